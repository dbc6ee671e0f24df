"""``symgrad.backends.mps``: Apple's Metal backend is not one of symgrad's."""

from __future__ import annotations


def is_available() -> bool:
    return False


def is_built() -> bool:
    return False
