"""Adamax (Adam with an infinity norm): torch's single-tensor update, op for op."""

from __future__ import annotations

from collections.abc import Iterable

from ..tensor import Tensor
from ._common import check_adam_args, lerp_, lr_value, param_backend, scalar_state
from .optimizer import Optimizer, bump_step, check_flags

__all__ = ["Adamax"]


class Adamax(Optimizer):
    """``m = lerp(m, g, 1 - b1)``; ``u = max(b2 u, |g| + eps)``; ``p -= lr / (1 - b1^t) m / u``,
    as ``torch.optim.Adamax`` (state ``step``, ``exp_avg``, ``exp_inf``)."""

    def __init__(self, params: Iterable, lr: float | Tensor = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, foreach: bool | None = None, *,
                 maximize: bool = False, differentiable: bool = False,
                 capturable: bool = False) -> None:
        check_flags(differentiable)
        check_adam_args(lr, eps, betas, weight_decay)
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay, "foreach": foreach,
                                  "maximize": maximize, "differentiable": differentiable,
                                  "capturable": capturable})

    def _init_state(self, p: Tensor) -> dict:
        from ..creation import zeros_like

        state = self.state[p]
        state["step"] = scalar_state(0.0)
        state["exp_avg"] = zeros_like(p)
        state["exp_inf"] = zeros_like(p)
        return state

    def step(self, closure=None):
        loss = self._loss_of(closure)
        for group in self.param_groups:
            lr = lr_value(group["lr"])
            beta1, beta2 = group["betas"]
            eps, wd = group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p._grad is None:
                    continue
                be = param_backend(p)
                state = self.state.get(p) or self._init_state(p)
                g = p._grad._data
                if group["maximize"]:
                    g = be.neg(g)
                step = bump_step(state["step"])
                if wd != 0:
                    g = be.add(g, be.mul(p._data, wd))
                m, u = state["exp_avg"]._data, state["exp_inf"]._data
                lerp_(be, m, g, 1 - beta1)
                be.mul_(u, beta2)
                be.copy_(u, be.maximum(u, be.add(be.abs(g), eps)))
                clr = lr / (1 - beta1 ** step)
                be.add_(p._data, be.div(be.mul(m, -clr), u))  # addcdiv_(m, u, value=-clr)
                p._storage.version += 1
                state["exp_avg"]._storage.version += 1
                state["exp_inf"]._storage.version += 1
        return loss
