"""A leaf whose exact gradient is 0 has no relative error (issue 30's GPT: the key part of
``c_attn.bias`` showed ``max rel err 1.93e+25`` beside a pass badge, the engine's 4e-19
against SymPy's cancellation residue 2e-44). The report leaves such elements out of
``max_rel_err``, counts them in ``exact_zeros``, and every table says "exact 0" where the
whole gradient is 0: the text report, the report's HTML, the graph payload's agreement
rows and the static SVG view's table (the labextension's: tests/browser/test_exact_zero_page.py).

The graph is real: one attention head whose keys carry a bias. Softmax does not change
when one constant is added to a row of scores, so the gradient of the key bias is exactly
0, while the value bias's is not; a third bias, split across both, has both kinds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

import symgrad as sg
from symgrad.jupyter.graph import apply_report, graph_json, load_schema
from symgrad.jupyter.svg import agreement_table_html

REPORT_SCHEMA = Path(sg.__file__).parent / "symbolic" / "report.schema.json"


def attention_with_biases():
    """loss of one causal-free attention head over 3 tokens; leaves by name."""
    sg.manual_seed(0)
    x = sg.randn(3, 2, dtype=sg.float64)
    wq, wk, wv = (sg.randn(2, 2, dtype=sg.float64, requires_grad=True) for _ in range(3))
    bk = sg.randn(2, dtype=sg.float64, requires_grad=True)   # gradient exactly 0
    bv = sg.randn(2, dtype=sg.float64, requires_grad=True)   # gradient not 0
    b = sg.randn(4, dtype=sg.float64, requires_grad=True)    # [key part | value part]
    q = x @ wq
    k = x @ wk + bk + b[:2]
    v = x @ wv + bv + b[2:]
    att = sg.softmax(q @ k.T, dim=-1)
    loss = ((att @ v) ** 2).sum()
    return loss, {"wq": wq, "wk": wk, "wv": wv, "bk": bk, "bv": bv, "b": b}


@pytest.fixture(scope="module")
def verified():
    loss, names = attention_with_biases()
    report = sg.verify(loss, names=names, mode="exact")
    return loss, names, report


def test_report_rows(verified):
    _, _, report = verified
    assert report.ok
    rows = {r.name: r for r in report.leaves}
    # bk: every element's exact gradient is 0, so no relative error at all
    assert rows["bk"].exact_zeros == 2 and rows["bk"].max_rel_err is None
    assert rows["bk"].max_abs_err is not None and rows["bk"].status == "ok"
    # b: half of it is a key bias; its relative error is over the value half only, where
    # it is a relative error of float64 rounding (below 1), not 1e25
    assert rows["b"].exact_zeros == 2
    assert rows["b"].max_rel_err is not None and rows["b"].max_rel_err < 1
    for name in ("wq", "wk", "wv", "bv"):
        assert rows[name].exact_zeros == 0 and rows[name].max_rel_err < 1, name
    data = report.to_json()
    jsonschema.validate(data, json.loads(REPORT_SCHEMA.read_text()))
    by_name = {r["name"]: r for r in data["leaves"]}
    assert by_name["bk"]["exact_zeros"] == 2 and by_name["bk"]["max_rel_err"] is None


def _row_line(text: str, name: str) -> str:
    lines = [ln for ln in text.splitlines() if re.match(rf"\s*{name}\s", ln)]
    assert len(lines) == 1, (name, text)
    return lines[0]


def test_text_and_html_report_say_exact_zero(verified):
    _, _, report = verified
    text = report.to_text() if hasattr(report, "to_text") else str(report)
    assert "exact 0" in _row_line(text, "bk")
    assert "(+2 exact 0)" in _row_line(text, "b")
    assert "exact 0" not in _row_line(text, "bv")
    html = report._repr_html_()
    assert re.search(r"<td[^>]*>exact 0</td>", html)
    assert "e+2" not in html  # no huge relative error anywhere


def test_graph_payload_and_static_table(verified):
    loss, names, report = verified
    node_map: dict[int, str] = {}
    payload = graph_json(loss, names, node_map=node_map)
    apply_report(payload, report, node_map)
    jsonschema.validate(payload, load_schema())
    rows = {r["leaf"]: r for r in payload["agreement"]["rows"]}
    assert rows["bk"]["exact_zeros"] == 2 and rows["bk"]["max_rel_err"] is None
    html = agreement_table_html(payload["agreement"])
    row = r'data-leaf="(\w+)".*?<td>[^<]*</td>(?:<td>.*?</td>){4}<td>([^<]*)</td>'
    cells = dict(re.findall(row, html))
    assert cells["bk"] == "exact 0", cells
    assert cells["b"].endswith("(+2 exact 0)") and float(cells["b"].split()[0]) < 1
    assert "exact" not in cells["bv"]
