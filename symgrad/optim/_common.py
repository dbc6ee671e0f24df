"""Pieces the newer optimizers share: 0-dim state tensors (``step``, ``mu_product``, ``eta``,
``mu``) kept as torch keeps them (float32 values the update reads back with ``.item()``),
torch's ``lerp_`` and its learning-rate checks."""

from __future__ import annotations

from ..backends import backend_for
from ..tensor import Tensor

__all__ = ["scalar_state", "get_value", "set_value", "check_lr", "lerp_"]


def scalar_state(value: float, device=None) -> Tensor:
    """A float32 0-dim tensor holding ``value`` (rounded to float32, as torch stores it)."""
    from ..dtypes import float32
    from ..tensor import tensor

    return tensor(float(value), dtype=float32, device=device)


def get_value(t: Tensor) -> float:
    """torch's ``_get_value``: the stored (float32) value as a Python float."""
    return float(backend_for(t._device.type).to_host(t._data))


def set_value(t: Tensor, value: float) -> None:
    """``t.copy_(torch.as_tensor(value))``: the float64 value rounded into t's float32."""
    be = backend_for(t._device.type)
    be.fill_(t._data, value)
    t._storage.version += 1


def check_lr(lr) -> None:
    """torch's learning-rate checks, in its order and words."""
    if isinstance(lr, Tensor) and lr.numel() != 1:
        raise ValueError("Tensor lr must be 1-element")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def lerp_(be, start, end, weight: float) -> None:
    """``start.lerp_(end, weight)`` with torch's two formulas: ``start + w (end - start)``
    for ``|w| < 0.5``, else ``end - (end - start)(1 - w)`` (exact at ``w = 1``)."""
    diff = be.sub(end, start)
    if abs(weight) < 0.5:
        be.add_(start, be.mul(diff, weight))
    else:
        be.copy_(start, be.sub(end, be.mul(diff, 1 - weight)))
