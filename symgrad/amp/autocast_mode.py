"""``autocast``: a context manager and decorator that keeps full precision (see package doc)."""

from __future__ import annotations

import functools
import warnings
from typing import Any

from .. import cuda as _cuda

__all__ = ["autocast", "custom_bwd", "custom_fwd", "is_autocast_available"]

_DEVICE_TYPES = ("cpu", "cuda")


def is_autocast_available(device_type: str) -> bool:
    """Whether ``autocast(device_type)`` is accepted (as torch: cpu and cuda)."""
    return device_type in _DEVICE_TYPES


class autocast:  # noqa: N801 - torch's name
    """``with symgrad.autocast("cuda"):`` runs its body in full precision.

    torch lowers matmuls and convolutions to float16/bfloat16 inside the block; symgrad has
    no reduced-precision kernels, so the block runs as written and ``enabled`` is False.
    """

    def __init__(self, device_type: str, dtype: Any = None, enabled: bool = True,
                 cache_enabled: bool | None = None) -> None:
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        if not is_autocast_available(device_type):
            raise RuntimeError(
                f"User specified an unsupported autocast device_type '{device_type}'")
        self.device = device_type
        self.fast_dtype = dtype
        self._cache_enabled = cache_enabled
        if enabled and device_type == "cuda" and not _cuda.is_available():
            warnings.warn("CUDA is not available or torch_xla is imported. Disabling autocast.",
                          UserWarning, stacklevel=2)
        elif enabled:
            warnings.warn(f"symgrad has no reduced-precision kernels: autocast('{device_type}') "
                          "runs its block in the inputs' dtypes. Disabling autocast.",
                          UserWarning, stacklevel=2)
        self._enabled = False

    def __enter__(self) -> autocast:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return wrapper


def custom_fwd(fwd=None, *, device_type: str, cast_inputs: Any = None):
    """torch's decorator for a custom Function's forward; autocast never runs, so it returns
    ``fwd`` unchanged."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)
    return fwd


def custom_bwd(bwd=None, *, device_type: str):
    """torch's decorator for a custom Function's backward (a no-op here, as custom_fwd)."""
    if not isinstance(device_type, str):
        raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)
    return bwd
