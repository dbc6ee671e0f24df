"""One truth per leaf: every agreement row is about the leaf it names and links to.

A row's worst element must be an index of *its* leaf's shape, and its engine value that
leaf's ``.grad`` there. Checked on every notebook in notebooks/ (their cells run in an
IPython shell with the extension loaded: the ``%%symgrad`` graphs and every
``sg.verify`` report) and on random MLPs and CNNs whose leaves nobody named (``t0, t1
...``, where the graph view and the verifier used to number leaves in two orders, so the
row ``t0`` of a weight was drawn on the bias the graph called ``t0``).
"""

from __future__ import annotations

import ast
import json
import pathlib
import re

import numpy as np
import pytest

import symgrad as sg
from symgrad import nn
from symgrad.jupyter.graph import _fmt, apply_report, graph_json

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"


def _grad_array(t) -> np.ndarray:
    g = t.grad
    assert g is not None, "a leaf with a row has a .grad"
    if isinstance(g, sg.Tensor):
        return np.asarray(g.detach().cpu()._data)
    return g.detach().cpu().numpy()  # torch


def _shape(t) -> tuple:
    return tuple(int(s) for s in t.shape)


def _parse_at(text: str) -> tuple[str, tuple]:
    """``"0.25 at [1, 0]"`` -> (``"0.25"``, (1, 0)); a scalar leaf's text has no index."""
    m = re.fullmatch(r"(.+?)(?: at (\[[0-9, ]*\]))?", text)
    assert m, text
    return m.group(1), tuple(ast.literal_eval(m.group(2))) if m.group(2) else ()


def check_payload_rows(payload: dict, node_map: dict, tensors: list) -> int:
    """Every row of the payload's agreement table against the tensor drawn at its node
    (``node_map``: what graph_json put where). Returns the number of rows checked."""
    at_node = {node_map[id(t)]: t for t in tensors if id(t) in node_map}
    label = {n["id"]: n["label"] for n in payload["nodes"]}
    leaf_shape = {lf["id"]: lf["shape"] for lf in payload["leaves"]}
    checked = 0
    for row in (payload.get("agreement") or {}).get("rows", []):
        nid = row["node"]
        assert nid is not None, f"row {row['leaf']} links to no leaf"
        t = at_node[nid]
        assert row["leaf"] == label[nid], (row["leaf"], label[nid])  # one name
        assert leaf_shape[nid] == list(_shape(t))
        if row["engine"] is None:
            continue
        value, index = _parse_at(row["engine"])
        assert len(index) == len(_shape(t)) and all(
            0 <= i < n for i, n in zip(index, _shape(t))), \
            f"row {row['leaf']}: index {list(index)} is not an index of shape {_shape(t)}"
        assert value == _fmt(float(_grad_array(t)[index])), (row, _grad_array(t)[index])
        checked += 1
    return checked


def grads_now(report) -> dict[int, np.ndarray]:
    """The .grad of every leaf a report's rows hold, copied when the report was made (a
    notebook may run backward again on the same model afterwards)."""
    return {id(row.tensor): _grad_array(row.tensor).copy() for row in report.leaves
            if row.tensor is not None and row.tensor.grad is not None}


def check_report_rows(report, grads: dict[int, np.ndarray] | None = None) -> int:
    """Every leaf row of a verifier Report against the tensor it holds (its gradient as
    ``grads`` saw it when the report was made; else its .grad now)."""
    checked = 0
    for row in report.leaves:
        t = row.tensor
        assert t is not None and row.name in {lf.name for lf in report._graph.leaves}
        assert tuple(row.shape) == _shape(t)
        had_grad = t.grad is not None if grads is None else id(t) in grads
        if row.worst_index is None or row.engine_value is None or not had_grad:
            continue
        index = tuple(int(i) for i in row.worst_index)
        assert len(index) == len(_shape(t)) and all(
            0 <= i < n for i, n in zip(index, _shape(t))), (row.name, index, _shape(t))
        g = grads[id(t)] if grads is not None else _grad_array(t)
        assert row.engine_value == float(g[index]), (row.name, row.engine_value, g[index])
        checked += 1
    return checked


# -- random graphs with unnamed leaves -------------------------------------------------------

def _unnamed_mlp(rng):
    sizes = [int(rng.integers(2, 6)) for _ in range(int(rng.integers(3, 5)))]
    ps = []
    for a, b in zip(sizes, sizes[1:]):
        ps.append(sg.tensor(rng.normal(size=(b, a)), requires_grad=True))
        ps.append(sg.tensor(rng.normal(size=(b,)), requires_grad=True))
    h = sg.tensor(rng.normal(size=(int(rng.integers(2, 5)), sizes[0])))
    for k in range(0, len(ps), 2):
        h = (h @ ps[k].t() + ps[k + 1]).tanh()
    return h.pow(2).sum(), ps


def _unnamed_cnn(rng):
    c1, c2 = int(rng.integers(1, 3)), int(rng.integers(2, 4))
    ps = [sg.tensor(rng.normal(size=(c2, c1, 2, 2)), requires_grad=True),
          sg.tensor(rng.normal(size=(c2,)), requires_grad=True)]
    x = sg.tensor(rng.normal(size=(2, c1, 4, 4)))
    h = nn.functional.conv2d(x, ps[0], ps[1]).relu()
    h = h.reshape(2, -1)
    ps += [sg.tensor(rng.normal(size=(3, h.shape[1])), requires_grad=True),
           sg.tensor(rng.normal(size=(3,)), requires_grad=True)]
    return (h @ ps[2].t() + ps[3]).sin().sum(), ps


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("build", [_unnamed_mlp, _unnamed_cnn])
def test_rows_of_unnamed_leaves_are_on_their_own_leaf(build, seed):
    rng = np.random.default_rng(seed)
    with sg.record():
        loss, ps = build(rng)
    loss.backward()
    node_map: dict = {}
    payload = graph_json(loss, namespace={}, node_map=node_map)
    names = {lf["name"] for lf in payload["leaves"]}
    assert len(names) == len(ps) and all(re.fullmatch(r"t\d+", n) for n in names)
    report = sg.verify(loss, namespace={})
    assert report.ok, str(report)
    assert sorted(r.name for r in report.leaves) == sorted(names)
    apply_report(payload, report, node_map)
    assert check_payload_rows(payload, node_map, ps) == len(ps)
    assert check_report_rows(report) == len(ps)
    # a JSON report (no objects): rows are matched by the names both sides share
    again = graph_json(loss, namespace={}, node_map={})
    apply_report(again, json.loads(json.dumps(report.to_json())))
    assert [(r["leaf"], r["node"]) for r in again["agreement"]["rows"]] == \
        [(r["leaf"], r["node"]) for r in payload["agreement"]["rows"]]


def test_inspector_rows_are_on_their_own_leaf():
    pytest.importorskip("ipywidgets")
    from symgrad.jupyter.widget import Inspector

    rng = np.random.default_rng(7)
    with sg.record():
        loss, ps = _unnamed_cnn(rng)
    loss.backward()
    ins = Inspector(loss, namespace={}, background=False)
    try:
        assert ins.status == "done", ins.message
        assert check_payload_rows(ins.graph, ins._node_map, ps) == len(ps)
        # the badge of each leaf is its own row's status
        rows = {r["node"]: r for r in ins.agreement_rows()}
        assert len(rows) == len(ps) and all(r["status"] == "pass" for r in rows.values())
    finally:
        ins.close()


# -- every notebook ---------------------------------------------------------------------------

def _code_cells(path: pathlib.Path) -> list[tuple[str, bool]]:
    """(source, whether the cell raises on purpose) of each code cell."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [("".join(c["source"]), "raises-exception" in c.get("metadata", {}).get("tags", []))
            for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    created = not InteractiveShell.initialized()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "symgrad")
    yield ip
    ip.reset()
    if created:
        InteractiveShell.clear_instance()


@pytest.mark.parametrize("notebook", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_notebook_rows_are_on_their_own_leaf(notebook, shell, monkeypatch):
    """Each notebook's cells in order; every %%symgrad agreement table and every
    ``sg.verify`` report it makes is checked row by row."""
    import symgrad.jupyter.magics as magics
    import symgrad.symbolic as symbolic

    monkeypatch.chdir(NOTEBOOKS)
    tables: list = []
    reports: list = []
    real_apply, real_verify = magics.apply_report, symbolic.verify

    def spy_apply(payload, report, node_map=None, local=None):
        out = real_apply(payload, report, node_map, local)
        tables.append((payload, node_map, [lf.tensor for lf in report._graph.leaves]))
        return out

    def spy_verify(*args, **kwargs):
        rep = real_verify(*args, **kwargs)
        reports.append((rep, grads_now(rep)))
        return rep

    monkeypatch.setattr(magics, "apply_report", spy_apply)
    monkeypatch.setattr(symbolic, "verify", spy_verify)
    errors = []
    cells = _code_cells(NOTEBOOKS / notebook)
    for src, raises in cells:
        result = shell.run_cell(src)
        if not result.success and not raises:
            errors.append((src[:80], repr(result.error_in_exec or result.error_before_exec)))
    assert not errors, errors
    rows = sum(check_payload_rows(p, m, ts) for p, m, ts in tables)
    rows += sum(check_report_rows(r, g) for r, g in reports)
    magic_cells = sum("%%symgrad" in src for src, _ in cells)
    assert len(tables) >= magic_cells  # every %%symgrad cell's table was checked
    if magic_cells or reports:
        assert rows > 0
