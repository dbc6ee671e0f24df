"""``Tensor.__getitem__`` / ``__setitem__``, decomposed exactly as PyTorch does it.

Getting: a plain int is ``select``, a plain slice ``slice``, None ``unsqueeze``, ``...``
an alias; in a tuple, full slices are skipped, then any index tensors (lists, masks,
int tensors) go to one ``index`` op. Setting writes into the tensor's data (version +1)
and, when a graph is recorded, makes the target's grad_fn ``CopySlices`` (part of it
assigned), ``CopyBackwards`` (all of it) or ``IndexPutBackward0`` (index tensors on the
whole tensor), whose first edge is the target's old grad_fn: the tensor object is the
same, only its place in the graph moves, as in PyTorch. Every index is checked here, so
no kernel ever sees an out-of-range one.
"""

from __future__ import annotations

import operator
import weakref
from typing import TYPE_CHECKING

import numpy as np

from . import _inplace_views as _iv
from . import _tensor_layer as _tl
from . import dtypes as _dt
from ._tensor_layer import TensorBase
from ._views import check_multi_output_view
from .autograd.function import _record
from .autograd.grad_mode import _state
from .autograd.node import _saved_tensors_hooks
from .autograd.record import _recording, before_write
from .backends import backend_for
from .functional import expand, unsqueeze, view
from .ops import OPS
from .ops import indexing as _ix
from .ops._ints import INT64_MAX, u64

if TYPE_CHECKING:  # annotations only: tensor.py imports this module
    from .tensor import Tensor

__all__ = ["getitem", "setitem"]

_BAD_INDEX = ("only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables "
              "are valid indices (got {})")


def _treat_as_tuple(index) -> bool:
    """PyTorch's treatSequenceAsTuple: a list holding slices, None, ... or sequences."""
    if isinstance(index, tuple):
        return True
    if not isinstance(index, list) or len(index) >= 32:
        return False
    return any(i is None or i is Ellipsis or isinstance(i, (slice, list, tuple, TensorBase,
                                                            np.ndarray)) for i in index)


def _item(i):
    """One index element in canonical form: bool, int, slice, None, Ellipsis or Tensor."""
    if i is None or i is Ellipsis or isinstance(i, slice):
        return i
    if isinstance(i, (bool, np.bool_)):
        return bool(i)
    if isinstance(i, (int, np.integer)):
        return int(i)
    if isinstance(i, TensorBase):
        if i.dtype not in (_dt.int64, _dt.bool_):
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        return i
    if isinstance(i, (list, range, np.ndarray)):  # torch reads a range as a sequence
        a = np.asarray(i)
        if a.size == 0 and a.dtype.kind not in "bi":
            a = a.astype(np.int64)
        if a.dtype.kind not in "biu":
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        return _tl.tensor(a.astype(np.bool_ if a.dtype.kind == "b" else np.int64))
    raise IndexError(_BAD_INDEX.format(type(i).__name__))


def _items(index):
    return tuple(_item(i) for i in (index if _treat_as_tuple(index) else (index,)))


def _consumed(item) -> int:
    if isinstance(item, TensorBase):
        if item.dtype is _dt.bool_:
            return item.ndim
        return 1
    if isinstance(item, (int, slice)) and not isinstance(item, bool):
        return 1
    return 0


def _check_count(items, ndim: int, setting: bool = False) -> int:
    specified = sum(_consumed(i) for i in items)
    if setting and sum(i is Ellipsis for i in items) > 1:  # torch reads x[..., ...]; rare
        raise IndexError("an index can only have a single ellipsis ('...') in an assignment")
    if specified > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    return specified


def _slice_args(s: slice, length: int, optimize: bool):
    """(start, end, step) as torch's slice saves them, or None for a skipped full slice."""
    step = 1 if s.step is None else operator.index(s.step)
    if step <= 0:
        raise ValueError("step must be greater than zero")
    start = 0 if s.start is None else operator.index(s.start)
    end = INT64_MAX if s.stop is None else operator.index(s.stop)
    if optimize and start == 0 and step == 1 and end >= length:
        return None
    return start, end, step


def _check_int(i: int, size: int, dim: int) -> None:
    """``dim`` is what torch names: the int's position in the index tuple (``x[None, 1, 3]``
    says dimension 2 for the 3), not the tensor dimension it selects from."""
    if not -size <= i < size:
        raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")


def _bool_index(value: bool) -> Tensor:
    return _tl.tensor([0] if value else [], dtype=_dt.int64)


def _record_index(adv: list, dim: int, t: Tensor) -> None:
    """Put index tensor ``t`` at ``dim`` of ``adv`` (one entry per backend index position:
    a k-dim mask is one entry spanning k dims, so callers pass ``dim`` less the extra
    dims of the masks before it)."""
    adv.extend([None] * (dim + 1 - len(adv)))
    adv[dim] = t


def _check_indices(shape, adv) -> None:
    """Bounds, mask shapes and broadcastability of index tensors against ``shape``.

    An out-of-range index names its dimension as torch does: the index tensor's place
    among the index tensors (a k-dim mask counts k, ``True``/``False`` count one), so
    ``x[[0], :, [9]]`` says dimension 1 (with the size of x's dimension 2)."""
    dim = 0
    ordinal = 0
    shapes = []
    for t in adv:
        if t is None:
            dim += 1
            continue
        a = t._data
        if t.dtype is _dt.bool_:
            for k in range(a.ndim):
                if dim + k >= len(shape) or a.shape[k] != shape[dim + k]:
                    raise IndexError(
                        f"The shape of the mask {list(a.shape)} at index {k} does not match the "
                        f"shape of the indexed tensor {list(shape)} at index {dim + k}")
            shapes.append((int(a.sum()),))
            dim += a.ndim
            ordinal += a.ndim
            continue
        size = shape[dim]
        # (a device index is checked by the kernel, reported at the next sync, as in torch)
        if a.size and t._device.type == "cpu":
            lo, hi = int(a.min()), int(a.max())
            bad = hi if hi >= size else lo if lo < -size else None
            if bad is not None:
                raise IndexError(f"index {bad} is out of bounds for dimension {ordinal} with "
                                 f"size {size}")
        shapes.append(a.shape)
        dim += 1
        ordinal += 1
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        raise IndexError("shape mismatch: indexing tensors could not be broadcast together "
                         "with shapes " + ", ".join(str(list(s)) for s in shapes)) from None


# -- getting -----------------------------------------------------------------------------------
def _select(x: Tensor, dim: int, i: int, position: int = 0) -> Tensor:
    shape = x._data.shape
    if not shape:
        raise IndexError("invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
                         "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number")
    _check_int(i, shape[dim], position)
    return _ix._apply("select", (x,), {"dim": dim, "index": i if i >= 0 else u64(i)})


def _slice(x: Tensor, dim: int, s: slice, optimize: bool) -> Tensor:
    if x.ndim == 0:
        raise IndexError("slice() cannot be applied to a 0-dim tensor.")
    args = _slice_args(s, x.shape[dim], optimize)
    if args is None:
        return x
    start, end, step = args
    return _ix.slice_(x, u64(dim), u64(start), u64(end), step)


def getitem(x: Tensor, index) -> Tensor:
    """``x[index]`` with PyTorch's decomposition and errors."""
    if not _treat_as_tuple(index):
        i = _item(index)
        if i is None:
            return unsqueeze(x, 0)
        if i is Ellipsis:
            return _ix._apply("alias", (x,), {})
        if isinstance(i, int) and not isinstance(i, bool):
            return _select(x, 0, i)  # (apply notes the views it makes)
        if isinstance(i, slice):
            return _slice(x, 0, i, optimize=False)
        items = (i,)
    else:
        items = _items(index)
    specified = _check_count(items, x.ndim)
    result, dim, adv = x, 0, []
    extra = 0  # dims spanned by masks beyond their one entry in adv
    for pos, item in enumerate(items):
        if item is Ellipsis:
            dim += x.ndim - specified
        elif item is None:
            result = unsqueeze(result, dim)
            dim += 1
        elif isinstance(item, bool):
            result = unsqueeze(result, dim)
            _record_index(adv, dim - extra, _bool_index(item))
            dim += 1
        elif isinstance(item, int):
            result = _select(result, dim, item, pos)
        elif isinstance(item, slice):
            result = _slice(result, dim, item, optimize=True)
            dim += 1
        elif item.ndim == 0 and item.dtype is _dt.int64:
            result = _select(result, dim, int(item.item()), pos)
        elif item.ndim == 0:  # a 0-dim bool tensor acts like a Python bool
            result = unsqueeze(result, dim)
            _record_index(adv, dim - extra, _bool_index(bool(item.item())))
            dim += 1
        else:
            _record_index(adv, dim - extra, item)
            dim += _consumed(item)
            extra += _consumed(item) - 1
    if not adv:
        if result is x:
            result = _ix._apply("alias", (x,), {})
        return result
    _check_indices(tuple(result.shape), adv)
    if result._device.type != "cpu":  # index tensors follow self's device, as in torch
        adv = [None if t is None else t.to(result._device) for t in adv]
    return _ix.index(result, adv)


# -- setting -----------------------------------------------------------------------------------
def _region(x: Tensor, items):
    """(numpy basic index for x, index tensors or None, whether the basic part is all of x)."""
    specified = _check_count(items, x.ndim, setting=True)
    basic: list = []
    adv: list = []
    src = dim = 0  # position in x's dims / in the basic view's dims
    extra = 0  # dims spanned by masks beyond their one entry in adv
    whole = True
    for pos, item in enumerate(items):
        if item is Ellipsis:
            basic.append(Ellipsis)
            n = x.ndim - specified
            src += n
            dim += n
        elif item is None:
            basic.append(None)
            dim += 1
            whole = False
        elif isinstance(item, bool):
            basic.append(None)
            _record_index(adv, dim - extra, _bool_index(item))
            dim += 1
            whole = False
        elif isinstance(item, (int, TensorBase)) and (not isinstance(item, TensorBase) or (
                item.ndim == 0 and item.dtype is _dt.int64)):
            i = int(item) if not isinstance(item, TensorBase) else int(item.item())
            _check_int(i, x.shape[src], pos)
            basic.append(i)
            src += 1
            whole = False
        elif isinstance(item, slice):
            args = _slice_args(item, x.shape[src], optimize=True)
            if args is None:
                basic.append(slice(None))
            else:
                basic.append(slice(args[0], args[1], args[2]))
                whole = False
            src += 1
            dim += 1
        elif item.ndim == 0:  # 0-dim bool tensor
            basic.append(None)
            _record_index(adv, dim - extra, _bool_index(bool(item.item())))
            dim += 1
            whole = False
        else:
            n = _consumed(item)
            basic.extend([slice(None)] * n)
            _record_index(adv, dim - extra, item)
            src += n
            dim += n
            extra += n - 1
    if adv and x._device.type != "cpu":  # index tensors follow x's device, as in torch
        adv = [None if t is None else t.to(x._device) for t in adv]
    return tuple(basic), (tuple(adv) if adv else None), whole


def _strip_leading_ones(shape):
    shape = tuple(shape)
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return shape[i:]


_VIEW_MESSAGE = (
    "symgrad: under autograd, assigning into a view of another tensor ({}) is not "
    "supported: the base tensor's graph would not see the change. Index the base "
    "tensor directly (x[i, j] = v rather than x[i][j] = v), or clone() the view first.")


def _check_not_view_of_graph(x: Tensor) -> None:
    """Refuse (rather than silently mis-differentiate) a graph write through a view."""
    fn = x._grad_fn
    if fn is None:
        # not in a graph: a view of a larger buffer would leave that buffer outside it
        if x._storage.nbytes != x._data.nbytes:
            raise RuntimeError(_VIEW_MESSAGE.format("a part of a larger tensor"))
        return
    spec = getattr(type(fn), "_spec", None)
    if spec is None or not spec.view or not fn._input_refs:
        return
    base = fn._input_refs[0]
    base = base() if isinstance(base, weakref.ref) else base  # strong under record()
    if isinstance(base, TensorBase) and base._storage is x._storage:
        raise RuntimeError(_VIEW_MESSAGE.format(f"made by {fn.name()}"))


def _view_written(items) -> str | None:
    """The grad_fn of the view ``x[items] = v`` writes into, as torch slices dim by dim
    (the last select / slice / unsqueeze); None when the write goes into ``x`` itself."""
    name = None
    for it in items:
        if it is None:
            name = "UnsqueezeBackward0"
        elif isinstance(it, slice):
            if not (it.start in (None, 0) and it.stop is None and it.step in (None, 1)):
                name = "SliceBackward0"
        elif isinstance(it, (int, np.integer)) and not isinstance(it, (bool, np.bool_)):
            name = "SelectBackward0"
    return name


def setitem(x: Tensor, index, value) -> None:
    """``x[index] = value``: writes x's data and, under autograd, rebases x's grad_fn."""
    if index is False:
        return  # PyTorch does nothing for x[False] = v
    items = _items(index)
    if isinstance(value, (list, np.ndarray)):
        value = _tl.tensor(value, dtype=x.dtype, device=x.device)
    elif not isinstance(value, TensorBase):
        if not isinstance(value, (bool, int, float, np.generic)):
            raise TypeError(f"can't assign a {type(value).__name__} to a "
                            f"symgrad.{x.dtype.name} tensor")
        value = value.item() if isinstance(value, np.generic) else value
    elif value._device != x._device:
        raise RuntimeError(f"expected device {x.device} but got device {value.device}")

    record = _state.enabled and (x._requires_grad or (
        isinstance(value, TensorBase) and value._requires_grad))
    if _state.enabled and x._requires_grad and x._grad_fn is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                           "operation.")
    check_multi_output_view(x, record, _view_written(items))
    found = None
    if record:
        found = _iv.view_base(x, "assignment") if x._grad_fn is not None else None
        if found is None:
            _check_not_view_of_graph(x)

    basic, adv, whole = _region(x, items)
    be = backend_for(x._device.type)
    if found is not None:
        base, view_region, others = found
        written = _iv.compose(view_region, basic)
        if written is None:
            raise RuntimeError("symgrad cannot locate the region assigned to in the base "
                               "tensor of this view.")
        eager = bool(_recording) or bool(_saved_tensors_hooks)
        old_base = _iv.stand_in(base, be, eager)  # before the write
    before_write(x)
    target = _ix.region_view(be, x._data, basic)
    if not getattr(getattr(target, "flags", None), "writeable", True):
        raise RuntimeError("unsupported operation: more than one element of the written-to "
                           "tensor refers to a single memory location. Please clone() the "
                           "tensor before performing the operation.")
    src = value
    if adv is None:
        shape = tuple(target.shape)
        if isinstance(value, TensorBase) and tuple(value.shape) != shape and value.ndim:
            src = expand(view(value, _strip_leading_ones(value.shape)), shape)
        be.setitem(target, Ellipsis, src._data if isinstance(src, TensorBase) else src)
    else:
        _check_indices(tuple(target.shape), adv)
        if isinstance(value, TensorBase):
            stripped = _strip_leading_ones(value.shape)
            if stripped != tuple(value.shape):
                src = view(value, stripped)
            result_shape = np.broadcast_to(np.empty((), np.bool_),
                                           target.shape)[_ix.np_indices(adv)].shape
            try:
                np.broadcast_shapes(tuple(src.shape), result_shape)
                if len(src.shape) > len(result_shape) or \
                        np.broadcast_shapes(tuple(src.shape), result_shape) != result_shape:
                    raise ValueError
            except ValueError:
                raise RuntimeError(f"shape mismatch: value tensor of shape {list(value.shape)} "
                                   "cannot be broadcast to indexing result of shape "
                                   f"{list(result_shape)}") from None
        be.index_put(target, _ix.np_indices(adv),
                     src._data if isinstance(src, TensorBase) else src, False)
    x._storage.version += 1
    if not record:
        return
    if found is not None:
        _iv.record_write(base, old_base, src, (written, adv), x, view_region, others, be,
                         eager)
        return

    if whole and adv is None:
        spec, params = OPS["setitem_copy"], {}
    elif whole:
        spec, params = OPS["index_put"], {"indices": adv, "accumulate": False}
    else:
        spec, params = OPS["copy_slices"], {"_region": (basic, adv)}
    _record(spec, (x, src), params, [x])
    if (_iv.VIEWS_OF and id(x) in _iv.VIEWS_OF) or (
            _iv.MADE and id(x._storage) in _iv.MADE):  # its views: rebase them
        _iv.refresh_views(x, be, bool(_recording) or bool(_saved_tensors_hooks))


_tl.provide(getitem=getitem)  # ops' backward formulas index through it
