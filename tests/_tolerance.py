"""Float tolerances derived from the dtype and the computation, never from a lucky constant.

Why
---
A float result is only defined up to rounding: the same sum taken in another order, by
another BLAS kernel, with another SIMD width or thread split, differs in its last bits. A
fixed ``rtol=1e-5`` happens to pass on one CPU and misses by 2 ulp on the next. Every float
comparison in the suite therefore asks this module for a bound computed from

* the machine epsilon ``eps`` of the dtype the values were computed in (``np.finfo``): the
  less precise of the two operands' float dtypes (float32 against a float64 reference is a
  float32 comparison), or ``dtype=`` when the caller knows better;
* ``terms``: how many rounding errors can pile up along the computation -- the length of a
  sum or mean, the inner dimension K of a matmul, the number of chained ops, steps x ops of
  an optimizer loop. Add them up along a chain (a matmul with K=8 followed by a sum of 16
  is ``terms=8 + 16``); one elementwise op is one term;
* ``scale``: the magnitude the rounding errors are relative to. By default the largest
  finite ``|expected|`` in the compared block (a norm-wise bound: small elements of a block
  get the block's absolute slack, as BLAS error bounds do). Where the result can cancel
  (a sum of mixed-sign terms, a gradient that is nearly zero), pass the magnitude of the
  *summed terms* instead, e.g. ``scale=(abs(a) @ abs(b)).max()`` for a matmul or
  ``scale=abs(x).sum()`` for a sum, or ``scale=magnitude(expected, *inputs)`` when the
  terms are products of O(1) inputs and weights in [-1, 1]: a sum of n such terms then
  has ``sum|terms| <= n * max|input|``, and ``terms >= n`` supplies the factor n.
  (A single correctly rounded ``a - b`` needs no such care: its error is relative to
  its result.)

The bound (:func:`tolerance`) is::

    bound = ulps * terms * eps * scale        (ulps = SAFETY = 4 unless given)

and :func:`assert_close` requires ``|actual - expected| <= bound`` elementwise.

Reasoning (standard forward error analysis, Higham, *Accuracy and Stability of Numerical
Algorithms*, ch. 3-4): with unit roundoff ``u = eps / 2``, a recursive sum of n terms has
``|fl(sum) - sum| <= gamma_{n-1} * sum|x_i|`` with ``gamma_k = k u / (1 - k u) ~ k u``,
whatever the order of summation (pairwise and blocked orders only do better); a dot product
of length K has ``gamma_K * sum|x_i y_i|``. Two implementations that each satisfy such a
bound differ by at most twice it: ``2 * n * u * S = n * eps * S``. So ``terms * eps * scale``
already covers *both* sides of a comparison against another library. The safety factor
``SAFETY = 4`` covers what that first-order bound leaves out: elementary functions (exp,
log, tanh, pow) that are faithfully but not correctly rounded (1-2 ulp in libm, SVML,
Sleef), fused multiply-adds in one library but not the other, the ``1/(1 - n u)`` term, and
a ``scale`` read from the result rather than from every intermediate. It is deliberately
small: a 0.1% error in float32 is ~8000 eps and fails for any sensible ``terms``.

Special values: NaN must sit at the same positions on both sides (NaN equals NaN only where
*both* are NaN; a NaN on one side only fails and the message lists where); an infinity
must be matched by the same infinity at the same position. Integer and bool arrays (on both
sides) compare exactly. Shapes must be equal: no broadcasting, so a transposed or squeezed
result fails clearly instead of passing by accident.

Inputs may be numpy arrays, Python scalars or sequences, symgrad tensors, torch tensors
(``.detach().cpu().numpy()`` is used where present) or numba device arrays. A Python float
counts as float64: compare ``.item()`` of a float32 tensor with ``dtype=np.float32``.
"""

from __future__ import annotations

import numpy as np

SAFETY = 4
"""Default ``ulps``: the safety factor over the first-order rounding bound (see above)."""

__all__ = ["SAFETY", "as_array", "assert_close", "eps_of", "magnitude", "tolerance"]


def as_array(value) -> np.ndarray:
    """``value`` as a numpy array (tensors of symgrad or torch, device arrays, scalars)."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):
        value = value.detach()
    if hasattr(value, "cpu"):
        value = value.cpu()
    if hasattr(value, "numpy"):
        value = value.numpy()
    elif hasattr(value, "copy_to_host"):  # numba.cuda device array
        value = value.copy_to_host()
    return np.asarray(value)


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind in "fc"


def eps_of(*values, dtype=None) -> float | None:
    """Machine epsilon of ``dtype``, else of the least precise float dtype among ``values``.

    ``None`` when no value is a float array: such comparisons are exact.
    """
    if dtype is not None:
        return float(np.finfo(np.dtype(dtype)).eps)
    arrays = [as_array(v) for v in values]
    floats = [a.dtype for a in arrays if _is_float(a)]
    if not floats:
        return None
    return max(float(np.finfo(d).eps) for d in floats)


def _magnitude(expected: np.ndarray) -> float:
    """Largest finite |value| of the block (0 for an empty or all-nonfinite block)."""
    finite = np.abs(expected[np.isfinite(expected)])
    return float(finite.max()) if finite.size else 0.0


def magnitude(*values) -> float:
    """Largest finite ``|v|`` over all ``values`` (a ``scale`` covering the terms a result
    was summed from when they are the given inputs, or products of them with weights in
    [-1, 1])."""
    return max((_magnitude(as_array(v)) for v in values if v is not None), default=0.0)


def tolerance(expected, *, terms=1, scale=None, ulps=SAFETY, dtype=None, actual=None):
    """The absolute bound ``ulps * terms * eps * scale`` for comparing against ``expected``.

    ``eps`` comes from ``dtype`` or from the less precise float dtype of ``expected`` and
    ``actual``; ``scale`` defaults to max finite ``|expected|``. ``scale`` may also be an
    array broadcastable to the compared shape (an elementwise bound); the result is then an
    array. Returns 0.0 for non-float inputs (exact comparison).
    """
    exp = as_array(expected)
    eps = eps_of(exp, *(() if actual is None else (actual,)), dtype=dtype)
    if eps is None:
        return 0.0
    if terms < 1:
        raise ValueError(f"terms must be >= 1, got {terms}")
    if scale is None:
        scale = _magnitude(exp)
    bound = ulps * terms * eps * np.asarray(scale, dtype=np.float64)
    return float(bound) if bound.ndim == 0 else bound


def _where(mask: np.ndarray, limit: int = 8) -> str:
    idx = [tuple(int(i) for i in ix) for ix in np.argwhere(mask)[:limit]]
    more = int(mask.sum()) - len(idx)
    return f"{idx}{f' and {more} more' if more > 0 else ''}"


def assert_close(actual, expected, *, terms=1, scale=None, ulps=SAFETY, dtype=None, msg=""):
    """Assert ``|actual - expected| <= ulps * terms * eps * scale`` elementwise.

    See the module docstring for how to choose ``terms`` and ``scale``. Shapes must match
    exactly; NaNs must coincide; infinities must coincide with the same sign; integer and
    bool inputs compare exactly.
    """
    a, e = as_array(actual), as_array(expected)
    head = f"{msg}: " if msg else ""
    if a.shape != e.shape:
        raise AssertionError(f"{head}shape mismatch: actual {a.shape} vs expected {e.shape}")
    if not (_is_float(a) or _is_float(e)):
        if not np.array_equal(a, e):
            bad = a != e
            raise AssertionError(f"{head}exact ({a.dtype} vs {e.dtype}) comparison failed at "
                                 f"{_where(bad)}: actual {a[bad][:8]} expected {e[bad][:8]}")
        return
    bound = tolerance(e, terms=terms, scale=scale, ulps=ulps, dtype=dtype, actual=a)
    eps = eps_of(a, e, dtype=dtype)
    a64, e64 = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64), \
        e.astype(np.complex128 if e.dtype.kind == "c" else np.float64)
    an, en = np.isnan(a64), np.isnan(e64)
    if (an != en).any():
        raise AssertionError(f"{head}NaN positions differ (NaN equals NaN only where both are "
                             f"NaN): NaN only in actual at {_where(an & ~en)}, only in "
                             f"expected at {_where(en & ~an)}")
    ai, ei = np.isinf(a64), np.isinf(e64)
    inf_bad = (ai | ei) & ~(ai & ei & (a64 == e64))
    if inf_bad.any():
        raise AssertionError(f"{head}infinities differ at {_where(inf_bad)}: actual "
                             f"{a64[inf_bad][:8]} expected {e64[inf_bad][:8]}")
    finite = ~(an | ai)
    diff = np.zeros(a64.shape)
    diff[finite] = np.abs(a64[finite] - e64[finite])
    bound_b = np.broadcast_to(bound, diff.shape)
    bad = diff > bound_b
    if bad.any():
        worst = tuple(int(i) for i in np.unravel_index(
            int(np.argmax(np.where(bad, diff - bound_b, -np.inf))), diff.shape))
        raise AssertionError(
            f"{head}not close: {int(bad.sum())} of {diff.size} elements exceed the bound "
            f"ulps*terms*eps*scale = {ulps}*{terms}*{eps:.3g}*"
            f"{'array' if np.ndim(scale) else f'{float(bound) / (ulps * terms * eps):.6g}'}"
            f"; worst at {worst}: actual {a64[worst].item()!r} expected {e64[worst].item()!r} "
            f"|diff| {diff[worst]:.6g} > bound {bound_b[worst]:.6g} "
            f"({diff[worst] / max(eps * _magnitude(e64), np.finfo(float).tiny):.3g} eps of "
            f"the block's max); mismatches at {_where(bad)}")
