"""torch.autograd.Function proved without a ``sympy`` method: the torch forward is traced on
symbols (torch calls on stand-ins run symgrad's ops of the same name on the SymPy backend).

The torch versions of tests/test_custom_function_proofs.py: correct Functions pass exactly;
each planted backward bug (sign, factor, wrong saved value, wrong axis) is flagged with its
input named; an untraceable forward falls back to finite differences with a note naming
the line; a straight-through estimator is a mismatch unless it declares
``surrogate_gradient``.
"""

from __future__ import annotations

import functools
import math
import operator

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the test oracle")

import symgrad as sg  # noqa: E402
from symgrad.symbolic import FreedGraphError  # noqa: E402

Function = torch.autograd.Function


def _t(shape, seed, lo=-1.5, hi=1.5):
    return torch.tensor(np.random.default_rng(seed).uniform(lo, hi, size=shape),
                        dtype=torch.float64)


def _verify(fn, *inputs, capture=True, seed=0, **kw):
    """``fn.apply(*inputs)`` with float tensors as leaves named after forward's parameters,
    along a seeded cotangent, verified."""
    from symgrad.symbolic.trace import forward_arg_names

    params = forward_arg_names(fn, len(inputs))
    args, names = [], {}
    for p, a in zip(params, inputs):
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point:
            a = a.clone().requires_grad_(True)
            names[p] = a
        args.append(a)
    if capture:
        with sg.capture_torch():
            out = fn.apply(*args)
    else:
        out = fn.apply(*args)
    outs = out if isinstance(out, tuple) else (out,)
    rng = np.random.default_rng(seed)
    terms = [(o * torch.tensor(rng.uniform(0.5, 1.5, size=tuple(o.shape)),
                               dtype=o.dtype)).sum() for o in outs]
    root = functools.reduce(operator.add, terms)
    return sg.verify(root, names=names, **kw)


def _node(rep, fn):
    return next(n for n in rep.nodes if n.name == f"{fn.__name__}Backward")


# -- the Functions -------------------------------------------------------------------------
class SmoothClamp(Function):
    """c * tanh(x / c): a smooth clamp to (-c, c)."""

    @staticmethod
    def forward(ctx, x, c):
        ctx.save_for_backward(x)
        ctx.c = c
        return torch.tanh(x / c) * c

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
        m = torch.amax(x, dim=1, keepdim=True)
        y = torch.log(torch.exp(x - m).sum(dim=1)) + m.squeeze(1)
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
        return grad.unsqueeze(1) * torch.softmax(x, dim=0)


_K = math.sqrt(2 / math.pi)


class LinearGelu(Function):
    """gelu_tanh(x @ w.T + b), fused."""

    @staticmethod
    def forward(ctx, x, w, b):
        z = x @ w.t() + b
        ctx.save_for_backward(x, w, z)
        return torch.nn.functional.gelu(z, approximate="tanh")

    @staticmethod
    def backward(ctx, grad):
        x, w, z = ctx.saved_tensors
        t = torch.tanh(_K * (z + 0.044715 * z ** 3))
        dz = grad * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _K * (1 + 3 * 0.044715 * z * z))
        return dz @ w, dz.t() @ x, dz.sum(0)


class LinearGeluFactorBug(LinearGelu):
    @staticmethod
    def backward(ctx, grad):
        x, w, z = ctx.saved_tensors
        t = torch.tanh(_K * (z + 0.044715 * z ** 3))
        dz = grad * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * _K * (1 + 0.044715 * z * z))
        return dz @ w, dz.t() @ x, dz.sum(0)


class NumpyForward(Function):
    """exp(x) * sin(x) + where(x > 0, tanh(x), 0), computed in NumPy."""

    @staticmethod
    def forward(ctx, x):
        a = x.detach().numpy()
        y = np.exp(a) * np.sin(a) + np.where(a > 0, np.tanh(a), 0.0)
        ctx.save_for_backward(x)
        return torch.from_numpy(y)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        e = x.exp()
        pos = (x > 0).double()
        return grad * (e * (x.sin() + x.cos()) + pos * (1 - x.tanh() ** 2))


class Branches(Function):
    """torch.where, torch.maximum, clamp and a constant tensor, decided at the point."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.where(x > 0, torch.exp(x), torch.sin(x)) + \
            torch.maximum(x, torch.tensor(0.25, dtype=x.dtype)) + x.clamp(-0.5, 0.5)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        d = torch.where(x > 0, x.exp(), x.cos()) + (x > 0.25).double() + \
            ((x >= -0.5) & (x <= 0.5)).double()
        return grad * d


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


class CubeSetupContext(Function):
    """The setup_context style (forward without ctx)."""

    @staticmethod
    def forward(x):
        return x ** 3

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

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
    (Branches, lambda: (_t((6,), 14),)),
    (SinCos, lambda: (_t((4,), 6),)),
    (Cube, lambda: (_t((3,), 7),)),
    (CubeSetupContext, lambda: (_t((3,), 7),)),
])
def test_correct_functions_are_proved_exactly(fn, inputs):
    assert not hasattr(fn, "sympy")
    rep = _verify(fn, *inputs())
    assert rep.ok and rep.mode == "exact" and rep.graph_kind == "torch", str(rep)
    assert not any("finite differences" in n for n in rep.notes), rep.notes
    assert all(lf.status == "ok" for lf in rep.leaves)
    loc = _verify(fn, *inputs(), mode="local")
    row = _node(loc, fn)
    assert loc.ok and row.status == "ok", str(loc)
    assert "traced on symbols" in row.formula


def test_all_tensor_arguments_need_no_capture():
    # every argument a tensor that requires grad: the graph's edges give the values
    rep = _verify(LinearGelu, _t((3, 2), 2), _t((4, 2), 3), _t((4,), 4), capture=False)
    assert rep.ok and rep.mode == "exact", str(rep)


def test_a_non_tensor_argument_without_capture_points_to_capture_torch():
    with pytest.raises(FreedGraphError, match=r"SmoothClampBackward.*capture_torch"):
        _verify(SmoothClamp, _t((2, 3), 0), 1.5, capture=False)


def test_a_tensor_argument_without_grad_is_taken_from_the_capture():
    x = _t((3, 2), 2)  # data: does not require grad
    w, b = _t((4, 2), 3).requires_grad_(True), _t((4,), 4).requires_grad_(True)
    with sg.capture_torch():
        root = LinearGelu.apply(x, w, b).sum()
    rep = sg.verify(root, names={"x": x, "w": w, "b": b})
    assert rep.ok and rep.mode == "exact", str(rep)
    assert sorted(lf.name for lf in rep.leaves) == ["b", "w"]  # the rows: leaves with grad
    root = LinearGelu.apply(x, w, b).sum()
    with pytest.raises(FreedGraphError, match=r"input 'x' of LinearGeluBackward"):
        sg.verify(root)


def test_declared_straight_through_is_skipped_with_the_note():
    rep = _verify(DeclaredStraightThrough, _t((4,), 8))
    assert rep.ok and rep.mode == "local", str(rep)
    assert any("straight-through estimator" in n for n in rep.notes), rep.notes


# -- planted bugs are flagged with the input named -----------------------------------------
@pytest.mark.parametrize("fn, inputs, names", [
    (SmoothClampSignBug, lambda: (_t((2, 3), 0), 1.5), "x"),
    # the wrong factor is in dz: every input's gradient is wrong, the worst one is named
    (LinearGeluFactorBug, lambda: (_t((3, 2), 2), _t((4, 2), 3), _t((4,), 4)), "xwb"),
    (LogSumExpWrongSaved, lambda: (_t((3, 4), 1),), "x"),
    (LogSumExpWrongAxis, lambda: (_t((4, 4), 1),), "x"),
])
def test_planted_bugs_name_the_input_and_element(fn, inputs, names):
    rep = _verify(fn, *inputs())
    assert not rep.ok and rep.status == "mismatch", str(rep)
    assert rep.first_bad_node is not None and rep.first_bad_node.name() == f"{fn.__name__}Backward"
    row = _node(rep, fn)
    assert row.status == "mismatch" and row.detail[3] in names and row.detail[4] == "[", \
        row.detail
    assert {lf.name for lf in rep.leaves if lf.status == "mismatch"} == set(names)


def test_bug_in_one_input_names_that_input():
    class WrongWeight(LinearGelu):
        @staticmethod
        def backward(ctx, grad):
            gx, gw, gb = LinearGelu.backward(ctx, grad)
            return gx, gw * 2, gb

    rep = _verify(WrongWeight, _t((3, 2), 2), _t((4, 2), 3), _t((4,), 4))
    row = _node(rep, WrongWeight)
    assert not rep.ok and row.detail.startswith("d/dw["), row.detail
    assert {lf.name: lf.status for lf in rep.leaves} == {"x": "ok", "w": "mismatch",
                                                         "b": "ok"}


def test_straight_through_estimator_undeclared_is_a_mismatch_with_a_hint():
    rep = _verify(StraightThrough, _t((4,), 8), mode="local")
    row = _node(rep, StraightThrough)
    assert not rep.ok and row.status == "mismatch", str(rep)
    assert "surrogate_gradient = True" in row.detail


# -- untraceable forwards fall back with the note ------------------------------------------
def test_python_if_on_a_value_falls_back_with_the_line():
    rep = _verify(PythonIf, _t((3,), 10))
    assert rep.ok and rep.mode == "local", str(rep)
    note = next(n for n in rep.notes if "could not be traced" in n)
    assert "test_custom_function_proofs_torch.py:" in note
    assert "`if x.sum().item() > 0:`" in note and "finite differences" in note


def test_unsupported_torch_call_falls_back_with_the_line():
    class Frac(Function):  # (cumsum, the earlier example, became known in issue 21)
        @staticmethod
        def forward(ctx, x):
            return torch.frac(x)

        @staticmethod
        def backward(ctx, grad):
            return grad

    rep = _verify(Frac, _t((4,), 11))
    assert rep.ok and rep.mode == "local", str(rep)
    note = next(n for n in rep.notes if "could not be traced" in n)
    assert "`return torch.frac(x)`" in note and "frac" in note


def test_untraceable_bug_is_still_caught_by_finite_differences():
    class PythonIfBug(PythonIf):
        @staticmethod
        def backward(ctx, grad):
            return grad * 2.5

    rep = _verify(PythonIfBug, _t((3,), 10))
    assert not rep.ok and rep.first_bad_node.name() == "PythonIfBugBackward", str(rep)


# -- in a bigger graph, local mode with sampling ---------------------------------------------
def test_in_a_graph_exact_and_local_sampled():
    x = _t((3, 4), 11).requires_grad_(True)
    root = (LogSumExp.apply(x.tanh()) * 2).sum()
    rep = sg.verify(root, names={"x": x})
    assert rep.ok and rep.mode == "exact", str(rep)
    big = _t((40, 30), 12).requires_grad_(True)
    with sg.capture_torch():
        root = SmoothClamp.apply(big, 2.0).sum()
        bad = SmoothClampSignBug.apply(big, 2.0).sum()
    rep = sg.verify(root, names={"big": big}, mode="local")
    row = _node(rep, SmoothClamp)
    assert rep.ok and row.status == "ok" and row.sampled, str(rep)
    rep = sg.verify(bad, names={"big": big}, mode="local")
    assert not rep.ok and rep.first_bad_node.name() == "SmoothClampSignBugBackward"


def test_capture_restores_function_apply():
    before = Function.__dict__["apply"]
    with sg.capture_torch():
        with sg.capture_torch():
            pass
    assert Function.__dict__["apply"] is before
