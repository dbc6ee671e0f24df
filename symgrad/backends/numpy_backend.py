"""The plain NumPy reference backend: the oracle the compiled backends are tested against."""

from __future__ import annotations

import ast
import math

import numpy as np

from ..dtypes import HALF_NP, via_float32
from ..ops import OPS
from ..ops.elementwise import scalar_kernels
from ..ops.scalar import TRANSCENDENTAL, build
from . import conv_numpy as _conv

__all__ = ["NUMPY_MATH", "NumpyBackend", "numpy_kernel"]

def _erf1(v):
    return math.erf(v)


#: erf as a ufunc: the C library's erf (what ``math.erf`` calls) in a Numba loop, built on
#: first use; ``np.vectorize(math.erf)`` costs ~1 µs a Python call per element (a GPT's
#: exact GELU spent most of its step there)
_ERF_UFUNC = None


def _erf_ufunc():
    global _ERF_UFUNC
    if _ERF_UFUNC is None:
        try:
            import numba

            _ERF_UFUNC = numba.vectorize(["float64(float64)"], cache=True)(_erf1)
        except Exception:  # no Numba: the Python loop
            _ERF_UFUNC = np.vectorize(math.erf, otypes=[np.float64])
    return _ERF_UFUNC


def _erf(x):
    """erf elementwise through the C library's ``erf`` (NumPy has no erf ufunc; SciPy's
    would cost 0.2 s of every ``import symgrad`` and is not a dependency), in float64,
    keeping a float dtype."""
    a = np.asarray(x)
    if a.dtype.kind in "fiub" and a.size > 16:
        out = _erf_ufunc()(a.astype(np.float64, copy=False))
    else:
        out = np.vectorize(math.erf, otypes=[np.float64])(a)
    return out.astype(a.dtype if a.dtype.kind == "f" else np.float64, copy=False)


def _log10(x):
    """log10 rounded once: NumPy's float32 log10 is 1 ulp off at powers of ten (log10(1000)
    = 3.0000002), where torch gives 3; computed in float64 and rounded to float32."""
    a = np.asarray(x)
    if a.dtype == np.float32:
        return np.log10(a.astype(np.float64)).astype(np.float32)
    return np.log10(a)


def _pow(a, b):
    if isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b < 0 \
            and np.asarray(a).dtype.kind in "iu":
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    return np.power(a, b)


def _torch_sign(x, out=None):
    """NumPy's sign, but 0 (not NaN) for NaN: torch 2.13 computes (0 < x) - (x < 0)."""
    s = np.sign(x) if out is None else np.sign(x, out=out)
    if getattr(s, "dtype", None) is not None and s.dtype.kind == "f":
        nan = np.isnan(s)
        if nan.any():
            if not isinstance(s, np.ndarray):
                return s.dtype.type(0)
            s[nan] = 0
    return s


#: The scalar-math vocabulary (symgrad/ops/scalar.py) as NumPy ufuncs.
NUMPY_MATH = {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
              "sqrt": np.sqrt, "abs": np.abs, "sign": _torch_sign, "where": np.where,
              "maximum": np.maximum, "minimum": np.minimum, "log1p": np.log1p,
              "log2": np.log2, "log10": _log10,
              "expm1": np.expm1, "erf": _erf, "atan2": np.arctan2, "hypot": np.hypot,
              "pow": _pow, "pi": math.pi}


#: The language's arithmetic operators as NumPy ufuncs (for in-place ``out=`` forms).
_OPERATOR_UFUNCS = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply,
                    ast.Div: np.true_divide}


def _one_operator(kernel: str) -> bool:
    scalar = next(s for s in OPS.values() if s.kernel == kernel).scalar
    if len(scalar.inputs) != 2 or ";" in scalar.forward:
        return False
    tree = ast.parse(scalar.forward, mode="eval").body
    return len(scalar.inputs) == 2 and not scalar.params and isinstance(tree, ast.BinOp) \
        and type(tree.op) in _OPERATOR_UFUNCS and isinstance(tree.left, ast.Name) \
        and isinstance(tree.right, ast.Name)


_CONSTANTS: dict = {}


def _channels_last_order(xs):
    """The NHWC / NDHWC axis order when every input is laid out so (and not contiguous),
    as torch's ``suggest_memory_format`` agreement in ``cat``; else None."""
    ndim = np.ndim(xs[0])
    if ndim not in (4, 5):
        return None
    order = (0, *range(2, ndim), 1)
    for x in xs:
        if x.flags.c_contiguous or not x.transpose(order).flags.c_contiguous:
            return None
    return order


def constant_value(expression: str) -> float:
    """A variable-free scalar expression in float64 (cached: formulas ask per call)."""
    value = _CONSTANTS.get(expression)
    if value is None:
        value = _CONSTANTS[expression] = float(build("_const", (), expression, NUMPY_MATH)())
    return value


def _quiet(fn):
    """NumPy warns on log(-1) or 1/0; PyTorch silently gives nan/inf, so do we."""

    def kernel(*args, **params):
        with np.errstate(all="ignore"):
            return fn(*args, **params)

    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


def diagonal_view(x, offset: int, dim1: int, dim2: int):
    """``torch.diagonal``: the ``offset`` diagonal of dims ``dim1 != dim2`` (normalized) as
    the last dim, a *writeable* view (np.diagonal's is read-only; einsum's is not). Object
    arrays too, so the SymPy backend shares it."""
    moved = np.moveaxis(x, (dim1, dim2), (-2, -1))
    n1, n2 = moved.shape[-2:]
    if offset >= 0:
        n = max(0, min(n1, n2 - offset))
        moved = moved[..., :n, offset:offset + n]
    else:
        n = max(0, min(n1 + offset, n2))
        moved = moved[..., -offset:-offset + n, :n]
    return np.einsum("...ii->...i", moved)


class NumpyBackend:
    name = "numpy"
    device_type = "cpu"

    # the elementwise kernels (add, mul, exp, tanh, where, ...) are generated from the ops'
    # stanzas below the class (``numpy_kernel``), and so are their fused backwards

    @staticmethod
    def sum(x, axis=None, keepdims=False, dtype=None):
        dtype = getattr(dtype, "np", dtype)  # sum(dtype=symgrad.float64): its NumPy twin
        return np.asarray(np.sum(x, axis=axis, keepdims=keepdims, dtype=dtype))

    @staticmethod
    def mean(x, axis=None, keepdims=False):
        return np.asarray(np.mean(x, axis=axis, keepdims=keepdims), dtype=x.dtype)

    @staticmethod
    def amax(x, axis=None, keepdims=False):
        return np.asarray(np.max(x, axis=axis, keepdims=keepdims))

    @staticmethod
    def amin(x, axis=None, keepdims=False):
        return np.asarray(np.min(x, axis=axis, keepdims=keepdims))

    @staticmethod
    def argmax(x, axis=None, keepdims=False):
        return np.asarray(np.argmax(x, axis=axis, keepdims=keepdims), dtype=np.int64)

    @staticmethod
    def argmin(x, axis=None, keepdims=False):
        return np.asarray(np.argmin(x, axis=axis, keepdims=keepdims), dtype=np.int64)

    @staticmethod
    def matmul(a, b):
        return np.matmul(a, b)

    @staticmethod
    def reshape(x, shape):
        # the method: np.reshape's argument handling costs ~2 µs a call, the method ~0.4
        return x.reshape(shape) if type(x) is np.ndarray else np.reshape(x, shape)

    @staticmethod
    def transpose(x, axes):
        return x.transpose(axes) if type(x) is np.ndarray else np.transpose(x, axes)

    @staticmethod
    def broadcast_to(x, shape):
        return np.broadcast_to(x, shape)

    @staticmethod
    def getitem(x, index):
        return np.asarray(x[index])

    @staticmethod
    def diagonal(x, offset, dim1, dim2):
        return diagonal_view(x, offset, dim1, dim2)

    @staticmethod
    def setitem(x, index, value):
        x[index] = value

    @staticmethod
    def index_put(x, index, values, accumulate=False):
        """``x[index] = values`` (or ``+=`` with repeats adding up); returns ``x``."""
        if accumulate:
            flat = []
            for i in index:  # np.add.at wants integer arrays: masks become their nonzeros
                if isinstance(i, np.ndarray) and i.dtype == np.bool_:
                    flat.extend(np.nonzero(i))
                else:
                    flat.append(i)
            np.add.at(x, tuple(flat), values)
        else:
            x[index] = values
        return x

    @staticmethod
    def cast(x, np_dtype):
        return via_float32(np.asarray(x), np.dtype(np_dtype))

    @staticmethod
    def copy(x):
        return np.array(x, copy=True, order="C")

    @staticmethod
    def concatenate(xs, axis):
        """torch.cat's layout: channels-last when every 4-D/5-D input is, else contiguous
        (numpy alone would follow the first input's strides, e.g. a transposed one's)."""
        xs = [np.asarray(x) for x in xs]
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        order = _channels_last_order(xs)
        if order is None:
            return np.concatenate(xs, axis=axis, out=np.empty(shape, np.result_type(*xs)))
        out = np.empty([shape[d] for d in order], np.result_type(*xs)).transpose(
            np.argsort(order))
        return np.concatenate(xs, axis=axis, out=out)

    @staticmethod
    def stack(xs, axis):
        """torch.stack's layout: contiguous (numpy alone would follow the inputs' strides,
        e.g. transposed ones'); channels-last inputs keep numpy's choice."""
        xs = [np.asarray(x) for x in xs]
        if _channels_last_order(xs) is not None:
            return np.stack(xs, axis=axis)
        shape = list(xs[0].shape)
        shape.insert(axis if axis >= 0 else len(shape) + 1 + axis, len(xs))
        return np.stack(xs, axis=axis, out=np.empty(shape, np.result_type(*xs)))

    @staticmethod
    def full(shape, value, np_dtype):
        return np.full(shape, value, dtype=np_dtype)

    @staticmethod
    def empty(shape, np_dtype):
        return np.empty(shape, dtype=np_dtype)

    @staticmethod
    def arange(start, end, step, np_dtype):
        return np.arange(start, end, step, dtype=np_dtype)

    @staticmethod
    def from_host(x):
        return x

    @staticmethod
    def to_host(x):
        return x

    @staticmethod
    def fill_(x, value):
        x[...] = value

    @staticmethod
    def copy_(dst, src):
        if dst.dtype in HALF_NP and getattr(src, "dtype", None) != dst.dtype:
            src = via_float32(np.asarray(src), dst.dtype)
        np.copyto(dst, src, casting="unsafe")

    @staticmethod
    def add_scaled_(dst, src, alpha):
        """``dst += alpha * src`` (torch's ``add_(other, alpha=)``), alpha in dst's dtype: an
        axpy, like matmul a linear-algebra kernel rather than an op's math."""
        np.add(dst, np.multiply(src, dst.dtype.type(alpha)), out=dst, casting="unsafe")

    # add_, sub_, mul_, div_ (``dst op= src``) are generated from the stanzas below the class

    @staticmethod
    def shares_memory(a, b) -> bool:
        return np.may_share_memory(a, b)

    @staticmethod
    def constant(expression: str) -> float:
        """A variable-free expression of the scalar language (``2 / sqrt(pi)``) as tensor
        formulas read it: the float64 the generated kernels compute."""
        return constant_value(expression)

    # -- issue 21 tensor functions: scans and sorting along one axis --------------------------
    @staticmethod
    def cumsum(x, axis):
        return np.cumsum(x, axis=axis)

    @staticmethod
    def cumprod(x, axis):
        return np.cumprod(x, axis=axis)

    @staticmethod
    def sort(x, axis, descending=False):
        """(values, int64 indices) along ``axis``, stable; NaN sorts as the largest, and
        ties keep their order in both directions (torch's ``stable=True``)."""
        return sort_by_keys(x, x, axis, descending)

    # -- convolution: im2col into one buffer + one batched BLAS product (conv_numpy.py) -------
    @staticmethod
    def convolution(input, weight, bias, stride, padding, dilation, groups):  # noqa: A002
        """conv1d/conv2d forward in one call, or None to decline (the op's generic lowering
        then runs): float arrays of one dtype, non-empty sizes."""
        if not _conv.accepts(input, weight, bias):
            return None
        geo = _conv.geometry(input.shape, weight.shape, stride, padding, dilation, groups)
        return None if geo is None else _conv.forward(input, weight, bias, geo)


def sort_by_keys(x, keys, axis, descending):
    """``x`` sorted along ``axis`` by the NumPy array ``keys`` (stable): (values, indices)."""
    if descending:
        n = keys.shape[axis]
        idx = (n - 1) - np.flip(np.argsort(np.flip(keys, axis), axis=axis, kind="stable"), axis)
    else:
        idx = np.argsort(keys, axis=axis, kind="stable")
    idx = idx.astype(np.int64)
    return np.take_along_axis(x, idx, axis=axis), idx


def numpy_kernel(kernel: str):
    """``be.<kernel>(*inputs, *params)`` from the op's ``Scalar.forward``, on whole arrays
    of ufuncs.

    Expressions that may meet a pole or leave the domain (exp, log, sqrt, division) run
    with NumPy's warnings off, as PyTorch gives nan/inf silently; "same" dtype ops keep
    the input's dtype (``maximum(x, 0)`` on bools)."""
    spec = next(s for s in OPS.values() if s.kernel == kernel)
    scalar = spec.scalar
    if _one_operator(kernel) and spec.dtype_rule != "same":
        # ``a + b`` is the ufunc itself (no Python frame around it: a scalar graph's
        # every node calls one)
        ufunc = _OPERATOR_UFUNCS[type(ast.parse(scalar.forward, mode="eval").body.op)]
        return staticmethod(_quiet(ufunc) if _may_warn(scalar.forward, set()) else ufunc)
    # constants folded to Python floats: NumPy's float64 scalars (np.sqrt(2)) would promote
    # a float32 array to float64, where torch computes in float32
    fn = build(kernel + "_forward", scalar.inputs + scalar.params, scalar.forward, NUMPY_MATH,
               fold_constants=constant_value)
    if spec.dtype_rule == "same":
        plain = fn

        def fn(x, *params, **kw):
            out = plain(x, *params, **kw)
            return out if out.dtype == x.dtype else out.astype(x.dtype, copy=False)

    if _may_warn(scalar.forward, scalar.calls()):
        fn = _quiet(fn)
    fn.__name__ = kernel
    fn.__doc__ = f"{kernel}: ``{scalar.forward}`` on NumPy arrays (generated)."
    return staticmethod(fn)


def _may_warn(text: str, calls: set) -> bool:
    """Can the expression meet a pole or leave a domain (NumPy would warn)?"""
    return bool(calls & (TRANSCENDENTAL - {"sin", "cos", "tanh"})) or "/" in text


def numpy_rule(op: str, index: int):
    """``rule(g, <values grad ``index`` reads>, <params>)``: the stanza's grad on arrays."""
    scalar = OPS[op].scalar
    fn = build(f"{op}_np_rule_{index}", ("g",) + scalar.reads(index) + scalar.param_reads(index),
               scalar.grads[index], NUMPY_MATH, fold_constants=constant_value)
    return _quiet(fn) if _may_warn(scalar.grads[index], scalar.calls("grad")) else fn


def saved_layout(op: str) -> list:
    """For each grad of the op's stanza: (input index, positions in ``OpSpec.saved`` of the
    values it reads, positions of the params it reads); the saved operands arrive in
    ``OpSpec.saved`` order."""
    spec = OPS[op]
    scalar = spec.scalar
    name_of = {**dict(zip(scalar.inputs, spec.inputs)), "y": "result"}
    out = []
    for i, text in enumerate(scalar.grads):
        if text is None:
            continue
        reads = [spec.saved.index(name_of[v]) for v in scalar.reads(i)]
        params = [spec.saved.index(p) for p in scalar.param_reads(i)]
        out.append((i, reads, params))
    return out


def numpy_inplace(kernel: str):
    """``be.<kernel>_(dst, src)``: ``dst = dst <op> src`` in place with no temporary, for
    a stanza whose forward is one arithmetic operator on its two inputs (``a + b``)."""
    scalar = next(s for s in OPS.values() if s.kernel == kernel).scalar
    tree = ast.parse(scalar.forward, mode="eval").body
    ufunc = _OPERATOR_UFUNCS[type(tree.op)]
    assert [n.id for n in (tree.left, tree.right)] == list(scalar.inputs)
    quiet = _may_warn(scalar.forward, scalar.calls())

    def fn(dst, src):
        if quiet:
            with np.errstate(all="ignore"):
                ufunc(dst, src, out=dst, casting="unsafe")
        else:
            ufunc(dst, src, out=dst, casting="unsafe")

    fn.__name__ = kernel + "_"
    fn.__doc__ = f"``dst = {scalar.forward}`` in place (generated from the {kernel} stanza)."
    return staticmethod(fn)


for _kernel in scalar_kernels():
    setattr(NumpyBackend, _kernel, numpy_kernel(_kernel))
    if _one_operator(_kernel):
        setattr(NumpyBackend, _kernel + "_", numpy_inplace(_kernel))
