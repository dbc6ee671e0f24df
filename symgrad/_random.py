"""symgrad's default random generator, seeded by ``manual_seed``.

It sits below the tensor layer so that the factories (creation.py: ``rand``, ``randn``)
and the in-place initialisers (functional.py: ``uniform_``, ``normal_`` ...) draw from the
same stream without importing each other.
"""

from __future__ import annotations

import numpy as np

from ._tensor_layer import type_name
from .device import CPU, as_device

__all__ = ["manual_seed", "default_generator", "Generator"]

_rng = np.random.default_rng(0)


def manual_seed(seed: int):
    global _rng
    # torch takes any int in [-2**63, 2**64) and uses it modulo 2**64
    _rng = np.random.default_rng(int(seed) % 2**64)
    return _rng


def default_generator() -> np.random.Generator:
    return _rng


class Generator:
    """``torch.Generator``'s role: a seeded stream for ``generator=`` arguments (``randn``,
    ``uniform_``, ``DataLoader``, ``random_split`` ...). It wraps NumPy's PCG64, so the same
    seed gives other numbers than torch's Mersenne Twister (docs/differences.md)."""

    #: torch's default seed of a new generator
    DEFAULT_SEED = 67280421310721

    def __init__(self, device="cpu") -> None:
        if as_device(device).type != "cpu":
            raise RuntimeError("symgrad.Generator: only the cpu generator exists (CUDA "
                               "kernels are seeded by one draw of a cpu generator)")
        self._seed = self.DEFAULT_SEED
        self._rng = np.random.default_rng(self._seed)

    @property
    def device(self):
        return CPU

    def manual_seed(self, seed: int) -> Generator:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"manual_seed expected a long, but got {type_name(seed)}")
        self._seed = int(seed) % 2**64
        self._rng = np.random.default_rng(self._seed)
        return self

    def initial_seed(self) -> int:
        return self._seed

    def seed(self) -> int:
        """Seed from the operating system's entropy, as torch does; returns the seed."""
        self.manual_seed(int(np.random.SeedSequence().entropy) % 2**63)
        return self._seed

    def get_state(self) -> dict:
        """The stream's state (a dict of NumPy's bit generator; torch returns a ByteTensor)."""
        return dict(self._rng.bit_generator.state)

    def set_state(self, state: dict) -> Generator:
        self._rng.bit_generator.state = state
        return self

    def __repr__(self) -> str:
        return f"<symgrad.Generator object at {id(self):#x}>"


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
    raise TypeError(f"argument 'generator' must be a symgrad.Generator (or a numpy.random."
                    f"Generator), not {type_name(generator)}")
