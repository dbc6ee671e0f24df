"""RAdam (Adam with a rectified variance): torch's single-tensor update, op for op."""

from __future__ import annotations

from collections.abc import Iterable

from ..tensor import Tensor
from ._common import check_adam_args, lerp_, lr_value, param_backend, scalar_state
from .optimizer import Optimizer, bump_step, check_flags

__all__ = ["RAdam"]


class RAdam(Optimizer):
    """Adam whose adaptive step is switched on only once the variance estimate is tractable,
    as ``torch.optim.RAdam``.

    With ``rho_inf = 2 / (1 - b2) - 1`` and ``rho_t = rho_inf - 2 t b2^t / (1 - b2^t)``: while
    ``rho_t <= 5`` the step is plain momentum ``p -= lr m / (1 - b1^t)``; after, it is scaled
    by ``sqrt(1 - b2^t) / (sqrt(v) + eps)`` and the rectification ``r_t``.
    ``decoupled_weight_decay`` shrinks ``p`` by ``1 - lr wd`` instead of L2 (RAdamW).
    """

    def __init__(self, params: Iterable, lr: float | Tensor = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, decoupled_weight_decay: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False,
                 capturable: bool = False, differentiable: bool = False) -> None:
        check_flags(differentiable)
        check_adam_args(lr, eps, betas, weight_decay)
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay, "maximize": maximize,
                                  "foreach": foreach, "capturable": capturable,
                                  "decoupled_weight_decay": decoupled_weight_decay,
                                  "differentiable": differentiable})

    def _init_state(self, p: Tensor) -> dict:
        from ..creation import zeros_like

        state = self.state[p]
        state["step"] = scalar_state(0.0)
        state["exp_avg"] = zeros_like(p)
        state["exp_avg_sq"] = zeros_like(p)
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
                    if group["decoupled_weight_decay"]:
                        be.mul_(p._data, 1 - lr * wd)
                    else:
                        g = be.add(g, be.mul(p._data, wd))
                m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data
                lerp_(be, m, g, 1 - beta1)
                be.mul_(v, beta2)
                be.add_(v, be.mul(be.mul(g, 1 - beta2), g))  # addcmul_(g, g, value=1 - b2)
                bias_correction1 = 1 - beta1 ** step
                bias_correction2 = 1 - beta2 ** step
                update = be.mul(be.div(m, bias_correction1), lr)
                rho_inf = 2 / (1 - beta2) - 1
                rho_t = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
                if rho_t > 5.0:
                    rect = ((rho_t - 4) * (rho_t - 2) * rho_inf
                            / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
                    # torch's ``c / t`` is ``t.reciprocal() * c``
                    adaptive = be.mul(be.reciprocal(be.add(be.sqrt(v), eps)),
                                      bias_correction2 ** 0.5)
                    update = be.mul(be.mul(update, adaptive), rect)
                be.sub_(p._data, update)  # add_(update, alpha=-1)
                p._storage.version += 1
                state["exp_avg"]._storage.version += 1
                state["exp_avg_sq"]._storage.version += 1
        return loss
