"""NumPy spellings torch's argument parser accepts: ``keepdims=`` for ``keepdim=`` and
``axis=`` for ``dim=`` (``x.sum(axis=1, keepdims=True)`` runs in torch, so it runs here)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_ALIASES = (("keepdims", "keepdim"), ("axis", "dim"))


def numpy_aliases(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` also accepting ``keepdims`` and ``axis`` (an error if both spellings are given,
    as torch's "got multiple values for argument")."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for alias, name in _ALIASES:
            if alias in kwargs:
                if name in kwargs:
                    raise TypeError(f"{fn.__name__}() got multiple values for argument "
                                    f"'{name}'")
                kwargs[name] = kwargs.pop(alias)
        return fn(*args, **kwargs)

    return wrapper
