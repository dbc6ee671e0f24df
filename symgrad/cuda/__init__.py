"""``symgrad.cuda``: GPU availability, synchronization and device memory, as ``torch.cuda``.

The CUDA backend (numba.cuda kernels, symgrad/backends/cuda) is imported and registered the
first time a tensor goes to "cuda", never by ``import symgrad``. Without an NVIDIA GPU the
same kernels run under numba's CUDA simulator when ``NUMBA_ENABLE_CUDASIM=1`` is set before
symgrad (and numba) are imported: slow, meant for tests.

Memory figures are exact tensor bytes (``numel * element_size`` of every live storage;
views share their base's storage), the numbers one computes by hand. ``memory_reserved``
adds what the allocator keeps cached for reuse (in 512-byte blocks) until ``empty_cache``.
"""

from __future__ import annotations

import os

from ..device import device as _device
from ..memory import max_memory_allocated as _max
from ..memory import memory_allocated as _mem
from ..memory import reset_peak_memory_stats as _reset

__all__ = ["is_available", "device_count", "current_device", "get_device_name",
           "synchronize", "memory_allocated", "max_memory_allocated",
           "reset_peak_memory_stats", "memory_reserved", "empty_cache", "manual_seed",
           "manual_seed_all", "seed", "seed_all", "amp"]

_NO_GPU = ("CUDA is not available: no NVIDIA GPU/driver was found by numba.cuda. To run "
           "symgrad's CUDA backend without a GPU, set NUMBA_ENABLE_CUDASIM=1 before "
           "importing symgrad (the numba.cuda simulator; slow, for tests).")
_NO_NUMBA_CUDA = ("CUDA is not available: the numba-cuda package is not installed "
                  "(pip install 'symgrad[cuda]'). To run symgrad's CUDA backend without a GPU, "
                  "set NUMBA_ENABLE_CUDASIM=1 before importing symgrad (the numba.cuda "
                  "simulator; slow, for tests).")


def _simulated() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _numba_cuda():
    """numba.cuda, or None when numba-cuda is missing (imported on first use only)."""
    try:
        from numba import cuda
    except ImportError:
        return None
    return cuda


def is_available() -> bool:
    """True when a GPU (or the simulator, ``NUMBA_ENABLE_CUDASIM=1``) can run the kernels."""
    cuda = _numba_cuda()
    if cuda is None:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken driver means: not available
        return False


def device_count() -> int:
    if not is_available():
        return 0
    if _simulated():
        return 1
    return len(_numba_cuda().gpus)


def current_device() -> int:
    _require_cuda()
    return 0


def get_device_name(device=None) -> str:
    _require_cuda(device)
    if _simulated():
        return "numba.cuda simulator"
    name = _numba_cuda().get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def _require_cuda(device=None) -> _device:
    """Load and register the CUDA backend; the canonical device ("cuda:0"), or a clear error."""
    if _numba_cuda() is None:
        raise RuntimeError(_NO_NUMBA_CUDA)
    if not is_available():
        raise RuntimeError(_NO_GPU)
    index = 0 if device is None else (_device(device).index or 0) \
        if not isinstance(device, int) else device
    if not 0 <= index < device_count():
        raise RuntimeError("CUDA error: invalid device ordinal")
    from ..backends import cuda as _backend

    _backend.register()
    return _device("cuda", index)


def synchronize(device=None) -> None:
    """Wait for every kernel launched so far (and report a pending device-side error)."""
    _require_cuda(device)
    from ..backends import backend_for

    backend_for("cuda").synchronize()


def memory_allocated(device=None) -> int:
    """Bytes of live CUDA tensors (exact element bytes; views are free)."""
    return _mem("cuda")


def max_memory_allocated(device=None) -> int:
    return _max("cuda")


def reset_peak_memory_stats(device=None) -> None:
    _reset("cuda")


def memory_reserved(device=None) -> int:
    """Device bytes the allocator holds: live blocks rounded to 512 bytes, plus its cache."""
    if not _loaded():
        return 0
    from ..backends.cuda import allocator

    return allocator.reserved_bytes()


def empty_cache() -> None:
    """Give the allocator's cached free blocks back to the device."""
    if not _loaded():
        return
    from ..backends.cuda import allocator

    allocator.empty_cache()


def _loaded() -> bool:
    import sys

    return "symgrad.backends.cuda.backend" in sys.modules


def manual_seed(seed: int) -> None:
    """torch seeds the current GPU's generator. symgrad draws random numbers for CUDA
    tensors from its one CPU generator (``symgrad.manual_seed``), so there is no GPU
    generator to seed: like torch on a machine without CUDA, this does nothing."""
    int(seed)  # torch rejects what is not an integer


def manual_seed_all(seed: int) -> None:
    """As :func:`manual_seed`, for every GPU."""
    int(seed)


def seed() -> None:
    """No GPU generator to seed (see :func:`manual_seed`)."""


def seed_all() -> None:
    """No GPU generator to seed (see :func:`manual_seed`)."""

