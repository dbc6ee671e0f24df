"""The data address of an array, read without ``__array_interface__`` (which builds a dict
of six entries: microseconds per array in a step's loop, with caches cold after its numeric
work). runtime.cat_into checks with it that each piece lies where the concatenation puts
it. Imported on first use: only steps with packed attention gradients need it."""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def address(x):  # pragma: no cover - compiled
    """``x.__array_interface__["data"][0]``."""
    return x.ctypes.data
