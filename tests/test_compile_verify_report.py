"""``step.verify()`` returns a report for what it finds in a compiled step (issue 32, scope
7): a fused kernel whose loop is not its ops' derivative, or generated code whose gradients
disagree with eager's, is a not-ok Report naming the kernel (``bad_kernel``, a row of
``compiled`` with its status, detail and derivation), never a RuntimeError; a correct step
is an ok Report whose ``compiled`` rows say how each kernel was proved."""

from __future__ import annotations

import json
import sys

import pytest

import symgrad as sg
from symgrad.compile import fwdbwd

STEP = sys.modules["symgrad.compile.step"]


def _body(x, w):
    h = (x * w).sigmoid() * 0.5 + x
    return (h.relu() * h).sum()


def _step(seed=3):
    sg.manual_seed(seed)
    w = sg.randn(6, 5, requires_grad=True)
    opt = sg.optim.SGD([w], lr=0.1)

    def fn(x):
        opt.zero_grad()
        loss = _body(x, w)
        loss.backward()
        opt.step()
        return loss

    return sg.compile(fn)


def _no_checks_at_generation(monkeypatch):
    """The self-check and the proof at generation would keep a wrong step eager: off, so
    that the wrong code is what runs and what verify() must find."""
    monkeypatch.setattr(STEP, "self_check", lambda *a: None)
    monkeypatch.setattr(STEP.CompiledStep, "_prove", lambda *a: None)


def _plant_wrong_mul(monkeypatch):
    describe = fwdbwd.describe

    def wrong(group, d, parallel, **kw):  # d(a*b)/db = b: wrong
        desc = describe(group, d, parallel, **kw)
        for op in desc["ops"]:
            if op[0] == "mul":
                op[2] = ["g * b", "g * b"]
        return desc

    monkeypatch.setattr(fwdbwd, "describe", wrong)


def _valid(data):
    """The report's JSON (with its compiled rows) against the shipped schema."""
    jsonschema = pytest.importorskip("jsonschema")
    from importlib import resources

    schema = json.loads(resources.files("symgrad.symbolic").joinpath(
        "report.schema.json").read_text())
    jsonschema.validate(data, schema)


def test_a_correct_step_gives_an_ok_report_with_its_proved_kernels():
    step = _step()
    step(sg.randn(6, 5))
    report = step.verify()
    assert report.ok and report.bad_kernel is None
    kernels = [r for r in report.compiled if r["kind"] != "generated gradient"]
    assert kernels and all(r["status"] == "ok" for r in kernels)
    row = next(r for r in kernels if r["name"] == "fused_0")
    assert row["how"] in ("proved", "checked at 16 points")
    assert "def fused_0" in row["derivation"] and "sigmoid" in row["derivation"]
    assert step.stats["proofs"]["fused_0"] == row["how"]
    data = report.to_json()
    assert data["status"] == "ok" and data["compiled"][0]["name"] == kernels[0]["name"]
    _valid(data)


def test_a_planted_error_in_a_fused_kernel_is_a_not_ok_report_naming_it(monkeypatch):
    _no_checks_at_generation(monkeypatch)
    _plant_wrong_mul(monkeypatch)
    step = _step()
    step(sg.randn(6, 5))
    assert step._entries(), "the wrong code must be what runs"
    report = step.verify()  # no RuntimeError
    assert not report.ok and report.status == "mismatch"
    assert report.bad_kernel == "fused_0"
    row = next(r for r in report.compiled if r["name"] == "fused_0")
    assert row["status"] == "wrong"
    assert "differs from SymPy's derivative" in row["detail"]
    assert "def fused_0" in row["derivation"] and "mul" in row["derivation"]
    # its effect, the gradient of w, is a row too, with the generated statement behind it
    grads = [r for r in report.compiled if r["kind"] == "generated gradient"]
    assert grads and grads[0]["status"] == "mismatch" and "leaf0" in grads[0]["name"]
    text = str(report)
    assert "compiled step: fused_0 disagrees" in text and "derivation:" in text
    assert text.startswith("symgrad.verify: MISMATCH")
    data = json.loads(report.to_json_str())
    assert data["ok"] is False and data["bad_kernel"] == "fused_0"
    assert "fused_0" in report._repr_html_()
    _valid(data)
    # the traced forward's own rules are right: the eager-side rows say so
    assert all(r.status in ("ok", "not run") for r in report.nodes)


def test_generated_code_that_disagrees_outside_fused_loops_is_named_by_gradient(monkeypatch):
    """A wrong gradient made by generated code outside the proved loops (here the returned
    run output scaled): the report names the gradient and the statements computing it."""
    step = _step()
    step(sg.randn(6, 5))
    entry = step._entries()[-1]
    make = entry.module.make

    def bad_make(K):
        run, bufs = make(K)

        def wrong(A, L, E, H):
            outs = run(A, L, E, H)
            for b in bufs.values():
                b *= 1.01
            return outs
        return wrong, bufs

    monkeypatch.setattr(entry.module, "make", bad_make)
    report = step.verify()
    assert not report.ok and report.status == "mismatch"
    assert report.bad_kernel == "gradient of leaf0"
    row = next(r for r in report.compiled if r["name"] == "gradient of leaf0")
    assert "generated code differs from eager" in row["detail"]
    assert row["derivation"]  # the generated statements that write it
    assert any(r["status"] == "ok" for r in report.compiled if r["name"] == "fused_0")


def test_a_planted_error_in_a_plain_fused_backward_loop_is_named(monkeypatch):
    """The plain fused path (a forward loop, then a backward loop per run): a wrong partial
    in the compile rules' table names that backward loop."""
    from symgrad.compile import fuse

    _no_checks_at_generation(monkeypatch)
    monkeypatch.setenv("SYMGRAD_COMPILE_FWDBWD", "0")
    monkeypatch.setattr(fuse, "_LOCAL", dict(fuse._LOCAL, mul=("{g} * {b}", "{g} * {b}")))
    step = _step()
    step(sg.randn(6, 5))
    report = step.verify()
    assert not report.ok and report.status == "mismatch"
    assert report.bad_kernel is not None and report.bad_kernel.startswith("fused_0_b")
    row = next(r for r in report.compiled if r["name"] == report.bad_kernel)
    assert row["kind"] == "fused backward loop" and row["status"] == "wrong"
    assert f"def {report.bad_kernel}(" in row["derivation"]
