"""Notebook layer: graph MIME bundles, the Inspector widget, and the ``%%symgrad`` magics.

Importing this module (``%load_ext symgrad`` does) gives grad_fn nodes a rich display
(the graph bundle), leaving ``Tensor``'s repr plain as torch's. ipywidgets is imported
only when the Inspector is used.
"""

from __future__ import annotations

from typing import Any

from .graph import GRAPH_MIME, REPORT_MIME, SCHEMA_ID, GraphView, graph, graph_json, load_schema

__all__ = ["GRAPH_MIME", "REPORT_MIME", "SCHEMA_ID", "GraphView", "graph", "graph_json",
           "load_schema", "Inspector", "install_display_hooks", "load_ipython_extension"]


def _node_mimebundle(self, include=None, exclude=None) -> dict:
    from .graph import mimebundle

    bundle = mimebundle(graph_json(self))
    bundle["text/plain"] = repr(self)  # a grad_fn still reads <MulBackward0 object at ...>
    return bundle


def _node_repr_html(self) -> str:
    from .svg import render_html

    return render_html(graph_json(self))


def install_display_hooks() -> None:
    """Give grad_fn nodes (symgrad's Node) the graph bundle as their rich display."""
    from ..autograd.node import Node

    Node._repr_mimebundle_ = _node_mimebundle
    Node._repr_html_ = _node_repr_html


def __getattr__(name: str) -> Any:
    if name == "Inspector":
        from .widget import Inspector

        return Inspector
    raise AttributeError(f"module 'symgrad.jupyter' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext symgrad``: register ``%symgrad``/``%%symgrad`` and the display hooks."""
    from .magics import register

    install_display_hooks()
    register(ipython)


install_display_hooks()
