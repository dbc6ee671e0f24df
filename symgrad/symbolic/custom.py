"""Custom ``Function`` nodes: checked through their ``sympy`` meaning when they have one,
else by local finite differences (noted in the report)."""

from __future__ import annotations


def fill_custom(g, node) -> None:
    g.note = "custom Function support pending"


def custom_meaning(g, engine, arrays):
    raise NotImplementedError(f"{g.name}: custom Function without a SymPy meaning")


def custom_local(g, graph, in_vals, v64, engine, engine_name, rng, sample):
    raise NotImplementedError
