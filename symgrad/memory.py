"""Storage: one allocation shared by a tensor and its views, and the live-byte counters.

``memory_allocated`` counts bytes of live storages per device type, like PyTorch's
caching allocator reports them (views share one storage, so they cost nothing).
A storage gives its bytes back in ``__del__``: the graph holds no reference cycles,
so this happens the moment the last tensor using it is dropped, even with gc disabled.
"""

from __future__ import annotations

__all__ = ["Storage", "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats"]

_live: dict[str, int] = {"cpu": 0, "cuda": 0}
_peak: dict[str, int] = {"cpu": 0, "cuda": 0}


class Storage:
    """Bytes of one buffer plus the version counter that in-place ops bump. ``written``
    (set by the first in-place write, see ``autograd.record.before_write``) stamps the last
    writes, so the verifier can tell a graph recorded before them."""

    __slots__ = ("nbytes", "device_type", "version", "written", "__weakref__")

    def __new__(cls, nbytes: int, device_type: str = "cpu") -> Storage:
        return new_storage(nbytes, device_type)

    def __del__(self) -> None:
        _live[self.device_type] -= self.nbytes


_new = object.__new__


def new_storage(nbytes: int, device_type: str) -> Storage:
    """A storage of ``nbytes`` on ``device_type``, counted as live. A plain function (no
    ``__init__`` call): every op output makes one, in ``Tensor._wrap``."""
    s = _new(Storage)
    s.nbytes = nbytes
    s.device_type = device_type
    s.version = 0
    live = _live[device_type] + nbytes
    _live[device_type] = live
    if live > _peak[device_type]:
        _peak[device_type] = live
    return s


def _type_of(device) -> str:
    if device is None:
        return "cpu"
    return getattr(device, "type", None) or str(device).split(":")[0]


def memory_allocated(device="cpu") -> int:
    """Bytes held by live tensor storages on ``device``."""
    return _live[_type_of(device)]


def max_memory_allocated(device="cpu") -> int:
    """Peak of :func:`memory_allocated` since start or the last reset."""
    return _peak[_type_of(device)]


def reset_peak_memory_stats(device="cpu") -> None:
    t = _type_of(device)
    _peak[t] = _live[t]
