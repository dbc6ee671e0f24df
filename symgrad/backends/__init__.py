"""Backends: kernel sets behind one interface, chosen per device.

``numpy`` is the reference. The compiled CPU backend (Numba) and the CUDA backend
register themselves here when they land; ``set_cpu_backend`` switches the default.
"""

from __future__ import annotations

import numpy as np

from ..dtypes import HALF_NP
from .numpy_backend import NumpyBackend

_BACKENDS: dict[str, object] = {"numpy": NumpyBackend()}
_DEVICE_DEFAULT: dict[str, str] = {"cpu": "numpy"}


def register_backend(name: str, backend: object, *, default_for: str | None = None) -> None:
    _BACKENDS[name] = backend
    if default_for:
        _DEVICE_DEFAULT[default_for] = name


def get_backend(name: str):
    return _BACKENDS[name]


def backend_for(device_type: str):
    """The backend that runs kernels for tensors on ``device_type``."""
    try:
        return _BACKENDS[_DEVICE_DEFAULT[device_type]]
    except KeyError:
        raise RuntimeError(f"no backend for device type {device_type!r}") from None


def small_kernel(kernel: str):
    """``(backend, fn, limits)``: ``backend`` runs stanza kernel ``kernel`` as plain ``fn``
    when its first array input has fewer than ``limits.PARALLEL_MIN`` elements (read per
    call: tests lower it), so a hot caller may call ``fn`` itself; None if none does."""
    from .cpu import backend as cpu_module

    be = _BACKENDS.get("cpu")
    fn = cpu_module.SMALL_KERNELS.get(kernel)
    return None if be is None or fn is None else (be, fn, cpu_module)


def upcast_halves(arrays: list, be) -> list:
    """float16/bfloat16 operands as float32: torch's CPU kernels compute half precision in
    float32 and round the result once, and so does symgrad: every non-view op on a half
    tensor runs on float32 arrays (autograd.function's apply, and a node's fused backward
    kernel), and its result is rounded to the half dtype once. It also keeps half arrays
    away from the Numba kernels, which take float32/float64 only."""
    return [be.cast(a, np.float32) if type(a) is np.ndarray and a.dtype in HALF_NP else a
            for a in arrays]


def set_cpu_backend(name: str) -> str:
    """Select the CPU backend by name; returns the previous one (tests run both)."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; known: {sorted(_BACKENDS)}")
    previous = _DEVICE_DEFAULT["cpu"]
    _DEVICE_DEFAULT["cpu"] = name
    return previous


def _register_cpu() -> None:
    """The Numba backend is the CPU default (it imports Numba only on its first kernel)."""
    import os

    from .cpu import CpuBackend

    register_backend("cpu", CpuBackend())
    if os.environ.get("SYMGRAD_CPU_BACKEND", "cpu") == "cpu":
        _DEVICE_DEFAULT["cpu"] = "cpu"


_register_cpu()
