"""The Inspector widget driven in-process: traits, node panel, LaTeX, agreement, badges.

No browser: the widget's state is its traitlets and its children's HTML, which is what
every front end renders. A wrong backward (a monkeypatched OpSpec formula) must show a
red badge on exactly the node whose rule was broken.
"""

from __future__ import annotations

import re
import time

import pytest

import symgrad as sg
from symgrad.ops.registry import OPS

pytest.importorskip("ipywidgets")
from symgrad.jupyter import Inspector  # noqa: E402
from symgrad.jupyter.widget import _Progress  # noqa: E402

XSS = "<img src=x onerror=alert(1)>"


def tutorial():
    a = sg.tensor(2.0, requires_grad=True)
    b = sg.tensor(3.0, requires_grad=True)
    c = sg.tensor(4.0, requires_grad=True)
    d = 5 * (a + b)
    e = c * d
    return dict(a=a, b=b, c=c, d=d, e=e)


def mlp():
    x = sg.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5]])
    w1 = sg.tensor([[0.1, -0.2], [0.3, 0.4], [-0.5, 0.6]], requires_grad=True)
    b1 = sg.tensor([0.01, -0.02], requires_grad=True)
    w2 = sg.tensor([[0.7], [-0.8]], requires_grad=True)
    h = (x @ w1 + b1).sigmoid()
    loss = ((h @ w2) ** 2).mean()
    return dict(x=x, w1=w1, b1=b1, w2=w2, h=h, loss=loss)


def break_rule(monkeypatch, op: str, input_name: str, formula) -> None:
    """Replace one backward formula; a backend's fused kernel for the op is bypassed too."""
    monkeypatch.setitem(OPS[op].grads, input_name, formula)
    monkeypatch.setattr(OPS[op], "fused_backward", None, raising=False)


def saved_rows(html: str) -> list[tuple[str, ...]]:
    """(data-name, cells...) of the node panel's saved-operand rows, tags stripped."""
    rows = []
    for m in re.finditer(r'<tr class="sg-saved-row" data-name="([^"]*)"[^>]*>(.*?)</tr>', html):
        cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>",
                                                                m.group(2))]
        rows.append((m.group(1), *cells))
    return rows


def test_select_nodes_through_traits_without_verification():
    ns = tutorial()
    w = Inspector(ns["e"], ns, verify=False)
    assert w.status == "not verified" and w.report == {}
    assert w.selected == w.graph["roots"][0] == "n0"  # the root is selected first
    assert w.node_picker.value == "n0"
    assert saved_rows(w.node_panel.value) == [
        ("other", "_saved_other", "tensor", "[]", "float32", "25.", "same object as d"),
        ("self", "_saved_self", "tensor", "[]", "float32", "4.", "same object as c"),
    ]
    assert "$$e = c d$$" in w.formula_view.value
    assert r"\frac{\partial e}{\partial c} = d" in w.formula_view.value
    assert 'data-selected="true"' in w.svg_view.value and 'data-id="n0"' in w.svg_view.value
    # select d's node via the trait: the panel, the picker and the SVG follow
    d_node = next(n["id"] for n in w.graph["nodes"] if n.get("variable") == "d")
    w.selected = d_node
    assert w.node_picker.value == d_node
    assert saved_rows(w.node_panel.value) == [
        ("other", "_saved_other", "scalar", "[]", "int64", "5", ""),
        ("self", "_saved_self", "none", "", "", "None", ""),
    ]
    assert "$$d = 5 \\mathrm{self}$$" in w.formula_view.value
    assert re.search(f'data-id="{d_node}"[^>]*data-selected="true"', w.svg_view.value)
    # and the picker drives the trait
    w.node_picker.value = w.find("c")
    assert w.selected == w.find("c") and w.node()["kind"] == "accumulate"
    assert "for leaf <code>c</code>" in w.node_panel.value
    assert "value <code>4.</code>" in w.node_panel.value
    assert w.formula_view.value == ""
    none = w.find("None")
    w.selected = none
    assert "needs no gradient: <code>5</code>" in w.node_panel.value
    assert "Not verified" in w.agreement_view.value
    w.close()


def test_tutorial_verified_agreement_and_badges():
    ns = tutorial()
    w = Inspector(ns["e"], ns)
    assert w.status == "done" and w.progress == 1.0
    assert w.report["schema"] == "symgrad.report/1" and w.report["ok"] is True
    rows = {r["leaf"]: r for r in w.agreement_rows()}
    assert set(rows) == {"a", "b", "c"}
    assert [rows[k]["status"] for k in "abc"] == ["pass"] * 3
    assert (rows["a"]["engine"], rows["a"]["symbolic"]) == ("20.", "20.")
    assert (rows["c"]["engine"], rows["c"]["symbolic"]) == ("25.", "25.")
    assert rows["c"]["max_abs_err"] == 0.0 and rows["c"]["fd_max_abs_err"] < 1e-6
    # the agreement table has one row per leaf, each with a green badge
    html = w.agreement_view.value
    assert html.count('class="sg-agreement-row"') == 3
    assert len(re.findall(r'class="sg-badge sg-badge-pass" data-status="pass"', html)) == 3
    # ∂e/∂c = d = 5(a+b), shown symbolically beside the numbers
    assert r"\frac{\partial e}{\partial c} = 5 a + 5 b" in w.symbolic_view.value
    # every op node's local check passed; leaves and None carry no check
    by_label = {}
    for nid, status in w.badges().items():
        by_label.setdefault(w.node(nid)["label"], []).append(status)
    assert by_label == {"MulBackward0": ["pass", "pass"], "AddBackward0": ["pass"],
                        "a": ["none"], "b": ["none"], "c": ["none"], "None": ["none"]}
    assert w.svg_view.value.count('data-status="pass"') == 3
    assert 'sg-badge-pass' in w.node_panel.value  # the selected root's own badge
    assert (w.rtol, w.atol) == (1e-4, 1e-6)  # float32 defaults of the verifier
    assert w.graph["agreement"]["first_bad_node"] is None
    w.close()


def test_wrong_backward_marks_exactly_that_node(monkeypatch, cpu_backend):
    break_rule(monkeypatch, "add", "other", lambda grad, alpha: grad * 2)
    ns = tutorial()
    w = Inspector(ns["e"], ns)
    add = w.find("AddBackward0")
    assert w.graph["agreement"]["ok"] is False
    assert w.graph["agreement"]["first_bad_node"] == add
    assert [k for k, v in w.badges().items() if v == "fail"] == [add]
    assert w.selected == add  # the Inspector opens on the first bad node
    assert 'sg-badge-fail' in w.node_panel.value
    rows = {r["leaf"]: r for r in w.agreement_rows()}
    assert (rows["b"]["status"], rows["b"]["engine"], rows["b"]["symbolic"]) == \
        ("fail", "40.", "20.")
    assert rows["a"]["status"] == rows["c"]["status"] == "pass"
    assert len(re.findall(r'data-status="fail"', w.agreement_view.value)) >= 1
    svg_fail = re.findall(r'<g class="sg-node[^"]*" data-id="(n\d+)"[^>]*data-status="fail"',
                          w.svg_view.value)
    assert svg_fail == [add]
    assert "FAIL" in w.agreement_view.value and "gradients disagree" in w.status_label.value
    w.close()


def test_mlp_sigmoid_mutation(monkeypatch, cpu_backend):
    ns = mlp()
    w = Inspector(ns["loss"], ns, verify=False)
    sig = w.find("SigmoidBackward0")
    w.selected = sig
    rows = saved_rows(w.node_panel.value)
    assert [r[0] for r in rows] == ["result"]
    assert rows[0][2:5] == ("tensor", "[2, 2]", "float32") and rows[0][6] == \
        "this node's output"
    assert r"h = \frac{1}{1 + e^{- \mathrm{self}}}" in w.formula_view.value
    mm = [n for n in w.graph["nodes"] if n["label"] == "MmBackward0"]
    w.selected = mm[0]["id"]  # h @ w2: saves h and w2, the user's very objects
    same = {r[0]: r[-1] for r in saved_rows(w.node_panel.value)}
    assert same["self"] == "same object as h" and same["mat2"] == "same object as w2"
    w.close()
    # a wrong sigmoid rule: only SigmoidBackward0 turns red
    break_rule(monkeypatch, "sigmoid", "self", lambda grad, result: grad * result)
    ns = mlp()
    w = Inspector(ns["loss"], ns)
    bad = {w.node(k)["label"] for k, v in w.badges().items() if v == "fail"}
    assert bad == {"SigmoidBackward0"}
    assert w.graph["agreement"]["first_bad_node"] == w.find("SigmoidBackward0")
    status = {r["leaf"]: r["status"] for r in w.agreement_rows()}
    assert status == {"w1": "fail", "b1": "fail", "w2": "pass"}
    w.close()


def test_tolerance_control_reevaluates_the_table(monkeypatch):
    # a slightly wrong rule: off by 1e-3 relative, caught at float32 defaults
    break_rule(monkeypatch, "mul", "self", lambda grad, other: grad * other * 1.001)
    ns = tutorial()
    w = Inspector(ns["e"], ns, local_checks=False)
    status = {r["leaf"]: r["status"] for r in w.agreement_rows()}
    assert status["c"] == "fail"
    w.rtol_input.value = 1e-2  # loosen: the table is re-evaluated at once
    assert w.rtol == 1e-2 and w.status == "done"
    assert {r["leaf"]: r["status"] for r in w.agreement_rows()}["c"] == "pass"
    assert w.graph["agreement"]["rtol"] == 1e-2
    w.close()


def test_background_verification_progress_and_stop():
    ns = tutorial()
    w = Inspector(ns["e"], ns, verify=True, background=True)
    w.wait(60)
    assert w.status == "done" and w.progress == 1.0, getattr(w, "_error", "")
    assert w.progress_bar.value == 1.0 and w.progress_bar.layout.visibility == "hidden"
    assert not w.verify_button.disabled and w.stop_button.disabled
    # Stop: the progress sink raises in the verifier's thread
    w._cancel.set()
    with pytest.raises(Exception, match="stopped by the user"):
        _Progress(w).update(1)
    w._cancel.clear()
    x = sg.tensor([0.5] * 40, requires_grad=True)
    y = x
    for _ in range(40):
        y = (y * 1.01).sin()
    y = y.sum()
    w2 = Inspector(y, {"x": x, "y": y}, verify=False, mode="exact")
    w2.verify(background=True)
    time.sleep(0.05)
    w2.stop_button.click()
    w2.wait(60)
    # done only if it finished first
    assert w2.status in ("interrupted", "done"), getattr(w2, "_error", "")
    assert w2.stop_button.disabled and not w2.verify_button.disabled
    w.close()
    w2.close()


def test_report_reuse_and_torch_tensor(torch):
    ns = tutorial()
    rep = sg.symbolic.verify(ns["e"], names=ns)
    w = Inspector(ns["e"], ns, report=rep)
    assert w.status == "done" and w.report_object is rep
    assert [r["status"] for r in w.agreement_rows()] == ["pass"] * 3
    w.close()
    a = torch.tensor(2.0, requires_grad=True)
    b = torch.tensor(3.0, requires_grad=True)
    y = (a * b).sin()
    t = Inspector(y, {"a": a, "b": b, "y": y})
    assert t.graph["source"] == "torch"
    assert [n["label"] for n in t.graph["nodes"] if n["kind"] == "op"] == \
        ["SinBackward0", "MulBackward0"]
    t.selected = t.find("MulBackward0")
    same = {r[0]: r[-1] for r in saved_rows(t.node_panel.value)}
    assert same == {"other": "same object as b", "self": "same object as a"}
    assert t.status in ("done", "error")
    if t.status == "done":  # the verifier reads torch graphs when its torch support is in
        assert {r["leaf"]: r["status"] for r in t.agreement_rows()} == \
            {"a": "pass", "b": "pass"}
    t.close()


def test_xss_name_is_escaped_in_every_html_output():
    evil = sg.tensor([1.0, 2.0], requires_grad=True)
    evil.name = XSS
    other = sg.tensor([3.0, 4.0], requires_grad=True)
    y = (evil * other).sum()
    w = Inspector(y, {"other": other, "y": y})
    w.selected = w.find(XSS)
    mul = w.find("MulBackward0")
    htmls = [w.svg_view.value, w.node_panel.value, w.agreement_view.value,
             w.symbolic_view.value, w.status_label.value]
    w.selected = mul
    htmls += [w.node_panel.value, w.formula_view.value, w.svg_view.value]
    for h in htmls:
        assert "<img" not in h
    joined = "".join(htmls)
    assert "&lt;img src=x onerror=alert(1)&gt;" in joined
    assert any(r["leaf"] == XSS for r in w.agreement_rows())
    # the labels of the node picker are plain text, not HTML
    assert any(XSS in label for label, _v in w.node_picker.options)
    # the verifier's own report HTML escapes it too
    rep = w.report_object
    assert "<img" not in rep._repr_html_()
    assert "&lt;img src=x onerror=alert(1)&gt;" in rep._repr_html_()
    w.close()


def test_graph_view_is_the_anywidget_canvas_when_the_bundle_exists():
    from symgrad.jupyter import widget as widget_mod

    pytest.importorskip("anywidget")
    # built by `make test` / `pip install -e .` (labextension: jlpm build:widget)
    assert widget_mod.BUNDLE.is_file(), "run `cd labextension && jlpm build:widget`"
    ns = tutorial()
    w = Inspector(ns["e"], ns)
    canvas = w.canvas
    assert canvas is not None and w.children[0] is canvas
    assert w.svg_view not in w.children
    # the canvas runs the labextension's module, which binds these three traits
    assert "change:" in canvas._esm and '"selected"' in canvas._esm
    state = canvas.get_state()
    assert state["graph"] == w.graph and state["report"] == w.report
    assert state["report"]["schema"] == "symgrad.report/1"
    assert state["selected"] == w.selected == "n0"
    # a click in the browser sets the canvas's trait: the panel and the picker follow
    add = w.find("AddBackward0")
    canvas.selected = add
    assert w.selected == add and w.node_picker.value == add
    assert f'data-id="{add}"' in w.node_panel.value
    assert re.search(f'data-id="{add}"[^>]*data-selected="true"', w.svg_view.value)
    # and the Python side's selection reaches the canvas
    w.node_picker.value = w.find("c")
    assert canvas.selected == w.find("c")
    # re-verification replaces the graph (badges) and the report on the canvas too
    w.rtol_input.value = 1e-3
    assert canvas.graph["agreement"]["rtol"] == 1e-3 and canvas.report == w.report
    w.close()
    assert canvas.comm is None  # closed with the Inspector


@pytest.mark.parametrize("missing", ["bundle", "anywidget"])
def test_graph_view_falls_back_to_static_svg(monkeypatch, tmp_path, missing):
    import sys

    from symgrad.jupyter import widget as widget_mod

    if missing == "bundle":
        monkeypatch.setattr(widget_mod, "BUNDLE", tmp_path / "inspector.js")
    else:
        monkeypatch.setattr(widget_mod, "_CANVAS_CLASSES", {})
        monkeypatch.setitem(sys.modules, "anywidget", None)  # import raises ImportError
    assert widget_mod.canvas_class() is None
    ns = tutorial()
    w = Inspector(ns["e"], ns, verify=False)
    assert w.canvas is None and w.children[0] is w.svg_view
    assert '<svg' in w.svg_view.value and 'data-selected="true"' in w.svg_view.value
    w.selected = w.find("AddBackward0")
    assert re.search(f'data-id="{w.selected}"[^>]*data-selected="true"', w.svg_view.value)
    w.close()
