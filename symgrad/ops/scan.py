"""Cumulative sum and product along one dim (backend kernels ``cumsum`` / ``cumprod``), and
``prod``, which is the last element of a cumulative product.

cumsum's gradient is the reversed cumulative sum of the incoming gradient. cumprod's is
``reverse_cumsum(grad * result) / self`` where no input element is zero (torch's fast
path); with zeros, where that division is undefined, the gradient is taken from its
definition ``d result_j / d x_k = prod_{i <= j, i != k} x_i`` in differentiable ops
(quadratic in the size of ``dim``, as torch's exact rule for that case is).
"""

from __future__ import annotations

import numpy as np

from .. import _tensor_layer as _tl
from ._ints import norm, u64
from .registry import OPS, register
from .spec import STRUCTURAL, OpSpec


def _apply(name, inputs, params):
    return _tl.apply(OPS[name], inputs, params)


def cumsum(x, dim):
    return _apply("cumsum", (x,), {"dim": dim, "dtype": x.dtype})


def cumprod(x, dim):
    return _apply("cumprod", (x,), {"dim": dim, "dtype": x.dtype})


def flip(x, dims):
    return _apply("flip", (x,), {"dims": tuple(dims)})


def reverse_cumsum(grad, dim):
    """``sum_{j >= k} grad_j`` at every k along ``dim``."""
    d = u64(norm(dim, grad.ndim))
    return flip(cumsum(flip(grad, (d,)), d), (d,))


def _scan_fwd(kernel):
    def forward(be, self, dim, dtype):
        x = self if self.dtype == dtype.np else be.cast(self, dtype.np)
        if x.ndim == 0:
            return be.copy(x)
        return getattr(be, kernel)(x, norm(dim, x.ndim))

    return forward


def cumprod_backward(grad, dim, result, self):
    if self.ndim == 0 or self.numel() == 0:
        return grad
    d = norm(dim, self.ndim)
    if not bool((self == 0).sum().item()):
        return reverse_cumsum(grad * result, d) / self
    return _cumprod_backward_with_zeros(grad, d, self)


def _cumprod_backward_with_zeros(grad, d, self):
    last = self.ndim - 1
    x = self.transpose(d, last)  # the scanned dim last: (..., n)
    g = grad.transpose(d, last)
    n = x.shape[-1]
    pos = _tl.arange(n, device=x.device)
    k, i = pos.reshape(n, 1), pos.reshape(1, n)  # rows: the input element k
    rows = x.unsqueeze(-2).expand(*x.shape[:-1], n, n)
    ones = _tl.ones_like(rows)
    # after[k, j] = prod_{k < i <= j} x_i ; before[k] = prod_{i < k} x_i
    after = cumprod(rows.where(i > k, ones), -1)
    before = cumprod(rows.where(i < k, ones), -1).select(-1, n - 1)
    tail = (after * g.unsqueeze(-2) * (i >= k)).sum(-1)
    return (before * tail).transpose(d, last)


def _prod_input(be, self, dtype):
    """``self`` in the result's dtype: ``dtype=``, else its own float, else int64 (torch)."""
    want = dtype.np if dtype is not None else (
        self.dtype if np.dtype(self.dtype).kind == "f" else np.dtype(np.int64))
    return self if self.dtype == want else be.cast(self, want)


def _prod_fwd(be, self, dtype=None):
    x = _prod_input(be, self, dtype)
    n = int(np.prod(x.shape))
    if n == 0:
        return be.full((), 1, x.dtype)
    return be.getitem(be.cumprod(be.reshape(x, (n,)), 0), (n - 1,))


def _prod_dim_fwd(be, self, dim, keepdim, dtype=None):
    x = _prod_input(be, self, dtype)
    if x.ndim == 0:
        return be.copy(x)
    d = norm(dim, x.ndim)
    if x.shape[d] == 0:
        shape = tuple(1 if i == d else s for i, s in enumerate(x.shape) if keepdim or i != d)
        return be.full(shape, 1, x.dtype)
    last = slice(-1, None) if keepdim else -1
    return be.copy(be.getitem(be.cumprod(x, d), (slice(None),) * d + (last,)))


def _cat_ones(ones, part, d):
    return _tl.apply(OPS["cat"], (ones, part), {"dim": u64(d),
                                                "_sizes": (1, part.shape[d])})


def _prod_safe_zeros_backward(grad, inp, d):
    """torch's rule where an input is zero: grad times the product of every other element,
    as the exclusive cumulative products from the left and from the right."""
    n = inp.shape[d]
    if inp.numel() == 0:
        return grad.expand(tuple(inp.shape))
    size = tuple(1 if i == d else s for i, s in enumerate(inp.shape))
    ones = _tl.ones(size, dtype=inp.dtype, device=inp.device)
    left = cumprod(_cat_ones(ones, inp.narrow(d, 0, n - 1), d), d)
    right = flip(cumprod(_cat_ones(ones, flip(inp.narrow(d, 1, n - 1), (d,)), d), d), (d,))
    return grad * (left * right)


def prod_backward(grad, result, self):
    """ProdBackward0: ``grad * (result / self)`` without zeros, else the safe rule."""
    if self.ndim == 0:
        return grad
    if not bool((self == 0).sum().item()):
        return grad * (result / self)
    flat = self.reshape(self.numel())
    return _prod_safe_zeros_backward(grad, flat, 0).reshape(tuple(self.shape))


def prod_dim_backward(grad, dim, keepdim, result, self):
    """ProdBackward1, as ProdBackward0 along ``dim``."""
    if self.ndim == 0:
        return grad
    d = norm(dim, self.ndim)
    if not keepdim:
        grad, result = grad.unsqueeze(d), result.unsqueeze(d)
    if not bool((self == 0).sum().item()):
        return grad * (result / self)
    return _prod_safe_zeros_backward(grad, self, d)


register(OpSpec(
    "prod", "ProdBackward0", ("self",), _prod_fwd,
    {"self": lambda grad, result, self: prod_backward(grad, result, self)},
    STRUCTURAL, dtype_rule="sum", doc="torch.prod over every element; ``dtype``: the result's."))
register(OpSpec(
    "prod_dim", "ProdBackward1", ("self",), _prod_dim_fwd,
    {"self": lambda grad, dim, keepdim, result, self:
        prod_dim_backward(grad, dim, keepdim, result, self)},
    STRUCTURAL, dtype_rule="sum", doc="torch.prod along one dim."))
register(OpSpec(
    "cumsum", "CumsumBackward0", ("self",), _scan_fwd("cumsum"),
    {"self": lambda grad, dim: grad if grad.ndim == 0 else reverse_cumsum(grad, dim)},
    STRUCTURAL, dtype_rule="param", doc="``dtype``: the result's (ints sum in int64)."))
register(OpSpec(
    "cumprod", "CumprodBackward0", ("self",), _scan_fwd("cumprod"),
    {"self": lambda grad, dim, result, self: cumprod_backward(grad, dim, result, self)},
    STRUCTURAL, dtype_rule="param"))


def _flip_fwd(be, self, dims):
    out = self
    for d in dims:
        d = norm(d, self.ndim)
        n = self.shape[d]
        if n > 1:
            rev = be.arange(n - 1, -1, -1, np.int64)
            out = be.getitem(out, (slice(None),) * d + (rev, Ellipsis))
    return be.copy(out) if out is self else out


register(OpSpec(
    "flip", "FlipBackward0", ("self",), _flip_fwd,
    {"self": lambda grad, dims: flip(grad, dims)}, STRUCTURAL, dtype_rule="same"))
