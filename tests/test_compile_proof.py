"""sg.compile proves each generated fused backward loop against SymPy when it generates the
module (not only in step.verify()), and keeps the outcome in the disk cache so that a
process loading the module from there does not import SymPy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad._codefiles import read_record


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """A fresh cache per test: the proof records are what is tested."""
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path / "cc"))


def _chain_fn(w, opt):
    def chain(x):
        opt.zero_grad()
        h = (x * w).tanh() + 1.0
        h = (h * h).sigmoid() - x
        loss = (h.exp() * 0.5).sum()
        loss.backward()
        opt.step()
        return loss

    return chain


def _pair(seed=3):
    sg.manual_seed(seed)
    w = sg.randn(6, 5, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)
    return (sg.compile(_chain_fn(w, sg.optim.SGD([w], lr=0.01))),
            _chain_fn(w_e, sg.optim.SGD([w_e], lr=0.01)), w, w_e)


def test_fused_backward_loops_are_proved_when_generated(tmp_path):
    step, _, _, _ = _pair()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(sg.randn(6, 5))
    proofs = step.stats["proofs"]  # set at generation: verify() was not called
    assert proofs and all(name.startswith("fused_") for name in proofs)
    assert set(proofs.values()) <= {"proved", "checked at 16 points"}
    records = list((tmp_path / "cc").glob("symgrad_step_*.proof.json"))
    assert len(records) == 1
    data = read_record(str(records[0]), "proof record")  # sealed: checked, then parsed
    assert data["ok"] and data["proofs"] == proofs


def test_a_wrong_fused_loop_is_caught_at_generation(monkeypatch, tmp_path):
    """The self-check is switched off, so only the proof can catch the wrong loop: the
    module is not used (eager runs, with a warning naming the loop), and the failure is
    recorded, so a second process would not use it either."""
    from symgrad.compile import fuse

    monkeypatch.setattr(sys.modules["symgrad.compile.step"], "self_check", lambda *a: None)
    monkeypatch.setenv("SYMGRAD_COMPILE_FWDBWD", "0")  # the plain path's loops (fuse._LOCAL)
    wrong = dict(fuse._LOCAL, mul=("{g} * {b}", "{g} * {b}"))  # d(a*b)/db = b: wrong
    monkeypatch.setattr(fuse, "_LOCAL", wrong)
    step, eager, w, w_e = _pair()
    x = sg.randn(6, 5)
    with pytest.warns(UserWarning, match=r"failed its SymPy proof: fused_0_b\d+: gradient of "
                                         r"x\d+ differs from SymPy"):
        got = step(x)
    assert not step._entries()
    assert_close(got, eager(x), terms=20 + 30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(2):
            assert_close(step(x), eager(x), terms=(i + 2) * (20 + 30))
    assert_close(w, w_e, terms=3 * (20 + 30))
    (record,) = (tmp_path / "cc").glob("symgrad_step_*.proof.json")
    assert not read_record(str(record), "proof record")["ok"]
    # a fresh step generating the same text reads the failure from the record
    again, _, _, _ = _pair()
    monkeypatch.setattr(sys.modules["symgrad.compile.prove"], "_prove_all",
                        lambda *a: pytest.fail("proved again despite the record"))
    with pytest.warns(UserWarning, match="failed its SymPy proof"):
        again(x)


_CHILD = textwrap.dedent("""
    import json, sys
    import symgrad as sg
    sg.manual_seed(3)
    w = sg.randn(6, 5, requires_grad=True)
    opt = sg.optim.SGD([w], lr=0.01)

    @sg.compile
    def chain(x):
        opt.zero_grad()
        h = (x * w).tanh() + 1.0
        loss = ((h * h).sigmoid() * 0.5).sum()
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        chain(sg.randn(6, 5))
    print(json.dumps({"sympy": "sympy" in sys.modules, "proofs": chain.stats["proofs"],
                      "fallbacks": chain.stats["fallbacks"]}))
""")


def test_a_cache_hit_does_not_import_sympy(tmp_path):
    env = dict(os.environ, SYMGRAD_COMPILE_CACHE=str(tmp_path), NUMBA_CACHE_DIR=str(tmp_path))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["sympy"] and first["proofs"] and not first["fallbacks"]
    assert not second["sympy"] and second["proofs"] == first["proofs"]
    assert not second["fallbacks"]


def test_values_made_under_no_grad_are_constants_to_the_proof_and_verify():
    """z = exp(x w) under no_grad fuses with z * w: the loop's gradient treats z as a
    constant, as eager does; the proof (and verify's replay) must too, not call it wrong."""
    sg.manual_seed(0)
    w = sg.randn(6, 5, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)

    def make(w, opt):
        def step(x):
            opt.zero_grad()
            with sg.no_grad():
                z = (x * w).exp()
            loss = (z * w).sum()
            loss.backward()
            opt.step()
            return loss

        return step

    step = sg.compile(make(w, sg.optim.SGD([w], lr=0.01)))
    eager = make(w_e, sg.optim.SGD([w_e], lr=0.01))
    x = sg.randn(6, 5)
    for i in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = step(x)
        assert_close(got, eager(x), terms=(i + 1) * 34)
        assert_close(w.grad, w_e.grad, terms=(i + 1) * 34)
    assert step.stats["proofs"] and "fused_0_b" in step.source()
    assert step.verify().ok


def _arith_fn(w):
    """The benchmark's chain shape: values between the SIMD ufuncs that are one or two
    arithmetic ops (``x * w``, ``h * 1.1``, ``(h + 0.3) ** 2``), with input gradients."""

    def step(x):
        w.grad = None
        x.grad = None
        h = ((x * w).sin() * 1.1).tanh() + 0.3
        loss = ((h * h).exp() - 0.2).sigmoid().sum()
        loss.backward()
        return loss

    return step


def _arith_pair():
    sg.manual_seed(5)
    w = sg.randn(40, requires_grad=True)
    x = sg.randn(40, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)
    x_e = sg.tensor(x.detach().numpy().copy(), requires_grad=True)
    return sg.compile(_arith_fn(w)), _arith_fn(w_e), (w, x), (w_e, x_e)


def test_one_op_values_between_ufuncs_are_shared_loops_proved_at_generation():
    """A value that is one or two arithmetic ops between NumPy's SIMD ufuncs is computed by
    loops every step shares (no Numba loop of its own to compile on the first call), and the
    proof runs those stages on SymPy values like the loops: same results as eager, proved."""
    step, eager, (w, x), (w_e, x_e) = _arith_pair()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(3):
            assert_close(step(x), eager(x_e), terms=(i + 1) * 12)
            assert_close(x.grad, x_e.grad, terms=12)
            assert_close(w.grad, w_e.grad, terms=12)
    src = step.source()
    assert "bo_multiply_aa(" in src and "bo_add_as(" in src and "np.sin(" in src
    # x * w, h * 1.1 and (h + 0.3) ** 2 are not loops: one loop for the rest of the run
    assert src.count("def fused_0_") == 1, src
    assert step.stats["proofs"] and not step.stats["fallbacks"]
    assert set(step.stats["proofs"].values()) <= {"proved", "checked at 16 points"}
    assert step.verify().ok


def test_a_wrong_numpy_stage_is_caught_at_generation(monkeypatch):
    """The self-check off, an ``add`` stage planted as ``subtract``: the proof, which runs
    the stages as derived, catches it and the step runs eagerly."""
    from symgrad.compile import fwdbwd

    monkeypatch.setattr(sys.modules["symgrad.compile.step"], "self_check", lambda *a: None)
    right = fwdbwd._as_ufuncs

    def wrong(sp, stores):
        calls = right(sp, stores)
        return calls and [[c[0], "subtract" if c[1] == "add" else c[1], *c[2:]]
                          for c in calls]

    monkeypatch.setattr(fwdbwd, "_as_ufuncs", wrong)
    step, eager, (w, x), (w_e, x_e) = _arith_pair()
    with pytest.warns(UserWarning, match=r"failed its SymPy proof: fused_0: value v\d+ "
                                         r"differs"):
        got = step(x)
    assert not step._entries()
    assert_close(got, eager(x_e), terms=12)
