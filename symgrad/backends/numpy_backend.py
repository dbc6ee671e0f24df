"""The plain NumPy reference backend: the oracle the compiled backends are tested against."""

from __future__ import annotations

import math

import numpy as np

from ..ops import OPS
from ..ops.elementwise import scalar_ops
from ..ops.scalar import TRANSCENDENTAL, build

__all__ = ["NUMPY_MATH", "NumpyBackend", "numpy_kernel"]

def _erf(x):
    """erf elementwise through ``math.erf`` (NumPy has no erf ufunc; SciPy's would cost
    0.2 s of every ``import symgrad`` and is not a dependency), keeping a float dtype."""
    a = np.asarray(x)
    out = np.vectorize(math.erf, otypes=[np.float64])(a)
    return out.astype(a.dtype if a.dtype.kind == "f" else np.float64, copy=False)


#: The scalar-math vocabulary (symgrad/ops/scalar.py) as NumPy ufuncs.
NUMPY_MATH = {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
              "sqrt": np.sqrt, "abs": np.abs, "sign": np.sign, "where": np.where,
              "maximum": np.maximum, "log1p": np.log1p, "expm1": np.expm1, "erf": _erf}


def _quiet(fn):
    """NumPy warns on log(-1) or 1/0; PyTorch silently gives nan/inf, so do we."""

    def kernel(*args):
        with np.errstate(all="ignore"):
            return fn(*args)

    kernel.__name__ = getattr(fn, "__name__", "kernel")
    return kernel


def _pow(a, b):
    with np.errstate(all="ignore"):
        if isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b < 0 \
                and np.asarray(a).dtype.kind in "iu":
            raise RuntimeError("Integers to negative integer powers are not allowed.")
        return np.power(a, b)


class NumpyBackend:
    name = "numpy"
    device_type = "cpu"

    # the unary math kernels (neg, exp, tanh, ...) are generated from the ops' stanzas
    # below the class (``numpy_kernel``)

    add = staticmethod(np.add)
    sub = staticmethod(np.subtract)
    mul = staticmethod(np.multiply)
    div = staticmethod(_quiet(np.true_divide))
    pow = staticmethod(_pow)
    gt = staticmethod(np.greater)
    ge = staticmethod(np.greater_equal)
    lt = staticmethod(np.less)
    le = staticmethod(np.less_equal)
    eq = staticmethod(np.equal)
    ne = staticmethod(np.not_equal)
    maximum = staticmethod(np.maximum)
    logical_or = staticmethod(np.logical_or)
    logical_and = staticmethod(np.logical_and)
    logical_not = staticmethod(np.logical_not)
    minimum = staticmethod(np.minimum)

    @staticmethod
    def addcmul(x, t1, t2, value=1):
        """``x + value * t1 * t2`` (torch.addcmul)."""
        return np.add(x, np.multiply(np.multiply(t1, t2), value) if value != 1 else
                      np.multiply(t1, t2))

    @staticmethod
    def sum(x, axis=None, keepdims=False, dtype=None):
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
        return np.reshape(x, shape)

    @staticmethod
    def transpose(x, axes):
        return np.transpose(x, axes)

    @staticmethod
    def broadcast_to(x, shape):
        return np.broadcast_to(x, shape)

    @staticmethod
    def getitem(x, index):
        return np.asarray(x[index])

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
    def where(cond, a, b):
        return np.where(cond, a, b)

    @staticmethod
    def cast(x, np_dtype):
        return np.asarray(x).astype(np_dtype, copy=False)

    @staticmethod
    def copy(x):
        return np.array(x, copy=True, order="C")

    @staticmethod
    def concatenate(xs, axis):
        return np.concatenate(xs, axis=axis)

    @staticmethod
    def stack(xs, axis):
        return np.stack(xs, axis=axis)

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
        np.copyto(dst, src, casting="unsafe")

    @staticmethod
    def add_(dst, src):
        np.add(dst, src, out=dst, casting="unsafe")

    @staticmethod
    def add_scaled_(dst, src, alpha):
        """``dst += alpha * src`` (torch's ``add_(other, alpha=)``), alpha in dst's dtype."""
        np.add(dst, np.multiply(src, dst.dtype.type(alpha)), out=dst, casting="unsafe")

    @staticmethod
    def sub_(dst, src):
        np.subtract(dst, src, out=dst, casting="unsafe")

    @staticmethod
    def mul_(dst, src):
        np.multiply(dst, src, out=dst, casting="unsafe")

    @staticmethod
    def div_(dst, src):
        with np.errstate(all="ignore"):
            np.true_divide(dst, src, out=dst, casting="unsafe")

    @staticmethod
    def shares_memory(a, b) -> bool:
        return np.may_share_memory(a, b)


def numpy_kernel(op: str):
    """``be.<op>(x)`` from the op's ``Scalar.forward``, on whole arrays of ufuncs.

    Expressions that may meet a pole or leave the domain (exp, log, sqrt, division) run
    with NumPy's warnings off, as PyTorch gives nan/inf silently; "same" dtype ops keep
    the input's dtype (``maximum(x, 0)`` on bools)."""
    spec = OPS[op]
    fn = build(op + "_forward", ("x",), spec.scalar.forward, NUMPY_MATH)
    quiet = bool(spec.scalar.calls() & (TRANSCENDENTAL - {"sin", "cos", "tanh"})) \
        or "/" in spec.scalar.forward
    if spec.dtype_rule == "same":
        plain = fn

        def fn(x):
            out = plain(x)
            return out if out.dtype == x.dtype else out.astype(x.dtype, copy=False)

    if quiet:
        fn = _quiet(fn)
    fn.__name__ = op
    fn.__doc__ = f"{op}: ``{spec.scalar.forward}`` on NumPy arrays (generated)."
    return staticmethod(fn)


for _op in scalar_ops(1):
    setattr(NumpyBackend, _op, numpy_kernel(_op))
