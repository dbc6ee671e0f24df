"""NAdam (Adam with Nesterov momentum and a momentum schedule): torch's single-tensor update."""

from __future__ import annotations

from collections.abc import Iterable

from ..backends import backend_for
from ..tensor import Tensor
from ._common import check_adam_args, get_value, lerp_, lr_value, param_backend, scalar_state
from .optimizer import Optimizer, bump_step, check_flags

__all__ = ["NAdam"]


class NAdam(Optimizer):
    """Adam's moments with Nesterov's look-ahead, as ``torch.optim.NAdam``.

    ``mu_t = b1 (1 - 0.96^(t psi) / 2)`` (``psi = momentum_decay``); the running product of
    the ``mu_t`` lives in ``state['mu_product']``, a 0-dim tensor of torch's scalar dtype
    (float32 unless the default dtype is float64) multiplied in that dtype, as torch's. The
    step is ``p -= lr (1 - mu_t) / (1 - prod) g / d + lr mu_{t+1} / (1 - prod mu_{t+1}) m / d``
    with ``d = sqrt(v / (1 - b2^t)) + eps``. ``decoupled_weight_decay``
    shrinks ``p`` by ``1 - lr wd`` instead of adding ``wd p`` to the gradient (NAdamW).
    """

    def __init__(self, params: Iterable, lr: float | Tensor = 2e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, foreach: bool | None = None,
                 maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False) -> None:
        check_flags(differentiable)
        check_adam_args(lr, eps, betas, weight_decay)
        if not 0.0 <= momentum_decay:
            raise ValueError(f"Invalid momentum_decay value: {momentum_decay}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay,
                                  "momentum_decay": momentum_decay,
                                  "decoupled_weight_decay": decoupled_weight_decay,
                                  "maximize": maximize, "foreach": foreach,
                                  "capturable": capturable, "differentiable": differentiable})

    def _init_state(self, p: Tensor) -> dict:
        from ..creation import zeros_like

        state = self.state[p]
        state["step"] = scalar_state(0.0)
        state["mu_product"] = scalar_state(1.0)
        state["exp_avg"] = zeros_like(p)
        state["exp_avg_sq"] = zeros_like(p)
        return state

    def step(self, closure=None):
        loss = self._loss_of(closure)
        for group in self.param_groups:
            lr = lr_value(group["lr"])
            beta1, beta2 = group["betas"]
            eps, wd, psi = group["eps"], group["weight_decay"], group["momentum_decay"]
            for p in group["params"]:
                if p._grad is None:
                    continue
                be = param_backend(p)
                state = self.state.get(p) or self._init_state(p)
                g = p._grad._data
                if group["maximize"]:
                    g = be.neg(g)
                step = bump_step(state["step"])
                bias_correction2 = 1 - beta2 ** step
                if wd != 0:
                    if group["decoupled_weight_decay"]:
                        be.mul_(p._data, 1 - lr * wd)
                    else:
                        g = be.add(g, be.mul(p._data, wd))
                mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * psi)))
                mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * psi)))
                mp = state["mu_product"]
                backend_for(mp._device.type).mul_(mp._data, mu)  # in its dtype, as torch
                mp._storage.version += 1
                mu_product = get_value(mp)
                m, v = state["exp_avg"]._data, state["exp_avg_sq"]._data
                lerp_(be, m, g, 1 - beta1)
                be.mul_(v, beta2)
                be.add_(v, be.mul(be.mul(g, 1 - beta2), g))  # addcmul_(g, g, value=1 - b2)
                denom = be.add(be.sqrt(be.div(v, bias_correction2)), eps)
                value = -lr * (1.0 - mu) / (1.0 - mu_product)
                be.add_(p._data, be.div(be.mul(g, value), denom))  # addcdiv_
                value = (-lr * mu_next) / (1.0 - mu_product * mu_next)
                be.add_(p._data, be.div(be.mul(m, value), denom))
                p._storage.version += 1
                state["exp_avg"]._storage.version += 1
                state["exp_avg_sq"]._storage.version += 1
        return loss
