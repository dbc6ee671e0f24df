"""A backward that raises is a finding, not a crash: ``sg.verify`` returns a report with
status "backward raised" naming the node and the exception (symgrad and torch Functions),
and the CLI and the testing helpers report it (issue 32, scope 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import symgrad as sg
from symgrad.cli import main


class ShapeBug(sg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g @ sg.ones(3, 5, dtype=g.dtype)  # a shape error inside backward


class Raises(sg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.exp()

    @staticmethod
    def backward(ctx, g):
        raise ValueError("not implemented for this layout")


@pytest.mark.parametrize("fn,exc,words", [(ShapeBug, "RuntimeError", "invalid gradient"),
                                          (Raises, "ValueError", "not implemented for this")])
@pytest.mark.parametrize("mode", ["exact", "local", "auto"])
def test_a_raising_backward_gives_a_report(fn, exc, words, mode):
    x = sg.tensor([1.0, 2.0, 3.0], dtype=sg.float64, requires_grad=True)
    y = (fn.apply(x) * 3).sum()
    rep = sg.verify(y, names={"x": x}, mode=mode)
    assert not rep.ok and rep.status == "backward raised"
    assert rep.first_bad_node is y.grad_fn.next_functions[0][0].next_functions[0][0]
    line = rep.notes[0]
    assert line.startswith(f"backward raised: {fn.__name__}Backward raised {exc}: ")
    assert words in line
    row = next(r for r in rep.nodes if r.status == "error")
    assert row.name == f"{fn.__name__}Backward" and exc in row.detail
    assert "BACKWARD RAISED" in str(rep)


def test_the_report_json_validates_and_names_the_status():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(sg.__file__).parent / "symbolic" / "report.schema.json")
                        .read_text())
    x = sg.tensor([1.0, 2.0, 3.0], dtype=sg.float64, requires_grad=True)
    doc = sg.verify(Raises.apply(x).sum(), names={"x": x}).to_json()
    jsonschema.validate(doc, schema)
    assert doc["status"] == "backward raised" and doc["ok"] is False


def test_a_torch_function_whose_backward_raises(torch):
    class TBad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g.reshape(5)

    with sg.capture_torch():
        x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
        y = TBad.apply(x).sum()
    rep = sg.verify(y, names={"x": x})
    assert rep.status == "backward raised" and not rep.ok
    assert rep.notes[0].startswith("backward raised: TBadBackward raised RuntimeError: shape")


def test_the_cli_reports_it_and_fails(tmp_path, monkeypatch, capsys):
    (tmp_path / "checks_raise.py").write_text(
        "import symgrad as sg\n"
        "from symgrad.testing import gradient_check\n\n"
        "class Raises(sg.autograd.Function):\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        return x.exp()\n\n"
        "    @staticmethod\n"
        "    def backward(ctx, g):\n"
        "        raise ValueError('not implemented for this layout')\n\n"
        "@gradient_check(inputs=[(3,)])\n"
        "def check_raises(x):\n"
        "    return Raises.apply(x).sum()\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "checks_raise.py"]) == 1
    out = capsys.readouterr().out
    assert "backward raised" in out and "ValueError" in out


def test_the_testing_helper_fails_with_the_report_not_the_exception():
    from symgrad.testing import check_function

    x = sg.tensor([1.0, 2.0, 3.0], dtype=sg.float64, requires_grad=True)
    with pytest.raises(AssertionError, match="backward raised"):
        check_function(Raises, x)
