"""The pytest plugin, run by pytest's own ``pytester`` on small test files."""

from __future__ import annotations

import json
import pathlib

pytest_plugins = ["pytester"]

GOOD_AND_BAD = '''
import pytest
import symgrad as sg
from symgrad.ops import OPS


def _x():
    return sg.tensor([0.3, 0.7, 1.1], dtype=sg.float64, requires_grad=True)


def test_correct_op(symgrad_check):
    report = symgrad_check(lambda x: (x.sin() * x).sum(), _x())
    assert report.ok


@pytest.mark.symgrad(mode="exact")
def test_marker_sets_mode(symgrad_check):
    assert symgrad_check(lambda x: x.exp().sum(), _x()).mode == "exact"


def test_wrong_backward(symgrad_check, monkeypatch):
    monkeypatch.setitem(OPS["sin"].grads, "self", lambda grad, self: -grad * self.cos())
    symgrad_check(lambda x: x.sin().sum(), _x())
'''


def _report_schema():
    import symgrad.symbolic

    return json.loads((pathlib.Path(symgrad.symbolic.__file__).parent /
                       "report.schema.json").read_text())


def test_correct_passes_wrong_fails_with_table_and_report(pytester):
    pytester.makepyfile(test_grads=GOOD_AND_BAD)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--symgrad-report=out/checks.json")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "test_wrong_backward" in out
    assert "SinBackward0" in out  # the verifier's table names the bad node
    data = json.loads((pytester.path / "out" / "checks.json").read_text())
    assert data["schema"] == "symgrad.checks/1" and data["total"] == 3 and data["failed"] == 1
    html = (pytester.path / "out" / "checks.html").read_text()
    assert "FAILED" in html and "test_wrong_backward" in html
    import jsonschema

    schema = _report_schema()
    for check in data["checks"]:
        jsonschema.validate(check["report"], schema)


def test_mode_option_and_xdist_workers_are_gathered(pytester):
    files = {f"test_part{i}": GOOD_AND_BAD.replace("def test_", f"def test_p{i}_")
             for i in range(2)}
    pytester.makepyfile(**files)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                           "--symgrad-mode=local",
                                "--symgrad-report=checks.json")
    result.assert_outcomes(passed=4, failed=2)
    data = json.loads((pytester.path / "checks.json").read_text())
    assert data["total"] == 6 and data["failed"] == 2
    names = {c["name"].split("::")[0] for c in data["checks"]}
    assert names == {"test_part0.py", "test_part1.py"}
    modes = {c["report"]["mode"] for c in data["checks"]
             if "marker_sets_mode" not in c["name"]}
    assert modes == {"local"}


def test_plugin_is_registered_through_the_entry_point():
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="pytest11") if ep.name == "symgrad"]
    assert eps and eps[0].value == "symgrad.testing.plugin"
