"""Adagrad: torch's single-tensor update, op for op."""

from __future__ import annotations

from collections.abc import Iterable

from ._common import param_backend, scalar_state
from .optimizer import Optimizer, bump_step, check_flags

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    """``s += g^2``; ``p -= lr / (1 + (t - 1) lr_decay) * g / (sqrt(s) + eps)``.

    As ``torch.optim.Adagrad``, every parameter's state (``step``, ``sum`` filled with
    ``initial_accumulator_value``) exists from construction on.
    """

    def __init__(self, params: Iterable, lr: float = 1e-2, lr_decay: float = 0,
                 weight_decay: float = 0, initial_accumulator_value: float = 0,
                 eps: float = 1e-10, foreach: bool | None = None, *, maximize: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        check_flags(differentiable)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= lr_decay:
            raise ValueError(f"Invalid lr_decay value: {lr_decay}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= initial_accumulator_value:
            raise ValueError("Invalid initial_accumulator_value value: "
                             f"{initial_accumulator_value}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if fused and foreach:
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
        super().__init__(params, {"lr": lr, "lr_decay": lr_decay, "eps": eps,
                                  "weight_decay": weight_decay,
                                  "initial_accumulator_value": initial_accumulator_value,
                                  "foreach": foreach, "maximize": maximize,
                                  "differentiable": differentiable, "fused": fused})
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p, group)

    def _init_state(self, p, group: dict) -> dict:
        from ..creation import full_like

        state = self.state[p]
        state["step"] = scalar_state(0.0, fused=group["fused"])
        # the optimizer's value even where a group names its own, as torch's
        state["sum"] = full_like(p, self.defaults["initial_accumulator_value"])
        return state

    def step(self, closure=None):
        loss = self._loss_of(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            wd, lr_decay, eps = group["weight_decay"], group["lr_decay"], group["eps"]
            for p in group["params"]:
                if p._grad is None:
                    continue
                be = param_backend(p)
                state = self.state.get(p) or self._init_state(p, group)
                step = bump_step(state["step"])
                g = p._grad._data
                if group["maximize"]:
                    g = be.neg(g)
                if wd != 0:
                    g = be.add(g, be.mul(p._data, wd))
                clr = lr / (1 + (step - 1) * lr_decay)
                s = state["sum"]._data
                be.add_(s, be.mul(g, g))  # addcmul_(g, g, value=1)
                std = be.add(be.sqrt(s), eps)
                be.add_(p._data, be.div(be.mul(g, -clr), std))  # addcdiv_(value=-clr)
                p._storage.version += 1
                state["sum"]._storage.version += 1
        return loss
