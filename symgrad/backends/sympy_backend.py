"""The SymPy backend: NumPy object arrays of SymPy (or symengine) expressions.

The verifier replays a recorded graph on this backend: the same op forwards that run
on NumPy arrays run here on arrays of expressions, so composite ops need no second,
hand-written formula. Elementwise kernels are built from each OpSpec's scalar ``sympy``
meaning; structural kernels (reshape, sums, matmul, indexing ...) are NumPy's own
functions on object arrays, with sums built as one ``Add`` (not a chain of ``+``).

Data-dependent decisions (comparisons, ``argmax``, the winner of a ``max``) cannot be
made on symbols alone: the backend asks ``valuation(expr) -> number`` for them. With no
valuation, SymPy's assumptions must decide, else :class:`Undecidable` is raised.
Ties in ``max``/``maximum`` follow PyTorch: the value is the mean of the tied elements,
so the gradient is split evenly among them, as PyTorch's ``amax``/``maximum`` do.

Loaded only by the verifier (``import symgrad`` never imports SymPy).
"""

from __future__ import annotations

import functools

import numpy as np

from ..ops import OPS
from ..ops.elementwise import scalar_kernels
from ..ops.scalar import build, sympy_namespace

__all__ = ["SympyBackend", "Undecidable", "Nonlinear", "obj", "is_number"]


class Undecidable(ValueError):
    """A comparison on symbols that neither assumptions nor a valuation can decide."""


class Nonlinear(Exception):
    """Raised in ``linear_probe`` mode when an op is not linear in its symbolic input."""


_NUM_TYPES = (int, float, bool, np.number, np.bool_)


def is_number(v) -> bool:
    """True for plain numbers and numeric SymPy/symengine atoms."""
    if isinstance(v, _NUM_TYPES):
        return True
    return bool(getattr(v, "is_Number", False))


def obj(x) -> np.ndarray:
    """``x`` as an object array (numbers become Python numbers)."""
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            return x
        return x.astype(object)
    return np.asarray(x, dtype=object) if not isinstance(x, (list, tuple)) else \
        np.array(x, dtype=object)


def _has_symbols(a) -> bool:
    if not isinstance(a, np.ndarray) or a.dtype != object:
        return not is_number(a) and not isinstance(a, np.ndarray)
    for v in a.flat:
        if not is_number(v):
            return True
    return False


class SympyBackend:
    """Kernels on object arrays. ``engine`` is the ``sympy`` or ``symengine`` module."""

    name = "sympy"
    device_type = "sympy"

    def __init__(self, engine=None, valuation=None, linear_probe: bool = False,
                 lazy: bool | None = None) -> None:
        if engine is None:
            import sympy as engine
        self.sp = engine
        self.valuation = valuation
        #: In probe mode a kernel that is not linear in a symbolic operand raises Nonlinear.
        self.linear_probe = linear_probe
        #: build products and sums of structural kernels unevaluated (SymPy only: its
        #: evaluated Mul is ~10x slower; symengine's is fast). ``.doit()`` evaluates.
        self._lazy = (linear_probe if lazy is None else lazy) and \
            getattr(engine, "__name__", "") == "sympy"
        self._unary_cache: dict = {}
        #: a tie in amax/amin: False splits it (PyTorch's max()); True takes the first
        #: element, the one argmax returns (max(dim), which returns indices)
        self.ties_first = False

    def as_constant(self, x):
        """``x`` at its recorded values, free of every symbol: the meaning of a value through
        which torch lets no gradient flow (embedding's padding row). Without a valuation
        (the linearity probe) ``x`` is returned as it is."""
        if self.valuation is None:
            return x
        arr = np.asarray(x, dtype=object)
        out = np.empty(arr.shape, dtype=object)
        for idx in np.ndindex(*arr.shape):
            v = arr[idx]
            out[idx] = v if is_number(v) else self.sp.sympify(float(self.valuation(v)))
        return out

    # -- helpers ---------------------------------------------------------------------
    def _S(self, v):
        return v

    def _add_all(self, terms):
        terms = [t for t in terms if not (is_number(t) and t == 0)]
        if not terms:
            return 0
        if len(terms) == 1:
            return terms[0]
        if self._lazy:
            return self.sp.Add(*terms, evaluate=False)
        return self.sp.Add(*terms)

    def _times(self, a, b):
        """a*b; in probe mode with SymPy left unevaluated (SymPy's Mul of a number and a
        symbol costs ~0.3 ms evaluated, ~20 us not, and probes only need coefficients)."""
        if self._lazy and not (is_number(a) and is_number(b)):
            return self.sp.Mul(a, b, evaluate=False)
        return a * b

    def _decide(self, rel):
        if rel is True or rel is False or isinstance(rel, (bool, np.bool_)):
            return bool(rel)
        name = type(rel).__name__
        if name in ("BooleanTrue", "true"):
            return True
        if name in ("BooleanFalse", "false"):
            return False
        if self.valuation is not None:
            return bool(self.valuation(rel))
        raise Undecidable(f"cannot decide {rel} on symbols without values")

    def _probe(self, *arrays, nonlinear_if: int = 1) -> None:
        """In probe mode: raise Nonlinear if more than ``nonlinear_if - 1`` operands
        are symbolic (``nonlinear_if=1``: any symbolic operand is nonlinear)."""
        if not self.linear_probe:
            return
        n = sum(1 for a in arrays if _has_symbols(a))
        if n >= nonlinear_if:
            raise Nonlinear

    def _scalar_kernel(self, kernel, *arrays, **params):
        """An elementwise kernel from its stanza's ``Scalar`` meaning, element by element."""
        spec = _STANZA_OF[kernel]
        scalar = spec.scalar
        if self.linear_probe and not scalar.linear:
            symbolic = tuple(i for i, a in enumerate(arrays) if _has_symbols(a))
            if symbolic and _nonlinear_in(kernel, symbolic):
                raise Nonlinear
        fn = self._unary_cache.get(kernel)
        if fn is None:
            namespace = sympy_namespace(self.sp)
            namespace["where"] = self._where
            meaning = build(kernel + "_meaning", scalar.inputs + scalar.params,
                            scalar.meaning or scalar.forward, namespace)
            fn = self._unary_cache[kernel] = meaning
        return obj(np.frompyfunc(lambda *xs: fn(*xs, **params), len(arrays), 1)(
            *[obj(a) for a in arrays]))

    def constant(self, expression):
        """A variable-free scalar expression (``2 / sqrt(pi)``), exact: a 0-d object array."""
        out = np.empty((), dtype=object)
        out[()] = build("_const", (), expression, sympy_namespace(self.sp))()
        return out

    def _where(self, c, a, b):
        """A select in a meaning: decided from the values where it can be (a valuation, or
        numbers: relu'(0) = 0 as in PyTorch), else a Piecewise."""
        try:
            return a if self._decide(c) else b
        except Undecidable:
            return self.sp.Piecewise((a, c), (b, True))

    def _spec_binary(self, name, fallback):
        fn = self._unary_cache.get(name)
        if fn is None:
            from ..ops import OPS

            spec = OPS.get(name)
            sp = self.sp
            if spec is not None and callable(spec.sympy) and name in ("add", "sub", "mul",
                                                                        "div"):
                meaning = spec.sympy
                fn = np.frompyfunc(lambda x, y: meaning(sp, x, y), 2, 1)
            else:
                fn = np.frompyfunc(lambda x, y: fallback(sp, x, y), 2, 1)
            self._unary_cache[name] = fn
        return fn

    # -- elementwise: the unary math kernels are generated from the ops' stanzas below the
    # class (``_scalar_method``) -----------------------------------------------------------
    def add(self, a, b):
        return obj(np.add(obj(a), obj(b)))

    def sub(self, a, b):
        return obj(np.subtract(obj(a), obj(b)))

    def mul(self, a, b):
        self._probe(a, b, nonlinear_if=2)
        if self._lazy:
            return obj(np.frompyfunc(self._times, 2, 1)(obj(a), obj(b)))
        return obj(np.multiply(obj(a), obj(b)))

    def div(self, a, b):
        self._probe(b)
        return obj(self._spec_binary("div", lambda sp, x, y: x / y)(obj(a), obj(b)))

    def pow(self, a, b):
        self._probe(a, b)
        sp = self.sp

        def p(x, y):
            if isinstance(y, float) and y.is_integer():
                y = int(y)
            return sp.Pow(x, y) if not (is_number(x) and is_number(y)) else x ** y

        return obj(np.frompyfunc(p, 2, 1)(obj(a), obj(b)))

    def _pick(self, a, b, larger: bool):
        def one(x, y):
            if is_number(x) and is_number(y):
                return x if (x >= y) == larger else y
            if self.valuation is None:
                try:
                    gt = self._decide(x > y)
                    lt = self._decide(x < y)
                except Undecidable:
                    return self.sp.Max(x, y) if larger else self.sp.Min(x, y)
            else:
                gt = self._decide(x > y)
                lt = self._decide(x < y)
            if not gt and not lt:  # a tie: PyTorch splits the gradient evenly
                return (x + y) / 2
            return x if gt == larger else y

        return obj(np.frompyfunc(one, 2, 1)(obj(a), obj(b)))

    def maximum(self, a, b):
        self._probe(a, b)
        return self._pick(a, b, True)

    def minimum(self, a, b):
        self._probe(a, b)
        return self._pick(a, b, False)

    def _compare(self, a, b, op):
        import operator

        f = getattr(operator, op)
        a, b = obj(a), obj(b)
        out = np.frompyfunc(lambda x, y: self._decide(f(x, y)), 2, 1)(a, b)
        return np.asarray(out, dtype=bool)

    def gt(self, a, b):
        return self._compare(a, b, "gt")

    def ge(self, a, b):
        return self._compare(a, b, "ge")

    def lt(self, a, b):
        return self._compare(a, b, "lt")

    def le(self, a, b):
        return self._compare(a, b, "le")

    def _equal(self, a, b, want):
        def one(x, y):
            if is_number(x) and is_number(y):
                return (x == y) == want
            if x == y:  # structurally equal
                return want
            return self._decide(self.sp.Eq(x, y)) == want

        out = np.frompyfunc(one, 2, 1)(obj(a), obj(b))
        return np.asarray(out, dtype=bool)

    def eq(self, a, b):
        return self._equal(a, b, True)

    def ne(self, a, b):
        return self._equal(a, b, False)

    @staticmethod
    def logical_or(a, b):
        return np.logical_or(np.asarray(a, dtype=bool), np.asarray(b, dtype=bool))

    @staticmethod
    def logical_and(a, b):
        return np.logical_and(np.asarray(a, dtype=bool), np.asarray(b, dtype=bool))

    @staticmethod
    def logical_not(a):
        return np.logical_not(np.asarray(a, dtype=bool))

    # -- reductions --------------------------------------------------------------------
    @staticmethod
    def _axes(x, axis):
        if axis is None:
            return tuple(range(x.ndim))
        if isinstance(axis, int):
            axis = (axis,)
        return tuple(sorted(a % max(x.ndim, 1) for a in axis))

    def _reduce(self, x, axis, keepdims, fn):
        x = obj(x)
        axes = self._axes(x, axis)
        if x.ndim == 0:
            return obj(np.asarray(fn([x[()]]), dtype=object).reshape(()))
        rest = [d for d in range(x.ndim) if d not in axes]
        moved = np.transpose(x, rest + list(axes))
        out_shape = tuple(x.shape[d] for d in rest)
        n = int(np.prod([x.shape[d] for d in axes])) if axes else 1
        flat = moved.reshape(-1, n) if moved.size else np.empty((int(np.prod(out_shape)), 0),
                                                                  dtype=object)
        out = np.empty(flat.shape[0], dtype=object)
        for i in range(flat.shape[0]):
            out[i] = fn(list(flat[i]))
        out = out.reshape(out_shape)
        if keepdims:
            out = out.reshape(tuple(1 if d in axes else s for d, s in enumerate(x.shape)))
        return out

    def sum(self, x, axis=None, keepdims=False, dtype=None):
        return self._reduce(x, axis, keepdims, self._add_all)

    def mean(self, x, axis=None, keepdims=False):
        x = obj(x)
        axes = self._axes(x, axis)
        n = int(np.prod([x.shape[d] for d in axes])) if axes else 1
        inv = self.sp.Rational(1, n) if n else float("nan")
        return self._reduce(x, axis, keepdims, lambda ts: self._add_all(ts) * inv)

    def _extreme(self, vals, larger):
        nums = [v for v in vals]
        if all(is_number(v) for v in nums):
            return max(nums) if larger else min(nums)
        if self.valuation is None:
            return self.sp.Max(*nums) if larger else self.sp.Min(*nums)
        keyed = [self.valuation(v) for v in nums]
        best = max(keyed) if larger else min(keyed)
        tied = [v for v, k in zip(nums, keyed) if k == best]
        if len(tied) == 1 or self.ties_first:
            return tied[0]
        return self._add_all(tied) / len(tied)  # PyTorch's amax splits ties evenly

    def amax(self, x, axis=None, keepdims=False):
        self._probe(x)
        return self._reduce(x, axis, keepdims, lambda vs: self._extreme(vs, True))

    def amin(self, x, axis=None, keepdims=False):
        self._probe(x)
        return self._reduce(x, axis, keepdims, lambda vs: self._extreme(vs, False))

    def _arg(self, x, axis, keepdims, larger):
        x = obj(x)
        if _has_symbols(x):
            if self.valuation is None:
                raise Undecidable("argmax/argmin of symbols needs values")
            vals = np.frompyfunc(lambda v: float(self.valuation(v)), 1, 1)(x).astype(float)
        else:
            vals = x.astype(float)
        f = np.argmax if larger else np.argmin
        return np.asarray(f(vals, axis=axis, keepdims=keepdims), dtype=np.int64)

    def argmax(self, x, axis=None, keepdims=False):
        return self._arg(x, axis, keepdims, True)

    def argmin(self, x, axis=None, keepdims=False):
        return self._arg(x, axis, keepdims, False)

    # -- matrix products ---------------------------------------------------------------
    def matmul(self, a, b):
        self._probe(a, b, nonlinear_if=2)
        a_num = isinstance(a, np.ndarray) and a.dtype != object
        b_num = isinstance(b, np.ndarray) and b.dtype != object
        if a_num and b_num:
            return obj(np.matmul(a, b))
        a = a if isinstance(a, np.ndarray) else obj(a)
        b = b if isinstance(b, np.ndarray) else obj(b)
        if a.ndim == 1 and b.ndim == 1:
            return obj(np.asarray(self._mm(a[None, :], b[:, None])[0, 0], dtype=object))
        if a.ndim == 1:
            return self.matmul(a[None, :], b)[..., 0, :]
        if b.ndim == 1:
            return self.matmul(a, b[:, None])[..., 0]
        if a.ndim == 2 and b.ndim == 2:
            return self._mm(a, b)
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        a = np.broadcast_to(a, batch + a.shape[-2:])
        b = np.broadcast_to(b, batch + b.shape[-2:])
        out = np.empty(batch + (a.shape[-2], b.shape[-1]), dtype=object)
        for idx in np.ndindex(*batch):
            out[idx] = self._mm(a[idx], b[idx])
        return out

    def _mm(self, a, b):
        """2-D product as one Add per element, iterating the sparser operand's nonzeros."""
        m, k = a.shape
        n = b.shape[1]
        anz = np.not_equal(a, 0).astype(bool) if a.size else np.zeros(a.shape, bool)
        bnz = np.not_equal(b, 0).astype(bool) if b.size else np.zeros(b.shape, bool)
        if a.dtype != object:
            a = a.astype(object)  # Python floats, so products are plain numbers or exprs
        if b.dtype != object:
            b = b.astype(object)
        terms = [[[] for _ in range(n)] for _ in range(m)]
        if anz.sum() * n <= bnz.sum() * m:
            for i, kk in zip(*np.nonzero(anz)):
                av = a[i, kk]
                row = terms[i]
                for j in np.nonzero(bnz[kk])[0]:
                    row[j].append(self._times(av, b[kk, j]))
        else:
            for kk, j in zip(*np.nonzero(bnz)):
                bv = b[kk, j]
                for i in np.nonzero(anz[:, kk])[0]:
                    terms[i][j].append(self._times(a[i, kk], bv))
        out = np.empty((m, n), dtype=object)
        for i in range(m):
            for j in range(n):
                out[i, j] = self._add_all(terms[i][j])
        return out

    # -- structure ---------------------------------------------------------------------
    @staticmethod
    def reshape(x, shape):
        return np.reshape(obj(x), shape)

    @staticmethod
    def transpose(x, axes):
        return np.transpose(obj(x), axes)

    @staticmethod
    def broadcast_to(x, shape):
        return np.broadcast_to(obj(x), shape)

    @staticmethod
    def getitem(x, index):
        if isinstance(index, tuple):
            index = tuple(np.asarray(i) if isinstance(i, list) else i for i in index)
        return obj(np.asarray(obj(x)[index], dtype=object))

    @staticmethod
    def setitem(x, index, value):
        x[index] = obj(value) if isinstance(value, np.ndarray) else value

    @staticmethod
    def index_put(x, index, values, accumulate=False):
        """``x[index] = values`` (``+=`` with repeated indices adding up); returns ``x``."""
        x = obj(x) if x.dtype != object else x
        if accumulate:
            flat = []
            for i in index:
                if isinstance(i, np.ndarray) and i.dtype == np.bool_:
                    flat.extend(np.nonzero(i))
                else:
                    flat.append(i)
            np.add.at(x, tuple(flat), obj(values) if isinstance(values, np.ndarray) else values)
        else:
            x[index] = obj(values) if isinstance(values, np.ndarray) else values
        return x

    @staticmethod
    def diagonal(x, offset, dim1, dim2):
        from .numpy_backend import diagonal_view

        return diagonal_view(obj(x), offset, dim1, dim2)

    @staticmethod
    def where(cond, a, b):
        return obj(np.where(np.asarray(cond, dtype=bool), obj(a), obj(b)))

    @staticmethod
    def cast(x, np_dtype):
        if isinstance(x, np.ndarray) and x.dtype == object:
            kind = np.dtype(np_dtype).kind
            if kind in "biu" and not _has_symbols(x):
                return x.astype(np_dtype)
            return x
        if isinstance(x, np.ndarray) and np.dtype(np_dtype).kind in "biu":
            return x.astype(np_dtype)
        if isinstance(x, np.ndarray) and x.dtype.kind == "b":
            return obj(x.astype(np.float64))  # True * expr would be a SymPy boolean
        return obj(x)

    @staticmethod
    def copy(x):
        return np.array(obj(x), dtype=object, copy=True)

    @staticmethod
    def concatenate(xs, axis):
        return np.concatenate([obj(x) for x in xs], axis=axis)

    @staticmethod
    def stack(xs, axis):
        return np.stack([obj(x) for x in xs], axis=axis)

    @staticmethod
    def full(shape, value, np_dtype):
        return np.full(shape, value, dtype=object)

    @staticmethod
    def empty(shape, np_dtype):
        return np.full(shape, 0, dtype=object)

    @staticmethod
    def arange(start, end, step, np_dtype):
        return np.arange(start, end, step, dtype=np_dtype)

    @staticmethod
    def from_host(x):
        return x

    @staticmethod
    def to_host(x):
        return x

    # -- in place (object arrays only; the caller owns ``dst``) ------------------------
    @staticmethod
    def fill_(x, value):
        x[...] = value

    @staticmethod
    def copy_(dst, src):
        dst[...] = obj(src)

    @staticmethod
    def add_(dst, src):
        dst[...] = np.add(dst, obj(src))

    def add_scaled_(self, dst, src, alpha):
        dst[...] = np.add(dst, self.mul(src, alpha))

    @staticmethod
    def sub_(dst, src):
        dst[...] = np.subtract(dst, obj(src))

    def mul_(self, dst, src):
        dst[...] = self.mul(dst, src)

    def div_(self, dst, src):
        dst[...] = self.div(dst, src)

    @staticmethod
    def shares_memory(a, b) -> bool:
        return np.may_share_memory(a, b)

    # -- issue 21 tensor functions: scans and sorting along one axis --------------------------
    def cumsum(self, x, axis):
        return obj(np.cumsum(obj(x), axis=axis))

    def cumprod(self, x, axis):
        self._probe(x)
        return obj(np.cumprod(obj(x), axis=axis))

    def sort(self, x, axis, descending=False):
        """Ordered by the recorded values (a valuation), as argmax decides its index."""
        from .numpy_backend import sort_by_keys

        self._probe(x)
        x = obj(x)
        if _has_symbols(x):
            if self.valuation is None:
                raise Undecidable("sort of symbols needs values")
            keys = np.frompyfunc(lambda v: float(self.valuation(v)), 1, 1)(x).astype(float)
        else:
            keys = x.astype(float)
        values, idx = sort_by_keys(x, keys, axis, descending)
        return obj(values), idx

    def __getattr__(self, name):
        """Kernels added to the NumPy backend later: elementwise ones via their OpSpec."""
        from ..ops import OPS

        spec = OPS.get(name)
        if spec is not None and callable(spec.sympy):
            meaning, sp = spec.sympy, self.sp

            def kernel(*arrays, **params):
                self._probe(*arrays)
                fn = np.frompyfunc(lambda *xs: meaning(sp, *xs, **params), len(arrays), 1)
                return obj(fn(*[obj(a) for a in arrays]))

            return kernel
        raise AttributeError(f"SympyBackend has no kernel {name!r}")


@functools.cache
def _nonlinear_in(kernel: str, symbolic: tuple[int, ...]) -> bool:
    """Is the stanza's meaning nonlinear when the inputs at ``symbolic`` are symbols (some
    second partial among them is nonzero)? ``x + value * t1 * t2`` is linear in x, and in
    t1 or t2 alone, not in both. Decided once per kernel and pattern, on free symbols."""
    import sympy

    scalar = _STANZA_OF[kernel].scalar
    xs = sympy.symbols(f"v0:{len(scalar.inputs)}", real=True)
    ps = sympy.symbols(f"p0:{len(scalar.params)}", real=True)
    namespace = sympy_namespace(sympy)
    f = build(kernel + "_probe", scalar.inputs + scalar.params,
              scalar.meaning or scalar.forward, namespace)(*xs, *ps)
    return any(sympy.diff(f, xs[i], xs[j]) != 0
               for i in symbolic for j in symbolic if i <= j)


def _scalar_method(kernel: str):
    def method(self, *args, **params):
        n = len(_STANZA_OF[kernel].scalar.inputs)
        params.update(zip(_STANZA_OF[kernel].scalar.params, args[n:]))
        return self._scalar_kernel(kernel, *args[:n], **params)

    method.__name__ = kernel
    method.__doc__ = f"{kernel}: the meaning of its stanza's ``Scalar``, on each element."
    method.from_stanza = True
    return method


#: kernel -> the op whose stanza defines it
_STANZA_OF = {s.kernel: s for s in OPS.values() if s.kernel is not None}
# Kernels the class defines itself are the vocabulary on symbols: the operators (+ - * /,
# comparisons, logical ones), pow, and maximum/minimum/where, which decide branches and
# PyTorch's ties at recorded values and evaluate lazily in probe mode; every op's math
# (exp, addcmul, atan2, softplus, ...) comes from its stanza's meaning.
for _kernel in scalar_kernels():
    if _kernel not in SympyBackend.__dict__:
        setattr(SympyBackend, _kernel, _scalar_method(_kernel))
