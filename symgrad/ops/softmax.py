"""softmax, log_softmax and logsumexp, numerically stable.

The forwards subtract the maximum before exponentiating, as PyTorch does, except on a
symbolic backend (object arrays of SymPy expressions), where the plain formula is exact:
so the forward replayed by the verifier *is* the op's meaning (STRUCTURAL).
"""

from __future__ import annotations

import numpy as np

from . import _tex
from ._ints import norm, norms
from .registry import register
from .spec import STRUCTURAL, OpSpec


def _symbolic(x) -> bool:
    return getattr(getattr(x, "dtype", None), "kind", "") == "O"


def _axis(x, dim):
    return None if x.ndim == 0 else norm(dim, x.ndim)


def _shifted(be, x, axis):
    """``x - max(x)`` along ``axis`` (kept), or ``x`` where that is exact or impossible."""
    if _symbolic(x) or x.size == 0:
        return x
    return be.sub(x, be.amax(x, axis, True))  # an infinite max gives NaN, as in torch


def _fast_softmax(be, x, dim, safe: bool):
    """A numeric backend's softmax kernel along the last dim, or None (it declines)."""
    fast = getattr(be, "softmax_last", None)
    return None if fast is None else fast(x, dim, safe)


def _softmax(be, self, dim):
    out = _fast_softmax(be, self, dim, False)
    if out is not None:
        return out
    ax = _axis(self, dim)
    e = be.exp(_shifted(be, self, ax))
    return be.div(e, be.sum(e, ax, True))


def _log_softmax(be, self, dim):
    ax = _axis(self, dim)
    z = _shifted(be, self, ax)
    return be.sub(z, be.log(be.sum(be.exp(z), ax, True)))


def _logsumexp(be, self, dim, keepdim):
    if self.ndim == 0:
        return be.copy(self)
    axes = norms(dim, self.ndim)
    if _symbolic(self) or self.size == 0:
        return be.log(be.sum(be.exp(self), axes, keepdim))
    m = be.amax(self, axes, True)
    # an infinite max is not subtracted (inf - inf would be NaN), as in torch
    m = be.where(be.eq(be.abs(m), float("inf")), be.full(m.shape, 0, m.dtype), m)
    out = be.add(be.log(be.sum(be.exp(be.sub(self, m)), axes, True)), m)
    if not keepdim:
        out = be.reshape(out, tuple(s for i, s in enumerate(out.shape) if i not in axes))
    return out


def _dead_rows(be, x, ax):
    """Rows (along ``ax``) that are all -inf: fully masked attention rows."""
    if _symbolic(x):
        # decided at the recorded values, as the backend decides max and where: a masked
        # score is ``s - oo`` in SymPy, which is not structurally -oo
        value = getattr(be, "valuation", None)
        if value is not None:
            v = np.frompyfunc(lambda e: float(value(e)), 1, 1)(x).astype(float)
            return np.all(v == -np.inf, axis=ax, keepdims=True)
        return (x == float("-inf")).astype(bool).all(axis=ax, keepdims=True)
    return be.eq(be.amax(x, ax, True), float("-inf"))


def _safe_softmax(be, self, dim):
    """torch's ``_safe_softmax`` (scaled_dot_product_attention's math path): softmax, but a
    row that is all -inf gives zeros instead of NaN (it is zeroed first, so no NaN is ever
    computed, and the backward through the zeros is zero)."""
    if self.ndim == 0:  # a row of one: 1, or 0 where it is -inf (torch)
        return be.reshape(_safe_softmax(be, be.reshape(self, (1,)), 0), ())
    out = _fast_softmax(be, self, dim, True)
    if out is not None:
        return out
    ax = _axis(self, dim)
    if self.size == 0:
        return _softmax(be, self, dim)
    dead = _dead_rows(be, self, ax)
    zeros = be.full(self.shape, 0, self.dtype)
    out = _softmax(be, be.where(dead, zeros, self), dim)
    return be.where(dead, zeros, out)


def softmax_backward(grad, result, dim):
    if result.ndim == 0:  # the sum over the dim is the element itself; 0, or NaN as torch
        return (grad - grad * result) * result
    d = norm(dim, result.ndim)
    return (grad - (grad * result).sum(d, keepdim=True)) * result


def log_softmax_backward(grad, result, dim):
    if result.ndim == 0:  # as softmax_backward
        return grad - result.exp() * grad
    d = norm(dim, result.ndim)
    return grad - result.exp() * grad.sum(d, keepdim=True)


def logsumexp_backward(grad, self, result, dim, keepdim):
    if not keepdim and self.ndim:
        for d in sorted(norms(dim, self.ndim)):
            grad = grad.unsqueeze(d)
            result = result.unsqueeze(d)
    return grad * (self - result).exp()


def _along(shapes, params, var: str) -> tuple[list[str], str, int]:
    """Index of one element along the op's dim (``[\\dots,i]``), the dim, and its size."""
    shape = shapes.get("result") or shapes.get("self") or ()
    n = len(shape)
    if not n:
        return [], "", 0
    d = _tex.dim_of(params.get("dim", -1), n)
    idx = ([r"\dots"] if d > 0 else []) + [var] + ([r"\dots"] if d < n - 1 else [])
    return idx, rf"\quad(\text{{along dim {d}}})", int(shape[d])


def _softmax_tex(names, out, params, shapes):
    """``y[…,i] = e^{x[…,i]} / Σ_{j<S} e^{x[…,j]}`` along the node's dim."""
    x = names["self"]
    i_at, note, size = _along(shapes, params, "i")
    if not i_at:
        return f"{out} = 1", None
    j_at = _along(shapes, params, "j")[0]
    forward = (rf"{_tex.index(out, i_at)} = \frac{{e^{{{_tex.index(x, i_at)}}}}}"
               rf"{{\sum_{{j<{size}}} e^{{{_tex.index(x, j_at)}}}}}{note}")
    vjp = (rf"\bar{{{x}}} = {out}\odot(\bar{{{out}}} - \textstyle\sum_j "
           rf"\bar{{{out}}}_j {out}_j)")
    return forward, vjp


def _log_softmax_tex(names, out, params, shapes):
    """``y[…,i] = x[…,i] − log Σ_{j<S} e^{x[…,j]}`` along the node's dim."""
    x = names["self"]
    i_at, note, size = _along(shapes, params, "i")
    if not i_at:
        return f"{out} = 0", None
    j_at = _along(shapes, params, "j")[0]
    forward = (rf"{_tex.index(out, i_at)} = {_tex.index(x, i_at)} - "
               rf"\log\sum_{{j<{size}}} e^{{{_tex.index(x, j_at)}}}{note}")
    vjp = (rf"\bar{{{x}}} = \bar{{{out}}} - e^{{{out}}}\textstyle\sum_j "
           rf"\bar{{{out}}}_j")
    return forward, vjp


register(OpSpec(
    "softmax", "SoftmaxBackward0", ("self",), _softmax,
    {"self": lambda grad, dim, result: softmax_backward(grad, result, dim)},
    STRUCTURAL, dtype_rule="same", fused_backward="softmax_backward",
    formula_tex=_softmax_tex))
register(OpSpec(
    "safe_softmax", "SafeSoftmaxBackward0", ("self",), _safe_softmax,
    {"self": lambda grad, dim, result: softmax_backward(grad, result, dim)},
    STRUCTURAL, dtype_rule="same", fused_backward="softmax_backward",
    formula_tex=_softmax_tex,  # zero rows where every input is -inf (said in the doc)
    doc="aten::_safe_softmax: zeros where a whole row is -inf; softmax's backward (a zero "
        "result row passes no gradient)."))
register(OpSpec(
    "log_softmax", "LogSoftmaxBackward0", ("self",), _log_softmax,
    {"self": lambda grad, dim, result: log_softmax_backward(grad, result, dim)},
    STRUCTURAL, dtype_rule="same", fused_backward="log_softmax_backward",
    formula_tex=_log_softmax_tex))
register(OpSpec(
    "logsumexp", "LogsumexpBackward0", ("self",), _logsumexp,
    {"self": lambda grad, dim, keepdim, result, self:
        logsumexp_backward(grad, self, result, dim, keepdim)},
    STRUCTURAL, dtype_rule="float",
    formula_tex=_tex.template("{y} = \\log\\sum_i e^{{{0}_i}}",
                              "\\bar{{{0}}}_i = \\bar{{{y}}}\\,e^{{{0}_i - {y}}}")))
