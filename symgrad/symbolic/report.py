"""The verifier's report: per leaf and per node agreement, as text, HTML, JSON and LaTeX.

``to_json()`` follows ``report.schema.json`` (``"schema": "symgrad.report/1"``), the
MIME type ``application/vnd.symgrad.report+json``; every rich form escapes user names.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Report", "LeafRow", "NodeRow", "MIME_TYPE", "SCHEMA_ID"]

MIME_TYPE = "application/vnd.symgrad.report+json"
SCHEMA_ID = "symgrad.report/1"


def _num(x):
    """A JSON-safe float (NaN/inf become strings, as JSON has no literal for them)."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _fmt(x, digits=6) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return f"{float(x):.{digits}g}"


@dataclass
class LeafRow:
    name: str
    shape: tuple
    dtype: str
    max_abs_err: float | None
    max_rel_err: float | None
    worst_index: tuple | None
    engine_value: float | None
    symbolic_value: float | None
    fd_value: float | None
    status: str  # ok | mismatch | not checked
    fd_max_abs_err: float | None = None
    checked: int = 0
    sampled: bool = False
    latex: str = ""


@dataclass
class NodeRow:
    id: int
    name: str
    status: str  # ok | mismatch | error | unsupported | skipped | not run | timeout
    formula: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    sampled: bool = False
    detail: str = ""
    node: Any = field(default=None, repr=False, compare=False)


@dataclass
class Report:
    ok: bool
    mode: str  # the main mode that ran: exact | local
    requested_mode: str
    backend: str
    order: int
    rtol: dict
    atol: dict
    leaves: list
    nodes: list
    first_bad_node: Any = None
    ran: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0
    budget: int = 0
    cost: int = 0
    graph_kind: str = "symgrad"
    hvp: list = field(default_factory=list)  # rows for order=2
    _sym: Any = field(default=None, repr=False)
    _gradient: Any = field(default=None, repr=False)
    _graph: Any = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    # -- symbolic gradients ---------------------------------------------------------------
    def _leaf(self, leaf):
        g = self._graph
        for lf in g.leaves:
            if lf.tensor is leaf or (isinstance(leaf, str) and lf.name == leaf):
                return lf
        raise KeyError(f"{leaf!r} is not a leaf of the verified graph")

    def symbolic_gradient(self, leaf):
        """The SymPy expression of d(sum(gradient*root))/d leaf (an Array for tensors).

        Simplified while small. ``leaf`` is the tensor or its display name.
        """
        import sympy

        from . import _engine as E

        lf = self._leaf(leaf)
        if lf.name in self._cache:
            return self._cache[lf.name]
        if not (lf.requires_grad and lf.is_float):
            raise ValueError(f"'{lf.name}' does not require grad")
        sym = self._ensure_sym()
        adjs = sym.symbolic_adjoints(self._gradient, list(lf.symbols.reshape(-1)))
        out = []
        for s in lf.symbols.reshape(-1):
            e = sym.expand_intermediates(adjs[s])
            e = E.to_sympy(e, sym.sym_map)
            if isinstance(e, sympy.Basic):
                e = e.doit()  # products and sums built unevaluated (fast path) evaluate now
            if sympy.count_ops(e) <= 12:  # simplify is only cheap on tiny expressions
                e = sympy.simplify(e)
            out.append(e)
        res = out[0] if not lf.shape else sympy.ImmutableDenseNDimArray(out, lf.shape)
        self._cache[lf.name] = res
        return res

    def _ensure_sym(self):
        if self._sym is None:
            from ._engine import pick_engine
            from .exact import SymbolicGraph

            engine, name = pick_engine(self.backend)
            sym = SymbolicGraph(self._graph, engine, name)
            sym.build()
            self._sym = sym
        return self._sym

    def latex(self) -> str:
        """LaTeX of every leaf's symbolic gradient (names escaped), one line each."""
        import sympy

        sym = self._ensure_sym()
        lines = []
        for lf in self._graph.leaves:
            if not (lf.requires_grad and lf.is_float):
                continue
            try:
                g = self.symbolic_gradient(lf.tensor)
            except ValueError:
                continue
            body = sympy.latex(g, symbol_names=sym.tex_map)
            lines.append(rf"\frac{{\partial L}}{{\partial {lf.latex}}} = {body}")
        return " \\\\\n".join(lines)

    # -- assertions and text --------------------------------------------------------------
    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError("gradient check failed\n" + str(self))

    def _leaf_table(self) -> list[str]:
        head = ["leaf", "shape", "status", "max abs err", "max rel err", "worst", "engine",
                "symbolic", "finite diff"]
        rows = [head]
        for r in self.leaves:
            rows.append([r.name, "x".join(map(str, r.shape)) or "scalar", r.status,
                         _fmt(r.max_abs_err, 3), _fmt(r.max_rel_err, 3),
                         "-" if r.worst_index is None else str(list(r.worst_index)),
                         _fmt(r.engine_value), _fmt(r.symbolic_value), _fmt(r.fd_value)])
        return _table(rows)

    def _node_table(self) -> list[str]:
        rows = [["id", "grad_fn", "local check", "max abs err", "detail"]]
        for r in self.nodes:
            mark = " <- first bad" if r.node is not None and r.node is self.first_bad_node \
                else ""
            rows.append([str(r.id), r.name, r.status + mark, _fmt(r.max_abs_err, 3),
                         r.detail[:90]])
        return _table(rows)

    def __str__(self) -> str:
        head = (f"symgrad.verify: {'OK' if self.ok else 'MISMATCH'}  (mode {self.mode}, "
                f"backend {self.backend}, order {self.order}, {self.seconds:.2f} s)")
        lines = [head]
        if self.first_bad_node is not None:
            lines.append(f"first bad node: {_node_name(self.first_bad_node)}")
        lines += self._leaf_table()
        if self.nodes and any(r.status != "not run" for r in self.nodes):
            lines.append("")
            lines += self._node_table()
        if self.hvp:
            lines.append("")
            lines += _table([["leaf", "Hessian-vector status", "max abs err"]] + [
                [h["name"], h["status"], _fmt(h["max_abs_err"], 3)] for h in self.hvp])
        if self.ran:
            lines.append("ran: " + ", ".join(self.ran))
        if self.skipped:
            lines.append("skipped: " + "; ".join(self.skipped))
        for n in self.notes:
            lines.append("note: " + n)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<symgrad Report ok={self.ok} mode={self.mode!r} leaves={len(self.leaves)} " \
               f"nodes={len(self.nodes)}>"

    # -- JSON -----------------------------------------------------------------------------
    def to_json(self) -> dict:
        """A dict in the ``symgrad.report/1`` schema (``json.dumps`` it as is)."""
        first = None
        for r in self.nodes:
            if r.node is not None and r.node is self.first_bad_node:
                first = r.id
        return {
            "schema": SCHEMA_ID,
            "ok": bool(self.ok),
            "mode": self.mode,
            "requested_mode": self.requested_mode,
            "backend": self.backend,
            "order": int(self.order),
            "graph_kind": self.graph_kind,
            "tolerances": {k: {"rtol": self.rtol[k], "atol": self.atol[k]} for k in self.rtol},
            "seconds": round(float(self.seconds), 6),
            "timed_out": bool(self.timed_out),
            "cost": int(self.cost),
            "budget": int(self.budget),
            "ran": list(self.ran),
            "skipped": list(self.skipped),
            "notes": list(self.notes),
            "first_bad_node": first,
            "leaves": [{
                "name": r.name, "latex": r.latex, "shape": [int(s) for s in r.shape],
                "dtype": r.dtype, "status": r.status,
                "max_abs_err": _num(r.max_abs_err), "max_rel_err": _num(r.max_rel_err),
                "worst_index": None if r.worst_index is None else [int(i) for i in
                                                                     r.worst_index],
                "engine_value": _num(r.engine_value), "symbolic_value": _num(r.symbolic_value),
                "fd_value": _num(r.fd_value), "fd_max_abs_err": _num(r.fd_max_abs_err),
                "checked": int(r.checked), "sampled": bool(r.sampled)} for r in self.leaves],
            "nodes": [{
                "id": int(r.id), "name": r.name, "status": r.status, "formula": r.formula,
                "max_abs_err": _num(r.max_abs_err), "max_rel_err": _num(r.max_rel_err),
                "sampled": bool(r.sampled), "detail": r.detail} for r in self.nodes],
            "hvp": [{"name": h["name"], "status": h["status"],
                     "max_abs_err": _num(h["max_abs_err"])} for h in self.hvp],
        }

    # -- HTML -----------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        e = html.escape
        color = "#1a7f37" if self.ok else "#cf222e"
        parts = [f'<div class="symgrad-report"><p><b style="color:{color}">'
                 f'{"OK" if self.ok else "MISMATCH"}</b> &mdash; mode {e(self.mode)}, '
                 f"backend {e(self.backend)}, order {self.order}, {self.seconds:.2f} s</p>"]
        if self.first_bad_node is not None:
            parts.append(f"<p>first bad node: <code>{e(_node_name(self.first_bad_node))}"
                         "</code></p>")
        parts.append("<table><thead><tr>" + "".join(
            f"<th>{h}</th>" for h in ("leaf", "shape", "status", "max abs err",
                                      "max rel err", "worst", "engine", "symbolic",
                                      "finite diff")) + "</tr></thead><tbody>")
        for r in self.leaves:
            parts.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
                r.name, "x".join(map(str, r.shape)) or "scalar", r.status,
                _fmt(r.max_abs_err, 3), _fmt(r.max_rel_err, 3),
                "-" if r.worst_index is None else list(r.worst_index), _fmt(r.engine_value),
                _fmt(r.symbolic_value), _fmt(r.fd_value))) + "</tr>")
        parts.append("</tbody></table>")
        if self.nodes and any(r.status != "not run" for r in self.nodes):
            parts.append("<table><thead><tr><th>id</th><th>grad_fn</th><th>local check</th>"
                         "<th>formula</th><th>detail</th></tr></thead><tbody>")
            for r in self.nodes:
                parts.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
                    r.id, r.name, r.status, r.formula, r.detail)) + "</tr>")
            parts.append("</tbody></table>")
        for n in self.notes + [f"skipped: {s}" for s in self.skipped]:
            parts.append(f"<p><i>{e(n)}</i></p>")
        parts.append("</div>")
        return "".join(parts)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        bundle = {MIME_TYPE: self.to_json(), "text/html": self._repr_html_(),
                  "text/plain": str(self)}
        if include:
            bundle = {k: v for k, v in bundle.items() if k in include}
        if exclude:
            bundle = {k: v for k, v in bundle.items() if k not in exclude}
        return bundle

    def to_json_str(self) -> str:
        return json.dumps(self.to_json())


def _node_name(node) -> str:
    n = node.name() if hasattr(node, "name") and callable(node.name) else type(node).__name__
    return str(n)


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    out = []
    for k, r in enumerate(rows):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def as_index(flat: int, shape) -> tuple:
    return tuple(int(i) for i in np.unravel_index(int(flat), shape)) if shape else ()
