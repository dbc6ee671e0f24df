"""Running the verifier from the Jupyter layer, with or without ipywidgets.

Kept apart from the widget so that ``%symgrad verify`` and ``%%symgrad`` work on the core
install (no ipywidgets): only the Inspector needs widgets.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["VerificationInterrupted", "run_verify", "verify_with_node_checks"]


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


def verify_with_node_checks(root: Any, names: Mapping[str, Any] | None = None, *,
                            progress=None, local_checks: bool = True,
                            **options: Any) -> tuple[Any, Any]:
    """:func:`run_verify`, plus a ``mode="local"`` run when the first checked no node.

    When every leaf agrees the verifier skips its per-node checks (all rows "not run"); a
    graph view wants a verdict on every node, and for a graph within the exact budget the
    local run is cheap. Returns ``(report, local)``, ``local`` being None when not run.
    Feed both to :func:`symgrad.jupyter.graph.apply_report`.
    """
    report = run_verify(root, names, progress=progress, **options)
    local = None
    nodes = getattr(report, "nodes", None)
    if local_checks and nodes and all(getattr(r, "status", None) == "not run" for r in nodes):
        local = run_verify(root, names, **dict(options, mode="local"))
    return report, local
