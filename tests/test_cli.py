"""The ``symgrad`` command: exit codes, JSON output, plain lines without a TTY."""

from __future__ import annotations

import json
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
