"""Graph JSON (schema symgrad.graph/1), the pure-Python layout, the static SVG and bundles.

PyTorch is the oracle for the graph's shape: the same code run in torch and in symgrad
freezes to the same grad_fn names, edges, saved operand names and "same object" links.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

import symgrad as sg
from symgrad.jupyter import GRAPH_MIME, graph_json, load_schema
from symgrad.jupyter.graph import Namer, latex_name, preview, text_outline
from symgrad.jupyter.layout import layout, layout_bends, layout_boxes
from symgrad.jupyter.svg import render_html, render_svg

jsonschema = pytest.importorskip("jsonschema")

XSS = "<img src=x onerror=alert(1)>"


def validate(payload: dict) -> None:
    jsonschema.validate(payload, load_schema())
    json.dumps(payload)  # plain JSON, nothing live inside


def tutorial(lib):
    a = lib.tensor(2.0, requires_grad=True)
    b = lib.tensor(3.0, requires_grad=True)
    c = lib.tensor(4.0, requires_grad=True)
    d = 5 * (a + b)
    e = c * d
    return dict(a=a, b=b, c=c, d=d, e=e)


def mlp(lib):
    lib.manual_seed(0)
    x = lib.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5]])
    w1 = lib.tensor([[0.1, -0.2], [0.3, 0.4], [-0.5, 0.6]], requires_grad=True)
    b1 = lib.tensor([0.01, -0.02], requires_grad=True)
    w2 = lib.tensor([[0.7], [-0.8]], requires_grad=True)
    h = (x @ w1 + b1).sigmoid()
    loss = ((h @ w2) ** 2).mean()
    return dict(x=x, w1=w1, b1=b1, w2=w2, h=h, loss=loss)


def structure(payload: dict):
    """(label, kind, shape, saved names + same-object) per node and labelled edges."""
    by_id = {n["id"]: n for n in payload["nodes"]}
    # (a None input's shape is known to symgrad through its weak input refs, not to torch)
    nodes = sorted((n["label"], n["kind"], tuple(n["shape"] or ()) if n["kind"] != "none" else (),
                    tuple(sorted((s["name"], s.get("same_object_as") or "") for s in n["saved"])))
                   for n in payload["nodes"])
    edges = sorted((by_id[e["from"]]["label"], e["input"], by_id[e["to"]]["label"])
                   for e in payload["edges"])
    return nodes, edges


def test_schema_file_is_valid_draft_2020_12():
    schema = load_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["schema"]["const"] == "symgrad.graph/1"
    assert set(schema["$defs"]["node"]["properties"]["kind"]["enum"]) == \
        {"op", "accumulate", "leaf", "none"}


def test_tutorial_graph_json(torch):
    ns = tutorial(sg)
    p = graph_json(ns["e"], ns)
    validate(p)
    assert p["schema"] == "symgrad.graph/1" and p["source"] == "symgrad"
    by_label = {}
    for n in p["nodes"]:
        by_label.setdefault(n["label"], []).append(n)
    root = next(n for n in p["nodes"] if n["id"] == p["roots"][0])
    assert root["label"] == "MulBackward0" and root["variable"] == "e" and root["shape"] == []
    saved = {s["name"]: s for s in root["saved"]}
    assert saved["other"]["same_object_as"] == "d" and saved["other"]["preview"] == "25."
    assert saved["self"]["same_object_as"] == "c" and saved["self"]["kind"] == "tensor"
    assert root["formula"] == "e = c d"
    assert r"\frac{\partial e}{\partial c} = d" in root["derivative"]
    assert r"\frac{\partial e}{\partial d} = c" in root["derivative"]
    assert [lf["name"] for lf in p["leaves"]] == ["c", "a", "b"]
    assert {n["label"] for n in p["nodes"] if n["kind"] == "accumulate"} == {"a", "b", "c"}
    none = [n for n in p["nodes"] if n["kind"] == "none"]
    assert len(none) == 1 and none[0]["variable"] == "5"  # the Python scalar in 5*(a+b)
    assert p["root_names"] == ["e"]
    # torch freezes to the same structure
    tns = tutorial(torch)
    tp = graph_json(tns["e"], tns)
    validate(tp)
    assert tp["source"] == "torch"
    assert structure(graph_json(ns["e"], ns))[1] == structure(tp)[1]
    assert [n["label"] for n in tp["nodes"]] == [n["label"] for n in p["nodes"]]


def test_mlp_matches_torch_structure(torch):
    ns, tns = mlp(sg), mlp(torch)
    p, tp = graph_json(ns["loss"], ns), graph_json(tns["loss"], tns)
    validate(p)
    validate(tp)
    s_nodes, s_edges = structure(p)
    t_nodes, t_edges = structure(tp)
    assert s_edges == t_edges
    # grad_fn names, shapes and saved operand names (torch's _saved_* attributes)
    assert [(n[0], n[1], n[2], tuple(x[0] for x in n[3])) for n in s_nodes] == \
        [(n[0], n[1], n[2], tuple(x[0] for x in n[3])) for n in t_nodes]
    sig = next(n for n in p["nodes"] if n["label"] == "SigmoidBackward0")
    res = {s["name"]: s for s in sig["saved"]}["result"]
    assert res["is_output"] is True and res["shape"] == [2, 2] and res["dtype"] == "float32"
    assert sig["formula"] is not None and "e^{" in sig["formula"]
    mm = [n for n in p["nodes"] if n["label"] == "MmBackward0"]
    # x @ w1 saves x (w1's grad needs it; w1 itself is not needed: x needs no grad),
    # h @ w2 saves h and w2, each the very object the user holds
    assert sorted((s["name"], s.get("same_object_as")) for n in mm for s in n["saved"]
                  if s["kind"] == "tensor") == [("mat2", "w2"), ("self", "h"), ("self", "x")]
    assert any(s["name"] == "mat2" and s["kind"] == "none" for n in mm for s in n["saved"])
    # structural ops get their forward and vector-Jacobian product as LaTeX templates
    assert sorted(n["formula"] for n in mm) == [r"y = h\,w_{2}", r"y = x\,w_{1}"]
    assert any(r"\bar{w_{2}} = h^{\top}\bar{y}" in n["derivative"] for n in mm)
    mean = next(n for n in p["nodes"] if n["label"] == "MeanBackward0")
    assert mean["formula"] == r"\mathrm{loss} = \frac{1}{n}\sum_i \mathrm{self}_i"
    assert sig["derivative"] == (r"\frac{\partial h}{\partial \mathrm{self}} = "
                                 r"\frac{e^{- \mathrm{self}}}{\left(1 + e^{- \mathrm{self}}"
                                 r"\right)^{2}}")


def test_freed_saved_tensors_are_reported():
    ns = tutorial(sg)
    ns["e"].backward()
    p = graph_json(ns["e"], ns)
    validate(p)
    root = p["nodes"][0]
    assert {s["kind"] for s in root["saved"]} == {"freed"}
    assert {lf["name"]: lf["grad_preview"] for lf in p["leaves"]} == \
        {"a": "20.", "b": "20.", "c": "25."}


def test_names_and_previews():
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    b = sg.tensor([3.0, 4.0], requires_grad=True)
    b2 = sg.tensor([5.0, 6.0], requires_grad=True)
    b2.name = "b"
    u = sg.tensor([1.0, 1.0], requires_grad=True)  # unnamed
    y = (a * b + b2 * u).sum()
    p = graph_json(y, {"a": a, "b": b, "_hidden": u})
    names = sorted(lf["name"] for lf in p["leaves"])
    assert names == ["a", "b", "b'", "t0"]
    assert preview(sg.arange(100.0)) == \
        "[0., 1., 2., …, 97., 98., 99.] (100 values, shape [100])"
    assert preview(sg.tensor([[1.5, 2.0]])) == "[1.5, 2.] (shape [1, 2])"
    assert latex_name("w1") == "w_{1}" and latex_name("d'") == "d'"
    assert latex_name(XSS) == r"\text{<img src=x onerror=alert(1)>}"
    assert latex_name("a_b{") == r"\text{a\_b\{}"
    n = Namer({"In": a, "x": a})
    assert n.variable(a) == "x"


def test_grad_fn_and_list_roots_and_truncation():
    ns = tutorial(sg)
    p = graph_json(ns["e"].grad_fn)
    validate(p)
    assert p["root_names"] == ["root"] and len(p["nodes"]) == 7
    both = graph_json([ns["e"], ns["d"]], ns)
    assert len(both["roots"]) == 2 and len(both["nodes"]) == 7
    x = sg.tensor(1.0, requires_grad=True)
    y = x
    for _ in range(50):
        y = y * 1.0
    cut = graph_json(y, max_nodes=10)
    validate(cut)
    assert len(cut["nodes"]) <= 10 + 10 and cut["truncated"] > 0
    leaf = graph_json(x, {"x": x})
    assert leaf["nodes"][0]["kind"] == "leaf" and leaf["roots"] == ["n0"]


def test_layout_layers_no_overlap_and_edges_go_down():
    ns = mlp(sg)
    p = graph_json(ns["loss"], ns)
    lay = layout([n["id"] for n in p["nodes"]], [(e["from"], e["to"]) for e in p["edges"]],
                 {n["id"]: 100.0 for n in p["nodes"]})
    assert set(lay.boxes) == {n["id"] for n in p["nodes"]}
    for e in p["edges"]:  # consumers are drawn above what they consume
        assert lay.boxes[e["from"]][1] < lay.boxes[e["to"]][1]
    rows: dict[float, list] = {}
    for x, y, w, _h in lay.boxes.values():
        rows.setdefault(y, []).append((x, x + w))
    for spans in rows.values():
        spans.sort()
        for (_, r0), (l1, _) in zip(spans, spans[1:]):
            assert l1 >= r0 - 1e-6
    assert all(0 <= x and x + w <= lay.width for x, _y, w, _h in lay.boxes.values())
    # long edges bend through dummy points instead of crossing layers straight
    assert all(len(pts) >= 2 for _a, _b, pts in lay.edges)


def test_layout_scales():
    import time

    ids = [f"n{i}" for i in range(600)]
    edges = [(f"n{i}", f"n{i + 1}") for i in range(599)] + \
        [(f"n{i}", f"n{i + 7}") for i in range(0, 590, 5)]
    t0 = time.perf_counter()
    lay = layout(ids, edges)
    assert time.perf_counter() - t0 < 5.0
    assert len(lay.boxes) == 600


def test_svg_is_well_formed_and_marks_nodes():
    ns = tutorial(sg)
    p = graph_json(ns["e"], ns)
    svg = render_svg(p, selected="n0")
    root = ET.fromstring(svg)
    groups = [g for g in root.iter("{http://www.w3.org/2000/svg}g")
              if g.get("class") == "sg-node"]
    assert len(groups) == len(p["nodes"])
    kinds = sorted(g.get("data-kind") for g in groups)
    assert kinds == ["accumulate"] * 3 + ["none"] + ["op"] * 3
    assert [g.get("data-id") for g in groups if g.get("data-selected")] == ["n0"]
    texts = "".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "MulBackward0" in texts and "AddBackward0" in texts and "AccumulateGrad" in texts
    paths = [e for e in root.iter("{http://www.w3.org/2000/svg}path")
             if e.get("class") == "sg-edge"]
    assert len(paths) == len(p["edges"])


def test_xss_name_is_escaped_in_graph_outputs():
    evil = sg.tensor([1.0, 2.0], requires_grad=True)
    evil.name = XSS
    y = (evil * evil).sum()
    p = graph_json(y, {"y": y})
    validate(p)
    html = render_html(p)
    svg = render_svg(p)
    for out in (html, svg):
        assert "<img" not in out
        assert "&lt;img src=x onerror=alert(1)&gt;" in out
    ET.fromstring(svg)  # still well-formed XML
    bundle = sg.graph(y)._repr_mimebundle_()
    assert "<img" not in bundle["text/html"]
    assert bundle[GRAPH_MIME]["leaves"][0]["name"] == XSS  # JSON keeps the raw text
    node = next(n for n in p["nodes"] if n["label"] == "MulBackward0")
    assert r"\text{<img src=x onerror=alert(1)>}" in node["formula"]


def test_mime_bundles_and_plain_tensor_repr():
    import symgrad.jupyter  # noqa: F401  (installs the grad_fn display hooks)

    ns = tutorial(sg)
    bundle = ns["e"].grad_fn._repr_mimebundle_()
    assert set(bundle) == {GRAPH_MIME, "text/html", "text/plain"}
    validate(bundle[GRAPH_MIME])
    assert re.fullmatch(r"<MulBackward0 object at 0x[0-9a-f]+>", bundle["text/plain"])
    assert "<svg" in bundle["text/html"]
    assert not hasattr(ns["e"], "_repr_mimebundle_") and not hasattr(ns["e"], "_repr_html_")
    assert repr(ns["e"]) == "tensor(100., grad_fn=<MulBackward0>)"
    view = sg.graph(ns["e"], ns)
    b = view._repr_mimebundle_()
    assert {k: v for k, v in b[GRAPH_MIME].items() if k != "layout"} == view.to_json()
    assert set(b[GRAPH_MIME]["layout"]["nodes"]) == {n["id"] for n in view.to_json()["nodes"]}
    assert text_outline(b[GRAPH_MIME]).splitlines() == [
        "symgrad graph: 3 op nodes, 3 leaves",
        "MulBackward0 []",
        "  AccumulateGrad (c) []",
        "  MulBackward0 []",
        "    AddBackward0 []",
        "      AccumulateGrad (a) []",
        "      AccumulateGrad (b) []",
        "    None",
    ]


def test_import_symgrad_stays_light():
    import subprocess
    import sys

    code = ("import sys, symgrad; bad=[m for m in ('ipywidgets','IPython','sympy','traitlets')"
            " if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def _loop_graph(n_iter: int = 250) -> dict:
    w = sg.tensor([0.5, 0.25], requires_grad=True)
    bb = sg.tensor([0.1, 0.2], requires_grad=True)
    h = sg.tensor([1.0, 2.0], requires_grad=True)
    z = h
    for _ in range(n_iter):
        z = z * w + bb
    return graph_json(z, {"w": w, "bb": bb, "h": h})


def test_static_svg_of_a_500_op_loop_is_small_and_collapsed():
    import time

    p = _loop_graph()
    assert len(p["nodes"]) == 503
    t0 = time.perf_counter()
    html = render_html(p)
    dt = time.perf_counter() - t0
    print(f"\nstatic SVG of a 500-op loop: {len(html) / 1e3:.1f} KB in {dt * 1e3:.0f} ms")
    assert len(html) < 300_000
    root = ET.fromstring(render_svg(p))
    groups = [g for g in root.iter("{http://www.w3.org/2000/svg}g")
              if g.get("class") == "sg-node"]
    kinds = sorted(g.get("data-kind") for g in groups)
    # the root, one box for the other 499 ops, and each leaf drawn once
    assert kinds == ["accumulate"] * 3 + ["chain", "op"]
    chain = next(g for g in groups if g.get("data-kind") == "chain")
    assert chain.get("data-members") == "499"
    texts = [t.text for t in chain.iter("{http://www.w3.org/2000/svg}text")]
    assert texts[0] == "(MulBackward0 \u2192 AddBackward0) \u00d7 249 + 1"
    # the shared leaves w and bb get one edge each from the chain, not 250
    paths = [e for e in root.iter("{http://www.w3.org/2000/svg}path")
             if e.get("class") == "sg-edge"]
    targets = sorted((e.get("data-from").startswith("chain:"), e.get("data-to"))
                     for e in paths)
    assert len(paths) == 5 and len(set(targets)) == 5
    # a selected node inside the run stays visible (the run splits around it)
    inner = next(n["id"] for n in p["nodes"] if n["label"] == "MulBackward0"
                 and n["id"] not in p["roots"] and n["order"] > 200)
    svg = render_svg(p, selected=inner)
    assert re.search(f'data-id="{inner}"[^>]*data-selected="true"', svg)
    assert svg.count('data-kind="chain"') == 2


def test_layout_bounds_bend_points_for_shared_leaves():
    # every op of the loop consumes w or bb: without a budget the edges to those leaves
    # need ~n^2/2 dummy points; with it the drawing stays linear in the graph size
    p = _loop_graph()
    ids = [n["id"] for n in p["nodes"]]
    lay = layout(ids, [(e["from"], e["to"]) for e in p["edges"]])
    points = sum(len(pts) for _a, _b, pts in lay.edges)
    assert len(lay.boxes) == 503 and points <= 2 * len(p["edges"]) + 2 * (4 * 503 + 64)
    for a, b, pts in lay.edges:  # still drawn from the consumer down to the input
        assert pts[0][1] == lay.boxes[a][1] + lay.boxes[a][3] and pts[-1][1] == lay.boxes[b][1]


def test_uncollapsed_500_op_svg_stays_linear(monkeypatch):
    import time

    import symgrad.jupyter.layout as layout_mod

    monkeypatch.setattr(layout_mod, "AUTO_COLLAPSE_NODES", 10**9)
    p = _loop_graph()
    t0 = time.perf_counter()
    svg = render_svg(p)
    dt = time.perf_counter() - t0
    print(f"\nuncollapsed SVG of a 500-op loop: {len(svg) / 1e3:.1f} KB in {dt * 1e3:.0f} ms")
    root = ET.fromstring(svg)
    assert sum(1 for g in root.iter("{http://www.w3.org/2000/svg}g")
               if g.get("class") == "sg-node") == 503
    assert len(svg) < 1_000_000  # ~1 KB per node; it was 4.7 MB with n^2 bend points


def _svg_boxes(svg: str) -> dict[str, list[float]]:
    root = ET.fromstring(svg)
    out = {}
    for g in root.iter("{http://www.w3.org/2000/svg}g"):
        if g.get("class") == "sg-node":
            r = g.find("{http://www.w3.org/2000/svg}rect")
            out[g.get("data-id")] = [float(r.get(k)) for k in ("x", "y", "width", "height")]
    return out


def test_payload_layout_is_what_the_static_svg_draws():
    # the one layout: the bundle's JSON ships it, its SVG draws exactly those boxes and
    # routes (the labextension draws the same numbers: tests/browser/test_renderer.py)
    ns = mlp(sg)
    a = ns["w1"]
    ns["y"] = ((a * 2.0).exp().sin() + a).sum() + ns["loss"]  # a's edge from + spans layers
    b = sg.graph(ns["y"], ns)._repr_mimebundle_()
    p = b[GRAPH_MIME]
    validate(p)
    lay = p["layout"]
    boxes = layout_boxes(lay)
    assert set(boxes) == {n["id"] for n in p["nodes"]}
    assert all(v == int(v) for box in boxes.values() for v in box)  # whole pixels
    assert _svg_boxes(b["text/html"]) == boxes
    bends = layout_bends(lay)
    assert bends
    root = ET.fromstring(render_svg(p))
    for path in root.iter("{http://www.w3.org/2000/svg}path"):
        if path.get("class") != "sg-edge":
            continue
        a, bb = path.get("data-from"), path.get("data-to")
        nums = [float(v) for v in path.get("d").replace("M", "").replace("L", "").split()]
        ax, ay, aw, ah = boxes[a]
        bx, by, bw, _ = boxes[bb]
        assert nums == [ax + aw / 2, ay + ah, *bends.get((a, bb), []), bx + bw / 2, by]
    # boxes of a layer never overlap, consumers sit above their inputs
    for e in p["edges"]:
        assert boxes[e["from"]][1] < boxes[e["to"]][1]
    rows: dict[float, list] = {}
    for x, y, w, h in boxes.values():
        rows.setdefault(y + h / 2, []).append((x, x + w))
    for spans in rows.values():
        spans.sort()
        assert all(l1 >= r0 for (_, r0), (l1, _) in zip(spans, spans[1:]))
    assert all(x + w <= lay["width"] and y + h <= lay["height"]
               for x, y, w, h in boxes.values())


def test_payload_layout_of_a_collapsed_loop_is_small():
    p = _loop_graph()
    from symgrad.jupyter.graph import mimebundle

    out = mimebundle(p)[GRAPH_MIME]
    validate(out)
    lay = out["layout"]
    # the chain box and the nodes around it: what the labextension draws first
    assert sorted(k.startswith("chain:") for k in lay["nodes"]) == [False] * 4 + [True]
    assert len(json.dumps(lay, separators=(",", ":"))) < 600
    # a selection inside the run splits it: the SVG lays that view out again
    inner = next(n["id"] for n in p["nodes"] if n["label"] == "MulBackward0"
                 and n["id"] not in p["roots"] and n["order"] > 200)
    svg = render_svg(out, selected=inner)
    assert svg.count('data-kind="chain"') == 2 and inner in _svg_boxes(svg)
    # a stale or foreign layout is not used
    assert _svg_boxes(render_svg(dict(out, layout={"width": 1, "height": 1, "nodes": {}})))


# -- formula lines of conv, pool and attention nodes (OpSpec.formula_tex) --------------------

_SVG = "{http://www.w3.org/2000/svg}"


def _cnn(conv_kw: dict, max_kw: dict, avg_kw: dict, adaptive: int, seed: int = 0):
    """A tiny CNN: conv -> max pool -> avg pool -> adaptive avg pool -> a weighted sum."""
    import symgrad.nn.functional as F

    sg.manual_seed(seed)
    x = sg.randn(1, 4, 9, 9, requires_grad=True)
    conv = sg.nn.Conv2d(4, 6, 3, **conv_kw)
    c = conv(x)
    m = F.max_pool2d(c, **max_kw)
    a = F.avg_pool2d(m, **avg_kw)
    out = F.adaptive_avg_pool2d(a, adaptive)
    return dict(x=x, w=conv.weight, b=conv.bias, c=c, m=m, a=a, out=out,
                loss=(out * sg.randn(*out.shape)).sum())


def _node(payload: dict, name: str) -> dict:
    (n,) = [n for n in payload["nodes"] if n["name"] == name]
    return n


def test_conv_and_pool_nodes_have_formula_lines_with_their_numbers():
    ns = _cnn(dict(stride=2, padding=1, dilation=2, groups=2),
              dict(kernel_size=2, stride=1, padding=1), dict(kernel_size=2), 1)
    p = graph_json(ns["loss"], ns)
    validate(p)
    conv = _node(p, "ConvolutionBackward0")
    assert conv["formula"] == (
        r"c[n,o,i,j] = b[o] + \sum_{c<2,\,p<3,\,q<3} w[o,c,p,q]\,"
        r"x[n,\,2\lfloor o/3\rfloor+c,\,2i+2p-1,\,2j+2q-1]\quad(\text{zero outside }x)")
    assert r"\bar{b}[o] = \sum_{n,i,j} \bar{c}[n,o,i,j]" in conv["derivative"]
    assert _node(p, "MaxPool2DWithIndicesBackward0")["formula"] == (
        r"m[n,c,i,j] = \max_{p<2,\,q<2} c[n,\,c,\,i+p-1,\,j+q-1]"
        r"\quad(\text{padding is skipped})")
    assert _node(p, "AvgPool2DBackward0")["formula"] == (
        r"a[n,c,i,j] = \frac{1}{4}\sum_{p<2,\,q<2} m[n,\,c,\,2i+p,\,2j+q]")
    # the same net with other numbers gives other lines: nothing is a fixed template
    ns2 = _cnn(dict(padding=0), dict(kernel_size=3, stride=2, dilation=2),
               dict(kernel_size=2, stride=1, padding=1, count_include_pad=False), 2)
    p2 = graph_json(ns2["loss"], ns2)
    validate(p2)
    assert _node(p2, "ConvolutionBackward0")["formula"] == (
        r"c[n,o,i,j] = b[o] + \sum_{c<4,\,p<3,\,q<3} w[o,c,p,q]\,x[n,\,c,\,i+p,\,j+q]")
    assert _node(p2, "MaxPool2DWithIndicesBackward0")["formula"] == (
        r"m[n,c,i,j] = \max_{p<3,\,q<3} c[n,\,c,\,2i+2p,\,2j+2q]")
    assert _node(p2, "AvgPool2DBackward0")["formula"] == (
        r"a[n,c,i,j] = \frac{1}{N_{ij}}\sum_{p<2,\,q<2} m[n,\,c,\,i+p-1,\,j+q-1]"
        r"\quad(N_{ij}\text{: window positions inside the input})")
    # conv 9 -> 7, max pool (k 3, s 2, d 2) 7 -> 2, avg pool (s 1, pad 1) 2 -> 3, then 3 -> 2:
    # overlapping windows [floor(3i/2), ceil(3(i+1)/2))
    assert _node(p2, "AdaptiveAvgPool2DBackward0")["formula"] == (
        r"\mathrm{out}[n,c,i,j] = \operatorname{mean}_{\lfloor 3i/2\rfloor\le p<"
        r"\lceil 3(i+1)/2\rceil,\; \lfloor 3j/2\rfloor\le q<\lceil 3(j+1)/2\rceil} a[n,c,p,q]")


def _py_index(expr: str) -> str:
    """An index of a formula line's plain text as Python: ``2⌊o/3⌋+c`` -> ``2*(o//3)+c``."""
    expr = re.sub(r"⌊(\w)/(\d+)⌋", r"(\1//\2)", expr.strip())
    return re.sub(r"(\d)([a-z(])", r"\1*\2", expr)


def _evaluate_line(text: str, x, w=None, b=None, out_shape=()):
    """Run a conv/pool formula line literally (its sum or max over its bounds, its index
    arithmetic) with NumPy loops; positions outside ``x`` are skipped (zero / never win)."""
    import itertools

    import numpy as np

    lhs, rhs = text.split(" = ", 1)
    bounds = dict(re.findall(r"(\w)<(\d+)", re.search(r"_\{([^}]*)\}", rhs).group(1)))
    idx = [_py_index(e) for e in re.search(r"(?:^|\s)x\[([^\]]*)\]", rhs).group(1).split(",")]
    w_idx = re.search(r"w\[([^\]]*)\]", rhs)
    w_idx = [_py_index(e) for e in w_idx.group(1).split(",")] if w_idx else None
    out = np.zeros(out_shape)
    names = ("n", "o", "i", "j") if w is not None else ("n", "c", "i", "j")
    for pos in itertools.product(*(range(s) for s in out_shape)):
        env = dict(zip(names, pos))
        vals = []
        for taps in itertools.product(*(range(int(k)) for k in bounds.values())):
            env.update(zip(bounds, taps))
            at = tuple(eval(e, {}, env) for e in idx)  # noqa: S307 - our own test text
            if not all(0 <= a < s for a, s in zip(at, x.shape)):
                continue
            v = x[at]
            vals.append(v * w[tuple(eval(e, {}, env) for e in w_idx)] if w is not None else v)
        if w is not None:
            out[pos] = b[env["o"]] + sum(vals)
        elif rhs.startswith(r"max"):
            out[pos] = max(vals)
        else:
            out[pos] = sum(vals) / int(re.match(r"1/(\d+)", rhs).group(1))
    return out


@pytest.mark.parametrize("conv_kw", [dict(stride=2, padding=1, dilation=2, groups=2),
                                     dict(stride=3, padding=2), dict(dilation=3)])
def test_conv_and_pool_formula_lines_compute_what_torch_computes(conv_kw, torch):
    """The lines are the ops' meaning, not decoration: evaluated literally, they give
    torch's conv2d / max_pool2d / avg_pool2d outputs for the same numbers."""
    from _tolerance import assert_close

    from symgrad.jupyter.svg import tex_to_text

    ns = _cnn(conv_kw, dict(kernel_size=2, stride=1, padding=1), dict(kernel_size=2), 1)
    p = graph_json(ns["loss"], {"x": ns["x"], "w": ns["w"], "b": ns["b"]})
    x, w, b = (ns[k].detach().numpy().astype("float64") for k in ("x", "w", "b"))
    line = tex_to_text(_node(p, "ConvolutionBackward0")["formula"]).split(" (")[0]
    ours = _evaluate_line(line, x, w, b, tuple(ns["c"].shape))
    tx, tw, tb = (torch.tensor(v) for v in (x, w, b))
    want = torch.nn.functional.conv2d(tx, tw, tb, **conv_kw).numpy()
    assert_close(ours, want, terms=w[0].size, scale=float(abs(x).max() * abs(w).max()))
    c = ns["c"].detach().numpy().astype("float64")
    line = tex_to_text(_node(p, "MaxPool2DWithIndicesBackward0")["formula"])
    line = line.split(" (")[0].replace(r" self[", " x[")  # its input has no name here
    got = _evaluate_line(line, c, out_shape=tuple(ns["m"].shape))
    assert (got == torch.nn.functional.max_pool2d(torch.tensor(c), 2, 1, 1).numpy()).all()
    m = ns["m"].detach().numpy().astype("float64")
    line = tex_to_text(_node(p, "AvgPool2DBackward0")["formula"]).replace(" self[", " x[")
    got = _evaluate_line(line, m, out_shape=tuple(ns["a"].shape))
    assert_close(got, torch.nn.functional.avg_pool2d(torch.tensor(m), 2).numpy(), terms=4)


def test_attention_nodes_have_formula_lines():
    import symgrad.nn.functional as F

    sg.manual_seed(3)
    q = sg.randn(2, 5, 8, requires_grad=True)
    attn = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    p = graph_json(attn.sum(), {"q": q, "attn": attn})
    validate(p)
    bmm = [n["formula"] for n in p["nodes"] if n["name"] == "BmmBackward0"]
    # q k^T over the head dim 8, then the weights times v over the 5 keys
    assert sorted(bmm) == sorted([
        r"y[b,i,j] = \sum_{k<8} \mathrm{self}[b,i,k]\,\mathrm{mat}_{2}[b,k,j]",
        r"y[b,i,j] = \sum_{k<5} \mathrm{self}[b,i,k]\,\mathrm{mat}_{2}[b,k,j]"])
    soft = _node(p, "SafeSoftmaxBackward0")  # torch 2.13's math path
    assert soft["formula"] == (
        r"y[\dots,\,i] = \frac{e^{\mathrm{self}[\dots,\,i]}}{\sum_{j<5} "
        r"e^{\mathrm{self}[\dots,\,j]}}\quad(\text{along dim 2})")
    assert soft["derivative"].startswith(r"\bar{\mathrm{self}} = y\odot")
    # the causal mask is added as a -inf bias (torch 2.13's math path: AddBackward0)
    assert _node(p, "AddBackward0")["formula"] == r"y = \mathrm{self} + \mathrm{other}"


def test_static_svg_shows_the_formula_lines():
    from symgrad.jupyter.svg import tex_to_text

    ns = _cnn(dict(stride=2, padding=1), dict(kernel_size=2, stride=1), dict(kernel_size=2), 2)
    p = graph_json(ns["loss"], ns)
    root = ET.fromstring(render_svg(p))
    titles = {g.get("data-id"): g.find(f"{_SVG}title").text for g in root.iter(f"{_SVG}g")
              if g.get("class") == "sg-node"}
    conv = _node(p, "ConvolutionBackward0")
    text = tex_to_text(conv["formula"])
    assert text == ("c[n,o,i,j] = b[o] + Σ_{c<4, p<3, q<3} w[o,c,p,q] "
                    "x[n, c, 2i+p-1, 2j+q-1] (zero outside x)")
    assert text in titles[conv["id"]].split("\n")
    for name in ("MaxPool2DWithIndicesBackward0", "AvgPool2DBackward0",
                 "AdaptiveAvgPool2DBackward0"):
        n = _node(p, name)
        assert tex_to_text(n["formula"]) in titles[n["id"]], name
    assert "max_{p<2, q<2} c[n, c, i+p, j+q]" in titles[
        _node(p, "MaxPool2DWithIndicesBackward0")["id"]]
    # and in the text/html fallback, which embeds the same SVG
    assert text.replace("<", "&lt;") in render_html(p)
