"""A NaN cell gets its own verdict (issue 29, scope 7).

``log`` and ``sqrt`` of ``[-1, 0, 4]`` make the gradient nan/inf at two elements. The
report used to list the leaf twice (an ``ok`` row for the finite element and a
``non-finite`` row), the graph views said "gradients disagree", and "node rebuilt from the
recorded inputs" was a note per node. Now: one row per leaf, the verdict "non-finite: arose
in: ..." in every view, and one note saying how many nodes were rebuilt.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import symgrad as sg
from symgrad.jupyter import graph_json
from symgrad.jupyter.graph import apply_report, text_outline
from symgrad.jupyter.svg import render_html

jsonschema = pytest.importorskip("jsonschema")
ROOT = Path(sg.__file__).parent
REPORT_SCHEMA = json.loads((ROOT / "symbolic" / "report.schema.json").read_text())
GRAPH_SCHEMA = json.loads((ROOT / "jupyter" / "graph.schema.json").read_text())


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def nan_cell(dtype=sg.float32):
    a = sg.tensor([-1., 0., 4.], dtype=dtype, requires_grad=True)
    b = a.log()
    c = a.sqrt()
    d = (b + c).sum()
    d.backward()
    return a, d


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_each_leaf_is_listed_once_with_the_non_finite_verdict(mode):
    a, d = nan_cell()
    rep = sg.verify(d, names={"a": a}, mode=mode)
    assert rep.status == "non-finite" and not rep.ok
    (row,) = rep.leaves  # one row for a, not an ok row and a non-finite row
    assert row.name == "a" and row.status == "non-finite"
    idx = tuple(row.worst_index)
    grad = a.grad.numpy()
    assert not np.isfinite(grad[idx])  # the row shows a non-finite element of a.grad
    assert np.isnan(row.engine_value) if np.isnan(grad[idx]) else row.engine_value == grad[idx]
    assert "arose in: the forward of LogBackward0 gives nan at [0]" in row.detail
    verdict = rep.notes[0]
    assert verdict.startswith("non-finite: arose in: the forward of LogBackward0 gives nan")
    assert verdict.endswith("(gradient of a)")
    assert sum(n.startswith("non-finite") or n.startswith("a: ") for n in rep.notes) == 1
    text = rep.to_text()
    assert text.splitlines()[0].startswith("symgrad.verify: NON-FINITE")
    assert "disagree" not in text.lower()
    data = rep.to_json()
    jsonschema.validate(data, REPORT_SCHEMA)
    assert [lf["name"] for lf in data["leaves"]] == ["a"]


def test_a_mismatch_with_non_finite_elements_stays_a_mismatch(monkeypatch):
    """Folding the non-finite elements into the row never hides a wrong rule."""
    from symgrad.ops.registry import OPS

    monkeypatch.setitem(OPS["add"].grads, "other", lambda grad, alpha: grad * 2)
    monkeypatch.setattr(OPS["add"], "fused_backward", None, raising=False)
    a, d = nan_cell(sg.float64)
    rep = sg.verify(d, names={"a": a})
    assert rep.status == "mismatch" and not rep.ok
    (row,) = rep.leaves
    assert row.status == "mismatch" and "elements non-finite" in row.detail


def test_graph_views_say_non_finite_not_disagree():
    a, d = nan_cell()
    names = {"a": a}
    rep = sg.verify(d, names=names)
    node_map: dict = {}
    payload = graph_json(d, names, node_map=node_map)
    apply_report(payload, rep, node_map)
    jsonschema.validate(payload, GRAPH_SCHEMA)
    ag = payload["agreement"]
    assert ag["ok"] is None  # neither agreement nor disagreement
    assert ag["verdict"].startswith("non-finite: arose in: the forward of LogBackward0")
    assert [r["leaf"] for r in ag["rows"]] == ["a"]
    assert ag["rows"][0]["status"] == "error"
    head = text_outline(payload).splitlines()[0]
    assert "non-finite: arose in" in head and "DISAGREE" not in head
    html = render_html(payload)
    assert "non-finite: arose in" in html and "gradients DISAGREE" not in html


def test_inspector_status_says_non_finite():
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from symgrad.jupyter import Inspector

    a, d = nan_cell()
    w = Inspector(d, {"a": a})
    status = w.static_parts()["status"]
    assert "non-finite: arose in" in status and "disagree" not in status
    w.close()


def test_rebuilt_nodes_are_one_note():
    a, d = nan_cell()
    rep = sg.verify(d, names={"a": a})
    rebuilt = [n for n in rep.notes if "rebuilt from the recorded inputs" in n]
    assert rebuilt == ["graph was freed: 2 nodes rebuilt from the recorded inputs "
                       "(LogBackward0, SqrtBackward0)"]


def test_symgrad_cell_with_nan(capsys):
    """The NaN cell of the issue through %%symgrad (terminal IPython)."""
    from IPython.core.interactiveshell import InteractiveShell

    created = not InteractiveShell.initialized()
    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "symgrad")
        ip.run_cell("import symgrad as sg")
        capsys.readouterr()
        ip.run_cell("%%symgrad\na = sg.tensor([-1., 0., 4.], requires_grad=True)\n"
                    "b = a.log()\nc = a.sqrt()\nd = (b + c).sum()\nd.backward()")
        out, _ = capsys.readouterr()
        flat = " ".join(out.split())
        assert "non-finite: arose in: the forward of LogBackward0" in flat
        assert "DISAGREE" not in out and "disagree" not in out
        assert "symgrad.verify: NON-FINITE" in out
        assert flat.count("a 3 float32") == 1  # the leaf's row, once
        assert flat.count("rebuilt from the recorded inputs") <= 1
    finally:
        if created:
            InteractiveShell.clear_instance()
