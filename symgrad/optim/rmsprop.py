"""RMSprop (centered, momentum, weight decay): torch's single-tensor update, op for op."""

from __future__ import annotations

from collections.abc import Iterable

from ..tensor import Tensor
from ._common import param_backend, scalar_state
from .optimizer import Optimizer, bump_step, check_flags

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    """``v = alpha v + (1 - alpha) g^2``; ``p -= lr g / (sqrt(v [- gbar^2]) + eps)``.

    As ``torch.optim.RMSprop``: ``centered`` subtracts the squared running mean of the
    gradient (``gbar``, moved by ``lerp``), ``momentum`` accumulates ``g / avg`` in a buffer
    that starts at zero, ``eps`` is added after the square root.
    """

    def __init__(self, params: Iterable, lr: float = 1e-2, alpha: float = 0.99,
                 eps: float = 1e-8, weight_decay: float = 0, momentum: float = 0,
                 centered: bool = False, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        check_flags(differentiable)
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        super().__init__(params, {"lr": lr, "momentum": momentum, "alpha": alpha, "eps": eps,
                                  "centered": centered, "weight_decay": weight_decay,
                                  "capturable": capturable, "foreach": foreach,
                                  "maximize": maximize, "differentiable": differentiable})

    def _init_state(self, p: Tensor, group: dict) -> dict:
        from ..creation import zeros_like

        state = self.state[p]
        state["step"] = scalar_state(0.0)
        state["square_avg"] = zeros_like(p)
        if group["momentum"] > 0:
            state["momentum_buffer"] = zeros_like(p)
        if group["centered"]:
            state["grad_avg"] = zeros_like(p)
        return state

    def step(self, closure=None):
        loss = self._loss_of(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            alpha, eps = group["alpha"], group["eps"]
            wd, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p._grad is None:
                    continue
                be = param_backend(p)
                state = self.state.get(p) or self._init_state(p, group)
                g = p._grad._data
                if group["maximize"]:
                    g = be.neg(g)
                bump_step(state["step"])
                if wd != 0:
                    g = be.add(g, be.mul(p._data, wd))
                sq = state["square_avg"]._data
                be.mul_(sq, alpha)
                be.add_(sq, be.mul(be.mul(g, 1 - alpha), g))  # addcmul_(g, g, value=1 - alpha)
                if group["centered"]:
                    gavg = state["grad_avg"]._data
                    be.add_(gavg, be.mul(be.sub(g, gavg), 1 - alpha))  # lerp_, weight < 0.5
                    avg = be.sqrt(be.sub(sq, be.mul(gavg, gavg)))  # addcmul(value=-1).sqrt_()
                else:
                    avg = be.sqrt(sq)
                avg = be.add(avg, eps)
                if momentum > 0:
                    buf = state["momentum_buffer"]._data
                    be.mul_(buf, momentum)
                    be.add_(buf, be.div(g, avg))  # addcdiv_(g, avg)
                    be.add_scaled_(p._data, buf, -lr)
                else:
                    be.add_(p._data, be.div(be.mul(g, -lr), avg))  # addcdiv_(value=-lr)
                p._storage.version += 1
                for k, t in state.items():
                    if k != "step":
                        t._storage.version += 1
        return loss
