"""Small report and CLI wording: each worst-element line says which check it comes from,
a missing path is called missing, and ``verify-rules`` prints aligned columns."""

from __future__ import annotations

import re

import numpy as np
import pytest

import symgrad as sg
from symgrad.cli import main
from symgrad.symbolic import verify
from symgrad.symbolic.audit import RuleAudit

# -- symgrad check PATH: a path that does not exist ----------------------------------------


@pytest.mark.parametrize("target", ["nope/", "nope/more/", "./nope", "nope/x:check_a",
                                    "my-checks"])
def test_check_of_a_missing_path_says_it_does_not_exist(target, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["check", target]) == 2
    err = capsys.readouterr().err
    path = target.split(":")[0]
    assert err == f"symgrad: error: no such file or directory: {path}\n"


def test_check_of_a_missing_module_name_says_neither_exists(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["check", "no.such.module"]) == 2
    assert capsys.readouterr().err == \
        "symgrad: error: no such file, directory or module: no.such.module\n"


def test_check_of_a_module_that_fails_to_import_says_why(tmp_path, monkeypatch, capsys):
    (tmp_path / "brokenchecks.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["check", "brokenchecks"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("symgrad: error: cannot import module 'brokenchecks': ")
    assert "no_such_dependency_xyz" in err


def test_check_of_a_file_that_is_not_python(tmp_path, monkeypatch, capsys):
    (tmp_path / "notes.txt").write_text("hello\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "notes.txt"]) == 2
    assert capsys.readouterr().err == \
        "symgrad: error: notes.txt is neither a directory nor a .py file\n"


# -- symgrad verify-rules: aligned columns --------------------------------------------------

def _column_starts(line: str) -> list[int]:
    """Where each cell starts: after a run of two or more spaces (cells are single words)."""
    return [0] + [m.end() for m in re.finditer(r" {2,}", line)]


def test_verify_rules_columns_start_where_the_header_says(monkeypatch, capsys):
    import symgrad.symbolic as symbolic
    from symgrad.ops import OPS

    # every registered op (the longest, binary_cross_entropy_with_logits, is 32 chars), and
    # each status, a failure carrying its detail
    statuses = ["proved", "checked numerically", "failed", "no example", "error"]
    rows = [RuleAudit(name, spec.grad_fn or "", statuses[k % len(statuses)],
                      "why" if statuses[k % len(statuses)] in ("failed", "error") else "")
            for k, (name, spec) in enumerate(sorted(OPS.items()))]
    assert max(len(r.op) for r in rows) > 18  # wider than the old fixed column
    monkeypatch.setattr(symbolic, "audit_rules", lambda: rows)
    assert main(["verify-rules"]) == 1
    lines = capsys.readouterr().out.splitlines()
    header, body, total = lines[0], lines[1:-1], lines[-1]
    assert header.split() == ["status", "op", "grad_fn"]
    starts = _column_starts(header)
    assert len(body) == len(rows)
    for r, line in zip(rows, body):
        status_at, op_at, fn_at = starts
        assert line[status_at:].startswith(r.status), line
        assert line[op_at - 2:op_at] == "  " and (line[op_at:] + " ").startswith(r.op + " "), line
        if r.grad_fn:  # (ops with no backward, argmax, end after their name)
            assert line[fn_at - 2:fn_at] == "  " and line[fn_at:].startswith(r.grad_fn), line
        if r.status in ("failed", "error"):
            assert line.endswith(f"{r.grad_fn}  why"), line
    bad = sum(r.status in ("failed", "error") for r in rows)
    assert total == f"{len(rows) - bad} passed, {bad} failed"


# -- worst-element lines say which check they come from -------------------------------------

def _wrong_tanh(monkeypatch):
    from symgrad.ops import OPS

    monkeypatch.setitem(OPS["tanh"].grads, "self", lambda grad, result: grad * (1 - result))
    x = sg.tensor(np.linspace(-1.0, 1.0, 12).reshape(3, 4), dtype=sg.float64,
                  requires_grad=True)
    return verify((x.tanh() * 2).sum(), names={"x": x})


def test_node_and_leaf_worst_elements_are_told_apart(monkeypatch):
    from symgrad.symbolic.report import NODE_WORST

    rep = _wrong_tanh(monkeypatch)
    leaf = rep.leaves[0]
    node = next(n for n in rep.nodes if n.name == "TanhBackward0")
    assert leaf.status == "mismatch" and node.detail.startswith("d/dself[")
    for text in (rep.summary(), str(rep)):
        flat = " ".join(text.split())
        # the node's clause names its check (a random cotangent, not the leaf gradient) ...
        assert f"{NODE_WORST}, worst element {node.detail}" in flat, text
        assert all(NODE_WORST in flat[max(0, m.start() - len(NODE_WORST) - 20):m.start()]
                   for m in re.finditer(r"d/dself\[", flat)), text
        # ... and the leaf table's column says it is the leaf gradient's worst element
        assert "grads: d(output)/d(leaf) at the worst element of the leaf's gradient" in \
            flat or "the element of the leaf's gradient d(output)/d(leaf) where engine and " \
            "symbolic differ most" in flat, text
    html = rep._repr_html_()
    assert f"{NODE_WORST}, worst element" in html


def test_function_failure_lines_say_which_worst_element(monkeypatch):
    from symgrad.autograd import Function
    from symgrad.symbolic.report import NODE_WORST
    from symgrad.testing import assert_function_correct

    class Cube(Function):
        @staticmethod
        def forward(ctx, u):
            ctx.save_for_backward(u)
            return u ** 3

        @staticmethod
        def backward(ctx, g):
            (u,) = ctx.saved_tensors
            return 2 * u * g  # wrong on purpose

    u = sg.tensor(np.linspace(0.5, 2.0, 6).reshape(2, 3), dtype=sg.float64)
    with pytest.raises(AssertionError) as info:
        assert_function_correct(Cube, u)
    first = str(info.value).split("\n\n")[0].splitlines()
    leaf_line = next(line for line in first if "gives a wrong gradient" in line)
    node_line = next(line for line in first if line.startswith("CubeBackward"))
    assert "worst element of the gradient at u[" in leaf_line
    assert f"{NODE_WORST}, worst element d/du[" in node_line
