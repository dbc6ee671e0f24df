"""Finite differences: the third opinion, central differences in float64.

The recorded forward is replayed on the NumPy backend in float64 with one leaf element
moved by ±h; nothing here uses the engine's backward or SymPy.
"""

from __future__ import annotations

import time

import numpy as np

from ..backends.numpy_backend import NumpyBackend

__all__ = ["replay_float64", "fd_gradient", "fd_cost"]

_BE = NumpyBackend()


def _f64(a):
    if isinstance(a, np.ndarray) and a.dtype.kind == "f":
        return a.astype(np.float64, copy=False)  # read only: replays copy what they move
    return a


def _consumers(graph) -> tuple[dict, dict]:
    """({node index: consumer node indices}, {leaf index: consumer node indices})."""
    cons = getattr(graph, "_fd_consumers", None)
    if cons is None:
        of_node: dict = {}
        of_leaf: dict = {}
        for g in graph.nodes:
            for r in g.inputs:
                if r[0] == "leaf":
                    of_leaf.setdefault(r[1], []).append(g.index)
                elif r[0] == "node":
                    of_node.setdefault(r[1], []).append(g.index)
        cons = graph._fd_consumers = (of_node, of_leaf)
    return cons


def _affected(graph, leaves) -> list:
    """The nodes (in order) whose value depends on any of ``leaves``: a replay with those
    leaves moved recomputes only these (cached per leaf)."""
    cache = graph.__dict__.setdefault("_fd_affected", {})
    key = tuple(sorted(leaves))
    hit = cache.get(key)
    if hit is None:
        of_node, of_leaf = _consumers(graph)
        seen: set = set()
        stack = [j for k in key for j in of_leaf.get(k, ())]
        while stack:
            j = stack.pop()
            if j not in seen:
                seen.add(j)
                stack.extend(of_node.get(j, ()))
        hit = cache[key] = [graph.nodes[j] for j in sorted(seen)]
    return hit


def fd_cost(graph, leaf) -> int:
    """The work one central difference at an element of ``leaf`` costs: two replays of
    the nodes that depend on it, each node counted as 1 + its number of inputs."""
    return 2 * max(sum(1 + len(g.inputs) for g in _affected(graph, (leaf.index,))), 1)


def _leaf64(graph, k):
    cache = graph.__dict__.setdefault("_fd_leaf64", {})
    v = cache.get(k)
    if v is None:
        v = cache[k] = _f64(graph.leaves[k].value)
    return v


def _kept_float64(graph, g) -> dict | None:
    """Node ``g``'s outputs as the graph holds them, where every one is a float64 (or
    non-float) array: the base point of the differences needs no replay of a float64
    graph, whose ± replays then recompute only the nodes downstream of the moved leaf
    (a float32 graph's base is replayed in float64, as the differences are taken)."""
    held = getattr(graph, "_values", None)
    if held is None:
        return None
    out = {}
    for nr in range(len(g.out_shapes)):
        v = held.get((g.index, nr))
        if not isinstance(v, np.ndarray) or (v.dtype.kind == "f" and v.dtype != np.float64) \
                or v.dtype.kind == "c":
            return None
        out[(g.index, nr)] = v
    return out or None


def replay_float64(graph, overrides: dict) -> np.ndarray:
    """The root's value with leaves replaced by ``overrides`` ({leaf index: array})."""
    base = getattr(graph, "_fd_base", None)
    if overrides and base is None:
        replay_float64(graph, {})
        base = graph._fd_base
    nodes = graph.nodes if base is None else _affected(graph, overrides)
    vals: dict = {}
    for g in nodes:
        if base is None and (kept := _kept_float64(graph, g)) is not None:
            vals.update(kept)  # the base point: the recorded float64 outputs as they are
            continue
        arrays = []
        for r in g.inputs:
            if r[0] == "leaf":
                v = overrides.get(r[1])
                arrays.append(_leaf64(graph, r[1]) if v is None else v)
            elif r[0] == "node":
                v = vals.get((r[1], r[2]))
                arrays.append(base[(r[1], r[2])] if v is None else v)
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
    v = vals.get((r[1], r[2]))
    return base[(r[1], r[2])] if v is None else v


def fd_gradient(graph, gradient: np.ndarray, leaf, flat_indices,
                deadline: float | None = None) -> np.ndarray:
    """Central differences of sum(gradient * root) at the given elements of ``leaf``;
    raises the verifier's TimeoutExpired between elements once ``deadline`` passed."""
    from ._common import TimeoutExpired

    base = _f64(leaf.value)
    g = np.asarray(gradient, dtype=np.float64)
    out = np.empty(len(flat_indices), dtype=np.float64)
    for n, i in enumerate(flat_indices):
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutExpired
        x0 = float(base.reshape(-1)[i])
        h = 6.0e-6 * max(1.0, abs(x0))
        vals = []
        x = base.copy()  # one copy, moved to each side (each value is read at once)
        for sgn in (1.0, -1.0):
            x.reshape(-1)[i] = x0 + sgn * h
            vals.append(float(np.sum(g * replay_float64(graph, {leaf.index: x}))))
        out[n] = (vals[0] - vals[1]) / (2 * h)
    return out
