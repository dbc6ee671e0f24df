"""Public tensor functions of issue 21: gather/scatter/index_select/index_add/masked_fill/
take_along_dim, cumsum/cumprod, var/std, norm and linalg.vector_norm, flip.

Each function checks its arguments with torch's wording (index dtype, index range, dims,
shapes) so that nothing unchecked reaches a kernel, then applies the op's spec
(symgrad/ops/gather.py, scan.py, stats.py). tensor.py binds them as Tensor methods where
torch has them (its class body); symgrad/__init__.py exports ``FUNCTIONS``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _tensor_layer as _tl
from . import dtypes as _dt
from . import return_types
from ._aliases import numpy_aliases
from ._random import _generator as _rng_of
from ._tensor_layer import CPP_NAMES, TORCH_NAMES, TensorBase
from ._tensor_layer import TORCH_NAMES as _TORCH_NAMES
from ._tensor_layer import wrap_dim as _wrap_dim
from ._views import mark_multi_output_views
from .autograd.function import apply
from .autograd.grad_mode import is_grad_enabled
from .ops import OPS
from .ops._ints import u64, u64s
from .ops.indexing import slice_

if TYPE_CHECKING:
    from .tensor import Tensor


def _host(t) -> np.ndarray:
    return np.asarray(t.detach().cpu().numpy())


def _index_dtype(fn: str, index, wording: str = "int32/int64") -> None:
    if not isinstance(index, TensorBase):
        raise TypeError(f"{fn}(): argument 'index' must be Tensor, not {type(index).__name__}")
    if index.dtype is not _dt.int64:
        raise RuntimeError(f"{fn}(): Expected dtype {wording} for index")


def _in_range(index, size: int, dim: int) -> None:
    """torch's ``index I is out of bounds for dimension D with size S``."""
    if index.numel() == 0 or index.device.type == "cpu":  # on the CPU: the op's forward
        return                                             # checks (ops/gather.py)
    values = _host(index)
    bad = values[(values < 0) | (values >= size)]
    if bad.size:
        raise RuntimeError(f"index {int(bad.reshape(-1)[0])} is out of bounds for dimension "
                           f"{dim} with size {size}")


def _same_rank_and_extent(fn: str, x, index, d: int, other=None) -> None:
    if index.ndim != max(x.ndim, 1) and not (x.ndim == 0 and index.ndim == 0):
        raise RuntimeError("Index tensor must have the same number of dimensions as "
                           f"{'input' if fn == 'gather' else 'self'} tensor")
    for k in range(index.ndim):
        if k != d and x.ndim and index.shape[k] > x.shape[k]:
            raise RuntimeError(f"Size does not match at dimension {k} expected index "
                               f"{list(index.shape)} to be no larger than self "
                               f"{list(x.shape)} apart from dimension {d}")
        if other is not None and other.ndim and index.shape[k] > other.shape[k]:
            raise RuntimeError(f"Size does not match at dimension {k} expected index "
                               f"{list(index.shape)} to be no larger than src "
                               f"{list(other.shape)}")


# -- gather / scatter --------------------------------------------------------------------------
def gather(input: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    """``out[i][j] = input[index[i][j]][j]`` (dim 0), torch.gather."""
    d = _wrap_dim(dim, input.ndim)
    _index_dtype("gather", index)
    _same_rank_and_extent("gather", input, index, d)
    _in_range(index, input.shape[d] if input.ndim else 1, d)
    return apply(OPS["gather"], (input,), {"dim": u64(dim), "index": index,
                                          "sparse_grad": bool(sparse_grad)})


def _scatter_checks(fn: str, input, dim, index, src=None) -> int:
    d = _wrap_dim(dim, input.ndim)
    _index_dtype(fn, index)
    if src is not None and src.dtype is not input.dtype:
        raise RuntimeError("scatter(): Expected self.dtype to be equal to src.dtype")
    _same_rank_and_extent(fn, input, index, d, src)
    _in_range(index, input.shape[d] if input.ndim else 1, d)
    return d


def scatter(input: Tensor, dim: int, index: Tensor, src: Any = None, *, value: Any = None,
            reduce: str | None = None) -> Tensor:
    """``out[index[i][j]][j] = src[i][j]`` (dim 0); ``src`` may be a number (``value``)."""
    if reduce is not None:
        raise NotImplementedError("scatter(reduce=...) is not implemented; use scatter_add")
    if src is None:
        src = value
    if isinstance(src, TensorBase):
        _scatter_checks("scatter", input, dim, index, src)
        return apply(OPS["scatter"], (input, src), {"dim": u64(dim), "index": index})
    _scatter_checks("scatter", input, dim, index)
    return apply(OPS["scatter_value"], (input,), {"dim": u64(dim), "index": index,
                                                 "value": src})


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    """``out[index[i][j]][j] += src[i][j]`` (dim 0): repeated indices add up."""
    _scatter_checks("scatter_add", input, dim, index, src)
    return apply(OPS["scatter_add"], (input, src), {"dim": u64(dim), "index": index})


def take_along_dim(input: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    """gather with the two tensors broadcast except along ``dim`` (GatherBackward0)."""
    _index_dtype("take_along_dim", indices, "int64")
    if dim is None:
        return gather(input.reshape(-1), 0, indices.reshape(-1))
    d = _wrap_dim(dim, input.ndim)
    if indices.ndim != input.ndim:
        raise RuntimeError("torch.take_along_dim(): input and indices should have the same "
                           f"number of dimensions, but got {input.ndim} dimensions for input, "
                           f"and {indices.ndim} dimensions for indices")
    shape_i = list(input.shape)
    shape_x = list(indices.shape)
    shape_i[d] = shape_x[d] = 1
    common = list(np.broadcast_shapes(tuple(shape_i), tuple(shape_x)))
    x_shape, i_shape = list(common), list(common)
    x_shape[d], i_shape[d] = input.shape[d], indices.shape[d]
    x = input if list(input.shape) == x_shape else input.expand(*x_shape)
    i = indices if list(indices.shape) == i_shape else indices.expand(*i_shape)
    return gather(x, dim, i)


# -- index_select / index_add / masked_fill ---------------------------------------------------
def _vector_index(fn: str, index) -> None:
    _index_dtype(fn, index, "int32 or int64")
    if index.ndim > 1:
        raise IndexError(f"{fn}(): Index is supposed to be a vector")


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    d = _wrap_dim(dim, input.ndim)
    _vector_index("index_select", index)
    if index.numel():
        values = _host(index)
        size = input.shape[d] if input.ndim else 1
        if ((values < 0) | (values >= size)).any():
            raise IndexError("index out of range in self")
    return apply(OPS["index_select"], (input,), {"dim": u64(dim), "index": index})


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *,
              alpha: Any = 1) -> Tensor:
    """``input`` with ``alpha * source`` added at ``index`` along ``dim`` (repeats add up)."""
    d = _wrap_dim(dim, input.ndim)
    _index_dtype("index_add_", index, "int32 or int64")
    if index.ndim > 1:
        raise IndexError("index_add_(): Index is supposed to be a vector")
    n = source.shape[d] if source.ndim else 1
    if index.numel() != n:
        raise RuntimeError(f"index_add_(): Number of indices ({index.numel()}) should be equal "
                           f"to source.size(dim): ({n}), for dim: {d}")
    _in_range(index, input.shape[d] if input.ndim else 1, d)
    return apply(OPS["index_add"], (input, source),
                 {"dim": u64(dim), "index": index, "alpha": alpha, "source_dim": source.ndim})


def _masked_fill_args(input, mask, value):
    """torch's checks; the mask expanded where it broadcasts beyond ``input``."""
    if mask.dtype is not _dt.bool_:
        raise RuntimeError("masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{CPP_NAMES.get(mask.dtype.name, mask.dtype.name)}")
    if isinstance(value, TensorBase):
        if value.ndim:
            raise RuntimeError("masked_fill_ only supports a 0-dimensional value tensor, but "
                               f"got tensor with {value.ndim} dimension(s).")
        if value.requires_grad and is_grad_enabled() and not input.dtype.is_floating_point:
            raise RuntimeError(f"Autograd not support dtype: {TORCH_NAMES[input.dtype.name]}")
    if tuple(np.broadcast_shapes(tuple(mask.shape), tuple(input.shape))) != tuple(input.shape):
        mask = mask.expand(*np.broadcast_shapes(tuple(mask.shape), tuple(input.shape)))
    return mask


def masked_fill(input: Tensor, mask: Tensor, value: Any) -> Tensor:
    """``input`` with ``value`` where ``mask`` is True: a number (MaskedFillBackward0), or a
    0-dim tensor (MaskedFillBackward1, whose gradient is the sum over the masked places)."""
    mask = _masked_fill_args(input, mask, value)
    if isinstance(value, TensorBase):
        return apply(OPS["masked_fill_tensor"], (input, value), {"mask": mask})
    return apply(OPS["masked_fill"], (input,), {"mask": mask, "value": value})


def masked_fill_(input: Tensor, mask: Tensor, value: Any) -> Tensor:
    """In-place :func:`masked_fill` (the node is recorded on ``input`` as torch does)."""
    mask = _masked_fill_args(input, mask, value)
    if isinstance(value, TensorBase):
        return input._inplace("masked_fill_", "masked_fill_tensor", (value,), {"mask": mask})
    return input._inplace("masked_fill_", "masked_fill", (), {"mask": mask, "value": value})


# -- cumsum / cumprod / flip -------------------------------------------------------------------
def _scan(name: str, input, dim, dtype):
    _wrap_dim(dim, input.ndim)
    if dtype is None:
        dtype = input.dtype if input.dtype.is_floating_point else _dt.int64
    return apply(OPS[name], (input,), {"dim": u64(dim), "dtype": dtype})


def cumsum(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    return _scan("cumsum", input, dim, dtype)


def cumprod(input: Tensor, dim: int, *, dtype: Any = None) -> Tensor:
    return _scan("cumprod", input, dim, dtype)


def _int_tuple(dims) -> tuple[int, ...]:
    return (int(dims),) if isinstance(dims, (int, np.integer)) else tuple(int(d) for d in dims)


def flip(input: Tensor, *dims) -> Tensor:
    dims = _int_tuple(dims[0] if len(dims) == 1 else dims)
    seen = set()
    for d in dims:
        w = _wrap_dim(d, input.ndim)
        if w in seen:
            raise RuntimeError(f"dim {w} appears multiple times in the list of dims")
        seen.add(w)
    return apply(OPS["flip"], (input,), {"dims": u64s(dims)})


# -- var / std / norm --------------------------------------------------------------------------
def _reduction_dims(dim, ndim):
    if dim is None:
        return None
    dims = _int_tuple(dim)
    for d in dims:
        _wrap_dim(d, ndim)
    return u64s(dims)


def _var_args(fn: str, input, dim, unbiased, correction, keepdim):
    if not input.dtype.is_floating_point:
        raise RuntimeError("std and var only support floating point and complex dtypes")
    if isinstance(dim, bool):  # var(unbiased: bool) legacy overload
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise TypeError(f"{fn}() received an invalid combination of arguments - got both "
                        "unbiased and correction")
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return {"dim": _reduction_dims(dim, input.ndim), "correction": correction,
            "keepdim": bool(keepdim)}


@numpy_aliases
def var(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False,
        *, correction: Any = None) -> Tensor:
    return apply(OPS["var"], (input,), _var_args("var", input, dim, unbiased, correction,
                                                keepdim))


@numpy_aliases
def std(input: Tensor, dim: Any = None, unbiased: bool | None = None, keepdim: bool = False,
        *, correction: Any = None) -> Tensor:
    return apply(OPS["std"], (input,), _var_args("std", input, dim, unbiased, correction,
                                                keepdim))


def vector_norm(x: Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False,  # noqa: A002
                *, dtype: Any = None) -> Tensor:
    """torch.linalg.vector_norm: ord 2, 1, inf, -inf, 0 or any real p."""
    if not x.dtype.is_floating_point:
        raise RuntimeError("linalg.vector_norm: Expected a floating point or complex tensor "
                           f"as input. Got {_dt_name(x.dtype)}")
    if dtype is not None:
        x = x.to(dtype)
    return apply(OPS["linalg_vector_norm"], (x,), {"ord": float(ord), "dim": _reduction_dims(
        dim, x.ndim), "keepdim": bool(keepdim)})


def _dt_name(d) -> str:
    return TORCH_NAMES.get(d.name, d.name)


def norm(input: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False,
         dtype: Any = None) -> Tensor:
    """Tensor.norm / torch.norm for vector norms (``p`` a number or "fro" over any dims)."""
    if p == "fro" or p is None:
        p = 2
    if isinstance(p, str):
        raise NotImplementedError(f"norm(p={p!r}): only vector norms are implemented")
    return vector_norm(input, p, dim, keepdim, dtype=dtype)



# -- sort / topk / tril / triu / roll / repeat / tile / outer ---------------------------------
def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """(values, indices) along ``dim``; always stable (ties keep their order)."""
    _wrap_dim(dim, input.ndim)
    values, indices = apply(OPS["sort"], (input,), {"dim": u64(dim),
                                                   "descending": bool(descending)})
    return return_types.sort(values, indices)


def argsort(input: Tensor, dim: int = -1, descending: bool = False,
            stable: bool = False) -> Tensor:
    return sort(input, dim, descending).indices


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002

    d = _wrap_dim(dim, input.ndim)
    size = input.shape[d] if input.ndim else 1
    if not 0 <= k <= size:
        raise RuntimeError("selected index k out of range")
    values, indices = apply(OPS["topk"], (input,), {"k": int(k), "dim": u64(dim),
                                                   "largest": bool(largest)})
    return return_types.topk(values, indices)


def _triangle(name: str, input, diagonal):
    if input.ndim < 2:
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
    return apply(OPS[name], (input,), {"diagonal": int(diagonal)})


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    return _triangle("tril", input, diagonal)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    return _triangle("triu", input, diagonal)


def roll(input: Tensor, shifts, dims=None) -> Tensor:
    shifts = _int_tuple(shifts)
    dims = () if dims is None else _int_tuple(dims)
    if dims and len(shifts) != len(dims):
        raise RuntimeError(f"shifts and dimensions must align. shifts: {len(shifts)}, dims:"
                           f"{len(dims)}")
    if not dims and len(shifts) != 1:
        raise RuntimeError("roll: shifts and dims must have the same length when dims is empty")
    for d in dims:
        _wrap_dim(d, input.ndim)
    return apply(OPS["roll"], (input,), {"shifts": u64s(shifts), "dims": u64s(dims)})


def repeat(input: Tensor, *sizes) -> Tensor:
    reps = _int_tuple(sizes[0] if len(sizes) == 1 and not isinstance(sizes[0], int)
                      else sizes)
    if len(reps) < input.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number "
                           "of dimensions of tensor")
    return apply(OPS["repeat"], (input,), {"repeats": reps})


def tile(input: Tensor, dims) -> Tensor:
    reps = _int_tuple(dims)
    reps = (1,) * (input.ndim - len(reps)) + reps
    return repeat(input, reps)


def outer(input: Tensor, vec2: Tensor) -> Tensor:
    """``input[:, None] * vec2`` (torch records MulBackward0 over a view, as here)."""
    if input.ndim != 1 or vec2.ndim != 1:
        raise RuntimeError(f"outer: Expected 1-D argument self, but got {input.ndim}-D"
                           if input.ndim != 1 else
                           f"outer: Expected 1-D argument vec2, but got {vec2.ndim}-D")
    return input.reshape(-1, 1) * vec2


# -- split / chunk / unbind / tensor_split -----------------------------------------------------
def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _py_type(x) -> str:
    return type(x).__name__ if not isinstance(x, TensorBase) else "Tensor"


def _pieces(name: str, input, params: dict) -> tuple:
    """Apply a multi-output op; the pieces of a view op refuse in-place writes as torch's do
    (the unsafe_ ops' pieces are no views for autograd: they take them)."""
    outs = apply(OPS[name], (input,), params)
    if OPS[name].view:
        mark_multi_output_views(outs, input.requires_grad)
    return outs


def split(tensor: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple:
    """Pieces of ``split_size`` along ``dim`` (the last may be smaller), or of the listed
    sizes; all views of ``tensor`` sharing one SplitBackward0 / SplitWithSizesBackward0."""
    sizes = split_size_or_sections
    if not _is_int(dim):
        raise TypeError(f"split() received an invalid combination of arguments - got (Tensor, "
                        f"{_py_type(sizes)}, {_py_type(dim)}), but expected one of:")
    if isinstance(sizes, (list, tuple)):
        for k, s in enumerate(sizes):
            if not _is_int(s):
                raise TypeError("split_with_sizes(): argument 'split_sizes' (position 2) must "
                                f"be tuple of ints, but found element of type {_py_type(s)} "
                                f"at pos {k}")
        return _by_sizes("split_with_sizes", tensor, tuple(int(s) for s in sizes), dim)
    if not _is_int(sizes):
        if isinstance(sizes, bool):
            raise TypeError("split() received an invalid combination of arguments - got "
                            f"(Tensor, bool, {_py_type(dim)}), but expected one of:")
        raise TypeError("split_with_sizes(): argument 'split_sizes' (position 2) must be "
                        f"tuple of ints, not {_py_type(sizes)}")
    return _by_size("split", tensor, int(sizes), dim)


def _by_sizes(name: str, tensor: Tensor, sizes: tuple, dim: int) -> tuple:
    """split_with_sizes / unsafe_split_with_sizes after the argument types: torch's checks."""
    if tensor.ndim == 0:
        raise RuntimeError("split expects at least a 1-dimensional tensor")
    d = _wrap_dim(dim, tensor.ndim)
    n = tensor.shape[d]
    if any(s < 0 for s in sizes):
        raise RuntimeError("split_with_sizes expects split_sizes have only non-negative "
                           f"entries, but got split_sizes={list(sizes)}")
    if sum(sizes) != n:
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} "
                           f"(input tensor's size at dimension {d}), but got "
                           f"split_sizes={list(sizes)}")
    return _pieces(name, tensor, {"split_sizes": sizes, "dim": u64(dim)})


def _by_size(name: str, tensor: Tensor, size: int, dim: int) -> tuple:
    """split / unsafe_split of an int size after the argument types: torch's checks."""
    if tensor.ndim == 0:
        raise RuntimeError("split expects at least a 1-dimensional tensor")
    d = _wrap_dim(dim, tensor.ndim)
    n = tensor.shape[d]
    if size < 0:
        raise RuntimeError(f"split expects split_size be non-negative, but got split_size={size}")
    if size == 0 and n != 0:
        raise RuntimeError("split_size can only be 0 if dimension size is 0, but got dimension "
                           f"size of {n}")
    return _pieces(name, tensor, {"split_size": size, "dim": u64(dim)})


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple:
    """At most ``chunks`` pieces of equal size (the last may be smaller): torch.chunk, which
    records a split (SplitBackward0) of size ceil(n / chunks)."""
    return _chunk("chunk", "", input, chunks, dim)


def _chunk(fn: str, unsafe: str, input: Tensor, chunks: int, dim: int) -> tuple:
    """chunk (``unsafe=""``) and unsafe_chunk (``"unsafe_"``: the unsafe_ split ops)."""
    if not _is_int(chunks):
        raise TypeError(f"{fn}(): argument 'chunks' (position 2) must be int, not "
                        f"{_py_type(chunks)}")
    if input.ndim == 0:
        raise RuntimeError("chunk expects at least a 1-dimensional tensor")
    chunks = int(chunks)
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    d = _wrap_dim(dim, input.ndim)
    n = input.shape[d]
    size = (n + chunks - 1) // chunks
    if size == 0 and n == 0:  # torch: chunks empty pieces, through split_with_sizes
        return _pieces(unsafe + "split_with_sizes", input, {"split_sizes": (0,) * chunks,
                                                            "dim": u64(dim)})
    return _pieces(unsafe + "split", input, {"split_size": size, "dim": u64(dim)})


# -- torch's unsafe_ forms: the same pieces, no views for autograd ----------------------------
def _int_arg(fn: str, name: str, pos: int, v: Any) -> int:
    if not _is_int(v):
        raise TypeError(f"{fn}(): argument '{name}' (position {pos}) must be int, not "
                        f"{_py_type(v)}")
    return int(v)


def unsafe_split(input: Tensor, split_size: int, dim: int = 0) -> tuple:
    """torch.unsafe_split: ``split`` of an int size whose pieces are no views for autograd
    (UnsafeSplitBackward0). They share the input's memory, so writing into a piece writes
    the input; torch's warning holds: modify the input or the pieces in place, not both."""
    return _unsafe_split(input, split_size, dim, 2)


def unsafe_split_with_sizes(input: Tensor, split_sizes: Any, dim: int = 0) -> tuple:
    """torch.unsafe_split_with_sizes: ``split`` of listed sizes, no views for autograd
    (UnsafeSplitWithSizesBackward0); see :func:`unsafe_split`."""
    return _unsafe_split_with_sizes(input, split_sizes, dim, 2)


def unsafe_chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple:
    """torch.unsafe_chunk: ``chunk`` whose pieces are no views for autograd (what torch's
    LSTM and GRU cut their gates with); see :func:`unsafe_split`."""
    return _unsafe_chunk(input, chunks, dim, 2)


# Tensor's methods: torch counts argument positions after self
def _unsafe_split_method(self: Tensor, split_size: int, dim: int = 0) -> tuple:
    """``Tensor.unsafe_split(split_size, dim=0)``: see :func:`unsafe_split`."""
    return _unsafe_split(self, split_size, dim, 1)


def _unsafe_split_with_sizes_method(self: Tensor, split_sizes: Any, dim: int = 0) -> tuple:
    """``Tensor.unsafe_split_with_sizes(split_sizes, dim=0)``: see :func:`unsafe_split`."""
    return _unsafe_split_with_sizes(self, split_sizes, dim, 1)


def _unsafe_chunk_method(self: Tensor, chunks: int, dim: int = 0) -> tuple:
    """``Tensor.unsafe_chunk(chunks, dim=0)``: see :func:`unsafe_chunk`."""
    return _unsafe_chunk(self, chunks, dim, 1)


def _unsafe_split(input, split_size, dim, pos: int) -> tuple:
    """(``pos``: the position torch's argument errors give ``split_size``)"""
    size = _int_arg("unsafe_split", "split_size", pos, split_size)
    return _by_size("unsafe_split", input, size, _int_arg("unsafe_split", "dim", pos + 1, dim))


def _unsafe_split_with_sizes(input, split_sizes, dim, pos: int) -> tuple:
    fn = "unsafe_split_with_sizes"
    if not isinstance(split_sizes, (list, tuple)):
        raise TypeError(f"{fn}(): argument 'split_sizes' (position {pos}) must be tuple of "
                        f"ints, not {_py_type(split_sizes)}")
    for k, v in enumerate(split_sizes):
        if not _is_int(v):
            raise TypeError(f"{fn}(): argument 'split_sizes' (position {pos}) must be tuple "
                            f"of ints, but found element of type {_py_type(v)} at pos {k}")
    return _by_sizes(fn, input, tuple(int(v) for v in split_sizes),
                     _int_arg(fn, "dim", pos + 1, dim))


def _unsafe_chunk(input, chunks, dim, pos: int) -> tuple:
    chunks = _int_arg("unsafe_chunk", "chunks", pos, chunks)
    return _chunk("unsafe_chunk", "unsafe_", input, chunks,
                  _int_arg("unsafe_chunk", "dim", pos + 1, dim))


def unbind(input: Tensor, dim: int = 0) -> tuple:
    """The slices along ``dim`` with that dim removed, sharing one UnbindBackward0."""
    if input.ndim == 0:
        raise IndexError(f"Dimension specified as {dim} but tensor has no dimensions")
    _wrap_dim(dim, input.ndim)
    return _pieces("unbind", input, {"dim": u64(dim)})


def tensor_split(input: Tensor, indices_or_sections: Any, dim: int = 0) -> tuple:
    """``sections`` nearly equal pieces, or pieces cut at ``indices``; each piece is its own
    slice (SliceBackward0), as torch records it."""
    arg = indices_or_sections
    if input.ndim == 0:
        raise RuntimeError("tensor_split expected at least a 1-dimensional tensor, but got a "
                           "tensor with 0 dims")
    if isinstance(arg, TensorBase):
        if arg.dtype is not _dt.int64:
            raise RuntimeError("tensor_split expected tensor_indices_or_sections to have dtype "
                               f"of long, but got {TORCH_NAMES.get(arg.dtype.name)}")
        if arg.ndim > 1:
            raise RuntimeError("tensor_split expected tensor_indices_or_sections to be a "
                               "zero-dimensional or one-dimensional tensor, but got a tensor "
                               f"with {arg.ndim} dims")
        arg = int(arg.item()) if arg.ndim == 0 else [int(v) for v in _host(arg)]
    d = _wrap_dim(dim, input.ndim)
    n = input.shape[d]
    if _is_int(arg):
        sections = int(arg)
        if sections <= 0:
            raise RuntimeError(f"number of sections must be larger than 0, got {sections}")
        small, extra = divmod(n, sections)
        bounds, start = [], 0
        for k in range(sections):
            end = start + small + (1 if k < extra else 0)
            bounds.append((start, end))
            start = end
    elif isinstance(arg, (list, tuple)) and all(_is_int(i) for i in arg):
        cuts = [int(i) for i in arg]
        bounds = list(zip([0] + cuts, cuts + [n]))
    else:
        raise TypeError("tensor_split() received an invalid combination of arguments - got "
                        f"(Tensor, {_py_type(arg)}), but expected one of:")
    return tuple(slice_(input, d, u64(a), u64(b), 1) for a, b in bounds)


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The ``offset`` diagonal of dims ``dim1``, ``dim2`` as the last dim (a view)."""
    d1, d2 = _wrap_dim(dim1, input.ndim), _wrap_dim(dim2, input.ndim)
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return apply(OPS["diagonal"], (input,), {"offset": u64(offset), "dim1": u64(dim1),
                                             "dim2": u64(dim2)})


# -- einsum -----------------------------------------------------------------------------------
def einsum(equation: str, *operands) -> Tensor:
    """Any contraction torch.einsum takes: ``...`` (broadcast dims), repeated indices within
    one operand (diagonals), implicit output. Composed of diagonal / sum / permute / reshape /
    bmm / mul as torch composes it (no einsum node); a single operand ends with a permute,
    as torch's does."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) > len(operands):
        raise RuntimeError("einsum(): fewer operands were provided than specified in the "
                           "equation")
    if len(terms) < len(operands):
        raise RuntimeError("einsum(): more operands were provided than specified in the "
                           "equation")
    operands, terms, ell = _einsum_ellipsis(list(operands), terms)
    letters = "".join(terms)
    if not arrow:
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1
                                   and c not in ell))
    else:
        out = out.replace("...", ell)
        for c in out:
            if c not in letters:
                raise RuntimeError(f"einsum(): output subscript {c} does not appear in the "
                                   "equation for any input operand")
            if out.count(c) > 1:
                raise RuntimeError(f"einsum(): output subscript {c} appears more than once in "
                                   "the output")
    for k, (t, x) in enumerate(zip(terms, operands)):  # repeated index: take the diagonal
        while len(set(t)) != len(t):
            c = next(c for c in t if t.count(c) > 1)
            p, q = t.index(c), t.index(c, t.index(c) + 1)
            if x.shape[p] != x.shape[q]:
                raise RuntimeError(f"einsum(): subscript {c} is repeated for operand {k} but "
                                   f"the sizes don't match, {x.shape[q]} != {x.shape[p]}")
            x, t = x.diagonal(0, p, q), t[:p] + t[p + 1:q] + t[q + 1:] + c
        operands[k], terms[k] = x, t
    seen: dict[str, int] = {}
    for k, (t, x) in enumerate(zip(terms, operands)):  # sizes agree (or one is 1) per letter
        for c, size in zip(t, x.shape):
            if c in seen and size != seen[c] and 1 not in (size, seen[c]):
                raise RuntimeError(f"einsum(): subscript {c} has size {size} for operand {k} "
                                   f"which does not broadcast with previously seen size "
                                   f"{seen[c]}")
            if seen.get(c, 1) == 1:
                seen[c] = size
    acc, acc_idx = operands[0], terms[0]
    for k in range(1, len(terms)):
        later = out + "".join(terms[k + 1:])
        acc, acc_idx = _contract(acc, acc_idx, operands[k], terms[k], later)
    summed = any(c not in out for c in acc_idx)
    acc, acc_idx = _sum_unused(acc, acc_idx, out)
    perm = tuple(acc_idx.index(c) for c in out)
    if len(terms) == 1 and not summed:
        return acc.permute(perm)  # torch records this permute even when it is the identity
    if perm == tuple(range(len(perm))):
        return acc
    return acc.permute(perm).view(tuple(acc.shape[p] for p in perm))  # torch ends in a view


#: stand-in subscripts for the dims ``...`` covers (never valid einsum letters)
_ELLIPSIS_LETTERS = "".join(chr(0x3B1 + i) for i in range(24))


def _einsum_ellipsis(operands: list, terms: list):
    """Terms with ``...`` spelled out as stand-in letters (right-aligned, broadcast: a size-1
    dim is expanded to the others' size); returns (operands, terms, the letters)."""
    counts = []
    for k, (t, x) in enumerate(zip(terms, operands)):
        if "..." in t:
            rest = t.replace("...", "", 1)
            if "." in rest:
                raise RuntimeError(f"einsum(): found '.' for operand {k} for which an ellipsis "
                                   "was already found")
            if len(rest) > x.ndim:
                raise RuntimeError(f"einsum(): the number of subscripts in the equation "
                                   f"({len(rest)}) is more than the number of dimensions "
                                   f"({x.ndim}) for operand {k}")
            counts.append(x.ndim - len(rest))
        elif "." in t:
            raise RuntimeError(f"einsum(): found '.' for operand {k} that is not part of any "
                               "ellipsis")
        else:
            if len(t) != x.ndim:
                raise RuntimeError(f"einsum(): the number of subscripts in the equation "
                                   f"({len(t)}) does not match the number of dimensions "
                                   f"({x.ndim}) for operand {k} and no ellipsis was given")
            counts.append(None)
    n = max((c for c in counts if c is not None), default=0)
    ell = _ELLIPSIS_LETTERS[:n]
    sizes: dict = {}
    for k, (t, x, c) in enumerate(zip(terms, operands, counts)):
        if c is None:
            continue
        mine = ell[n - c:]
        terms[k] = t.replace("...", mine)
        for d, e in enumerate(mine, start=t.index("...")):
            size = x.shape[d]
            seen = sizes.get(e, 1)
            if size != 1 and seen != 1 and size != seen:
                raise RuntimeError(f"einsum(): dimension {ell.index(e)} covered by ellipsis in "
                                   f"operand {k}has size {size} which does not broadcast with "
                                   f"previously seen ellipsis with size {seen} for the "
                                   "respective dimension")
            sizes[e] = max(size, seen)
    for k, (t, x, c) in enumerate(zip(terms, operands, counts)):
        if c is not None:
            shape = tuple(sizes.get(e, s) for e, s in zip(t, x.shape))
            if shape != tuple(x.shape):
                operands[k] = x.expand(*shape)
    return operands, terms, ell


def _sum_unused(x, idx: str, keep: str):
    dims = tuple(i for i, c in enumerate(idx) if c not in keep)
    if not dims:
        return x, idx
    return x.sum(dims), "".join(c for c in idx if c in keep)


def _contract(a, ai: str, b, bi: str, later: str):
    a, ai = _sum_unused(a, ai, bi + later)
    b, bi = _sum_unused(b, bi, ai + later)
    batch = [c for c in ai if c in bi and c in later]
    summed = [c for c in ai if c in bi and c not in later]
    left = [c for c in ai if c not in bi]
    right = [c for c in bi if c not in ai]
    size = {**dict(zip(ai, a.shape)), **dict(zip(bi, b.shape))}

    def n(cs):
        return math.prod(size[c] for c in cs)

    def arrange(x, xi, order):
        perm = tuple(xi.index(c) for c in order)
        return x.permute(perm) if perm != tuple(range(len(perm))) else x

    if not summed:  # nothing to contract: a broadcast product, as torch's sumproduct_pair
        order = sorted(batch + left + right, key=later.index)  # the output's order
        a_ = arrange(a, ai, [c for c in order if c in ai])
        b_ = arrange(b, bi, [c for c in order if c in bi])
        for k, c in enumerate(order):
            if c not in ai:
                a_ = a_.unsqueeze(k)
            if c not in bi:
                b_ = b_.unsqueeze(k)
        return a_ * b_, "".join(order)
    a3 = arrange(a, ai, batch + left + summed).reshape(n(batch), n(left), n(summed))
    b3 = arrange(b, bi, batch + summed + right).reshape(n(batch), n(summed), n(right))
    out = a3.bmm(b3).reshape(tuple(size[c] for c in batch + left + right))
    return out, "".join(batch + left + right)


def unique(input: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim: int | None = None):
    """The distinct values (or slices along ``dim``) in ascending order, with the inverse
    indices and counts torch returns on request. No gradient flows through the result
    (torch's Unique2Backward0 raises "not implemented" when reached). ``sorted=False`` sorts
    too: torch's CPU kernel does the same for the inputs checked, and an order is a
    valid answer where torch promises none."""
    a = _host(input)
    if dim is None:
        values, inverse, counts = np.unique(a.reshape(-1), return_inverse=True,
                                            return_counts=True)
        inverse = inverse.reshape(a.shape)
    else:
        d = _wrap_dim(dim, input.ndim)
        values, inverse, counts = np.unique(a, return_inverse=True, return_counts=True,
                                            axis=d)
        inverse = inverse.reshape(-1)

    def wrap(arr: np.ndarray) -> Tensor:
        return _tl.Tensor._wrap(np.ascontiguousarray(arr)).to(input.device)

    out = [wrap(values.astype(a.dtype))]
    if return_inverse:
        out.append(wrap(inverse.astype(np.int64)))
    if return_counts:
        out.append(wrap(counts.astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *, generator=None,
                out=None) -> Tensor:
    """Category indices drawn with probabilities proportional to the rows of ``input``.

    Without replacement it draws as torch's CPU kernel does, the ``num_samples`` largest of
    ``p / Exp(1)`` (so zero-weight categories come last, not never); the numbers differ from
    torch's for the same seed (symgrad's generator is NumPy's)."""
    if out is not None:
        raise TypeError("multinomial(): out= is not supported by symgrad")
    if input.dtype not in (_dt.float32, _dt.float64):
        raise RuntimeError("multinomial only supports floating-point dtypes for input, got: "
                           f"{_TORCH_NAMES[input.dtype.name]}")
    if input.ndim not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    n = int(num_samples)
    if n <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    p = np.asarray(input.detach().cpu().numpy(), dtype=np.float64).reshape(-1, input.shape[-1])
    if not replacement and n > p.shape[1]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without "
                           "replacement")
    if not np.isfinite(p).all() or (p < 0).any():
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    sums = p.sum(axis=1)
    if (sums <= 0).any():
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    g = _rng_of(generator)
    if replacement:
        cdf = np.cumsum(p / sums[:, None], axis=1)
        cdf[:, -1] = 1.0
        draws = g.random((p.shape[0], n))
        rows = [np.searchsorted(c, d, side="right") for c, d in zip(cdf, draws)]
        picked = np.minimum(np.stack(rows), p.shape[1] - 1)
    else:
        keys = p / g.exponential(size=p.shape)
        picked = np.argsort(-keys, axis=1, kind="stable")[:, :n]
    picked = picked.astype(np.int64).reshape(input.shape[:-1] + (n,))
    return _tl.Tensor._wrap(np.ascontiguousarray(picked)).to(input.device)


def _split_method(self: Tensor, split_size: Any, dim: int = 0) -> tuple:
    """``Tensor.split(split_size, dim=0)`` (torch names the argument so on the method)."""
    return split(self, split_size, dim)


#: top-level functions (torch has each of these names; the Tensor methods, tensor.py's
#: class body, also have repeat and masked_fill_, and split as ``_split_method``)
FUNCTIONS = ("gather", "scatter", "scatter_add", "take_along_dim", "index_select", "index_add",
             "masked_fill", "cumsum", "cumprod", "flip", "var", "std", "norm", "sort",
             "argsort", "topk", "tril", "triu", "roll", "tile", "outer", "split", "chunk",
             "unbind", "tensor_split", "diagonal", "unique", "multinomial", "einsum",
             "unsafe_split", "unsafe_split_with_sizes", "unsafe_chunk")
