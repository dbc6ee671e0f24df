"""``symgrad.amp``: torch.amp's names, so mixed-precision training scripts run unchanged.

symgrad computes every op in its inputs' dtype: :class:`autocast` never lowers precision. It
warns once where it is asked to (a CPU autocast, or a CUDA one with a GPU) and where torch
itself disables autocast (CUDA asked for, none available) it says what torch says.
:class:`GradScaler` is torch's loss scaling: on "cpu", or on "cuda" where CUDA is available,
it scales, unscales, skips steps whose gradients are not finite and adapts the scale exactly
as torch does; asked for "cuda" where none is available it is disabled with torch's warning
and passes everything through.
"""

from __future__ import annotations

from .autocast_mode import autocast, custom_bwd, custom_fwd, is_autocast_available
from .grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast", "custom_bwd", "custom_fwd", "is_autocast_available"]
