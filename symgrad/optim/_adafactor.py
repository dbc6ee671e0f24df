"""Adafactor (factored second moments): torch's single-tensor update, op for op."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..tensor import Tensor
from ._common import lerp_, lr_value, param_backend, scalar_state
from .optimizer import Optimizer, bump_step

__all__ = ["Adafactor"]


class Adafactor(Optimizer):
    """Adafactor as ``torch.optim.Adafactor`` (Shazeer & Stern, with torch's choices).

    A matrix (or batch of matrices) keeps only row and column means of ``g^2``
    (``row_var``, ``col_var``), whose outer product over the row mean estimates the second
    moment; a vector keeps ``variance``. The moments move by ``lerp`` with weight
    ``t^beta2_decay``; the step ``g / sqrt(v)`` is scaled down to RMS ``d`` at most and
    by ``max(eps2, RMS(p)) * min(lr, 1 / sqrt(t))``; ``weight_decay`` is decoupled.
    """

    def __init__(self, params: Iterable, lr: float | Tensor = 1e-2, beta2_decay: float = -0.8,
                 eps: tuple[float | None, float] = (None, 1e-3), d: float = 1.0,
                 weight_decay: float = 0.0, *, foreach: bool | None = None,
                 maximize: bool = False) -> None:
        if isinstance(lr, Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not 0.0 >= beta2_decay:
            raise ValueError(f"beta2_decay should be <= 0 but is: {beta2_decay}")
        if eps[0] is not None and not 0.0 <= eps[0]:
            raise ValueError(f"epsilon1 should be >= 0 but is: {eps[0]}")
        if not 0.0 <= eps[1]:
            raise ValueError(f"epsilon2 should be >= 0 but is: {eps[1]}")
        if not 1.0 <= d:
            raise ValueError(f"Clipping threshold d should be >= 1 but is: {d}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"weight_decay should be >= 0 but is: {weight_decay}")
        super().__init__(params, {"lr": lr, "beta2_decay": beta2_decay, "eps": eps, "d": d,
                                  "weight_decay": weight_decay, "foreach": foreach,
                                  "maximize": maximize})

    def _init_state(self, p: Tensor) -> dict:
        from ..creation import zeros, zeros_like

        grad = p._grad
        state = self.state[p]
        state["step"] = scalar_state(0.0)
        if grad.ndim > 1:
            row_shape, col_shape = list(grad.shape), list(grad.shape)
            row_shape[-1] = 1
            col_shape[-2] = 1
            state["row_var"] = zeros(row_shape, dtype=grad.dtype, device=grad.device)
            state["col_var"] = zeros(col_shape, dtype=grad.dtype, device=grad.device)
        else:
            state["variance"] = zeros_like(grad)
        return state

    def step(self, closure=None):
        loss = self._loss_of(closure)
        for group in self.param_groups:
            lr = lr_value(group["lr"])
            beta2_decay, d, wd = group["beta2_decay"], group["d"], group["weight_decay"]
            eps1, eps2 = group["eps"]
            for p in group["params"]:
                if p._grad is None:
                    continue
                be = param_backend(p)
                state = self.state.get(p) or self._init_state(p)
                g = p._grad._data
                if group["maximize"]:
                    g = be.neg(g)
                if eps1 is None:  # set by the group's first parameter, as torch's loop does
                    eps1 = float(np.finfo(p.dtype.np).eps)
                step = bump_step(state["step"])
                one_minus_beta2_t = step ** beta2_decay
                rho_t = min(lr, 1 / (step ** 0.5))
                alpha = max(eps2, _norm(be, p._data) / (p.numel() ** 0.5)) * rho_t
                if wd != 0:
                    be.mul_(p._data, 1 - lr * wd)
                if p._grad.ndim > 1:
                    row_var, col_var = state["row_var"]._data, state["col_var"]._data
                    n_col, n_row = p._grad.shape[-1], p._grad.shape[-2]
                    # norm(g, dim).square_().div_(n): the mean of g^2 along dim
                    row_mean = be.div(_squared_norm(be, g, -1), n_col)
                    lerp_(be, row_var, row_mean, one_minus_beta2_t)
                    col_mean = be.div(_squared_norm(be, g, -2), n_row)
                    lerp_(be, col_var, col_mean, one_minus_beta2_t)
                    var_estimate = be.matmul(row_var, col_var)
                    var_estimate = be.div(var_estimate, be.maximum(
                        be.mean(row_var, axis=-2, keepdims=True), eps1))
                    state["row_var"]._storage.version += 1
                    state["col_var"]._storage.version += 1
                else:
                    variance = state["variance"]._data
                    lerp_(be, variance, be.mul(g, g), one_minus_beta2_t)
                    var_estimate = be.copy(variance)
                    state["variance"]._storage.version += 1
                # clamp_(min=eps1^2).rsqrt_(), times the gradient
                update = be.mul(be.reciprocal(be.sqrt(be.maximum(var_estimate, eps1 * eps1))),
                                g)
                denom = max(1.0, _norm(be, update) / ((p.numel() ** 0.5) * d))
                be.add_scaled_(p._data, update, -alpha / denom)
                p._storage.version += 1
        return loss


def _squared_norm(be, x, axis: int):
    """``torch.norm(x, dim=axis, keepdim=True).square_()``: the root, then its square."""
    root = be.sqrt(be.sum(be.mul(x, x), axis=axis, keepdims=True))
    return be.mul(root, root)


def _norm(be, x) -> float:
    """``x.norm(2).item()``."""
    return float(be.to_host(be.sqrt(be.sum(be.mul(x, x)))))
