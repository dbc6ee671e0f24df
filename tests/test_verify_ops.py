"""Every registered op verifies: exact and local mode agree with the engine; kinks as torch."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

import symgrad as sg
from symgrad.ops import OPS
from symgrad.symbolic import verify
from symgrad.symbolic.audit import EXAMPLES, _leaf

NAMES = sorted(n for n in EXAMPLES if n in OPS)


def _loss(name):
    x, y = _leaf((2, 3), 1), _leaf((2, 3), 2)
    out = EXAMPLES[name](x, y)
    w = sg.tensor(np.linspace(-1, 1, out.numel()).reshape(tuple(out.shape)), dtype=out.dtype)
    return (out * w).sum()


@pytest.mark.parametrize("mode", ["exact", "local"])
@pytest.mark.parametrize("name", NAMES)
def test_op_verifies(name, mode):
    rep = verify(_loss(name), mode=mode)
    assert rep.ok, str(rep)
    assert rep.mode == mode
    assert all(r.status in ("ok", "not run") for r in rep.nodes), str(rep)


def test_ties_and_kinks_follow_pytorch(torch):
    data = [[1.0, 3.0, 3.0], [0.0, -2.0, 0.0]]
    for build in (
        lambda m: m.max(),  # a 2-way tie: split evenly
        lambda m: m.relu().sum() + m.abs().sum(),  # relu'(0) = abs'(0) = 0
        lambda m: m.clamp(0.0, 3.0).sum(),  # at the bounds the gradient passes
        lambda m: m.max(1)[0].sum(),  # max over a dim: the gradient goes to the argmax
        lambda m: (m.maximum(m * 0 + 3.0) if hasattr(m, "maximum") else m).sum(),  # split
    ):
        s = sg.tensor(data, requires_grad=True)
        t = torch.tensor(data, requires_grad=True)
        rep = verify(build(s), mode="exact")
        assert rep.ok, str(rep)
        build(t).backward()
        row = rep.leaves[0]
        assert row.max_abs_err < 1e-6
        sym = rep.symbolic_gradient(s)
        at = {sympy.Symbol(f"{rep.leaves[0].name}[{i},{j}]", real=True): data[i][j]
              for i in range(2) for j in range(3)}
        got = np.array([[float(sym[i, j].subs(at)) for j in range(3)] for i in range(2)])
        np.testing.assert_allclose(got, t.grad.numpy(), atol=1e-12)
        assert verify(build(s), mode="local").ok


def test_infinite_and_nan_gradients_agree_when_both_sides_have_them():
    a = sg.tensor([0.0, 1.0], requires_grad=True)  # log'(0) = inf
    b = sg.tensor([-1.0, 4.0], requires_grad=True)  # sqrt(-1) = nan
    for y in ((a.log() * 2).sum(), b.sqrt().sum()):
        for mode in ("exact", "local"):
            rep = verify(y, mode=mode)
            # no mismatch anywhere, but a non-finite gradient is reported, never ok
            assert rep.status == "non-finite", str(rep)
            assert not rep.ok and rep.first_bad_node is None
            assert all(r.status in ("ok", "not checked", "non-finite") for r in rep.leaves)
            assert all(r.status in ("ok", "not run") for r in rep.nodes), str(rep)
