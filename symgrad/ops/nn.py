"""Ops behind ``symgrad.nn``: the biased Linear (addmm) and the fused losses.

Like the other families, each op is one stanza whose backward formulas name what the
node saves. The losses take their non-differentiable tensors (``weight``, ``pos_weight``,
nll's ``target``) as forward *params*, not inputs, because PyTorch gives those no edge in
``next_functions`` (``NllLossBackward0`` has exactly one) while still saving them under
these names. Reductions are torch's enum: 0 none, 1 mean, 2 sum.

The forwards use only backend kernels, so they run unchanged on every backend, and on the
SymPy object-array backend they are the loss's exact meaning (``STRUCTURAL``).
"""

from __future__ import annotations

from .. import _tensor_layer as _tl
from . import _tex
from .linalg import mm_mat1_backward, mm_mat2_backward
from .registry import register
from .spec import STRUCTURAL, OpSpec

NONE, MEAN, SUM = 0, 1, 2


def _arr(x):
    """A backend array from a Tensor param (params reach the forward unconverted)."""
    return getattr(x, "_data", x)


def _reduce(be, x, reduction):
    if reduction == MEAN:
        return be.mean(x)
    if reduction == SUM:
        return be.sum(x)
    return x


# -- addmm: beta*self + alpha*(mat1 @ mat2); nn.Linear with bias on 2-D input --------------
def _addmm_forward(be, self, mat1, mat2, beta=1, alpha=1):
    out = be.matmul(mat1, mat2)
    if alpha != 1:
        out = be.mul(out, alpha)
    if beta == 0:
        return out
    be.add_(out, self if beta == 1 else be.mul(self, beta))  # the product is a fresh array
    return out


def _scaled(grad, factor):
    return grad if factor == 1 else grad * factor


register(OpSpec(
    "addmm", "AddmmBackward0", ("self", "mat1", "mat2"), _addmm_forward,
    {"self": lambda grad, beta: _scaled(grad, beta),
     "mat1": lambda grad, mat2, mat1_sym_sizes, mat1_sym_strides, alpha:
        mm_mat1_backward(grad, mat2, mat1_sym_sizes, mat1_sym_strides, alpha),
     "mat2": lambda grad, mat1, mat2_sym_sizes, mat2_sym_strides, alpha:
        mm_mat2_backward(grad, mat1, mat2_sym_sizes, mat2_sym_strides, alpha)},
    STRUCTURAL, dtype_rule="same_required", fused_backward="addmm_backward",
    doc="The engine sums self's gradient back to the bias shape, as torch's does.",
    formula_tex=_tex.template("{y} = {0} + {1}\\,{2}",
                              "\\bar{{{0}}} = \\bar{{{y}}},\\quad \\bar{{{1}}} = \\bar{{{y}}}\\,"
                              "{2}^{{\\top}},\\quad \\bar{{{2}}} = {1}^{{\\top}}\\bar{{{y}}}")))


# -- mse_loss --------------------------------------------------------------------------------
def _mse_forward(be, self, target, reduction=MEAN):
    d = be.sub(self, target)
    return _reduce(be, be.mul(d, d), reduction)


def _mse_grad(grad, self, target, reduction):
    scale = 2.0 / self.numel() if reduction == MEAN else 2.0
    return (self - target) * (grad * scale)


register(OpSpec(
    "mse_loss", "MseLossBackward0", ("self", "target"), _mse_forward,
    {"self": lambda grad, self, target, reduction: _mse_grad(grad, self, target, reduction),
     "target": lambda grad, self, target, reduction: -_mse_grad(grad, self, target, reduction)},
    STRUCTURAL, dtype_rule="promote", fused_backward="mse_loss_backward",
    formula_tex=_tex.template("{y} = \\frac{{1}}{{n}}\\sum_i ({0}_i - {1}_i)^2",
                              "\\bar{{{0}}} = \\frac{{2}}{{n}}\\bar{{{y}}}({0} - {1})")))


# -- binary_cross_entropy_with_logits ------------------------------------------------------
def _bce_logits_forward(be, self, target, weight=None, pos_weight=None, reduction=MEAN):
    # torch's stable form: (1 - t) x + lw * softplus(-x), softplus(-x) = m + log(e^-m + e^(-x-m))
    # with m = max(-x, 0) and lw = 1 + (pos_weight - 1) t.
    neg_x = be.neg(self)
    if getattr(self.dtype, "kind", "") == "O":  # symbolic backend: the plain formula is exact
        softplus = be.log(be.add(be.exp(neg_x), 1))
    else:
        m = be.maximum(neg_x, 0)
        softplus = be.add(m, be.log(be.add(be.exp(be.neg(m)), be.exp(be.sub(neg_x, m)))))
    if pos_weight is not None:
        lw = be.add(be.mul(be.sub(_arr(pos_weight), 1), target), 1)
        softplus = be.mul(lw, softplus)
    loss = be.sub(softplus, be.mul(be.sub(target, 1), self))
    if weight is not None:
        loss = be.mul(loss, _arr(weight))
    return _reduce(be, loss, reduction)


def _softplus(x):
    """log(1 + e^x), stable, in differentiable tensor ops."""
    return x.relu() + ((-x.abs()).exp() + 1).log()


def _bce_finish(g, grad, weight, reduction, numel):
    g = g * grad
    if weight is not None:
        g = g * weight
    if reduction == MEAN:
        g = g / numel
    return g


def _bce_self_grad(grad, self, target, weight, pos_weight, reduction):
    s = self.sigmoid()
    if pos_weight is None:
        g = s - target
    else:
        g = ((pos_weight - 1) * target + 1) * s - pos_weight * target
    return _bce_finish(g, grad, weight, reduction, self.numel())


def _bce_target_grad(grad, self, target, weight, pos_weight, reduction):
    if pos_weight is None:
        g = -self
    else:  # log_sigmoid(-x) - pos_weight * log_sigmoid(x)
        g = pos_weight * _softplus(-self) - _softplus(self)
    return _bce_finish(g, grad, weight, reduction, target.numel())


register(OpSpec(
    "binary_cross_entropy_with_logits", "BinaryCrossEntropyWithLogitsBackward0",
    ("self", "target"), _bce_logits_forward,
    {"self": _bce_self_grad, "target": _bce_target_grad},
    STRUCTURAL, dtype_rule="promote",
    doc="weight and pos_weight are params: saved, but no edge, as in torch."))


# -- nll_loss (cross_entropy = nll_loss(log_softmax(x, 1))) -------------------------------
def _nll_forward(be, self, target, weight=None, reduction=MEAN, ignore_index=-100):
    """Returns (loss, total_weight), torch's two outputs; input (C,) or (N, C)."""
    t = _arr(target)
    index_dtype = t.dtype  # int64; kernels of the SymPy backend return object arrays
    one = self.ndim == 1
    x = be.reshape(self, (1,) + tuple(self.shape)) if one else self
    n = x.shape[0]
    t = be.reshape(t, (n,))
    keep = be.ne(t, ignore_index)
    safe = be.cast(be.where(keep, t, 0), index_dtype)
    picked = be.getitem(x, (be.arange(0, n, 1, index_dtype), safe))
    if weight is None:
        w = be.cast(be.where(keep, 1, 0), x.dtype)
    else:
        w = be.where(keep, be.getitem(_arr(weight), safe), 0)
        w = be.cast(w, x.dtype)
    losses = be.neg(be.mul(picked, w))
    if reduction == NONE:
        return (be.reshape(losses, ()) if one else losses), be.mul(be.sum(w), 0)
    total = be.sum(losses)
    total_weight = be.sum(w)
    if reduction == MEAN:
        total = be.div(total, total_weight)
    return total, total_weight


def _nll_grad(grad, self, target, weight, reduction, ignore_index, total_weight):
    c = self.shape[-1]
    t = target.reshape(-1, 1) if self.ndim == 2 else target.reshape(1)
    hit = t == _tl.arange(c, device=self.device)
    if 0 <= ignore_index < c:
        hit = hit & (t != ignore_index)
    if weight is None:
        coef = -hit.to(self.dtype)
    else:
        coef = (-weight.to(self.dtype)).where(hit, 0.0)
    if reduction == NONE:
        return coef * (grad.unsqueeze(-1) if self.ndim == 2 else grad)
    if reduction == MEAN:
        if float(hit.to(self.dtype).sum()) == 0:
            # every target ignored: total_weight is 0 and torch's kernel writes zeros, so
            # grad / 0 must not turn the zero coefficients into nan
            return coef * (grad * 0) + 0.0  # + 0.0 turns -0. into torch's 0.
        grad = grad / total_weight
    return coef * grad


register(OpSpec(
    "nll_loss", "NllLossBackward0", ("self",), _nll_forward,
    {"self": _nll_grad}, STRUCTURAL, dtype_rule="same",
    outputs=("result", "total_weight"), differentiable_outputs=1,
    doc="target and weight are params (no edge in torch); total_weight is output 1."))


# -- nll_loss2d: (N, C, H, W) scores, (N, H, W) targets: nll_loss over the N*H*W rows ------
def _nll2d_forward(be, self, target, weight=None, reduction=MEAN, ignore_index=-100):
    n, c, h, w = self.shape
    rows = be.reshape(be.transpose(self, (0, 2, 3, 1)), (n * h * w, c))
    loss, total_weight = _nll_forward(be, rows, target, weight, reduction, ignore_index)
    if reduction == NONE:
        loss = be.reshape(loss, (n, h, w))
    return loss, total_weight


def _nll2d_grad(grad, self, target, weight, reduction, ignore_index, total_weight):
    n, c, h, w = self.shape
    rows = self.permute(0, 2, 3, 1).reshape(n * h * w, c)
    flat = target.reshape(n * h * w)
    g = grad.reshape(n * h * w) if reduction == NONE else grad
    out = _nll_grad(g, rows, flat, weight, reduction, ignore_index, total_weight)
    return out.reshape(n, h, w, c).permute(0, 3, 1, 2)


register(OpSpec(
    "nll_loss2d", "NllLoss2DBackward0", ("self",), _nll2d_forward,
    {"self": _nll2d_grad}, STRUCTURAL, dtype_rule="same",
    outputs=("result", "total_weight"), differentiable_outputs=1,
    doc="torch.nn.functional.nll_loss on (N, C, H, W): the class dim is 1."))
