"""SGD with momentum, dampening, Nesterov and weight decay: torch's single-tensor update."""

from __future__ import annotations

from collections.abc import Iterable

from ..tensor import Tensor
from ._common import param_backend
from .optimizer import Optimizer, check_flags

__all__ = ["SGD"]


class SGD(Optimizer):
    """``p -= lr * d`` where ``d`` is the (momentum, Nesterov) direction of ``grad + wd * p``.

    Matches ``torch.optim.SGD``: the momentum buffer starts as a copy of the first
    direction (no dampening on that step), then ``buf = momentum * buf + (1 - dampening) * d``.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0,
                 dampening: float = 0, weight_decay: float = 0, nesterov: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        check_flags(differentiable)
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov,
                                  "maximize": maximize, "foreach": foreach,
                                  "differentiable": differentiable, "fused": fused})

    def step(self, closure=None):
        loss = self._loss_of(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            momentum = group["momentum"]
            dampening = group["dampening"]
            wd = group["weight_decay"]
            nesterov = group["nesterov"]
            for p in group["params"]:
                grad = p._grad
                if grad is None:
                    continue
                be = param_backend(p)
                d = grad._data
                if group["maximize"]:
                    d = be.neg(d)
                if wd != 0:
                    d = be.add(d, be.mul(p._data, wd))
                if momentum != 0:
                    state = self.state.setdefault(p, {})
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = Tensor._wrap(be.copy(d), p._device)
                    else:
                        be.mul_(buf._data, momentum)
                        be.add_(buf._data, d if dampening == 0 else be.mul(d, 1 - dampening))
                        buf._storage.version += 1
                    d = be.add(d, be.mul(buf._data, momentum)) if nesterov else buf._data
                be.add_scaled_(p._data, d, -lr)
                p._storage.version += 1
        return loss
