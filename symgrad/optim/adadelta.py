"""Adadelta: torch's single-tensor update, op for op."""

from __future__ import annotations

from collections.abc import Iterable

from ..tensor import Tensor
from ._common import check_lr, lr_value, param_backend, scalar_state
from .optimizer import Optimizer, bump_step, check_flags

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    """``v = rho v + (1 - rho) g^2``; ``dx = sqrt(u + eps) / sqrt(v + eps) g``;
    ``u = rho u + (1 - rho) dx^2``; ``p -= lr dx``, as ``torch.optim.Adadelta``.

    State per parameter (created at its first gradient): ``step``, ``square_avg`` (v) and
    ``acc_delta`` (u); ``lr`` only scales the step, whose size Adadelta adapts itself.
    """

    def __init__(self, params: Iterable, lr: float | Tensor = 1.0, rho: float = 0.9,
                 eps: float = 1e-6, weight_decay: float = 0, foreach: bool | None = None, *,
                 capturable: bool = False, maximize: bool = False,
                 differentiable: bool = False) -> None:
        check_flags(differentiable)
        check_lr(lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, {"lr": lr, "rho": rho, "eps": eps,
                                  "weight_decay": weight_decay, "maximize": maximize,
                                  "capturable": capturable, "foreach": foreach,
                                  "differentiable": differentiable})

    def _init_state(self, p: Tensor) -> dict:
        from ..creation import zeros_like

        state = self.state[p]
        state["step"] = scalar_state(0.0)
        state["square_avg"] = zeros_like(p)
        state["acc_delta"] = zeros_like(p)
        return state

    def step(self, closure=None):
        loss = self._loss_of(closure)
        for group in self.param_groups:
            lr = lr_value(group["lr"])
            rho, eps, wd = group["rho"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p._grad is None:
                    continue
                be = param_backend(p)
                state = self.state.get(p) or self._init_state(p)
                bump_step(state["step"])
                g = p._grad._data
                if group["maximize"]:
                    g = be.neg(g)
                if wd != 0:
                    g = be.add(g, be.mul(p._data, wd))
                sq, acc = state["square_avg"]._data, state["acc_delta"]._data
                be.mul_(sq, rho)
                be.add_(sq, be.mul(be.mul(g, 1 - rho), g))  # addcmul_(g, g, value=1 - rho)
                std = be.sqrt(be.add(sq, eps))
                delta = be.mul(be.div(be.sqrt(be.add(acc, eps)), std), g)
                be.mul_(acc, rho)
                be.add_(acc, be.mul(be.mul(delta, 1 - rho), delta))
                be.add_scaled_(p._data, delta, -lr)
                p._storage.version += 1
                state["square_avg"]._storage.version += 1
                state["acc_delta"]._storage.version += 1
        return loss
