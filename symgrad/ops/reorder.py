"""sort / topk (values + indices), tril / triu, roll, repeat: ops that reorder, select or
copy elements (structural: their forwards replay exactly on the SymPy backend).

sort and topk send the gradient back to the indices they returned (torch's
``value_selecting_backward``: zeros with the gradient scattered in); tril/triu mask the
gradient like the input; roll rolls it back; repeat sums the copies.
"""

from __future__ import annotations

import numpy as np

from .. import _tensor_layer as _tl
from ._ints import norm, s64
from .registry import OPS, register
from .spec import STRUCTURAL, OpSpec


def _apply(name, inputs, params):
    return _tl.apply(OPS[name], inputs, params)


# -- sort / topk -------------------------------------------------------------------------------
def _sort_fwd(be, self, dim, descending, stable=False):
    if self.ndim == 0:
        return be.copy(self), be.full((), 0, np.int64)
    return be.sort(self, norm(dim, self.ndim), descending)


def _topk_fwd(be, self, k, dim, largest, sorted=True):  # noqa: A002
    if self.ndim == 0:
        return be.copy(self), be.full((), 0, np.int64)
    d = norm(dim, self.ndim)
    values, indices = be.sort(self, d, largest)
    region = (slice(None),) * d + (slice(0, k), Ellipsis)
    return be.copy(be.getitem(values, region)), be.copy(be.getitem(indices, region))


def value_selecting_backward(grad, dim, indices, self_sym_sizes):
    """Zeros shaped like the input with ``grad`` written at ``indices`` along ``dim``."""
    zeros = _tl.zeros(tuple(self_sym_sizes), dtype=grad.dtype, device=grad.device)
    if not self_sym_sizes:
        return grad + zeros
    return _apply("scatter", (zeros, grad), {"dim": dim, "index": indices})


register(OpSpec(
    "sort", "SortBackward0", ("self",), _sort_fwd,
    {"self": lambda grad, dim, indices, self_sym_sizes:
        value_selecting_backward(grad, dim, indices, self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", outputs=("result", "indices"),
    doc="sort(dim, descending): stable, NaN largest; indices are not differentiable."))
register(OpSpec(
    "topk", "TopkBackward0", ("self",), _topk_fwd,
    {"self": lambda grad, dim, indices, self_sym_sizes:
        value_selecting_backward(grad, dim, indices, self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", outputs=("result", "indices")))


# -- tril / triu -------------------------------------------------------------------------------
def triangle_mask(be, shape, diagonal: int, lower: bool):
    """A backend bool array of ``shape[-2:]``: the kept triangle."""
    n, m = shape[-2], shape[-1]
    keep = np.tri(n, m, diagonal, dtype=bool) if lower else ~np.tri(n, m, diagonal - 1,
                                                                       dtype=bool)
    return be.from_host(keep)


def _triangle_fwd(lower):
    def forward(be, self, diagonal=0):
        mask = triangle_mask(be, self.shape, diagonal, lower)
        return be.where(mask, self, be.full((), 0, self.dtype))

    return forward


register(OpSpec(
    "tril", "TrilBackward0", ("self",), _triangle_fwd(True),
    {"self": lambda grad, diagonal: _apply("tril", (grad,), {"diagonal": diagonal})},
    STRUCTURAL, dtype_rule="same"))
register(OpSpec(
    "triu", "TriuBackward0", ("self",), _triangle_fwd(False),
    {"self": lambda grad, diagonal: _apply("triu", (grad,), {"diagonal": diagonal})},
    STRUCTURAL, dtype_rule="same"))


# -- roll --------------------------------------------------------------------------------------
def _roll_fwd(be, self, shifts, dims):
    if not dims:  # torch: roll the flattened tensor, then restore the shape
        flat = be.reshape(self, (self.size,))
        return be.reshape(_roll_fwd(be, flat, shifts, (0,)), self.shape)
    out = self
    for shift, d in zip(shifts, dims):
        d = norm(d, self.ndim)
        n = self.shape[d]
        if n:
            source = be.from_host((np.arange(n, dtype=np.int64) - s64(shift)) % n)
            out = be.getitem(out, (slice(None),) * d + (source, Ellipsis))
    return be.copy(out) if out is self else out


register(OpSpec(
    "roll", "RollBackward0", ("self",), _roll_fwd,
    {"self": lambda grad, dims, shifts: _apply(
        "roll", (grad,), {"shifts": tuple(-s64(s) for s in shifts), "dims": dims})},
    STRUCTURAL, dtype_rule="same"))


# -- repeat ------------------------------------------------------------------------------------
def _interleaved(sizes, repeats):
    """(r0, s0, r1, s1, ...) for an input of ``sizes`` left-padded to len(repeats)."""
    padded = (1,) * (len(repeats) - len(sizes)) + tuple(sizes)
    return padded, tuple(v for pair in zip(repeats, padded) for v in pair)


def _repeat_fwd(be, self, repeats):
    padded, pairs = _interleaved(self.shape, repeats)
    x = be.reshape(self, tuple(v for s in padded for v in (1, s)))
    tiled = be.copy(be.broadcast_to(x, pairs))
    return be.reshape(tiled, tuple(r * s for r, s in zip(repeats, padded)))


def repeat_backward(grad, repeats, self_sym_sizes):
    _, pairs = _interleaved(self_sym_sizes, repeats)
    summed = grad.reshape(pairs).sum(tuple(range(0, len(pairs), 2))) if pairs else grad
    return summed.reshape(tuple(self_sym_sizes))


register(OpSpec(
    "repeat", "RepeatBackward0", ("self",), _repeat_fwd,
    {"self": lambda grad, repeats, self_sym_sizes: repeat_backward(grad, repeats,
                                                                   self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", doc="Tensor.repeat and torch.tile."))

