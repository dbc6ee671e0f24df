"""The verifier checks a graph as it was recorded (issue 29, scope 2).

After ``loss.backward(); opt.step()`` the leaves hold new values while ``.grad`` holds the
gradient at the old ones. Verifying then used to compare ``.grad`` with SymPy's gradient at
the new values and report agreement or "imprecise" (float32 rounding). Now the verifier
either checks at the recorded values (kept under ``symgrad.record()``, which ``%%symgrad``
uses) and agrees for the right reason, or reports ``changed in place`` with one line naming
the leaf, its versions and where the check belongs.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
import weakref
from pathlib import Path

import numpy as np
import pytest

import symgrad as sg
from symgrad.symbolic.verify import DEFAULT_TOLERANCES

jsonschema = pytest.importorskip("jsonschema")
SCHEMA = json.loads((Path(sg.__file__).parent / "symbolic" / "report.schema.json").read_text())


def _valid(rep) -> dict:
    data = rep.to_json()
    jsonschema.validate(data, SCHEMA)
    json.dumps(data, allow_nan=False)
    return data


def _model(dtype):
    sg.manual_seed(0)
    model = sg.nn.Sequential(sg.nn.Linear(3, 4), sg.nn.Tanh(), sg.nn.Linear(4, 1)).to(dtype)
    x = sg.randn(5, 3, dtype=dtype)
    y = sg.randn(5, 1, dtype=dtype)
    return model, x, y


#: every optimizer that updates parameters in its step (LBFGS needs a closure: its writes
#: are Tensor in-place ops, covered by the add_/copy_ tests)
OPTIMIZERS = {
    "sgd": lambda p: sg.optim.SGD(p, lr=0.5, momentum=0.9),
    "adam": lambda p: sg.optim.Adam(p, lr=0.3),
    "adamw": lambda p: sg.optim.AdamW(p, lr=0.3),
    "rmsprop": lambda p: sg.optim.RMSprop(p, lr=0.1),
    "adagrad": lambda p: sg.optim.Adagrad(p, lr=0.3),
    "adadelta": lambda p: sg.optim.Adadelta(p, lr=1.0),
    "adamax": lambda p: sg.optim.Adamax(p, lr=0.3),
    "nadam": lambda p: sg.optim.NAdam(p, lr=0.3),
    "radam": lambda p: sg.optim.RAdam(p, lr=0.3),
    "asgd": lambda p: sg.optim.ASGD(p, lr=0.3),
    "rprop": lambda p: sg.optim.Rprop(p, lr=0.3),
    "adafactor": lambda p: sg.optim.Adafactor(p, lr=0.3),
}


def _train_step(opt_name, dtype, recorded):
    model, x, y = _model(dtype)
    opt = OPTIMIZERS[opt_name](model.parameters())
    with sg.record() if recorded else contextlib.nullcontext():
        loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    old = {id(p): p.detach().clone() for p in model.parameters()}
    grads = {id(p): p.grad.detach().clone() for p in model.parameters()}
    opt.step()
    for p in model.parameters():  # the step really moved every parameter
        assert not np.allclose(p.detach().numpy(), old[id(p)].numpy())
    return model, loss, grads, (x, y)  # the inputs stay alive, as in a user's loop


CHANGED_LINE = re.compile(r"^changed in place: (\S+ \(version \d+ when recorded, \d+ now\)"
                          r"(, )?)+ written after the graph was recorded; (its recorded value "
                          r"is|their recorded values are) gone, so nothing was checked: "
                          r"verify before opt\.step\(\)")


@pytest.mark.parametrize("dtype", [sg.float32, sg.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
def test_verify_after_opt_step_without_record_names_the_changed_leaves(opt_name, dtype):
    model, loss, _, _inputs = _train_step(opt_name, dtype, recorded=False)
    names = dict(model.named_parameters())
    rep = sg.verify(loss, names=names)
    assert not rep.ok
    assert rep.status == "changed in place"
    assert all(r.status == "changed in place" for r in rep.leaves)
    assert sorted(r.name for r in rep.leaves) == sorted(names)  # each leaf once
    line = rep.notes[0]
    assert CHANGED_LINE.match(line), line
    for name in names:  # recorded version vs now: the step bumped each one by one
        m = re.search(re.escape(name) + r" \(version (\d+) when recorded, (\d+) now\)", line)
        assert m and int(m.group(2)) == int(m.group(1)) + 1 == names[name]._version
    assert [n for n in rep.notes if "recorded" in n] == [line]  # said once
    text = rep.to_text()
    assert "CHANGED IN PLACE" in text.splitlines()[0]
    assert "OK" not in text.splitlines()[0] and "imprecise" not in text.lower()
    data = _valid(rep)
    assert data["status"] == "changed in place" and data["ok"] is False
    with pytest.raises(AssertionError, match="CHANGED IN PLACE"):
        rep.assert_ok()


@pytest.mark.parametrize("dtype", [sg.float32, sg.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("opt_name", ["sgd", "adam"])
def test_verify_after_opt_step_under_record_checks_the_recorded_values(opt_name, dtype):
    model, loss, grads, _ = _train_step(opt_name, dtype, recorded=True)
    rep = sg.verify(loss, names=dict(model.named_parameters()))
    assert rep.ok and rep.status == "ok"
    assert rep.precise  # agreement, not float32 "imprecise"
    assert {r.status for r in rep.leaves} == {"ok"}
    assert "checked at the values recorded then" in rep.notes[0]
    # the symbolic gradient is the one at the old weights: at each row's worst element it
    # equals .grad from the backward before the step, to the dtype's tolerance
    rtol, atol = DEFAULT_TOLERANCES[np.dtype(dtype.np).name]
    for row, p in zip(rep.leaves, model.parameters()):
        old = float(grads[id(p)].numpy()[tuple(row.worst_index)])
        assert row.symbolic_value == pytest.approx(old, rel=rtol, abs=atol + rtol * abs(old))
    _valid(rep)


def test_a_wrong_rule_is_still_caught_at_the_recorded_values(monkeypatch):
    """Checking at the kept values is a real check: a wrong backward still disagrees."""
    from symgrad.ops import OPS

    monkeypatch.setitem(OPS["add"].grads, "other", lambda grad, alpha: grad * 2)
    monkeypatch.setattr(OPS["add"], "fused_backward", None, raising=False)
    w = sg.tensor([0.5, -1.0], dtype=sg.float64, requires_grad=True)
    b = sg.tensor([0.25, 0.5], dtype=sg.float64, requires_grad=True)
    with sg.record():
        loss = (w.sin() + b).sum()
    loss.backward()
    sg.optim.SGD([w, b], lr=0.5).step()
    rep = sg.verify(loss, names={"w": w, "b": b})
    assert not rep.ok and rep.status == "mismatch"
    assert {r.name: r.status for r in rep.leaves} == {"w": "ok", "b": "mismatch"}


def _leaf_graph(recorded):
    w = sg.tensor([0.5, -1.0, 2.0], dtype=sg.float64, requires_grad=True)
    x = sg.tensor([1.5, 2.0, -0.5], dtype=sg.float64)
    with sg.record() if recorded else contextlib.nullcontext():
        loss = (w.sin() * x).sum()
    loss.backward()
    return w, x, loss


WRITES = {
    "add_": lambda t: t.add_(1.0),
    "copy_": lambda t: t.copy_(sg.tensor([9.0, 8.0, 7.0], dtype=sg.float64)),
    "zero_": lambda t: t.zero_(),
    "setitem": lambda t: t.__setitem__(1, 4.0),
    "data.mul_": lambda t: t.data.mul_(3.0),
}


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("which", ["w", "x"])
def test_inplace_write_on_a_leaf_without_record(write, which):
    w, x, loss = _leaf_graph(recorded=False)
    with sg.no_grad():
        WRITES[write]({"w": w, "x": x}[which])
    rep = sg.verify(loss, names={"w": w, "x": x})
    assert rep.status == "changed in place" and not rep.ok
    assert CHANGED_LINE.match(rep.notes[0])
    assert rep.notes[0].startswith(f"changed in place: {which} (version 0 when recorded, 1 "
                                   "now) written")
    # a row for the leaf requiring grad only; a constant is named in the line
    assert [r.name for r in rep.leaves] == (["w"] if which == "w" else [])
    _valid(rep)


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("which", ["w", "x"])
def test_inplace_write_on_a_leaf_under_record(write, which):
    w, x, loss = _leaf_graph(recorded=True)
    expected = (np.cos(w.detach().numpy()) * x.numpy()).copy()
    with sg.no_grad():
        WRITES[write]({"w": w, "x": x}[which])
    rep = sg.verify(loss, names={"w": w, "x": x})
    assert rep.ok and rep.status == "ok" and rep.precise
    assert rep.notes[0].startswith(f"{which} (version 0 when recorded, 1 now) changed in "
                                   "place after the graph was recorded; checked at the values "
                                   "recorded then")
    (row,) = rep.leaves
    assert row.symbolic_value == pytest.approx(expected[row.worst_index], rel=1e-12)


def test_unchanged_leaves_are_not_copied_and_copies_die_with_the_graph():
    """Copy on write: recording keeps no copy of a leaf nobody writes, and the copy an
    optimizer step made goes when the graph goes (no growth over a training loop)."""
    from symgrad.autograd import record as rec

    model, x, y = _model(sg.float32)
    opt = sg.optim.SGD(model.parameters(), lr=0.1)
    gc.disable()
    try:
        for _ in range(3):
            with sg.record():
                loss = ((model(x) - y) ** 2).mean()
            kept = [k for n in _nodes(loss) for k in getattr(n, "_kept", None) or ()]
            assert kept and not any(k.copied for k in kept)
            assert all(k.array is k.tensor._data for k in kept)  # no copy yet
            opt.zero_grad()
            loss.backward()
            opt.step()
            params = {id(p) for p in model.parameters()}
            assert {id(k.tensor) for k in kept if k.copied} == params
            assert not any(k.copied for k in kept if id(k.tensor) not in params)  # x, y
            refs = [weakref.ref(k) for k in kept]
            del loss, kept
            assert all(r() is None for r in refs)  # freed by reference counting alone
        assert not any(r() is not None and r().copied for refs in rec._watch.values()
                       for r in refs)
    finally:
        gc.enable()


def _nodes(t):
    seen, stack, out = set(), [t.grad_fn], []
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n)
        stack.extend(m for m, _ in n.next_functions)
    return out


def test_intermediate_written_under_no_grad_is_replayed():
    """A node output changed in place without recording (no_grad) is read from the
    replay of its recorded inputs, not from the tensor's new values (tanh saves its
    result and sin its input, so the engine's backward still runs)."""
    w = sg.tensor([0.3, 0.7], dtype=sg.float64, requires_grad=True)
    h = w.sin()  # saves w, not h
    loss = h.tanh().sum()
    with sg.no_grad():
        h.mul_(10.0)
    rep = sg.verify(loss, mode="local")  # each node checked at its recorded inputs
    assert rep.ok and rep.status == "ok"
    assert {r.status for r in rep.nodes} == {"ok"}


def test_live_graph_with_a_changed_saved_leaf_is_not_an_error_or_a_verdict():
    w = sg.tensor([0.5, 1.5], dtype=sg.float64, requires_grad=True)
    with sg.record():
        loss = (w * w).sum()
    loss.backward(retain_graph=True)
    with sg.no_grad():
        w.add_(1.0)
    rep = sg.verify(loss)  # the engine's backward cannot re-run on the new w
    assert rep.status == "changed in place" and not rep.ok
    assert rep.notes[0].startswith("changed in place: w (version 0 when recorded, 1 now)")


def _run_magic_cell(ip, capsys, cell):
    capsys.readouterr()
    ip.run_cell(cell)
    out, err = capsys.readouterr()
    return " ".join(out.split()), err  # notes wrap at the terminal width


@pytest.fixture
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    created = not InteractiveShell.initialized()
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "symgrad")
    yield ip
    if created:
        InteractiveShell.clear_instance()


SETUP = ("import symgrad as sg\n"
         "sg.manual_seed(0)\n"
         "model = sg.nn.Sequential(sg.nn.Linear(3, 4), sg.nn.Tanh(), sg.nn.Linear(4, 1))\n"
         "x = sg.randn(6, 3)\n"
         "y = sg.randn(6, 1)\n"
         "opt = sg.optim.SGD(model.parameters(), lr=0.9)\n")
STEP = ("opt.zero_grad()\n"
        "loss = ((model(x) - y) ** 2).mean()\n"
        "loss.backward()\n"
        "opt.step()\n")


def test_symgrad_cell_ending_in_opt_step(shell, capsys):
    """%%symgrad (which records) on a training step: checked at the recorded values, said
    so, and never 'imprecise'; plain verify of the same loss afterwards names the leaves."""
    shell.run_cell(SETUP)
    out, err = _run_magic_cell(shell, capsys, "%%symgrad\n" + STEP)
    assert "IMPRECISE" not in out and "imprecise" not in out
    assert "symgrad.verify: OK (" in out  # the graph as recorded agrees
    assert "changed in place after the graph was recorded; checked at the values " \
           "recorded then" in out
    rep = shell.magics_manager.registry["SymgradMagics"].last_report
    assert rep.ok and rep.precise and rep.status == "ok"

    # a training step recorded outside %%symgrad, verified by the line magic after the step
    shell.run_cell(STEP)
    out, err = _run_magic_cell(shell, capsys, "%symgrad verify loss")
    assert "symgrad.verify: CHANGED IN PLACE (" in out
    assert "agree" not in out and "IMPRECISE" not in out
    assert "verify before opt.step()" in out


def test_symgrad_cell_without_record_copy_claims_nothing(shell, capsys, monkeypatch):
    """If the recorded values are gone, the cell's graph says no verdict (not agree, not
    disagree) and the report names the changed leaves."""
    from symgrad.jupyter import magics

    monkeypatch.setattr(magics, "_record_context", contextlib.nullcontext)
    shell.run_cell(SETUP)
    out, err = _run_magic_cell(shell, capsys, "%%symgrad\n" + STEP)
    assert "gradients agree" not in out and "GRADIENTS DISAGREE" not in out
    assert "symgrad.verify: CHANGED IN PLACE" in out
    assert "verify before opt.step()" in out
    assert "IMPRECISE" not in out


def test_a_compiled_training_step_counts_as_an_in_place_change():
    """sg.compile's generated optimizer update writes the parameters as eager's does: it
    bumps their versions (it did not), so a graph recorded before it is not checked at
    the new values."""
    sg.manual_seed(0)
    model = sg.nn.Linear(3, 1)
    opt = sg.optim.SGD(model.parameters(), lr=0.5)
    x = sg.randn(4, 3)

    @sg.compile
    def step(x):
        opt.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    step(x)  # traced
    step(x)  # compiled
    assert step.stats["traces"] == 1 and not step.stats["fallbacks"]
    v = model.weight._version
    step(x)
    assert model.weight._version == v + 1
    loss = (model(x) ** 2).mean()
    loss.backward()
    step(x)
    rep = sg.verify(loss, names=dict(model.named_parameters()))
    assert rep.status == "changed in place"
    assert rep.notes[0].startswith(f"changed in place: weight (version {v + 1} when "
                                   f"recorded, {v + 2} now), bias (version")


CHECKS_CHANGED = '''
import symgrad as sg
from symgrad.testing import gradient_check


@gradient_check(inputs=[(3,)])
def check_changes_its_input(x):
    y = (x * x).sin().sum()
    with sg.no_grad():
        x.add_(1.0)  # after the graph was built: its recorded value is gone
    return y
'''


def test_cli_and_assert_helpers_report_the_changed_leaf(tmp_path):
    import subprocess
    import sys

    from symgrad.testing import assert_gradients_match

    (tmp_path / "checks_changed.py").write_text(CHECKS_CHANGED)
    out = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "symgrad", "check", "checks_changed.py",
                        "--json", str(out)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if "check_changes_its_input" in x)
    assert line.startswith("FAILED") and line.endswith("changed in place: x")
    assert "disagree" not in r.stdout
    data = json.loads(out.read_text())
    (check,) = data["checks"]
    assert check["report"]["status"] == "changed in place"
    jsonschema.validate(check["report"], SCHEMA)

    def fn(x):
        y = (x * x).sin().sum()
        with sg.no_grad():
            x.add_(1.0)
        return y

    with pytest.raises(AssertionError, match=r"CHANGED IN PLACE[\s\S]*x \(version 0 when "
                                             r"recorded, 1 now\)[\s\S]*verify before"):
        assert_gradients_match(fn, sg.tensor([0.5, 1.0, 1.5], requires_grad=True))


@pytest.mark.parametrize("recorded", [True, False])
def test_symgrad_cell_ending_in_opt_step_in_the_inspector(shell, capsys, monkeypatch, recorded):
    """The same cell where a kernel shows the Inspector: its verdict line and agreement
    are the report's (agree at the recorded values; else 'changed in place', no verdict)."""
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from symgrad.jupyter import magics

    if not recorded:
        monkeypatch.setattr(magics, "_record_context", contextlib.nullcontext)
    monkeypatch.setattr(shell, "kernel", object(), raising=False)  # as in a Jupyter kernel
    shell.run_cell(SETUP)
    _run_magic_cell(shell, capsys, "%%symgrad\n" + STEP)
    w = shell.magics_manager.registry["SymgradMagics"].last_inspector
    ag = w.graph["agreement"]
    status = w.static_parts()["status"]
    if recorded:  # agreement, but at the values recorded before opt.step(): said so
        assert ag["ok"] is True
        assert ag["verdict"] == ("checked at the values recorded before 0.weight, 0.bias, "
                                 "2.weight, 2.bias changed in place: gradients agree there")
        assert "checked at the values recorded then" in ag["message"]
        assert ag["verdict"] in status and 'data-status="pass"' in status
        assert "imprecise" not in status.lower() and w.report["precise"] is True
    else:
        assert ag["ok"] is None
        assert ag["verdict"].startswith("changed in place: ") and \
            "verify before opt.step()" in ag["verdict"]
        assert "agree" not in status and "changed in place: " in status
        assert w.report["status"] == "changed in place"
    w.close()


def test_data_replaced_under_record_is_checked_at_the_old_array():
    w, x, loss = _leaf_graph(recorded=True)
    expected = np.cos(w.detach().numpy()) * x.numpy()
    w.data = sg.tensor([9.0, 9.0, 9.0], dtype=sg.float64)  # another storage
    rep = sg.verify(loss, names={"w": w, "x": x})
    assert rep.ok and rep.status == "ok"
    assert rep.notes[0].startswith("w (its .data replaced) changed in place")
    (row,) = rep.leaves
    assert row.symbolic_value == pytest.approx(expected[row.worst_index], rel=1e-12)


def test_a_write_that_bypassed_the_hook_is_not_taken_for_the_recorded_value():
    """Under record() no copy is made for a write that did not announce itself; its
    version bump still says the kept array now holds new values: not checked."""
    w, x, loss = _leaf_graph(recorded=True)
    w.data.numpy()[:] = 7.0  # a raw write into the shared array
    w._storage.version += 1
    rep = sg.verify(loss, names={"w": w, "x": x})
    assert rep.status == "changed in place" and not rep.ok
    assert CHANGED_LINE.match(rep.notes[0]), rep.notes[0]


def test_symgrad_cell_ending_in_opt_step_graph_payload_says_recorded_values(shell, capsys,
                                                                          monkeypatch):
    """Without widgets: the cell's graph output (its payload, static HTML and text) says
    where the agreement holds, never a bare 'gradients agree'; a payload without the note
    keeps the plain agreement."""
    from IPython.core import display_functions

    from symgrad.jupyter.graph import GRAPH_MIME, _recorded_verdict

    shell.run_cell(SETUP)
    shown: list[dict] = []
    publish = display_functions.publish_display_data

    def spy(data, *args, **kwargs):
        shown.append(data)
        return publish(data, *args, **kwargs)

    monkeypatch.setattr(display_functions, "publish_display_data", spy)
    _run_magic_cell(shell, capsys, "%%symgrad\n" + STEP)
    bundles = [d for d in shown if GRAPH_MIME in d]
    assert len(bundles) == 1
    ag = bundles[0][GRAPH_MIME]["agreement"]
    line = ("checked at the values recorded before 0.weight, 0.bias, 2.weight, 2.bias "
            "changed in place: gradients agree there")
    assert ag["ok"] is True and ag["verdict"] == line
    assert line in bundles[0]["text/html"] and line in bundles[0]["text/plain"]
    assert "gradients agree<" not in bundles[0]["text/html"]
    assert _recorded_verdict({"ok": True, "notes": ["something else"]}) is None
    assert _recorded_verdict({"ok": False, "notes": [
        "w (its .data replaced) changed in place after the graph was recorded; checked at "
        "the values recorded then (symgrad.record() kept them)"]}) == \
        "checked at the values recorded before w changed in place: gradients disagree there"
