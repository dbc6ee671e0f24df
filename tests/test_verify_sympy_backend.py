"""The SymPy backend: every kernel of the NumPy backend, exact on symbols, ties as torch."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

from symgrad.backends import base
from symgrad.backends.numpy_backend import NumpyBackend
from symgrad.backends.sympy_backend import SympyBackend, Undecidable, obj


def _syms(name, shape):
    a = np.empty(shape, dtype=object)
    for i, idx in enumerate(np.ndindex(*shape)):
        a[idx] = sympy.Symbol(f"{name}{i}", real=True)
    return a


def test_has_every_kernel_of_the_numpy_backend():
    be = SympyBackend(sympy)
    names = set(base.KERNELS) | {k for k in dir(NumpyBackend) if not k.startswith("_")}
    # optional kernels (a fast path the op declines without: convolution) are left out on
    # purpose: the SymPy backend runs the op's generic lowering, its exact meaning
    names -= set(base.OPTIONAL)
    assert not [k for k in sorted(names) if not hasattr(be, k)]
    assert not any(hasattr(be, k) for k in base.OPTIONAL)
    # and the meaning-only kernels are the SymPy backend's alone
    assert all(hasattr(be, k) for k in base.MEANING_ONLY)
    assert not any(hasattr(NumpyBackend, k) for k in base.MEANING_ONLY)


def test_kernels_are_exact_on_symbols():
    be = SympyBackend(sympy)
    a, b = _syms("a", (2, 3)), _syms("b", (3, 2))
    p = be.matmul(a, b)
    assert sympy.expand(p[1, 0] - sum(a[1, k] * b[k, 0] for k in range(3))) == 0
    s = be.sum(a, (1,), True)
    assert s.shape == (2, 1) and s[0, 0] == a[0, 0] + a[0, 1] + a[0, 2]
    m = be.mean(a, None, False)
    assert sympy.simplify(m - sum(a.flat) / 6) == 0
    e = be.exp(a)
    assert e[0, 1] == sympy.exp(a[0, 1])
    assert be.sigmoid(a)[0, 0] == 1 / (1 + sympy.exp(-a[0, 0]))
    r = be.reshape(be.transpose(a, (1, 0)), (6,))
    assert list(r) == [a[0, 0], a[1, 0], a[0, 1], a[1, 1], a[0, 2], a[1, 2]]


def test_decisions_need_values_or_assumptions():
    be = SympyBackend(sympy)
    x = _syms("x", (2,))
    with pytest.raises(Undecidable):
        be.gt(x, 0)
    pos = obj(np.array([sympy.Symbol("p", positive=True)], dtype=object))
    assert be.gt(pos, 0).tolist() == [True]
    import mpmath

    from symgrad.symbolic._engine import Evaluator

    bv = SympyBackend(sympy, valuation=Evaluator({x[0]: mpmath.mpf(1), x[1]: mpmath.mpf(1)}))
    # ties: the value is the mean of the tied elements, so the gradient splits as in torch
    m = bv.amax(x, None, False)[()]
    assert sympy.diff(m, x[0]) == sympy.Rational(1, 2)
    bv.ties_first = True  # max(dim) returns indices: the first maximum takes it all
    m = bv.amax(x, None, False)[()]
    assert m == x[0]
    assert bv.relu(np.array([x[0] - 1], dtype=object))[0] == 0  # relu at 0 -> the 0 branch
