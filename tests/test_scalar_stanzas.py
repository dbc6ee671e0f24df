"""Elementwise math written once: the ``Scalar`` of a unary stanza is the only definition.

Checks that the language rejects what backends could not compile, that each stanza's
``grad`` is the derivative of its meaning (SymPy, at sample points away from kinks), and
that every backend's kernels come from the stanza (the backward formula, SymPy meaning,
NumPy, Numba and CUDA-simulator kernels all compute the stanza's expressions).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg  # noqa: F401  (fills the registry)
from symgrad.backends import get_backend
from symgrad.ops import OPS
from symgrad.ops.elementwise import UNARY_FUSED_BACKWARD, scalar_ops, unary_fused_backward
from symgrad.ops.scalar import Scalar, build

UNARY = scalar_ops(1)
POINTS = (-2.5, -0.75, 0.3, 1.7)


def test_the_unary_family_is_on_the_stanza_path():
    assert set(UNARY) >= {"neg", "exp", "log", "sin", "cos", "tanh", "sigmoid", "relu", "sqrt",
                          "abs", "sign", "reciprocal"}
    assert UNARY_FUSED_BACKWARD == unary_fused_backward()
    for op in UNARY_FUSED_BACKWARD:
        assert OPS[op].fused_backward == op + "_backward"


@pytest.mark.parametrize("bad", ["foo(x)", "x.real", "x[0]", "lambda: x", "z + 1",
                                 "__import__('os')", "exp(x) if x else 0"])
def test_the_expression_language_rejects_what_backends_cannot_compile(bad):
    with pytest.raises(ValueError):
        Scalar(bad)


def test_a_grad_may_read_one_saved_operand_only():
    with pytest.raises(ValueError, match="one saved operand"):
        Scalar("tanh(x)", "g * x * y")


def test_build_refuses_to_shadow_the_vocabulary():
    with pytest.raises(ValueError):
        build("exp", ("x",), "exp(x)", {"exp": math.exp})


@pytest.mark.parametrize("op", UNARY)
def test_grad_is_the_derivative_of_the_meaning(op):
    sp = pytest.importorskip("sympy")
    spec = OPS[op]
    x = sp.Symbol("x", real=True)
    meaning = spec.sympy(sp, x)
    derivative = sp.diff(meaning, x)
    formula = spec.grads["self"]
    for v in POINTS:
        if op in ("log", "sqrt") and v <= 0:
            continue
        want = float(derivative.subs(x, v))
        kw = {}
        if spec.saved == ("self",):
            kw["self"] = sg.tensor(v, dtype=sg.float64)
        elif spec.saved == ("result",):
            kw["result"] = sg.tensor(float(meaning.subs(x, v)), dtype=sg.float64)
        got = formula(sg.tensor(1.0, dtype=sg.float64), **kw)
        assert float(got) == pytest.approx(want, rel=1e-12, abs=1e-12), (op, v)


def _sample(op, dtype):
    rng = np.random.default_rng(0)
    x = rng.uniform(-3, 3, 600).astype(dtype)
    if op in ("log", "sqrt"):
        x = np.abs(x) + dtype(0.1)
    x[:4] = (0.0, -0.0, 50.0, -50.0) if op not in ("log", "sqrt") else (1.0, 2.0, 4.0, 9.0)
    return x


@pytest.mark.parametrize("op", UNARY)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_kernels_equal_the_reference_bit_for_bit(op, dtype):
    ref, cpu = get_backend("numpy"), get_backend("cpu")
    x = _sample(op, dtype)
    y = getattr(ref, op)(x)
    np.testing.assert_array_equal(getattr(cpu, op)(x), y)
    if op in UNARY_FUSED_BACKWARD:
        g = np.random.default_rng(1).standard_normal(x.size).astype(dtype)
        saved = y if OPS[op].saved == ("result",) else x
        want = np.asarray(OPS[op].grads["self"](
            sg.tensor(g), **{OPS[op].saved[0]: sg.tensor(saved)}).numpy())
        # n >= FUSED_MIN: the Numba loop, or NumPy for rules calling libm. Numba evaluates
        # ``1 - y * y`` of a float32 y in float64 (its integer literal widens), so float32
        # agrees to rounding; float64 bit for bit
        got = getattr(cpu, op + "_backward")(g, (True,), saved)[0]
        if dtype is np.float32:  # the rule's two or three roundings, in float32 or float64
            assert_close(got, want, terms=3)
        else:
            np.testing.assert_array_equal(got, want)
        one = getattr(cpu, op + "_backward")(g[:1], (True,), saved[:1])  # size 1: Python
        if one is not None:
            assert_close(one[0], want[:1], terms=3)


@pytest.mark.parametrize("op", UNARY)
def test_sympy_backend_replays_the_stanza_meaning(op):
    sp = pytest.importorskip("sympy")
    from symgrad.backends.sympy_backend import SympyBackend

    be = SympyBackend()
    x = sp.Symbol("x", positive=True)
    out = getattr(be, op)(np.array([x], dtype=object))
    assert sp.simplify(out[0] - OPS[op].sympy(sp, x)) == 0
