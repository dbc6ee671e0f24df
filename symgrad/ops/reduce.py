"""Reductions. Gradients broadcast back over the reduced dims (reshape, then expand)."""

from __future__ import annotations

from . import _tex
from ._ints import norms
from .registry import register
from .spec import STRUCTURAL, OpSpec


def _keepdim_shape(sizes, dims):
    return tuple(1 if i in dims else s for i, s in enumerate(sizes))


def _axes(dim, ndim):
    """Backend axes for reducing ``dim`` (a 0-dim tensor's dim 0 is the whole tensor)."""
    return norms(dim, ndim) if ndim else None


def _normalized(dim, ndim):
    return norms(dim, ndim)


def sum_backward(grad, self_sym_sizes, dim=None, keepdim=True):
    """Spread ``grad`` back over the reduced dims of a tensor of ``self_sym_sizes``."""
    if not keepdim:
        grad = grad.reshape(_keepdim_shape(self_sym_sizes, _normalized(dim, len(self_sym_sizes))))
    return grad.expand(self_sym_sizes)


def _count(sizes, dim):
    n = 1
    for d in _normalized(dim, len(sizes)):
        n *= sizes[d] if sizes else 1
    return n


register(OpSpec(
    "sum", "SumBackward0", ("self",),
    lambda be, self, dtype=None: be.sum(self, None, False, dtype),
    {"self": lambda grad, self_sym_sizes: grad.expand(self_sym_sizes)},
    STRUCTURAL, dtype_rule="sum",
    formula_tex=_tex.template("{y} = \\sum_i {0}_i", "\\bar{{{0}}}_i = \\bar{{{y}}}")))
register(OpSpec(
    "sum_dim", "SumBackward1", ("self",),
    lambda be, self, dim, keepdim, dtype=None: be.sum(self, _axes(dim, self.ndim), keepdim, dtype),
    {"self": lambda grad, dim, keepdim, self_sym_sizes:
        sum_backward(grad, self_sym_sizes, dim, keepdim)},
    STRUCTURAL, dtype_rule="sum",
    formula_tex=_tex.template("{y} = \\sum_{{i \\in \\mathrm{{dim}}}} {0}_i",
                              "\\bar{{{0}}} = \\operatorname{{expand}}(\\bar{{{y}}})")))
register(OpSpec(
    "mean", "MeanBackward0", ("self",),
    lambda be, self: be.mean(self, None, False),
    {"self": lambda grad, self_sym_numel, self_sym_sizes:
        grad.expand(self_sym_sizes) / self_sym_numel},
    STRUCTURAL, dtype_rule="float_only",
    formula_tex=_tex.template("{y} = \\frac{{1}}{{n}}\\sum_i {0}_i",
                              "\\bar{{{0}}}_i = \\bar{{{y}}} / n")))
register(OpSpec(
    "mean_dim", "MeanBackward1", ("self",),
    lambda be, self, dim, keepdim: be.mean(self, _axes(dim, self.ndim), keepdim),
    {"self": lambda grad, dim, keepdim, self_sym_numel, self_sym_sizes:
        sum_backward(grad, self_sym_sizes, dim, keepdim) / _count(self_sym_sizes, dim)},
    STRUCTURAL, dtype_rule="float_only",
    formula_tex=_tex.template("{y} = \\operatorname{{mean}}_{{\\mathrm{{dim}}}}({0})",
                              "\\bar{{{0}}} = \\operatorname{{expand}}(\\bar{{{y}}}) / n")))
