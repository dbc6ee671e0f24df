"""The pytest plugin, run by pytest's own ``pytester`` on small test files."""

from __future__ import annotations

import json
import pathlib
import re

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


# -- leaves named as the user knows them ----------------------------------------------------
MODEL_TEST = '''
import symgrad as sg
from symgrad import nn
from symgrad.ops import OPS

sg.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 2), nn.Tanh()).double()


def test_model_with_wrong_tanh(symgrad_check, monkeypatch):
    monkeypatch.setitem(OPS["tanh"].grads, "self", lambda grad, result: grad * (1 - result))
    inputs = sg.randn(4, 3, dtype=sg.float64, requires_grad=True)
    symgrad_check(lambda features: model(features).sum(), inputs)
'''


def test_failure_names_module_parameters_and_arguments(pytester):
    pytester.makepyfile(test_model=MODEL_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--symgrad-report=checks.json")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "first bad node: TanhBackward0 in 1 (#" in out  # made by model[1], the Tanh
    for name, shape in (("0.weight", "2x3"), ("0.bias", "2"), ("features", "4x3")):
        assert re.search(rf"^E?\s+{re.escape(name)}\s+{shape} float64\s+mismatch", out,
                         re.MULTILINE), name
    assert not re.search(r"\b(x0|t0)\b", out)
    data = json.loads((pytester.path / "checks.json").read_text())
    report = data["checks"][0]["report"]
    assert [lf["name"] for lf in report["leaves"]] == ["0.weight", "0.bias", "features"]
    assert report["first_bad_node_label"].startswith("TanhBackward0 in 1 (#")


def test_leaf_names_prefer_parameter_paths_then_arguments_then_variables():
    import symgrad as sg
    from symgrad import nn
    from symgrad.autograd import Function
    from symgrad.testing import assert_gradients_match, check_function
    from symgrad.testing.checks import leaf_names

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(2, 2).double()

        def forward(self, inp):
            return self.fc1(inp).sum()

    net = Net()
    x = sg.tensor([[0.5, -1.0]], dtype=sg.float64, requires_grad=True)
    scale = sg.tensor(2.0, dtype=sg.float64, requires_grad=True)

    def by_name(names):
        return {k: id(v) for k, v in names.items()}

    # a module that the function reads from its closure, an argument, a closure tensor
    names = by_name(leaf_names(lambda features: net(features) * scale, (x,)))
    assert names == {"fc1.weight": id(net.fc1.weight), "fc1.bias": id(net.fc1.bias),
                     "features": id(x), "scale": id(scale)}
    # the module itself as the checked function: forward's parameter names
    assert by_name(leaf_names(net, (x,))) == {"fc1.weight": id(net.fc1.weight),
                                              "fc1.bias": id(net.fc1.bias), "inp": id(x)}
    # two modules: paths are told apart by the modules' variable names
    other = Net()
    two = leaf_names(lambda a: net(a) + other(a), (x,))
    assert {"net.fc1.weight", "other.fc1.weight", "a"} <= set(two)
    # *args, and t0 (as in every view) only when nothing names an input
    assert set(leaf_names(lambda *args: args[0].sum(), (x,))) == {"args[0]"}
    assert set(leaf_names(max, (x,))) == {"t0"}  # no signature to read

    rep = assert_gradients_match(lambda features: net(features) * scale, x)
    assert [lf.name for lf in rep.leaves] == ["fc1.weight", "fc1.bias", "features", "scale"]

    class Mul(Function):
        @staticmethod
        def forward(ctx, left, right):
            ctx.save_for_backward(left, right)
            return left * right

        @staticmethod
        def backward(ctx, grad):
            left, right = ctx.saved_tensors
            return grad * right, grad * left

    a = sg.tensor([1.0, 2.0], dtype=sg.float64, requires_grad=True)
    b = sg.tensor([3.0, 4.0], dtype=sg.float64, requires_grad=True)
    rep = check_function(Mul, a, b)
    assert sorted(lf.name for lf in rep.leaves) == ["left", "right"]
    # the caller's own names come first; tensor.name beats everything
    rep = assert_gradients_match(lambda u: (u * u).sum(), a, names={"alpha": a})
    assert [lf.name for lf in rep.leaves] == ["alpha"]
    a.name = "a_named"
    rep = assert_gradients_match(lambda u: (u * u).sum(), a)
    assert [lf.name for lf in rep.leaves] == ["a_named"]


# -- per-node checks fanned out over processes ------------------------------------------------
WORKERS_TEST = '''
import pytest
import symgrad as sg
from symgrad.ops import OPS
from symgrad.symbolic import fanout


def _f(x):
    return ((x * 2).tanh() * x.sin()).sum()


def _x():
    return sg.tensor([0.3, -0.7, 1.1], dtype=sg.float64, requires_grad=True)


def _rows(rep):
    return [(n.name, n.status, n.max_abs_err, n.bound, n.detail) for n in rep.nodes]


def test_option_fans_out_with_the_serial_report(symgrad_check):
    fanout.LAST_RUN.clear()
    fanned = symgrad_check(_f, _x())
    assert fanout.LAST_RUN == {"sent": len(fanned.nodes), "fallback": 0, "here": 0}
    fanout.LAST_RUN.clear()
    serial = symgrad_check(_f, _x(), workers=1)  # a call's own option wins
    assert fanout.LAST_RUN == {}
    assert fanned.mode == serial.mode == "local" and _rows(fanned) == _rows(serial)


@pytest.mark.symgrad(workers=1)
def test_marker_overrides_the_option(symgrad_check):
    fanout.LAST_RUN.clear()
    assert symgrad_check(_f, _x()).ok
    assert fanout.LAST_RUN == {}


def test_wrong_rule_is_named_by_the_workers(symgrad_check, monkeypatch):
    monkeypatch.setitem(OPS["sin"].grads, "self", lambda grad, self: -grad * self.cos())
    fanout.LAST_RUN.clear()
    try:
        symgrad_check(_f, _x())
    finally:
        assert fanout.LAST_RUN["sent"] > 0
'''


def test_workers_option_and_marker_are_passed_to_the_verifier(pytester):
    pytester.makepyfile(test_workers=WORKERS_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--symgrad-mode=local",
                                           "--symgrad-workers=2")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "test_wrong_rule_is_named_by_the_workers" in out and "SinBackward0" in out


def test_workers_option_must_be_a_positive_integer(pytester):
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--symgrad-workers=0")
    assert result.ret == 4  # pytest's usage error
    assert "argument --symgrad-workers: expected a whole number of worker processes " \
           "(>= 1), got '0'" in result.stderr.str()
