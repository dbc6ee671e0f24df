"""float32 graphs whose ops carry a dtype parameter (cumsum, cumprod, sum(dtype=),
softmax(dtype=), to()) are re-run in float64 when they disagree: the replay really is in
float64, never recurses, and a wrong rule is reported (issue 32, scope 7)."""

from __future__ import annotations

import pytest

import symgrad as sg
import symgrad.ops.scan as scan

PROGRAMS = {
    "cumprod": lambda x: (x.cumprod(1) * sg.tensor([1.0, -2.0, 3.0])).sum(),
    "cumsum": lambda x: (x.cumsum(1) * sg.tensor([1.0, -2.0, 3.0])).sum(),
    "sum_dtype": lambda x: (x.cumsum(0).sum(1, dtype=sg.float32) ** 2).sum(),
    "softmax_dtype": lambda x: (x.cumprod(1).softmax(1, dtype=sg.float32)
                                * sg.tensor([1.0, -2.0, 3.0])).sum(),
    "to": lambda x: (x.cumsum(1).to(sg.float32).tanh() * 3.0).sum(),
}


def test_sum_with_a_dtype_runs_and_matches_torch(torch):
    for lib in (sg, torch):
        x = lib.tensor([[0.5, 1.5], [2.0, 3.0]], requires_grad=True)
        y = x.sum(1, dtype=lib.float64)
        z = x.sum(dtype=lib.float64)
        assert str(y.dtype).endswith("float64") and str(z.dtype).endswith("float64")
        (y.sum() + z).backward()
        assert str(x.grad.dtype).endswith("float32") and x.grad.tolist() == [[2.0] * 2] * 2


def _x():
    return sg.tensor([[0.5, 1.5, 2.0], [1.0, 2.0, 3.0]], requires_grad=True)


@pytest.mark.parametrize("mode", ["exact", "local"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_correct_float32_graph_is_ok(name, mode):
    x = _x()
    report = sg.verify(PROGRAMS[name](x), names={"x": x}, mode=mode)
    assert report.ok, report


@pytest.mark.parametrize("mode", ["exact", "local"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_planted_scan_error_is_reported_not_raised(monkeypatch, name, mode):
    real = scan.reverse_cumsum  # both scans' backward sum through it
    monkeypatch.setattr(scan, "reverse_cumsum", lambda g, d: real(g, d) * 1.01)
    x = _x()
    report = sg.verify(PROGRAMS[name](x), names={"x": x}, mode=mode)
    assert not report.ok and report.status == "mismatch"
    if mode == "local":
        assert report.first_bad_node.name() in ("CumsumBackward0", "CumprodBackward0")
    assert all(r.status != "imprecise" for r in report.leaves + report.nodes)


def test_the_replay_runs_in_float64(monkeypatch):
    import sys

    V = sys.modules["symgrad.symbolic.verify"]  # the package exports a function of that name

    seen = []
    real = V._replay_float64

    def spy(graph):
        out = real(graph)
        seen.extend(o.dtype for o in out[2].values() if hasattr(o, "dtype"))
        return out

    monkeypatch.setattr(V, "_replay_float64", spy)
    monkeypatch.setattr(scan, "reverse_cumsum",
                        lambda g, d, _r=scan.reverse_cumsum: _r(g, d) * 1.01)
    x = _x()
    sg.verify(PROGRAMS["cumsum"](x), names={"x": x}, mode="exact")
    assert seen and all(d == sg.float64 for d in seen if d.is_floating_point)
