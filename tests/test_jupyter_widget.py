"""The Inspector widget driven in-process: traits, messages, node panel, LaTeX, agreement,
badges.

No browser: the widget's state is its traitlets, the graph and report it sends the front
end, and the static view's HTML the kernel renders where the labextension is absent (the
parts read here). A front end is played by calling the widget's message and state
handlers, as a comm message would. A wrong backward (a monkeypatched OpSpec formula) must
show a red badge on exactly the node whose rule was broken.
"""

from __future__ import annotations

import re

import pytest

import symgrad as sg
from symgrad.ops.registry import OPS

pytest.importorskip("ipywidgets")
from symgrad.jupyter import Inspector  # noqa: E402
from symgrad.jupyter.widget import STATIC_VIEW, _Progress  # noqa: E402

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


def part(w, name: str) -> str:
    """One part of the Inspector's static view (svg, panel, formula, agreement, ...)."""
    return w.static_parts()[name]


def same_html(a: str, b: str) -> bool:
    """Equal up to the SVG's per-drawing marker ids."""
    return re.sub(r"sg\d+-", "sg-", a) == re.sub(r"sg\d+-", "sg-", b)


def front_end(w, **content) -> None:
    """A custom message from the front end, handled as the comm would."""
    w._handle_custom_msg(content, [])


def recorder(monkeypatch, w) -> list[dict]:
    """Every message the Inspector sends its front end, from now on."""
    sent: list[dict] = []
    monkeypatch.setattr(w, "send", lambda content, buffers=None: sent.append(content))
    return sent


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
    assert saved_rows(part(w, "panel")) == [
        ("other", "_saved_other", "tensor", "[]", "float32", "25.", "same object as d"),
        ("self", "_saved_self", "tensor", "[]", "float32", "4.", "same object as c"),
    ]
    assert "$$e = c d$$" in part(w, "formula")
    assert r"\frac{\partial e}{\partial c} = d" in part(w, "formula")
    assert 'data-selected="true"' in part(w, "svg") and 'data-id="n0"' in part(w, "svg")
    # select d's node via the trait: the panel and the SVG follow
    d_node = next(n["id"] for n in w.graph["nodes"] if n.get("variable") == "d")
    w.selected = d_node
    assert saved_rows(part(w, "panel")) == [
        ("other", "_saved_other", "scalar", "[]", "int64", "5", ""),
        ("self", "_saved_self", "none", "", "", "None", ""),
    ]
    assert "$$d = 5 \\mathrm{self}$$" in part(w, "formula")
    assert re.search(f'data-id="{d_node}"[^>]*data-selected="true"', part(w, "svg"))
    # a click in a front end sets the trait (a comm update)
    w.set_state({"selected": w.find("c")})
    assert w.selected == w.find("c") and w.node()["kind"] == "accumulate"
    assert "for leaf <code>c</code>" in part(w, "panel")
    assert "value <code>4.</code>" in part(w, "panel")
    assert part(w, "formula") == ""
    none = w.find("None")
    w.selected = none
    assert "needs no gradient: <code>5</code>" in part(w, "panel")
    assert "Not verified" in part(w, "agreement")
    assert part(w, "status") == '<span class="sg-status">not verified</span>'
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
    html = part(w, "agreement")
    assert html.count('class="sg-agreement-row"') == 3
    assert len(re.findall(r'class="sg-badge sg-badge-pass" data-status="pass"', html)) == 3
    # ∂e/∂c = d = 5(a+b), shown symbolically beside the numbers
    assert r"\frac{\partial e}{\partial c} = 5 a + 5 b" in part(w, "symbolic")
    # every op node's local check passed; leaves and None carry no check
    by_label = {}
    for nid, status in w.badges().items():
        by_label.setdefault(w.node(nid)["label"], []).append(status)
    assert by_label == {"MulBackward0": ["pass", "pass"], "AddBackward0": ["pass"],
                        "a": ["none"], "b": ["none"], "c": ["none"], "None": ["none"]}
    assert part(w, "svg").count('data-status="pass"') == 3
    assert 'sg-badge-pass' in part(w, "panel")  # the selected root's own badge
    assert "gradients agree" in part(w, "status")
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
    assert 'sg-badge-fail' in part(w, "panel")
    rows = {r["leaf"]: r for r in w.agreement_rows()}
    assert (rows["b"]["status"], rows["b"]["engine"], rows["b"]["symbolic"]) == \
        ("fail", "40.", "20.")
    assert rows["a"]["status"] == rows["c"]["status"] == "pass"
    assert len(re.findall(r'data-status="fail"', part(w, "agreement"))) >= 1
    svg_fail = re.findall(r'<g class="sg-node[^"]*" data-id="(n\d+)"[^>]*data-status="fail"',
                          part(w, "svg"))
    assert svg_fail == [add]
    assert "FAIL" in part(w, "agreement") and "gradients disagree" in part(w, "status")
    w.close()


def test_mlp_sigmoid_mutation(monkeypatch, cpu_backend):
    ns = mlp()
    w = Inspector(ns["loss"], ns, verify=False)
    sig = w.find("SigmoidBackward0")
    w.selected = sig
    rows = saved_rows(part(w, "panel"))
    assert [r[0] for r in rows] == ["result"]
    assert rows[0][2:5] == ("tensor", "[2, 2]", "float32") and rows[0][6] == \
        "this node's output"
    assert r"h = \frac{1}{1 + e^{- \mathrm{self}}}" in part(w, "formula")
    mm = [n for n in w.graph["nodes"] if n["label"] == "MmBackward0"]
    w.selected = mm[0]["id"]  # h @ w2: saves h and w2, the user's very objects
    same = {r[0]: r[-1] for r in saved_rows(part(w, "panel"))}
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
    w.set_state({"rtol": 1e-2})  # the front end's input loosens it: verified again at once
    assert w.rtol == 1e-2 and w.status == "done"
    assert {r["leaf"]: r["status"] for r in w.agreement_rows()}["c"] == "pass"
    assert w.graph["agreement"]["rtol"] == 1e-2
    w.close()


def test_background_verification_progress_and_stop():
    ns = tutorial()
    w = Inspector(ns["e"], ns, verify=True, background=True)
    w.wait(60)
    assert w.status == "done" and w.progress == 1.0, w.message
    # the static view's controls follow the status
    assert '<button data-sg-action="stop" disabled>' in w.static_html()
    assert '<button data-sg-action="verify">' in w.static_html()
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
    front_end(w2, type="verify")  # the Verify button
    w2.wait(0.05)
    if w2.status == "verifying":
        assert '<button data-sg-action="verify" disabled>' in w2.static_html()
    front_end(w2, type="stop")  # the Stop button
    w2.wait(60)
    # done only if it finished first
    assert w2.status in ("interrupted", "done"), w2.message
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
    same = {r[0]: r[-1] for r in saved_rows(part(t, "panel"))}
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
    htmls = [*w.static_parts().values(), w.static_html()]
    w.selected = mul
    htmls += [*w.static_parts().values(), w.static_html()]
    for h in htmls:
        assert "<img" not in h
    joined = "".join(htmls)
    assert "&lt;img src=x onerror=alert(1)&gt;" in joined
    assert any(r["leaf"] == XSS for r in w.agreement_rows())
    # the verifier's own report HTML escapes it too
    rep = w.report_object
    assert "<img" not in rep._repr_html_()
    assert "&lt;img src=x onerror=alert(1)&gt;" in rep._repr_html_()
    w.close()


def test_front_end_gets_the_graph_by_message_and_saved_state_stays_small(monkeypatch):
    ns = tutorial()
    w = Inspector(ns["e"], ns)
    state = w.get_state()
    # what a notebook saves: a loader and a few traits, no graph, no report, no layout
    assert "graph" not in state and "report" not in state and state["layout"] is None
    assert {state[k] for k in ("status", "selected")} == {"done", "n0"}
    assert len(state["_esm"]) < 1000 and "symgrad.inspector.v1" in state["_esm"]
    assert w._repr_mimebundle_()[0]["text/plain"] == \
        "symgrad Inspector: 3 op nodes, 3 leaves (a live widget: run the cell to use it)"
    sent = recorder(monkeypatch, w)
    # the labextension's view asks for the graph
    front_end(w, type="request")
    # the graph goes with the layout the static SVG draws (symgrad/jupyter/layout.py)
    # (and the model id, by which the labextension hides the %%symgrad graph twin)
    assert sent == [{"type": "graph", "graph": dict(w.graph, layout=sent[0]["graph"]["layout"]),
                     "report": w.report, "model_id": w.model_id}]
    assert set(sent[0]["graph"]["layout"]["nodes"]) == {n["id"] for n in w.graph["nodes"]}
    assert sent[0]["report"]["schema"] == "symgrad.report/1"
    # a click in the view sets the trait; nothing to send (the view drew it)
    add = w.find("AddBackward0")
    w.set_state({"selected": add})
    assert w.selected == add and len(sent) == 1
    # a new tolerance verifies again: the new graph and report go out once
    w.set_state({"rtol": 1e-3})
    assert [m["type"] for m in sent[1:]] == ["graph"]
    assert sent[-1]["graph"]["agreement"]["rtol"] == 1e-3 and sent[-1]["report"] == w.report
    # without the labextension: the static view's module, then its HTML on every change
    front_end(w, type="request-static-module")
    assert sent[-1] == {"type": "static-module", "code": STATIC_VIEW.read_text()}
    front_end(w, type="request-static")
    assert sent[-1]["type"] == "static"
    assert same_html(sent[-1]["html"], w.static_html())
    assert f'data-id="{add}"' in sent[-1]["html"]  # the selected node's panel
    w.selected = w.find("c")
    assert sent[-1]["type"] == "static" and "for leaf <code>c</code>" in sent[-1]["html"]
    n = len(sent)
    front_end(w, type="verify")
    kinds = [m["type"] for m in sent[n:]]
    assert "graph" in kinds and kinds[-1] == "static" and w.status == "done"
    assert 'value="0.001"' in w.static_html()  # the rtol input shows the tolerance
    front_end(w, type="no such message")  # ignored
    w.close()
    assert w.comm is None


def test_status_of_a_failed_verification():
    ns = tutorial()
    w = Inspector(ns["e"], ns, verify=False, mode="no such mode")
    w.verify()
    assert w.status == "error" and w.message
    assert f"verification failed: {w.message}"[:40] in part(w, "status")
    w.close()
