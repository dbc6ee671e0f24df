"""Module-aware graphs in the labextension's view (issue 30, scope 1; scope 4's "10,000
nodes collapsed by module stay interactive"): modules drawn as frames with a header
"path: Type" and a verdict badge (✓, ✗, not checked), collapsed to one box with edges
re-routed to it, repeated blocks folded to one "Block × N" box, one module focused on its
own, and a big model first drawn collapsed to its top-level modules.

Driven in headless Chromium through the Inspector's view without JupyterLab (the test
bundle of test_renderer.py: the same drawing code the JupyterLab MIME renderer uses), with
payloads built from the module contract (sg_payloads.gpt_like) and one from a real
2-block GPT whose block 1 has a wrong backward rule. The assertions read the rendered
page: box and frame labels, badges, which graph nodes are drawn, edges, geometry.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import sg_payloads as payloads
from test_renderer import _page, bundle, mount, valid  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]

# What the page draws: graph nodes, module/fold boxes, frames, edges, the focus.
STATE_JS = """() => {
  const q = s => [...document.querySelectorAll(s)];
  const r = el => { const b = el.getBoundingClientRect();
                    return [b.left, b.top, b.right, b.bottom]; };
  const text = (el, s) => { const t = el && el.querySelector(s); return t ? t.textContent : null; };
  const view = document.querySelector('[data-symgrad=graph]');
  return {
    nodes: Object.fromEntries(q('.sg-view .sg-node')
      .filter(e => ['op', 'accumulate', 'leaf', 'none'].includes(e.dataset.kind))
      .map(e => [e.dataset.nodeId, {status: e.dataset.status,
                                   rect: r(e.querySelector('rect.sg-box'))}])),
    boxes: Object.fromEntries(q('.sg-view .sg-node[data-kind=module], '
                                + '.sg-view .sg-node[data-kind=fold]')
      .map(e => [e.dataset.nodeId, {kind: e.dataset.kind, verdict: e.dataset.verdict,
                                   count: +e.dataset.count, members: e.dataset.members || null,
                                   label: text(e, '.sg-node-label'),
                                   sub: text(e, '.sg-node-sub'),
                                   badge: text(e, '.sg-verdict > text'),
                                   focus: !!e.querySelector('[data-symgrad=focus]')}])),
    frames: Object.fromEntries(q('.sg-view .sg-cluster').map(e => {
      const id = e.dataset.cluster;
      const head = q('.sg-view .sg-cluster-head').find(h => h.dataset.cluster === id);
      return [id, {kind: e.dataset.kind, verdict: e.dataset.verdict,
                   label: text(head, '.sg-cluster-label'),
                   badge: text(head, '.sg-verdict > text'),
                   rect: r(e.querySelector('rect.sg-cluster-frame'))}]; })),
    edges: q('.sg-view .sg-edge').map(p => [p.dataset.from, p.dataset.to]),
    visible: +view.dataset.visibleNodes,
    layout: view.dataset.layout,
    focus: view.dataset.focus,
    bar: (() => { const b = document.querySelector('[data-symgrad=focus-bar]');
                  return b && !b.hidden ? b.textContent : null; })(),
  };
}"""

BADGE = {"ok": "✓", "bad": "✗", "unchecked": "not checked"}


@pytest.fixture(scope="module")
def page(browser, bundle):  # noqa: F811 (the test bundle from test_renderer)
    pg = _page(browser, bundle)
    yield pg
    assert pg.errors == []
    pg.close()


def state(page) -> dict:
    return page.evaluate(STATE_JS)


def click(page, selector: str) -> float:
    """Click the element (ms spent in the handler: layout and drawing included)."""
    return page.evaluate("""s => { const el = document.querySelector(s);
      if (!el) { throw new Error('nothing matches ' + s); }
      const t0 = performance.now();
      el.dispatchEvent(new MouseEvent('click', {bubbles: true}));
      return performance.now() - t0; }""", selector)


def header(cluster: str) -> str:
    return f'.sg-cluster-head[data-cluster="{cluster}"] [data-symgrad=module-header]'


def rect(page, selector: str) -> list[float]:
    return page.evaluate("""s => { const b = document.querySelector(s).getBoundingClientRect();
      return [b.left, b.top, b.right, b.bottom]; }""", selector)


def inside(inner: list[float], outer: list[float]) -> bool:
    return (inner[0] >= outer[0] - 0.5 and inner[1] >= outer[1] - 0.5
            and inner[2] <= outer[2] + 0.5 and inner[3] <= outer[3] + 0.5)


def owners(g: dict) -> dict[str, str]:
    """node id -> the module it is drawn in: its own, else (a leaf no module call made)
    the module of the op that uses it (each weight of gpt_like has one user)."""
    own = {n["id"]: n.get("module", "") for n in g["nodes"]}
    for e in g["edges"]:
        if not own[e["to"]]:
            own[e["to"]] = own[e["from"]]
    return own


def within(g: dict, path: str) -> set[str]:
    """Ids of the nodes drawn inside module `path` (its submodules' included)."""
    return {i for i, p in owners(g).items() if p == path or p.startswith(path + ".")}


def test_frames_headers_verdicts_and_the_fold_of_two_blocks(page, artifacts):
    g = valid(payloads.gpt_like(2, bad_block=1))
    mods = {m["path"]: m for m in g["modules"]}
    mount(page, g)
    st = state(page)
    # A small model: its modules open, the two blocks folded into one box.
    assert set(st["frames"]) == {"module:wte", "module:h", "module:head"}
    for fid, f in st["frames"].items():
        m = mods[fid.split(":", 1)[1]]
        assert f["label"] == f"▾ {m['path']}: {m['type']}"
        assert (f["verdict"], f["badge"]) == (m["verdict"], BADGE[m["verdict"]])
    fold = st["boxes"]["fold:h.0"]
    assert fold["label"] == "▸ Block × 2" and fold["members"] == "h.0 h.1"
    assert (fold["verdict"], fold["badge"]) == ("bad", "✗")  # block 1 is bad
    assert fold["count"] == len(within(g, "h.0") | within(g, "h.1"))
    outside_h = {i for i in within(g, "wte") | within(g, "head")} | {"loss"}
    assert set(st["nodes"]) == outside_h
    # a weight no module call made is drawn in its layer's frame
    assert inside(st["nodes"]["w_head"]["rect"], st["frames"]["module:head"]["rect"])
    assert inside(st["nodes"]["emb"]["rect"], st["frames"]["module:wte"]["rect"])
    assert inside(rect(page, '.sg-node[data-fold="fold:h.0"] rect.sg-box'),
                  st["frames"]["module:h"]["rect"])

    # Unfolded: the blocks and their parts, each with its own verdict, top down to the node.
    click(page, '.sg-node[data-fold="fold:h.0"]')
    st = state(page)
    assert set(st["frames"]) == {"module:wte", "module:h", "fold:h.0", "module:h.0",
                                 "module:h.0.attn", "module:h.0.mlp", "module:h.1",
                                 "module:h.1.attn", "module:h.1.mlp", "module:head"}
    assert st["frames"]["fold:h.0"]["label"].startswith("▾ Block × 2")
    for fid, f in st["frames"].items():
        if fid.startswith("module:"):
            m = mods[fid.split(":", 1)[1]]
            assert f["label"] == f"▾ {m['path']}: {m['type']}"
            assert (f["verdict"], f["badge"]) == (m["verdict"], BADGE[m["verdict"]])
    bad = {fid for fid, f in st["frames"].items() if f["verdict"] == "bad"}
    assert bad == {"module:h", "fold:h.0", "module:h.1", "module:h.1.attn"}
    assert set(st["nodes"]) == {n["id"] for n in g["nodes"]} and st["boxes"] == {}
    first = g["agreement"]["first_bad_node"]
    assert st["nodes"][first]["status"] == "fail"
    for fid in ("module:h.1.attn", "module:h.1", "fold:h.0", "module:h"):
        assert inside(st["nodes"][first]["rect"], st["frames"][fid]["rect"]), fid
    assert not inside(st["nodes"][first]["rect"], st["frames"]["module:h.0"]["rect"])
    page.mouse.move(0, 0)
    page.locator(".sg-canvas").screenshot(path=str(artifacts / "modules-unfolded.png"))

    # The fold's header folds it again.
    click(page, header("fold:h.0"))
    assert "fold:h.0" in state(page)["boxes"]


def test_collapse_and_expand_change_what_is_drawn_and_reroute_edges(page):
    g = valid(payloads.gpt_like(2, bad_block=1))
    mount(page, g)
    click(page, '.sg-node[data-fold="fold:h.0"]')
    all_ids = {n["id"] for n in g["nodes"]}
    assert set(state(page)["nodes"]) == all_ids

    click(page, header("module:h.0"))
    st = state(page)
    inner = within(g, "h.0")
    assert set(st["nodes"]) == all_ids - inner
    box = st["boxes"]["module:h.0"]
    assert box["label"] == "▸ h.0: Block" and box["count"] == len(inner)
    assert (box["verdict"], box["badge"]) == ("ok", "✓") and box["focus"]
    assert "module:h.0" not in st["frames"] and "module:h.0.attn" not in st["frames"]
    assert st["visible"] == len(all_ids - inner) + 1
    # Every edge that touched a node inside now ends at the box, once per neighbour.
    rep = {i: ("module:h.0" if i in inner else i) for i in all_ids}
    expected = {(rep[e["from"]], rep[e["to"]]) for e in g["edges"]
                if rep[e["from"]] != rep[e["to"]]}
    assert sorted(map(tuple, st["edges"])) == sorted(expected)
    assert ("b1_attn", "module:h.0") in expected and ("module:h.0", "emb") in expected

    click(page, '.sg-node[data-module="h.0"]')  # the box opens again
    st = state(page)
    assert set(st["nodes"]) == all_ids and "module:h.0" in st["frames"]

    # Collapse modules: the top-level boxes; Expand modules: everything.
    click(page, "[data-symgrad=modules-collapse]")
    st = state(page)
    assert set(st["boxes"]) == {"module:wte", "module:h", "module:head"}
    assert set(st["nodes"]) == {"loss"} and st["frames"] == {}
    click(page, "[data-symgrad=modules-expand]")
    st = state(page)
    assert set(st["nodes"]) == all_ids and st["boxes"] == {}


def test_focus_draws_one_module_alone_with_a_way_back(page, artifacts):
    g = valid(payloads.gpt_like(2, bad_block=1))
    mount(page, g)
    click(page, '.sg-node[data-fold="fold:h.0"]')
    click(page, '.sg-cluster-head[data-cluster="module:h.1"] [data-symgrad=focus]')
    st = state(page)
    assert st["focus"] == "h.1"
    assert set(st["nodes"]) == within(g, "h.1")
    assert set(st["frames"]) == {"module:h.1", "module:h.1.attn", "module:h.1.mlp"}
    assert st["frames"]["module:h.1"]["label"] == "h.1: Block"  # alone: no collapse mark
    assert st["bar"].replace("\u00a0", " ") == "← whole graph › h › h.1: Block"
    # no edge leaves the focused module
    assert all(a in st["nodes"] and b in st["nodes"] for a, b in st["edges"])
    page.mouse.move(0, 0)
    page.locator(".sg-canvas").screenshot(path=str(artifacts / "modules-focus-h1.png"))

    page.click("[data-symgrad=focus-bar] button[data-focus-to=h]")
    st = state(page)
    assert st["focus"] == "h" and set(st["nodes"]) == within(g, "h")
    assert st["bar"] == "← whole graph › h: ModuleList"
    page.click("[data-symgrad=unfocus]")
    st = state(page)
    assert st["focus"] == "" and st["bar"] is None
    assert set(st["nodes"]) == {n["id"] for n in g["nodes"]}

    # A collapsed module's box has the focus button too: its nodes, opened.
    click(page, "[data-symgrad=modules-collapse]")
    click(page, '.sg-node[data-module="head"] [data-symgrad=focus]')
    st = state(page)
    assert st["focus"] == "head" and set(st["nodes"]) == within(g, "head")


def test_the_first_bad_node_is_found_from_the_agreement_link(page):
    g = valid(payloads.gpt_like(2, bad_block=1, collapsed=True))
    mount(page, g)
    st = state(page)
    assert set(st["boxes"]) == {"module:wte", "module:h", "module:head"}
    assert {k: b["verdict"] for k, b in st["boxes"].items()} == {
        "module:wte": "ok", "module:h": "bad", "module:head": "ok"}
    first = g["agreement"]["first_bad_node"]
    page.click("[data-symgrad=agreement] .sg-first-bad-note button")
    st = state(page)
    assert first in st["nodes"] and st["nodes"][first]["status"] == "fail"
    assert page.get_attribute("[data-symgrad=node-panel]", "data-selected") == first
    assert "sg-selected" in page.get_attribute(f'.sg-node[data-node-id="{first}"]', "class")
    for fid in ("module:h", "fold:h.0", "module:h.1", "module:h.1.attn"):
        assert inside(st["nodes"][first]["rect"], st["frames"][fid]["rect"]), fid
    # the node panel names the module, with its own focus action
    fact = page.locator("[data-symgrad=node-module]")
    assert fact.get_attribute("data-module") == "h.1.attn"
    assert fact.locator("code").text_content() == "h.1.attn: Attention"
    fact.locator("button").click()
    assert state(page)["focus"] == "h.1.attn"


def test_inspector_keeps_the_open_modules_when_the_graph_comes_again(page):
    g = valid(payloads.gpt_like(2))
    mount(page, g)
    click(page, '.sg-node[data-fold="fold:h.0"]')
    click(page, header("module:h.0"))
    st = state(page)
    assert st["boxes"]["module:h.0"]["verdict"] == "ok"
    # verified again (the same model, now with block 0 wrong): same view, new verdicts
    page.evaluate("g => window.push(g, null)", valid(payloads.gpt_like(2, bad_block=0)))
    st = state(page)
    assert "module:h.0" in st["boxes"] and "fold:h.0" in st["frames"]
    assert st["boxes"]["module:h.0"]["badge"] == "✗"
    assert st["frames"]["module:h.1"]["badge"] == "✓"



def test_module_names_are_text(page):
    g = payloads.gpt_like(2)
    for m in g["modules"]:
        if m["path"] == "h.0":
            m["type"] = payloads.XSS
    g["folds"][0]["label"] = payloads.XSS + " × 2"
    mount(page, valid(g))
    st = state(page)
    assert st["boxes"]["fold:h.0"]["label"] == f"▸ {payloads.XSS} × 2"
    click(page, '.sg-node[data-fold="fold:h.0"]')
    st = state(page)
    assert st["frames"]["module:h.0"]["label"] == f"▾ h.0: {payloads.XSS}"
    click(page, '.sg-cluster-head[data-cluster="module:h.0"] [data-symgrad=focus]')
    assert state(page)["bar"].endswith(f"h.0: {payloads.XSS}")
    assert page.locator("img").count() == 0 and page.dialogs == []

def test_10000_nodes_start_collapsed_and_open_one_level_at_a_time(page, artifacts):
    """Scope 4: a 10,000-node model collapsed by module stays interactive because only
    what is visible is drawn and laid out. Timings are printed, not asserted."""
    shape = {"bad_block": 7, "collapsed": True, "shared_mlp_weight": True}
    valid(payloads.gpt_like(12, mlp_depth=2, **shape))  # (the schema, in Python: slow)
    g = payloads.gpt_like(12, mlp_depth=416, **shape)
    n = len(g["nodes"])
    assert n >= 10_000
    page.evaluate("s => { window.big = JSON.parse(s); }", json.dumps(g))  # (fast as text)
    t0 = time.perf_counter()
    ms = page.evaluate("() => window.mount(window.big)")
    wall = time.perf_counter() - t0
    view = page.locator("[data-symgrad=graph]")
    assert view.get_attribute("data-state") == "ready"  # the page checked the schema
    assert view.get_attribute("data-node-count") == str(n)
    st = state(page)
    # first view: the top-level modules (and the loss, made outside any module)
    assert set(st["boxes"]) == {"module:wte", "module:h", "module:head"}
    assert set(st["nodes"]) == {"loss"} and st["visible"] == 4
    assert page.locator(".sg-view .sg-node").count() == 4  # nothing else in the DOM
    assert st["boxes"]["module:h"]["count"] == len(within(g, "h"))
    times = {}
    times["open h"] = click(page, '.sg-node[data-module="h"]')
    st = state(page)
    assert st["boxes"]["fold:h.0"]["label"] == "▸ Block × 12"
    assert st["boxes"]["fold:h.0"]["verdict"] == "bad"
    times["unfold"] = click(page, '.sg-node[data-fold="fold:h.0"]')
    st = state(page)
    # a big model opens one level at a time: twelve block boxes, block 7 bad
    blocks = {f"module:h.{i}" for i in range(12)}
    assert set(st["boxes"]) == blocks | {"module:wte", "module:head"}
    assert {b for b in blocks if st["boxes"][b]["verdict"] == "bad"} == {"module:h.7"}
    assert st["visible"] == 15
    times["open h.7"] = click(page, '.sg-node[data-module="h.7"]')
    st = state(page)
    assert {"module:h.7.attn", "module:h.7.mlp"} <= set(st["boxes"])
    assert st["boxes"]["module:h.7.attn"]["verdict"] == "bad"
    assert st["boxes"]["module:h.7.mlp"]["verdict"] == "ok"
    assert st["visible"] < 25
    times["open h.7.attn"] = click(page, '.sg-node[data-module="h.7.attn"]')
    st = state(page)
    assert st["nodes"]["b7_attn"]["status"] == "fail"
    times["open h.7.mlp"] = click(page, '.sg-node[data-module="h.7.mlp"]')
    st = state(page)
    # the mlp's long (mm, relu) run is one chain box inside the mlp's frame
    chain = page.locator('.sg-node[data-kind=group]')
    assert chain.count() == 1
    assert "(ReluBackward0 → MmBackward0) × " in chain.text_content() or \
        "(MmBackward0 → ReluBackward0) × " in chain.text_content()
    assert inside(rect(page, ".sg-node[data-kind=group] rect.sg-box"),
                  st["frames"]["module:h.7.mlp"]["rect"])
    assert st["visible"] < 30
    times["expand the chain"] = click(page, ".sg-node[data-kind=group]")
    st = state(page)
    assert set(st["nodes"]) == within(g, "h.7") | {"loss"}
    assert page.locator(".sg-view .sg-node").count() == st["visible"]
    times["close h.7"] = click(page, header("module:h.7"))
    assert state(page)["visible"] == 15
    page.mouse.move(0, 0)
    page.locator(".sg-canvas").screenshot(path=str(artifacts / "modules-10000.png"))
    print(f"\n{n}-node model (under load): first view {ms:.0f} ms in the page "
          f"(wall {wall * 1000:.0f} ms from Python); "
          + ", ".join(f"{k} {v:.0f} ms" for k, v in times.items()))


# -- a real model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt_with_wrong_rule():
    """A real 2-block GPT (tests/_gpt_tiny.py) whose AddmmBackward0 nodes made in
    h.1.mlp.c_fc have a rule 0.1% off, verified (local mode) and drawn as the payload."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from _gpt_tiny import tiny_gpt_loss
    finally:
        sys.path.remove(str(REPO / "tests"))
    import symgrad as sg
    from symgrad.jupyter.graph import graph_json, mimebundle

    model, loss = tiny_gpt_loss()
    target = model.h[1].mlp.c_fc
    stack, seen, bad = [loss.grad_fn], set(), None
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        call = getattr(node, "_module_call", None)
        if node.name() == "AddmmBackward0" and call is not None and call[0]() is target:
            bad = node
        stack += [f for f, _ in node.next_functions]
    assert bad is not None
    cls = type(bad)
    real = cls.apply

    def wrong(self, grad_outputs, needed):
        out = list(real(self, grad_outputs, needed))
        call = self._module_call
        if call is not None and call[0]() is target and out[1] is not None:
            out[1] = out[1] * 1.001
        return out

    cls.apply = wrong
    try:
        report = sg.verify(loss, names=dict(model.named_parameters()), mode="local",
                           sample=2)
    finally:
        cls.apply = real
    assert not report.ok and report.first_bad_node is bad
    g = mimebundle(graph_json(loss, report=report, formulas=False))[
        "application/vnd.symgrad.graph+json"]
    return model, report, valid(g)


def test_real_gpt_boxes_match_its_modules_and_the_wrong_rule_is_found_top_down(
        page, gpt_with_wrong_rule, artifacts):
    model, report, g = gpt_with_wrong_rule
    types = {p: type(m).__name__ for p, m in model.named_modules() if p}
    first = g["agreement"]["first_bad_node"]
    assert next(n for n in g["nodes"] if n["id"] == first)["module"] == "h.1.mlp.c_fc"
    mount(page, g)
    st = state(page)
    # The first view (a big graph): one box per top-level module, the two embeddings
    # folded, where the payload's layout (the static SVG's) puts them.
    assert st["layout"] == "payload"
    shown = set()
    for bid, b in st["boxes"].items():
        if b["kind"] == "module":
            path = bid.split(":", 1)[1]
            assert b["label"] == f"▸ {path}: {types[path]}"
            shown.add(path)
        else:
            assert b["label"] == "▸ Embedding × 2"
            shown |= set(b["members"].split())
    assert shown == {name for name, _ in model.named_children()}
    assert {b for b, x in st["boxes"].items() if x["verdict"] == "bad"} == {"module:h"}
    assert all(x["badge"] == BADGE[x["verdict"]] for x in st["boxes"].values())

    # From the top box down to the node, each level's only ✗ is on the way.
    way = [('.sg-node[data-module="h"]', "fold:h.0"),
           ('.sg-node[data-fold="fold:h.0"]', "module:h.1"),
           ('.sg-node[data-module="h.1"]', "module:h.1.mlp"),
           ('.sg-node[data-module="h.1.mlp"]', "module:h.1.mlp.c_fc")]
    for sel, bad_box in way:
        click(page, sel)
        st = state(page)
        assert {b for b, x in st["boxes"].items() if x["verdict"] == "bad"} == {bad_box}
        for bid, b in st["boxes"].items():
            if b["kind"] == "module":
                path = bid.split(":", 1)[1]
                assert b["label"] == f"▸ {path}: {types[path]}"
    # the bad box names the node to look for
    box = st["boxes"]["module:h.1.mlp.c_fc"]
    assert box["sub"] == f"{box['count']} nodes · first bad: AddmmBackward0"
    assert all(" · first bad" not in b["sub"] for b in st["boxes"].values()
               if b["verdict"] != "bad")
    click(page, '.sg-node[data-module="h.1.mlp.c_fc"]')
    st = state(page)
    failing = {i for i, x in st["nodes"].items() if x["status"] == "fail"}
    assert first in failing and failing <= within(g, "h.1.mlp.c_fc")
    assert inside(st["nodes"][first]["rect"], st["frames"]["module:h.1.mlp.c_fc"]["rect"])
    for fid, f in st["frames"].items():
        if f["kind"] == "module":
            path = fid.split(":", 1)[1]
            assert f["label"] == f"▾ {path}: {types[path]}"
            on_way = path in ("h", "h.1", "h.1.mlp", "h.1.mlp.c_fc")
            assert f["verdict"] == ("bad" if on_way else "ok"), path
    page.mouse.move(0, 0)
    page.locator(".sg-canvas").screenshot(path=str(artifacts / "modules-gpt-bad-block1.png"))



def test_a_graph_cut_to_one_module_by_the_kernel_opens_focused(page, gpt_with_wrong_rule):
    """sg.graph(root, focus='h.1'): the payload holds block 1 only; the view draws it as
    the focused module, and a deeper focus goes back to it, not to a whole graph."""
    from symgrad.jupyter.graph import focus_payload

    model, report, g = gpt_with_wrong_rule
    cut = valid(focus_payload(g, "h.1"))
    mount(page, cut)
    st = state(page)
    assert st["focus"] == "h.1" and st["bar"] == "The graph was cut to h.1: Block"
    assert page.locator("[data-symgrad=unfocus]").count() == 0
    assert st["frames"]["module:h.1"]["label"] == "h.1: Block"
    assert st["frames"]["module:h.1"]["verdict"] == "bad"
    boxed = [p for bid, b in st["boxes"].items()
             for p in (b["members"].split() if b["members"] else [bid.split(":", 1)[1]])]
    drawn = set(st["nodes"]).union(*(within(cut, p) for p in boxed))
    assert drawn == {n["id"] for n in cut["nodes"]}
    click(page, '.sg-cluster-head[data-cluster="module:h.1.mlp"] [data-symgrad=focus]')
    st = state(page)
    assert st["focus"] == "h.1.mlp" and st["bar"] == "← h.1 › h.1.mlp: MLP"
    page.click("[data-symgrad=unfocus]")
    assert state(page)["focus"] == "h.1"

def test_jupyterlab_draws_the_saved_model_graph_by_module(browser, lab_server,
                                                          gpt_with_wrong_rule, artifacts):
    """The labextension (the build in this checkout) draws a saved notebook's graph
    output by module, with no kernel: the top-level boxes with their verdicts, the fold of
    the two blocks, block 1 opened down to its bad layer, and block 1 focused."""
    import nbformat

    model, report, g = gpt_with_wrong_rule
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("sg.graph(loss, report=report)")
    cell.outputs = [nbformat.v4.new_output(
        "display_data", data={"application/vnd.symgrad.graph+json": g,
                              "text/plain": "<symgrad graph>"})]
    nb.cells = [cell]
    nbformat.write(nb, lab_server.root / "by_module.ipynb")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{lab_server.url}/lab/workspaces/modules/tree/by_module.ipynb")
        page.locator(".jp-Dialog .jp-Dialog-button", has_text="No Kernel").click(
            timeout=60_000)
        view = page.locator(".jp-OutputArea-output .sg-view[data-symgrad=graph]")
        view.locator(".sg-node").first.wait_for(state="attached", timeout=30_000)
        assert view.get_attribute("data-state") == "ready"
        st = state(page)
        top = {b: x["verdict"] for b, x in st["boxes"].items()}
        assert top == {"fold:wte": "ok", "module:h": "bad", "module:ln_f": "ok",
                       "module:lm_head": "ok"}
        assert st["boxes"]["module:h"]["label"] == "▸ h: ModuleList"
        assert st["boxes"]["fold:wte"]["label"] == "▸ Embedding × 2"
        view.locator('.sg-node[data-module="h"]').click()
        view.locator('.sg-node[data-fold="fold:h.0"]').click()
        view.locator('.sg-node[data-module="h.1"]').click()
        view.locator('.sg-node[data-module="h.1.mlp"]').click()
        st = state(page)
        assert {b for b, x in st["boxes"].items() if x["verdict"] == "bad"} == \
            {"module:h.1.mlp.c_fc"}
        assert st["frames"]["module:h.1"]["label"] == "▾ h.1: Block"
        # (its header is panned out of sight by now: the click goes to the element)
        click(page, '.sg-cluster-head[data-cluster="module:h.1"] [data-symgrad=focus]')
        st = state(page)
        assert st["focus"] == "h.1"
        assert st["nodes"] and set(st["nodes"]) <= within(g, "h.1")
        assert all(b.split(":", 1)[1].startswith("h.1.") for b in st["boxes"])
        assert st["bar"] == "← whole graph › h › h.1: Block"
        view.screenshot(path=str(artifacts / "lab-modules-focus-h1.png"))
        assert errors == []
    finally:
        page.close()
