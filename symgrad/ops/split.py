"""split, split_with_sizes and unbind: one node whose outputs are all views of the input.

PyTorch records one ``SplitBackward0`` (``SplitWithSizesBackward0``, ``UnbindBackward0``)
for all the pieces, each piece its own ``output_nr``; the backward joins the pieces'
gradients again (``cat`` / ``stack``), with zeros for pieces that got none, as torch's
``split_backward`` and ``unbind_backward`` do. chunk is split with the size chunk picks.
``unsafe_split`` / ``unsafe_split_with_sizes`` (torch's unsafe_split, unsafe_chunk: what its
LSTM and GRU cut their gates with) are the same cut under their own grad_fn names
(``UnsafeSplitBackward0`` ...): the pieces share the input's memory but are no views for
autograd, so writing into one in place records on the piece alone, as in torch.
"""

from __future__ import annotations

from .. import _tensor_layer as _tl
from ._ints import norm
from .registry import register
from .shape import list_spec
from .spec import STRUCTURAL, OpSpec


def piece_sizes(n: int, split_size: int) -> tuple[int, ...]:
    """The sizes ``split(split_size)`` cuts a dim of size ``n`` into (one piece when n=0)."""
    if n == 0 or split_size == 0:
        return (n,)
    return tuple(min(split_size, n - s) for s in range(0, n, split_size))


def _pieces(be, self, dim, sizes):
    d = norm(dim, self.ndim)
    lead = (slice(None),) * d
    out, start = [], 0
    for size in sizes:
        out.append(be.getitem(self, lead + (slice(start, start + size), Ellipsis)))
        start += size
    return tuple(out)


def _split_fwd(be, self, split_size, dim):
    return _pieces(be, self, dim, piece_sizes(self.shape[norm(dim, self.ndim)], split_size))


def _split_with_sizes_fwd(be, self, split_sizes, dim):
    return _pieces(be, self, dim, split_sizes)


def _unbind_fwd(be, self, dim):
    d = norm(dim, self.ndim)
    lead = (slice(None),) * d
    return tuple(be.getitem(self, lead + (i, Ellipsis)) for i in range(self.shape[d]))


def _filled(grads, shapes):
    """``grads`` with zeros of ``shapes[k]`` where output k got no gradient."""
    ref = next(g for g in grads if g is not None)
    return [g if g is not None else _tl.zeros(shape, dtype=ref.dtype, device=ref.device)
            for g, shape in zip(grads, shapes)]


def _join(grads, sizes, dim, self_sym_sizes):
    """The input's gradient: the pieces' gradients concatenated along ``dim``."""
    sizes = tuple(sizes)
    full = tuple(self_sym_sizes)
    d = norm(dim, len(full))
    shapes = [full[:d] + (s,) + full[d + 1:] for s in sizes]
    grads = _filled(grads, shapes)
    return _tl.apply(list_spec("cat", len(grads)), tuple(grads), {"dim": dim, "_sizes": sizes})


def _split_grad(grads, split_size, dim, self_sym_sizes):
    n = tuple(self_sym_sizes)[norm(dim, len(self_sym_sizes))]
    return _join(grads, piece_sizes(n, split_size), dim, self_sym_sizes)


def _split_with_sizes_grad(grads, split_sizes, dim, self_sym_sizes):
    return _join(grads, split_sizes, dim, self_sym_sizes)


def _unbind_grad(grads, dim):
    shape = tuple(next(g for g in grads if g is not None).shape)
    grads = _filled(grads, [shape] * len(grads))
    return _tl.apply(list_spec("stack", len(grads)), tuple(grads), {"dim": dim})


register(OpSpec(
    "split", "SplitBackward0", ("self",), _split_fwd, {"self": _split_grad}, STRUCTURAL,
    dtype_rule="same", view=True, variadic_outputs=True,
    doc="torch.split with an int size, and torch.chunk (which picks the size)."))
register(OpSpec(
    "split_with_sizes", "SplitWithSizesBackward0", ("self",), _split_with_sizes_fwd,
    {"self": _split_with_sizes_grad}, STRUCTURAL, dtype_rule="same", view=True,
    variadic_outputs=True, doc="torch.split with a list of sizes."))
register(OpSpec(
    "unbind", "UnbindBackward0", ("self",), _unbind_fwd, {"self": _unbind_grad}, STRUCTURAL,
    dtype_rule="same", view=True, variadic_outputs=True,
    doc="torch.unbind: the slices along dim, that dim removed."))
register(OpSpec(
    "unsafe_split", "UnsafeSplitBackward0", ("self",), _split_fwd, {"self": _split_grad},
    STRUCTURAL, dtype_rule="same", variadic_outputs=True,
    doc="torch.unsafe_split and torch.unsafe_chunk: split's pieces, no views for autograd."))
register(OpSpec(
    "unsafe_split_with_sizes", "UnsafeSplitWithSizesBackward0", ("self",),
    _split_with_sizes_fwd, {"self": _split_with_sizes_grad}, STRUCTURAL, dtype_rule="same",
    variadic_outputs=True, doc="torch.unsafe_split_with_sizes (and unsafe_chunk of an empty "
                               "dim): split_with_sizes' pieces, no views for autograd."))
