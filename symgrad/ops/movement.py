"""Ops that move or reshape elements without arithmetic; all are structural for SymPy."""

from __future__ import annotations

from .. import _tensor_layer as _tl
from . import _tex
from ._ints import norm, norms, s64
from .registry import OPS, register
from .spec import STRUCTURAL, OpSpec

#: the readable lines of the ops that only reshape or copy (the Inspector's formula line)
_RESHAPE_TEX = _tex.template("{y} = \\operatorname{{reshape}}({0})",
                             "\\bar{{{0}}} = \\operatorname{{reshape}}(\\bar{{{y}}})")
_COPY_TEX = _tex.template("{y} = {0}", "\\bar{{{0}}} = \\bar{{{y}}}")


def _inverse(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def _unsqueeze_to(grad, dim, self_sym_sizes):
    """Undo ``squeeze(dim)``: put the size-1 dim back if squeeze removed one."""
    sizes = tuple(self_sym_sizes)
    if not sizes:
        return grad.reshape(())
    d = norm(dim, len(sizes))
    return grad.unsqueeze(d) if sizes[d] == 1 else grad


register(OpSpec(
    "view", "ViewBackward0", ("self",), lambda be, self, size: be.reshape(self, size),
    {"self": lambda grad, self_sym_sizes: grad.reshape(self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", view=True,
    formula_tex=_RESHAPE_TEX))
register(OpSpec(
    "t", "TBackward0", ("self",),
    lambda be, self: be.transpose(self, tuple(range(self.ndim))[::-1]),
    {"self": lambda grad: grad.t()}, STRUCTURAL, dtype_rule="same", view=True,
    formula_tex=_tex.template("{y} = {0}^{{\\top}}", "\\bar{{{0}}} = \\bar{{{y}}}^{{\\top}}")))
register(OpSpec(
    "transpose", "TransposeBackward0", ("self",),
    lambda be, self, dim0, dim1: be.transpose(
        self, _swap(self.ndim, norm(dim0, self.ndim), norm(dim1, self.ndim))),
    {"self": lambda grad, dim0, dim1: grad.transpose(s64(dim0), s64(dim1))},
    STRUCTURAL, dtype_rule="same", view=True,
    formula_tex=_tex.template("{y} = {0}^{{\\top}}", "\\bar{{{0}}} = \\bar{{{y}}}^{{\\top}}")))
register(OpSpec(
    "permute", "PermuteBackward0", ("self",),
    lambda be, self, dims: be.transpose(self, norms(dims, self.ndim)),
    {"self": lambda grad, dims: grad.permute(_inverse(norms(dims, len(dims))))},
    STRUCTURAL, dtype_rule="same", view=True,
    formula_tex=_tex.template("{y} = \\operatorname{{permute}}({0})",
                              "\\bar{{{0}}} = \\operatorname{{permute}}^{{-1}}(\\bar{{{y}}})")))
register(OpSpec(
    "expand", "ExpandBackward0", ("self",), lambda be, self, size: _expand(be, self, size),
    {"self": lambda grad, self_sym_sizes: grad.sum_to_size(self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", view=True,
    formula_tex=_tex.template("{y} = \\operatorname{{expand}}({0})",
                              "\\bar{{{0}}} = \\textstyle\\sum_{{\\text{{broadcast dims}}}}"
                              "\\bar{{{y}}}")))
register(OpSpec(
    "unsqueeze", "UnsqueezeBackward0", ("self",),
    lambda be, self, dim: be.reshape(self, _unsqueezed(self.shape, norm(dim, self.ndim + 1))),
    {"self": lambda grad, dim: grad.squeeze(norm(dim, grad.ndim))}, STRUCTURAL, dtype_rule="same",
    view=True,
    formula_tex=_RESHAPE_TEX))
register(OpSpec(
    "squeeze", "SqueezeBackward1", ("self",),
    lambda be, self, dim: be.reshape(self, _squeezed(self.shape, dim)),
    {"self": lambda grad, dim, self_sym_sizes: _unsqueeze_to(grad, dim, self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", view=True,
    formula_tex=_RESHAPE_TEX))
register(OpSpec(
    "squeeze_", "SqueezeBackward4", ("self",),
    lambda be, self, dim: be.reshape(self, _squeezed(self.shape, dim)),
    {"self": lambda grad, dim, self_sym_sizes: _unsqueeze_to(grad, dim, self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", view=True,
    doc="In-place squeeze; PyTorch's 1-D @ 2-D matmul ends with it.",
    formula_tex=_RESHAPE_TEX))
register(OpSpec(
    "squeeze_all", "SqueezeBackward0", ("self",),
    lambda be, self: be.reshape(self, tuple(s for s in self.shape if s != 1)),
    {"self": lambda grad, self_sym_sizes: grad.reshape(self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", view=True, doc="``squeeze()`` with no dim.",
    formula_tex=_RESHAPE_TEX))
register(OpSpec(
    "squeeze_dims", "SqueezeBackward2", ("self",),
    lambda be, self, dim: be.reshape(self, _squeezed_all(self.shape, dim)),
    {"self": lambda grad, dim, self_sym_sizes: grad.reshape(self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", view=True, doc="``squeeze((d0, d1, ...))``.",
    formula_tex=_RESHAPE_TEX))
register(OpSpec(
    "alias", "AliasBackward0", ("self",), lambda be, self: be.reshape(self, self.shape),
    {"self": lambda grad: grad}, STRUCTURAL, dtype_rule="same", view=True,
    doc="``x[...]`` and ``x[:, :]``: a new tensor over the same data.",
    formula_tex=_RESHAPE_TEX))
register(OpSpec(
    "reshape_alias", "ReshapeAliasBackward0", ("self",),
    lambda be, self, size: be.reshape(self, size),
    {"self": lambda grad, self_sym_sizes: grad.reshape(self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", view=True,
    doc="reshape of a non-contiguous tensor whose strides allow a view.",
    formula_tex=_RESHAPE_TEX))
register(OpSpec(
    "unsafe_view", "UnsafeViewBackward0", ("self",),
    lambda be, self, size: be.reshape(self, size),
    {"self": lambda grad, self_sym_sizes: grad.reshape(self_sym_sizes)},
    STRUCTURAL, dtype_rule="same", view=True,
    doc="reshape of a fresh contiguous copy (reshape of a non-viewable tensor, batched @).",
    formula_tex=_RESHAPE_TEX))
register(OpSpec(
    "clone", "CloneBackward0", ("self",), lambda be, self: be.copy(self),
    {"self": lambda grad: grad}, STRUCTURAL, dtype_rule="same",
    formula_tex=_COPY_TEX))
register(OpSpec(
    "to_copy", "ToCopyBackward0", ("self",), lambda be, self, dtype: be.cast(self, dtype.np),
    {"self": lambda grad: grad}, STRUCTURAL, dtype_rule="param",
    doc="dtype casts; the engine casts the gradient back to the input's dtype.",
    formula_tex=_COPY_TEX))


def _diagonal_fwd(be, self, offset, dim1, dim2):
    return be.diagonal(self, s64(offset), norm(dim1, self.ndim), norm(dim2, self.ndim))


def _diagonal_backward_fwd(be, grad_output, input_sizes, offset, dim1, dim2):
    """zeros(input_sizes) with ``grad_output`` written on the diagonal (a writeable view)."""
    n = len(input_sizes)
    out = be.full(tuple(input_sizes), 0, grad_output.dtype)
    be.copy_(be.diagonal(out, s64(offset), norm(dim1, n), norm(dim2, n)), grad_output)
    return out


register(OpSpec(
    "diagonal", "DiagonalBackward0", ("self",), _diagonal_fwd,
    {"self": lambda grad, offset, dim1, dim2, self_sym_sizes: apply_op(
        "diagonal_backward", (grad,), {"input_sizes": tuple(self_sym_sizes), "offset": offset,
                                       "dim1": dim1, "dim2": dim2})},
    STRUCTURAL, dtype_rule="same", view=True,
    doc="torch.diagonal: a view with the diagonal of dims dim1, dim2 as its last dim."))
register(OpSpec(
    "diagonal_backward", "DiagonalBackwardBackward0", ("grad_output",), _diagonal_backward_fwd,
    {"grad_output": lambda grad, offset, dim1, dim2: apply_op(
        "diagonal", (grad,), {"offset": offset, "dim1": dim1, "dim2": dim2})},
    STRUCTURAL, dtype_rule="same"))


def apply_op(name, inputs, params):
    # autograd's apply, plugged in by autograd/function.py (ops never import autograd)
    return _tl.apply(OPS[name], inputs, params)


def _expand(be, x, size):
    """``broadcast_to``; to the array's own shape (batched matmul's expand of operands whose
    batch dims already agree) a plain view: NumPy's broadcast_to is Python-level and costs
    ~10 µs a call."""
    if x.shape == tuple(size):
        return be.reshape(x, x.shape)
    return be.broadcast_to(x, size)


def _swap(ndim, dim0, dim1):
    axes = list(range(ndim))
    if ndim:
        axes[dim0], axes[dim1] = axes[dim1], axes[dim0]
    return tuple(axes)


def _squeezed(shape, dim):
    if not shape:
        return shape
    d = norm(dim, len(shape))
    return shape[:d] + shape[d + 1:] if shape[d] == 1 else shape


def _squeezed_all(shape, dims):
    ds = set(norms(dims, len(shape)))
    return tuple(s for i, s in enumerate(shape) if not (i in ds and s == 1))


def _unsqueezed(shape, d):
    return shape[:d] + (1,) + shape[d:]
