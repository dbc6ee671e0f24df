"""var / std with torch's ``correction`` (VarBackward0, StdBackward0) and
``linalg.vector_norm`` (LinalgVectorNormBackward0).

Forwards are composed of backend kernels (mean, sub, mul, sum, div, sqrt, abs, pow,
amax), so on the SymPy backend they replay their exact meaning. Backwards are torch's
rules (``var_backward``, ``std_backward``, ``linalg_vector_norm_backward``) in tensor ops.
"""

from __future__ import annotations

import math

from .. import _tensor_layer as _tl
from ._ints import norms
from .reduce import sum_backward
from .registry import OPS, register
from .spec import STRUCTURAL, OpSpec


def _axes(dim, ndim):
    if dim is None or ndim == 0:
        return None
    return norms(dim, ndim)


def _count(sizes, dim) -> int:
    if dim is None or not sizes:
        return math.prod(sizes)
    return math.prod(sizes[d] for d in norms(dim, len(sizes)))


def _var_fwd(be, self, dim, correction, keepdim):
    axes = _axes(dim, self.ndim)
    mean = be.mean(self, axes, True)
    dev = be.sub(self, mean)
    sq = be.sum(be.mul(dev, dev), axes, keepdim)
    return be.div(sq, max(_count(self.shape, dim) - correction, 0))


def _std_fwd(be, self, dim, correction, keepdim):
    return be.sqrt(_var_fwd(be, self, dim, correction, keepdim))


def _keep(grad, dim, keepdim, sizes):
    """The gradient broadcast back to the input's shape."""
    return sum_backward(grad, sizes, dim if dim is not None else tuple(range(len(sizes))),
                        keepdim or dim is None)


def zero_where(t, mask):
    """``t.masked_fill(mask, 0)`` (MaskedFillBackward0 under create_graph, as in torch)."""
    return _tl.apply(OPS["masked_fill"], (t,), {"mask": mask, "value": 0.0})


def var_backward(grad, dim, correction, keepdim, self):
    sizes = tuple(self.shape)
    n = max(_count(sizes, dim) - correction, 0)
    if dim is not None and sizes and not keepdim:
        grad = _keep(grad, dim, False, sizes)
    mean = self.mean(tuple(norms(dim, len(sizes))), keepdim=True) if dim is not None and sizes \
        else self.mean()
    centered = self - mean
    return (2.0 / n) * grad * centered


def std_backward(grad, dim, correction, keepdim, result, self):
    g = grad / (result * 2)
    g = zero_where(g, result == 0)
    return var_backward(g, dim, correction, keepdim, self)


register(OpSpec(
    "var", "VarBackward0", ("self",), _var_fwd,
    {"self": lambda grad, correction, dim, keepdim, self:
        var_backward(grad, dim, correction, keepdim, self)},
    STRUCTURAL, dtype_rule="same", doc="var(dim, correction, keepdim); dim None: all."))
register(OpSpec(
    "std", "StdBackward0", ("self",), _std_fwd,
    {"self": lambda grad, correction, dim, keepdim, result, self:
        std_backward(grad, dim, correction, keepdim, result, self)},
    STRUCTURAL, dtype_rule="same"))


# -- linalg.vector_norm ------------------------------------------------------------------------
def _norm_fwd(be, self, ord, dim, keepdim):  # noqa: A002
    axes = _axes(dim, self.ndim)
    a = be.abs(self)
    if ord == math.inf:
        return be.amax(a, axes, keepdim)
    if ord == -math.inf:
        return be.amin(a, axes, keepdim)
    if ord == 0:
        return be.sum(be.cast(be.ne(self, 0), self.dtype), axes, keepdim)
    if ord == 1:
        return be.sum(a, axes, keepdim)
    if ord == 2:
        return be.sqrt(be.sum(be.mul(self, self), axes, keepdim))
    return be.pow(be.sum(be.pow(a, ord), axes, keepdim), 1.0 / ord)


def vector_norm_backward(grad, dim, keepdim, ord, result, self):  # noqa: A002
    sizes = tuple(self.shape)
    if dim is not None and sizes and not keepdim:
        grad = _keep(grad, dim, False, sizes)
        result = _keep(result, dim, False, sizes)
    if ord == 0:
        return self * 0
    if ord == 1:
        return self.sign() * grad
    if ord == 2:
        return self * zero_where(grad / result, result == 0)
    if math.isinf(ord):
        mask = self.abs() == result
        axes = tuple(norms(dim, len(sizes))) if dim is not None and sizes else \
            tuple(range(len(sizes)))
        count = mask.sum(axes, keepdim=True) if axes else mask * 1
        return self.sign() * (grad / count) * mask
    if ord < 2:
        scaled = self.sign() * self.abs() ** (ord - 1)
    else:
        scaled = self * self.abs() ** (ord - 2)
    scale = zero_where(grad / result ** (ord - 1), result == 0)
    return scaled * scale


register(OpSpec(
    "linalg_vector_norm", "LinalgVectorNormBackward0", ("self",), _norm_fwd,
    {"self": lambda grad, dim, keepdim, ord, result, self:
        vector_norm_backward(grad, dim, keepdim, ord, result, self)},
    STRUCTURAL, dtype_rule="same", doc="linalg.vector_norm(ord, dim, keepdim) and norm(p)."))
