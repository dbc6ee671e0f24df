"""Custom Functions proved without a ``sympy`` method: their forward is traced on symbols.

Correct Functions pass exactly; each planted backward bug (sign, factor, wrong saved value,
wrong axis) is flagged with its input named; untraceable forwards fall back to finite
differences with a note naming the line; a straight-through estimator is a mismatch unless
it declares ``surrogate_gradient``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import symgrad as sg
from symgrad.autograd import Function
from symgrad.testing import assert_function_correct

F64 = sg.float64


def _t(shape, seed, lo=-1.5, hi=1.5):
    return sg.tensor(np.random.default_rng(seed).uniform(lo, hi, size=shape), dtype=F64)


# -- the Functions -------------------------------------------------------------------------
class SmoothClamp(Function):
    """c * tanh(x / c): a smooth clamp to (-c, c)."""

    @staticmethod
    def forward(ctx, x, c):
        ctx.save_for_backward(x)
        ctx.c = c
        return (x / c).tanh() * c

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (1 - (x / ctx.c).tanh() ** 2), None


class SmoothClampSignBug(SmoothClamp):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * ((x / ctx.c).tanh() ** 2 - 1), None


class StraightThrough(Function):
    """sign(x) forward, identity backward: the derivative of sign is 0 on purpose."""

    @staticmethod
    def forward(ctx, x):
        return (x > 0).double() * 2 - 1

    @staticmethod
    def backward(ctx, grad):
        return grad


class DeclaredStraightThrough(StraightThrough):
    surrogate_gradient = "straight-through estimator"


class LogSumExp(Function):
    """log(sum(exp(x), dim=1)) with the max subtracted (the stable forward)."""

    @staticmethod
    def forward(ctx, x):
        m = x.max(dim=1, keepdim=True).values
        y = (x - m).exp().sum(dim=1).log() + m.squeeze(1)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad.unsqueeze(1) * (x - y.unsqueeze(1)).exp()


class LogSumExpWrongSaved(LogSumExp):
    """Uses the max where the log-sum-exp belongs (a wrong saved value)."""

    @staticmethod
    def forward(ctx, x):
        m = x.max(dim=1, keepdim=True).values
        y = (x - m).exp().sum(dim=1).log() + m.squeeze(1)
        ctx.save_for_backward(x, m.squeeze(1))
        return y


class LogSumExpWrongAxis(LogSumExp):
    """Normalises over dim 0 instead of dim 1 (a wrong axis)."""

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        return grad.unsqueeze(1) * x.softmax(dim=0)


_K = math.sqrt(2 / math.pi)


class LinearGelu(Function):
    """gelu_tanh(x @ w.T + b), fused."""

    @staticmethod
    def forward(ctx, x, w, b):
        z = x @ w.t() + b
        ctx.save_for_backward(x, w, z)
        return 0.5 * z * (1 + (_K * (z + 0.044715 * z ** 3)).tanh())

    @staticmethod
    def backward(ctx, grad):
        x, w, z = ctx.saved_tensors
        t = (_K * (z + 0.044715 * z ** 3)).tanh()
        dz = grad * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _K * (1 + 3 * 0.044715 * z * z))
        return dz @ w, dz.t() @ x, dz.sum(0)


class LinearGeluFactorBug(LinearGelu):
    @staticmethod
    def backward(ctx, grad):
        x, w, z = ctx.saved_tensors
        t = (_K * (z + 0.044715 * z ** 3)).tanh()
        dz = grad * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _K * (1 + 0.044715 * z * z))
        return dz @ w, dz.t() @ x, dz.sum(0)


class NumpyForward(Function):
    """exp(x) * sin(x) + where(x > 0, tanh(x), 0), computed in NumPy."""

    @staticmethod
    def forward(ctx, x):
        a = x.detach().numpy()
        y = np.exp(a) * np.sin(a) + np.where(a > 0, np.tanh(a), 0.0)
        ctx.save_for_backward(x)
        return sg.from_numpy(y)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        e = x.exp()
        pos = (x > 0).double()
        return grad * (e * (x.sin() + x.cos()) + pos * (1 - x.tanh() ** 2))


class PythonIf(Function):
    """A Python ``if`` on a value taken out of the tensor: cannot be traced."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        if x.sum().item() > 0:
            return x * 2
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (2 if x.sum().item() > 0 else 3)


class SinCos(Function):
    """Two outputs."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin(), x.cos()

    @staticmethod
    def backward(ctx, gs, gc):
        (x,) = ctx.saved_tensors
        return gs * x.cos() - gc * x.sin()


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x ** 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x ** 2


# -- correct Functions pass exactly, without a sympy method ----------------------------------
@pytest.mark.parametrize("fn, inputs", [
    (SmoothClamp, lambda: (_t((2, 3), 0), 1.5)),
    (LogSumExp, lambda: (_t((3, 4), 1),)),
    (LinearGelu, lambda: (_t((3, 2), 2), _t((4, 2), 3), _t((4,), 4))),
    (NumpyForward, lambda: (_t((5,), 5),)),
    (SinCos, lambda: (_t((4,), 6),)),
    (Cube, lambda: (_t((3,), 7),)),
    (DeclaredStraightThrough, lambda: (_t((4,), 8),)),
])
def test_correct_functions_are_proved_exactly(fn, inputs):
    assert fn.sympy is None
    rep = assert_function_correct(fn, *inputs(), order=1 if fn is LinearGelu else None)
    assert rep.ok, str(rep)
    if fn is DeclaredStraightThrough:  # declared: the node is not compared, the note says so
        assert rep.mode == "local"
        assert any("straight-through estimator" in n for n in rep.notes), rep.notes
        return
    assert rep.mode == "exact", str(rep)
    assert not any("finite differences" in n for n in rep.notes), rep.notes
    assert all(lf.status == "ok" for lf in rep.leaves)


def test_double_backward_is_proved_when_the_backward_is_differentiable():
    rep = assert_function_correct(Cube, _t((3,), 9))
    assert rep.order == 2 and rep.hvp and all(h["status"] == "ok" for h in rep.hvp)


def test_wrong_double_backward_is_named():
    # LinearGelu's backward reads z saved from forward (a constant under create_graph), so
    # the double backward it claims misses d z/d(x, w, b): first order right, second wrong
    with pytest.raises(AssertionError) as info:
        assert_function_correct(LinearGelu, _t((3, 2), 2), _t((4, 2), 3), _t((4,), 4))
    msg = str(info.value)
    assert "double backward of LinearGelu" in msg and "once_differentiable" in msg
    assert "wrong gradient" not in msg


# -- planted bugs are flagged with the input named -----------------------------------------
@pytest.mark.parametrize("fn, inputs, name", [
    (SmoothClampSignBug, lambda: (_t((2, 3), 0), 1.5), "x"),
    (LinearGeluFactorBug, lambda: (_t((3, 2), 2), _t((4, 2), 3), _t((4,), 4)), "x"),
    (LogSumExpWrongSaved, lambda: (_t((3, 4), 1),), "x"),
    (LogSumExpWrongAxis, lambda: (_t((4, 4), 1),), "x"),
])
def test_planted_bugs_name_the_input_and_element(fn, inputs, name):
    with pytest.raises(AssertionError) as info:
        assert_function_correct(fn, *inputs())
    msg = str(info.value)
    assert f"{fn.__name__}.backward gives a wrong gradient for input '{name}'" in msg, msg
    assert "engine " in msg and "exact " in msg and f"at {name}[" in msg


def test_bug_in_one_input_names_that_input():
    class WrongWeight(LinearGelu):
        @staticmethod
        def backward(ctx, grad):
            gx, gw, gb = LinearGelu.backward(ctx, grad)
            return gx, gw * 2, gb

    with pytest.raises(AssertionError) as info:
        assert_function_correct(WrongWeight, _t((3, 2), 2), _t((4, 2), 3), _t((4,), 4))
    first = str(info.value).splitlines()[0]
    assert "input 'w' (argument 2 of forward)" in first, first


def test_straight_through_estimator_undeclared_is_a_mismatch_with_a_hint():
    with pytest.raises(AssertionError) as info:
        assert_function_correct(StraightThrough, _t((4,), 8))
    msg = str(info.value)
    assert "wrong gradient for input 'x'" in msg
    assert "surrogate_gradient = True" in msg  # the hint: declare it when it is on purpose


# -- untraceable forwards fall back with the note ------------------------------------------
def test_python_if_on_a_value_falls_back_with_the_line():
    x = _t((3,), 10)
    rep = assert_function_correct(PythonIf, x)
    assert rep.ok and rep.mode == "local"
    note = next(n for n in rep.notes if "could not be traced" in n)
    assert "test_custom_function_proofs.py:" in note
    assert "`if x.sum().item() > 0:`" in note and "finite differences" in note
    with pytest.raises(AssertionError, match="not proved exactly"):
        assert_function_correct(PythonIf, x, require_exact=True)


def test_untraceable_bug_is_still_caught_by_finite_differences():
    class PythonIfBug(PythonIf):
        @staticmethod
        def backward(ctx, grad):
            return grad * 2.5

    with pytest.raises(AssertionError, match="PythonIfBugBackward"):
        assert_function_correct(PythonIfBug, _t((3,), 10))


# -- verify on a graph, local mode with sampling ---------------------------------------------
def test_in_a_graph_exact_and_local_sampled():
    x = _t((3, 4), 11).requires_grad_(True)
    root = (LogSumExp.apply(x.tanh()) * 2).sum()
    rep = sg.verify(root, names={"x": x})
    assert rep.ok and rep.mode == "exact", str(rep)
    big = _t((40, 30), 12).requires_grad_(True)
    rep = sg.verify(SmoothClamp.apply(big, 2.0).sum(), names={"big": big}, mode="local")
    row = next(n for n in rep.nodes if n.name == "SmoothClampBackward")
    assert rep.ok and row.status == "ok" and row.sampled, str(rep)
    assert "traced on symbols" in row.formula
    rep = sg.verify(SmoothClampSignBug.apply(big, 2.0).sum(), names={"big": big}, mode="local")
    assert not rep.ok and rep.first_bad_node is not None
    assert rep.first_bad_node.name() == "SmoothClampSignBugBackward"


def test_pytest_fixture(symgrad_function):
    rep = symgrad_function(Cube, _t((3,), 13))
    assert rep.ok
    with pytest.raises(AssertionError, match="input 'x'"):
        symgrad_function(SmoothClampSignBug, _t((3,), 13), 1.0)
