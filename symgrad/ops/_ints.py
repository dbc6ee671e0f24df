"""int64 op arguments as PyTorch saves them.

PyTorch's ``_saved_dim`` and friends show a negative ``int64_t`` argument as its unsigned
64-bit pattern (``sum(-1)`` saves ``(18446744073709551615,)``), and keep it unnormalized.
Public functions pass such arguments through :func:`u64`; forwards and backward formulas
read them back with :func:`s64` / :func:`norm`.
"""

from __future__ import annotations

_TWO64 = 1 << 64
_TWO63 = 1 << 63
INT64_MAX = _TWO63 - 1


def u64(d: int) -> int:
    """The value PyTorch shows for the int64 argument ``d``."""
    d = int(d)
    return d + _TWO64 if d < 0 else d


def u64s(ds) -> tuple[int, ...]:
    return tuple(u64(d) for d in ds)


def s64(d: int) -> int:
    """Undo :func:`u64`."""
    return d - _TWO64 if d >= _TWO63 else d


def norm(d: int, ndim: int) -> int:
    """A saved (already validated) dim as an index into a ``ndim``-dim shape."""
    return s64(d) % max(ndim, 1)


def norms(ds, ndim: int) -> tuple[int, ...]:
    return tuple(norm(d, ndim) for d in ds)
