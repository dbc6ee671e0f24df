"""Indexing: select, slice, advanced index, their backwards, and ``__setitem__``.

``x[...]`` is decomposed exactly as PyTorch does it (symgrad/indexing.py): ints become
``select`` (SelectBackward0), slices ``slice`` (SliceBackward0), None ``unsqueeze``,
tensors/lists/masks one ``index`` (IndexBackward0). The backwards are ops themselves
(zeros with the gradient written in, or accumulated over repeated indices), so
``create_graph=True`` differentiates through them. Assignments record ``CopySlices``,
``CopyBackwards`` or ``IndexPutBackward0`` on the target, as PyTorch does.
"""

from __future__ import annotations

from .. import _tensor_layer as _tl
from ..dtypes import bool_
from ._ints import norm, s64
from .registry import OPS, register
from .spec import STRUCTURAL, OpSpec


def _apply(name, inputs, params):
    # autograd's apply, plugged in by autograd/function.py (ops never import autograd)
    return _tl.apply(OPS[name], inputs, params)


def _at(d, item):
    """A basic index applying ``item`` to dim ``d`` (always a view, even for 0-d results)."""
    return (slice(None),) * d + (item, Ellipsis)


def _slice_of(start, end, step):
    return slice(s64(start), s64(end), step)


def np_indices(indices):
    """``(Tensor | None, ...)`` -> a backend index tuple (None: the whole dim)."""
    return tuple(slice(None) if i is None else getattr(i, "_data", i) for i in indices)


# -- select / slice / index -------------------------------------------------------------------
def _select_fwd(be, self, dim, index):
    return be.getitem(self, _at(norm(dim, self.ndim), s64(index)))


def _slice_fwd(be, self, dim, start, end, step):
    return be.getitem(self, _at(norm(dim, self.ndim), _slice_of(start, end, step)))


def _index_fwd(be, self, indices):
    return be.getitem(self, np_indices(indices))


def select(x, dim, index):
    return _apply("select", (x,), {"dim": dim, "index": index})


def slice_(x, dim, start, end, step):
    return _apply("slice", (x,), {"dim": dim, "start": start, "end": end, "step": step})


def index(x, indices):
    return _apply("index", (x,), {"indices": tuple(indices)})


register(OpSpec(
    "select", "SelectBackward0", ("self",), _select_fwd,
    {"self": lambda grad, dim, index, self_sym_sizes:
        _apply("select_backward", (grad,),
               {"input_sizes": tuple(self_sym_sizes), "dim": dim, "index": index})},
    STRUCTURAL, dtype_rule="same", view=True))
register(OpSpec(
    "slice", "SliceBackward0", ("self",), _slice_fwd,
    {"self": lambda grad, dim, start, end, step, self_sym_sizes:
        _apply("slice_backward", (grad,), {"input_sizes": tuple(self_sym_sizes), "dim": dim,
                                          "start": start, "end": end, "step": step})},
    STRUCTURAL, dtype_rule="same", view=True))
register(OpSpec(
    "index", "IndexBackward0", ("self",), _index_fwd,
    {"self": lambda grad, indices, self_sym_sizes:
        _apply("index_backward", (grad,), {"indices": indices,
                                          "input_sizes": tuple(self_sym_sizes)})},
    STRUCTURAL, dtype_rule="same",
    doc="Advanced indexing; ``indices`` holds the index tensors (None: a whole dim)."))


# -- their backwards: zeros with the gradient written (or accumulated) in --------------------
def _select_backward_fwd(be, grad_output, input_sizes, dim, index):
    out = be.full(tuple(input_sizes), 0, grad_output.dtype)
    be.setitem(out, _at(norm(dim, len(input_sizes)), s64(index)), grad_output)
    return out


def _slice_backward_fwd(be, grad_output, input_sizes, dim, start, end, step):
    out = be.full(tuple(input_sizes), 0, grad_output.dtype)
    be.setitem(out, _at(norm(dim, len(input_sizes)), _slice_of(start, end, step)), grad_output)
    return out


def _index_backward_fwd(be, values, indices, input_sizes):
    out = be.full(tuple(input_sizes), 0, values.dtype)
    return be.index_put(out, np_indices(indices), values, True)


register(OpSpec(
    "select_backward", "SelectBackwardBackward0", ("grad_output",), _select_backward_fwd,
    {"grad_output": lambda grad, dim, index: select(grad, dim, index)},
    STRUCTURAL, dtype_rule="same"))
register(OpSpec(
    "slice_backward", "SliceBackwardBackward0", ("grad_output",), _slice_backward_fwd,
    {"grad_output": lambda grad, dim, start, end, step: slice_(grad, dim, start, end, step)},
    STRUCTURAL, dtype_rule="same"))
register(OpSpec(
    "index_backward", "IndexPutImplBackward0", ("values",), _index_backward_fwd,
    {"values": lambda grad, indices: index(grad, indices)},
    STRUCTURAL, dtype_rule="same",
    doc="zeros(sizes) with ``values`` accumulated at ``indices`` (repeats add up)."))


# -- assignment: x[region] = src --------------------------------------------------------------
def region_view(be, x, basic):
    """The backend view of ``x[basic]`` (basic: ints, slices, None, Ellipsis)."""
    if not any(b is Ellipsis for b in basic):
        basic = tuple(basic) + (Ellipsis,)
    return be.getitem(x, basic)


def write_region(be, x, region, src) -> None:
    """``x[basic][adv] = src`` in place on the backend array ``x``."""
    basic, adv = region
    view = region_view(be, x, basic)
    if adv is None:
        be.setitem(view, Ellipsis, src)
    else:
        be.index_put(view, np_indices(adv), src, False)


def keep_mask(grad, region):
    """A bool tensor shaped like ``grad``: False on the assigned region."""
    m = _tl.ones(tuple(grad.shape), dtype=bool_)
    write_region(_tl.backend_for(grad.device.type), m._data, region, False)
    return m


def take_region(grad, region):
    """``grad[basic][adv]`` in differentiable ops (the gradient of the assigned value)."""
    basic, adv = region
    out = _tl.getitem(grad, tuple(basic))
    return out if adv is None else index(out, adv)


def _copy_slices_fwd(be, self, src, _region):
    out = be.copy(self)
    write_region(be, out, _region, src)
    return out


def _copy_fwd(be, self, src):
    out = be.copy(self)
    be.setitem(out, Ellipsis, src)
    return out


def _index_put_fwd(be, self, values, indices, accumulate):
    return be.index_put(be.copy(self), np_indices(indices), values, accumulate)


register(OpSpec(
    "copy_slices", "CopySlices", ("self", "src"), _copy_slices_fwd,
    {"self": lambda grad, _region: grad * keep_mask(grad, _region),
     "src": lambda grad, _region: take_region(grad, _region)},
    STRUCTURAL, dtype_rule="same",
    doc="``x[i] = v`` on part of x: x's new grad_fn (its old one is input 0)."))
def _as_strided_region_fwd(be, self, _region):
    return region_view(be, self, _region)


def _as_strided_region_bwd(grad, _region, self_sym_sizes):
    zeros = _tl.zeros(tuple(self_sym_sizes), dtype=grad.dtype, device=grad.device)
    return _apply("copy_slices", (zeros, grad), {"_region": (tuple(_region), None)})


register(OpSpec(
    "as_strided_region", "AsStridedBackward0", ("self",), _as_strided_region_fwd,
    {"self": _as_strided_region_bwd},
    STRUCTURAL, dtype_rule="same", view=True,
    doc="A view of a tensor written in place through one of its views: the view's new "
        "grad_fn (torch's AsStridedBackward0). Its meaning is ``self[_region]`` for the basic "
        "index ``_region`` (ints, slices, None) the view covers, which is what torch's "
        "(size, stride, storage_offset) describe for views made by indexing."))
register(OpSpec(
    "setitem_copy", "CopyBackwards", ("self", "src"), _copy_fwd,
    {"self": lambda grad: grad * 0, "src": lambda grad: grad},
    STRUCTURAL, dtype_rule="same", doc="``x[...] = v`` / ``x[:] = v``: all of x."))
register(OpSpec(
    "index_put", "IndexPutBackward0", ("self", "values"), _index_put_fwd,
    {"self": lambda grad, indices, accumulate:
        grad if accumulate else grad * keep_mask(grad, ((), indices)),
     "values": lambda grad, indices: index(grad, indices)},
    STRUCTURAL, dtype_rule="same", doc="``x[idx_tensors] = v``."))
