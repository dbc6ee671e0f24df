"""gather / scatter / scatter_add / index_select / index_add: ops that address one dim by an
index tensor.

Every forward is advanced indexing on the backend (``getitem`` / ``index_put``) with an
index grid: the index tensor along ``dim`` and ``arange`` broadcast along the other dims.
The index tensors are params (saved, no edge), validated by the public functions
(symgrad/tensor_functions.py) before they reach a kernel, as torch's ``_saved_index``.
Backwards are the ops' duals (gather <-> scatter_add, index_select <-> index_add), so
``create_graph=True`` differentiates through them.
"""

from __future__ import annotations

import numpy as np

from .. import _tensor_layer as _tl
from ._ints import norm
from .registry import OPS, register
from .spec import STRUCTURAL, OpSpec


def _arr(x):
    return getattr(x, "_data", x)


def _apply(name, inputs, params):
    return _tl.apply(OPS[name], inputs, params)


def index_grid(be, index, dim: int) -> tuple:
    """Backend indices addressing ``out[i0..in] = x[i0.., index[i0..in], ..in]``."""
    shape = tuple(index.shape)
    grid = []
    for d, n in enumerate(shape):
        if d == dim:
            grid.append(index)
        else:
            ramp = be.reshape(be.arange(0, n, 1, np.int64),
                              tuple(n if k == d else 1 for k in range(len(shape))))
            # the cast keeps the grid integral on the SymPy backend (object arrays)
            grid.append(be.cast(be.broadcast_to(ramp, shape), np.int64))
    return tuple(grid)


def _leading(be, src, shape):
    """``src[:shape[0], :shape[1], ...]`` (scatter reads only the index's extent of src)."""
    if tuple(src.shape) == tuple(shape):
        return src
    return be.getitem(src, tuple(slice(0, n) for n in shape))


def check_range(index, self, dim) -> None:
    """torch's ``index I is out of bounds for dimension D with size S``, on a host index
    array (the op's own check, so a compiled step runs it on each call; the public
    functions read a device index back themselves)."""
    if not isinstance(index, np.ndarray) or index.size == 0 or index.dtype.kind not in "iu":
        return
    n = self.ndim
    d = norm(dim, n) if n else 0
    size = self.shape[d] if n else 1
    lo, hi = index.min(), index.max()
    if lo < 0 or hi >= size:
        bad = index[(index < 0) | (index >= size)]
        raise RuntimeError(f"index {int(bad.reshape(-1)[0])} is out of bounds for dimension "
                           f"{d} with size {size}")


def _gather_fwd(be, self, dim, index, sparse_grad=False):
    index = _arr(index)
    check_range(index, self, dim)
    if self.ndim == 0:
        return be.copy(self)
    return be.getitem(self, index_grid(be, index, norm(dim, self.ndim)))


def _scatter_fwd(be, self, src, dim, index, accumulate):
    index = _arr(index)
    check_range(index, self, dim)
    if index.size == 0:
        return be.copy(self)
    scalar = self.ndim == 0  # a 0-dim self is addressed as a 1-element vector
    out = be.copy(be.reshape(self, (1,)) if scalar else self)
    if scalar:
        index, dim = be.reshape(index, (1,)), 0
    if not isinstance(src, (bool, int, float)):
        src = _leading(be, be.reshape(src, (1,)) if src.ndim == 0 else src, index.shape)
    out = be.index_put(out, index_grid(be, index, norm(dim, out.ndim)), src, accumulate)
    return be.reshape(out, ()) if scalar else out


def _vector(be, index):
    return be.reshape(index, (1,)) if index.ndim == 0 else index


def _at(d, item):
    return (slice(None),) * d + (item, Ellipsis)


def _index_select_fwd(be, self, dim, index):
    index = _vector(be, _arr(index))
    if self.ndim == 0:
        return be.reshape(be.copy(self), ()) if index.size else be.full((0,), 0, self.dtype)
    return be.getitem(self, _at(norm(dim, self.ndim), index))


def _index_add_fwd(be, self, source, dim, index, alpha=1, source_dim=None):
    index = _vector(be, _arr(index))
    check_range(index, self, dim)
    out = be.copy(self)
    if alpha != 1:
        source = be.mul(source, alpha)
    if self.ndim == 0:
        return be.add(out, be.reshape(source, ())) if index.size else out
    return be.index_put(out, _at(norm(dim, self.ndim), index), source, True)


# -- differentiable helpers used by the formulas ---------------------------------------------
def gather(x, dim, index):
    return _apply("gather", (x,), {"dim": dim, "index": index, "sparse_grad": False})


def scatter_add(x, dim, index, src):
    return _apply("scatter_add", (x, src), {"dim": dim, "index": index})


def scatter_value(x, dim, index, value):
    return _apply("scatter_value", (x,), {"dim": dim, "index": index, "value": value})


def index_select(x, dim, index):
    return _apply("index_select", (x,), {"dim": dim, "index": index})


def index_add(x, dim, index, source, alpha=1):
    return _apply("index_add", (x, source), {"dim": dim, "index": index, "alpha": alpha,
                                             "source_dim": source.ndim})


def _zeros(grad, sizes):
    return _tl.zeros(tuple(sizes), dtype=grad.dtype, device=grad.device)


def _index_add_source_grad(grad, alpha, dim, index, source_dim):
    g = index_select(grad, dim, index)
    if source_dim == 0:
        g = g.reshape(())
    return g if alpha == 1 else g * alpha


register(OpSpec(
    "gather", "GatherBackward0", ("self",), _gather_fwd,
    {"self": lambda grad, dim, index, self, sparse_grad:
        scatter_add(_zeros(grad, self.shape), dim, index, grad)},
    STRUCTURAL, dtype_rule="same", doc="torch.gather / take_along_dim."))
register(OpSpec(
    "scatter", "ScatterBackward0", ("self", "src"),
    lambda be, self, src, dim, index: _scatter_fwd(be, self, src, dim, index, False),
    {"self": lambda grad, dim, index: scatter_value(grad, dim, index, 0),
     "src": lambda grad, dim, index: gather(grad, dim, index)},
    STRUCTURAL, dtype_rule="same", doc="scatter(dim, index, src): repeats keep one write."))
register(OpSpec(
    "scatter_value", "ScatterBackward1", ("self",),
    lambda be, self, dim, index, value: _scatter_fwd(be, self, value, dim, index, False),
    {"self": lambda grad, dim, index: scatter_value(grad, dim, index, 0)},
    STRUCTURAL, dtype_rule="same", doc="scatter(dim, index, value: number)."))
register(OpSpec(
    "scatter_add", "ScatterAddBackward0", ("self", "src"),
    lambda be, self, src, dim, index: _scatter_fwd(be, self, src, dim, index, True),
    {"self": lambda grad, dim, index: grad,
     "src": lambda grad, dim, index: gather(grad, dim, index)},
    STRUCTURAL, dtype_rule="same", doc="scatter_add: repeated indices add up."))
register(OpSpec(
    "index_select", "IndexSelectBackward0", ("self",), _index_select_fwd,
    {"self": lambda grad, dim, index, self_sym_sizes:
        index_add(_zeros(grad, self_sym_sizes), dim, index, grad)},
    STRUCTURAL, dtype_rule="same"))
register(OpSpec(
    "index_add", "IndexAddBackward0", ("self", "source"), _index_add_fwd,
    {"self": lambda grad, dim, index: grad,
     "source": lambda grad, alpha, dim, index, source, source_dim:
        _index_add_source_grad(grad, alpha, dim, index, source_dim)},
    STRUCTURAL, dtype_rule="same",
    doc="index_add(dim, index, source, alpha); torch also saves ``source`` itself."))
