"""The device allocator: exact live bytes, a small block cache, memory given back on last use.

Every device buffer the CUDA backend makes comes from :func:`allocate` as a :class:`Block`.
Tensor data (:class:`~symgrad.backends.cuda.backend.CudaArray`) and all its views hold the
same ``Block``; when the last of them is dropped the block's ``__del__`` runs (the graph
keeps no reference cycles, so this is immediate, even with ``gc`` disabled) and its bytes
leave :func:`live_bytes`. Like PyTorch's caching allocator, the freed device memory is kept
in a per-size cache for reuse (cudaMalloc is slow) until :func:`empty_cache`.

Counts are exact element bytes (``numel * itemsize``), the numbers a user computes by
hand; the cache rounds device allocations up to 512 bytes, reported by :func:`reserved_bytes`.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["Block", "allocate", "live_bytes", "peak_bytes", "reserved_bytes",
           "reset_peak", "empty_cache"]

ROUND = 512  # device allocations are multiples of this (torch's smallest block size)

_lock = threading.Lock()
_live = 0        # bytes held by live blocks (exact, as requested)
_peak = 0
_reserved = 0    # device bytes allocated from the driver, cached ones included
_cache: dict[int, list] = {}  # rounded size -> free raw uint8 device buffers


def _raw_alloc(nbytes: int):
    from numba import cuda

    return cuda.device_array(nbytes, dtype=np.uint8)


class Block:
    """One device allocation: ``data`` is a 1-D typed device array of exactly ``n`` elements."""

    __slots__ = ("data", "nbytes", "_raw", "_size", "__weakref__")

    def __init__(self, n: int, dtype: np.dtype) -> None:
        global _live, _peak, _reserved
        dtype = np.dtype(dtype)
        nbytes = n * dtype.itemsize
        size = max(ROUND, -(-nbytes // ROUND) * ROUND)
        with _lock:
            free = _cache.get(size)
            raw = free.pop() if free else None
        if raw is None:
            raw = _raw_alloc(size)
            with _lock:
                _reserved += size
        self._raw = raw
        self._size = size
        self.nbytes = nbytes
        self.data = raw[:nbytes].view(dtype) if n else raw[:0].view(dtype)
        with _lock:
            _live += nbytes
            if _live > _peak:
                _peak = _live

    def __del__(self) -> None:
        global _live
        raw = self._raw
        if raw is None:
            return
        self._raw = None
        self.data = None
        with _lock:
            _live -= self.nbytes
            _cache.setdefault(self._size, []).append(raw)


def allocate(n: int, dtype) -> Block:
    """A new block for ``n`` elements of ``dtype`` (uninitialized)."""
    return Block(int(n), dtype)


def live_bytes() -> int:
    """Bytes of device blocks currently in use (tensors and in-flight temporaries)."""
    return _live


def peak_bytes() -> int:
    return _peak


def reserved_bytes() -> int:
    """Device bytes held from the driver: live blocks (rounded) plus the cache."""
    return _reserved


def reset_peak() -> None:
    global _peak
    _peak = _live


def empty_cache() -> None:
    """Give cached free blocks back to the device (as ``torch.cuda.empty_cache``)."""
    global _reserved
    with _lock:
        freed = sum(size * len(bufs) for size, bufs in _cache.items())
        _cache.clear()
        _reserved -= freed
    if _simulated():
        return
    from numba import cuda

    try:
        cuda.current_context().deallocations.clear()  # numba defers frees; flush them now
    except Exception:  # noqa: BLE001 - no context yet: nothing to flush
        pass


def _simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)
