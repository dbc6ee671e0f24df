"""Pieces the optimizers share: 0-dim state tensors (``step``, ``mu_product``, ``eta``,
``mu``) kept as torch keeps them (float32 unless the default dtype is float64, values the
update reads back with ``.item()``), torch's ``lerp_`` and its learning-rate checks."""

from __future__ import annotations

from ..autograd.record import before_write
from ..backends import backend_for
from ..tensor import Tensor

__all__ = ["lr_value", "scalar_dtype", "scalar_state", "get_value", "set_value", "check_lr",
           "lerp_", "param_backend", "check_adam_args"]


def param_backend(p: Tensor):
    """The backend that updates ``p`` in place, once the write is noted: a graph recorded
    before this step is then checked at the values it recorded, or told it changed
    (``autograd.record.before_write``). Every optimizer's update of a parameter starts here."""
    before_write(p)
    return backend_for(p._device.type)


def scalar_dtype(fused: bool | None = False):
    """torch's ``_get_scalar_dtype``: float64 under a float64 default dtype (unless fused),
    else float32."""
    from ..dtypes import float32, float64, get_default_dtype

    return float64 if get_default_dtype() is float64 and not fused else float32


def scalar_state(value: float, device=None, fused: bool | None = False) -> Tensor:
    """A 0-dim tensor of :func:`scalar_dtype` holding ``value``, as torch stores it."""
    from ..tensor import tensor

    return tensor(float(value), dtype=scalar_dtype(fused), device=device)


def get_value(t: Tensor) -> float:
    """torch's ``_get_value``: the stored value as a Python float."""
    return float(backend_for(t._device.type).to_host(t._data))


def set_value(t: Tensor, value: float) -> None:
    """``t.copy_(torch.as_tensor(value))``: the Python float becomes a tensor of the default
    dtype first (float32 unless changed), then takes t's dtype."""
    from ..dtypes import get_default_dtype

    be = backend_for(t._device.type)
    be.fill_(t._data, float(get_default_dtype().np.type(value)))
    t._storage.version += 1


def lr_value(lr):
    """A group's ``lr`` as the update computes with it: a Python float, or for a tensor lr
    (torch keeps it a 0-dim tensor) a NumPy scalar of its dtype, so that arithmetic with
    Python floats stays in that dtype as torch's 0-dim tensor arithmetic does."""
    if isinstance(lr, Tensor):
        return lr.dtype.np.type(float(lr))
    return float(lr)


def check_lr(lr) -> None:
    """torch's learning-rate checks, in its order and words."""
    if isinstance(lr, Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def check_adam_args(lr, eps: float, betas, weight_decay: float) -> None:
    """The Adam family's argument checks (Adamax, NAdam, RAdam), in torch's order and words."""
    check_lr(lr)
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def lerp_(be, start, end, weight: float) -> None:
    """``start.lerp_(end, weight)`` with torch's two formulas: ``start + w (end - start)``
    for ``|w| < 0.5``, else ``end - (end - start)(1 - w)`` (exact at ``w = 1``)."""
    diff = be.sub(end, start)
    if abs(weight) < 0.5:
        be.add_(start, be.mul(diff, weight))
    else:
        be.copy_(start, be.sub(end, be.mul(diff, 1 - weight)))
