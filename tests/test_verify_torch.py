"""symgrad.verify on PyTorch graphs: grad_fn chains, saved values, capture_torch."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

import symgrad as sg
from symgrad.symbolic import FreedGraphError, verify


def test_torch_mlp_verifies_exactly_and_locally(torch):
    torch.manual_seed(0)
    a = torch.tensor([0.3, -0.5, 1.2], requires_grad=True)
    W = torch.randn(2, 3, requires_grad=True)
    loss = ((W @ a).tanh() ** 2).sum() + (a * a).mean()
    rep = verify(loss, names={"a": a, "W": W})
    assert rep.ok and rep.mode == "exact" and rep.graph_kind == "torch", str(rep)
    assert [r.name for r in rep.leaves] == ["W", "a"]
    g = rep.symbolic_gradient(a)
    assert sympy.Symbol("W[1,2]", real=True) in g[2].free_symbols
    loc = verify(loss, mode="local")
    assert loc.ok
    assert [r.name for r in loc.nodes] == [n.name() for n in _order(loss.grad_fn)]
    assert a.grad is None  # verify used torch.autograd.grad, not backward


def _order(fn):
    out, seen = [], set()

    def visit(n):
        if n is None or id(n) in seen or type(n).__name__ == "AccumulateGrad":
            return
        seen.add(id(n))
        for m, _ in n.next_functions:
            visit(m)
        out.append(n)

    visit(fn)
    return out


def test_unsaved_operand_names_it_and_capture_torch_fixes_it(torch):
    a = torch.tensor([0.3, -0.5, 1.2], requires_grad=True)
    b = torch.tensor([1.0, 2.0, 3.0])
    y = (a + b).exp().sum()
    with pytest.raises(FreedGraphError, match=r"'other' of AddBackward0.*capture_torch"):
        verify(y)
    with sg.capture_torch():
        y = (a + b).exp().sum()
        z = (2 - a).sin().sum()
        w = torch.softmax(a.view(1, 3) * 2, dim=1)[0, 1]
    assert verify(y).ok
    rz = verify(z)
    assert rz.ok and rz.mode == "exact"
    assert verify(w).ok


def test_unknown_torch_node_is_named(torch):
    a = torch.tensor([0.3, -0.5, 1.2], requires_grad=True)
    y = torch.cummax(a, 0).values.sum()  # (cumsum became known in issue 21)
    with pytest.raises(NotImplementedError, match="CummaxBackward0"):
        verify(y)


def test_torch_order_two(torch):
    a = torch.tensor([0.3, -0.5], dtype=torch.float64, requires_grad=True)
    y = (a.sin() * a).sum()
    rep = verify(y, order=2)
    assert rep.ok and [h["status"] for h in rep.hvp] == ["ok"]


def test_torch_and_symgrad_reports_agree(torch):
    x = np.array([0.2, -0.7, 1.1])
    ta = torch.tensor(x, requires_grad=True)
    sa = sg.tensor(x, requires_grad=True)
    rt = verify((ta.sigmoid() * ta).sum())
    rs = verify((sa.sigmoid() * sa).sum())
    assert rt.ok and rs.ok
    assert rt.leaves[0].symbolic_value == pytest.approx(rs.leaves[0].symbolic_value, rel=1e-12)


def test_freed_torch_graph_says_how_to_keep_it(torch):
    a = torch.tensor([0.3, -0.5], requires_grad=True)
    y = (a * 3.0).exp().sum()
    y.backward()
    with pytest.raises(FreedGraphError, match="retain_graph=True"):
        verify(y)
    y = (a * 3.0).exp().sum()
    y.backward(retain_graph=True)
    assert verify(y).ok
