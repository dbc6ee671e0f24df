"""``symgrad.backends.mkldnn``: oneDNN is not used by symgrad (NumPy's BLAS and Numba are)."""

from __future__ import annotations

enabled = True
deterministic = False


def is_available() -> bool:
    return False
