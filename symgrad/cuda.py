"""``symgrad.cuda``: GPU availability and memory (the numba.cuda backend plugs in here)."""

from __future__ import annotations

import os

from .memory import max_memory_allocated as _max
from .memory import memory_allocated as _mem

__all__ = ["is_available", "device_count", "memory_allocated", "max_memory_allocated"]

_NO_GPU = ("CUDA is not available: no NVIDIA GPU/driver was found by numba.cuda. To run "
           "symgrad's CUDA backend without a GPU, set NUMBA_ENABLE_CUDASIM=1 before "
           "importing symgrad (the numba.cuda simulator; slow, for tests).")


def is_available() -> bool:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return _backend_present()
    try:
        from numba import cuda
    except ImportError:
        return False
    try:
        return bool(cuda.is_available()) and _backend_present()
    except Exception:
        return False


def _backend_present() -> bool:
    from . import backends

    return "cuda" in backends._BACKENDS


def device_count() -> int:
    return 1 if is_available() else 0


def _require_cuda() -> None:
    if not is_available():
        raise RuntimeError(_NO_GPU)


def memory_allocated(device=None) -> int:
    return _mem("cuda")


def max_memory_allocated(device=None) -> int:
    return _max("cuda")
