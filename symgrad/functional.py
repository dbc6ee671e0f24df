"""Public op functions (``symgrad.exp``, ``symgrad.matmul`` ...), also Tensor's methods.

Each function normalizes its arguments the way PyTorch does (dims, scalars, overloads)
and calls ``apply`` with the op's spec; nothing here computes or differentiates.

tensor.py binds these functions as Tensor's methods and operators in its class body
(``__mul__ = _F.mul``), and attaches the in-place forms generated here
(:func:`inplace_methods`). This module sits below tensor.py: it recognises tensors as
``TensorBase`` and reaches the class and its factory through ``_tensor_layer``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _tensor_layer as _tl
from . import cuda as _cuda
from . import dtypes as _dt
from . import return_types
from ._aliases import numpy_aliases
from ._random import _generator
from ._tensor_layer import CPP_NAMES as _CPP_NAMES
from ._tensor_layer import TORCH_NAMES as _TORCH_NAMES
from ._tensor_layer import TensorBase
from ._tensor_layer import type_name as _type_name
from ._tensor_layer import wrap_dim as _wrap_dim
from .autograd import function as _fn
from .autograd.function import apply
from .autograd.grad_mode import _state
from .backends import backend_for
from .backends.base import view_strides
from .device import CPU
from .ops import OPS
from .ops._ints import u64, u64s
from .ops.indexing import select as _select
from .ops.indexing import slice_
from .ops.shape import list_spec

if TYPE_CHECKING:  # annotations only: tensor.py imports this module to bind its methods
    from .tensor import Tensor

_O = OPS  # short alias for the hot path
# the commonest ops call their entry directly (``apply`` is one Python call more)
_ADD, _SUB, _MUL, _DIV = _O["add"], _O["sub"], _O["mul"], _O["div"]


def _t(x):
    return x if isinstance(x, TensorBase) else None


def _check_number(x, op):
    if isinstance(x, (bool, int, float)):
        return x
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"{op}(): argument 'other' must be Tensor or Number, not {type(x).__name__}")


# -- arithmetic ------------------------------------------------------------------------------
def add(input, other, *, alpha=1):
    if not isinstance(other, TensorBase):
        other = _check_number(other, "add")
        if not isinstance(input, TensorBase):
            raise TypeError("add(): argument 'input' must be Tensor")
    elif not isinstance(input, TensorBase):
        return add(other, input, alpha=alpha) if alpha == 1 else rsub_scalar(other, input, alpha)
    return _ADD._run((input, other), {"alpha": alpha})


def sub(input, other, *, alpha=1):
    if not isinstance(input, TensorBase):
        return rsub_scalar(other, input, alpha)
    if not isinstance(other, TensorBase):
        other = _check_number(other, "sub")
    return _SUB._run((input, other), {"alpha": alpha})


def rsub_scalar(input, other, alpha=1):
    """``other - alpha * input`` for a scalar ``other`` (torch's RsubBackward1)."""
    return apply(_O["rsub"], (input,), {"other": _check_number(other, "rsub"), "alpha": alpha})


def mul(input, other):
    if not isinstance(input, TensorBase):
        input, other = other, input
    if not isinstance(other, TensorBase):
        other = _check_number(other, "mul")
    return _MUL._run((input, other))


def div(input, other):
    if not isinstance(input, TensorBase):
        return mul(reciprocal(other), _check_number(input, "div"))
    if not isinstance(other, TensorBase):
        other = _check_number(other, "div")
    return _DIV._run((input, other))


def pow(input, exponent):  # noqa: A001
    if isinstance(input, TensorBase):
        if isinstance(exponent, TensorBase):
            return apply(_O["pow_tensor"], (input, exponent))
        exponent = _check_number(exponent, "pow")
        return apply(_O["pow"], (_promote_for_scalars(input, exponent),), {"exponent": exponent})
    return apply(_O["pow_scalar_base"], (exponent,), {"self": _check_number(input, "pow")})


def _unary(name):
    spec = _O[name]

    def fn(input):
        return spec._run((input,))

    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name} (grad_fn {spec.grad_fn})."
    return fn


def _refusing_bool(name, error):
    """``_unary(name)`` with torch's error for a bool tensor (NumPy's would differ)."""
    spec = _O[name]

    def fn(input):
        if input.dtype is _dt.bool_:
            raise error
        return spec._run((input,))

    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name} (grad_fn {spec.grad_fn})."
    return fn


neg = _refusing_bool("neg", RuntimeError(
    "Negation, the `-` operator, on a bool tensor is not supported. If you are trying to "
    "invert a mask, use the `~` or `logical_not()` operator instead."))
reciprocal = _unary("reciprocal")
exp = _unary("exp")
log = _unary("log")
sin = _unary("sin")
cos = _unary("cos")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
relu = _refusing_bool("relu", RuntimeError("Boolean inputs not supported for relu"))
sqrt = _unary("sqrt")
log1p = _unary("log1p")
log2 = _unary("log2")
log10 = _unary("log10")
expm1 = _unary("expm1")
erf = _unary("erf")
abs = _refusing_bool("abs", NotImplementedError(  # noqa: A001
    "\"abs_cpu\" not implemented for 'Bool'"))
logical_not = _unary("logical_not")


def sign(input):
    """Elementwise sign (grad_fn SignBackward0); a bool tensor is its own sign, as in torch."""
    if input.dtype is _dt.bool_:
        return apply(_O["clone"], (input,))
    return apply(_O["sign"], (input,))


def _promote_for_scalars(input, *scalars):
    """``input`` cast to the dtype torch computes ``op(input, *scalars)`` in, for ops whose
    numbers are parameters rather than inputs (pow's exponent, clamp's bounds)."""
    numbers = [v for v in scalars if v is not None]
    d = _dt.promote([(input.dtype, input.ndim == 0)], numbers)
    return input if d is input.dtype else to_dtype(input, d)


def _compare(name):
    spec = _O[name]

    def fn(input, other):
        if not isinstance(other, TensorBase):
            other = _check_number(other, name)
        return apply(spec, (input, other))

    fn.__name__ = name
    return fn


gt, ge, lt, le, eq, ne = (_compare(n) for n in ("gt", "ge", "lt", "le", "eq", "ne"))
logical_or, logical_and = _compare("logical_or"), _compare("logical_and")


def addcmul(input, tensor1, tensor2, *, value=1):
    """``input + value * tensor1 * tensor2`` as one op: one fused pass on the CPU backend."""
    for name, x in (("input", input), ("tensor1", tensor1), ("tensor2", tensor2)):
        if not isinstance(x, TensorBase):
            raise TypeError(f"addcmul(): argument '{name}' must be Tensor, not "
                            f"{type(x).__name__}")
    value = _check_number(value, "addcmul")
    if isinstance(value, float) and not _dt.promote(
            [(t.dtype, t.ndim == 0) for t in (input, tensor1, tensor2)]).is_floating_point:
        value = int(value)  # torch converts value to the integer dtype it computes in
    return apply(_O["addcmul"], (input, tensor1, tensor2), {"value": value})


def where(condition, input, other):
    if not isinstance(condition, TensorBase) or condition.dtype is not _dt.bool_:
        raise RuntimeError("where expected condition to be a boolean tensor")
    if not isinstance(input, TensorBase):
        if not isinstance(other, TensorBase):  # two numbers: their promoted dtype, as torch
            d = _dt.promote([], [_check_number(input, "where"), _check_number(other, "where")])
            input = _tl.tensor(input, dtype=d, device=condition.device)
            other = _tl.tensor(other, dtype=d, device=condition.device)
            return apply(_O["where"], (condition, input, other))
        input = _full_like_scalar(input, other)
    elif not isinstance(other, TensorBase):
        other = _full_like_scalar(other, input)
    return apply(_O["where"], (condition, input, other))


def _full_like_scalar(value, like):
    return _tl.tensor(value, dtype=like.dtype if isinstance(value, float) and
                  like.dtype.is_floating_point else None, device=like.device)


# -- reductions ------------------------------------------------------------------------------
def _dims(dim, ndim):
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(_wrap_dim(d, ndim) for d in dim)


def _raw_dims(dim, ndim):
    """Validated dims, kept as given (torch saves ``sum(-1)``'s dim as 2**64 - 1)."""
    if isinstance(dim, int):
        dim = (dim,)
    _dims(dim, ndim)
    return u64s(dim)


@numpy_aliases
def sum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A001
    params = {} if dtype is None else {"dtype": _dt.as_dtype(dtype)}
    if dim is None:
        return apply(_O["sum"], (input,), params)
    params.update(dim=_raw_dims(dim, input.ndim), keepdim=keepdim)
    return apply(_O["sum_dim"], (input,), params)


@numpy_aliases
def prod(input, dim=None, keepdim=False, *, dtype=None):
    """The product of all elements (ProdBackward0) or along ``dim`` (ProdBackward1)."""
    params = {} if dtype is None else {"dtype": _dt.as_dtype(dtype)}
    if dim is None:
        return apply(_O["prod"], (input,), params)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"prod(): argument 'dim' must be int, not {_type_name(dim)}")
    _wrap_dim(dim, input.ndim)
    params.update(dim=u64(dim), keepdim=bool(keepdim))
    return apply(_O["prod_dim"], (input,), params)


@numpy_aliases
def mean(input, dim=None, keepdim=False):
    if dim is None:
        return apply(_O["mean"], (input,))
    return apply(_O["mean_dim"], (input,), {"dim": _raw_dims(dim, input.ndim),
                                            "keepdim": keepdim})


# -- shape ops -------------------------------------------------------------------------------
def _shape_arg(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    for s in shape:  # the common call: Python ints already (no generator, no new tuple)
        if type(s) is not int:
            return tuple([int(s) for s in shape])
    return shape if type(shape) is tuple else tuple(shape)


def _infer_size(shape, numel):
    if -1 not in shape:  # the common call: every size given
        known = 1
        for s in shape:
            if s < 0:
                break
            known *= s
        else:
            if known == numel:
                return shape
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
        if known == 0 and numel == 0:
            raise RuntimeError(f"cannot reshape tensor of 0 elements into shape {list(shape)} "
                               "because the unspecified dimension size -1 can be any value "
                               "and is ambiguous")
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape[shape.index(-1)] = numel // known
    elif known != numel:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
    return tuple(shape)


def _viewable(input, shape) -> bool:
    """Can ``input`` be viewed as ``shape`` without a copy (PyTorch's computeStride)?"""
    if input.numel() == 0 or input.ndim == 0 or input.is_contiguous():
        return True
    return view_strides(tuple(input.shape), input.stride(), tuple(shape)) is not None


def reshape(input, *shape):
    """A view when the strides allow one (ViewBackward0), else a copy (UnsafeView over Clone)."""
    data = input._data  # numel() and is_contiguous(), read off the array once
    shape = _infer_size(_shape_arg(shape), int(data.size))
    if data.flags.c_contiguous:
        return apply(_O["view"], (input,), {"size": shape})
    if _viewable(input, shape):
        return apply(_O["reshape_alias"], (input,), {"size": shape})
    return _unsafe_view(clone(input), shape)


def _unsafe_view(input, shape):
    return apply(_O["unsafe_view"], (input,), {"size": tuple(shape)})


def view(input, *shape):
    data = input._data
    shape = _infer_size(_shape_arg(shape), int(data.size))
    if not data.flags.c_contiguous and not _viewable(input, shape):
        raise RuntimeError("view size is not compatible with input tensor's size and stride (at "
                           "least one dimension spans across two contiguous subspaces). Use "
                           ".reshape(...) instead.")
    return apply(_O["view"], (input,), {"size": shape})


def contiguous(input):
    return input if input.is_contiguous() else clone(input)


def flatten(input, start_dim=0, end_dim=-1):
    if input.ndim == 0:
        return reshape(input, (1,))
    s, e = _wrap_dim(start_dim, input.ndim), _wrap_dim(end_dim, input.ndim)
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    if s == e:
        return input
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
    _wrap_dim(dim0, n), _wrap_dim(dim1, n)
    return apply(_O["transpose"], (input,), {"dim0": u64(dim0), "dim1": u64(dim1)})


def permute(input, *dims):
    dims = _shape_arg(dims)
    if len(dims) != input.ndim:
        raise RuntimeError("permute(sparse_coo): number of dimensions in the tensor input does "
                           "not match the length of the desired ordering of dimensions i.e. "
                           f"input.dim() = {input.ndim} is not equal to len(dims) = {len(dims)}")
    norm = tuple(_wrap_dim(d, input.ndim) for d in dims)
    if len(set(norm)) != len(norm):
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    return apply(_O["permute"], (input,), {"dims": u64s(dims)})


def expand(input, *sizes):
    sizes = _shape_arg(sizes)
    shape = tuple(input.shape)
    if len(sizes) < len(shape):
        raise RuntimeError(f"expand(symgrad.{input.dtype.name}{{{list(shape)}}}, "
                           f"size={list(sizes)}): the number of sizes provided "
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
    _wrap_dim(dim, input.ndim + 1)
    return apply(_O["unsqueeze"], (input,), {"dim": u64(dim)})


def squeeze(input, dim=None):
    if dim is None:
        return apply(_O["squeeze_all"], (input,))
    if isinstance(dim, (tuple, list)):
        return apply(_O["squeeze_dims"], (input,), {"dim": _raw_dims(tuple(dim), input.ndim)})
    _wrap_dim(dim, input.ndim)
    return apply(_O["squeeze"], (input,), {"dim": u64(dim)})


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
    d = _dt.as_dtype(dtype)
    _dt.check_device(d, input._device.type)
    return apply(_O["to_copy"], (input,), {"dtype": d})


def to_device(input, device):
    """Copy ``input`` to ``device``; recorded as ToCopyBackward0 (as torch) when it needs grad."""
    if device.type == "cuda":
        device = _cuda._require_cuda(device)  # read at call time: the verifier swaps it
        _dt.check_device(input.dtype, "cuda")
    elif device.type == "cpu":
        device = CPU  # any cpu index is the one cpu; other types (the verifier's symbolic
        # device) keep their own backend
    if input._device == device:
        return input
    host = backend_for(input._device.type).to_host(input._data)
    out = _tl.Tensor._wrap(backend_for(device.type).from_host(host), device)
    if input._requires_grad:
        if _state.enabled:
            _fn._T()
            _fn._record(_O["to_cuda" if device.type == "cuda" else "to_cpu"], (input,), {},
                        [out])
    return out


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
        n, m = input.shape[0], other.shape[0]
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{n}] and src [{m}] to "
                           f"have the same number of elements, but got {n} and {m} elements "
                           "respectively")
    return apply(_O["dot"], (input, other))


def matmul(input, other):
    """PyTorch's dispatch: dot, mv, unsqueeze+mm+squeeze_, mm, or batched (bmm)."""
    if not isinstance(input, TensorBase) or not isinstance(other, TensorBase):
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


def bmm(input, mat2):
    for name, x in (("batch1", input), ("batch2", mat2)):
        if not isinstance(x, TensorBase):
            raise TypeError(f"bmm(): argument '{name}' must be Tensor, not {type(x).__name__}")
        if x.ndim != 3:
            raise RuntimeError(f"{name} must be a 3D tensor")
    b, _, m = input.shape
    if tuple(mat2.shape[:2]) != (b, m):
        raise RuntimeError("Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{b}, {m}] but got: [{mat2.shape[0]}, {mat2.shape[1]}].")
    return apply(_O["bmm"], (input, mat2))


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """``beta * input + alpha * (batch1 @ batch2)`` (BaddbmmBackward0); input broadcasts."""
    for name, x in (("batch1", batch1), ("batch2", batch2)):
        if not isinstance(x, TensorBase):
            raise TypeError(f"baddbmm(): argument '{name}' must be Tensor, not "
                            f"{type(x).__name__}")
        if x.ndim != 3:
            raise RuntimeError(f"{name} must be a 3D tensor")
    b, n, m = batch1.shape
    if tuple(batch2.shape[:2]) != (b, m):
        raise RuntimeError("Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{b}, {m}] but got: [{batch2.shape[0]}, {batch2.shape[1]}].")
    if batch1.dtype is not batch2.dtype:
        raise RuntimeError(f"expected scalar type {_TORCH_NAMES[batch1.dtype.name]} but found "
                           f"{_TORCH_NAMES[batch2.dtype.name]}")
    if input.dtype is not batch1.dtype:
        names = [_CPP_NAMES[t.dtype.name] for t in (input, batch1, batch2)]
        raise RuntimeError(f"Input dtypes must be the same, got: input {names[0]}, batch1: "
                           f"{names[1]}, batch2: {names[2]}")
    target = (b, n, batch2.shape[2])
    shape = tuple(input.shape)
    for i in range(1, len(shape) + 1):
        if len(shape) > 3 or shape[-i] not in (1, target[-i]):
            d = len(target) - i if len(shape) <= 3 else 0
            raise RuntimeError(f"The expanded size of the tensor ({target[d]}) must match the "
                               f"existing size ({shape[-i]}) at non-singleton dimension {d}.  "
                               f"Target sizes: {list(target)}.  Tensor sizes: {list(shape)}")
    return apply(_O["baddbmm"], (input, batch1, batch2), {"beta": beta, "alpha": alpha})


def _mT(x):
    return transpose(x, -2, -1)


def _should_fold(t1, t2) -> bool:
    """PyTorch's should_fold: run >=3-D @ <=2-D as one mm/mv on a folded view."""
    larger = t1.ndim >= t2.ndim
    big = t1 if larger else t2
    dim_big, dim_small = (t1.ndim, t2.ndim) if larger else (t2.ndim, t1.ndim)
    if not (dim_big >= 3 and dim_small <= 2):
        return False
    if (t2 if larger else t1).requires_grad:
        return True
    if t1.ndim == 2:
        return False
    if big.numel() == 0:
        return True
    shape, stride = list(big.shape), list(big.stride())
    if not larger:  # big is t2.mT
        shape[-2:], stride[-2:] = shape[-2:][::-1], stride[-2:][::-1]
    return all(stride[i] == stride[i + 1] * shape[i + 1] for i in range(dim_big - 2))


def _batched_matmul(t1, t2):
    """PyTorch's matmul for >=3-D operands: fold into mm/mv, or expand + bmm."""
    import math

    if _should_fold(t1, t2):
        swap = t2.ndim > t1.ndim
        a = _mT(t2) if swap else t1
        b = (t(t1) if t1.ndim == 2 else t1) if swap else t2
        out_shape = tuple(a.shape[:-1])
        if b.ndim == 2:
            out_shape += (b.shape[1],)
        folded = reshape(a, (math.prod(a.shape[:-1]), a.shape[-1]))
        if b.ndim == 2:
            out = _unsafe_view(mm(folded, b), out_shape)
            return contiguous(_mT(out)) if swap else out
        if folded.shape[1] != b.shape[0]:
            raise RuntimeError(f"size mismatch, got input ({folded.shape[0]}), mat "
                               f"({folded.shape[0]}x{folded.shape[1]}), vec ({b.shape[0]})")
        return _unsafe_view(mv(folded, b), out_shape)
    n = t1.shape[-2] if t1.ndim > 1 else 1
    m1 = t1.shape[-1]
    batch1 = tuple(t1.shape[:t1.ndim - 2 if t1.ndim > 2 else 0])
    m2 = t2.shape[-2] if t2.ndim > 1 else t2.shape[0]
    p = t2.shape[-1] if t2.ndim > 1 else 1
    batch2 = tuple(t2.shape[:t2.ndim - 2 if t2.ndim > 2 else 0])
    if t1.ndim == 3 and t2.ndim == 3 and batch1[0] != batch2[0]:
        if batch1[0] == 1 and t1.requires_grad:
            return matmul(squeeze(t1, 0), t2)
        if batch2[0] == 1 and t2.requires_grad:
            return matmul(t1, squeeze(t2, 0))
    import numpy as np

    try:  # equal batch dims (attention's heads) need no broadcasting rule
        out_shape = batch1 if batch1 == batch2 else tuple(np.broadcast_shapes(batch1, batch2))
    except ValueError:
        nd = len(batch1) if len(batch1) > len(batch2) else len(batch2)
        for i in range(1, nd + 1):
            da = batch1[-i] if i <= len(batch1) else 1
            db = batch2[-i] if i <= len(batch2) else 1
            if da != db and 1 not in (da, db):
                raise RuntimeError(f"The size of tensor a ({da}) must match the size of tensor "
                                   f"b ({db}) at non-singleton dimension "
                                   f"{nd - i}") from None
        raise
    nb = math.prod(out_shape)
    if m1 != m2:
        raise RuntimeError("Expected size for first two dimensions of batch2 tensor to be: "
                           f"[{nb}, {m1}] but got: [{nb}, {m2}].")
    a = reshape(expand(t1, out_shape + (n, m1)), (nb, n, m1))
    if t2.ndim == 1:
        b = unsqueeze(reshape(expand(t2, out_shape + (m2,)), (nb, m2)), 2)
    else:
        b = reshape(expand(t2, out_shape + (m2, p)), (nb, m2, p))
    full = out_shape + ((n,) if t1.ndim > 1 else ()) + ((p,) if t2.ndim > 1 else ())
    out = bmm(a, b)
    if t2.ndim == 1:
        out = squeeze(out, -1)
    return _unsafe_view(out, full)


# -- max / min / argmax / clamp --------------------------------------------------------------
def _minmax(name, input, dim, keepdim):
    if isinstance(dim, TensorBase):
        return (maximum if name == "max" else minimum)(input, dim)
    if dim is None:
        if input.numel() == 0:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for "
                               "input.numel() == 0. Specify the reduction dim with the 'dim' "
                               "argument.")
        return apply(_O[name], (input,))
    d = _wrap_dim(dim, input.ndim)
    if input.ndim and input.shape[d] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
    values, indices = apply(_O[name + "_dim"], (input,), {"dim": u64(dim),
                                                        "keepdim": bool(keepdim)})
    return getattr(return_types, name)(values, indices)


@numpy_aliases
def max(input, dim=None, keepdim=False):  # noqa: A001
    """``max()``, ``max(dim)`` -> (values, indices), or ``max(other)`` = ``maximum``."""
    return _minmax("max", input, dim, keepdim)


@numpy_aliases
def min(input, dim=None, keepdim=False):  # noqa: A001
    """``min()``, ``min(dim)`` -> (values, indices), or ``min(other)`` = ``minimum``."""
    return _minmax("min", input, dim, keepdim)


def _arg(name, input, dim, keepdim):
    if dim is None:
        if input.numel() == 0:
            raise IndexError(f"{name}(): Expected reduction dim to be specified for "
                             "input.numel() == 0.")
    else:
        d = _wrap_dim(dim, input.ndim)
        if input.ndim and input.shape[d] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
        if input.ndim == 0:
            dim = None
    return apply(_O[name], (input,), {"dim": None if dim is None else u64(dim),
                                      "keepdim": bool(keepdim), "dtype": _dt.int64})


@numpy_aliases
def argmax(input, dim=None, keepdim=False):
    return _arg("argmax", input, dim, keepdim)


@numpy_aliases
def argmin(input, dim=None, keepdim=False):
    return _arg("argmin", input, dim, keepdim)


def maximum(input, other):
    if not isinstance(input, TensorBase) or not isinstance(other, TensorBase):
        raise TypeError("maximum(): argument 'other' must be Tensor")
    return apply(_O["maximum"], (input, other))


def minimum(input, other):
    if not isinstance(input, TensorBase) or not isinstance(other, TensorBase):
        raise TypeError("minimum(): argument 'other' must be Tensor")
    return apply(_O["minimum"], (input, other))


def _tensor_pair(name):
    """A binary elementwise function of two tensors (torch.atan2, torch.hypot)."""
    spec = _O[name]

    def fn(input, other):
        for pos, (arg, value) in enumerate((("input", input), ("other", other)), 1):
            if not isinstance(value, TensorBase):
                raise TypeError(f"{name}(): argument '{arg}' (position {pos}) must be Tensor, "
                                f"not {type(value).__name__}")
        return apply(spec, (input, other))

    fn.__name__ = name
    fn.__doc__ = f"Elementwise {name} of two tensors (grad_fn {spec.grad_fn})."
    return fn


atan2 = _tensor_pair("atan2")
arctan2 = atan2
hypot = _tensor_pair("hypot")


def clamp(input, min=None, max=None):  # noqa: A002
    """ClampBackward1 with number bounds, ClampBackward0 with tensor bounds (as in torch)."""
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    if isinstance(min, TensorBase) or isinstance(max, TensorBase):
        if max is None:
            return apply(_O["clamp_tensor_min"], (input, min, None), {"max": None})
        if min is None:
            return apply(_O["clamp_tensor_max"], (input, None, max), {"min": None})
        lo = min if isinstance(min, TensorBase) else _full_like_scalar(min, input)
        hi = max if isinstance(max, TensorBase) else _full_like_scalar(max, input)
        return apply(_O["clamp_tensor"], (input, lo, hi))
    min = None if min is None else _check_number(min, "clamp")
    max = None if max is None else _check_number(max, "clamp")
    return apply(_O["clamp"], (_promote_for_scalars(input, min, max),), {"min": min, "max": max})


def clamp_min(input, min):  # noqa: A002
    if isinstance(min, TensorBase):
        return apply(_O["clamp_min_tensor"], (input, min))
    min = _check_number(min, "clamp_min")
    return apply(_O["clamp_min"], (_promote_for_scalars(input, min),), {"min": min})


def clamp_max(input, max):  # noqa: A002
    if isinstance(max, TensorBase):
        return apply(_O["clamp_max_tensor"], (input, max))
    max = _check_number(max, "clamp_max")
    return apply(_O["clamp_max"], (_promote_for_scalars(input, max),), {"max": max})


# -- softmax family --------------------------------------------------------------------------
def _softmax_like(name, input, dim, dtype):
    if dim is None:
        import warnings

        dim = 0 if input.ndim in (0, 1, 3) else 1
        warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the "
                      "call to include dim=X as an argument.", UserWarning, stacklevel=3)
    if dtype is not None:
        input = to_dtype(input, _dt.as_dtype(dtype))
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f'"{name}_lastdim_kernel_impl" not implemented for '
                                  f"'{input.dtype.name.capitalize().replace('Int64', 'Long')}'")
    _wrap_dim(dim, input.ndim)
    return apply(_O[name], (input,), {"dim": u64(dim)})


def softmax(input, dim=None, dtype=None):
    return _softmax_like("softmax", input, dim, dtype)


def log_softmax(input, dim=None, dtype=None):
    return _softmax_like("log_softmax", input, dim, dtype)


@numpy_aliases
def logsumexp(input, dim, keepdim=False):
    return apply(_O["logsumexp"], (input,), {"dim": _raw_dims(dim, input.ndim),
                                             "keepdim": bool(keepdim)})


# -- joining and slicing ---------------------------------------------------------------------
def _tensor_list(tensors, name):
    if isinstance(tensors, TensorBase) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{name}(): argument 'tensors' (position 1) must be tuple of Tensors, "
                        f"not {type(tensors).__name__}")
    for i, x in enumerate(tensors):
        if not isinstance(x, TensorBase):
            raise TypeError(f"expected Tensor as element {i} in argument 0, but got "
                            f"{type(x).__name__}")
    return list(tensors)


def cat(tensors, dim=0):
    """torch.cat; 1-D empty tensors are skipped (PyTorch's legacy rule)."""
    tensors = _tensor_list(tensors, "cat")
    if not tensors:
        raise ValueError("torch.cat(): expected a non-empty list of Tensors")
    kept = [x for x in tensors if tuple(x.shape) != (0,)]
    ref = kept[0] if kept else tensors[0]
    if ref.ndim == 0:
        raise RuntimeError("zero-dimensional tensor (at position 0) cannot be concatenated")
    d = _wrap_dim(dim, ref.ndim)
    for i, x in enumerate(tensors):
        if tuple(x.shape) == (0,) and kept:
            continue
        if x.ndim != ref.ndim:
            raise RuntimeError(f"Tensors must have same number of dimensions: got {ref.ndim} "
                               f"and {x.ndim}")
        for k in range(ref.ndim):
            if k != d and x.shape[k] != ref.shape[k]:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {d}. "
                                   f"Expected size {ref.shape[k]} but got size {x.shape[k]} for "
                                   f"tensor number {i} in the list.")
    sizes = tuple(None if (tuple(x.shape) == (0,) and kept) else x.shape[d] for x in tensors)
    return apply(list_spec("cat", len(tensors)), tuple(tensors), {"dim": u64(dim),
                                                                  "_sizes": sizes})


def stack(tensors, dim=0):
    tensors = _tensor_list(tensors, "stack")
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    for i, x in enumerate(tensors[1:], 1):
        if x.shape != tensors[0].shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                               f"{list(tensors[0].shape)} at entry 0 and {list(x.shape)} at "
                               f"entry {i}")
    _wrap_dim(dim, tensors[0].ndim + 1)
    return apply(list_spec("stack", len(tensors)), tuple(tensors), {"dim": u64(dim)})


def select(input, dim, index):
    if input.ndim == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    d = _wrap_dim(dim, input.ndim)
    size = input.shape[d]
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for tensor of size "
                         f"{list(input.shape)} at dimension {d}")
    return _select(input, u64(dim), u64(index))


def narrow(input, dim, start, length):
    d = _wrap_dim(dim, input.ndim)
    size = input.shape[d]
    if not -size <= start <= size:
        raise IndexError(f"start out of range (expected to be in range of [{-size}, {size}], "
                         f"but got {start})")
    start = start % size if start < 0 else start
    if length < 0 or start + length > size:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size "
                           f"({size}).")
    return slice_(input, u64(d), u64(start), u64(start + length), 1)


# -- composites that tutorials use (built from registered ops, so every backend has them) ---
def _count_true(input, dim, keepdim):
    nonzero = ne(input, 0)
    if dim is None:
        return sum(nonzero), input.numel()
    dims = _dims(dim, input.ndim)
    n = 1
    for d in dims:
        n *= input.shape[d] if input.ndim else 1
    return sum(nonzero, dims, keepdim=keepdim), n


@numpy_aliases
def all_(input, dim=None, keepdim=False):
    """True where every element (along ``dim``) is non-zero; a bool tensor, no gradient."""
    hits, n = _count_true(input, dim, keepdim)
    return eq(hits, n)


@numpy_aliases
def any_(input, dim=None, keepdim=False):
    """True where some element (along ``dim``) is non-zero; a bool tensor, no gradient."""
    hits, _ = _count_true(input, dim, keepdim)
    return gt(hits, 0)


def norm(input, p="fro", dim=None, keepdim=False):
    """The 2-norm (``p=2`` or ``"fro"``), composed as ``sqrt(sum(x * x))``.

    Its gradient is exact, but the graph shows SqrtBackward0 over SumBackward0 over
    MulBackward0 where torch shows one LinalgVectorNormBackward0 (docs/differences.md).
    """
    if p not in (2, 2.0, "fro"):
        raise NotImplementedError(f"norm(p={p!r}): only the 2-norm is implemented")
    return sqrt(sum(mul(input, input), dim, keepdim=keepdim) if dim is not None
                else sum(mul(input, input)))


# -- whole-tensor comparisons: equal, isclose, allclose --------------------------------------
def _tensor_args(fn: str, input, other) -> None:
    for name, pos, x in (("input", 1, input), ("other", 2, other)):
        if not isinstance(x, TensorBase):
            raise TypeError(f"{fn}(): argument '{name}' (position {pos}) must be Tensor, not "
                            f"{_type_name(x)}")
    if input._device != other._device:
        raise RuntimeError("Expected all tensors to be on the same device, but found at least "
                           f"two devices, {other._device} and {input._device}!")


def _host(t: Tensor):
    return t.detach().cpu()._data


def _num(v) -> str:
    """A double as torch's C++ messages print it: ``-1``, ``0.5``, ``1e-05``, ``nan``."""
    return f"{float(v):g}"


def equal(input, other) -> bool:
    """True when both have the same size and the same elements, compared in their promoted
    dtype as torch does (``equal(tensor([1.]), tensor([1]))`` is True); NaN is never equal."""
    import numpy as np

    _tensor_args("equal", input, other)
    if input.shape != other.shape:
        return False
    d = _dt.promote([(input.dtype, False), (other.dtype, False)]).np
    return bool(np.array_equal(_host(input).astype(d, copy=False),
                               _host(other).astype(d, copy=False)))


def _isclose(fn: str, input, other, rtol, atol, equal_nan):
    """isclose as a host bool array, computed as torch's isclose does (same dtypes only;
    tolerances applied in the input's float dtype, or the default one for ints and bools)."""
    import numpy as np

    _tensor_args(fn, input, other)
    for name, v in (("rtol", rtol), ("atol", atol)):  # torch's keyword-form wording
        if isinstance(v, TensorBase) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{fn}(): argument '{name}' must be float, not {_type_name(v)}")
    if not isinstance(equal_nan, (bool, np.bool_)):
        raise TypeError(f"{fn}(): argument 'equal_nan' must be bool, not "
                        f"{_type_name(equal_nan)}")
    if input.dtype is not other.dtype:
        raise RuntimeError(f"{_TORCH_NAMES[input.dtype.name]} did not match "
                           f"{_TORCH_NAMES[other.dtype.name]}")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if not v >= 0:
            raise RuntimeError(f"{name} must be greater than or equal to zero, but got {_num(v)}")
    a, b = _host(input), _host(other)
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise _broadcast_error(a.shape, b.shape) from None
    with np.errstate(all="ignore"):
        close = a == b
        floating = input.dtype.is_floating_point
        if equal_nan and floating:
            close = close | (np.isnan(a) & np.isnan(b))
        if rtol == 0 and atol == 0:
            return close
        ct = a.dtype if floating else _dt.default_float().np
        if input.dtype is _dt.bool_:
            a, b = a.astype(ct), b.astype(ct)
        allowed = ct.type(atol) + np.abs(ct.type(rtol) * b.astype(ct, copy=False))
        actual = np.abs(a - b).astype(ct, copy=False)
        return close | (np.isfinite(actual) & (actual <= allowed))


def _broadcast_error(a: tuple, b: tuple) -> RuntimeError:
    import builtins

    max = builtins.max  # noqa: A001  (this module's max is the tensor op)
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        if da != db and da != 1 and db != 1:
            return RuntimeError(f"The size of tensor a ({da}) must match the size of tensor b "
                                f"({db}) at non-singleton dimension {max(len(a), len(b)) - i}")
    return RuntimeError(f"shapes {list(a)} and {list(b)} cannot be broadcast")


def isclose(input, other, rtol: float = 1e-05, atol: float = 1e-08,
            equal_nan: bool = False) -> Tensor:
    """``|input - other| <= atol + rtol * |other|`` elementwise (a bool tensor), or equal;
    NaNs are close to each other only with ``equal_nan``; infinities only to themselves."""
    close = _isclose("isclose", input, other, rtol, atol, equal_nan)
    if input._device.type == "cpu":
        return _tl.Tensor._wrap(close)
    return _tl.Tensor._wrap(backend_for(input._device.type).from_host(close), input._device)


def allclose(input, other, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> bool:
    """Whether every element of ``input`` is close to ``other`` (see :func:`isclose`)."""
    return bool(_isclose("allclose", input, other, rtol, atol, equal_nan).all())


# -- in-place forms of the elementwise ops, generated from the registry ----------------------
#: Elementwise ops torch has no in-place form of.
_NO_INPLACE = frozenset({"where", "maximum", "minimum", "rsub"})
#: In-place forms written by hand in tensor.py (a backend kernel does them truly in place).
_HAND_WRITTEN = frozenset({"add", "sub", "mul", "div"})


def _elementwise_functions() -> list[str]:
    """The public elementwise functions, read off the registry: every op with a scalar SymPy
    meaning (elementwise by construction) or an elementwise comparison or logical rule, that
    this module exposes under the op's name. A new elementwise op gets its ``name_`` here."""
    names = []
    for name, spec in OPS.items():
        if not (callable(spec.sympy) or spec.dtype_rule in ("bool_compare", "bool")):
            continue
        if name in _NO_INPLACE or name.endswith("_") or not callable(globals().get(name)):
            continue
        names.append(name)
    return names


def _inplace_form(name: str):
    """``Tensor.<name>_``: the op written into the tensor (see ``Tensor._inplace_run``)."""
    fn = globals()[name]
    spec = OPS[name]
    method = name + "_"
    if spec.dtype_rule == "bool_compare":  # 0/1 in self's dtype; GtBackward0/GtBackward1
        def inplace(self, other):
            if isinstance(other, TensorBase):
                return self._inplace(method, f"{name}_tensor_", (other,))
            return self._inplace(method, f"{name}_", (), {"other": _check_number(other, name)})
    else:
        differentiable = spec.grad_fn is not None  # logical_*_: no leaf check, no rebase

        def inplace(self, *args, **kwargs):
            others = tuple(a for a in args + tuple(kwargs.values()) if isinstance(a, TensorBase))
            return self._inplace_run(method, others, lambda s: fn(s, *args, **kwargs),
                                     differentiable=differentiable)

    inplace.__name__ = inplace.__qualname__ = method
    inplace.__doc__ = (f"In-place :func:`{name}`: the result is written into this tensor, whose "
                       "version is bumped; with autograd the tensor's grad_fn becomes the op's "
                       "node, as in PyTorch.")
    return inplace


def _inplace_function(method: str):
    def fn(input, *args, **kwargs):
        return getattr(input, method)(*args, **kwargs)

    fn.__name__ = fn.__qualname__ = method
    fn.__doc__ = f"``symgrad.{method}(t, ...)`` is ``t.{method}(...)``."
    return fn


# -- in-place random initialisers ------------------------------------------------------------
_REQUIRED = object()


def _bind(fn: str, args: tuple, kwargs: dict, params: tuple) -> list:
    """Arguments by torch's parameter names (``from`` is a Python keyword, so these methods
    take ``*args, **kwargs``), with Python's errors for a wrong call."""
    if len(args) > len(params):
        raise TypeError(f"{fn}() takes from 0 to {len(params)} positional arguments but "
                        f"{len(args)} were given")
    values = dict(zip((p for p, _ in params), args))
    names = dict(params)
    for k, v in kwargs.items():
        if k not in names:
            raise TypeError(f"{fn}() got an unexpected keyword argument '{k}'")
        if k in values:
            raise TypeError(f"{fn}() got multiple values for argument '{k}'")
        values[k] = v
    for name, default in params:
        if name not in values:
            if default is _REQUIRED:
                raise TypeError(f"{fn}() missing 1 required positional arguments: \"{name}\"")
            values[name] = default
    return [values[p] for p, _ in params]


def _float_arg(fn: str, name: str, pos: int, v) -> float:
    import numpy as np

    if isinstance(v, TensorBase) and v.numel() == 1:
        v = v.item()
    if not isinstance(v, (bool, int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}(): argument '{name}' (position {pos}) must be float, not "
                        f"{_type_name(v)}")
    return float(v)


def _floating_only(t: Tensor, kernel: str) -> None:
    if not t.dtype.is_floating_point:
        raise NotImplementedError(f"\"{kernel}\" not implemented for "
                                  f"'{_TORCH_NAMES[t.dtype.name]}'")


def _continuous_only(t: Tensor, what: str, names: dict) -> None:
    if not t.dtype.is_floating_point:
        raise RuntimeError(f"{what} distribution is a continuous probability distribution. "
                           f"dtype must be a floating point but you specified "
                           f"{names[t.dtype.name]}")


def _refuse_leaf(self: Tensor) -> None:
    """torch's leaf error, before any number is drawn (the generator must not advance)."""
    if _state.enabled and self._requires_grad and self._grad_fn is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                           "operation.")


def _write_random(self: Tensor, method: str, op: str, host, others: tuple = ()) -> Tensor:
    """Write drawn numbers (a host array) into ``self`` through the op ``op``, whose forward
    copies them: truly in place without a graph, UniformBackward0 ... with one."""
    import numpy as np


    with np.errstate(all="ignore"):
        host = np.ascontiguousarray(host, dtype=self.dtype.np)
    values = host if self._device.type == "cpu" else \
        backend_for(self._device.type).from_host(host)
    return self._inplace(method, op, others, {"values": values}, "copy_", values)


def uniform_(self, *args, generator=None, **kwargs) -> Tensor:
    """``uniform_(from=0, to=1, *, generator=None)``: numbers uniform on [from, to)."""
    import numpy as np

    lo, hi = _bind("uniform_", args, kwargs, (("from", 0.0), ("to", 1.0)))
    lo = _float_arg("uniform_", "from", 1, lo)
    hi = _float_arg("uniform_", "to", 2, hi)
    _refuse_leaf(self)
    _floating_only(self, "check_uniform_bounds")
    big = float(np.finfo(self.dtype.np).max)
    cname = _CPP_NAMES[self.dtype.name]
    for name, v in (("from", lo), ("to", hi)):
        if not -big <= v <= big:
            raise RuntimeError(f"{name} is out of bounds for {cname}")
    if lo > hi:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found "
                           f"from={_num(lo)} > to={_num(hi)}")
    if hi - lo > big:
        raise RuntimeError(f"uniform_ expects to-from <= std::numeric_limits"
                           f"<{_TORCH_NAMES[self.dtype.name]}>::max(), "
                           f"but found to={_num(hi)} and from={_num(lo)} which result in to-from "
                           "to exceed the limit")
    u = _generator(generator).random(tuple(self.shape))
    with np.errstate(all="ignore"):
        v = (lo + u * (hi - lo)).astype(self.dtype.np)
    if lo < hi:  # rounding to the dtype must not reach ``to``
        v = np.minimum(v, np.nextafter(self.dtype.np.type(hi), self.dtype.np.type(lo)))
    return _write_random(self, "uniform_", "uniform_", v)


def normal_(self, *args, generator=None, **kwargs) -> Tensor:
    """``normal_(mean=0, std=1, *, generator=None)``: normally distributed numbers."""
    mean, std = _bind("normal_", args, kwargs, (("mean", 0.0), ("std", 1.0)))
    mean = _float_arg("normal_", "mean", 1, mean)
    std = _float_arg("normal_", "std", 2, std)
    _refuse_leaf(self)
    _floating_only(self, "normal_kernel_cpu")
    if not std >= 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {_num(std)}")
    z = _generator(generator).standard_normal(tuple(self.shape))
    return _write_random(self, "normal_", "normal_", mean + std * z)


def _random_overloads_error(args: tuple, kwargs: dict) -> TypeError:
    got = ", ".join([_type_name(a) for a in args]
                    + [f"{k}={_type_name(v)}" for k, v in kwargs.items()])
    return TypeError(f"random_() received an invalid combination of arguments - got ({got}), "
                     "but expected one of:\n * (*, Generator generator = None)\n * (int from, "
                     "int to, *, Generator generator = None)\n * (int to, *, Generator "
                     "generator = None)\n")


def random_(self, *args, generator=None, **kwargs) -> Tensor:
    """``random_()``, ``random_(to)``, ``random_(from, to)``: integers on [from, to - 1]; with
    no ``to``, up to the largest integer the dtype holds exactly (2**24 for float32, 2**53
    for float64, 2**63 - 1 for int64, 1 for bool)."""
    import warnings

    import numpy as np

    if len(args) > 2:
        raise TypeError(f"random_() takes 2 positional arguments but {len(args)} were given")
    if set(kwargs) - {"from", "to"}:
        raise _random_overloads_error(args, kwargs)
    if len(args) == 1 and not kwargs:
        lo, hi, op = 0, args[0], "random_to_"
    else:
        lo, hi = _bind("random_", args, kwargs, (("from", 0), ("to", None)))
        op = "random_" if not args and not kwargs else "random_from_to_"
    for v in (lo, hi):
        if v is not None and not (isinstance(v, (int, np.integer))
                                  and not isinstance(v, (bool, np.bool_))):
            raise _random_overloads_error(args, kwargs)
        if v is not None and not -(2**63) <= int(v) < 2**63:
            raise ValueError("Overflow when unpacking long long")
    _refuse_leaf(self)
    d = self.dtype
    digits = {"float32": 24, "float64": 53, "float16": 11, "bfloat16": 8}.get(d.name)
    top = 2**digits if digits else 1 if d is _dt.bool_ else int(np.iinfo(d.np).max)
    lo = int(lo)
    if hi is None:
        hi_incl = top
        if lo > top:
            raise RuntimeError(f"random_ expects 'from' casted to dtype to be less than or "
                               f"equal to 'to_inc' casted to dtype, but got from={lo} > "
                               f"to_inc={top}")
    else:
        hi = int(hi)
        if lo >= hi:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got "
                               f"from={lo} >= to={hi}")
        hi_incl = hi - 1
        if d is _dt.bool_:
            if lo < 0:
                raise RuntimeError("from is out of bounds for bool")
            if hi_incl > 1:
                raise RuntimeError("to - 1 is out of bounds for bool")
        elif digits:
            for what, v in (("from", lo), ("to - 1", hi_incl)):
                if not -(2**digits) <= v <= 2**digits:
                    warnings.warn(
                        f"{what} is out of bounds [-(2^{digits}), 2^{digits}]. Due to "
                        f"precision limitations {_CPP_NAMES[d.name]} can support discrete "
                        "uniform distribution only within this range. This warning will "
                        "become an error in version 1.7 release, please fix the code in "
                        "advance", UserWarning, stacklevel=2)
    v = _generator(generator).integers(lo, hi_incl, size=tuple(self.shape), dtype=np.int64,
                                       endpoint=True)
    return _write_random(self, "random_", op, v)


def bernoulli_(self, *args, generator=None, **kwargs) -> Tensor:
    """``bernoulli_(p=0.5, *, generator=None)``: 1 with probability p (a number, or a tensor
    broadcast to this one's shape), else 0; any dtype."""

    (p,) = _bind("bernoulli_", args, kwargs, (("p", 0.5),))
    if not isinstance(p, TensorBase):
        p = _float_arg("bernoulli_", "p", 1, p)
    _refuse_leaf(self)
    g = _generator(generator)
    if isinstance(p, TensorBase):
        if not p.dtype.is_floating_point:
            raise NotImplementedError(f"\"bernoulli_tensor_cpu_p_\" not implemented for "
                                      f"'{_TORCH_NAMES[p.dtype.name]}'")
        probs = _host(expand(p.detach(), tuple(self.shape)))
        if probs.size and not ((probs >= 0) & (probs <= 1)).all():
            raise RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.  "
                               "(Could this error message be improved?  If so, please report "
                               "an enhancement request to PyTorch.)")
        return _write_random(self, "bernoulli_", "bernoulli_tensor_",
                             g.random(tuple(self.shape)) < probs, (p,))
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={_num(p)}")
    return _write_random(self, "bernoulli_", "bernoulli_", g.random(tuple(self.shape)) < p)


def exponential_(self, *args, generator=None, **kwargs) -> Tensor:
    """``exponential_(lambd=1, *, generator=None)``: exponentially distributed numbers."""
    (lambd,) = _bind("exponential_", args, kwargs, (("lambd", 1.0),))
    lambd = _float_arg("exponential_", "lambd", 1, lambd)
    _refuse_leaf(self)
    _continuous_only(self, "Exponential", _TORCH_NAMES)
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={_num(lambd)}")
    v = _generator(generator).exponential(1.0 / lambd, tuple(self.shape))
    return _write_random(self, "exponential_", "exponential_", v)


def log_normal_(self, *args, generator=None, **kwargs) -> Tensor:
    """``log_normal_(mean=1, std=2, *, generator=None)``: exp of normal numbers."""
    import numpy as np

    mean, std = _bind("log_normal_", args, kwargs, (("mean", 1.0), ("std", 2.0)))
    mean = _float_arg("log_normal_", "mean", 1, mean)
    std = _float_arg("log_normal_", "std", 2, std)
    _refuse_leaf(self)
    _floating_only(self, "log_normal_cpu")
    if not std > 0:
        raise RuntimeError(f"log_normal_ expects std > 0.0, but found std={_num(std)}")
    with np.errstate(all="ignore"):
            v = np.exp(mean + std * _generator(generator).standard_normal(tuple(self.shape)))
    return _write_random(self, "log_normal_", "log_normal_", v)


def cauchy_(self, *args, generator=None, **kwargs) -> Tensor:
    """``cauchy_(median=0, sigma=1, *, generator=None)``: Cauchy-distributed numbers."""
    import numpy as np

    median, sigma = _bind("cauchy_", args, kwargs, (("median", 0.0), ("sigma", 1.0)))
    median = _float_arg("cauchy_", "median", 1, median)
    sigma = _float_arg("cauchy_", "sigma", 2, sigma)
    _refuse_leaf(self)
    _continuous_only(self, "Cauchy", _CPP_NAMES)
    if not sigma > 0:
        raise RuntimeError(f"cauchy_ expects sigma > 0.0, but found sigma={_num(sigma)}")
    u = _generator(generator).random(tuple(self.shape))
    return _write_random(self, "cauchy_", "cauchy_", median + sigma * np.tan(np.pi * (u - 0.5)))


def geometric_(self, *args, generator=None, **kwargs) -> Tensor:
    """``geometric_(p, *, generator=None)``: the number of trials to the first success."""
    (p,) = _bind("geometric_", args, kwargs, (("p", _REQUIRED),))
    p = _float_arg("geometric_", "p", 1, p)
    _refuse_leaf(self)
    if self.dtype is _dt.bool_:
        raise NotImplementedError("\"geometric_cpu\" not implemented for 'Bool'")
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={_num(p)}")
    v = _generator(generator).geometric(p, tuple(self.shape))
    return _write_random(self, "geometric_", "geometric_", v)


_INITIALISERS = (uniform_, normal_, random_, bernoulli_, exponential_, log_normal_, cauchy_,
                 geometric_)

#: torch's in-place aliases (``Tensor.multiply_`` is ``mul_`` ...); below, the in-place ops
#: torch also offers as functions (``torch.relu_(t)``).
_INPLACE_ALIASES = {"true_divide_": "div_", "divide_": "div_", "multiply_": "mul_",
                    "subtract_": "sub_", "negative_": "neg_", "greater_": "gt_",
                    "greater_equal_": "ge_", "less_": "lt_", "less_equal_": "le_",
                    "not_equal_": "ne_", "clip_": "clamp_"}
neg_ = _inplace_function("neg_")
negative_ = _inplace_function("negative_")
reciprocal_ = _inplace_function("reciprocal_")
exp_ = _inplace_function("exp_")
log_ = _inplace_function("log_")
sin_ = _inplace_function("sin_")
cos_ = _inplace_function("cos_")
tanh_ = _inplace_function("tanh_")
sigmoid_ = _inplace_function("sigmoid_")
sqrt_ = _inplace_function("sqrt_")
log1p_ = _inplace_function("log1p_")
log2_ = _inplace_function("log2_")
log10_ = _inplace_function("log10_")
expm1_ = _inplace_function("expm1_")
erf_ = _inplace_function("erf_")
relu_ = _inplace_function("relu_")
abs_ = _inplace_function("abs_")
clamp_ = _inplace_function("clamp_")
clip_ = _inplace_function("clip_")
clamp_min_ = _inplace_function("clamp_min_")
clamp_max_ = _inplace_function("clamp_max_")


def inplace_methods() -> dict:
    """Tensor's methods generated here from the op registry, by name (tensor.py attaches
    them): ``<op>_`` for each elementwise op of :func:`_elementwise_functions` (``exp_``,
    ``gt_`` ...; ``add_``/``sub_``/``mul_``/``div_`` are written in tensor.py) and the random
    initialisers (``uniform_`` ...). torch's in-place aliases (``multiply_`` ...) are
    ``_INPLACE_ALIASES``, resolved on the class."""
    methods = {name + "_": _inplace_form(name) for name in _elementwise_functions()
               if name not in _HAND_WRITTEN}
    methods.update((fn.__name__, fn) for fn in _INITIALISERS)
    return methods
