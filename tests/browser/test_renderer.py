"""The drawing module in headless Chromium, through the Inspector's anywidget front end
(symgrad/jupyter/static/inspector.js, bundled from labextension/src by esbuild), with a
fake widget model and hand-built payloads that are checked against the package schema.
No JupyterLab here: see test_lab.py for the end-to-end run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jsonschema
import pytest
import sg_payloads as payloads

from symgrad.jupyter.graph import load_schema

STATIC = Path(__file__).resolve().parents[2] / "symgrad" / "jupyter" / "static"
REPORT_SCHEMA = STATIC.parents[1] / "symbolic" / "report.schema.json"
ORIGIN = "http://symgrad.test"
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>symgrad</title></head>
<body style="margin:8px"><div id="host" style="width:1100px"></div>
<script type="module">
import widget from '/inspector.js';
// A minimal stand-in for an anywidget model: get/set/on/off/save_changes.
window.mount = (graph, selected, report) => {
  const host = document.getElementById('host');
  if (window.cleanup) { window.cleanup(); }
  host.textContent = '';
  const el = document.createElement('div');
  host.appendChild(el);
  const data = {graph, selected: selected || '', report: report || {}};
  const listeners = {};
  window.saves = 0;
  window.model = {
    get: k => data[k],
    set: (k, v) => { data[k] = v; (listeners['change:' + k] || []).forEach(f => f()); },
    save_changes: () => { window.saves += 1; },
    on: (e, f) => { (listeners[e] = listeners[e] || []).push(f); },
    off: (e, f) => { listeners[e] = (listeners[e] || []).filter(g => g !== f); },
  };
  const t0 = performance.now();
  window.cleanup = widget.render({model: window.model, el});
  return performance.now() - t0;
};
window.ready = true;
</script></body></html>"""


@pytest.fixture(scope="module")
def page(browser):
    bundle = STATIC / "inspector.js"
    if not bundle.exists():
        pytest.fail(f"{bundle} is missing: build it with `make labext` (or pip install -e .)")
    body = bundle.read_bytes()
    pg = browser.new_page(viewport={"width": 1200, "height": 900})
    pg.dialogs = []
    pg.errors = []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))

    def route(r):
        if r.request.url.endswith("/inspector.js"):
            r.fulfill(body=body, content_type="text/javascript")
        elif r.request.url.endswith("/index.html"):
            r.fulfill(body=PAGE, content_type="text/html")
        else:  # nothing else may load (an injected <img src=x> would land here)
            pg.errors.append("unexpected request " + r.request.url)
            r.fulfill(status=404, body="")

    pg.route(f"{ORIGIN}/**", route)
    pg.goto(f"{ORIGIN}/index.html")
    pg.wait_for_function("window.ready === true")
    yield pg
    assert pg.errors == []
    pg.close()


def mount(page, graph, selected=None, report=None) -> float:
    return page.evaluate("([g, s, r]) => window.mount(g, s, r)", [graph, selected, report])


def valid(payload: dict) -> dict:
    jsonschema.validate(payload, load_schema())
    return payload


def test_tutorial_graph_nodes_panel_and_badges(page, artifacts):
    mount(page, valid(payloads.tutorial()))
    view = page.locator("[data-symgrad=graph]")
    assert view.get_attribute("data-state") == "ready"
    assert page.locator(".sg-node[data-kind=op]").count() == 2
    assert page.locator(".sg-node[data-kind=accumulate]").count() == 3
    assert page.locator(".sg-edge").count() == 4
    labels = sorted(page.locator(".sg-node .sg-node-label").all_text_contents())
    assert labels == ["AddBackward0", "MulBackward0", "a", "b", "c"]
    # Each op carries its local check badge.
    assert page.locator(".sg-node[data-kind=op][data-status=pass] .sg-node-badge").count() == 2
    assert page.get_attribute("[data-symgrad=overall]", "data-status") == "pass"

    # Selecting the MulBackward0 node shows what it saved, its formula (KaTeX) and check.
    page.click(".sg-node[data-node-id=n0]")
    panel = page.locator("[data-symgrad=node-panel]")
    assert panel.get_attribute("data-selected") == "n0"
    rows = panel.locator("[data-symgrad=saved-operands] tbody tr")
    assert rows.count() == 2
    other = panel.locator("tr[data-saved-name=other]")
    assert other.locator("td").nth(0).text_content() == "_saved_other"
    assert "same object as c" in other.text_content()
    assert "tensor(4.)" in other.text_content()
    assert panel.locator(".katex").count() >= 2
    assert page.locator(".sg-node[data-node-id=n0]").get_attribute("class").count("sg-selected")
    # ... and the selection is written back to the widget model.
    assert page.evaluate("window.model.get('selected')") == "n0"
    assert page.evaluate("window.saves") == 1

    # Agreement table: one pass badge per leaf.
    table = page.locator("[data-symgrad=agreement]")
    for leaf in "abc":
        assert table.locator(f"tr[data-leaf={leaf}] .sg-badge").get_attribute(
            "data-status") == "pass"
    page.screenshot(path=str(artifacts / "renderer-tutorial.png"), full_page=True)


def test_model_selection_drives_view_and_next_functions_links(page):
    mount(page, valid(payloads.tutorial()), selected="n1")
    panel = page.locator("[data-symgrad=node-panel]")
    assert panel.get_attribute("data-selected") == "n1"
    assert "_saved_alpha" in panel.text_content()
    page.evaluate("window.model.set('selected', 'n4')")
    assert panel.get_attribute("data-selected") == "n4"
    assert "AccumulateGrad" in panel.text_content()
    page.evaluate("window.model.set('selected', 'n0')")
    page.click("[data-symgrad=node-panel] button[data-target=n1]")
    assert panel.get_attribute("data-selected") == "n1"
    # Keyboard: nodes are focusable buttons; Escape on the drawing clears the selection.
    page.focus(".sg-node[data-node-id=n2]")
    page.keyboard.press("Enter")
    assert panel.get_attribute("data-selected") == "n2"
    page.focus(".sg-canvas")
    page.keyboard.press("Escape")
    assert panel.get_attribute("data-selected") == ""
    assert page.evaluate("window.model.get('selected')") == ""


def test_widget_before_the_graph_is_set(page):
    mount(page, {})  # the traitlet's default
    assert page.locator(".sg-placeholder").text_content() == "No graph yet."
    assert page.locator("[data-symgrad=error]").count() == 0
    page.evaluate("g => window.model.set('graph', g)", valid(payloads.tutorial()))
    assert page.locator(".sg-placeholder").count() == 0
    assert page.locator(".sg-node[data-kind=op]").count() == 2


def test_wrong_backward_is_red_on_exactly_that_node(page, artifacts):
    mount(page, valid(payloads.tutorial(bad=True)))
    failing = page.locator(".sg-node[data-status=fail]")
    assert failing.count() == 1
    assert failing.get_attribute("data-node-id") == "n0"
    assert "sg-first-bad" in failing.get_attribute("class")
    assert page.get_attribute("[data-symgrad=overall]", "data-status") == "fail"
    table = page.locator("[data-symgrad=agreement]")
    assert table.locator("tr[data-leaf=c] .sg-badge").get_attribute("data-status") == "fail"
    assert table.locator("tr[data-leaf=a] .sg-badge").get_attribute("data-status") == "pass"
    assert "First disagreeing node" in table.text_content()
    page.screenshot(path=str(artifacts / "renderer-mismatch.png"), full_page=True)


def test_hover_shows_shape_and_dtype(page):
    mount(page, valid(payloads.loop_chain(3)))
    page.hover(".sg-node[data-node-id=m0]")
    tip = page.locator("[data-symgrad=tooltip]")
    assert tip.is_visible()
    assert "MulBackward0" in tip.text_content()
    assert "shape [4] · float32" in tip.text_content()
    page.mouse.move(1150, 5)
    assert not tip.is_visible()


def test_pan_and_zoom(page):
    mount(page, valid(payloads.tutorial()))
    viewport = page.locator(".sg-viewport")
    before = viewport.get_attribute("transform")
    zoom0 = float(page.get_attribute("[data-symgrad=graph]", "data-zoom"))
    page.click("button.sg-button:text('+')")
    zoom1 = float(page.get_attribute("[data-symgrad=graph]", "data-zoom"))
    assert zoom1 == pytest.approx(zoom0 * 1.25, rel=1e-3)
    box = page.locator(".sg-canvas").bounding_box()
    page.mouse.move(box["x"] + 5, box["y"] + 5)
    page.keyboard.down("Control")
    page.mouse.wheel(0, 200)
    page.keyboard.up("Control")
    zoom2 = float(page.get_attribute("[data-symgrad=graph]", "data-zoom"))
    assert zoom2 < zoom1
    page.mouse.move(box["x"] + 8, box["y"] + box["height"] - 8)
    page.mouse.down()
    page.mouse.move(box["x"] + 60, box["y"] + box["height"] - 40, steps=4)
    page.mouse.up()
    assert viewport.get_attribute("transform") != before
    page.click("button.sg-button:text('Fit')")
    assert float(page.get_attribute("[data-symgrad=graph]", "data-zoom")) == pytest.approx(
        zoom0, rel=1e-3)


def test_xss_names_are_text(page):
    evil = payloads.XSS
    g = payloads.tutorial(leaf_name=evil)
    g["root_names"] = [evil]
    g["nodes"][0]["saved"][0]["preview"] = evil
    g["nodes"][0]["check"]["message"] = evil
    g["nodes"][0]["formula"] = r"\href{javascript:alert(1)}{x} + " + evil
    valid(g)
    mount(page, g, selected="n0")
    page.wait_for_timeout(200)
    assert page.dialogs == []
    assert page.locator("img").count() == 0
    assert evil in page.locator(".sg-node-label").all_text_contents()
    assert evil in page.locator("[data-symgrad=agreement]").text_content()
    assert evil in page.locator("[data-symgrad=node-panel]").text_content()
    assert page.locator("a[href^=javascript]").count() == 0


def test_bad_payload_shows_readable_error(page):
    g = payloads.tutorial()
    g["nodes"][1]["kind"] = "gadget"
    mount(page, g)
    err = page.locator("[data-symgrad=error]")
    assert err.is_visible()
    text = err.text_content()
    assert "/nodes/1/kind" in text and "must be equal to one of the allowed values" in text
    assert page.locator(".sg-svg").count() == 0

    g = payloads.tutorial()
    g["edges"][0]["to"] = "n99"
    mount(page, g)
    err = page.locator("[data-symgrad=error]").text_content()
    assert '/edges/0/to: unknown node id "n99"' in err

    mount(page, {"schema": "symgrad.graph/7", "nodes": []})
    assert "symgrad.graph/7" in page.locator("[data-symgrad=error]").text_content()
    mount(page, "not json at all")
    assert "expected a JSON object" in page.locator("[data-symgrad=error]").text_content()


def test_500_node_chain_collapses_and_expands(page, artifacts):
    g = valid(payloads.loop_chain(250))
    assert len(g["nodes"]) == 503
    page.evaluate("window.mount({schema: 'symgrad.graph/1', nodes: [], edges: [], roots: [], "
                  "leaves: []})")  # warm up the module (first-run JIT)
    t0 = time.perf_counter()
    ms = mount(page, g)
    wall = time.perf_counter() - t0
    view = page.locator("[data-symgrad=graph]")
    assert view.get_attribute("data-node-count") == "503"
    # Collapsed by default: the repeated Add/Mul run is one box, the leaves stay.
    assert int(view.get_attribute("data-visible-nodes")) < 10
    group = page.locator(".sg-node[data-kind=group]")
    assert group.count() == 1
    assert "(MulBackward0 → AddBackward0) × " in group.text_content() or \
        "(AddBackward0 → MulBackward0) × " in group.text_content()
    page.screenshot(path=str(artifacts / "renderer-500-collapsed.png"))
    t1 = time.perf_counter()
    page.click("[data-symgrad=collapse]")
    expand = time.perf_counter() - t1
    visible = int(view.get_attribute("data-visible-nodes"))
    assert page.locator(".sg-node[data-kind=op]").count() == 500
    assert visible >= 503
    page.screenshot(path=str(artifacts / "renderer-500-expanded.png"))
    print(f"\n500-node chain: collapsed render {ms:.0f} ms (wall {wall * 1000:.0f} ms), "
          f"expand all {expand * 1000:.0f} ms")


def test_500_node_graph_without_chains_renders(page):
    g = valid(payloads.wide_graph(334))
    assert len(g["nodes"]) == 501
    ms = mount(page, g)
    assert page.locator(".sg-node[data-kind=op]").count() == 334
    print(f"\n501-node graph with nothing to collapse: render {ms:.0f} ms")


def _report_json() -> dict:
    """A real verifier report (symgrad.report/1) for sum(a * c)."""
    import symgrad as sg

    a = sg.tensor([2.0, 1.0], requires_grad=True)
    c = sg.tensor(4.0, requires_grad=True)
    e = (a * c).sum()
    data = sg.verify(e, names={"a": a, "c": c}).to_json()
    jsonschema.validate(data, json.loads(REPORT_SCHEMA.read_text()))
    return data


def test_report_payload(page):
    report = _report_json()
    mount(page, valid(payloads.tutorial()), report=report)
    rep = page.locator("[data-symgrad=report]")
    assert rep.get_attribute("data-state") == "ready"
    assert rep.locator("[data-symgrad=overall]").get_attribute("data-status") == "pass"
    leaves = rep.locator("[data-symgrad=report-leaves] tbody tr")
    assert leaves.count() == 2
    assert [leaves.nth(i).get_attribute("data-key") for i in range(2)] == ["a", "c"]
    assert leaves.nth(0).get_attribute("data-status") == "pass"
    assert "exact mode" in rep.text_content()

    # A disagreement (as the verifier reports one), with a hostile leaf name.
    bad = json.loads(json.dumps(report))
    bad["ok"] = False
    bad["leaves"][0].update(name=payloads.XSS, status="mismatch", max_abs_err=0.5)
    bad["nodes"][0].update(status="mismatch", detail=payloads.XSS)
    bad["first_bad_node"] = bad["nodes"][0]["id"]
    jsonschema.validate(bad, json.loads(REPORT_SCHEMA.read_text()))
    page.evaluate("r => window.model.set('report', r)", bad)
    assert rep.locator("[data-symgrad=overall]").get_attribute("data-status") == "fail"
    assert leaves.nth(0).get_attribute("data-status") == "fail"
    assert leaves.nth(0).get_attribute("data-key") == payloads.XSS
    nodes = rep.locator("[data-symgrad=report-nodes] tbody tr")
    assert nodes.nth(0).get_attribute("data-status") == "fail"
    assert "First disagreeing node: MulBackward0" in rep.text_content()
    assert page.locator("img").count() == 0

    # A report that does not match its schema is an error box, not a table.
    bad["mode"] = "guess"
    page.evaluate("r => window.model.set('report', r)", bad)
    assert "/mode" in page.locator("[data-symgrad=report] [data-symgrad=error]").text_content()
