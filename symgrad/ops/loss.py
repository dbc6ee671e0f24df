"""Ops behind the losses that torch computes with a node of their own, and the few aten
overloads that torch's C++ loss composites record (so their graphs carry torch's names).

- ``smooth_l1_loss`` (SmoothL1LossBackward0), ``huber_loss`` (HuberLossBackward0) and
  ``binary_cross_entropy`` (BinaryCrossEntropyBackward0): one node each, saving what torch
  saves (``self``, ``target``, ``reduction``, ``beta``/``delta``/``weight``). Their
  backward formulas are torch's: the clamped slope ``clamp((x - t) / beta, -1, 1)``,
  ``clamp(x - t, -delta, delta)``, and ``(x - t) / max(x (1 - x), 1e-12)`` with the target's
  ``-logit(x)``.
- ``xlogy`` (XlogyBackward0): ``x * log(y)``, 0 where ``x == 0``; kl_div is composed from it.
- ``mul_scalar`` (MulBackward1), ``div_scalar`` (DivBackward1) and ``masked_fill``
  (MaskedFillBackward0): aten's ``mul.Scalar``, ``div.Scalar`` and ``masked_fill.Scalar``,
  which torch's cross_entropy composites (label smoothing, class probabilities) record;
  ``masked_fill_tensor`` (MaskedFillBackward1) is ``masked_fill.Tensor``, a 0-dim value.
  From Python, ``t * 2`` is MulBackward0 in torch and here; these are for the composites.

Reductions are torch's enum: 0 none, 1 mean, 2 sum. The forwards use only backend kernels,
so on the SymPy backend they are the exact meaning (``STRUCTURAL``), branches decided at the
recorded values.
"""

from __future__ import annotations

from .. import _tensor_layer as _tl
from .nn import MEAN, _arr, _reduce
from .registry import register
from .spec import STRUCTURAL, OpSpec

#: torch's EPSILON in binary_cross_entropy_backward, x (1 - x) is clamped to at least this:
#: the float 1e-12f (9.99999996e-13), as torch's kernel has it
BCE_EPSILON = 9.999999960041972e-13


def _norm(grad, reduction, numel):
    """The incoming gradient scaled as torch's loss backwards do (``1/numel`` for mean)."""
    return grad / numel if reduction == MEAN else grad


# -- smooth_l1_loss: 0.5 z^2 / beta below beta, z - beta / 2 above (z = |x - t|) -------------
def _smooth_l1_forward(be, self, target, reduction=MEAN, beta=1.0):
    z = be.abs(be.sub(self, target))
    quad = be.div(be.mul(be.mul(z, 0.5), z), beta)
    loss = be.where(be.lt(z, beta), quad, be.sub(z, 0.5 * beta))
    return _reduce(be, loss, reduction)


def _smooth_l1_grad(grad, self, target, reduction, beta):
    return ((self - target) / beta).clamp(-1.0, 1.0) * _norm(grad, reduction, self.numel())


register(OpSpec(
    "smooth_l1_loss", "SmoothL1LossBackward0", ("self", "target"), _smooth_l1_forward,
    {"self": _smooth_l1_grad,
     "target": lambda grad, self, target, reduction, beta:
        -_smooth_l1_grad(grad, self, target, reduction, beta)},
    STRUCTURAL, dtype_rule="promote",
    doc="beta > 0 (beta == 0 is l1_loss, composed, as torch's functional does)."))


# -- huber_loss: 0.5 z^2 below delta, delta (z - delta / 2) above ---------------------------
def _huber_forward(be, self, target, reduction=MEAN, delta=1.0):
    z = be.abs(be.sub(self, target))
    quad = be.mul(be.mul(z, 0.5), z)
    lin = be.mul(be.sub(z, 0.5 * delta), delta)
    return _reduce(be, be.where(be.lt(z, delta), quad, lin), reduction)


def _huber_grad(grad, self, target, reduction, delta):
    return (self - target).clamp(-delta, delta) * _norm(grad, reduction, self.numel())


register(OpSpec(
    "huber_loss", "HuberLossBackward0", ("self", "target"), _huber_forward,
    {"self": _huber_grad,
     "target": lambda grad, self, target, reduction, delta:
        -_huber_grad(grad, self, target, reduction, delta)},
    STRUCTURAL, dtype_rule="promote"))


# -- binary_cross_entropy: -w (t log x + (1 - t) log(1 - x)), logs clamped at -100 -----------
def _bce_forward(be, self, target, weight=None, reduction=MEAN):
    log_x = be.maximum(be.log(self), -100)
    log_1mx = be.maximum(be.log(be.sub(1, self)), -100)
    loss = be.sub(be.mul(be.sub(target, 1), log_1mx), be.mul(target, log_x))
    if weight is not None:
        loss = be.mul(loss, _arr(weight))
    return _reduce(be, loss, reduction)


def _weighted(g, grad, weight, reduction, numel):
    g = g * grad
    if weight is not None:
        g = g * weight
    return g / numel if reduction == MEAN else g


def _bce_self_grad(grad, self, target, weight, reduction):
    g = (self - target) / ((1 - self) * self).clamp_min(BCE_EPSILON)
    return _weighted(g, grad, weight, reduction, self.numel())


def _bce_target_grad(grad, self, target, weight, reduction):
    # torch's -logit(x), written log(1 - x) - log(x): the forward's d/dt term for term
    return _weighted((1 - self).log() - self.log(), grad, weight, reduction, target.numel())


def _zeros_like(t):
    return _tl.zeros_like(t)  # creation's, plugged in (ops never import the tensor layer)


register(OpSpec(
    "binary_cross_entropy", "BinaryCrossEntropyBackward0", ("self", "target"), _bce_forward,
    {"self": _bce_self_grad, "target": _bce_target_grad},
    STRUCTURAL, dtype_rule="promote",
    doc="weight is a param (saved, no edge), as in torch; inputs must lie in [0, 1]."))


# -- xlogy: x log y, 0 where x == 0 (NaN where y is NaN) -------------------------------------
def _xlogy_forward(be, self, other):
    zero = be.eq(self, 0)
    out = be.mul(self, be.log(be.where(zero, 1, other)))  # log(1) = 0 where x == 0: no 0 * -inf
    return be.where(be.ne(other, other), other, out)


register(OpSpec(
    "xlogy", "XlogyBackward0", ("self", "other"), _xlogy_forward,
    {"self": lambda grad, self, other: grad * other.log().where(self != 0, _zeros_like(other)),
     "other": lambda grad, self, other: grad * self / other},
    STRUCTURAL, dtype_rule="promote_float"))


# -- aten's Scalar overloads recorded by the C++ loss composites ---------------------------
register(OpSpec(
    "mul_scalar", "MulBackward1", ("self",), lambda be, self, other: be.mul(self, other),
    {"self": lambda grad, other: grad * other},
    lambda sp, x, other: x * other, dtype_rule="same",
    doc="aten::mul.Scalar on a float tensor (torch's C++ composites, e.g. label smoothing)."))
register(OpSpec(
    "div_scalar", "DivBackward1", ("self",), lambda be, self, other: be.div(self, other),
    {"self": lambda grad, other: grad / other},
    lambda sp, x, other: x / other, dtype_rule="same",
    doc="aten::div.Scalar on a float tensor (cross_entropy's class-probability mean)."))
register(OpSpec(
    "masked_fill", "MaskedFillBackward0", ("self",),
    lambda be, self, mask, value: be.where(_arr(mask), value, self),
    {"self": lambda grad, mask: grad.where(mask.logical_not(), _zeros_like(grad))},
    STRUCTURAL, dtype_rule="same",
    doc="masked_fill(mask, number): mask is a bool param (saved, no edge), as in torch."))
register(OpSpec(
    "masked_fill_tensor", "MaskedFillBackward1", ("self", "value"),
    lambda be, self, value, mask: be.where(_arr(mask), be.cast(value, self.dtype), self),
    {"self": lambda grad, mask: grad.where(mask.logical_not(), _zeros_like(grad)),
     "value": lambda grad, mask: grad.where(mask, _zeros_like(grad)).sum()},
    STRUCTURAL, dtype_rule="same",
    doc="masked_fill(mask, value) with a 0-dim tensor value (aten::masked_fill.Tensor): the "
        "value's gradient is the sum of the incoming gradient over the masked positions."))
