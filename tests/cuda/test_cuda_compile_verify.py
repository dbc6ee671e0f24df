"""``step.verify()`` of a compiled CUDA step, under the simulator.

The same promise as on the CPU (tests/test_compile.py, tests/test_compile_custom.py):
``sg.verify`` on the traced forward replayed on the CPU from host copies of the
parameters and of the traced call's arguments; a fresh instance of the CUDA plan, run on
device copies of everything, against the eager engine's gradients on that replay; each
fused run's CUDA kernels proved against SymPy on the derivation they were made from
(``stats["proofs"]``). Nothing the user owns changes: parameters, ``.grad``, optimizer
state and the entry's device buffers are the same bits after verify(), and the step goes
on equal to eager."""

from __future__ import annotations

import re
import sys
import warnings

import numpy as np
import pytest
from _tolerance import assert_close
from test_compile_custom import _wrong_fn
from test_cuda_compile import _assert_same, _cuda_data, _cuda_pair

import symgrad as sg
from symgrad.backends import backend_for
from symgrad.compile import fwdbwd

_PROVED = ("proved", "checked at 16 points")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cc"))


def _host(a) -> np.ndarray:
    return np.asarray(a) if isinstance(a, np.ndarray) else backend_for("cuda").to_host(a)


def _snapshot(step, compiled, args) -> dict:
    """Host copies of everything verify() must leave alone: parameters, .grad, optimizer
    state, the call's arguments, and the entry's device buffers (its .grad buffers, the
    arrays it is bound to, the traced call's argument copies it replays from)."""
    model, opt = compiled
    entry = step._entries()[-1]
    snap = {}
    for i, p in enumerate(model.parameters()):
        snap[f"param {i}"] = p._data
        snap[f"grad {i}"] = p._grad._data
        for key, t in opt.state.get(p, {}).items():
            snap[f"state {key} {i}"] = t._data
    for i, a in enumerate(args):
        snap[f"arg {i}"] = a._data
    for slot, t in entry._grad_tensors.items():
        snap[f"grad buffer {slot}"] = t._data
    for i, a in enumerate(entry._bound):
        snap[f"bound {i}"] = a
    for i, a in enumerate(entry.example):
        snap[f"example {i}"] = a
    return {k: (_host(a).copy(), a) for k, a in snap.items()}


def _assert_unchanged(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for k, (host, arr) in before.items():
        now, arr_now = after[k]
        assert arr_now is arr, f"{k} was replaced"
        assert host.dtype == now.dtype and host.shape == now.shape, k
        assert host.tobytes() == now.tobytes(), f"{k} changed"  # bit for bit


@pytest.mark.parametrize("act,opt,loss", [
    ("relu", "sgd", "mse"),
    ("tanh", "sgd_momentum_wd", "cross_entropy"),
    ("gelu", "adam", "cross_entropy"),
    ("gelu", "sgd", "mse"),
    ("relu", "adamw", "mse"),
])
def test_verify_cuda_step_is_clean_proves_its_kernels_and_has_no_side_effect(act, opt, loss):
    step, eager, c, e = _cuda_pair(act, opt, loss)
    for i in range(2):
        x, y = _cuda_data(i, loss)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            step(x, y)
        eager(x, y)
    entry = step._entries()[-1]
    assert entry.device.type == "cuda"
    before = _snapshot(step, c, (x, y))
    report = step.verify()
    assert report.ok, report
    _assert_unchanged(before, _snapshot(step, c, (x, y)))
    proofs = step.stats["proofs"]
    assert set(proofs) == {f.name for f in entry.module.runs}
    assert set(proofs.values()) <= set(_PROVED)
    if act == "gelu":  # its elementwise run is a fused CUDA kernel, proved
        assert proofs and "fused_0" in proofs
    # the live plan is untouched: the step goes on equal to eager
    x, y = _cuda_data(2, loss)
    step(x, y)
    eager(x, y)
    _assert_same(c, e, 3)
    assert step.stats["traces"] == 1 and step.stats["fallbacks"] == []


def test_verify_reports_a_wrong_custom_backward_in_a_cuda_step():
    """The wrong backward runs on the device as eager runs it (the compiled step equals
    eager), and verify() reports it, as on the CPU."""
    sg.manual_seed(2)
    w = sg.randn(3, 4, device="cuda").requires_grad_()
    w_e = w.detach().clone().requires_grad_()
    step = sg.compile(_wrong_fn(w, sg.optim.SGD([w], lr=0.1)))
    eager = _wrong_fn(w_e, sg.optim.SGD([w_e], lr=0.1))
    x = sg.randn(5, 3).to("cuda")
    for i in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = step(x)
        want = eager(x)
        terms = (i + 1) * 16
        assert_close(got.cpu(), want.detach().cpu(), terms=terms)
        assert_close(w.grad.cpu(), w_e.grad.cpu(), terms=terms)  # the wrong gradient
    assert step._entries()[-1].device.type == "cuda"
    report = step.verify()
    assert not report.ok
    assert "WrongTanhBackward" in str(report)


def test_fused_cuda_kernels_are_proved_when_generated_and_recorded(monkeypatch):
    """As on the CPU: each fused run proved once, the outcome recorded in the disk cache;
    the same derivation compiled again reads the record (no proof runs)."""
    from symgrad.compile import prove

    step, _, _, _ = _cuda_pair("gelu", "sgd", "mse")
    x, y = _cuda_data(0, "mse")
    step(x, y)
    assert step.stats["proofs"] and all(v in _PROVED for v in step.stats["proofs"].values())
    ran = []
    monkeypatch.setattr(prove, "prove_runs", lambda runs: ran.append(runs) or {})
    again, _, _, _ = _cuda_pair("gelu", "sgd", "mse")
    again(x, y)
    assert ran == [] and again.stats["proofs"] == step.stats["proofs"]


def test_verify_catches_a_corrupted_fused_cuda_kernel(monkeypatch):
    """A wrong derivation of the GELU run (d(a*b)/db = b) with the self-check off: the proof
    at generation keeps the step eager; without it, verify() finds the generated code's
    gradients disagree with eager's on the replay (naming the leaf), and with that
    comparison off too, the SymPy proof of the CUDA kernel catches it."""
    describe = fwdbwd.describe

    def wrong(group, d, parallel, simd=True):
        desc = describe(group, d, parallel, simd=simd)
        for op in desc["ops"]:
            if op[0] == "mul":
                op[2] = ["g * b", "g * b"]
        return desc

    monkeypatch.setattr(fwdbwd, "describe", wrong)
    step_module = sys.modules["symgrad.compile.step"]
    monkeypatch.setattr(step_module, "self_check", lambda *a: None)
    # the proof when the step is generated catches it first: the signature stays eager
    step, _, c, _ = _cuda_pair("gelu", "sgd", "mse")
    x, y = _cuda_data(0, "mse")
    with pytest.warns(UserWarning, match=r"a fused CUDA kernel failed its SymPy proof: "
                                         r"fused_0: gradient of x\d+ differs"):
        step(x, y)
    assert not step._entries()
    # with that proof off, verify() still finds it
    monkeypatch.setattr(step_module.CompiledStep, "_prove", lambda *a: None)
    step, _, c, _ = _cuda_pair("gelu", "sgd", "mse")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(x, y)
    assert step._entries() and step._entries()[-1].module.runs
    report = step.verify()  # a report naming the kernel, and the gradient it spoils
    assert not report.ok and report.bad_kernel == "fused_0"
    assert any(re.fullmatch(r"gradient of leaf ?\d+", r["name"]) for r in report.compiled)
    monkeypatch.setattr(sys.modules["symgrad.compile.replay"], "check_generated",
                        lambda *a: [])
    report = step.verify()
    assert not report.ok and report.bad_kernel == "fused_0"
    row = next(r for r in report.compiled if r["name"] == "fused_0")
    assert row["kind"] == "fused CUDA kernel" and row["status"] == "wrong"
    assert re.match(r"fused_0: gradient of x\d+ differs from SymPy's derivative", row["detail"])
