"""Named tuples returned by ops with several outputs (``max(dim)`` ...), like torch.return_types."""

from __future__ import annotations

from collections import namedtuple

__all__ = ["max", "min"]


def _make(name: str):
    base = namedtuple(name, ["values", "indices"])

    def __repr__(self) -> str:
        return f"symgrad.return_types.{name}(\nvalues={self.values!r},\nindices={self.indices!r})"

    cls = type(name, (base,), {"__slots__": (), "__repr__": __repr__,
                               "__module__": "symgrad.return_types"})
    return cls


max = _make("max")  # noqa: A001
min = _make("min")  # noqa: A001

# -- tensor functions and normalisation (issue 21)
sort = _make("sort")
topk = _make("topk")
__all__ += ["sort", "topk"]
