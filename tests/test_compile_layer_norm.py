"""sg.compile's direct layer-norm lines (rules.layer_norm_rows: the CPU backend's
layer_norm_rows / layer_norm_rows_b kernels called from the generated code instead of the
op's stanza forward and its node's backward).

Eager runs those kernels where its backend's ``layer_norm`` and
``native_layer_norm_backward`` take the arrays (float32/float64, from FUSED_MIN elements);
the compiled step calls them on the same arrays with the same arguments, so it must give
eager's bits: outputs, gradients of the input, weight and bias, with and without affine
parameters, over one or two normalized dims, for gradients of only some operands, and
over several steps. Below FUSED_MIN eager computes layer norm from its generic ops, and so
does the compiled step.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import symgrad as sg
from symgrad.backends.cpu import backend as cpu
from symgrad.nn import functional as F


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Generated modules go to a temp dir, not the user's ~/.cache."""
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cc"))


def _make(shape, norm_shape, affine, dtype, wants):
    sg.manual_seed(3)
    w = sg.randn(*norm_shape, dtype=dtype, requires_grad="w" in wants) if affine else None
    b = sg.randn(*norm_shape, dtype=dtype, requires_grad="b" in wants) if affine else None
    x = (sg.randn(*shape, dtype=dtype) * 3 + 1).requires_grad_("x" in wants)
    c = sg.randn(*shape, dtype=dtype)
    return x, w, b, c


def _step(norm_shape, w, b, opt):
    def fn(x, c):
        opt.zero_grad()
        y = F.layer_norm(x * 1.5, norm_shape, w, b, eps=1e-4)
        loss = (y * c).sum()
        loss.backward()
        opt.step()
        return y, loss
    return fn


@pytest.mark.parametrize("dtype", [sg.float32, sg.float64])
@pytest.mark.parametrize("shape, norm_shape, affine, wants", [
    ((8, 32, 64), (64,), True, "xwb"),
    ((8, 32, 64), (64,), True, "wb"),     # the input's gradient not needed
    ((8, 32, 64), (64,), True, "xb"),     # the weight's not needed
    ((4, 16, 8, 8), (8, 8), True, "xwb"),  # two normalized dims
    ((512, 40), (40,), False, "x"),       # no affine parameters
])
def test_direct_layer_norm_lines_equal_eager_bit_for_bit(dtype, shape, norm_shape, affine,
                                                          wants):
    x, w, b, c = _make(shape, norm_shape, affine, dtype, wants)
    params = [p for p in (w, b) if p is not None and p.requires_grad]
    leaf = sg.zeros(1, requires_grad=True)  # an optimizer always has something to update
    opt = sg.optim.SGD(params + [leaf], lr=0.1, momentum=0.9)
    w_e, b_e = copy.deepcopy(w), copy.deepcopy(b)
    params_e = [p for p in (w_e, b_e) if p is not None and p.requires_grad]
    opt_e = sg.optim.SGD(params_e + [copy.deepcopy(leaf)], lr=0.1, momentum=0.9)
    step = sg.compile(_step(norm_shape, w, b, opt))
    eager = _step(norm_shape, w_e, b_e, opt_e)
    x_e = x.detach().requires_grad_(x.requires_grad)
    for i in range(3):
        cx = c * (i + 1)
        (y, loss), (y_e, loss_e) = step(x, cx), eager(x_e, cx)
        np.testing.assert_array_equal(y.detach().numpy(), y_e.detach().numpy())
        np.testing.assert_array_equal(loss.detach().numpy(), loss_e.detach().numpy())
        if x.requires_grad:
            np.testing.assert_array_equal(x.grad.numpy(), x_e.grad.numpy())
            x.grad = x_e.grad = None
        for p, q in zip(params, params_e):
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
            np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    assert step.stats["fallbacks"] == [] and step.stats["traces"] == 1
    src = step.source()
    assert "'layer_norm_rows'" in src and "'layer_norm_rows_b'" in src
    assert "fwd_native_layer_norm" not in src and "bwd_native_layer_norm" not in src


def test_below_fused_min_the_generic_path_stays_and_equals_eager():
    """Eager's backend declines a layer norm below FUSED_MIN elements (its generic ops
    run): so does the compiled step, with eager's values."""
    shape = (2, cpu.FUSED_MIN // 8 - 1)  # under FUSED_MIN elements
    x, w, b, c = _make(shape, shape[-1:], True, sg.float32, "xwb")
    opt = sg.optim.SGD([w, b], lr=0.1)
    w_e, b_e = copy.deepcopy(w), copy.deepcopy(b)
    opt_e = sg.optim.SGD([w_e, b_e], lr=0.1)
    step, eager = sg.compile(_step(shape[-1:], w, b, opt)), _step(shape[-1:], w_e, b_e, opt_e)
    x_e = x.detach().requires_grad_()
    for _ in range(2):
        (y, _), (y_e, _) = step(x, c), eager(x_e, c)
        np.testing.assert_array_equal(y.detach().numpy(), y_e.detach().numpy())
        np.testing.assert_array_equal(x.grad.numpy(), x_e.grad.numpy())
        np.testing.assert_array_equal(w.detach().numpy(), w_e.detach().numpy())
        x.grad = x_e.grad = None
    assert step.stats["fallbacks"] == []
    assert "'layer_norm_rows'" not in step.source()


def test_step_with_direct_layer_norms_verifies_and_catches_a_wrong_gradient(monkeypatch):
    """step.verify() proves a step with the direct lines, and reports a gradient the
    generated code gets wrong (its backward kernel's bias sums doubled, the self-check at
    generation turned off) as a mismatch naming the gradient."""
    import sys

    from symgrad.compile import codegen, rules

    norm = (4,)  # short rows, FUSED_MIN elements: the direct lines, and a cheap proof
    x, w, b, c = _make((cpu.FUSED_MIN // 4, 4), norm, True, sg.float32, "xwb")
    step = sg.compile(_step(norm, w, b, sg.optim.SGD([w, b], lr=0.1)))
    step(x, c)
    assert "'layer_norm_rows_b'" in step.source()
    assert step.verify().ok

    def wrong(name, n, *args):
        out = cpu._run(name, n, *args)
        if name == "layer_norm_rows_b":
            args[-2][...] *= 2  # gb: the bias gradient's float64 sums
        return out

    real = rules.layer_norm_operands

    def operands(call, ctx, n, m):  # the generated code's runner only: eager keeps its own
        _, weight, k = real(call, ctx, n, m)
        return ctx.bind(wrong, "wrong"), weight, k

    monkeypatch.setattr(rules, "layer_norm_operands", operands)
    monkeypatch.setattr(codegen, "layer_norm_operands", operands)
    monkeypatch.setattr(sys.modules["symgrad.compile.step"], "self_check", lambda *a: None)
    step = sg.compile(_step(norm, w, b, sg.optim.SGD([w, b], lr=0.1)))
    step(x, c)
    step(x, c)
    report = step.verify()
    assert not report.ok and report.status == "mismatch"
    assert report.bad_kernel.startswith("gradient of leaf")
