"""Public op functions (``symgrad.exp``, ``symgrad.matmul`` ...) and Tensor methods.

Each function normalizes its arguments the way PyTorch does (dims, scalars, overloads)
and calls ``apply`` with the op's spec; nothing here computes or differentiates.
"""

from __future__ import annotations

from . import dtypes as _dt
from .autograd.function import apply
from .ops import OPS
from .tensor import Tensor, _wrap_dim

_O = OPS  # short alias for the hot path


def _t(x):
    return x if isinstance(x, Tensor) else None


def _check_number(x, op):
    if isinstance(x, (bool, int, float)):
        return x
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"{op}(): argument 'other' must be Tensor or Number, not {type(x).__name__}")


# -- arithmetic ------------------------------------------------------------------------------
def add(input, other, *, alpha=1):
    if not isinstance(other, Tensor):
        other = _check_number(other, "add")
        if not isinstance(input, Tensor):
            raise TypeError("add(): argument 'input' must be Tensor")
    elif not isinstance(input, Tensor):
        return add(other, input, alpha=alpha) if alpha == 1 else rsub_scalar(other, input, alpha)
    return apply(_O["add"], (input, other), {"alpha": alpha})


def sub(input, other, *, alpha=1):
    if not isinstance(input, Tensor):
        return rsub_scalar(other, input, alpha)
    if not isinstance(other, Tensor):
        other = _check_number(other, "sub")
    return apply(_O["sub"], (input, other), {"alpha": alpha})


def rsub_scalar(input, other, alpha=1):
    """``other - alpha * input`` for a scalar ``other`` (torch's RsubBackward1)."""
    return apply(_O["rsub"], (input,), {"other": _check_number(other, "rsub"), "alpha": alpha})


def mul(input, other):
    if not isinstance(input, Tensor):
        input, other = other, input
    if not isinstance(other, Tensor):
        other = _check_number(other, "mul")
    return apply(_O["mul"], (input, other))


def div(input, other):
    if not isinstance(input, Tensor):
        return mul(reciprocal(other), _check_number(input, "div"))
    if not isinstance(other, Tensor):
        other = _check_number(other, "div")
    return apply(_O["div"], (input, other))


def pow(input, exponent):  # noqa: A001
    if isinstance(input, Tensor):
        if isinstance(exponent, Tensor):
            return apply(_O["pow_tensor"], (input, exponent))
        return apply(_O["pow"], (input,), {"exponent": _check_number(exponent, "pow")})
    return apply(_O["pow_scalar_base"], (exponent,), {"self": _check_number(input, "pow")})


def _unary(name):
    spec = _O[name]

    def fn(input):
        return apply(spec, (input,))

    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name} (grad_fn {spec.grad_fn})."
    return fn


neg = _unary("neg")
reciprocal = _unary("reciprocal")
exp = _unary("exp")
log = _unary("log")
sin = _unary("sin")
cos = _unary("cos")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
relu = _unary("relu")
sqrt = _unary("sqrt")
abs = _unary("abs")  # noqa: A001
sign = _unary("sign")
logical_not = _unary("logical_not")


def _compare(name):
    spec = _O[name]

    def fn(input, other):
        if not isinstance(other, Tensor):
            other = _check_number(other, name)
        return apply(spec, (input, other))

    fn.__name__ = name
    return fn


gt, ge, lt, le, eq, ne = (_compare(n) for n in ("gt", "ge", "lt", "le", "eq", "ne"))
logical_or, logical_and = _compare("logical_or"), _compare("logical_and")


def addcmul(input, tensor1, tensor2, *, value=1):
    """``input + value * tensor1 * tensor2`` as one op: one fused pass on the CPU backend."""
    for name, x in (("input", input), ("tensor1", tensor1), ("tensor2", tensor2)):
        if not isinstance(x, Tensor):
            raise TypeError(f"addcmul(): argument '{name}' must be Tensor, not "
                            f"{type(x).__name__}")
    return apply(_O["addcmul"], (input, tensor1, tensor2), {"value": _check_number(value,
                                                                                   "addcmul")})


def where(condition, input, other):
    if not isinstance(condition, Tensor) or condition.dtype is not _dt.bool_:
        raise RuntimeError("where expected condition to be a boolean tensor")
    if not isinstance(input, Tensor):
        if not isinstance(other, Tensor):
            raise TypeError("where(): expected at least one Tensor argument")
        input = _full_like_scalar(input, other)
    elif not isinstance(other, Tensor):
        other = _full_like_scalar(other, input)
    return apply(_O["where"], (condition, input, other))


def _full_like_scalar(value, like):
    from .tensor import tensor

    return tensor(value, dtype=like.dtype if isinstance(value, float) and
                  like.dtype.is_floating_point else None, device=like.device)


# -- reductions ------------------------------------------------------------------------------
def _dims(dim, ndim):
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(_wrap_dim(d, ndim) for d in dim)


def sum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A001
    params = {} if dtype is None else {"dtype": _dt.as_dtype(dtype)}
    if dim is None:
        return apply(_O["sum"], (input,), params)
    dims = _dims(dim, input.ndim)
    params.update(dim=dims, keepdim=keepdim)
    return apply(_O["sum_dim"], (input,), params)


def mean(input, dim=None, keepdim=False):
    if dim is None:
        return apply(_O["mean"], (input,))
    return apply(_O["mean_dim"], (input,), {"dim": _dims(dim, input.ndim), "keepdim": keepdim})


# -- shape ops -------------------------------------------------------------------------------
def _shape_arg(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(s) for s in shape)


def _infer_size(shape, numel):
    shape = list(shape)
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    known = 1
    for s in shape:
        if s != -1:
            if s < 0:
                raise RuntimeError(f"invalid shape dimension {s}")
            known *= s
    if -1 in shape:
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape[shape.index(-1)] = numel // known
    elif known != numel:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
    return tuple(shape)


def reshape(input, *shape):
    shape = _infer_size(_shape_arg(shape), input.numel())
    if shape == tuple(input.shape):
        return view(input, shape)
    return apply(_O["view"], (input,), {"size": shape})


def view(input, *shape):
    shape = _infer_size(_shape_arg(shape), input.numel())
    return apply(_O["view"], (input,), {"size": shape})


def flatten(input, start_dim=0, end_dim=-1):
    if input.ndim == 0:
        return reshape(input, (1,))
    s, e = _wrap_dim(start_dim, input.ndim), _wrap_dim(end_dim, input.ndim)
    shape = tuple(input.shape)
    n = 1
    for d in shape[s:e + 1]:
        n *= d
    return reshape(input, shape[:s] + (n,) + shape[e + 1:])


def t(input):
    if input.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                           f"{input.ndim}D")
    return apply(_O["t"], (input,))


def transpose(input, dim0, dim1):
    n = input.ndim
    return apply(_O["transpose"], (input,), {"dim0": _wrap_dim(dim0, n) if n else 0,
                                             "dim1": _wrap_dim(dim1, n) if n else 0})


def permute(input, *dims):
    dims = _shape_arg(dims)
    if len(dims) != input.ndim:
        raise RuntimeError("permute(sparse_coo): number of dimensions in the tensor input does "
                           "not match the length of the desired ordering of dimensions i.e. "
                           f"input.dim() = {input.ndim} is not equal to len(dims) = {len(dims)}")
    norm = tuple(_wrap_dim(d, input.ndim) for d in dims)
    if len(set(norm)) != len(norm):
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    return apply(_O["permute"], (input,), {"dims": dims})


def expand(input, *sizes):
    sizes = _shape_arg(sizes)
    shape = tuple(input.shape)
    if len(sizes) < len(shape):
        raise RuntimeError(f"expand(symgrad.{input.dtype.name}{{{list(shape)}}}, size={list(sizes)}): "
                           "the number of sizes provided "
                           f"({len(sizes)}) must be greater or equal to the number of "
                           f"dimensions in the tensor ({len(shape)})")
    lead = len(sizes) - len(shape)
    out = []
    for i, s in enumerate(sizes):
        if i < lead:
            if s < 0:
                raise RuntimeError(f"The expanded size of the tensor ({s}) isn't allowed in a "
                                   "leading, non-existing dimension 0")
            out.append(s)
            continue
        cur = shape[i - lead]
        if s == -1:
            s = cur
        if cur != s and cur != 1:
            raise RuntimeError(f"The expanded size of the tensor ({s}) must match the existing "
                               f"size ({cur}) at non-singleton dimension {i}.  Target sizes: "
                               f"{list(sizes)}.  Tensor sizes: {list(shape)}")
        out.append(s)
    return apply(_O["expand"], (input,), {"size": tuple(out)})


def unsqueeze(input, dim):
    return apply(_O["unsqueeze"], (input,), {"dim": _wrap_dim(dim, input.ndim + 1)})


def squeeze(input, dim=None):
    if dim is None:
        out = input
        for d in reversed(range(input.ndim)):
            if input.shape[d] == 1:
                out = apply(_O["squeeze"], (out,), {"dim": d})
        return out
    if input.ndim == 0:
        return apply(_O["squeeze"], (input,), {"dim": 0})
    return apply(_O["squeeze"], (input,), {"dim": _wrap_dim(dim, input.ndim)})


def sum_to_size(input, *size):
    """Sum broadcast dims away so the result has ``size`` (the broadcast-gradient reduction)."""
    size = _shape_arg(size)
    shape = tuple(input.shape)
    if shape == size:
        return input
    lead = len(shape) - len(size)
    dims = tuple(range(lead)) + tuple(
        i + lead for i, s in enumerate(size) if s == 1 and shape[i + lead] != 1)
    out = sum(input, dims, keepdim=True) if dims else input
    return reshape(out, size) if tuple(out.shape) != size else out


def clone(input):
    return apply(_O["clone"], (input,))


def to_dtype(input, dtype):
    return apply(_O["to_copy"], (input,), {"dtype": _dt.as_dtype(dtype)})


def to_device(input, device):
    if device.type == "cuda":
        from .cuda import _require_cuda

        _require_cuda()
    raise RuntimeError(f"moving tensors to {device} is not supported yet")


# -- matrix products -------------------------------------------------------------------------
def mm(input, mat2):
    if input.ndim != 2:
        raise RuntimeError("self must be a matrix")
    if mat2.ndim != 2:
        raise RuntimeError("mat2 must be a matrix")
    if input.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({input.shape[0]}x"
                           f"{input.shape[1]} and {mat2.shape[0]}x{mat2.shape[1]})")
    return apply(_O["mm"], (input, mat2))


def mv(input, vec):
    if input.ndim != 2 or vec.ndim != 1 or input.shape[1] != vec.shape[0]:
        raise RuntimeError(f"size mismatch, got input ({input.shape[0]}), mat "
                           f"({input.shape[0]}x{input.shape[1]}), vec ({vec.shape[0]})")
    return apply(_O["mv"], (input, vec))


def dot(input, other):
    if input.ndim != 1 or other.ndim != 1:
        raise RuntimeError(f"1D tensors expected, but got {input.ndim}D and {other.ndim}D "
                           "tensors")
    if input.shape[0] != other.shape[0]:
        raise RuntimeError("inconsistent tensor size, expected tensor [%d] and src [%d] to have "
                           "the same number of elements, but got %d and %d elements "
                           "respectively" % (input.shape[0], other.shape[0], input.shape[0],
                                             other.shape[0]))
    return apply(_O["dot"], (input, other))


def matmul(input, other):
    """PyTorch's dispatch: dot, mv, unsqueeze+mm+squeeze_, mm, or batched (bmm)."""
    if not isinstance(input, Tensor) or not isinstance(other, Tensor):
        raise TypeError("matmul(): argument 'other' must be Tensor")
    a, b = input.ndim, other.ndim
    if a == 0 or b == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are "
                           f"{a}D and {b}D")
    if a == 1 and b == 1:
        return dot(input, other)
    if a == 2 and b == 1:
        return mv(input, other)
    if a == 1 and b == 2:
        if input.shape[0] != other.shape[0]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied (1x{input.shape[0]} "
                               f"and {other.shape[0]}x{other.shape[1]})")
        return apply(_O["squeeze_"], (mm(unsqueeze(input, 0), other),), {"dim": 0})
    if a == 2 and b == 2:
        return mm(input, other)
    return _batched_matmul(input, other)


def _batched_matmul(input, other):
    raise RuntimeError("batched matmul (bmm) is not supported yet")


# -- Tensor methods and operators ------------------------------------------------------------
def _install_tensor_methods() -> None:
    T = Tensor
    for name in ("add", "sub", "mul", "div", "pow", "neg", "reciprocal", "exp", "log", "sin",
                 "cos", "tanh", "sigmoid", "relu", "sqrt", "abs", "sign", "sum", "mean",
                 "reshape", "view", "flatten", "t", "transpose", "permute", "expand",
                 "unsqueeze", "squeeze", "sum_to_size", "clone", "mm", "mv", "dot", "matmul",
                 "gt", "ge", "lt", "le", "eq", "ne", "logical_not", "logical_or",
                 "logical_and"):
        setattr(T, name, globals()[name])
    T.true_divide = T.divide = T.div
    T.multiply = T.mul
    T.subtract = T.sub
    T.negative = T.neg
    T.greater, T.less = T.gt, T.lt
    T.__add__ = T.__radd__ = add
    T.__sub__ = sub
    T.__rsub__ = lambda self, other: rsub_scalar(self, other)
    T.__mul__ = T.__rmul__ = mul
    T.__truediv__ = div
    T.__rtruediv__ = lambda self, other: div(other, self)
    T.__pow__ = pow
    T.__rpow__ = lambda self, other: pow(other, self)
    T.__matmul__ = matmul
    T.__rmatmul__ = lambda self, other: matmul(other, self)
    T.__neg__ = neg
    T.__pos__ = lambda self: self
    T.__abs__ = abs
    T.__gt__, T.__ge__, T.__lt__, T.__le__ = gt, ge, lt, le
    T.__eq__, T.__ne__ = eq, ne
    T.__or__ = logical_or
    T.__and__ = logical_and
    T.__invert__ = logical_not
    T.T = property(lambda self: permute(self, tuple(range(self.ndim))[::-1]))
    T.expand_as = lambda self, other: expand(self, other.shape)
    T.view_as = lambda self, other: view(self, other.shape)
    T.reshape_as = lambda self, other: reshape(self, other.shape)
    T.where = lambda self, condition, other: where(condition, self, other)
    T.addcmul = addcmul


_install_tensor_methods()
