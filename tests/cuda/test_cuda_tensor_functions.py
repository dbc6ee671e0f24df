"""Issue 21 tensor functions and normalisation on the CUDA backend (numba's simulator in CI)
against symgrad's cpu backend: values, gradients and grad_fn names of every case of
tests/test_tensor_functions.py, and the nn functionals of tests/test_norm_layers.py."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close, magnitude
from test_norm_layers import F_CASES
from test_split import CASES as SPLIT_CASES
from test_split import USED as SPLIT_USED
from test_tensor_functions import CASES, _input

import symgrad as sg


def _on(device, fn, arrays):
    leaves = [sg.tensor(a, device=device, requires_grad=True) for a in arrays]
    out = fn(*leaves)
    w = sg.tensor(np.random.default_rng(1).uniform(-1, 1, tuple(out.shape)), dtype=out.dtype,
                  device=device)
    grads = sg.autograd.grad((out * out * w).sum(), leaves, allow_unused=True)
    return out, grads


class _OnDevice:
    """``sg`` whose index tensors are made on ``device`` (the cases call ``L.tensor``)."""

    def __init__(self, device):
        self._device = device

    def __getattr__(self, name):
        return getattr(sg, name)

    def tensor(self, data, **kwargs):
        kwargs.setdefault("device", self._device)
        return sg.tensor(data, **kwargs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_matches_cpu(name):
    shape, fn = CASES[name]
    data = _input(shape, np.float64)
    results = [_on(dev, lambda x, dev=dev: fn(_OnDevice(dev), x), [data])
               for dev in ("cpu", "cuda")]
    (out, (g,)), (c_out, (c_g,)) = results
    assert c_out.grad_fn.name() == out.grad_fn.name()
    assert c_out.device.type == "cuda"
    assert_close(c_out.cpu(), out, terms=data.size, scale=magnitude(out, data, 1.0) ** 2 + 1)
    assert_close(c_g.cpu(), g, terms=data.size ** 2, scale=magnitude(g, data, 1.0) ** 3 + 1)


@pytest.mark.parametrize("name", sorted(F_CASES))
def test_cuda_norm_functionals_match_cpu(name):
    xs, ws, bs, fn = F_CASES[name]
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s) for s in (xs, ws, bs)]
    results = [_on(dev, lambda *t, dev=dev: fn(_OnDevice(dev), *t), arrays)
               for dev in ("cpu", "cuda")]
    (out, grads), (c_out, c_grads) = results
    assert c_out.grad_fn.name() == out.grad_fn.name()
    n = int(np.prod(xs))
    assert_close(c_out.cpu(), out, terms=n, scale=magnitude(out, *arrays))
    for g, cg in zip(grads, c_grads):
        assert (g is None) == (cg is None)
        if g is not None:
            assert_close(cg.cpu(), g, terms=4 * n, scale=magnitude(g, *arrays) ** 3 + 1)


def test_cuda_embedding_and_dropout():
    w = np.random.default_rng(9).standard_normal((6, 3))
    outs = []
    for dev in ("cpu", "cuda"):
        weight = sg.tensor(w, device=dev, requires_grad=True)
        y = sg.nn.functional.embedding(sg.tensor([[1, 2, 1], [0, 5, 1]], device=dev), weight,
                                       padding_idx=2)
        (y * y).sum().backward()
        outs.append((y.cpu(), weight.grad.cpu()))
    assert_close(outs[1][0], outs[0][0], terms=1, scale=1)
    assert_close(outs[1][1], outs[0][1], terms=4, scale=magnitude(w))
    sg.manual_seed(0)
    x = sg.ones(50, 40, device="cuda", requires_grad=True)
    y = sg.nn.functional.dropout(x, 0.25)
    y.sum().backward()
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.75) < 5 * np.sqrt(0.75 * 0.25 / 2000)
    assert np.array_equal(x.grad.cpu().numpy(), y.detach().cpu().numpy())


# -- split / chunk / unbind / tensor_split (tests/test_split.py) ------------------------------
@pytest.mark.parametrize("name", sorted(SPLIT_CASES))
def test_cuda_split_matches_cpu(name):
    """Pieces (views on the device), their shared node and the joined gradient."""
    data = _input(SPLIT_CASES[name][0], np.float64)
    results = []
    for dev in ("cpu", "cuda"):
        x = sg.tensor(data, device=dev, requires_grad=True)
        pieces = SPLIT_CASES[name][1](_OnDevice(dev), x)
        used = SPLIT_USED.get(name, range(len(pieces)))
        loss = None
        for k, p in enumerate(pieces):
            if k in used:
                term = (p * p).sum() * (k + 1)
                loss = term if loss is None else loss + term
        (g,) = sg.autograd.grad(loss, x) if loss is not None else (sg.zeros_like(x),)
        results.append((pieces, g))
    (pieces, g), (c_pieces, c_g) = results
    assert [p.grad_fn.name() for p in c_pieces] == [p.grad_fn.name() for p in pieces]
    assert [p._output_nr for p in c_pieces] == [p._output_nr for p in pieces]
    for p, cp in zip(pieces, c_pieces):
        assert cp.device.type == "cuda"
        assert_close(cp.cpu(), p, terms=1)
    assert_close(c_g.cpu(), g, terms=2, scale=magnitude(g) + 1)
