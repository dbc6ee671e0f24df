"""The CUDA backend (numba.cuda kernels on device arrays).

Importing this package imports numba.cuda, so ``symgrad`` imports it only when a tensor is
first moved to "cuda" (``symgrad.cuda._require_cuda``). :func:`register` makes the backend
the one ``backend_for("cuda")`` returns.
"""

from __future__ import annotations

from .. import register_backend
from .backend import CudaArray, CudaBackend

__all__ = ["CudaArray", "CudaBackend", "register"]

_registered = False


def register() -> None:
    global _registered
    if not _registered:
        from .kernels import error_flag

        error_flag()  # the device-side index error flag, made once here rather than in an op
        register_backend("cuda", CudaBackend(), default_for="cuda")
        _registered = True
