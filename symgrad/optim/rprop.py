"""Rprop (resilient backpropagation): torch's single-tensor update, op for op."""

from __future__ import annotations

from collections.abc import Iterable

from ..tensor import Tensor
from ._common import check_lr, param_backend, scalar_state
from .optimizer import Optimizer, bump_step, check_flags

__all__ = ["Rprop"]


class Rprop(Optimizer):
    """Per-element step sizes from the gradient's sign alone, as ``torch.optim.Rprop``.

    Where ``g * prev > 0`` the step size grows by ``etas[1]``, where ``< 0`` it shrinks by
    ``etas[0]`` (and that element's gradient counts as 0, skipping its move and the next
    comparison), clamped to ``step_sizes``; then ``p -= sign(g) * step_size``. State:
    ``step``, ``prev`` (the last gradient used) and ``step_size`` (starting at ``lr``).
    """

    def __init__(self, params: Iterable, lr: float | Tensor = 1e-2,
                 etas: tuple[float, float] = (0.5, 1.2),
                 step_sizes: tuple[float, float] = (1e-6, 50), *, capturable: bool = False,
                 foreach: bool | None = None, maximize: bool = False,
                 differentiable: bool = False) -> None:
        check_flags(differentiable)
        check_lr(lr)
        if not 0.0 < etas[0] < 1.0 < etas[1]:
            raise ValueError(f"Invalid eta values: {etas[0]}, {etas[1]}")
        super().__init__(params, {"lr": lr, "etas": etas, "step_sizes": step_sizes,
                                  "foreach": foreach, "maximize": maximize,
                                  "differentiable": differentiable, "capturable": capturable})

    def _init_state(self, p: Tensor, group: dict) -> dict:
        from ..creation import full_like, zeros_like

        state = self.state[p]
        state["step"] = scalar_state(0.0)
        state["prev"] = zeros_like(p)
        state["step_size"] = full_like(p._grad, float(group["lr"]))
        return state

    def step(self, closure=None):
        loss = self._loss_of(closure)
        for group in self.param_groups:
            etaminus, etaplus = group["etas"]
            step_size_min, step_size_max = group["step_sizes"]
            for p in group["params"]:
                if p._grad is None:
                    continue
                be = param_backend(p)
                state = self.state.get(p) or self._init_state(p, group)
                g = p._grad._data
                if group["maximize"]:
                    g = be.neg(g)
                bump_step(state["step"])
                prev, step_size = state["prev"]._data, state["step_size"]._data
                sign = be.sign(be.mul(g, prev))
                shape, np_dtype = tuple(p.shape), p.dtype.np
                # sign[sign > 0] = etaplus; sign[sign < 0] = etaminus; sign[sign == 0] = 1
                # (in torch's order, so a NaN stays NaN)
                sign = be.where(be.gt(sign, 0.0), be.full(shape, etaplus, np_dtype), sign)
                sign = be.where(be.lt(sign, 0.0), be.full(shape, etaminus, np_dtype), sign)
                sign = be.where(be.eq(sign, 0.0), be.full(shape, 1.0, np_dtype), sign)
                be.mul_(step_size, sign)
                be.copy_(step_size, be.minimum(be.maximum(step_size, step_size_min),
                                               step_size_max))  # clamp_
                # a sign change: this gradient counts as zero (grad[sign == etaminus] = 0)
                g = be.where(be.eq(sign, be.full(shape, etaminus, np_dtype)),
                             be.full(shape, 0.0, np_dtype), g)
                be.sub_(p._data, be.mul(be.sign(g), step_size))  # addcmul_(value=-1)
                be.copy_(prev, g)
                p._storage.version += 1
                state["prev"]._storage.version += 1
                state["step_size"]._storage.version += 1
        return loss
