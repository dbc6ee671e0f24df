"""``symgrad.testing.assert_function_correct`` takes ``torch.autograd.Function`` classes too
(issue 32, scope 5): proved through ``symgrad.capture_torch()`` + ``symgrad.verify``, the
path every torch graph takes; a wrong backward fails naming the Function's node, the input
and the element; symgrad Functions are checked as before."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the test oracle")

import symgrad as sg  # noqa: E402
from symgrad.autograd import Function as SgFunction  # noqa: E402
from symgrad.testing import assert_function_correct  # noqa: E402


def _x(shape=(3, 2), seed=0):
    return torch.tensor(np.random.default_rng(seed).uniform(-1.5, 1.5, size=shape),
                        dtype=torch.float64)


class SmoothClamp(torch.autograd.Function):
    """c * tanh(x / c)."""

    @staticmethod
    def forward(ctx, x, c):
        ctx.save_for_backward(x)
        ctx.c = c
        return torch.tanh(x / c) * c

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (1 - (x / ctx.c).tanh() ** 2), None


class SmoothClampCubeBug(SmoothClamp):
    """tanh**3 where tanh**2 belongs."""

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (1 - (x / ctx.c).tanh() ** 3), None


class ScaleAndExp(torch.autograd.Function):
    """Two outputs (x * w, exp(x)); the bug variant forgets exp's gradient for x."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w, x.exp()

    @staticmethod
    def backward(ctx, g1, g2):
        x, w = ctx.saved_tensors
        return g1 * w + g2 * x.exp(), g1 * x


class ScaleAndExpBug(ScaleAndExp):
    @staticmethod
    def backward(ctx, g1, g2):
        x, w = ctx.saved_tensors
        return g1 * w, g1 * x


class SgCube(SgFunction):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x


class SgCubeBug(SgCube):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * x * x


def test_a_correct_torch_function_is_proved_exactly_through_the_torch_path():
    rep = assert_function_correct(SmoothClamp, _x(), 0.7, require_exact=True)
    assert rep.ok and rep.graph_kind == "torch" and rep.mode == "exact"
    # its backward is differentiable under create_graph: the double backward was proved too
    assert rep.order == 2 and rep.hvp and all(h["status"] == "ok" for h in rep.hvp)
    assert [lf.name for lf in rep.leaves] == ["x"]


def test_a_correct_torch_function_with_two_outputs():
    rep = assert_function_correct(ScaleAndExp, _x(seed=1), _x(seed=2), order=1)
    assert rep.ok and rep.graph_kind == "torch"
    assert sorted(lf.name for lf in rep.leaves) == ["w", "x"]


def test_a_wrong_torch_backward_fails_naming_its_node_input_and_element():
    with pytest.raises(AssertionError) as info:
        assert_function_correct(SmoothClampCubeBug, _x(), 0.7, order=1)
    text = str(info.value)
    first = text.splitlines()[0]
    assert first.startswith("SmoothClampCubeBug.backward gives a wrong gradient for input 'x' "
                            "(argument 1 of forward)")
    assert "engine" in first and "exact" in first
    assert "SmoothClampCubeBugBackward (its own backward" in text  # the node, by its name
    assert "first bad node: SmoothClampCubeBugBackward" in text


def test_a_wrong_torch_backward_with_two_outputs_names_the_input():
    with pytest.raises(AssertionError) as info:
        assert_function_correct(ScaleAndExpBug, _x(seed=1), _x(seed=2), order=1)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("ScaleAndExpBug.backward gives a wrong gradient for input 'x'")
    assert not any("for input 'w'" in ln for ln in lines[:3])  # w's gradient is right


def test_the_torch_check_agrees_with_verify_on_the_captured_graph():
    """Same verdict and same numbers as the documented torch path written by hand."""
    x = _x().requires_grad_(True)
    with sg.capture_torch():
        out = SmoothClampCubeBug.apply(x, 0.7)
    cot = torch.tensor(np.random.default_rng(0).uniform(0.5, 1.5, size=(3, 2)))
    by_hand = sg.verify(out, cot, names={"x": x}, order=1, namespace={})
    with pytest.raises(AssertionError):
        assert_function_correct(SmoothClampCubeBug, _x(), 0.7, order=1)
    from symgrad.testing.checks import RECORDED

    recorded = RECORDED[-1][1]
    assert recorded["status"] == by_hand.to_json()["status"] != "ok"
    row = next(r for r in recorded["leaves"] if r["name"] == "x")
    assert row["max_abs_err"] == by_hand.leaves[0].max_abs_err


def test_symgrad_functions_still_work():
    x = sg.tensor(np.random.default_rng(3).uniform(-1.5, 1.5, size=(4,)), dtype=sg.float64)
    rep = assert_function_correct(SgCube, x)
    assert rep.ok and rep.graph_kind == "symgrad"
    with pytest.raises(AssertionError, match=r"SgCubeBug.backward gives a wrong gradient for "
                                             r"input 'x'"):
        assert_function_correct(SgCubeBug, x)


def test_inputs_of_the_wrong_library_are_a_clear_error():
    sx = sg.tensor([1.0, 2.0], dtype=sg.float64)
    with pytest.raises(TypeError, match="no floating-point torch tensor among the inputs"):
        assert_function_correct(SmoothClamp, sx, 0.7)
    with pytest.raises(TypeError, match="expects an autograd.Function class"):
        assert_function_correct(SmoothClamp.apply, _x(), 0.7)


class RaisingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.exp()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad @ torch.ones(7, 2, dtype=x.dtype)  # a shape error


def test_a_torch_backward_that_raises_fails_naming_the_node_and_the_error():
    with pytest.raises(AssertionError) as info:
        assert_function_correct(RaisingBackward, _x())
    first = str(info.value).splitlines()[0]
    assert first.startswith("RaisingBackwardBackward (its own backward")
    assert "backward raised RuntimeError" in first and "7x2" in first
