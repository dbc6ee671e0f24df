"""Count kernel launches and host<->device transfers by patching numba.cuda itself.

Under the simulator: a top-level ``FakeCUDAKernel.__call__`` is a launch; ``cuda.to_device``,
``copy_to_device`` and ``copy_to_host`` are transfers, and so is any host-side element read
or write of a device array (``FakeCUDAArray.__getitem__``/``__setitem__`` outside a kernel),
which a real GPU would turn into a copy. symgrad's own counters are not trusted here.
"""

from __future__ import annotations

from numba import cuda
from numba.cuda.simulator import kernel as _kernel
from numba.cuda.simulator.cudadrv import devicearray as _da


class Counter:
    def __init__(self) -> None:
        self.launches = 0
        self.h2d = 0
        self.d2h = 0
        self.names: list[str] = []
        self._saved = []

    def reset(self) -> None:
        self.launches = self.h2d = self.d2h = 0
        self.names = []

    @property
    def transfers(self) -> int:
        return self.h2d + self.d2h

    def _patch(self, owner, name, wrapper_factory) -> None:
        orig = getattr(owner, name)
        self._saved.append((owner, name, orig))
        setattr(owner, name, wrapper_factory(orig))

    def __enter__(self) -> Counter:
        c = self

        def call(orig):
            def wrapper(kernel, *args):
                if not kernel._device and _kernel._kernel_context is None:
                    c.launches += 1
                    c.names.append(kernel.fn.__name__)
                return orig(kernel, *args)
            return wrapper

        def count(attr):
            def factory(orig):
                def wrapper(*args, **kwargs):
                    setattr(c, attr, getattr(c, attr) + 1)
                    return orig(*args, **kwargs)
                return wrapper
            return factory

        def host_read(orig):
            def wrapper(self, *args):
                out = orig(self, *args)
                # a view (slicing) costs nothing on a GPU; an element read is a copy
                if _kernel._kernel_context is None and not isinstance(out, _da.FakeCUDAArray):
                    c.d2h += 1
                return out
            return wrapper

        def host_write(orig):
            def wrapper(self, *args):
                if _kernel._kernel_context is None:
                    c.h2d += 1
                return orig(self, *args)
            return wrapper

        self._patch(_kernel.FakeCUDAKernel, "__call__", call)
        self._patch(cuda, "to_device", count("h2d"))
        self._patch(_da.FakeCUDAArray, "copy_to_device", count("h2d"))
        self._patch(_da.FakeCUDAArray, "copy_to_host", count("d2h"))
        self._patch(_da.FakeCUDAArray, "__getitem__", host_read)
        self._patch(_da.FakeCUDAArray, "__setitem__", host_write)
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, orig in reversed(self._saved):
            setattr(owner, name, orig)
        self._saved.clear()
