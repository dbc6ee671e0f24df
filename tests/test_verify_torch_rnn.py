"""Recurrent torch graphs in the verifier.

GRUCell: torch's composite ``gru_cell`` computes ``(hx - newgate) * updategate + newgate``
in C++, so with a hidden state that needs no gradient (or none given: zeros) its
SubBackward0 keeps no ``self`` and ``capture_torch()`` never sees that subtraction. The
verifier recovers the constant from the subtraction's output, which the multiplication
saved; a wrong backward elsewhere is still caught.

nn.GRU / nn.LSTM stack their steps' outputs: CatBackward0 and StackBackward0 have one edge
per tensor, so they take the registry's spec for that many tensors, ``dim`` as torch saved
it (-1 as 2**64 - 1) and cat's sizes from the replayed inputs."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the test oracle")

import symgrad as sg  # noqa: E402
from symgrad.symbolic.torch_graph import walk_torch  # noqa: E402


def _x(*shape, seed, rg=True):
    return torch.tensor(np.random.default_rng(seed).uniform(-1.5, 1.5, size=shape),
                        dtype=torch.float64, requires_grad=rg)


def _gru_loss(hidden: str, capture: bool):
    torch.manual_seed(0)
    cell = torch.nn.GRUCell(3, 4).double()
    x = _x(2, 3, seed=1)
    hx = {"leaf": _x(2, 4, seed=2), "constant": _x(2, 4, seed=2, rg=False),
          "none": None}[hidden]
    if capture:
        with sg.capture_torch():
            h = cell(x, hx)
    else:
        h = cell(x, hx)
    names = dict(cell.named_parameters(), x=x)
    return h.sum(), names, hx


@pytest.mark.parametrize("capture", [False, True])
@pytest.mark.parametrize("hidden", ["leaf", "constant", "none"])
def test_gru_cell_verifies(hidden, capture):
    loss, names, hx = _gru_loss(hidden, capture)
    rep = sg.verify(loss, names=names)
    assert rep.ok and rep.mode == "exact", str(rep)
    local = sg.verify(loss, names=names, mode="local")
    assert local.ok and local.nodes and all(n.status == "ok" for n in local.nodes), str(local)


@pytest.mark.parametrize("hidden", ["constant", "none"])
def test_the_recovered_hidden_state_is_the_one_given(hidden):
    loss, _, hx = _gru_loss(hidden, False)
    graph = walk_torch(loss)
    sub = next(g for g in graph.nodes if g.name == "SubBackward0")
    assert sub.inputs[0][0] == "leaf" and sub.inputs[1][0] == "node"
    got = graph.value_of(sub.inputs[0])
    want = np.zeros((2, 4)) if hx is None else hx.detach().numpy()
    if hx is None:  # 0 = (0 - n) + n exactly
        np.testing.assert_array_equal(got, want)
    else:  # one rounding of out = hx - n and one of out + n, at the operands' size
        n = graph.value_of(sub.inputs[1])
        bound = 2 * np.finfo(np.float64).eps * (np.abs(want) + np.abs(n))
        assert np.all(np.abs(got - want) <= bound)


class _Sigmoid(torch.autograd.Function):
    factor = 1.0  # 1 + 1e-3 plants a wrong backward

    @staticmethod
    def forward(ctx, a):
        y = torch.sigmoid(a)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y * (1 - y) * _Sigmoid.factor


def _gru_like(monkeypatch, factor: float):
    """One GRU step written out, its update gate through ``_Sigmoid``, the hidden state a
    constant (so the last subtraction keeps no operand, as in torch's gru_cell)."""
    monkeypatch.setattr(_Sigmoid, "factor", factor)
    x, hx = _x(2, 3, seed=3), _x(2, 4, seed=4, rg=False)
    w_ih, w_hh = _x(12, 3, seed=5), _x(12, 4, seed=6)
    gi, gh = x @ w_ih.t(), hx @ w_hh.t()
    i_r, i_z, i_n = gi.chunk(3, 1)
    h_r, h_z, h_n = gh.chunk(3, 1)
    r = torch.sigmoid(i_r + h_r)
    z = _Sigmoid.apply(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    h = (hx - n) * z + n
    return (h * _x(2, 4, seed=7, rg=False)).sum(), dict(x=x, w_ih=w_ih, w_hh=w_hh)


def test_gru_like_graph_with_a_correct_function_verifies(monkeypatch):
    loss, names = _gru_like(monkeypatch, 1.0)
    assert sg.verify(loss, names=names).ok
    assert sg.verify(loss, names=names, mode="local").ok


@pytest.mark.parametrize("mode", ["auto", "local"])
def test_a_wrong_backward_inside_a_gru_like_graph_is_caught(monkeypatch, mode):
    loss, names = _gru_like(monkeypatch, 1.0 + 1e-3)
    rep = sg.verify(loss, names=names, mode=mode)
    assert not rep.ok, str(rep)
    bad = [n.name for n in rep.nodes if n.status != "ok"]
    assert bad == ["_SigmoidBackward"], str(rep)


@pytest.mark.parametrize("op, const_first, alpha", [
    (torch.sub, True, 2.0), (torch.sub, False, 3.0), (torch.add, True, 0.5),
    (torch.add, False, -2.0)])
def test_a_constant_operand_of_add_or_sub_is_recovered_with_alpha(op, const_first, alpha):
    """The gradient of w is the add/sub's output, rebuilt from the recovered constant: a wrong
    sign or alpha in the recovery would make it differ from torch's."""
    a, w = _x(3, seed=8), _x(3, seed=9)
    c = _x(3, seed=10, rg=False)
    out = op(c, a.sin(), alpha=alpha) if const_first else op(a.sin(), c, alpha=alpha)
    graph = walk_torch((out * w).sum())
    node = next(g for g in graph.nodes if g.name in ("AddBackward0", "SubBackward0"))
    got = graph.value_of(node.inputs[0 if const_first else 1])
    # two roundings (the forward's, the recovery's) at the operands' size: |c|, |sin a| <= 1.5
    bound = 2 * np.finfo(np.float64).eps * 1.5 * (1 + abs(alpha))
    np.testing.assert_allclose(got, c.detach().numpy(), rtol=0, atol=bound)
    assert sg.verify((out * w).sum(), names=dict(a=a, w=w)).ok


def test_gru_cell_fanned_out_gives_the_serial_report():
    """The recovered constant is a plain leaf: worker processes check the nodes that read
    it as this process does."""
    from symgrad.symbolic import fanout

    loss, names, _ = _gru_loss("none", False)
    serial = sg.verify(loss, names=names, mode="local")
    fanned = sg.verify(loss, names=names, mode="local", workers=2)
    assert fanout.LAST_RUN["sent"] > 0
    rows = [[(n.name, n.status, n.max_abs_err, n.bound) for n in r.nodes]
            for r in (serial, fanned)]
    assert serial.ok and rows[0] == rows[1]


def test_gru_and_lstm_modules_verify():
    x = _x(4, 2, 3, seed=11)
    for cls in (torch.nn.GRU, torch.nn.LSTM):
        torch.manual_seed(0)
        net = cls(3, 4, num_layers=2).double()
        loss = (net(x)[0] * _x(4, 2, 4, seed=12, rg=False)).sum()
        names = dict(net.named_parameters(), x=x)
        assert sg.verify(loss, names=names).ok
        assert sg.verify(loss, names=names, mode="local").ok


@pytest.mark.parametrize("case", ["cat2", "cat3_neg", "cat_empty", "cat_const", "stack2",
                                  "stack3_neg", "stack_const"])
def test_cat_and_stack_verify(case):
    a, m = _x(3, seed=13), _x(2, 3, seed=14)
    c = _x(3, seed=15, rg=False)
    build = {
        "cat2": lambda: torch.cat([a.sin(), a.cos()]),
        "cat3_neg": lambda: torch.cat([m.sin(), m.cos(), m], -1),
        "cat_empty": lambda: torch.cat([a.sin(), torch.empty(0, dtype=torch.float64),
                                        a.cos()]),
        "cat_const": lambda: torch.cat([a.sin(), c], 0),
        "stack2": lambda: torch.stack([a.sin(), a.cos()]),
        "stack3_neg": lambda: torch.stack([m.sin(), m.cos(), m], -1),
        "stack_const": lambda: torch.stack([a.sin(), c], 1),
    }[case]
    with sg.capture_torch():  # a tensor that needs no grad is kept by the capture only
        out = build()
        loss = (out * _x(*out.shape, seed=16, rg=False)).sum()
    node = loss.grad_fn.next_functions[0][0].next_functions[0][0]
    assert node.name() in ("CatBackward0", "StackBackward0")
    rep = sg.verify(loss, names=dict(a=a, m=m))
    assert rep.ok and rep.mode == "exact", str(rep)
    assert sg.verify(loss, names=dict(a=a, m=m), mode="local").ok


def test_a_wrong_backward_stacked_with_others_is_caught(monkeypatch):
    monkeypatch.setattr(_Sigmoid, "factor", 1.0 + 1e-3)
    a, b = _x(3, seed=17), _x(3, seed=18)
    loss = (torch.stack([a.sin(), _Sigmoid.apply(b), a * b], -1) ** 2).sum()
    for mode in ("auto", "local"):
        rep = sg.verify(loss, names=dict(a=a, b=b), mode=mode)
        assert not rep.ok and [n.name for n in rep.nodes if n.status != "ok"] == \
            ["_SigmoidBackward"], str(rep)
