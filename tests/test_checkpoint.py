"""``symgrad.utils.checkpoint``: recompute in backward, same gradients, less memory kept."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad.utils.checkpoint import checkpoint

B, D, K = 8, 16, 4  # batch, width, layers in the checkpointed block
RNG = np.random.default_rng(7)
X = RNG.standard_normal((B, D)).astype(np.float32)
WS = [(RNG.standard_normal((D, D)) / 4).astype(np.float32) for _ in range(K)]


def _setup(lib):
    x = lib.tensor(X, requires_grad=True)
    ws = [lib.tensor(w, requires_grad=True) for w in WS]
    calls = []

    def block(h):
        calls.append(1)
        for w in ws:
            h = (h @ w).tanh()
        return h

    return x, ws, block, calls


def _grads(x, ws):
    return [x.grad.numpy().copy()] + [w.grad.numpy().copy() for w in ws]


# Roundings along the block's gradients: forward, each layer an mm over D and tanh (2);
# the loss's 2 * out; backward, each layer tanh's partial (3), mm over D for h's gradient
# and over the batch B for w's.
TERMS = K * (D + 2) + 2 + K * (3 + D + B)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpoint_gives_torchs_gradients_and_keeps_less_memory(torch, use_reentrant, no_gc):
    x, ws, block, calls = _setup(sg)
    before = sg.memory_allocated()
    out = block(x)
    kept_plain = sg.memory_allocated() - before
    (out * out).sum().backward()
    plain = _grads(x, ws)
    del out

    x, ws, block, calls = _setup(sg)
    before = sg.memory_allocated()
    out = checkpoint(block, x, use_reentrant=use_reentrant)
    kept_ckpt = sg.memory_allocated() - before
    # plain keeps every layer's tanh output (saved by TanhBackward0 and the next mm);
    # the checkpointed block keeps only its output
    assert kept_plain - kept_ckpt == (K - 1) * B * D * 4
    assert calls == [1]
    (out * out).sum().backward()
    assert calls == [1, 1]  # recomputed once, in backward
    ckpt = _grads(x, ws)

    tx, tws, tblock, _ = _setup(torch)
    tout = torch.utils.checkpoint.checkpoint(tblock, tx, use_reentrant=use_reentrant)
    (tout * tout).sum().backward()
    for a, b, c in zip(plain, ckpt, _grads(tx, tws)):
        assert_close(b, a, terms=TERMS, msg="checkpoint vs plain")
        assert_close(b, c, terms=TERMS, msg="vs torch")


def test_module_is_callable_and_default_flavour_warns_like_torch(torch):
    x, ws, block, _ = _setup(sg)
    for lib, fn in ((sg, sg.utils.checkpoint), (torch, torch.utils.checkpoint.checkpoint)):
        x, ws, block, _ = _setup(lib)
        with pytest.warns(UserWarning, match="use_reentrant parameter should be passed "
                                             "explicitly"):
            out = fn(block, x)
        assert out.grad_fn.name() == "CheckpointFunctionBackward"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sg.utils.checkpoint(block, x, use_reentrant=False)


def test_non_reentrant_works_with_autograd_grad_and_inputs_without_grad(torch):
    out = {}
    for lib in (sg, torch):
        x, ws, block, calls = _setup(lib)
        x_plain = lib.tensor(X)  # only the closure's weights require grad
        y = lib.utils.checkpoint.checkpoint(block, x_plain, use_reentrant=False)
        grads = lib.autograd.grad((y * y).sum(), ws[:2])
        out[lib] = [g.numpy().copy() for g in grads]
        assert len(calls) == 2
        for w in ws:
            assert w.grad is None
    for a, b in zip(out[sg], out[torch]):
        assert_close(a, b, terms=TERMS)


def test_reentrant_without_grad_inputs_warns_like_torch(torch):
    for lib in (sg, torch):
        x, ws, block, _ = _setup(lib)
        with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
            y = lib.utils.checkpoint.checkpoint(block, lib.tensor(X), use_reentrant=True)
        assert not y.requires_grad


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_random_draws_are_replayed_in_the_recomputation(use_reentrant):
    def noisy(h):
        mask = (sg.rand(*h.shape) > 0.5).float()  # dropout-like
        return (h * mask).tanh()

    def run(fn):
        sg.manual_seed(3)
        x = sg.tensor(X, requires_grad=True)
        y = fn(x)
        sg.rand(3)  # the generator moves on between forward and backward
        (y * y).sum().backward()
        return y.detach().numpy().copy(), x.grad.numpy().copy()

    plain = run(noisy)
    ckpt = run(lambda x: checkpoint(noisy, x, use_reentrant=use_reentrant))
    np.testing.assert_array_equal(plain[0], ckpt[0])
    # h * mask, tanh (2), the loss's 2 y, tanh's partial (3), the mask again
    terms = 1 + 2 + 1 + 3 + 1
    assert_close(ckpt[1], plain[1], terms=terms)
    if use_reentrant:  # without the saved state the recomputed mask differs
        loose = run(lambda x: checkpoint(noisy, x, use_reentrant=True,
                                         preserve_rng_state=False))
        with pytest.raises(AssertionError, match="not close"):
            assert_close(loose[1], plain[1], terms=terms)


def test_non_reentrant_backward_twice_recomputes_once():
    x, ws, block, calls = _setup(sg)
    y = checkpoint(block, x, use_reentrant=False)
    loss = (y * y).sum()
    loss.backward(retain_graph=True)
    once = _grads(x, ws)
    loss.backward()
    assert calls == [1, 1]
    for a, b in zip(once, _grads(x, ws)):
        assert_close(b, 2 * a, terms=TERMS)  # the recomputed backward, accumulated


def test_recomputation_that_saves_differently_is_a_clear_error():
    state = {"n": 0}
    w = sg.tensor(WS[0], requires_grad=True)

    def flaky(h):
        state["n"] += 1
        h = h @ w
        return h.exp() if state["n"] == 1 else h * 2

    y = checkpoint(flaky, sg.tensor(X), use_reentrant=False)
    with pytest.raises(RuntimeError, match="different number of tensors was saved"):
        y.sum().backward()


def test_reentrant_checkpoint_with_several_outputs_and_non_tensor_args(torch):
    out = {}
    for lib in (sg, torch):
        x = lib.tensor(X, requires_grad=True)

        def two(h, scale):
            return (h * scale).sin(), h.cos()

        a, b = lib.utils.checkpoint.checkpoint(two, x, 3.0, use_reentrant=True)
        (a * b).sum().backward()
        out[lib] = x.grad.numpy().copy()
    # 3 cos(3x) cos(x) - sin(3x) sin(x): 3x, four elementary functions (2 each), the
    # partials' products and the sum (5); the two products cancel: their |sum| is the scale
    x = X.astype(np.float64)
    scale = 3 * np.abs(np.cos(3 * x) * np.cos(x)) + np.abs(np.sin(3 * x) * np.sin(x))
    assert_close(out[sg], out[torch], terms=1 + 4 * 2 + 5, scale=scale)
