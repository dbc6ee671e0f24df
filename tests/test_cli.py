"""The ``symgrad`` command: exit codes, JSON output, plain lines without a TTY, and reports
that name nodes by grad_fn and leaves by parameter path or argument name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

CHECKS = textwrap.dedent('''
    import symgrad as sg
    from symgrad.testing import gradient_check


    @gradient_check(inputs=[(3,), (3,)])
    def check_mul_sin(x, y):
        return (x * y.sin()).sum()


    @gradient_check(inputs=lambda: (sg.tensor([[0.5, 1.0], [2.0, 0.25]], dtype=sg.float64,
                                              requires_grad=True),))
    def check_matrix_log(m):
        return (m @ m).log()
''')

BUGGY = textwrap.dedent('''
    import symgrad as sg
    from symgrad.ops import OPS
    from symgrad.testing import gradient_check

    OPS["tanh"].grads["self"] = lambda grad, result: grad * (1 - result)  # wrong on purpose


    @gradient_check(inputs=[(3,)])
    def check_tanh(x):
        return x.tanh().sum()
''')


def _run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "symgrad", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def checks_dir(tmp_path):
    (tmp_path / "checks_good.py").write_text(CHECKS)
    (tmp_path / "checks_buggy.py").write_text(BUGGY)
    return tmp_path


def test_all_ok_exits_zero_and_writes_valid_json(checks_dir):
    out = checks_dir / "report.json"
    r = _run("check", "checks_good.py", "--json", str(out), "--html",
             str(checks_dir / "r.html"), cwd=checks_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "2 passed, 0 failed"
    assert all("\r" not in line and "\x1b" not in line for line in lines)  # no TTY: plain
    data = json.loads(out.read_text())
    assert data["schema"] == "symgrad.checks/1" and data["total"] == 2
    import pathlib

    import jsonschema

    import symgrad.symbolic

    schema = json.loads((pathlib.Path(symgrad.symbolic.__file__).parent /
                         "report.schema.json").read_text())
    for check in data["checks"]:
        jsonschema.validate(check["report"], schema)
    assert "check_matrix_log" in (checks_dir / "r.html").read_text()


def test_a_wrong_rule_exits_one_and_names_the_node(checks_dir):
    r = _run("check", str(checks_dir), cwd=checks_dir)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED checks_buggy.py::check_tanh" in r.stdout
    assert "TanhBackward0" in r.stdout
    assert r.stdout.strip().splitlines()[-1] == "2 passed, 1 failed"


def test_k_filter_and_func_selector(checks_dir):
    r = _run("check", str(checks_dir), "-k", "mul or matrix", cwd=checks_dir)
    assert r.returncode == 0 and "2 passed, 0 failed" in r.stdout
    r = _run("check", "checks_good.py:check_mul_sin", cwd=checks_dir)
    assert r.returncode == 0 and "1 passed, 0 failed" in r.stdout


@pytest.mark.parametrize("args", [["check", "no_such_file.py"], ["check", "no.such.module"],
                                  ["frobnicate"], ["check"],
                                  ["check", "checks_good.py", "-k", "and ("]])
def test_usage_errors_exit_two(checks_dir, args):
    r = _run(*args, cwd=checks_dir)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "error" in r.stderr.lower()


def test_verify_rules_proves_every_rule_and_fails_on_a_wrong_one(tmp_path):
    r = _run("verify-rules", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1].endswith("passed, 0 failed")
    assert any(line.startswith("proved") and "MulBackward0" in line for line in lines)
    broken = ("from symgrad.ops import OPS\n"
              "OPS['cos'].grads['self'] = lambda grad, self: grad * self.sin()\n"
              "from symgrad.cli import main\n"
              "raise SystemExit(main(['verify-rules']))\n")
    r = subprocess.run([sys.executable, "-c", broken], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert any(line.startswith("failed") and "CosBackward0" in line
               for line in r.stdout.splitlines())


# -- names: the CLI speaks the user's names ---------------------------------------------------
MODEL = textwrap.dedent('''
    import symgrad as sg
    from symgrad import nn
    from symgrad.autograd import Function
    from symgrad.testing import gradient_check


    class Cube(Function):
        @staticmethod
        def forward(ctx, u):
            ctx.save_for_backward(u)
            return u * u * u

        @staticmethod
        def backward(ctx, grad):
            (u,) = ctx.saved_tensors
            return grad * 2 * u * u  # wrong on purpose: d(u^3)/du = 3 u^2

        @staticmethod
        def sympy(u):
            return u ** 3


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(3, 4).double()
            self.fc2 = nn.Linear(4, 1).double()

        def forward(self, x):
            return self.fc2(Cube.apply(self.fc1(x)))


    sg.manual_seed(0)
    model = Net()


    @gradient_check(inputs=[(5, 3)])
    def check_net(batch):
        return model(batch).sum()
''')

NO_SYMPY = textwrap.dedent('''
    from symgrad.autograd import Function
    from symgrad.testing import gradient_check


    class BadScale(Function):  # forward not traceable: checked by finite differences
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            k = float(b.detach().sum())  # a Python value stops the symbolic trace
            return a * b * (k / k)

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            return grad * b * 2, grad * a  # wrong on purpose: factor 2


    @gradient_check(inputs=[(2, 3), (3,)])
    def check_scale(x, w):
        return BadScale.apply(x, w).tanh().sum()
''')


@pytest.fixture(scope="module")
def model_run(tmp_path_factory):
    """One default run, one --verbose run of each failing project (they take seconds)."""
    d = tmp_path_factory.mktemp("names")
    (d / "model_checks.py").write_text(MODEL)
    (d / "scale_checks.py").write_text(NO_SYMPY)
    runs = {}
    for target in ("model_checks.py", "scale_checks.py"):
        stem = target.split("_")[0]
        runs[stem] = _run("check", target, "--json", f"{stem}.json", "--html",
                          f"{stem}.html", cwd=d)
        runs[stem + "-v"] = _run("check", target, "-v", cwd=d)
    return d, runs


def _json(d, stem):
    def no_nan(token):
        raise AssertionError(f"non-standard JSON constant {token}")

    return json.loads((d / f"{stem}.json").read_text(), parse_constant=no_nan)


def _leaf_table(stdout: str) -> list[dict]:
    """The leaf table's rows as {header: cell}, cells cut at the header's columns."""
    lines = stdout.splitlines()
    k = next(i for i, line in enumerate(lines) if "engine grad" in line and "leaf" in line)
    header, dashes = lines[k], lines[k + 1]
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", dashes)]
    names = [header[a:b].strip() for a, b in spans]
    rows = []
    for line in lines[k + 2:]:
        if not line.strip() or line.strip().startswith(("columns", "grads", "...")):
            break
        rows.append({n: line[a:b + 1].strip() for n, (a, b) in zip(names, spans)})
    return rows


def _fmt(x):
    from symgrad.symbolic.report import _fmt as fmt

    return fmt(x)


def test_failure_names_the_node_by_grad_fn_and_the_leaves_by_parameter_path(model_run):
    d, runs = model_run
    r = runs["model"]
    assert r.returncode == 1, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("FAILED model_checks.py::check_net")
    assert re.search(r"first bad node: CubeBackward \(#\d+ of \d+ from the root\)", first), first
    assert not re.search(r"first bad node: \d", r.stdout)  # never a bare id
    rows = {row["leaf"]: row for row in _leaf_table(r.stdout)}
    assert set(rows) == {"fc1.weight", "fc1.bias", "batch"}  # only what disagrees
    assert all(row["status"] == "mismatch" for row in rows.values())
    assert not re.search(r"\b(x0|t0|t1)\b", r.stdout)
    report = _json(d, "model")["checks"][0]["report"]
    for leaf in report["leaves"]:  # every column holds what its header says
        if leaf["name"] in rows:
            row = rows[leaf["name"]]
            assert row["engine grad"] == _fmt(leaf["engine_value"])
            assert row["symbolic grad"] == _fmt(leaf["symbolic_value"])
            assert row["finite-diff grad"] == _fmt(leaf["fd_value"])
            assert row["shape"] == "x".join(map(str, leaf["shape"])) + " float64"


def test_default_is_a_summary_and_verbose_has_everything(model_run):
    d, runs = model_run
    short, full = runs["model"].stdout, runs["model-v"].stdout
    assert runs["model-v"].returncode == 1
    report = _json(d, "model")["checks"][0]["report"]
    labels = [n["label"] for n in report["nodes"]]
    ok_labels = [n["label"] for n in report["nodes"] if n["status"] == "ok"]
    assert len(labels) == 6 and all(label in full for label in labels)
    assert not any(label in short for label in ok_labels)
    assert "--verbose" in short and "--verbose" not in full
    assert {row["leaf"] for row in _leaf_table(full)} == {
        "fc1.weight", "fc1.bias", "batch", "fc2.weight", "fc2.bias"}
    header = next(line for line in full.splitlines() if "engine grad" in line).split("  ")
    header = [h.strip() for h in header if h.strip()]
    assert header == ["leaf", "shape", "status", "worst element", "engine grad",
                      "symbolic grad", "finite-diff grad", "max abs err", "bound",
                      "max rel err", "finite-diff err", "elements checked"]
    node_header = next(line for line in full.splitlines() if "checked against" in line)
    assert [h.strip() for h in node_header.split("  ") if h.strip()] == [
        "node", "local check", "checked against", "max abs err", "bound", "max rel err",
        "formula"]
    assert "tolerance:" in full and "rtol 1e-08" in full
    assert "tolerance:" not in short


def test_long_details_are_not_cut_and_finite_differences_are_named(model_run):
    d, runs = model_run
    report = _json(d, "scale")["checks"][0]["report"]
    assert [lf["name"] for lf in report["leaves"]] == ["x", "w"]  # the argument names
    bad = next(n for n in report["nodes"] if n["id"] == report["first_bad_node"])
    assert bad["name"] == "BadScaleBackward" and bad["reference"] == "finite differences"
    assert report["first_bad_node_label"] == bad["label"]
    assert len(bad["detail"]) > 100 and ", finite differences " in bad["detail"]
    assert ", symbolic " not in bad["detail"]  # the reference is finite differences
    for key in ("scale", "scale-v"):
        out = runs[key].stdout
        flat = " ".join(out.split())
        assert " ".join(bad["detail"].split()) in flat  # wrapped, never cut
        assert all(len(line) <= 110 for line in out.splitlines() if "d/da[" in line), out


def test_json_and_html_carry_the_names(model_run):
    d, _ = model_run
    data = _json(d, "model")
    report = data["checks"][0]["report"]
    assert isinstance(report["first_bad_node"], int)  # machine-usable id, as before
    assert re.fullmatch(r"CubeBackward \(#\d of 6 from the root\)",
                        report["first_bad_node_label"])
    nodes = {n["id"]: n for n in report["nodes"]}
    assert nodes[report["first_bad_node"]]["label"] == report["first_bad_node_label"]
    assert sorted(n["position"] for n in report["nodes"]) == list(range(1, 7))
    root = next(n for n in report["nodes"] if n["position"] == 1)
    assert root["name"] == "SumBackward0" and root["id"] == max(nodes)
    assert [lf["name"] for lf in report["leaves"]] == ["fc1.weight", "fc1.bias", "batch",
                                                       "fc2.weight", "fc2.bias"]
    import pathlib

    import jsonschema

    import symgrad.symbolic

    schema = json.loads((pathlib.Path(symgrad.symbolic.__file__).parent /
                         "report.schema.json").read_text())
    jsonschema.validate(report, schema)
    page = (d / "model.html").read_text()
    assert report["first_bad_node_label"] in page and "fc1.weight" in page
    for th in ("engine grad", "symbolic grad", "finite-diff grad", "max abs err",
               "checked against"):
        assert f">{th}</th>" in page


def _without_times(data: dict) -> dict:
    for check in data["checks"]:
        check["report"].pop("seconds", None)
    return data


def test_workers_give_the_serial_reports(checks_dir, capsys, monkeypatch):
    """``--workers 2`` fans each check's node checks out over 2 processes: the same lines,
    the same JSON (the wrong tanh rule named as in one process)."""
    from symgrad.cli import main
    from symgrad.ops import OPS
    from symgrad.symbolic import fanout

    # checks_buggy.py replaces the tanh rule when loaded: restored after this test
    monkeypatch.setitem(OPS["tanh"].grads, "self", OPS["tanh"].grads["self"])
    runs = {}
    for label, extra in (("serial", []), ("fanned", ["--workers", "2"])):
        fanout.LAST_RUN.clear()
        rc = main(["check", str(checks_dir), "--mode", "local",
                   "--json", str(checks_dir / f"{label}.json"), *extra])
        out = re.sub(r"\d+\.\d+ s\)", "(time) s)", capsys.readouterr().out)
        runs[label] = (rc, out,
                       _without_times(json.loads((checks_dir / f"{label}.json").read_text())),
                       dict(fanout.LAST_RUN))
    (rc_s, out_s, data_s, fan_s), (rc_f, out_f, data_f, fan_f) = runs["serial"], runs["fanned"]
    assert rc_s == rc_f == 1 and "TanhBackward0" in out_f
    assert out_f == out_s and data_f == data_s
    assert fan_s == {}  # one process: nothing fanned out
    # the last check's nodes went to worker processes
    assert fan_f["sent"] > 0 and fan_f["fallback"] == 0, fan_f


@pytest.mark.parametrize("value", ["0", "-3", "two", "1.5"])
def test_workers_must_be_a_positive_integer(checks_dir, capsys, value):
    from symgrad.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["check", str(checks_dir), "--workers", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --workers: expected a whole number of worker processes (>= 1), " \
           f"got {value!r}" in err
