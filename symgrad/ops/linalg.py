"""Matrix products. ``matmul`` dispatches to these exactly as PyTorch's does."""

from __future__ import annotations

from . import _tex
from .registry import register
from .spec import STRUCTURAL, OpSpec


def column_major(sizes: tuple, strides: tuple) -> bool:
    """A 2-D tensor laid out as the transpose of a contiguous one (``W.t()``): the layout
    in which torch's mm backward returns that operand's gradient."""
    return strides[0] == 1 and (strides[1] == sizes[0] or sizes[1] == 1) and sizes[0] != 1


def _scaled(grad, alpha):
    return grad if alpha == 1 else grad * alpha


def mm_mat1_backward(grad, mat2, mat1_sizes, mat1_strides, alpha=1):
    """d(mat1 @ mat2)/d mat1 laid out like mat1 (torch's mm_mat1_backward): a transposed
    mat1 gets ``(mat2 @ grad^T)^T``, so a leaf behind ``t()`` receives a contiguous gradient
    and AccumulateGrad need not copy it."""
    if column_major(mat1_sizes, mat1_strides):
        return _scaled(mat2.mm(grad.t()).t(), alpha)
    return _scaled(grad.mm(mat2.t()), alpha)


def mm_mat2_backward(grad, mat1, mat2_sizes, mat2_strides, alpha=1):
    """d(mat1 @ mat2)/d mat2 in mat2's layout; ``nn.Linear`` passes ``W.t()`` as mat2."""
    if column_major(mat2_sizes, mat2_strides):
        return _scaled(grad.t().mm(mat1).t(), alpha)
    return _scaled(mat1.t().mm(grad), alpha)


register(OpSpec(
    "mm", "MmBackward0", ("self", "mat2"), lambda be, self, mat2: be.matmul(self, mat2),
    {"self": lambda grad, mat2, self_sym_sizes, self_sym_strides:
        mm_mat1_backward(grad, mat2, self_sym_sizes, self_sym_strides),
     "mat2": lambda grad, self, mat2_sym_sizes, mat2_sym_strides:
        mm_mat2_backward(grad, self, mat2_sym_sizes, mat2_sym_strides)},
    STRUCTURAL, dtype_rule="same_required",
    formula_tex=_tex.template("{y} = {0}\\,{1}",
                              "\\bar{{{0}}} = \\bar{{{y}}}\\,{1}^{{\\top}},\\quad "
                              "\\bar{{{1}}} = {0}^{{\\top}}\\bar{{{y}}}")))
register(OpSpec(
    "mv", "MvBackward0", ("self", "vec"), lambda be, self, vec: be.matmul(self, vec),
    {"self": lambda grad, vec: grad.unsqueeze(1).mm(vec.unsqueeze(0)),
     "vec": lambda grad, self: self.t().mm(grad.unsqueeze(1)).squeeze(1)},
    STRUCTURAL, dtype_rule="same_required",
    formula_tex=_tex.template("{y} = {0}\\,{1}",
                              "\\bar{{{0}}} = \\bar{{{y}}}\\,{1}^{{\\top}},\\quad "
                              "\\bar{{{1}}} = {0}^{{\\top}}\\bar{{{y}}}")))
register(OpSpec(
    "dot", "DotBackward0", ("self", "tensor"), lambda be, self, tensor: be.matmul(self, tensor),
    {"self": lambda grad, tensor: grad * tensor, "tensor": lambda grad, self: grad * self},
    STRUCTURAL, dtype_rule="same_required",
    formula_tex=_tex.template("{y} = {0}\\cdot {1}",
                              "\\bar{{{0}}} = \\bar{{{y}}}\\,{1},\\quad "
                              "\\bar{{{1}}} = \\bar{{{y}}}\\,{0}")))


def _bmm_tex(names, out, params, shapes):
    """``y[b,i,j] = Σ_{k<K} A[b,i,k]·B[b,k,j]`` (attention's scores and weighted values)."""
    a, m = names["self"], names["mat2"]
    inner = shapes.get("self")
    k = rf"k<{inner[-1]}" if inner else "k"
    forward = (rf"{out}[b,i,j] = \sum_{{{k}}} {a}[b,i,k]\,{m}[b,k,j]")
    vjp = (rf"\bar{{{a}}}[b] = \bar{{{out}}}[b]\,{m}[b]^{{\top}},\quad "
           rf"\bar{{{m}}}[b] = {a}[b]^{{\top}}\bar{{{out}}}[b]")
    return forward, vjp


register(OpSpec(
    "bmm", "BmmBackward0", ("self", "mat2"), lambda be, self, mat2: be.matmul(self, mat2),
    {"self": lambda grad, mat2: grad.bmm(mat2.transpose(1, 2)),
     "mat2": lambda grad, self: self.transpose(1, 2).bmm(grad)},
    STRUCTURAL, dtype_rule="same_required", formula_tex=_bmm_tex))


def _baddbmm_forward(be, self, batch1, batch2, beta=1, alpha=1):
    out = be.matmul(batch1, batch2)
    if alpha != 1:
        out = be.mul(out, alpha)
    if beta == 0:  # self is ignored (a NaN in it does not propagate), as in torch
        return out
    return be.add(out, self if beta == 1 else be.mul(self, beta))


register(OpSpec(
    "baddbmm", "BaddbmmBackward0", ("self", "batch1", "batch2"), _baddbmm_forward,
    {"self": lambda grad, beta: _scaled(grad, beta),
     "batch1": lambda grad, batch2, alpha: _scaled(grad.bmm(batch2.transpose(1, 2)), alpha),
     "batch2": lambda grad, batch1, alpha: _scaled(batch1.transpose(1, 2).bmm(grad), alpha)},
    STRUCTURAL, dtype_rule="same",
    doc="beta * self + alpha * (batch1 @ batch2); MultiheadAttention's masked scores. The "
        "engine sums self's gradient back to its (broadcast) shape."))
