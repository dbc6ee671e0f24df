"""What a compiled step is specialised to, checked on every call.

The signature (the cache key) covers fn's arguments and the grad mode; the leaves and the
optimizer state are checked by identity of their arrays when the entry gathers them (an
array replaced since the last call is re-checked by shape and dtype).
"""

from __future__ import annotations

from typing import Any

from ..autograd.grad_mode import _state
from ..tensor import Tensor

__all__ = ["signature"]

_SCALARS = (int, float, bool, str, type(None))


def signature(args: tuple) -> tuple[Any, str | None]:
    """(cache key, None) for these arguments, or (None, why they cannot be compiled)."""
    parts: list = [_state.enabled, _state.inference]
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            if a._device.type != "cpu":
                return None, "CUDA tensors: sg.compile of CUDA steps is not implemented yet"
            d = a._data
            parts.append((d.shape, d.dtype.str, a._requires_grad))
        elif type(a) in _SCALARS:
            parts.append((type(a), a))
        else:
            return None, f"argument {i} is a {type(a).__name__} (tensors and Python scalars " \
                         "only)"
    return tuple(parts), None
