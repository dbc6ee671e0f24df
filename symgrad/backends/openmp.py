"""``symgrad.backends.openmp``: symgrad's parallel CPU loops are Numba's, not OpenMP's."""

from __future__ import annotations


def is_available() -> bool:
    return False
