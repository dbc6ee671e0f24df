"""symgrad's default random generator, seeded by ``manual_seed``.

It sits below the tensor layer so that the factories (creation.py: ``rand``, ``randn``)
and the in-place initialisers (functional.py: ``uniform_``, ``normal_`` ...) draw from the
same stream without importing each other.
"""

from __future__ import annotations

import numpy as np

from ._tensor_layer import type_name

__all__ = ["manual_seed", "default_generator"]

_rng = np.random.default_rng(0)


def manual_seed(seed: int):
    global _rng
    # torch takes any int in [-2**63, 2**64) and uses it modulo 2**64
    _rng = np.random.default_rng(int(seed) % 2**64)
    return _rng


def default_generator() -> np.random.Generator:
    return _rng


def _generator(generator) -> np.random.Generator:
    """``generator=``: None (symgrad's generator, seeded by manual_seed), a NumPy
    ``Generator``, or an object carrying one as ``_rng``."""
    if generator is None:
        return _rng
    if isinstance(generator, np.random.Generator):
        return generator
    g = getattr(generator, "_rng", None)
    if isinstance(g, np.random.Generator):
        return g
    raise TypeError(f"argument 'generator' must be a symgrad generator (a numpy.random."
                    f"Generator), not {type_name(generator)}")
