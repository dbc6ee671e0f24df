"""Finite differences: the third opinion, central differences in float64.

The recorded forward is replayed on the NumPy backend in float64 with one leaf element
moved by ±h; nothing here uses the engine's backward or SymPy.
"""

from __future__ import annotations

import numpy as np

from ..backends.numpy_backend import NumpyBackend

__all__ = ["replay_float64", "fd_gradient"]

_BE = NumpyBackend()


def _f64(a):
    if isinstance(a, np.ndarray) and a.dtype.kind == "f":
        return a.astype(np.float64)
    return a


def _deps(graph) -> list:
    """For each node, the leaves it depends on (so a replay redoes only what changed)."""
    deps = getattr(graph, "_fd_deps", None)
    if deps is None:
        deps = []
        for g in graph.nodes:
            d = set()
            for r in g.inputs:
                if r[0] == "leaf":
                    d.add(r[1])
                elif r[0] == "node":
                    d |= deps[r[1]]
            deps.append(d)
        graph._fd_deps = deps
    return deps


def replay_float64(graph, overrides: dict) -> np.ndarray:
    """The root's value with leaves replaced by ``overrides`` ({leaf index: array})."""
    base = getattr(graph, "_fd_base", None)
    if overrides and base is None:
        replay_float64(graph, {})
        base = graph._fd_base
    deps = _deps(graph)
    changed = set(overrides)
    vals: dict = {}
    for g in graph.nodes:
        if base is not None and not (deps[g.index] & changed):
            for nr in range(len(g.out_shapes) or 1):
                if (g.index, nr) in base:
                    vals[(g.index, nr)] = base[(g.index, nr)]
            continue
        arrays = []
        for r in g.inputs:
            if r[0] == "leaf":
                arrays.append(overrides.get(r[1], _f64(graph.leaves[r[1]].value)))
            elif r[0] == "node":
                arrays.append(vals[(r[1], r[2])])
            else:
                arrays.append(r[1])
        if g.spec is not None and g.spec.name == "to_copy" and \
                np.asarray(arrays[0]).dtype.kind == "f" and \
                getattr(g.params.get("dtype"), "is_floating_point", False):
            outs = (arrays[0],)
        else:
            with np.errstate(all="ignore"):
                outs = g.forward_numeric(_BE, arrays)
        for nr, o in enumerate(outs):
            vals[(g.index, nr)] = _f64(np.asarray(o))
    if not overrides:
        graph._fd_base = vals
    r = graph.root
    if r[0] == "leaf":
        return overrides.get(r[1], _f64(graph.leaves[r[1]].value))
    return vals[(r[1], r[2])]


def fd_gradient(graph, gradient: np.ndarray, leaf, flat_indices) -> np.ndarray:
    """Central differences of sum(gradient * root) at the given elements of ``leaf``."""
    base = _f64(leaf.value)
    g = np.asarray(gradient, dtype=np.float64)
    out = np.empty(len(flat_indices), dtype=np.float64)
    for n, i in enumerate(flat_indices):
        x0 = float(base.reshape(-1)[i])
        h = 6.0e-6 * max(1.0, abs(x0))
        vals = []
        for sgn in (1.0, -1.0):
            x = base.copy()
            x.reshape(-1)[i] = x0 + sgn * h
            vals.append(float(np.sum(g * replay_float64(graph, {leaf.index: x}))))
        out[n] = (vals[0] - vals[1]) / (2 * h)
    return out
