"""Hooks: Tensor.register_hook, Node.register_hook/register_prehook, saved_tensors_hooks.

The same code runs on symgrad and PyTorch; what the hooks see and what they change must
agree, and hook handles must not keep graphs alive.
"""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg

# Small dyadic values: the sums and products of them below are exact in float32, and those
# gradients are compared exactly.
X = np.array([0.5, -1.0, 2.0], dtype=np.float32)
Y = np.array([1.5, 0.25, -3.0], dtype=np.float32)


def test_tensor_hooks_replace_gradients_and_remove_like_torch(torch):
    out = {}
    for lib in (sg, torch):
        x = lib.tensor(X, requires_grad=True)
        seen = []
        h_leaf = x.register_hook(lambda g: g * 10)  # replaces the leaf's gradient
        y = x * 2
        h_mid = y.register_hook(lambda g, seen=seen: seen.append(g.numpy().copy()))  # observe
        y.register_hook(lambda g: g + 1)  # runs after the first, sees its (unchanged) result
        z = (y * lib.tensor(Y)).sum()
        z.backward(retain_graph=True)
        first = x.grad.numpy().copy()
        h_leaf.remove()
        h_mid.remove()
        h_mid.remove()  # removing twice is harmless
        x.grad = None
        z.backward()
        out[lib] = (seen, first, x.grad.numpy().copy())
    assert len(out[sg][0]) == len(out[torch][0]) == 1
    np.testing.assert_array_equal(out[sg][0][0], out[torch][0][0])
    np.testing.assert_array_equal(out[sg][1], out[torch][1])
    np.testing.assert_array_equal(out[sg][2], out[torch][2])
    np.testing.assert_array_equal(out[sg][1], (Y + 1) * 2 * 10)


def test_leaf_hook_applies_under_autograd_grad_like_torch(torch):
    for lib in (sg, torch):
        x = lib.tensor(X, requires_grad=True)
        x.register_hook(lambda g: g * 2)
        (g,) = lib.autograd.grad((x * 3).sum(), x)
        np.testing.assert_array_equal(g.numpy(), [6.0, 6.0, 6.0])
        assert x.grad is None


def test_hook_errors_match_torch(torch):
    for lib in (sg, torch):
        x = lib.tensor(X, requires_grad=True)
        y = x * 2

        def shrink(g):
            return g[:2]

        y.register_hook(shrink)
        with pytest.raises(RuntimeError, match="hook 'shrink' has changed the size of value"):
            y.sum().backward()
        with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't "
                                               "require gradient"):
            lib.tensor(X).register_hook(lambda g: g)
    x = sg.tensor(X, requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: 3)
    with pytest.raises(TypeError, match="expected Tensor or None"):
        y.sum().backward()


def test_node_hooks_see_and_replace_gradients_like_torch(torch):
    out = {}
    for lib in (sg, torch):
        a = lib.tensor(X, requires_grad=True)
        b = lib.tensor(Y, requires_grad=True)
        c = a * b
        log = []

        def pre(grad_outputs, log=log):
            log.append(("pre", [g.numpy().copy() for g in grad_outputs]))
            return (grad_outputs[0] * 2,)

        def post(grad_inputs, grad_outputs, log=log):
            log.append(("post", [g.numpy().copy() for g in grad_inputs],
                        [g.numpy().copy() for g in grad_outputs]))
            return (grad_inputs[0], grad_inputs[1] * 0)

        hp = c.grad_fn.register_prehook(pre)
        hq = c.grad_fn.register_hook(post)
        (c * lib.tensor([1.0, 2.0, 3.0])).sum().backward(retain_graph=True)
        first = (a.grad.numpy().copy(), b.grad.numpy().copy())
        hp.remove()
        hq.remove()
        a.grad = b.grad = None
        (c * lib.tensor([1.0, 2.0, 3.0])).sum().backward()
        out[lib] = (log, first, (a.grad.numpy().copy(), b.grad.numpy().copy()))
    (slog, sfirst, ssecond), (tlog, tfirst, tsecond) = out[sg], out[torch]
    assert [e[0] for e in slog] == [e[0] for e in tlog] == ["pre", "post"]
    for se, te in zip(slog, tlog):
        for sa, ta in zip(se[1:], te[1:]):
            for p, q in zip(sa, ta):
                np.testing.assert_array_equal(p, q)
    for p, q in zip(sfirst + ssecond, tfirst + tsecond):
        np.testing.assert_array_equal(p, q)
    np.testing.assert_array_equal(sfirst[1], 0.0)


def test_hook_order_tensor_hooks_then_node_prehooks_like_torch(torch):
    orders = []
    for lib in (sg, torch):
        order = []
        x = lib.tensor(X, requires_grad=True)
        y = x.exp()
        y.grad_fn.register_prehook(lambda g, o=order: o.append("node pre"))
        y.register_hook(lambda g, o=order: o.append("tensor"))
        y.grad_fn.register_hook(lambda gi, go, o=order: o.append("node post"))
        x.register_hook(lambda g, o=order: o.append("leaf"))
        y.sum().backward()
        orders.append(order)
    assert orders[0] == orders[1]


def test_hook_handles_do_not_keep_graphs_alive(no_gc):
    before = sg.memory_allocated()
    x = sg.tensor(np.ones(1000, dtype=np.float32), requires_grad=True)
    y = x.exp()
    handles = [y.register_hook(lambda g: g), y.grad_fn.register_hook(lambda gi, go: None),
               y.grad_fn.register_prehook(lambda g: None)]
    del y
    del x
    assert sg.memory_allocated() == before
    for h in handles:
        h.remove()  # removing after the graph died is harmless


def _packs(lib, expr):
    packed = []
    with lib.autograd.graph.saved_tensors_hooks(
            lambda t: packed.append(tuple(t.shape)) or t, lambda t: t):
        a = lib.tensor(X, requires_grad=True)
        b = lib.tensor(Y, requires_grad=True)
        out = eval(expr, {"a": a, "b": b})
    return sorted(packed), out


@pytest.mark.parametrize("expr", ["a * b", "(a * b).exp()", "a.sin() + b", "a / b",
                                  "(a @ b).tanh()", "(a * 2).sum()", "a.pow(3)"])
def test_saved_tensors_hooks_see_what_torch_saves(torch, expr):
    s_packs, _ = _packs(sg, expr)
    t_packs, _ = _packs(torch, expr)
    assert s_packs == t_packs


def test_saved_tensors_hooks_trade_memory_and_give_the_same_gradients(torch, no_gc):
    # pack parks each saved tensor as a NumPy copy outside symgrad's allocator
    def pack(t):
        return t.detach().numpy().copy()

    def unpack(arr):
        return sg.tensor(arr)

    def forward(x, w):
        h = x
        for _ in range(3):
            h = (h @ w).tanh()  # each tanh saves its 16x16 float32 result
        return h.sum()

    x = sg.tensor(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32),
                  requires_grad=True)
    w = sg.tensor(np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32) / 4,
                  requires_grad=True)
    base = sg.memory_allocated()
    plain = forward(x, w)
    kept_plain = sg.memory_allocated() - base
    plain.backward()
    ref = (x.grad.numpy().copy(), w.grad.numpy().copy())
    x.grad = w.grad = None
    del plain
    base = sg.memory_allocated()
    with sg.autograd.graph.saved_tensors_hooks(pack, unpack):
        hooked = forward(x, w)
    kept_hooked = sg.memory_allocated() - base
    assert kept_plain - kept_hooked == 3 * 16 * 16 * 4  # the three tanh results
    hooked.backward()
    # three layers: forward mm over 16 and tanh (2); backward tanh' (3), mm over 16 for
    # h's gradient and over 16 rows for w's
    terms = 3 * (16 + 2) + 3 * (3 + 16 + 16)
    assert_close(x.grad, ref[0], terms=terms)
    assert_close(w.grad, ref[1], terms=terms)


def test_saved_tensors_hooks_skip_the_version_check_like_torch(torch):
    for lib in (sg, torch):
        a = lib.tensor(X, requires_grad=True)
        b = lib.tensor(Y)
        with lib.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
            y = a * b
        b.add_(1)  # the packed clone still holds the old values
        y.sum().backward()
        np.testing.assert_array_equal(a.grad.numpy(), Y)


def test_unpack_hook_must_return_a_tensor_and_hooks_nest():
    a = sg.tensor(X, requires_grad=True)
    with sg.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: "oops"):
        y = a.exp()
    with pytest.raises(TypeError, match="unpack_hook expected to be a Tensor"):
        y.sum().backward()
    calls = []
    with sg.autograd.graph.saved_tensors_hooks(lambda t: calls.append("outer") or t, lambda t: t):
        with sg.autograd.graph.saved_tensors_hooks(lambda t: calls.append("inner") or t,
                                                   lambda t: t):
            a.sin()
        a.cos()
    assert calls == ["inner", "outer"]
    assert not sg.autograd.node._saved_tensors_hooks  # the stack is empty again


def test_save_on_cpu_keeps_gradients(torch):
    a = sg.tensor(X, requires_grad=True)
    with sg.autograd.graph.save_on_cpu():
        y = (a * a).exp()
    y.sum().backward()
    assert_close(a.grad, 2 * X * np.exp(X * X), terms=4)  # exp (2) and two products
