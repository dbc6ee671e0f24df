"""Constant folding while a forward is traced on symbols.

Data-dependent structure in a forward (a mask ``x > 0``, a count ``(z > c).sum()``, the
indices of a sort, an index ``k - 1`` computed from them) holds no symbol: the comparisons
that made it were decided at the recorded values, as every branch in the verifier is. Such
values must stay *numbers* with their integer or boolean dtype, or they cannot index,
gather or count (a SymPy sum of booleans is no integer). :class:`FoldingBackend` wraps the
SymPy backend of a trace: a kernel none of whose operands holds a symbol runs on the NumPy
backend (PyTorch's semantics for integers and booleans), and only the arithmetic on
symbols stays symbolic. Float results are handed back as object arrays of numbers, the form
every float tensor has on the symbolic device, so later in-place writes of expressions into
them still work.
"""

from __future__ import annotations

import numpy as np

from ..backends.sympy_backend import is_number, obj

__all__ = ["FoldingBackend", "has_symbols"]

_ACTIVE: list = []  # the backend of the innermost trace (trace.py pushes it)
_REAL: list = []  # non-empty while torch itself runs a call at numbers (no stand-ins made)

#: Kernels that keep running on the SymPy backend: creation (object arrays, so expressions
#: can be written into them), views (a folded copy would break view semantics), in-place
#: writes into the caller's array, and host transfers.
_KEEP = frozenset({
    "full", "empty", "arange", "constant", "from_host", "to_host", "fill_", "copy_", "add_",
    "add_scaled_", "sub_", "mul_", "div_", "setitem", "index_put", "shares_memory", "reshape",
    "transpose", "broadcast_to", "getitem", "diagonal", "copy", "cast", "as_constant",
})


def has_symbols(a) -> bool:
    """Whether ``a`` (an array, a number, an expression, a sequence of them) holds a symbol."""
    if isinstance(a, np.ndarray):
        if a.dtype != object:
            return False
        return any(not is_number(v) for v in a.flat)
    if isinstance(a, (list, tuple)):
        return any(has_symbols(u) for u in a)
    if isinstance(a, (bool, int, float, complex, np.generic)) or a is None:
        return False
    return hasattr(a, "free_symbols") and not is_number(a)


def _numeric(a):
    """An operand free of symbols in NumPy's terms (object arrays of numbers as float64)."""
    if isinstance(a, np.ndarray):
        if a.dtype != object:
            return a
        flat = list(a.flat)
        if flat and all(isinstance(v, (bool, np.bool_)) for v in flat):
            return a.astype(bool)
        return np.asarray([float(v) for v in flat], dtype=np.float64).reshape(a.shape)
    if isinstance(a, (list, tuple)) and not hasattr(a, "_fields"):
        return type(a)(_numeric(u) for u in a)
    if isinstance(a, (bool, int, float, complex, np.generic)) or a is None:
        return a
    if is_number(a):
        f = float(a)
        return int(f) if getattr(a, "is_Integer", False) else f
    return a


def _back(r):
    """A folded result in the symbolic device's form: float arrays as object arrays."""
    if isinstance(r, np.ndarray):
        return obj(r) if r.dtype.kind in "fc" else r
    if isinstance(r, tuple):
        return tuple(_back(u) for u in r)
    if isinstance(r, list):
        return [_back(u) for u in r]
    return r


_WHAT = {"gt": "comparisons", "ge": "comparisons", "lt": "comparisons", "le": "comparisons",
         "eq": "comparisons", "ne": "comparisons", "sort": "sort order", "argmax": "argmax",
         "argmin": "argmin"}


def _structural(r) -> bool:
    """Whether a kernel's result carries decided structure (integers, booleans)."""
    if isinstance(r, tuple):
        return any(_structural(u) for u in r)
    return isinstance(r, np.ndarray) and r.dtype.kind in "biu"


class FoldingBackend:
    """``be`` (a SymPy backend) whose kernels run numerically when no operand is symbolic."""

    def __init__(self, be, decided: list | None = None) -> None:
        from ..backends.numpy_backend import NumpyBackend

        object.__setattr__(self, "_be", be)
        object.__setattr__(self, "_np", NumpyBackend())
        #: what was decided at the recorded values: kernels on symbols with integer or
        #: boolean results (comparisons, sort order, argmax)
        object.__setattr__(self, "decided", decided if decided is not None else [])

    def __getattr__(self, name):
        attr = getattr(self._be, name)
        if name.startswith("_") or name in _KEEP or not callable(attr):
            return attr
        numeric = getattr(self._np, name, None)
        if numeric is None:
            return attr

        def kernel(*args, **kwargs):
            if has_symbols(args) or has_symbols(tuple(kwargs.values())):
                r = attr(*args, **kwargs)
                if _structural(r):
                    what = _WHAT.get(name, name)
                    if what not in self.decided:
                        self.decided.append(what)
                return r
            try:
                nargs = [_numeric(a) for a in args]
                nkw = {k: _numeric(v) for k, v in kwargs.items()}
            except (TypeError, ValueError):  # a number SymPy cannot make a float of
                return attr(*args, **kwargs)
            with np.errstate(all="ignore"):
                return _back(numeric(*nargs, **nkw))

        kernel.__name__ = name
        return kernel

    def full(self, shape, value, np_dtype):
        """Integer and boolean tensors are made as numbers (their dtype kept); float ones as
        object arrays, so expressions can be written into them."""
        if np.dtype(np_dtype).kind in "biu" and not has_symbols(value):
            return np.full(shape, _numeric(value), dtype=np_dtype)
        return self._be.full(shape, value, np_dtype)

    def empty(self, shape, np_dtype):
        if np.dtype(np_dtype).kind in "biu":
            return np.zeros(shape, dtype=np_dtype)
        return self._be.empty(shape, np_dtype)

    def __setattr__(self, name, value) -> None:
        setattr(self._be, name, value)


_INT_METHODS = {"long": "int64", "int": "int32", "short": "int16", "char": "int8",
                "byte": "uint8", "bool": "bool_"}


def _cast_target(name, args, kwargs):
    """The integer or boolean dtype a cast method asks for, else None."""
    from .. import dtypes

    if name in _INT_METHODS:
        return getattr(dtypes, _INT_METHODS[name])
    cands = [kwargs.get("dtype")] + list(args)
    for a in cands:
        d = a if isinstance(a, dtypes.dtype) else getattr(a, "dtype", None) if hasattr(
            a, "_data") else None
        if isinstance(d, dtypes.dtype):
            return d if not (d.is_floating_point or getattr(d, "is_complex", False)) else None
    return None


def decided_cast(orig, name):
    """``Tensor.<name>`` (long, int, bool, to, type ...) whose integer or boolean cast of a
    symbolic tensor is decided at the recorded values (truncation toward zero, as
    PyTorch's; nonzero for bool): piecewise constant, so its meaning there."""
    def method(self, *args, **kwargs):
        from ..tensor import Tensor

        target = None
        if self._device.type == "sympy" and isinstance(self._data, np.ndarray) and \
                self._data.dtype == object:
            target = _cast_target(name, args, kwargs)
        if target is None or not has_symbols(self._data) or not _ACTIVE or \
                getattr(_ACTIVE[-1], "valuation", None) is None:
            return orig(self, *args, **kwargs)
        be = _ACTIVE[-1]
        vals = np.asarray(be.as_constant(self._data), dtype=object)
        num = np.asarray([float(v) for v in vals.flat], dtype=np.float64).reshape(
            self._data.shape)
        kind = np.dtype(target.np).kind
        what = "boolean cast" if kind == "b" else "integer cast"
        if what not in getattr(be, "decided", [what]):
            be.decided.append(what)
        data = (num != 0) if kind == "b" else np.trunc(num).astype(target.np)
        return Tensor._wrap(data, self._device)

    method.__name__ = name
    method.__wrapped__ = orig
    return method


def decided_method(orig, name):
    """``Tensor.<name>`` (isclose, equal ...), computed by symgrad on the data rather than
    through a kernel: with symbols among its tensors, run at the recorded values (a
    comparison, decided there as branches are)."""
    def method(*args, **kwargs):
        from ..tensor import Tensor

        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, Tensor)]
        if not _ACTIVE or getattr(_ACTIVE[-1], "valuation", None) is None or not any(
                t._device.type == "sympy" and has_symbols(t._data) for t in tensors):
            return orig(*args, **kwargs)
        be = _ACTIVE[-1]
        dev = next(t._device for t in tensors if t._device.type == "sympy")

        def num(a):
            if not isinstance(a, Tensor) or a._device.type != "sympy":
                return a
            d = a._data
            if d.dtype == object:
                d = np.asarray([float(v) for v in np.asarray(be.as_constant(d)).flat],
                               dtype=np.float64).reshape(d.shape)
            return Tensor._wrap(np.array(d))

        r = orig(*[num(a) for a in args], **{k: num(v) for k, v in kwargs.items()})
        if "comparisons" not in be.decided:
            be.decided.append("comparisons")
        return Tensor._wrap(r._data, dev) if isinstance(r, Tensor) else r

    method.__name__ = name
    method.__wrapped__ = orig
    return method
