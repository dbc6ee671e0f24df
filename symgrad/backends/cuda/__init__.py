"""The CUDA backend (numba.cuda kernels on device arrays), and torch.backends.cuda's switches.

Importing this package stays light: ``matmul``, ``is_built`` and the other switches need no
GPU. The kernels (``CudaBackend``, ``CudaArray``) import numba.cuda on first access, which
``symgrad`` does only when a tensor is first moved to "cuda" (``symgrad.cuda._require_cuda``).
:func:`register` makes the backend the one ``backend_for("cuda")`` returns.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .._flags import Flags

__all__ = ["CudaArray", "CudaBackend", "register", "matmul", "is_built",
           "flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled",
           "enable_flash_sdp", "enable_mem_efficient_sdp", "enable_math_sdp"]

# torch.backends.cuda.matmul: kept, no effect (numba.cuda kernels have no TF32/FP16 modes)
matmul = Flags(allow_tf32=False, allow_fp16_reduced_precision_reduction=True,
               allow_bf16_reduced_precision_reduction=True)
_sdp = {"flash": True, "mem_efficient": True, "math": True}

_registered = False


def is_built() -> bool:
    """Whether symgrad can run CUDA kernels at all: the numba-cuda package is installed."""
    return importlib.util.find_spec("numba_cuda") is not None


def flash_sdp_enabled() -> bool:
    return _sdp["flash"]


def mem_efficient_sdp_enabled() -> bool:
    return _sdp["mem_efficient"]


def math_sdp_enabled() -> bool:
    return _sdp["math"]


def enable_flash_sdp(enabled: bool) -> None:
    _sdp["flash"] = bool(enabled)


def enable_mem_efficient_sdp(enabled: bool) -> None:
    _sdp["mem_efficient"] = bool(enabled)


def enable_math_sdp(enabled: bool) -> None:
    _sdp["math"] = bool(enabled)


def __getattr__(name: str) -> Any:
    if name in ("CudaArray", "CudaBackend"):
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    global _registered
    if not _registered:
        from .. import register_backend
        from .backend import CudaBackend
        from .kernels import error_flag

        error_flag()  # the device-side index error flag, made once here rather than in an op
        register_backend("cuda", CudaBackend(), default_for="cuda")
        _registered = True
