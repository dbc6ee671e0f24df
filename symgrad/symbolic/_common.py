"""The verifier's shared low-level pieces: no import of another verifier module.

The exception a timed-out check raises, the rounding bound every mode compares with, the
broadcast reduction of a gradient to its input's shape and the full-precision NumPy
lambdify. They live here so that the mode modules (exact, local, glue, fd), the graph
walkers and the custom-Function support can share them without importing one another;
each is re-exported where it was defined before (``exact.TimeoutExpired``,
``local.rounding_bound``, ``local._sum_to``, ``local.lambdify_numpy``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["TimeoutExpired", "BOUND_FACTOR", "rounding_bound", "lambdify_numpy"]


class TimeoutExpired(Exception):
    """The verifier's ``timeout`` ran out (work is chunked so this is prompt)."""


#: The bound's safety factor C (see rounding_bound and docs/verifier.md).
BOUND_FACTOR = 2.0


def rounding_bound(dtype, mag, n, dterm=None, finite=None):
    """The error a correct computation in ``dtype`` may show, per element:

    ``C * eps(dtype) * (n * (M + mean(M)) + D)`` where ``M`` is the magnitude of the terms
    (the sum of |contributions| that make the element, so cancellation is allowed for),
    ``n`` the rounding steps on the path (a few per op, plus one per term summed at the
    fan-in), ``mean(M)`` over the tensor (elements computed from shared quantities: a
    value near 0 among large ones), and ``D`` the rounding of recorded outputs that a
    backward reads (sigmoid, tanh, exp: ``|v| |y| |f''/f'|``). ``C = BOUND_FACTOR``.
    """
    eps = float(np.finfo(np.dtype(dtype) if np.dtype(dtype).kind == "f"
                         else np.float64).eps)
    mag = np.asarray(mag, dtype=np.float64)
    magfin = np.isfinite(mag)
    all_finite = bool(magfin.all())
    fin = magfin if finite is None else (finite & magfin)
    if all_finite and (finite is None or bool(np.all(finite))):
        mean = float(mag.mean()) if mag.size else 0.0  # (the common case: no mask copy)
    else:
        mean = float(np.mean(mag[fin])) if fin.any() else 0.0
    b = mag + mean if all_finite else np.where(magfin, mag, 0.0) + mean
    b = b * np.asarray(n, dtype=np.float64)
    if dterm is not None:
        b = b + np.where(np.isfinite(dterm), dterm, 0.0)
    b *= BOUND_FACTOR * eps
    return np.maximum(b, np.finfo(np.float64).tiny, out=b)


def _sum_to(a: np.ndarray, shape) -> np.ndarray:
    shape = tuple(shape)
    if a.shape == shape:
        return a
    lead = a.ndim - len(shape)
    if lead:
        a = a.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and a.shape[i] != 1)
    if axes:
        a = a.sum(axis=axes, keepdims=True)
    return a.reshape(shape)


def lambdify_numpy(xs, expr, extra: dict):
    """``sympy.lambdify`` for NumPy whose generated code carries every number at full
    precision.

    SymPy's printers write a ``Float`` with the 15 significant digits of its default
    precision, so a parameter such as a clamp bound ``0.17433847556174747`` became
    ``0.174338475561747`` in the generated code and an element lying exactly on the
    bound was judged outside it. Here a Float is printed as ``repr(float(value))``: the
    shortest decimal that reads back as the same double (every float parameter, scalar
    or constant in a meaning came from a double, and the code computes in float64).
    """
    import sympy

    printer = _full_precision_printer()({
        "fully_qualified_modules": False, "inline": True, "allow_unknown_functions": True,
        "user_functions": {k: k for k in extra}})
    return sympy.lambdify(xs, expr, modules=[extra, "numpy"], printer=printer)


_PRINTER = None


def _full_precision_printer():
    global _PRINTER
    if _PRINTER is None:
        from sympy.printing.numpy import NumPyPrinter

        class FullPrecisionNumPyPrinter(NumPyPrinter):
            def _print_Float(self, expr):  # noqa: N802  (SymPy's printer protocol)
                v = float(expr)
                if v != v or v in (float("inf"), float("-inf")):
                    return super()._print_Float(expr)
                return repr(v)

        _PRINTER = FullPrecisionNumPyPrinter
    return _PRINTER
