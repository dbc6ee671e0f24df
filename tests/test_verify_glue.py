"""Mutation tests for the engine's glue between backward rules (issue 18).

Each mutant monkeypatches one glue step of symgrad/autograd/engine.py (the broadcast
reduction after a node, the sum of the gradients flowing into a tensor that feeds several
nodes, AccumulateGrad into ``.grad``); ``verify`` in local and exact mode, float32 and
float64, must flag it and name the step and where it happened. Correct graphs with
broadcasting and fan-out stay ok.
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad as sg
from symgrad.autograd import engine

DTYPES = {"float32": sg.float32, "float64": sg.float64}


def _t(shape, seed, dtype, name):
    rng = np.random.default_rng(seed)
    x = sg.tensor(rng.standard_normal(shape).astype(dtype.np), requires_grad=True)
    x.name = name
    return x


def _broadcast(dtype):
    """A bias broadcast over rows and a (3, 1) column broadcast over columns."""
    x, b, c = _t((3, 4), 0, dtype, "x"), _t((4,), 1, dtype, "b"), _t((3, 1), 2, dtype, "c")
    return ((x * 1.5 + b).tanh() * c).sum()


def _fan_out(dtype):
    """``x`` feeds three nodes, ``h`` two (one of them twice)."""
    x = _t((2, 3), 3, dtype, "x")
    h = x.sin()
    return (h * h + x.exp() * 0.5 + x).sum()


def _both(dtype):
    x, w = _t((3, 4), 4, dtype, "x"), _t((4,), 5, dtype, "w")
    h = (x * w).tanh()
    return (h * x + h).sum()


def _find(root, name):
    found, stack, seen = [], [root.grad_fn], set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        if n.name() == name:
            found.append(n)
        stack.extend(m for m, _ in n.next_functions)
    assert len(found) == 1, (name, found)
    return found[0]


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("mode", ["local", "exact"])
@pytest.mark.parametrize("build", [_broadcast, _fan_out, _both])
def test_correct_glue_is_ok(build, mode, dt):
    rep = sg.verify(build(DTYPES[dt]), mode=mode)
    assert rep.ok and rep.status == "ok", str(rep)
    assert any("engine glue" in r for r in rep.ran)


# -- mutants ------------------------------------------------------------------------------
_orig_sum_to = engine._sum_to
_orig_sum_grads = engine._sum_grads
_orig_accumulate = engine._accumulate_into


def _mean_reduction(g, shape):
    """A mean instead of a sum over the broadcast dims."""
    out = _orig_sum_to(g, shape)
    return out * (float(np.prod(shape)) / float(np.prod(g.shape)))


def _leading_only(g, shape):
    """Sums the leading broadcast dims only (a (3, 1) input gets a (3, 4) gradient)."""
    lead = g.dim() - len(shape)
    return g.sum(tuple(range(lead))) if lead > 0 else g


def _off_by_tenth_percent(g, shape):
    return _orig_sum_to(g, shape) * 1.001


def _first_only(a, b):
    """The second gradient flowing into a tensor is dropped."""
    return a


def _sum_grads_tenth_percent(a, b):
    return _orig_sum_grads(a, b) * 1.001


def _overwrite(variable, g, create_graph, shared):
    """``.grad = g`` on every backward instead of ``.grad += g``."""
    if g is None:
        return
    variable._grad = g.detach().clone()


def _accumulate_scaled(variable, g, create_graph, shared):
    if g is not None:
        _orig_accumulate(variable, g * 1.001, create_graph, shared)


REDUCTION = {"mean": _mean_reduction, "leading dims only": _leading_only,
             "0.1%": _off_by_tenth_percent}


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("mode", ["local", "exact"])
@pytest.mark.parametrize("mutant", sorted(REDUCTION))
def test_broadcast_reduction_mutant_is_named(mutant, mode, dt, monkeypatch):
    monkeypatch.setattr(engine, "_sum_to", REDUCTION[mutant])
    root = _broadcast(DTYPES[dt])
    rep = sg.verify(root, mode=mode)
    assert not rep.ok and rep.status == "mismatch", str(rep)
    bad = [r for r in rep.nodes if r.status == "mismatch"]
    assert bad, str(rep)
    # the first in topological order: the mul's broadcast of `c`, or the add's `other`
    names = {"AddBackward0": "'other'", "MulBackward0": "'other'"}
    assert rep.first_bad_node is bad[0].node
    assert bad[0].name in names, str(rep)
    assert f"broadcast reduction into {bad[0].name}'s {names[bad[0].name]}" in bad[0].detail
    assert "local" in rep.ran
    # the rules themselves are right: only the glue step is blamed
    assert all(r.detail.startswith("broadcast reduction") for r in bad), str(rep)


def test_broadcast_reduction_names_add_other(monkeypatch):
    """The issue's example: the bias of ``x * 1.5 + b`` gets a mean, not a sum."""
    monkeypatch.setattr(engine, "_sum_to", _mean_reduction)
    x, b = _t((3, 4), 0, sg.float64, "x"), _t((4,), 1, sg.float64, "b")
    root = (x * 1.5 + b).tanh().sum()
    target = _find(root, "AddBackward0")
    for mode in ("local", "exact"):
        rep = sg.verify(root, mode=mode)
        assert rep.first_bad_node is target, str(rep)
        row = next(r for r in rep.nodes if r.node is target)
        assert "broadcast reduction into AddBackward0's 'other'" in row.detail
        assert "broadcast reduction into AddBackward0's 'other'" in str(rep)


ACCUMULATION = {"dropped": _first_only, "0.1%": _sum_grads_tenth_percent}


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("mode", ["local", "exact"])
@pytest.mark.parametrize("mutant", sorted(ACCUMULATION))
def test_accumulation_mutant_is_named(mutant, mode, dt, monkeypatch):
    monkeypatch.setattr(engine, "_sum_grads", ACCUMULATION[mutant])
    root = _fan_out(DTYPES[dt])
    rep = sg.verify(root, mode=mode)
    assert not rep.ok and rep.status == "mismatch", str(rep)
    text = str(rep)
    assert "accumulation of the 3 gradients flowing into 'x'" in text, text
    assert "accumulation of the 2 gradients flowing into the output of SinBackward0" in text
    x_row = next(r for r in rep.leaves if r.name == "x")
    assert x_row.status == "mismatch" and "accumulation" in x_row.detail
    sin = _find(root, "SinBackward0")
    sin_row = next(r for r in rep.nodes if r.node is sin)
    assert sin_row.status == "mismatch" and "accumulation" in sin_row.detail
    assert rep.first_bad_node is not None
    # no rule is blamed: every mismatched node row names the accumulation
    assert all("accumulation" in r.detail for r in rep.nodes if r.status == "mismatch")


ACCUMULATE_GRAD = {"overwrite": _overwrite, "0.1%": _accumulate_scaled}


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("mode", ["local", "exact"])
@pytest.mark.parametrize("mutant", sorted(ACCUMULATE_GRAD))
def test_accumulate_grad_mutant_is_named(mutant, mode, dt, monkeypatch):
    monkeypatch.setattr(engine, "_accumulate_into", ACCUMULATE_GRAD[mutant])
    x, w = _t((3, 4), 4, DTYPES[dt], "x"), _t((4,), 5, DTYPES[dt], "w")
    w.grad = sg.ones(4, dtype=DTYPES[dt])  # the user's .grad is left alone
    root = (x * w).tanh().sum()
    rep = sg.verify(root, mode=mode)
    assert not rep.ok and rep.status == "mismatch", str(rep)
    text = str(rep)
    assert "AccumulateGrad into x.grad" in text and "AccumulateGrad into w.grad" in text
    row = next(r for r in rep.leaves if r.name == "w")
    assert row.status == "mismatch" and row.detail.startswith("AccumulateGrad into w.grad")
    assert type(rep.first_bad_node).__name__ == "AccumulateGrad"
    assert rep.first_bad_node.variable is x
    assert np.array_equal(w.grad.numpy(), np.ones(4))
    assert x.grad is None


def test_real_backward_still_accumulates():
    """The stand-in check leaves the engine's behaviour as it is."""
    x = _t((2,), 6, sg.float64, "x")
    for _ in range(2):
        (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 4 * x.detach().numpy())


def _inline_overwrite_run_plain():
    """engine._run_plain with its inline buffer accumulation planted wrong: a second
    gradient flowing into a node replaces the first (``_sum_grads`` is never called)."""
    import inspect

    src = inspect.getsource(engine._run_plain)
    line = "buf[nr] = g if buf[nr] is None else _sum_grads(buf[nr], g)"
    assert line in src, "the inline accumulation of engine._run_plain moved: update this"
    ns = dict(vars(engine))
    exec(compile(src.replace(line, "buf[nr] = g"), engine.__file__, "exec"), ns)
    return ns["_run_plain"]


@pytest.mark.parametrize("dt", sorted(DTYPES))
@pytest.mark.parametrize("mode", ["local", "exact"])
def test_inline_accumulation_of_the_backward_loop_is_checked(mode, dt, monkeypatch):
    """Tensor.backward's loop fills buffers inline (not through _add_to_buffer), and
    verify's own engine gradients come from autograd.grad: only the loop probe sees it."""
    monkeypatch.setattr(engine, "_run_plain", _inline_overwrite_run_plain())
    x = _t((2, 3), 3, DTYPES[dt], "x")
    h = x.sin()
    w = (h * h + x.exp() * 0.5 + x).sum()
    w.backward(retain_graph=True)  # the planted bug is real: x.grad is wrong
    rep = sg.verify(w, mode=mode)
    assert not rep.ok and rep.status == "mismatch", str(rep)
    text = " ".join(rep.notes)
    assert "accumulation in the backward loop of the 3 gradients flowing into 'x'" in text
    assert ("accumulation in the backward loop of the 2 gradients flowing into the output "
            "of SinBackward0") in text
    assert "backward loop" in next(r for r in rep.leaves if r.name == "x").detail
    sin = _find(w, "SinBackward0")
    assert next(r for r in rep.nodes if r.node is sin).status == "mismatch"
