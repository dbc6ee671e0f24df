"""symgrad.verify: tutorial graphs, symbols and names, modes, the report's forms, lifetimes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sympy

import symgrad as sg
from symgrad.symbolic import FreedGraphError, verify

SCHEMA = Path(sg.__file__).parent / "symbolic" / "report.schema.json"


def R(name):
    return sympy.Symbol(name, real=True)


# -- tutorial graphs ------------------------------------------------------------------------
def test_product_gives_the_other_factor():
    c = sg.tensor(2.0, requires_grad=True)
    d = sg.tensor(3.0, requires_grad=True)
    e = c * d
    rep = verify(e, names={"c": c, "d": d})
    assert rep.ok and rep.mode == "exact"
    assert rep.symbolic_gradient(c) == R("d")
    assert rep.symbolic_gradient(d) == R("c")
    assert [r.name for r in rep.leaves] == ["c", "d"]
    assert rep.leaves[0].symbolic_value == pytest.approx(3.0)
    assert rep.leaves[0].engine_value == pytest.approx(3.0)
    assert rep.leaves[0].fd_value == pytest.approx(3.0, rel=1e-6)


def test_scalars_stay_numbers():
    a = sg.tensor(1.0, requires_grad=True)
    b = sg.tensor(2.0, requires_grad=True)
    d = 5 * (a + b)
    rep = verify(d, names=locals())
    assert rep.symbolic_gradient(a) == 5
    assert rep.symbolic_gradient("b") == 5


def test_sin_chain_gives_two_cos():
    a = sg.tensor([0.1, 0.5, 1.0, -2.0], requires_grad=True)
    a.name = "a"
    y = (a.sin() * 2).sum()
    rep = verify(y)
    assert rep.ok
    g = rep.symbolic_gradient(a)
    assert g.shape == (4,)
    for i in range(4):
        assert sympy.simplify(g[i] - 2 * sympy.cos(R(f"a[{i}]"))) == 0


def test_bce_with_logits_linear_model_closed_form():
    rng = np.random.default_rng(0)
    x = sg.tensor(rng.standard_normal((3, 2)), dtype=sg.float64)
    y = sg.tensor([1.0, 0.0, 1.0], dtype=sg.float64)
    w = sg.tensor([0.3, -0.2], dtype=sg.float64, requires_grad=True)
    b = sg.tensor(0.1, dtype=sg.float64, requires_grad=True)
    ny = 1 - y  # computed outside the graph: a constant tensor of its own
    z = x @ w + b
    p = z.sigmoid()
    loss = -(y * p.log() + ny * (1 - p).log()).mean()
    rep = verify(loss, names=locals())
    assert rep.ok and rep.mode == "exact", str(rep)
    zs = [sum(R(f"x[{i},{j}]") * R(f"w[{j}]") for j in range(2)) + R("b") for i in range(3)]
    sig = [1 / (1 + sympy.exp(-zi)) for zi in zs]
    closed_b = sum(s - R(f"y[{i}]") for i, s in enumerate(sig)) / 3
    vals = {R(f"x[{i},{j}]"): float(x.numpy()[i, j]) for i in range(3) for j in range(2)}
    vals.update({R(f"y[{i}]"): float(y.numpy()[i]) for i in range(3)})
    vals.update({R(f"ny[{i}]"): 1 - float(y.numpy()[i]) for i in range(3)})
    vals.update({R("w[0]"): 0.3, R("w[1]"): -0.2, R("b"): 0.1})
    gb = rep.symbolic_gradient(b)
    # the same function of every symbol: equal at the recorded point and at others
    for shift in (0.0, 0.37, -1.1):
        at = {k: v + shift for k, v in vals.items()}
        at.update({R(f"ny[{i}]"): 1 - at[R(f"y[{i}]")] for i in range(3)})
        assert float(gb.xreplace(at)) == pytest.approx(float(closed_b.xreplace(at)), rel=1e-9)
    gw = rep.symbolic_gradient(w)
    closed_w0 = sum((s - R(f"y[{i}]")) * R(f"x[{i},0]") for i, s in enumerate(sig)) / 3
    assert float(gw[0].xreplace(vals)) == pytest.approx(float(closed_w0.xreplace(vals)),
                                                        rel=1e-9)
    # and the engine's numbers agree with the closed form
    assert rep.leaves[1].symbolic_value is not None
    assert b.grad is None  # verify ran its own backward: .grad untouched


def test_bce_with_logits_op_closed_form():
    F = pytest.importorskip("symgrad.nn.functional")
    x = sg.tensor([[0.5, -1.0], [2.0, 0.3]], dtype=sg.float64)
    y = sg.tensor([1.0, 0.0], dtype=sg.float64)
    w = sg.tensor([0.3, -0.2], dtype=sg.float64, requires_grad=True)
    b = sg.tensor(0.1, dtype=sg.float64, requires_grad=True)
    loss = F.binary_cross_entropy_with_logits(x @ w + b, y)
    rep = verify(loss, names=locals())
    assert rep.ok and rep.mode == "exact", str(rep)
    z = x.numpy() @ np.array([0.3, -0.2]) + 0.1
    expected = np.mean(1 / (1 + np.exp(-z)) - y.numpy())
    row = next(r for r in rep.leaves if r.name == "b")
    assert row.symbolic_value == pytest.approx(expected, rel=1e-12)


# -- names and symbols ----------------------------------------------------------------------
def test_same_name_twice_is_two_symbols_and_latex_escapes():
    d1 = sg.tensor(2.0, requires_grad=True)
    d2 = sg.tensor(3.0, requires_grad=True)
    d1.name = d2.name = "d"
    w = sg.tensor([[1.0, 2.0]], requires_grad=True)
    w.name = "my_w"
    out = (d1 * d2 + (w * w).sum())
    rep = verify(out)
    assert [r.name for r in rep.leaves] == ["d", "d'", "my_w"]
    assert rep.symbolic_gradient(d1) == R("d'")
    assert rep.symbolic_gradient(d2) == R("d")
    tex = rep.latex()
    assert r"\mathrm{my\_w}_{0,1}" in tex
    assert "d'" in tex


def test_leaves_are_named_by_the_callers_variables_and_constants_are_symbols():
    a = sg.tensor(2.0, requires_grad=True)
    k = sg.tensor(4.0)  # does not require grad, still a symbol
    rep = verify(a * k)  # names from this frame's variables
    assert rep.symbolic_gradient(a) == R("k")
    assert [r.name for r in rep.leaves] == ["a"]


def test_unnamed_tensors_get_t0_t1_and_constants_are_symbols():
    def unnamed():
        return sg.tensor(2.0, requires_grad=True), sg.tensor(4.0)

    rep = verify(unnamed()[0] * unnamed()[1])  # no variable holds either tensor
    assert rep.symbolic_gradient(rep.leaves[0].tensor) == R("t1")
    assert [r.name for r in rep.leaves] == ["t0"]


def test_kinks_follow_pytorch():
    x = sg.tensor([0.0, 1.0, -1.0], requires_grad=True)
    y = (x.relu() + x.abs()).sum()
    rep = verify(y)
    assert rep.ok, str(rep)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 2.0, -1.0])


# -- modes ----------------------------------------------------------------------------------
def test_local_mode_checks_every_node_and_samples_big_tensors():
    rng = np.random.default_rng(1)
    x = sg.tensor(rng.standard_normal((8, 300)).astype(np.float32))
    w = sg.tensor(rng.standard_normal((300, 5)).astype(np.float32), requires_grad=True)
    loss = (x @ w).tanh().sum()
    rep = verify(loss, mode="local", sample=8)
    assert rep.ok and rep.mode == "local"
    assert [r.name for r in rep.nodes] == ["MmBackward0", "TanhBackward0", "SumBackward0"]
    assert all(r.status == "ok" for r in rep.nodes)
    mm = rep.nodes[0]
    assert mm.sampled and "8 of 1500" in mm.detail
    assert rep.leaves[0].status == "not checked"
    assert rep.leaves[0].fd_value == pytest.approx(rep.leaves[0].engine_value, rel=1e-3)


def test_auto_over_budget_runs_local(monkeypatch):
    from symgrad.symbolic import verify as vmod

    monkeypatch.setattr(sys.modules["symgrad.symbolic.verify"], "EXACT_BUDGET", 10)
    a = sg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    rep = vmod((a * a).sum())
    assert rep.mode == "local" and rep.ok
    assert any("over the budget" in s for s in rep.skipped)


def test_exact_mode_over_budget_is_an_error_unless_timed(monkeypatch):
    from symgrad.symbolic import VerifierBudgetError

    monkeypatch.setattr(sys.modules["symgrad.symbolic.verify"], "EXACT_BUDGET", 10)
    a = sg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(VerifierBudgetError, match="over the budget.*mode='local'"):
        verify((a * a).sum(), mode="exact")
    assert verify((a * a).sum(), mode="exact", timeout=30).ok


def test_exact_mode_with_sympy_and_symengine_agree():
    pytest.importorskip("symengine")
    a = sg.tensor([0.3, -0.7], dtype=sg.float64, requires_grad=True)
    y = (a.exp() * a.sin()).sum()
    r1 = verify(y, backend="sympy")
    r2 = verify(y, backend="symengine")
    assert r1.backend == "sympy" and r2.backend == "symengine"
    assert r1.ok and r2.ok
    assert r1.leaves[0].symbolic_value == r2.leaves[0].symbolic_value
    assert sympy.simplify(r1.symbolic_gradient(a)[0] - r2.symbolic_gradient(a)[0]) == 0


def test_order_two_hessian_vector_products():
    a = sg.tensor([0.3, -0.7, 1.2], dtype=sg.float64, requires_grad=True)
    b = sg.tensor(0.5, dtype=sg.float64, requires_grad=True)
    y = ((a * b).tanh() * a).sum()
    rep = verify(y, order=2)
    assert rep.ok, str(rep)
    assert [h["status"] for h in rep.hvp] == ["ok", "ok"]


def test_order_two_catches_a_wrong_double_backward(monkeypatch):
    from symgrad.ops import OPS

    a = sg.tensor([0.3, -0.7], dtype=sg.float64, requires_grad=True)
    y = a.tanh().sum()
    # first derivative right, second wrong: (1 - r^2) written with a detached r
    monkeypatch.setitem(OPS["tanh"].grads, "self",
                        lambda grad, result: grad * (1 - result.detach() * result.detach()))
    rep = verify(y, order=2)
    assert not rep.ok
    assert rep.leaves[0].status == "ok"
    assert rep.hvp[0]["status"] == "mismatch"


def test_progress_callback_is_called_and_can_stop():
    a = sg.tensor([0.5, 1.0], requires_grad=True)
    y = (a.sin() * a).sum()
    seen = []
    assert verify(y, progress=lambda done, total: seen.append((done, total))).ok
    assert seen and seen[-1][0] <= seen[-1][1] and len(seen) >= 3

    class Stop(Exception):
        pass

    def stop(done, total):
        raise Stop

    with pytest.raises(Stop):
        verify(y, progress=stop)


def test_timeout_is_honoured():
    a = sg.tensor(np.linspace(0.1, 1, 200), requires_grad=True)
    y = a
    for _ in range(30):
        y = (y.sin() * 1.01 + a)
    rep = verify(y.sum(), timeout=0.05)
    assert rep.timed_out and not rep.ok
    assert rep.seconds < 5


# -- lifetimes ------------------------------------------------------------------------------
def test_before_backward_leaves_grad_untouched():
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    m = a * 3
    m.retain_grad()
    y = (m * a).sum()
    rep = verify(y)
    assert rep.ok
    assert a.grad is None and m.grad is None
    y.backward()
    np.testing.assert_allclose(a.grad.numpy(), [6.0, 12.0])


def test_after_retained_backward_and_freed_graph():
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    y = (a.exp() * 2).sum()
    y.backward(retain_graph=True)
    assert verify(y).ok

    def make():
        b = sg.tensor([1.0, 2.0], requires_grad=True)
        c = sg.tensor([3.0, 4.0])
        return (b * c).sum()  # c's value is saved, b's is not: after b dies it is gone

    y2 = make()
    y2.backward()
    with pytest.raises(FreedGraphError, match=r"retain_graph=True.*symgrad\.record"):
        verify(y2)


def test_record_keeps_what_is_needed():
    def make():
        b = sg.tensor([1.0, 2.0], requires_grad=True)
        c = sg.tensor([3.0, 4.0])
        return (b.sin() * c).sum(), b

    with sg.record():
        y, b = make()
    y.backward()
    rep = verify(y, mode="exact")
    assert rep.ok, str(rep)
    assert any(".grad" in n for n in rep.notes)
    rep = verify(y, mode="local")
    assert rep.ok, str(rep)


def test_import_symgrad_stays_light():
    code = ("import sys, symgrad; a = symgrad.tensor(1.0, requires_grad=True); "
            "(a*a).backward(); print(any(m in sys.modules for m in "
            "('sympy', 'symengine', 'mpmath')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# -- the report -----------------------------------------------------------------------------
def _bad_report(monkeypatch):
    from symgrad.ops import OPS

    monkeypatch.setitem(OPS["mul"].grads, "self", lambda grad, other: grad * other * 1.01)
    x = sg.tensor([1.0, 2.0], requires_grad=True)
    x.name = "<b>x&"
    return verify((x * x).sum())


def test_report_json_validates_against_schema(monkeypatch):
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    good = verify((a * a).sum(), order=1)
    jsonschema.validate(good.to_json(), schema)
    bad = _bad_report(monkeypatch)
    doc = bad.to_json()
    jsonschema.validate(doc, schema)
    json.dumps(doc)  # plain JSON
    assert doc["schema"] == "symgrad.report/1"
    assert doc["ok"] is False and doc["first_bad_node"] == 0
    assert doc["nodes"][0]["status"] == "mismatch"
    local = verify((a * a).sum(), mode="local")
    jsonschema.validate(local.to_json(), schema)


def test_assert_ok_message_is_a_table(monkeypatch):
    a = sg.tensor(1.0, requires_grad=True)
    verify(a * a).assert_ok()
    rep = _bad_report(monkeypatch)
    with pytest.raises(AssertionError) as info:
        rep.assert_ok()
    msg = str(info.value)
    assert "MISMATCH" in msg and "first bad node: MulBackward0" in msg
    assert "max abs err" in msg and "<b>x&" in msg


def test_html_escapes_user_strings_and_mimebundle(monkeypatch):
    rep = _bad_report(monkeypatch)
    h = rep._repr_html_()
    assert "<b>x&" not in h and "&lt;b&gt;x&amp;" in h
    bundle = rep._repr_mimebundle_()
    assert set(bundle) == {"application/vnd.symgrad.report+json", "text/html", "text/plain"}
    assert bundle["text/plain"] == str(rep)
    assert bundle["application/vnd.symgrad.report+json"]["schema"] == "symgrad.report/1"
    assert "symgrad.verify" in repr(rep) or "Report" in repr(rep)


def test_reports_hold_no_reference_cycles(no_gc, monkeypatch):
    import weakref

    from symgrad.ops import OPS

    def run(bad):
        a = sg.tensor([0.5, -1.0, 2.0], requires_grad=True)
        w = sg.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
        y = ((w * a).tanh() @ a.reshape(3, 1)).sum()
        rep = verify(y, order=2)
        rep.symbolic_gradient(a)
        local = verify(y, mode="local")
        return weakref.ref(rep), weakref.ref(local), weakref.ref(a), rep.ok, local.ok

    before = sg.memory_allocated()
    refs = run(False)
    assert refs[3] and refs[4]
    assert all(r() is None for r in refs[:3]), "verify left a reference cycle"
    monkeypatch.setitem(OPS["tanh"].grads, "self", lambda grad, result: grad * result)
    refs = run(True)
    assert not refs[3]
    assert all(r() is None for r in refs[:3]), "a failing report left a reference cycle"
    assert sg.memory_allocated() == before


def test_non_scalar_root_needs_a_gradient():
    a = sg.tensor([0.5, -1.0, 2.0], requires_grad=True)
    y = a.sin() * 3
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar"):
        verify(y)
    g = sg.tensor([1.0, -2.0, 0.5])
    rep = verify(y, g)
    assert rep.ok
    (w,) = rep.leaves[0].worst_index
    x, gv = [0.5, -1.0, 2.0], [1.0, -2.0, 0.5]
    assert rep.leaves[0].symbolic_value == pytest.approx(3 * np.cos(x[w]) * gv[w], rel=1e-12)
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        verify(y, sg.tensor([1.0, 2.0]))


# -- the report's forms name nodes and leaves, label columns and render non-finite values --
def _table_rows(text: str, marker: str) -> dict:
    """{first cell: {header: cell}} of the text table whose header holds ``marker``."""
    import re

    lines = text.splitlines()
    k = next(i for i, line in enumerate(lines) if marker in line)
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[k + 1])]
    names = [lines[k][a:b].strip() for a, b in spans]
    rows = {}
    for line in lines[k + 2:]:
        if not line.strip() or not line.startswith(" " * spans[0][0]) or \
                line[spans[0][0]] == " ":
            break
        cells = {n: line[a:b + 1].strip() for n, (a, b) in zip(names, spans)}
        if ":" in cells[names[0]]:  # the legend under the table
            break
        rows[cells[names[0]]] = cells
    return rows


def _nonfinite_report():
    from symgrad.symbolic.report import LeafRow, NodeRow, Report

    nan, inf = float("nan"), float("inf")
    leaves = [LeafRow("fc1.weight", (2, 3), "float32", inf, nan, (1, 2), nan, 0.5, -inf,
                      "mismatch", nan, 6, False, r"\mathrm{fc1.weight}", bound=inf),
              LeafRow("x", (), "float64", 0.0, 0.0, (), 1.0, 1.0, 1.0, "ok", 0.0, 1)]
    nodes = [NodeRow(0, "MulBackward0", "mismatch", "result = other*self", nan, inf,
                     detail="d/dself[1, 2]: engine nan, symbolic 0.5"),
             NodeRow(1, "SumBackward0", "ok", "sum: structural", 0.0, 0.0)]
    return Report(ok=False, mode="exact", requested_mode="auto", backend="sympy", order=1,
                  rtol={"float32": 1e-4, "float64": inf}, atol={"float32": 1e-6,
                                                              "float64": 1e-12},
                  leaves=leaves, nodes=nodes, seconds=0.1)


def test_nonfinite_values_render_in_text_html_and_strict_json():
    jsonschema = pytest.importorskip("jsonschema")
    rep = _nonfinite_report()
    for text in (str(rep), rep.summary()):
        row = _table_rows(text, "engine grad")["fc1.weight"]
        assert (row["engine grad"], row["symbolic grad"], row["finite-diff grad"],
                row["max abs err"], row["finite-diff err"]) == ("nan", "0.5", "-inf", "inf",
                                                                "nan")
    full = str(rep)
    assert _table_rows(full, "engine grad")["fc1.weight"]["bound"] == "inf"
    node = _table_rows(full, "checked against")["MulBackward0 (#2 of 2 from the root)"]
    assert (node["max abs err"], node["max rel err"]) == ("nan", "inf")
    assert "rtol inf" in full
    h = rep._repr_html_()
    assert "<td>nan</td>" in h and "<td>inf</td>" in h and "<td>-inf</td>" in h
    doc = rep.to_json()
    text = json.dumps(doc, allow_nan=False)  # strict JSON: no NaN/Infinity literals
    assert json.loads(text) == doc
    leaf = doc["leaves"][0]
    assert (leaf["engine_value"], leaf["fd_value"], leaf["max_abs_err"], leaf["bound"]) == \
        ("nan", "-inf", "inf", "inf")
    assert doc["nodes"][0]["max_abs_err"] == "nan" and doc["tolerances"]["float64"]["rtol"] \
        == "inf"
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))


def test_nonfinite_gradients_from_a_real_graph_in_every_form():
    a = sg.tensor([1.0, 2.0], dtype=sg.float64, requires_grad=True)
    b = sg.tensor([0.5, -1.0], dtype=sg.float64, requires_grad=True)
    rep = verify((a * float("inf")).sum() + (b * float("nan")).sum(), names=locals())
    json.dumps(rep.to_json(), allow_nan=False)
    rows = _table_rows(str(rep), "engine grad")
    assert (rows["a"]["engine grad"], rows["a"]["symbolic grad"]) == ("inf", "inf")
    assert (rows["b"]["engine grad"], rows["b"]["symbolic grad"]) == ("nan", "nan")
    tex = rep.latex()
    assert r"\mathrm{inf}" in tex and r"\mathrm{nan}" in tex
    assert "NaN" not in tex and r"\infty" not in tex
    assert "<td>inf</td>" in rep._repr_html_()


def test_nodes_are_named_by_grad_fn_and_position_from_the_root(monkeypatch):
    rep = _bad_report(monkeypatch)  # (x * x).sum() with a wrong MulBackward0
    assert rep.first_bad_node_label == "MulBackward0 (#2 of 2 from the root)"
    assert rep.node_label(rep.nodes[-1]) == "SumBackward0 (#1 of 2 from the root)"
    assert rep.node_label(rep.first_bad_node) == rep.first_bad_node_label
    doc = rep.to_json()
    assert doc["first_bad_node"] == 0 and doc["first_bad_node_label"] == rep.first_bad_node_label
    assert [(n["id"], n["label"], n["position"], n["reference"]) for n in doc["nodes"]] == [
        (0, "MulBackward0 (#2 of 2 from the root)", 2, "symbolic"),
        (1, "SumBackward0 (#1 of 2 from the root)", 1, "symbolic")]
    for text in (str(rep), rep.summary()):
        assert "first bad node: MulBackward0 (#2 of 2 from the root)" in text
    assert "MulBackward0 (#2 of 2 from the root)" in rep._repr_html_()


def test_text_columns_are_labelled_and_details_never_cut():
    from symgrad.symbolic.report import NodeRow

    rep = _nonfinite_report()
    long = "d/dself[1, 2]: engine 1.5, symbolic 0.5; " + " ".join(
        f"word{i}" for i in range(60))
    rep.nodes[0] = NodeRow(0, "MulBackward0", "mismatch", "result = other*self", 1.0, 2.0,
                           detail=long)
    full, short = str(rep), rep.summary()
    for text in (full, short):
        assert " ".join(long.split()) in " ".join(text.split())
        assert max(len(line) for line in text.splitlines()
                   if "word" in line) <= 100  # wrapped at TEXT_WIDTH
    header = next(line for line in full.splitlines() if "engine grad" in line)
    assert [h.strip() for h in header.split("  ") if h.strip()] == [
        "leaf", "shape", "status", "worst element", "engine grad", "symbolic grad",
        "finite-diff grad", "max abs err", "bound", "max rel err", "finite-diff err",
        "elements checked"]
    assert "SumBackward0 (#1 of 2" in full and "SumBackward0" not in short  # ok nodes
    assert set(_table_rows(full, "engine grad")) == {"fc1.weight", "x"}
    assert set(_table_rows(short, "engine grad")) == {"fc1.weight"}  # ok leaves left out
    h = rep._repr_html_()
    for th in ("engine grad", "symbolic grad", "finite-diff grad", "bound", "max abs err",
               "checked against", "formula", "detail"):
        assert f">{th}</th>" in h
