"""``symgrad.compile``: a whole training step traced once and run as generated NumPy/Numba
code (docs/compile.md).

``step = sg.compile(fn)`` (or ``@sg.compile``): the first call per signature runs ``fn``
eagerly while tracing it, then generates one module doing its forward, backward and
optimizer update on plain arrays; later calls run that module.
"""

from __future__ import annotations

from collections.abc import Callable

from .step import CompiledStep

__all__ = ["compile", "CompiledStep"]


def compile(fn: Callable | None = None, *, cache_size: int = 8,  # noqa: A001
            background: bool = False):
    """Compile a training step ``fn`` (see docs/compile.md); usable as ``@compile`` or
    ``@compile(cache_size=4)``. ``background=True``: the first call returns after its
    traced (eager) run, the code is generated, compiled and checked in a thread, and calls
    run eagerly until it is ready (a cold first call no longer waits for Numba);
    ``step.wait()`` blocks until then."""
    if fn is None:
        return lambda f: CompiledStep(f, cache_size, background)
    return CompiledStep(fn, cache_size, background)
