"""Creation functions (torch names and keywords) and symgrad's own random generator.

Random numbers come from a NumPy ``Generator`` seeded by ``manual_seed``: the same seed
gives the same numbers in symgrad every time, but not torch's numbers (documented).
"""

from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from .device import as_device
from .tensor import Tensor, tensor

__all__ = ["zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like",
           "empty_like", "eye", "arange", "linspace", "rand", "randn", "randint",
           "from_numpy", "manual_seed", "tensor"]

_rng = np.random.default_rng(0)


def manual_seed(seed: int):
    global _rng
    _rng = np.random.default_rng(int(seed))
    return _rng


def default_generator() -> np.random.Generator:
    return _rng


def _size(size) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    out = []
    for s in size:
        s = int(s)
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: "
                               f"{list(size)}")
        out.append(s)
    return tuple(out)


def _finish(arr: np.ndarray, device, requires_grad: bool) -> Tensor:
    dev = as_device(device)
    t = Tensor._wrap(arr if arr.flags.c_contiguous else arr.copy(), as_device("cpu"))
    if dev.type != "cpu":
        t = t.to(dev)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _on_device(device) -> bool:
    return device is not None and as_device(device).type != "cpu"


def _device_made(kernel: str, shape, d: _dt.dtype, device, requires_grad: bool, *args):
    """A tensor made by a kernel on the device (fill or random numbers): no host copy."""
    from .backends import backend_for
    from .cuda import _require_cuda

    dev = _require_cuda(as_device(device))
    t = Tensor._wrap(getattr(backend_for(dev.type), kernel)(shape, *args), dev)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _dtype(dtype, default=None) -> _dt.dtype:
    if dtype is None:
        return default or _dt.default_float()
    return _dt.as_dtype(dtype)


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    if dtype is None:
        dtype = _dt.promote([], [fill_value]) if not isinstance(fill_value, float) else None
    d = _dtype(dtype)
    if _on_device(device):
        return _device_made("full", _size((size,)), d, device, requires_grad, fill_value, d.np)
    return _finish(np.full(_size((size,) if isinstance(size, int) else (size,)), fill_value,
                           dtype=d.np), device, requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    if _on_device(device):
        d = _dtype(dtype)
        return _device_made("full", _size(size), d, device, requires_grad, 0, d.np)
    return _finish(np.zeros(_size(size), dtype=_dtype(dtype).np), device, requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    if _on_device(device):
        d = _dtype(dtype)
        return _device_made("full", _size(size), d, device, requires_grad, 1, d.np)
    return _finish(np.ones(_size(size), dtype=_dtype(dtype).np), device, requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    return _finish(np.empty(_size(size), dtype=_dtype(dtype).np), device, requires_grad)


def _like(fn, t, dtype, device, requires_grad, *args):
    return fn(*args, tuple(t.shape), dtype=dtype or t.dtype, device=device or t.device,
              requires_grad=requires_grad) if args else \
        fn(tuple(t.shape), dtype=dtype or t.dtype, device=device or t.device,
           requires_grad=requires_grad)


def zeros_like(input, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    return zeros(tuple(input.shape), dtype=dtype or input.dtype, device=device or input.device,
                 requires_grad=requires_grad)


def ones_like(input, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    return ones(tuple(input.shape), dtype=dtype or input.dtype, device=device or input.device,
                requires_grad=requires_grad)


def empty_like(input, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    return empty(tuple(input.shape), dtype=dtype or input.dtype, device=device or input.device,
                 requires_grad=requires_grad)


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    return full(tuple(input.shape), fill_value, dtype=dtype or input.dtype,
                device=device or input.device, requires_grad=requires_grad)


def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad=False):
    return _finish(np.eye(n, m if m is not None else n, dtype=_dtype(dtype).np), device,
                   requires_grad)


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if dtype is None:
        is_int = all(isinstance(v, int) for v in (start, end, step))
        dtype = _dt.int64 if is_int else _dt.default_float()
    d = _dtype(dtype)
    if _on_device(device):
        from .backends import backend_for
        from .cuda import _require_cuda

        dev = _require_cuda(as_device(device))
        t = Tensor._wrap(backend_for(dev.type).arange(start, end, step, d.np), dev)
        return t.requires_grad_(True) if requires_grad else t
    return _finish(np.arange(start, end, step).astype(d.np), device, requires_grad)


def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad=False):
    if steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    return _finish(np.linspace(start, end, steps).astype(_dtype(dtype).np), device,
                   requires_grad)


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    g = generator or _rng
    if _on_device(device):  # made on the device; the seed is one draw of the host generator
        d = _dtype(dtype)
        return _device_made("random", _size(size), d, device, requires_grad, d.np, False,
                            int(g.integers(0, 2**63)))
    return _finish(g.random(_size(size)).astype(_dtype(dtype).np), device, requires_grad)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    g = generator or _rng
    if _on_device(device):
        d = _dtype(dtype)
        return _device_made("random", _size(size), d, device, requires_grad, d.np, True,
                            int(g.integers(0, 2**63)))
    return _finish(g.standard_normal(_size(size)).astype(_dtype(dtype).np), device,
                   requires_grad)


def randint(low, high=None, size=(), *, generator=None, dtype=None, device=None,
            requires_grad=False) -> Tensor:
    if high is None:
        low, high = 0, low
    g = generator or _rng
    return _finish(g.integers(low, high, size=_size((size,))).astype(
        _dtype(dtype, _dt.int64).np), device, requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with ``array`` (as torch.from_numpy)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(array).__name__})")
    d = _dt.from_numpy_dtype(array.dtype)
    if array.dtype != d.np:
        raise TypeError(f"can't convert np.ndarray of type {array.dtype}. The only supported "
                        "types are: float64, float32, int64 and bool.")
    return Tensor._wrap(array)
