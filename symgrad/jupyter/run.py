"""Running the verifier from the Jupyter layer, with or without ipywidgets.

Kept apart from the widget so that ``%symgrad verify`` and ``%%symgrad`` work on the core
install (no ipywidgets): only the Inspector needs widgets.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["VerificationInterrupted", "run_verify"]


class VerificationInterrupted(Exception):
    """Raised inside the verifier's progress callback when the user pressed Stop."""


def _verifier():
    try:
        from ..symbolic import verify  # type: ignore[attr-defined]
    except ImportError:
        try:
            from .. import verify  # type: ignore[attr-defined]
        except ImportError:
            return None
    return verify


def run_verify(root: Any, names: Mapping[str, Any] | None = None, *, progress=None,
               **options: Any) -> Any:
    """Call ``symgrad.verify`` with the options it accepts (None values are left out)."""
    verify = _verifier()
    if verify is None:
        raise RuntimeError("symgrad.verify is not available in this installation")
    try:
        params = inspect.signature(verify).parameters
    except (TypeError, ValueError):
        params = {}
    accepts_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in options.items() if v is not None and (k in params or accepts_kw)}
    if names is not None and ("names" in params or accepts_kw):
        kwargs["names"] = names
    if progress is not None and ("progress" in params or accepts_kw):
        kwargs["progress"] = progress
    return verify(root, **kwargs)
