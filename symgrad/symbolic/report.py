"""The verifier's report: per leaf and per node agreement, as text, HTML, JSON and LaTeX.

``to_json()`` follows ``report.schema.json`` (``"schema": "symgrad.report/1"``), the
MIME type ``application/vnd.symgrad.report+json``; every rich form escapes user names.
"""

from __future__ import annotations

import html
import json
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._format import _special
from .._module_paths import ModulePaths

__all__ = ["Report", "LeafRow", "NodeRow", "MIME_TYPE", "SCHEMA_ID", "node_label",
           "render_text", "render_html"]

MIME_TYPE = "application/vnd.symgrad.report+json"
SCHEMA_ID = "symgrad.report/1"
#: long text (details, notes) wraps at this width in text reports; nothing is cut.
TEXT_WIDTH = 100


def _finite_or_name(x):
    """``(float, None)`` for a number, or ``(None, text)`` for None/str/nan/inf/non-numbers."""
    if x is None:
        return None, "-"
    if isinstance(x, str):
        return None, x
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None, str(x)
    special = _special(x)
    return (None, special) if special is not None else (x, None)


def _num(x):
    """A JSON-safe float (NaN/inf become strings, as JSON has no literal for them)."""
    if x is None:
        return None
    value, text = _finite_or_name(x)
    return text if value is None else value


def _fmt(x, digits=6) -> str:
    """A number for text and HTML: ``-`` when not computed, ``nan``/``inf``/``-inf``."""
    value, text = _finite_or_name(x)
    return text if value is None else f"{value:.{digits}g}"


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
    status: str  # ok | mismatch | not checked | non-finite | could not evaluate |
    #              imprecise | changed in place (written in place since recorded)
    fd_max_abs_err: float | None = None
    checked: int = 0
    sampled: bool = False
    latex: str = ""
    bound: float | None = None  # the error allowed at the worst element, when known
    #: status "non-finite" / "could not evaluate": where the nan/inf arose
    detail: str = ""
    #: the leaf tensor itself: views tie the row to their leaf by identity, not by name
    tensor: Any = field(default=None, repr=False, compare=False)
    #: elements whose exact gradient is 0: no relative error there (max_rel_err is over
    #: the others; None when every element's exact gradient is 0)
    exact_zeros: int = 0


#: report statuses where nothing could be compared: the report is its one line (a note)
ONE_LINE_STATUSES = ("changed in place", "backward raised")


@dataclass
class NodeRow:
    id: int
    name: str
    status: str  # ok | mismatch | error | unsupported | skipped | not run | timeout |
    #              could not evaluate
    formula: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    sampled: bool = False
    detail: str = ""
    node: Any = field(default=None, repr=False, compare=False)
    bound: float | None = None  # the error allowed at the worst element, when known


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
    #: ok | mismatch | non-finite | could not evaluate | unsupported | timed out |
    #: changed in place (a leaf written in place since the graph was recorded, its recorded
    #: value gone: nothing was checked) | backward raised (a node's backward raised: the
    #: node, the exception's type and message are the one line)
    status: str = ""
    #: False when a float32 number lost precision (a row is ``imprecise``): the rules are
    #: right (a float64 replay of the graph agrees), the float32 values are not exact
    precise: bool = True
    #: where float32 precision was lost (a grad_fn), when a row is imprecise
    imprecise_node: Any = None
    #: a compiled step's ``verify()``: one row per fused kernel (proved against SymPy) and
    #: per gradient where the generated code and eager disagree; dicts with kind, name,
    #: status (ok | wrong | not proved | mismatch), how, detail, derivation
    compiled: list = field(default_factory=list)
    #: the fused kernel (or generated gradient) of ``compiled`` that disagrees, by name
    bad_kernel: str | None = None
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
            if sym.opaque and isinstance(e, sympy.Basic):  # non-finite scalars, as numbers
                vals = {c.name: sympy.Float(v) for v, c in sym.opaque.items()}
                e = e.xreplace({f: vals[f.name] for f in e.free_symbols
                                if f.name in vals})
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
            if getattr(g, "shape", None) is not None and 0 in g.shape:
                # an empty leaf: SymPy's array printer cannot print a size-0 array
                shape = r" \times ".join(str(n) for n in g.shape)
                body = rf"\text{{(empty, }}{shape}\text{{)}}"
            else:
                body = _latex_nonfinite(sympy.latex(g, symbol_names=sym.tex_map))
            lines.append(rf"\frac{{\partial L}}{{\partial {lf.latex}}} = {body}")
        return " \\\\\n".join(lines)

    # -- node names ---------------------------------------------------------------------
    def node_label(self, node) -> str:
        """A node as users read it: ``MulBackward0 (#3 of 7 from the root)``.

        ``node`` is a row of ``.nodes``, its id, or the grad_fn object. Positions count
        the graph's grad_fn nodes from the root's own (#1) in reverse topological order,
        the order backward runs them.
        """
        rows = self.nodes
        row = None
        for r in rows:
            if r is node or r.id == node or (r.node is not None and r.node is node):
                row = r
                break
        if row is None:
            if isinstance(node, NodeRow):
                row = node
            elif isinstance(node, int):
                raise KeyError(f"no node with id {node} in this report")
            else:
                return _node_name(node)
        pos = _positions([r.id for r in rows]).get(row.id)
        module = ModulePaths(getattr(r.node, "_module_call", None) for r in rows
                             ).of_node(row.node) if row.node is not None else ""
        return node_label(row.name, pos, len(rows), module)

    @property
    def first_bad_node_label(self) -> str | None:
        """``first_bad_node`` named by grad_fn and position (None when all agree)."""
        if self.first_bad_node is None:
            return None
        return self.node_label(self.first_bad_node)

    # -- assertions and text --------------------------------------------------------------
    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError("gradient check failed\n" + str(self))

    def to_text(self, verbose: bool = True, width: int = TEXT_WIDTH) -> str:
        """The report for a terminal: every leaf and node (``verbose``), or a summary of
        what disagrees. Cells and details are never cut; long text wraps at ``width``."""
        return render_text(self.to_json(), verbose=verbose, width=width)

    def summary(self, width: int = TEXT_WIDTH) -> str:
        """What disagrees, named and readable (``to_text(verbose=False)``)."""
        return self.to_text(verbose=False, width=width)

    def __str__(self) -> str:
        return self.to_text(verbose=True)

    def __repr__(self) -> str:
        return f"<symgrad Report ok={self.ok} mode={self.mode!r} leaves={len(self.leaves)} " \
               f"nodes={len(self.nodes)}>"

    # -- JSON -----------------------------------------------------------------------------
    def to_json(self) -> dict:
        """A dict in the ``symgrad.report/1`` schema.

        Strict JSON: NaN and infinities are the strings ``"nan"``, ``"inf"``, ``"-inf"``
        (so ``json.dumps(d, allow_nan=False)`` works); a value not computed is ``null``.
        Nodes carry their ``id`` (forward topological order, what ``first_bad_node``
        refers to) and a ``label`` naming them by grad_fn and position from the root.
        """
        first = None
        for r in self.nodes:
            if r.node is not None and r.node is self.first_bad_node:
                first = r.id
        pos = _positions([r.id for r in self.nodes])
        total = len(self.nodes)
        # the nn.Module call that made each node: h.1.mlp.c_fc
        paths = ModulePaths(getattr(r.node, "_module_call", None) for r in self.nodes)
        module = {r.id: paths.of_node(r.node) if r.node is not None else ""
                  for r in self.nodes}
        nodes = []
        for r in self.nodes:
            ref = _reference(r)
            nodes.append({
                "id": int(r.id), "name": r.name, "status": r.status, "formula": r.formula,
                "max_abs_err": _num(r.max_abs_err), "max_rel_err": _num(r.max_rel_err),
                "sampled": bool(r.sampled), "detail": _detail_words(r.detail, ref),
                "label": node_label(r.name, pos[r.id], total, module[r.id]),
                "position": pos[r.id], "module": module[r.id],
                "reference": ref, "bound": _num(r.bound)})
        first_label = None
        if first is not None:
            first_label = node_label(self.nodes[[r.id for r in self.nodes].index(first)].name,
                                     pos[first], total, module[first])
        elif self.first_bad_node is not None:
            first_label = node_label(_node_name(self.first_bad_node), None, total,
                                     paths.of_node(self.first_bad_node))
        return {
            "schema": SCHEMA_ID,
            "ok": bool(self.ok),
            "status": self.status or ("ok" if self.ok else "mismatch"),
            "precise": bool(self.precise),
            "mode": self.mode,
            "requested_mode": self.requested_mode,
            "backend": self.backend,
            "order": int(self.order),
            "graph_kind": self.graph_kind,
            "tolerances": {k: {"rtol": _num(self.rtol[k]), "atol": _num(self.atol[k])}
                           for k in self.rtol},
            "seconds": _num(round(float(self.seconds), 6)),
            "timed_out": bool(self.timed_out),
            "cost": int(self.cost),
            "budget": int(self.budget),
            "ran": list(self.ran),
            "skipped": list(self.skipped),
            "notes": list(self.notes),
            "first_bad_node": first,
            "first_bad_node_label": first_label,
            "leaves": [{
                "name": r.name, "latex": r.latex, "shape": [int(s) for s in r.shape],
                "dtype": r.dtype, "status": r.status,
                "max_abs_err": _num(r.max_abs_err), "max_rel_err": _num(r.max_rel_err),
                "worst_index": None if r.worst_index is None else [int(i) for i in
                                                                     r.worst_index],
                "engine_value": _num(r.engine_value), "symbolic_value": _num(r.symbolic_value),
                "fd_value": _num(r.fd_value), "fd_max_abs_err": _num(r.fd_max_abs_err),
                "checked": int(r.checked), "sampled": bool(r.sampled),
                "bound": _num(r.bound), "detail": str(r.detail or ""),
                # only where there are some: a reader of older reports is not surprised
                **({"exact_zeros": int(r.exact_zeros)} if r.exact_zeros else {})}
               for r in self.leaves],
            "nodes": nodes,
            "hvp": [{"name": h["name"], "status": h["status"],
                     "max_abs_err": _num(h["max_abs_err"])} for h in self.hvp],
            **({"compiled": [{k: (None if r.get(k) is None else str(r[k])) for k in
                              ("kind", "name", "status", "how", "detail", "derivation")}
                             for r in self.compiled],
                "bad_kernel": self.bad_kernel} if self.compiled else {}),
        }

    # -- HTML -----------------------------------------------------------------------------
    def _repr_html_(self) -> str:
        return render_html(self.to_json())

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        bundle = {MIME_TYPE: self.to_json(), "text/html": self._repr_html_(),
                  "text/plain": str(self)}
        if include:
            bundle = {k: v for k, v in bundle.items() if k in include}
        if exclude:
            bundle = {k: v for k, v in bundle.items() if k not in exclude}
        return bundle

    def to_json_str(self) -> str:
        return json.dumps(self.to_json(), allow_nan=False)


def headline(data: dict) -> str:
    """The verdict word of a report dict: ``OK``, or its status in capitals (``MISMATCH``,
    ``NON-FINITE``, ``COULD NOT EVALUATE``, ``TIMED OUT``, ``UNSUPPORTED``); an ok report
    whose float32 numbers lost precision reads ``OK (IMPRECISE)``. Older dicts without a
    status read OK or MISMATCH."""
    ok = bool(data.get("ok"))
    status = data.get("status") or ("ok" if ok else "mismatch")
    if ok or status == "ok":
        return "OK" if data.get("precise", True) else "OK (IMPRECISE)"
    return str(status).upper()


def _node_name(node) -> str:
    n = node.name() if hasattr(node, "name") and callable(node.name) else type(node).__name__
    return str(n)


def node_label(name: str, position: int | None, total: int, module: str = "") -> str:
    """``MulBackward0 (#3 of 7 from the root)``, or with the nn.Module call that made it
    ``AddmmBackward0 in h.1.mlp.c_fc (#12 of 80 from the root)``: the name every report
    form uses."""
    if module:
        name = f"{name} in {module}"
    if position is None:
        return str(name)
    return f"{name} (#{position} of {total} from the root)"


def _positions(ids: list) -> dict:
    """id -> position counted from the root's grad_fn (#1); ids are in forward order."""
    return {i: k + 1 for k, i in enumerate(sorted(ids, reverse=True))}


_FD_FORMULA = "finite differences (no SymPy meaning)"


def _reference(row) -> str:
    """What a node's backward was compared with: ``symbolic`` or ``finite differences``
    (a custom Function without a ``sympy`` staticmethod)."""
    node = row.node
    cls = getattr(type(node), "_forward_cls", None) if node is not None else None
    if cls is not None and getattr(cls, "sympy", None) is not None:
        return "symbolic"
    return "finite differences" if _FD_FORMULA in (row.formula or "") else "symbolic"


def _detail_words(detail: str, reference: str) -> str:
    """The local check's detail, naming finite differences as such where they were the
    reference (its worst-element clause reads ``engine X, symbolic Y`` either way)."""
    if reference != "finite differences" or not detail:
        return detail
    return re.sub(r"(: engine [^,;]+), symbolic ", r"\1, finite differences ", detail, count=1)


def _latex_nonfinite(tex: str) -> str:
    """NaN and infinities in LaTeX as the words the other forms use (nan, inf)."""
    return (tex.replace(r"\text{NaN}", r"\mathrm{nan}")
               .replace(r"\tilde{\infty}", r"\mathrm{inf}")
               .replace(r"\infty", r"\mathrm{inf}"))


# -- rendering (from the JSON form, so session reports and the CLI draw the same) ---------
_BAD_NODE = ("mismatch", "error", "unsupported", "timeout")

#: What a node's worst-element detail (``d/dself[1, 2]: engine X, symbolic Y``) measures:
#: the node's own backward applied to a seeded random cotangent, so its element and values
#: differ from the leaf table's worst element (of d(output)/d(leaf)) even for the same tensor.
NODE_WORST = "local check (its backward on a seeded random cotangent, not the leaf gradient)"


def node_detail(detail: str) -> str:
    """A node's detail, its worst-element clause saying which check it comes from."""
    if detail.startswith("d/d"):
        return f"{NODE_WORST}, worst element {detail}"
    return detail

LEAF_COLUMNS = {  # key: (header, what it holds)
    "leaf": ("leaf", "the leaf tensor: parameter path or variable name"),
    "shape": ("shape", "shape and dtype"),
    "status": ("status", "ok, mismatch, or not checked (local mode: no symbolic value)"),
    "worst": ("worst element", "the element of the leaf's gradient d(output)/d(leaf) where "
                               "engine and symbolic differ most"),
    "engine": ("engine grad", "d(output)/d(leaf) at the worst element from the engine's "
                              "backward"),
    "symbolic": ("symbolic grad", "the same from SymPy's exact derivative"),
    "fd": ("finite-diff grad", "the same from central finite differences (float64)"),
    "abs": ("max abs err", "largest |engine - symbolic| over the checked elements"),
    "bound": ("bound", "the largest error allowed at the worst element"),
    "rel": ("max rel err", "largest |engine - symbolic| / |symbolic| where the symbolic "
                           "value is not 0 (\"exact 0\": 0 everywhere, the abs err is the "
                           "measure)"),
    "fd_err": ("finite-diff err", "largest |finite-diff - symbolic| at the sampled elements "
                                  "(local mode: |finite-diff - engine|)"),
    "checked": ("elements checked", "how many elements were compared (sampled: a seeded "
                                    "sample)"),
}
NODE_COLUMNS = {
    "node": ("node", "grad_fn name and position counted from the root's grad_fn (#1)"),
    "status": ("local check", "the node's own backward against its op's Jacobian"),
    "reference": ("checked against", "symbolic Jacobian, or finite differences of the "
                                     "forward (custom Function without a sympy meaning)"),
    "abs": ("max abs err", "largest |engine - reference| of the node's vector-Jacobian "
                           "product"),
    "bound": ("bound", "the largest error allowed at the worst element"),
    "rel": ("max rel err", "largest |engine - reference| / |reference|"),
    "formula": ("formula", "the op's meaning used for the check"),
    "detail": ("detail", "the worst element of the node's backward on a seeded random "
                         "cotangent (not of the leaf gradient): engine value against the "
                         "reference"),
}
_LEAF_SUMMARY = ("leaf", "shape", "status", "worst", "engine", "symbolic", "fd", "abs",
                 "fd_err")
_LEAF_FULL = ("leaf", "shape", "status", "worst", "engine", "symbolic", "fd", "abs", "bound",
              "rel", "fd_err", "checked")
_SUMMARY_ROWS = 10


def _leaf_column_text(key: str, fd_vs: str) -> str:
    if key == "worst" and fd_vs == "engine":
        return "the sampled element where finite differences and engine differ most"
    if key == "fd_err":
        return f"largest |finite-diff - {fd_vs}| at the sampled elements"
    return LEAF_COLUMNS[key][1]


def _shape_text(leaf: dict) -> str:
    shape = "x".join(str(s) for s in leaf.get("shape") or []) or "scalar"
    return f"{shape} {leaf['dtype']}" if leaf.get("dtype") else shape


def rel_err_text(row: dict) -> str:
    """A leaf row's relative error as a reader should take it: against an exact gradient
    of 0 there is none ("exact 0": the absolute error is the measure), and a row that has
    such elements beside others says how many its relative error leaves out."""
    zeros = int(row.get("exact_zeros") or 0)
    rel = row.get("max_rel_err")
    if zeros and rel is None and row.get("max_abs_err") is not None:
        return "exact 0"
    text = _fmt(rel, 3)
    return f"{text} (+{zeros} exact 0)" if zeros and rel is not None else text


def _leaf_cells(leaf: dict) -> dict:
    wi = leaf.get("worst_index")
    checked = str(leaf.get("checked", ""))
    if leaf.get("sampled"):
        checked += " sampled"
    return {"leaf": leaf.get("name", "?"), "shape": _shape_text(leaf),
            "status": leaf.get("status", ""),
            "worst": "-" if wi is None else ("[" + ", ".join(map(str, wi)) + "]" if wi
                                             else "scalar"),
            "engine": _fmt(leaf.get("engine_value")),
            "symbolic": _fmt(leaf.get("symbolic_value")),
            "fd": _fmt(leaf.get("fd_value")), "abs": _fmt(leaf.get("max_abs_err"), 3),
            "bound": _fmt(leaf.get("bound"), 3), "rel": rel_err_text(leaf),
            "fd_err": _fmt(leaf.get("fd_max_abs_err"), 3), "checked": checked}


def _with_labels(data: dict) -> list[dict]:
    """The nodes of a report dict, each with ``label`` (older dicts lack it)."""
    nodes = list(data.get("nodes") or [])
    pos = _positions([n.get("id", k) for k, n in enumerate(nodes)])
    out = []
    for k, n in enumerate(nodes):
        n = dict(n)
        p = n.get("position") or pos.get(n.get("id", k))
        n.setdefault("label", node_label(n.get("name", "?"), p, len(nodes),
                                         str(n.get("module") or "")))
        n["position"] = p
        n.setdefault("reference", "finite differences" if _FD_FORMULA in (n.get("formula")
                                                                           or "") else "symbolic")
        out.append(n)
    return out


def _first_bad(data: dict, nodes: list[dict]) -> dict | None:
    fb = data.get("first_bad_node")
    for n in nodes:
        if fb is not None and n.get("id") == fb:
            return n
    return None


def _wrap(text: str, width: int, indent: str, first: str | None = None) -> list[str]:
    """Wrap at word boundaries, never cutting a word or dropping text."""
    return textwrap.wrap(text, width=width, initial_indent=indent if first is None else first,
                         subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [indent.rstrip()]


def _tolerance_text(data: dict) -> str:
    tols = data.get("tolerances") or {}
    per = "; ".join(f"{dt}: rtol {_fmt(v.get('rtol'), 3)}, atol {_fmt(v.get('atol'), 3)}"
                    for dt, v in tols.items())
    return ("tolerance: an element passes when |engine - symbolic| <= atol + rtol * "
            "(|symbolic| + mean |symbolic|)" + (f"; {per}" if per else ""))


def render_text(data: dict, verbose: bool = True, width: int = TEXT_WIDTH) -> str:
    """A report dict (``Report.to_json()``) as text: a summary of what disagrees, or with
    ``verbose`` every leaf and node with formulas, tolerances and notes."""
    if "leaves" not in data:  # a check that could not run: its error only
        return "\n".join(_wrap(str(data.get("error", "no report")), width, "  ", ""))
    mode = data.get("mode", "?")
    seconds = data.get("seconds")
    secs = f"{seconds:.2f} s" if isinstance(seconds, (int, float)) else f"{seconds} s"
    lines = [f"symgrad.verify: {headline(data)}  (mode {mode}, backend "
             f"{data.get('backend', '?')}, order {data.get('order', 1)}, {secs})"]
    if data.get("status") in ONE_LINE_STATUSES:  # nothing was checked: the one line
        for note in data.get("notes") or []:
            lines += _wrap(note, width, "  ", "")
        return "\n".join(lines)
    nodes = _with_labels(data)
    first = _first_bad(data, nodes)
    if first is not None:
        lines.append(f"first bad node: {first['label']}")
        if first.get("detail"):
            lines += _wrap(node_detail(first["detail"]), width, "    ", "  ")
    elif data.get("first_bad_node_label"):
        lines.append(f"first bad node: {data['first_bad_node_label']}")

    leaves = list(data.get("leaves") or [])
    fd_vs = "engine" if mode == "local" else "symbolic"
    cols = _LEAF_FULL if verbose else _LEAF_SUMMARY
    if not any(lf.get("bound") is not None for lf in leaves):
        cols = tuple(c for c in cols if c != "bound")
    shown = leaves if verbose else [lf for lf in leaves if lf.get("status") != "ok"]
    if shown:
        more = 0 if verbose else max(0, len(shown) - _SUMMARY_ROWS)
        cells = [_leaf_cells(lf) for lf in (shown if verbose else shown[:_SUMMARY_ROWS])]
        if not verbose:  # a summary leaves out the columns nothing was computed for
            cols = tuple(c for c in cols if c in ("leaf", "shape", "status")
                         or any(x[c] != "-" for x in cells))
        lines.append("")
        statuses = {lf.get("status") for lf in shown}
        if verbose:
            title = "leaves"
        elif statuses == {"mismatch"}:
            title = f"leaves that disagree ({len(shown)} of {len(leaves)})"
        elif statuses == {"not checked"}:
            title = (f"leaves not checked symbolically, finite differences only "
                     f"({len(shown)} of {len(leaves)})")
        else:
            title = f"leaves that disagree or were not checked ({len(shown)} of {len(leaves)})"
        lines.append(title + ":")
        rows = [[LEAF_COLUMNS[c][0] for c in cols]] + [[x[c] for c in cols] for x in cells]
        lines += ["  " + x for x in _table(rows)]
        if more:
            lines.append(f"  ... and {more} more leaves (verbose output lists them all)")
        leaf_details = [lf for lf in shown if lf.get("detail")]
        if leaf_details:
            lines.append("  leaf details:")
            for lf in leaf_details:
                lines += _wrap(f"{lf.get('name', '?')} ({lf.get('status', '')}): "
                               f"{lf['detail']}", width, "      ", "    ")
        if verbose:
            lines.append("  columns:")
            named = [c for c in cols if c not in ("leaf", "status")]
            w = max(len(LEAF_COLUMNS[c][0]) for c in named)
            for c in named:
                lines += _wrap(_leaf_column_text(c, fd_vs), width, "    " + " " * (w + 2),
                               "    " + LEAF_COLUMNS[c][0].ljust(w + 2))
            lines.append("    " + "-".ljust(w + 2) + "not computed")
        else:
            short = {"worst": None, "engine": None, "symbolic": None, "fd": None,
                     "abs": "max abs err: largest |engine - symbolic|",
                     "bound": "bound: the error allowed there",
                     "fd_err": f"finite-diff err: largest |finite-diff - {fd_vs}|"}
            legend = ["grads: d(output)/d(leaf) at the worst element of the leaf's gradient"]
            legend += [short[c] for c in cols if short.get(c)]
            lines += _wrap("; ".join(legend) + "; -: not computed", width, "  ", "  ")
    elif leaves:
        lines.append(f"all {len(leaves)} leaves agree with the symbolic gradients")
    if verbose and data.get("tolerances"):
        lines += _wrap(_tolerance_text(data), width, "    ", "  ")

    ran_nodes = [n for n in nodes if n.get("status") != "not run"]
    if verbose and ran_nodes:
        ncols = ["node", "status", "reference", "abs", "bound", "rel", "formula"]
        if not any(n.get("bound") is not None for n in nodes):
            ncols.remove("bound")
        lines.append("")
        lines.append("nodes, local check of each backward (from the root):")
        rows = [[NODE_COLUMNS[c][0] for c in ncols]]
        for n in sorted(nodes, key=lambda n: n["position"] or 0):
            mark = " (first bad)" if first is not None and n is first else ""
            cell = {"node": n["label"], "status": n.get("status", "") + mark,
                    "reference": n["reference"], "abs": _fmt(n.get("max_abs_err"), 3),
                    "bound": _fmt(n.get("bound"), 3), "rel": _fmt(n.get("max_rel_err"), 3),
                    "formula": n.get("formula") or "-"}
            rows.append([cell[c] for c in ncols])
        lines += ["  " + x for x in _table(rows)]
        detailed = [n for n in sorted(nodes, key=lambda n: n["position"] or 0)
                    if n.get("detail")]
        if detailed:
            lines.append("  details:")
            for n in detailed:
                sampled = " (sampled)" if n.get("sampled") else ""
                lines += _wrap(f"{n['label']}: {node_detail(n['detail'])}{sampled}", width,
                               "      ", "    ")
    elif ran_nodes:
        bad = [n for n in nodes if n.get("status") in _BAD_NODE]
        counts: dict[str, int] = {}
        for n in ran_nodes:
            counts[n.get("status", "?")] = counts.get(n.get("status", "?"), 0) + 1
        lines.append("")
        lines.append("nodes (local check of each backward): " + ", ".join(
            f"{v} {k}" for k, v in counts.items()) + f" (of {len(nodes)})")
        for n in sorted(bad, key=lambda n: n["position"] or 0):
            head = f"{n['label']}: {n.get('status')}, max abs err " \
                   f"{_fmt(n.get('max_abs_err'), 3)} (against {n['reference']})"
            lines += _wrap(head, width, "      ", "  ")
            if n.get("detail") and n is not first:
                lines += _wrap(node_detail(n["detail"]), width, "      ", "    ")

    hvp = list(data.get("hvp") or [])
    if hvp and (verbose or any(h.get("status") != "ok" for h in hvp)):
        lines.append("")
        lines.append("Hessian-vector products:")
        lines += ["  " + x for x in _table([["leaf", "status", "max abs err"]] + [
            [h.get("name", "?"), h.get("status", ""), _fmt(h.get("max_abs_err"), 3)]
            for h in hvp])]
    lines += _compiled_text(data, verbose, width)
    if verbose and data.get("ran"):
        lines += _wrap("ran: " + ", ".join(data["ran"]), width, "  ", "")
    for s in data.get("skipped") or []:
        lines += _wrap("skipped: " + s, width, "  ", "")
    for n in data.get("notes") or []:
        lines += _wrap("note: " + n, width, "  ", "")
    return "\n".join(lines)


def _compiled_text(data: dict, verbose: bool, width: int) -> list:
    """A compiled step's kernels and generated gradients; a bad one with its derivation."""
    rows = list(data.get("compiled") or [])
    bad = [r for r in rows if r.get("status") != "ok"]
    if not rows or not (verbose or bad):
        return []
    lines = ["", "compiled step" + (f": {data['bad_kernel']} disagrees"
                                    if data.get("bad_kernel") else "") + ":"]
    lines += ["  " + x for x in _table([["kernel", "kind", "status", "how"]] + [
        [r.get("name", "?"), r.get("kind", ""), r.get("status", ""), r.get("how") or ""]
        for r in (rows if verbose else bad)])]
    for r in bad:
        lines += _wrap(f"{r.get('name')}: {r.get('detail')}", width, "  ", "    ")
        if r.get("derivation"):
            lines.append("    derivation:")
            lines += ["      " + ln for ln in str(r["derivation"]).splitlines()]
    return lines


def _th(cols: dict, keys) -> str:
    e = html.escape
    return "<tr>" + "".join(f'<th title="{e(cols[k][1])}">{e(cols[k][0])}</th>'
                            for k in keys) + "</tr>"


def render_html(data: dict) -> str:
    """A report dict as an HTML fragment (every user string escaped)."""
    e = html.escape
    if "leaves" not in data:
        return f'<div class="symgrad-report"><p>{e(str(data.get("error", "no report")))}' \
               "</p></div>"
    ok = bool(data.get("ok"))
    mode = data.get("mode", "?")
    color = "#1a7f37" if ok else "#cf222e"
    seconds = data.get("seconds")
    secs = f"{seconds:.2f}" if isinstance(seconds, (int, float)) else str(seconds)
    parts = [f'<div class="symgrad-report"><p><b style="color:{color}">'
             f'{e(headline(data))}</b> &mdash; mode {e(str(mode))}, '
             f"backend {e(str(data.get('backend', '?')))}, order {e(str(data.get('order', 1)))},"
             f" {e(secs)} s</p>"]
    if data.get("status") in ONE_LINE_STATUSES:  # nothing was checked: the one line
        return "".join(parts + [f"<p>{e(str(n))}</p>" for n in data.get("notes") or []]
                       + ["</div>"])
    nodes = _with_labels(data)
    first = _first_bad(data, nodes)
    if first is not None:
        parts.append(f"<p>first bad node: <code>{e(first['label'])}</code>"
                     + (f" &mdash; {e(node_detail(first['detail']))}" if first.get("detail")
                        else "")
                     + "</p>")
    leaves = list(data.get("leaves") or [])
    fd_vs = "engine" if mode == "local" else "symbolic"
    cols = [c for c in _LEAF_FULL
            if c != "bound" or any(lf.get("bound") is not None for lf in leaves)]
    if leaves:
        parts.append("<table><thead>" + _th(LEAF_COLUMNS, cols) + "</thead><tbody>")
        for lf in leaves:
            cells = _leaf_cells(lf)
            parts.append("<tr>" + "".join(f"<td>{e(str(cells[c]))}</td>" for c in cols)
                         + "</tr>")
        parts.append("</tbody></table>")
        for lf in leaves:
            if lf.get("detail"):
                parts.append(f"<p><small>{e(str(lf.get('name', '?')))} "
                             f"({e(str(lf.get('status', '')))}): {e(str(lf['detail']))}"
                             "</small></p>")
        parts.append('<p class="symgrad-legend"><small>' + e("; ".join(
            f"{LEAF_COLUMNS[c][0]}: {_leaf_column_text(c, fd_vs)}" for c in cols)) + "; -: not "
            "computed. " + e(_tolerance_text(data)) + "</small></p>")
    if any(n.get("status") != "not run" for n in nodes):
        ncols = ["node", "status", "reference", "abs", "bound", "rel", "formula", "detail"]
        if not any(n.get("bound") is not None for n in nodes):
            ncols.remove("bound")
        parts.append("<table><thead>" + _th(NODE_COLUMNS, ncols) + "</thead><tbody>")
        for n in sorted(nodes, key=lambda n: n["position"] or 0):
            mark = " (first bad)" if first is not None and n is first else ""
            cell = {"node": n["label"], "status": n.get("status", "") + mark,
                    "reference": n["reference"], "abs": _fmt(n.get("max_abs_err"), 3),
                    "bound": _fmt(n.get("bound"), 3), "rel": _fmt(n.get("max_rel_err"), 3),
                    "formula": n.get("formula") or "-",
                    "detail": (n.get("detail") or "") + (" (sampled)" if n.get("sampled")
                                                         else "")}
            parts.append("<tr>" + "".join(f"<td>{e(str(cell[c]))}</td>" for c in ncols)
                         + "</tr>")
        parts.append("</tbody></table>")
    hvp = list(data.get("hvp") or [])
    if hvp:
        parts.append("<table><thead><tr><th>leaf</th><th>Hessian-vector product check</th>"
                     "<th>max abs err</th></tr></thead><tbody>")
        for h in hvp:
            parts.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
                h.get("name", "?"), h.get("status", ""), _fmt(h.get("max_abs_err"), 3)))
                + "</tr>")
        parts.append("</tbody></table>")
    compiled = list(data.get("compiled") or [])
    if compiled:
        parts.append("<table><thead><tr><th>compiled kernel</th><th>kind</th><th>status</th>"
                     "<th>detail</th><th>derivation</th></tr></thead><tbody>")
        for r in compiled:
            parts.append("<tr>" + "".join(f"<td>{e(str(r.get(c) or ''))}</td>" for c in (
                "name", "kind", "status", "detail")) + "<td><pre>"
                + e(str(r.get("derivation") or "")) + "</pre></td></tr>")
        parts.append("</tbody></table>")
    for n in list(data.get("notes") or []) + [f"skipped: {s}" for s in data.get("skipped")
                                              or []]:
        parts.append(f"<p><i>{e(n)}</i></p>")
    parts.append("</div>")
    return "".join(parts)


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
