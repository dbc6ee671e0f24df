"""NaN and infinity at the edges torch 2.13 defines (found by 600+ random programs):
``sign(NaN)`` is 0 (torch computes ``(0 < x) - (x < 0)``), so ``abs``'s gradient at NaN is
0; a 0-d softmax / log_softmax / _safe_softmax row keeps torch's NaN gradient, and a 0-d
``_safe_softmax`` of -inf is 0."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad as sg
from symgrad.autograd.function import apply
from symgrad.ops.registry import OPS

torch = pytest.importorskip("torch", reason="torch 2.13 is the test oracle")

VALUES = [float("nan"), -float("nan"), 0.0, -0.0, 1.5, -2.0, float("inf"), -float("inf")]


def _same(a, b) -> None:
    np.testing.assert_array_equal(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))


@pytest.mark.parametrize("n", [1, 5, 40])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sign_and_abs_gradient_at_nan_match_torch(cpu_backend, n, dtype):
    data = np.resize(np.array(VALUES, dtype=dtype), n)
    x = sg.tensor(data, requires_grad=True)
    y = x.sign()
    x.abs().sum().backward()
    t = torch.tensor(data, requires_grad=True)
    ty = t.sign()
    t.abs().sum().backward()
    _same(y.detach().numpy(), ty.detach().numpy())
    _same(x.grad.numpy(), t.grad.numpy())


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "safe_softmax"])
def test_zero_dim_softmaxes_match_torch_at_nan_and_inf(cpu_backend, name, value):
    x = sg.tensor(value, dtype=sg.float64, requires_grad=True)
    t = torch.tensor(value, dtype=torch.float64, requires_grad=True)
    if name == "safe_softmax":
        y, ty = apply(OPS[name], (x,), {"dim": 0}), torch.ops.aten._safe_softmax(t, 0)
    else:
        y, ty = getattr(sg, name)(x, 0), getattr(torch, name)(t, 0)
    with np.errstate(invalid="ignore"):
        y.backward(sg.tensor(0.7, dtype=sg.float64))
    ty.backward(torch.tensor(0.7, dtype=torch.float64))
    _same(y.item(), ty.item())
    _same(x.grad.item(), t.grad.item())
