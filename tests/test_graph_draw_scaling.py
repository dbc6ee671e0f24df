"""Big graphs draw in time linear in their size (issue 30, scope 4), counted, never timed.

Drawing a 2,000-node chain took minutes: every node derived its formula with SymPy anew
(``nsimplify`` of the loop's constant alone is ~25 ms). Formulas are now derived once per
(op, scalar operands, arguments) and filled with each node's names; distinct derivations
stop at a budget, which the payload and the views state. The layout and the static SVG
were already linear; these tests pin all of it by counting work: SymPy derivations,
Python and builtin calls per node, and dictionary operations on each node's id.
Timings are in ``benchmarks/bench_graph_draw.py``.
"""

from __future__ import annotations

import importlib
import sys
from collections import Counter

import pytest

import symgrad as sg
from symgrad.jupyter import layout as L
from symgrad.jupyter import load_schema
from symgrad.jupyter.svg import render_html

G = importlib.import_module("symgrad.jupyter.graph")
jsonschema = pytest.importorskip("jsonschema")


def chain(loops: int, x=None):
    x = sg.randn(3, requires_grad=True) if x is None else x
    y = x
    for _ in range(loops):
        y = (y * 1.001).tanh()
    return x, y.sum()


def fan(width: int):
    x = sg.randn(3, requires_grad=True)
    return sg.stack([(x * sg.randn(3, requires_grad=True)).tanh() for _ in range(width)]).sum()


def fold(width: int):
    """Branches folded into a deep add chain, all sharing the leaf ``x``: long edges."""
    x = sg.randn(3, requires_grad=True)
    total = (x * sg.randn(3, requires_grad=True)).tanh()
    for _ in range(width - 1):
        total = total + (x * sg.randn(3, requires_grad=True)).tanh()
    return total.sum()


@pytest.fixture
def derivations(monkeypatch):
    """The SymPy derivations graph_json runs (op names), from a cold formula cache."""
    calls: list[str] = []
    real = G._derive_latex

    def counted(spec, *args):
        calls.append(spec.name)
        return real(spec, *args)

    monkeypatch.setattr(G, "_LATEX_CACHE", {})
    monkeypatch.setattr(G, "_derive_latex", counted)
    return calls


def test_a_loop_derives_each_formula_once(derivations):
    x, y = chain(1000)
    p = G.graph_json(y, {"x": x}, max_nodes=10**6)
    ops = [n for n in p["nodes"] if n["kind"] == "op"]
    assert len(ops) == 2001
    # one derivation per distinct (op, scalar operands): the loop's mul and tanh (the sum
    # has a written formula_tex line, no SymPy)
    assert Counter(derivations) == Counter({"mul": 1, "tanh": 1})
    assert all(n["formula"] and n["derivative"] for n in ops)
    assert "formulas_omitted" not in p
    # each node still shows its own names: only the first mul reads the leaf x
    muls = [n["formula"] for n in ops if n["label"] == "MulBackward0"]
    assert muls.count(r"y = \frac{1001 x}{1000}") == 1
    assert muls.count(r"y = \frac{1001 \mathrm{self}}{1000}") == 999


def test_a_cached_formula_is_the_one_a_fresh_derivation_gives(derivations):
    """Same op, other names, other constants: one entry serves nodes whose LaTeX differs
    only in names; a different scalar operand or argument is a different formula."""
    a, b, c, d = (sg.tensor([0.5, 1.5], requires_grad=True) for _ in range(4))
    y = (a * b).sum() + (c * d).sum() + (a * 2.5).sum() + (c * 3).sum() + (a ** 3).sum() \
        + (c ** 2.0).sum() + (a * float("nan")).sum()
    names = dict(a=a, b=b, c=c, d=d, w1=a)
    p = G.graph_json(y, names)
    formulas = sorted((n["formula"], n["derivative"]) for n in p["nodes"]
                      if n["label"] in ("MulBackward0", "PowBackward0"))
    assert (r"y = a b", r"\frac{\partial y}{\partial a} = b,\quad "
            r"\frac{\partial y}{\partial b} = a") in formulas
    assert (r"y = c d", r"\frac{\partial y}{\partial c} = d,\quad "
            r"\frac{\partial y}{\partial d} = c") in formulas
    assert (r"y = \frac{5 a}{2}", r"\frac{\partial y}{\partial a} = \frac{5}{2}") in formulas
    assert (r"y = 3 c", r"\frac{\partial y}{\partial c} = 3") in formulas
    assert (r"y = a^{3}", r"\frac{\partial y}{\partial a} = 3 a^{2}") in formulas
    assert (r"y = c^{2.0}", r"\frac{\partial y}{\partial c} = 2.0 c^{1.0}") in formulas
    assert (r"y = \mathrm{nan} a", r"\frac{\partial y}{\partial a} = \mathrm{nan}") in formulas
    first = len(derivations)
    assert Counter(derivations)["mul"] == 4  # a*b and c*d share one
    # drawn again: nothing derived, the same payload
    assert G.graph_json(y, names) == p and len(derivations) == first


def test_the_formula_budget_bounds_sympy_work_and_the_views_say_so(derivations):
    x = sg.randn(3, requires_grad=True)
    y = x
    for i in range(100):  # a distinct constant at every mul: nothing to share
        y = (y * float(i + 2)).tanh()
    p = G.graph_json(y.sum(), {"x": x}, max_nodes=10**6, formula_budget=20)
    ops = [n for n in p["nodes"] if n["kind"] == "op"]
    assert len(derivations) == 20 and Counter(derivations) == {"tanh": 1, "mul": 19}
    muls = [n for n in ops if n["label"] == "MulBackward0"]
    with_formula = [n for n in muls if n["formula"]]
    assert len(with_formula) == 19 and p["formulas_omitted"] == len(muls) - 19 == 81
    # the budget goes to the nodes nearest the root (what the view shows first)
    assert {n["id"] for n in with_formula} == {n["id"] for n in sorted(
        muls, key=lambda n: n["order"])[:19]}
    # a formula already derived costs nothing: every tanh and the sum (formula_tex) have one
    assert all(n["formula"] for n in ops if n["label"] != "MulBackward0")
    jsonschema.validate(p, load_schema())
    assert "81 nodes shown without a formula" in render_html(p)
    full = G.graph_json(y.sum(), {"x": x}, max_nodes=10**6, formula_budget=400)
    assert "formulas_omitted" not in full and all(n["formula"] for n in full["nodes"]
                                                  if n["kind"] == "op")


def _calls(fn) -> int:
    """Python and builtin function calls made by ``fn()``: the work, as a count."""
    count = 0

    def prof(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


@pytest.mark.parametrize("family,small,big", [
    ("chain", 100, 400), ("fan", 100, 400), ("fold", 100, 400)])
def test_drawing_costs_a_bounded_number_of_calls_per_node(family, small, big):
    """graph_json + the bundle (layout, static SVG/HTML, outline) of a graph 4x bigger
    costs at most 4x the calls: the per-node count does not grow with the graph (it did
    not when SymPy ran per node either; the formula tests above pin that part)."""
    build = {"chain": lambda n: chain(n)[1], "fan": fan, "fold": fold}[family]
    per_node = []
    for n in (small, big):
        root = build(n)

        def draw(root=root):
            G.mimebundle(G.graph_json(root, max_nodes=10**6))

        draw()  # warm: formula cache, lazy imports
        size = len(G.graph_json(root, max_nodes=10**6)["nodes"])
        assert size > L.AUTO_COLLAPSE_NODES  # both sizes take the big-graph path
        per_node.append(_calls(draw) / size)
    assert per_node[1] <= per_node[0], per_node


class _Id(str):
    """A node id that counts the dictionary operations made with it (each hashes it)."""

    counts: Counter = Counter()

    def __hash__(self) -> int:
        _Id.counts[str(self)] += 1
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        _Id.counts[str(self)] += 1
        return str.__eq__(self, other)


def _counted_payload(root) -> dict:
    p = G.graph_json(root, max_nodes=10**6)
    ids = {n["id"]: _Id(n["id"]) for n in p["nodes"]}
    for n in p["nodes"]:
        n["id"] = ids[n["id"]]
    for e in p["edges"]:
        e["from"], e["to"] = ids[e["from"]], ids[e["to"]]
    p["roots"] = [ids[r] for r in p["roots"]]
    return p


@pytest.mark.parametrize("family", ["chain", "fold"])
def test_layout_touches_each_node_a_bounded_number_of_times(family):
    """The layout and SVG of a 2,000-node graph touch each node's id no more often (per
    edge it has) than those of a 500-node graph of the same shape do: nothing scans all
    nodes per node. (In ``fold`` one leaf has an edge from every branch.)"""
    build = {"chain": lambda n: chain(n)[1], "fold": fold}[family]
    most = []
    for n in (250, 1000) if family == "chain" else (125, 500):
        p = _counted_payload(build(n))
        degree = Counter(str(e[k]) for e in p["edges"] for k in ("from", "to"))
        _Id.counts.clear()
        render_html(G.with_layout(p))
        assert len(p["nodes"]) > L.AUTO_COLLAPSE_NODES
        assert set(_Id.counts) == {str(n["id"]) for n in p["nodes"]}  # all were drawn
        most.append(max(c / (1 + degree[i]) for i, c in _Id.counts.items()))
    assert most[1] <= most[0], most


def test_a_2000_node_chain_is_laid_out_uncollapsed_in_linear_work():
    """The layout itself, on an uncollapsed 2,000-node chain (a view that expands every
    chain): each node's id is used a bounded number of times, the same as at 500."""
    most = []
    for n in (500, 2000):
        ids = [_Id(f"n{i}") for i in range(n)]
        edges = list(zip(ids, ids[1:]))
        _Id.counts.clear()
        lay = L.layout(ids, edges)
        assert len(lay.boxes) == n and len(lay.layers) == n
        most.append(max(_Id.counts.values()))
    assert most[1] <= most[0], most
