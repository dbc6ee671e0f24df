"""ASGD (averaged SGD): torch's single-tensor update, op for op."""

from __future__ import annotations

from collections.abc import Iterable

from ..tensor import Tensor
from ._common import check_lr, get_value, lr_value, param_backend, scalar_state, set_value
from .optimizer import Optimizer, bump_step, check_flags

__all__ = ["ASGD"]


class ASGD(Optimizer):
    """SGD with a decaying step and a running average of the iterates, as
    ``torch.optim.ASGD``.

    Each step: ``p *= 1 - lambd eta``; ``p -= eta g``; ``ax += mu (p - ax)`` (a copy while
    ``mu == 1``); then ``eta = lr / (1 + lambd lr t)^alpha`` and ``mu = 1 / max(1, t - t0)``.
    ``step``, ``eta`` and ``mu`` are 0-dim tensors on the parameter's device, as torch keeps
    them: float32 (float64 under a float64 default dtype), and the new ``eta`` and ``mu``
    pass through a tensor of the default dtype, so they are read back rounded to it even
    after a checkpoint's load made them float64. ``ax`` holds the average.
    """

    def __init__(self, params: Iterable, lr: float | Tensor = 1e-2, lambd: float = 1e-4,
                 alpha: float = 0.75, t0: float = 1e6, weight_decay: float = 0,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False, capturable: bool = False) -> None:
        check_flags(differentiable)
        check_lr(lr)
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, {"lr": lr, "lambd": lambd, "alpha": alpha, "t0": t0,
                                  "weight_decay": weight_decay, "foreach": foreach,
                                  "maximize": maximize, "differentiable": differentiable,
                                  "capturable": capturable})

    def _init_state(self, p: Tensor, group: dict) -> dict:
        from ..creation import zeros_like

        state = self.state[p]
        state["step"] = scalar_state(0.0, p.device)
        state["eta"] = scalar_state(float(group["lr"]), p.device)
        state["mu"] = scalar_state(1.0, p.device)
        state["ax"] = zeros_like(p)
        return state

    def step(self, closure=None):
        loss = self._loss_of(closure)
        for group in self.param_groups:
            lr = lr_value(group["lr"])
            lambd, alpha, t0 = group["lambd"], group["alpha"], group["t0"]
            wd = group["weight_decay"]
            for p in group["params"]:
                if p._grad is None:
                    continue
                be = param_backend(p)
                state = self.state.get(p) or self._init_state(p, group)
                g = p._grad._data
                if group["maximize"]:
                    g = be.neg(g)
                step = bump_step(state["step"])
                if wd != 0:
                    g = be.add(g, be.mul(p._data, wd))
                eta = get_value(state["eta"])
                be.mul_(p._data, 1 - lambd * eta)  # decay
                be.add_scaled_(p._data, g, -eta)
                ax = state["ax"]._data
                mu = get_value(state["mu"])
                if mu != 1:
                    be.add_(ax, be.mul(be.sub(p._data, ax), mu))
                else:
                    be.copy_(ax, p._data)
                set_value(state["eta"], lr / ((1 + lambd * lr * step) ** alpha))
                set_value(state["mu"], 1 / max(1, step - t0))
                p._storage.version += 1
                state["ax"]._storage.version += 1
        return loss
