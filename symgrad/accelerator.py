"""``symgrad.accelerator``: torch.accelerator's device-agnostic questions.

symgrad's one accelerator is CUDA (numba.cuda, or its simulator under
``NUMBA_ENABLE_CUDASIM=1``): where ``symgrad.cuda.is_available()`` is False there is none,
and the calls that need one raise torch's error.
"""

from __future__ import annotations

from . import cuda as _cuda
from .device import device as _device

__all__ = ["current_accelerator", "current_device_idx", "current_device_index", "device_count",
           "empty_cache", "is_available", "max_memory_allocated", "memory_allocated",
           "reset_peak_memory_stats", "set_device_idx", "set_device_index", "synchronize"]

_NONE = "Cannot access accelerator device when none is available."


def is_available() -> bool:
    return _cuda.is_available()


def current_accelerator(check_available: bool = False) -> _device | None:
    """``device(type='cuda')`` where CUDA runs symgrad's kernels, else None."""
    return _device("cuda") if _cuda.is_available() else None


def device_count() -> int:
    return _cuda.device_count() if _cuda.is_available() else 0


def _require() -> None:
    if not _cuda.is_available():
        raise RuntimeError(_NONE)


def current_device_index() -> int:
    _require()
    return _cuda.current_device()


current_device_idx = current_device_index


def set_device_index(device: object, /) -> None:
    _require()
    index = getattr(device, "index", device)
    if index not in (None, 0, "cuda", "cuda:0"):
        raise RuntimeError(f"Invalid device index {index}: symgrad uses one GPU, index 0")


set_device_idx = set_device_index


def synchronize(device: object = None, /) -> None:
    _require()
    _cuda.synchronize()


def empty_cache() -> None:
    _require()
    _cuda.empty_cache()


def memory_allocated(device_index: object = None, /) -> int:
    _require()
    return _cuda.memory_allocated()


def max_memory_allocated(device_index: object = None, /) -> int:
    _require()
    return _cuda.max_memory_allocated()


def reset_peak_memory_stats(device_index: object = None, /) -> None:
    _require()
    _cuda.reset_peak_memory_stats()
