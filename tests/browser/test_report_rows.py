"""Rows of the labextension's tables, read from the rendered page (the Inspector's view in
headless Chromium: the test bundle of test_renderer.py, the code the JupyterLab renderer
runs), on real reports:

* a compiled step's ``step.verify()`` report: its ``compiled`` rows (each fused kernel and
  generated gradient) drawn as rows with a verdict badge, like the leaves and nodes, the
  bad kernel named above them and its derivation folded in its row (they were notes);
* an agreement whose leaf has an exact gradient of 0 (an attention head's key bias): its
  relative-error cell says "exact 0", never 1e25, in the graph's agreement table and in the
  report's leaf table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest
from test_renderer import _page, bundle, mount, valid  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]
REPORT_SCHEMA = REPO / "symgrad" / "symbolic" / "report.schema.json"


@pytest.fixture(scope="module")
def page(browser, bundle):  # noqa: F811 (the test bundle from test_renderer)
    pg = _page(browser, bundle)
    yield pg
    assert pg.errors == []
    pg.close()


def _tests_path():
    sys.path.insert(0, str(REPO / "tests"))


def _compiled_report() -> dict:
    """step.verify() of a compiled step whose fused kernel has a planted wrong
    derivative (tests/test_compile_verify_report.py's)."""
    _tests_path()
    import test_compile_verify_report as steps

    import symgrad as sg

    mp = pytest.MonkeyPatch()
    try:
        steps._no_checks_at_generation(mp)
        steps._plant_wrong_mul(mp)
        step = steps._step()
        step(sg.randn(6, 5))
        data = step.verify().to_json()
    finally:
        mp.undo()
    jsonschema.validate(data, json.loads(REPORT_SCHEMA.read_text()))
    return data


ROWS_JS = """sel => [...document.querySelectorAll(sel + ' tbody tr')].map(tr => ({
  key: tr.dataset.key, status: tr.dataset.status, bad: tr.dataset.bad === 'true',
  cells: [...tr.children].map(td => td.textContent),
  badge: (tr.querySelector('.sg-badge') || {}).textContent || null,
  visible: tr.getBoundingClientRect().height > 0}))"""


def test_compiled_rows_are_rows_with_verdicts(page):
    data = _compiled_report()
    assert data["bad_kernel"] == "fused_0"
    _tests_path()
    import sg_payloads as payloads

    mount(page, valid(payloads.tutorial()), report=data)
    page.click(".sg-report-details > summary")  # the Inspector folds its full report
    rows = page.evaluate(ROWS_JS, "[data-symgrad=report-compiled]")
    assert [r["key"] for r in rows] == [c["name"] for c in data["compiled"]]
    want = {"ok": "pass", "wrong": "fail", "mismatch": "fail", "not proved": "none"}
    for r, c in zip(rows, data["compiled"]):
        assert r["visible"], r
        assert r["status"] == want[c["status"]]
        assert c["status"] in r["badge"]
        assert r["cells"][1] == c["kind"]
        assert r["bad"] == (c["name"] == data["bad_kernel"])
    bad = next(r for r in rows if r["bad"])
    assert "differs from SymPy's derivative" in bad["cells"][3]
    assert "def fused_0" in bad["cells"][4]  # the derivation, folded in its row
    section = page.locator("[data-symgrad=report] .sg-section", has_text="Compiled step")
    assert section.text_content() == "Compiled step: fused_0 disagrees"
    assert page.get_attribute("[data-symgrad=report] [data-symgrad=overall]",
                              "data-status") == "fail"


def test_exact_zero_leaf_says_so_in_both_tables(page):
    _tests_path()
    from test_exact_zero_rows import attention_with_biases

    import symgrad as sg
    from symgrad.jupyter.graph import apply_report, graph_json

    loss, names = attention_with_biases()
    report = sg.verify(loss, names=names, mode="exact")
    node_map: dict[int, str] = {}
    payload = graph_json(loss, names, node_map=node_map)
    apply_report(payload, report, node_map)
    mount(page, valid(payload), report=report.to_json())

    # the graph's agreement table: leaf, status, engine, symbolic, fd, abs, rel
    agree = {r["cells"][0]: r for r in page.evaluate(ROWS_JS, "[data-symgrad=agreement]")}
    assert set(agree) == set(names)
    assert agree["bk"]["cells"][-1] == "exact 0" and agree["bk"]["status"] == "pass"
    assert agree["b"]["cells"][-1].endswith("(+2 exact 0)")
    assert float(agree["b"]["cells"][-1].split()[0]) < 1
    assert float(agree["bv"]["cells"][-1]) < 1
    # the report's leaf table: ..., max abs err, max rel err, worst
    leaves = {r["key"]: r for r in page.evaluate(ROWS_JS, "[data-symgrad=report-leaves]")}
    assert leaves["bk"]["cells"][7] == "exact 0"
    assert leaves["b"]["cells"][7].endswith("(+2 exact 0)")
    assert "e+" not in "".join(r["cells"][7] for r in leaves.values())
