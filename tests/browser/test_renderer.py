"""The Inspector's view in headless Chromium without JupyterLab: the labextension's
drawing module and control bar (labextension/src/inspector.ts, bundled with its CSS by
scripts/build-test-bundle.mjs for this test), driven through a fake anywidget model that
plays the kernel's part (it answers the view's request with the graph and report), with
hand-built payloads checked against the package schema. Also the loader that every saved
Inspector holds (symgrad/jupyter/inspector_stub.js): it uses the labextension's view when
the page has one, else the kernel's static view (inspector_static.js). See test_lab.py
and test_saved_notebooks.py for JupyterLab and Notebook 7.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest
import sg_payloads as payloads

from symgrad.jupyter.graph import load_schema

REPO = Path(__file__).resolve().parents[2]
LABEXT = REPO / "labextension"
JUPYTER = REPO / "symgrad" / "jupyter"
REPORT_SCHEMA = REPO / "symgrad" / "symbolic" / "report.schema.json"
ORIGIN = "http://symgrad.test"
PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>symgrad</title></head>
<body style="margin:8px"><div id="host" style="width:1100px"></div>
<script type="module">
import view from '/inspector.js';
window.view = view;
// A stand-in for an anywidget model and the kernel behind it: get/set/on/off/save_changes
// and send; the kernel's part answers {type: 'request'} with the graph message (unless
// there is no graph yet) and records everything sent in window.sent.
window.fakeModel = (traits, kernel) => {
  const data = Object.assign({selected: '', status: 'done', progress: 1, message: '',
                              rtol: 1e-4, atol: 1e-6}, traits);
  const listeners = {};
  const fire = (e, ...args) => (listeners[e] || []).slice().forEach(f => f(...args));
  window.saves = 0;
  window.sent = [];
  return {
    get: k => data[k],
    set: (k, v) => { data[k] = v; fire('change:' + k); },
    save_changes: () => { window.saves += 1; },
    on: (e, f) => { (listeners[e] = listeners[e] || []).push(f); },
    off: (e, f) => { listeners[e] = (listeners[e] || []).filter(g => g !== f); },
    send: m => { window.sent.push(m); kernel(m, msg => fire('msg:custom', msg, [])); },
  };
};
const newEl = () => {
  const host = document.getElementById('host');
  if (typeof window.cleanup === 'function') { window.cleanup(); }
  window.cleanup = null;
  host.textContent = '';
  return host.appendChild(document.createElement('div'));
};
window.mount = (graph, selected, report, render) => {
  const el = newEl();
  window.kernelData = {graph, report: report || null};
  window.model = window.fakeModel({selected: selected || ''}, (m, reply) => {
    if (m.type === 'request' && window.kernelData.graph !== null) {
      reply({type: 'graph', ...window.kernelData});
    }
  });
  const t0 = performance.now();
  const cleanup = (render || view.render)({model: window.model, el});
  const ms = performance.now() - t0;
  Promise.resolve(cleanup).then(c => { window.cleanup = c; });  // the loader's is async
  return ms;
};
// The saved loader on a page without the labextension: the kernel's part sends the static
// view's module and its HTML (window.staticHtml, sent again by window.pushStatic).
window.mountStatic = async (stub, code, html) => {
  const el = newEl();
  window.staticHtml = html;
  window.model = window.fakeModel({}, (m, reply) => {
    window.reply = reply;
    if (m.type === 'request-static-module') { reply({type: 'static-module', code}); }
    if (m.type === 'request-static') { reply({type: 'static', html: window.staticHtml}); }
  });
  window.cleanup = await stub.render({model: window.model, el});
};
window.pushStatic = html => {
  window.staticHtml = html;
  window.reply({type: 'static', html});
};
// The kernel sends new data (after a verification).
window.push = (graph, report) => {
  window.kernelData = {graph, report: report || null};
  window.model.send({type: 'request'});
};
window.ready = true;
</script></body></html>"""


@pytest.fixture(scope="session")
def bundle(tmp_path_factory) -> bytes:
    """The test bundle of the Inspector's view, built now from labextension/src."""
    node = shutil.which("node")
    if node is None or not (LABEXT / "node_modules" / "esbuild").is_dir():
        pytest.fail("node and labextension/node_modules are needed: run `make labext`")
    out = tmp_path_factory.mktemp("bundle") / "inspector.js"
    res = subprocess.run([node, "scripts/build-test-bundle.mjs", "--out", str(out)],
                         cwd=LABEXT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return out.read_bytes()


def _page(browser, bundle: bytes, extra: dict[str, tuple[bytes, str]] | None = None):
    files = {"/inspector.js": (bundle, "text/javascript"),
             "/index.html": (PAGE.encode(), "text/html"), **(extra or {})}
    pg = browser.new_page(viewport={"width": 1200, "height": 900})
    pg.dialogs = []
    pg.errors = []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))

    def route(r):
        path = r.request.url[len(ORIGIN):]
        if path in files:
            body, kind = files[path]
            r.fulfill(body=body, content_type=kind)
        else:  # nothing else may load (an injected <img src=x> would land here)
            pg.errors.append("unexpected request " + r.request.url)
            r.fulfill(status=404, body="")

    pg.route(f"{ORIGIN}/**", route)
    pg.goto(f"{ORIGIN}/index.html")
    pg.wait_for_function("window.ready === true")
    return pg


@pytest.fixture(scope="module")
def page(browser, bundle):
    pg = _page(browser, bundle)
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


def test_view_before_the_kernel_answers(page):
    mount(page, None)  # the kernel has not answered the view's request yet
    assert page.evaluate("window.sent") == [{"type": "request"}]
    assert page.locator(".sg-placeholder").text_content() == "Waiting for the kernel…"
    assert page.locator("[data-symgrad=error]").count() == 0
    page.evaluate("g => window.push(g)", valid(payloads.tutorial()))
    assert page.locator(".sg-placeholder").count() == 0
    assert page.locator(".sg-node[data-kind=op]").count() == 2


def test_control_bar_sets_traits_and_sends_commands(page):
    mount(page, valid(payloads.tutorial()))
    bar = page.locator("[data-symgrad=controls]")
    status = bar.locator("[data-symgrad=status]")
    assert status.locator(".sg-badge").get_attribute("data-status") == "pass"
    assert bar.locator("input[data-trait=rtol]").input_value() == "0.0001"
    assert bar.locator("input[data-trait=atol]").input_value() == "0.000001"
    assert bar.locator("button[data-action=stop]").is_disabled()
    assert not bar.locator(".sg-inspector-progress").is_visible()
    # a new tolerance goes to the model (the kernel verifies again on it)
    bar.locator("input[data-trait=rtol]").fill("0.01")
    bar.locator("input[data-trait=rtol]").press("Enter")
    assert page.evaluate("[window.model.get('rtol'), window.saves]") == [0.01, 1]
    bar.locator("input[data-trait=atol]").fill("-1")  # refused: back to the model's value
    bar.locator("input[data-trait=atol]").press("Tab")
    assert bar.locator("input[data-trait=atol]").input_value() == "0.000001"
    bar.locator("button[data-action=verify]").click()
    assert page.evaluate("window.sent.at(-1)") == {"type": "verify"}
    # the kernel's state shows: verifying (progress, Stop), then a failure with its message
    page.evaluate("window.model.set('progress', 0.4); window.model.set('status', 'verifying')")
    assert bar.locator(".sg-inspector-progress").is_visible()
    assert bar.locator("button[data-action=verify]").is_disabled()
    bar.locator("button[data-action=stop]").click()
    assert page.evaluate("window.sent.at(-1)") == {"type": "stop"}
    page.evaluate("window.model.set('message', 'TimeoutError: over budget');"
                  "window.model.set('status', 'error')")
    assert status.text_content() == "verification failed: TimeoutError: over budget"
    assert not bar.locator(".sg-inspector-progress").is_visible()


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
    bad["status"] = "mismatch"
    bad["leaves"][0].update(name=payloads.XSS, status="mismatch", max_abs_err=0.5)
    bad["nodes"][0].update(status="mismatch", detail=payloads.XSS)
    bad["first_bad_node"] = bad["nodes"][0]["id"]
    jsonschema.validate(bad, json.loads(REPORT_SCHEMA.read_text()))
    page.evaluate("r => window.push(window.kernelData.graph, r)", bad)
    assert rep.locator("[data-symgrad=overall]").get_attribute("data-status") == "fail"
    assert leaves.nth(0).get_attribute("data-status") == "fail"
    assert leaves.nth(0).get_attribute("data-key") == payloads.XSS
    nodes = rep.locator("[data-symgrad=report-nodes] tbody tr")
    assert nodes.nth(0).get_attribute("data-status") == "fail"
    assert "First disagreeing node: MulBackward0" in rep.text_content()
    assert page.locator("img").count() == 0

    # A report that does not match its schema is an error box, not a table.
    bad["mode"] = "guess"
    page.evaluate("r => window.push(window.kernelData.graph, r)", bad)
    assert "/mode" in page.locator("[data-symgrad=report] [data-symgrad=error]").text_content()


# -- the loader every saved Inspector holds ------------------------------------------------

STATIC_JS = (JUPYTER / "inspector_static.js").read_text()


@pytest.fixture
def stub_page(browser, bundle):
    from symgrad.jupyter.widget import Inspector

    pg = _page(browser, bundle, {"/stub.js": (Inspector._esm.encode(), "text/javascript")})
    yield pg
    assert pg.errors == []
    pg.close()


def test_loader_uses_the_labextension_view(stub_page):
    # what index.ts does when JupyterLab or Notebook 7 loads the labextension
    stub_page.evaluate("window[Symbol.for('symgrad.inspector.v1')] = window.view")
    stub_page.evaluate("""async g => {
        const stub = (await import('/stub.js')).default;
        window.mount(g, 'n1', null, stub.render);
    }""", valid(payloads.tutorial()))
    panel = stub_page.locator("[data-symgrad=node-panel]")
    panel.wait_for(state="attached")
    assert panel.get_attribute("data-selected") == "n1"
    assert stub_page.locator(".symgrad-inspector .sg-node[data-kind=op]").count() == 2
    assert stub_page.evaluate("window.sent") == [{"type": "request"}]


def test_loader_without_the_labextension_shows_the_kernels_static_view(stub_page):
    import symgrad as sg
    from symgrad.jupyter.widget import Inspector

    evil = sg.tensor([1.0, 2.0], requires_grad=True)
    evil.name = payloads.XSS
    c = sg.tensor(4.0, requires_grad=True)
    y = (evil * c).sum()
    w = Inspector(y, {"c": c, "y": y})
    stub_page.evaluate("""async ([code, html]) => {
        const stub = (await import('/stub.js')).default;
        await window.mountStatic(stub, code, html);
    }""", [STATIC_JS, w.static_html()])
    assert stub_page.evaluate("window.sent") == [{"type": "request-static-module"},
                                                 {"type": "request-static"}]
    view = stub_page.locator(".symgrad-inspector-static")
    assert view.locator("svg.symgrad-graph .sg-node").count() == len(w.graph["nodes"])
    assert view.locator(".sg-agreement-row").count() == 2
    assert stub_page.locator("img").count() == 0 and stub_page.dialogs == []
    assert payloads.XSS in view.text_content()
    # a click on a node selects it (the kernel then sends the view again)
    mul = w.find("MulBackward0")
    view.locator(f"svg .sg-node[data-id={mul}]").click()
    assert stub_page.evaluate("[window.model.get('selected'), window.saves]") == [mul, 1]
    w.selected = mul
    stub_page.evaluate("h => window.pushStatic(h)", w.static_html())
    assert view.locator(f".sg-node-panel[data-id={mul}]").count() == 1
    # the controls: tolerances are traits, Verify and Stop are messages
    view.locator("input[data-sg-trait=rtol]").fill("0.01")
    view.locator("input[data-sg-trait=rtol]").press("Enter")
    assert stub_page.evaluate("window.model.get('rtol')") == 0.01
    view.locator("button[data-sg-action=verify]").click()
    assert stub_page.evaluate("window.sent.at(-1)") == {"type": "verify"}
    assert view.locator("button[data-sg-action=stop]").is_disabled()
    w.close()


def _numbers(d: str) -> list[float]:
    return [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", d)]


def test_view_draws_the_payloads_layout_as_the_static_svg_does(page):
    # one layout (symgrad/jupyter/layout.py): a %%symgrad output ships it in the JSON, the
    # static SVG draws it, and so does the labextension, box for box and bend for bend
    import xml.etree.ElementTree as ET

    import symgrad as sg
    from symgrad.jupyter.graph import graph_json, mimebundle
    from symgrad.jupyter.layout import layout_boxes
    from symgrad.jupyter.svg import render_svg

    a = sg.tensor([0.5, -1.0], requires_grad=True)
    b = sg.tensor(2.0, requires_grad=True)
    y = ((a * b).exp().sin() + a).sum()  # a's edge from the add spans layers: it bends
    bundle = mimebundle(graph_json(y, {"a": a, "b": b, "y": y}))
    g = valid(bundle["application/vnd.symgrad.graph+json"])
    assert g["layout"].get("edges")
    mount(page, g)
    view = page.locator("[data-symgrad=graph]")
    assert view.get_attribute("data-layout") == "payload"
    drawn = page.evaluate("""() => Object.fromEntries(
      [...document.querySelectorAll('.sg-view .sg-node')].map(el => {
        const t = el.getAttribute('transform').match(/translate\\(([-\\d.]+),([-\\d.]+)\\)/);
        const r = el.querySelector('rect.sg-box');
        return [el.dataset.nodeId,
                [+t[1], +t[2], +r.getAttribute('width'), +r.getAttribute('height')]];
      }))""")
    assert drawn == layout_boxes(g["layout"])
    paths = page.evaluate("""() => [...document.querySelectorAll('.sg-view .sg-edge')]
      .map(p => [p.dataset.from, p.dataset.to, p.getAttribute('d')])""")
    svg = ET.fromstring(render_svg(g))
    static = {(p.get("data-from"), p.get("data-to")): _numbers(p.get("d"))
              for p in svg.iter("{http://www.w3.org/2000/svg}path")
              if p.get("class") == "sg-edge"}
    assert len(paths) == len(static)
    for frm, to, d in paths:
        assert _numbers(d) == static[(frm, to)]
    # a payload without a layout (older outputs, hand-made ones) is laid out here
    mount(page, valid({k: v for k, v in g.items() if k != "layout"}))
    assert view.get_attribute("data-layout") == "dagre"
    assert page.locator(".sg-view .sg-node").count() == len(g["nodes"])


def test_collapsed_loop_uses_the_payloads_layout_until_expanded(page):
    import symgrad as sg
    from symgrad.jupyter.graph import graph_json, mimebundle

    w = sg.tensor(0.9, requires_grad=True)
    z = x = sg.tensor(1.0, requires_grad=True)
    for _ in range(250):
        z = z * w + 0.5
    g = valid(mimebundle(graph_json(z, {"w": w, "x": x}))["application/vnd.symgrad.graph+json"])
    mount(page, g)
    view = page.locator("[data-symgrad=graph]")
    assert view.get_attribute("data-layout") == "payload"
    ids = set(page.evaluate("""() => [...document.querySelectorAll('.sg-view .sg-node')]
      .map(el => el.dataset.nodeId)"""))
    assert ids == set(g["layout"]["nodes"]) and any(i.startswith("chain:") for i in ids)
    # expanding draws nodes the shipped layout does not cover: laid out here
    page.click("[data-symgrad=collapse]")
    assert view.get_attribute("data-layout") in ("dagre", "fast")
    assert page.locator(".sg-node[data-kind=op]").count() == 500
    page.click("[data-symgrad=collapse]")
    assert view.get_attribute("data-layout") == "payload"


def test_2000_node_chain_draws_and_says_which_formulas_are_left_out(page):
    """A real 2,000-node graph (issue 30): drawn collapsed from its shipped layout, with
    notices for the nodes cut and for those shown without a formula (a formula budget of
    one derivation leaves the loop's mul without one); expanding every chain lays all of
    them out here (the fast layout). Timings are printed, not asserted."""
    import symgrad as sg
    from symgrad.jupyter.graph import graph_json, mimebundle

    x = y = sg.randn(3, requires_grad=True)
    for _ in range(1000):
        y = (y * 1.001).tanh()
    g = valid(mimebundle(graph_json(y.sum(), {"x": x}, formula_budget=1))[
        "application/vnd.symgrad.graph+json"])
    assert g["truncated"] > 0 and g["formulas_omitted"] > 0
    ms = mount(page, g)  # in the page: the payload's transfer from Python is not counted
    view = page.locator("[data-symgrad=graph]")
    assert view.get_attribute("data-layout") == "payload"
    notices = page.locator(".sg-notice").all_text_contents()
    assert any(f"{g['truncated']} more node" in t for t in notices), notices
    assert any(f"{g['formulas_omitted']} nodes shown without a formula" in t
               for t in notices), notices
    expand = page.evaluate("""() => { const t0 = performance.now();
      document.querySelector('[data-symgrad=collapse]').click();
      return performance.now() - t0; }""")
    assert view.get_attribute("data-layout") == "fast"
    assert int(view.get_attribute("data-visible-nodes")) == len(g["nodes"])
    print(f"\n{len(g['nodes'])}-node chain: collapsed render {ms:.0f} ms, "
          f"expand all {expand:.0f} ms")
