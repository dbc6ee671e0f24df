"""Module-aware graphs (issue 30, scope 1): every node knows the nn.Module call that made
it, the payload groups nodes into module boxes with verdicts, folds repeated blocks, and
the static SVG draws them."""

from __future__ import annotations

import threading
import weakref

import pytest
from _gpt_tiny import tiny_gpt_loss

import symgrad as sg
import symgrad.nn as nn
import symgrad.nn.functional as F
from symgrad.jupyter.graph import graph_json, load_schema

jsonschema = pytest.importorskip("jsonschema")


def _by_module(payload: dict) -> dict[str, list[str]]:
    """module path -> op labels made directly in it."""
    out: dict[str, list[str]] = {}
    for n in payload["nodes"]:
        if n["kind"] == "op":
            out.setdefault(n["module"], []).append(n["label"])
    return out


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.act = nn.Tanh()

    def forward(self, x):
        return F.relu(self.act(self.fc(x))) * 2.0  # a functional call and an operator


def test_nested_modules_and_functional_calls_name_their_nodes():
    model = nn.Sequential(Inner(), Inner())
    x = sg.randn(2, 3)
    y = model(x).sum()  # the sum is made outside any module call
    payload = graph_json(y, formulas=False)
    jsonschema.validate(payload, load_schema())
    ops = _by_module(payload)
    assert ops[""] == ["SumBackward0"]
    for k in ("0", "1"):
        # ReluBackward0 and MulBackward0 come from Inner.forward itself
        assert sorted(ops[k]) == ["MulBackward0", "ReluBackward0"]
        assert ops[f"{k}.act"] == ["TanhBackward0"]
        assert ops[f"{k}.fc"] and all(lbl != "TanhBackward0" for lbl in ops[f"{k}.fc"])
    # parameters' AccumulateGrad nodes sit in the module owning them
    acc = {n["label"]: n["module"] for n in payload["nodes"] if n["kind"] == "accumulate"}
    assert acc == {"0.fc.weight": "0.fc", "0.fc.bias": "0.fc", "1.fc.weight": "1.fc",
                   "1.fc.bias": "1.fc"}
    mods = {m["path"]: m for m in payload["modules"]}
    assert list(mods) == ["0", "0.fc", "0.act", "1", "1.fc", "1.act"]  # named_modules order
    assert mods["0.fc"]["parent"] == "0" and mods["0"]["parent"] is None
    assert (mods["0"]["depth"], mods["0.act"]["depth"]) == (1, 2)
    assert mods["0"]["type"] == "Inner" and mods["0.fc"]["type"] == "Linear"
    # transitive membership: a block holds its children's nodes
    assert set(mods["0.fc"]["nodes"]) | set(mods["0.act"]["nodes"]) < set(mods["0"]["nodes"])
    assert payload["folds"] == [{"label": "Inner \u00d7 2", "parent": None,
                                 "members": ["0", "1"]}]
    assert payload["collapsed"] == []  # a small graph is drawn expanded


class Shared(nn.Module):
    """One activation module called twice, and one Linear registered under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = self.a
        self.act = nn.Sigmoid()

    def forward(self, x):
        return self.act(self.b(self.act(self.a(x))))


def test_shared_module_gives_its_first_name():
    model = Shared()
    x = sg.randn(1, 2)
    payload = graph_json(model(x).sum(), formulas=False)
    ops = _by_module(payload)
    assert ops["act"] == ["SigmoidBackward0", "SigmoidBackward0"]
    assert "b" not in ops and len(ops["a"]) >= 2  # both calls of the shared Linear
    assert [m["path"] for m in payload["modules"]] == ["a", "act"]


def test_repeated_blocks_fold_and_big_graphs_collapse_to_top_level():
    model, loss = tiny_gpt_loss()
    payload = graph_json(loss, formulas=False)
    jsonschema.validate(payload, load_schema())
    ops = _by_module(payload)
    assert "ScaledDotProductAttentionBackward0" in " ".join(ops["h.1.attn"]) or \
        any("Softmax" in lbl or "Bmm" in lbl or "Attention" in lbl for lbl in ops["h.1.attn"])
    assert ops["h.0.mlp.gelu"] == ["GeluBackward0"] == ops["h.1.mlp.gelu"]
    assert "NllLossBackward0" in ops[""]  # F.cross_entropy in the root's forward
    mods = {m["path"]: m for m in payload["modules"]}
    assert mods["h"]["type"] == "ModuleList" and mods["h.0"]["parent"] == "h"
    assert mods["h.0"]["signature"] == mods["h.1"]["signature"]
    assert mods["h.0"]["signature"] != mods["h.0.mlp"]["signature"]
    assert {"label": "Block \u00d7 2", "parent": "h", "members": ["h.0", "h.1"]} \
        in payload["folds"]
    assert len(payload["nodes"]) > 60
    assert payload["collapsed"] == ["wte", "wpe", "h", "ln_f", "lm_head"]


def test_a_different_block_breaks_the_fold():
    model, _ = tiny_gpt_loss()
    model.h[1].mlp.gelu = nn.ReLU()
    idx, tg = sg.tensor([[0, 1]]), sg.tensor([[1, 2]])
    payload = graph_json(model(idx, tg), formulas=False)
    mods = {m["path"]: m for m in payload["modules"]}
    assert mods["h.0"]["signature"] != mods["h.1"]["signature"]
    assert not any(f["parent"] == "h" for f in payload["folds"])


def test_module_stack_is_restored_after_an_exception_and_per_thread():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    with pytest.raises(ValueError):
        Boom()(sg.randn(1))
    x = sg.randn(2, requires_grad=True)
    assert (x * 2).grad_fn._module_call is None

    made = {}

    class Waits(nn.Module):
        def forward(self, x):
            t = threading.Thread(target=lambda: made.update(y=x * 3))
            t.start()
            t.join()
            return x * 2

    out = Waits()(x)
    assert out.grad_fn._module_call is not None
    assert made["y"].grad_fn._module_call is None  # made in another thread, outside


def test_a_graph_keeps_no_module_alive_and_makes_no_cycle(no_gc):
    model = nn.Sequential(Inner(), Inner())
    x = sg.randn(64, 3)
    before = sg.memory_allocated()
    y = model(x).sum()
    assert sg.memory_allocated() > before  # the forward's saved activations
    node = weakref.ref(y.grad_fn.next_functions[0][0])
    assert node()._module_call is not None
    m_ref = weakref.ref(model)
    params = list(model.parameters())  # counted in ``before``: kept to the end
    del model  # the graph holds the module weakly (its parameters stay alive)
    assert m_ref() is None
    del y  # and the graph frees at once, by reference counting alone
    assert node() is None
    assert sg.memory_allocated() == before
    del params


def test_torch_graphs_have_modules_only_when_captured():
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh())
            self.head = torch.nn.Linear(2, 1)

        def forward(self, x):
            return self.head(self.body(x) * 2.0)

    net = Net()
    payload = graph_json(net(torch.ones(1, 2)).sum(), formulas=False)
    jsonschema.validate(payload, load_schema())
    assert payload["modules"] == [] and payload["folds"] == []  # torch nodes know no module
    assert {n["module"] for n in payload["nodes"]} == {""}

    x = torch.ones(1, 2, requires_grad=True)
    with sg.capture_torch():
        loss = net(x * 3.0).sum()  # x * 3.0 made outside any module, consumed inside
    payload = graph_json(loss, formulas=False)
    jsonschema.validate(payload, load_schema())
    ops = _by_module(payload)
    assert ops["body.1"] == ["TanhBackward0"]
    assert sorted(ops[""]) == ["MulBackward0", "MulBackward0", "SumBackward0"]
    # F.linear's addmm, and the t() inside it that the capture never saw returned
    assert sorted(ops["body.0"]) == sorted(ops["head"]) == ["AddmmBackward0", "TBackward0"]
    assert [m["path"] for m in payload["modules"]] == ["body", "body.0", "body.1", "head"]
    acc = sorted(n["module"] for n in payload["nodes"] if n["kind"] == "accumulate")
    assert acc == ["", "body.0", "body.0", "head", "head"]  # x, weights and biases


def _nodes_of(root) -> list:
    seen, stack, out = set(), [root.grad_fn], []
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n)
        stack += [f for f, _ in n.next_functions]
    return out


def test_planted_wrong_rule_in_block_1_is_found_from_the_top_box_down(monkeypatch):
    model, loss = tiny_gpt_loss()
    target = model.h[1].mlp.c_fc
    bad = next(n for n in _nodes_of(loss) if n.name() == "AddmmBackward0"
               and n._module_call[0]() is target)
    real = type(bad).apply

    def wrong(self, grad_outputs, needed):
        # the rule is 0.1% off for the nodes made inside h.1.mlp.c_fc only
        out = list(real(self, grad_outputs, needed))
        call = self._module_call
        if call is not None and call[0]() is target and out[1] is not None:
            out[1] = out[1] * 1.001
        return out

    monkeypatch.setattr(type(bad), "apply", wrong)
    report = sg.verify(loss, names=dict(model.named_parameters()), mode="local", sample=2)
    assert not report.ok and report.first_bad_node is bad
    assert report.first_bad_node_label.startswith("AddmmBackward0 in h.1.mlp.c_fc (#")
    assert "first bad node: AddmmBackward0 in h.1.mlp.c_fc (#" in report.summary()
    rows = report.to_json()["nodes"]
    assert {r["module"] for r in rows if r["status"] == "mismatch"} == {"h.1.mlp.c_fc"}
    payload = graph_json(loss, report=report, formulas=False)
    jsonschema.validate(payload, load_schema())
    verdicts = {m["path"]: m["verdict"] for m in payload["modules"]}
    bad_boxes = {"h", "h.1", "h.1.mlp", "h.1.mlp.c_fc"}  # the box and its ancestors
    assert {p for p, v in verdicts.items() if v == "bad"} == bad_boxes
    assert all(v == "ok" for p, v in verdicts.items() if p not in bad_boxes)
    first = payload["agreement"]["first_bad_node"]
    assert all(m["first_bad"] == first for m in payload["modules"] if m["path"] in bad_boxes)
    assert next(n for n in payload["nodes"] if n["id"] == first)["module"] == "h.1.mlp.c_fc"


def test_boxes_without_checks_are_unchecked():
    model, loss = tiny_gpt_loss()
    payload = graph_json(loss, formulas=False)
    assert {m["verdict"] for m in payload["modules"]} == {"unchecked"}
    assert all(m["first_bad"] is None for m in payload["modules"])


def _svg_parts(svg: str):
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    frames = {g.get("data-path"): g for g in root.iter(ns + "g")
              if g.get("class") == "sg-module"}
    boxes = {g.get("data-id"): g for g in root.iter(ns + "g")
             if g.get("class") == "sg-node" and g.get("data-kind") == "module"}
    texts = {g.get("data-id"): [t.text for t in g.iter(ns + "text")] for g in boxes.values()}
    return frames, boxes, texts


def test_svg_draws_collapsed_modules_folds_and_expanded_frames():
    model, loss = tiny_gpt_loss()
    view = sg.graph(loss, collapse=None)
    svg = view._repr_html_()
    svg = svg[svg.index("<svg"):svg.index("</svg>") + 6]
    frames, boxes, texts = _svg_parts(svg)
    # a big graph: one box per top-level module; the two embeddings fold
    assert set(boxes) == {"fold:wte", "module:h", "module:ln_f", "module:lm_head"}
    in_h = sum(1 for n in graph_json(loss, formulas=False)["nodes"]  # what h's box holds
               if (n.get("module") or "") == "h" or (n.get("module") or "").startswith("h."))
    assert in_h > 20  # both blocks' attention, MLP and norms
    assert texts["module:h"] == ["h: ModuleList", f"{in_h} nodes \u00b7 not checked"]
    assert texts["fold:wte"][0] == "Embedding \u00d7 2"
    assert not frames  # nothing expanded

    svg = sg.graph(loss, collapse=2)._repr_html_()
    frames, boxes, texts = _svg_parts(svg[svg.index("<svg"):svg.index("</svg>") + 6])
    assert set(boxes) == {"fold:h.0"}  # both blocks collapsed: one "Block × 2" box
    assert texts["fold:h.0"][0] == "Block \u00d7 2"
    assert boxes["fold:h.0"].get("data-paths") == "h.0 h.1"
    assert set(frames) == {"wte", "wpe", "h", "ln_f", "lm_head"}  # frames around the rest

    svg = sg.graph(loss, collapse=["h.1"])._repr_html_()
    frames, boxes, texts = _svg_parts(svg[svg.index("<svg"):svg.index("</svg>") + 6])
    assert set(boxes) == {"module:h.1"} and texts["module:h.1"][0] == "h.1: Block"
    assert "h.0.attn.c_attn" in frames and "h.1.attn" not in frames


def test_verdict_badges_in_svg_and_focus_on_one_module(monkeypatch):
    model, loss = tiny_gpt_loss()
    report = sg.verify(loss, names=dict(model.named_parameters()), mode="local", sample=2)
    assert report.ok
    svg = sg.graph(loss, report=report, collapse=True)._repr_html_()
    frames, boxes, texts = _svg_parts(svg[svg.index("<svg"):svg.index("</svg>") + 6])
    assert texts["module:h"][1].endswith("\u00b7 \u2713")
    assert boxes["module:h"].get("data-verdict") == "ok"

    view = sg.graph(loss, report=report, focus="h.0.attn")
    p = view.payload
    jsonschema.validate(p, load_schema())
    assert p["focus"] == "h.0.attn" and p["collapsed"] == []
    assert {n["module"] for n in p["nodes"]} == {"h.0.attn", "h.0.attn.c_attn",
                                                  "h.0.attn.c_proj"}
    assert [m["path"] for m in p["modules"]] == ["h.0.attn", "h.0.attn.c_attn",
                                                  "h.0.attn.c_proj"]
    assert p["modules"][0]["parent"] is None and p["modules"][0]["depth"] == 1
    assert {lf["name"] for lf in p["leaves"]} == {"h.0.attn.c_attn.weight",
                                                   "h.0.attn.c_attn.bias",
                                                   "h.0.attn.c_proj.weight",
                                                   "h.0.attn.c_proj.bias"}
    ids = {n["id"] for n in p["nodes"]}
    assert all(e["from"] in ids and e["to"] in ids for e in p["edges"])
    assert p["roots"] and set(p["roots"]) <= ids
    view._repr_html_()  # draws

    with pytest.raises(ValueError, match="not a module of this graph"):
        sg.graph(loss, focus="h.7")
    with pytest.raises(ValueError, match="names no module"):
        sg.graph(loss, collapse=["nope"])
    with pytest.raises(TypeError, match="collapse must be"):
        sg.graph(loss, collapse=1.5)


def test_text_outline_lists_the_top_level_modules():
    model, loss = tiny_gpt_loss()
    text = repr(sg.graph(loss))
    assert text.splitlines()[1] == ("modules: wte: Embedding not checked, wpe: Embedding not "
                                    "checked, h: ModuleList not checked, ln_f: LayerNorm not "
                                    "checked, lm_head: Linear not checked")


class Gen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, z):
        return self.fc(z).tanh()


def test_two_root_models_are_told_apart_and_an_owned_root_is_named_through_its_owner():
    gen, disc = Gen(), nn.Sequential(nn.Linear(2, 1))
    z = sg.randn(3, 2)
    payload = graph_json(disc(gen(z)).sum(), formulas=False)  # a GAN's two models
    ops = _by_module(payload)
    assert ops["Gen"] == ["TanhBackward0"] and ops[""] == ["SumBackward0"]
    assert ops["Gen.fc"] and ops["Sequential.0"]
    mods = {m["path"]: m for m in payload["modules"]}
    assert set(mods) == {"Gen", "Gen.fc", "Sequential", "Sequential.0"}
    assert mods["Gen"]["parent"] is None and mods["Gen.fc"]["parent"] == "Gen"
    acc = {n["label"]: n["module"] for n in payload["nodes"] if n["kind"] == "accumulate"}
    assert acc["fc.weight"] == "Gen.fc"  # the leaf's own name stays as the verifier's

    twice = nn.Sequential(Gen(), Gen())
    y = twice[1](twice(z))  # the owned block called on its own too: one name for both
    ops = _by_module(graph_json(y.sum(), formulas=False))
    assert set(ops) == {"", "0", "0.fc", "1", "1.fc"}
    assert ops["1"] == ["TanhBackward0", "TanhBackward0"]


def _inside(poly, pts):
    """Even-odd rule: which of ``pts`` (n x 2) lie inside the polygon."""
    import numpy as np

    p = np.asarray(poly, float)
    x, y = pts[:, 0], pts[:, 1]
    inside = np.zeros(len(pts), bool)
    for (x1, y1), (x2, y2) in zip(p, np.roll(p, -1, axis=0)):
        crosses = (y1 > y) != (y2 > y)
        with np.errstate(divide="ignore", invalid="ignore"):
            xi = (x2 - x1) * (y - y1) / (y2 - y1) + x1
        inside ^= crosses & (x < xi)
    return inside


def test_frames_nest_never_overlap_their_siblings_and_hold_only_their_nodes():
    import numpy as np

    from symgrad.jupyter.layout import (
        layout_boxes,
        module_clusters,
        payload_layout,
        visible_graph,
    )

    _, loss = tiny_gpt_loss()
    payload = graph_json(loss, formulas=False)
    for collapse in ([], ["h.0.attn", "h.1.mlp"]):
        p = dict(payload, collapsed=collapse)
        nodes, _ = visible_graph(p)
        boxes = layout_boxes(payload_layout(p))
        frames = module_clusters(p, nodes, boxes)
        mods = {m["path"]: m for m in p["modules"]}
        assert {f["path"] for f in frames} == {m for m in mods if not any(
            m == c or m.startswith(c + ".") for c in collapse)}
        w = max(b[0] + b[2] for b in boxes.values()) + 60
        h = max(b[1] + b[3] for b in boxes.values()) + 60
        xs, ys = np.meshgrid(np.arange(-40.0, w, 6.0), np.arange(-40.0, h, 6.0))
        grid = np.c_[xs.ravel(), ys.ravel()]
        area = {f["path"]: np.any([_inside(poly, grid) for poly in f["outline"]], axis=0)
                for f in frames}
        for a in area:
            parent = mods[a]["parent"]
            if parent in area:
                assert not (area[a] & ~area[parent]).any(), (a, "outside", parent)
            for b in area:
                if a < b and mods[b]["parent"] == parent:
                    assert not (area[a] & area[b]).any(), (a, b)
        centres = np.array([[boxes[n["id"]][0] + boxes[n["id"]][2] / 2,
                             boxes[n["id"]][1] + boxes[n["id"]][3] / 2] for n in nodes])
        for f in frames:  # no node of another module sits in a frame
            members = set(mods[f["path"]]["nodes"])
            foreign = np.array([n["id"] not in members and not set(n.get("members", ()))
                                & members for n in nodes])
            inside = np.any([_inside(poly, centres) for poly in f["outline"]], axis=0)
            assert not (inside & foreign).any(), f["path"]
