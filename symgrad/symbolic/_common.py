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

__all__ = ["TimeoutExpired", "BOUND_FACTOR", "rounding_bound", "lambdify_numpy",
           "all_finite", "flat_pair", "random_uniform", "OUTER_FROM", "same_memory"]

#: random arrays with this many elements or more (and two or more dims) are drawn as an
#: outer product (see random_uniform): below it a full draw costs microseconds
OUTER_FROM = 1 << 14


def random_uniform(rng, shape, order: str = "C", full: bool = True):
    """Random values in [-1, 1) of ``shape`` for the verifier's identities, and their
    factors: ``(array, None)`` for independent draws, or ``(array, (a, b))`` where the
    array is the outer product ``a b^T`` of two independent uniform vectors over the
    first dim and the rest (reshaped), for arrays of ``OUTER_FROM`` elements or more.

    Why that is as strong: a check ``<D, v> = 0`` misses a nonzero error ``D`` only where
    ``a^T D b = 0``, a nonzero polynomial in (a, b) (rank-1 matrices span every matrix),
    which continuous random vectors avoid with probability one; its typical size is
    ``|D|_F / 3`` against ``|D|_F / sqrt(3)`` for independent draws, as the bounds (which
    scale with |v|) also shrink. Why: a weight of 200k elements costs 200k random numbers
    otherwise, as much as the product being checked; ``a b^T`` costs one multiplication
    per element, and reductions against it are matrix-vector products (``a^T E b``).
    ``order``: the memory layout of the array (a transposed weight's gradient is 'F');
    ``full=False``: the outer product is not made (None in its place), for callers that
    use the factors only."""
    shape = tuple(int(d) for d in shape)
    n = int(np.prod(shape)) if shape else 1
    if len(shape) < 2 or n < OUTER_FROM:
        v = np.asarray(rng.uniform(-1.0, 1.0, n), dtype=np.float64)  # = 2 random - 1
        return v.reshape(shape, order=order), None
    m = shape[0]
    a = np.asarray(rng.uniform(-1.0, 1.0, m), dtype=np.float64)
    b = np.asarray(rng.uniform(-1.0, 1.0, n // m), dtype=np.float64)
    if not full:
        return None, (a, b)
    if order == "F" and len(shape) == 2:  # column-major: the transpose of a C array
        return np.multiply.outer(b, a).T, (a, b)
    return np.multiply.outer(a, b).reshape(shape), (a, b)


def outer_dot(e, factors) -> float:
    """``<e, a b^T>`` for ``factors = (a, b)``: ``a^T E b`` with E the array as (first
    dim, rest), one matrix-vector product (any memory layout of a 2-d ``e``)."""
    a, b = factors
    e2 = e.reshape(a.size, b.size) if e.ndim != 2 else e
    return float(a @ (e2 @ b))


def all_finite(a) -> bool:
    """Whether every element of the float array ``a`` is finite, in one read of it and no
    temporary in the common case: a sum is finite only if every term is (inf and nan
    propagate; inf - inf is nan); a sum that overflowed is looked at element by element."""
    a = np.asarray(a)
    if a.dtype.kind not in "fc" or a.size == 0:
        return True
    with np.errstate(all="ignore"):
        if np.isfinite(np.sum(a)):
            return True
    return bool(np.isfinite(a).all())


def flat_pair(a, b):
    """``a`` and ``b`` as 1-d arrays pairing their elements by index, without a copy where
    both are laid out alike in memory (a transposed gradient and a tangent drawn in its
    order): ``np.vdot`` of two such arrays then reads each once."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape == b.shape and a.strides == b.strides and \
            (a.flags.c_contiguous or a.flags.f_contiguous):
        return a.ravel(order="K"), b.ravel(order="K")
    return a.reshape(-1), b.reshape(-1)


def same_memory(a, b) -> bool:
    """Whether ``a`` and ``b`` are the same elements of the same memory (same dtype): a
    view compared with the array it views, element for element, at no cost."""
    return (a.dtype == b.dtype and a.shape == b.shape and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def memory_order(a) -> str:
    """'F' for an array laid out column-major only (a transposed view), else 'C'."""
    a = np.asarray(a)
    return "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"


class TimeoutExpired(Exception):
    """The verifier's ``timeout`` ran out (work is chunked so this is prompt)."""


#: The bound's safety factor C (see rounding_bound and docs/verifier.md).
BOUND_FACTOR = 2.0


def exact_zero(s, allowed):
    """Elements whose exact value is 0 at the precision its bound is stated at.

    SymPy's cancellations (and a meaning evaluated in float64) leave residues such as
    1e-44 where the derivative is 0: a relative error against one is meaningless, so
    such an element is judged and shown by its absolute error alone.
    """
    return np.abs(s) <= np.asarray(allowed) * np.finfo(np.float64).eps


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
