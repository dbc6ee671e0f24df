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
    a = torch.tensor([0.3, 0.5, 1.2], requires_grad=True)
    y = torch.lgamma(a).sum()  # an op symgrad's registry does not have
    with pytest.raises(NotImplementedError, match="LgammaBackward0"):
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


# -- attention graphs torch records (issue 21) ---------------------------------------------

def _torch_mha_loss(torch, need_weights: bool, same: str, L=3, N=2, E=4, H=2):
    """``(out * out).sum()`` of a torch MultiheadAttention (float64, random biases)."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(E, H).double()
    with torch.no_grad():
        mha.in_proj_bias.uniform_(-0.5, 0.5)
        mha.out_proj.bias.uniform_(-0.5, 0.5)
    x = torch.randn(L, N, E, dtype=torch.float64, requires_grad=True)
    y = torch.randn(L + 1, N, E, dtype=torch.float64, requires_grad=True)
    args = {"qkv": (x, x, x), "kv": (x, y, y), "all": (x, y, y * 0.5)}[same]
    out, _ = mha(*args, need_weights=need_weights)
    return (out * out).sum()


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("same", ["qkv", "kv", "all"])
def test_torch_multihead_attention_verifies_locally(torch, need_weights, same):
    """The packed in-projection (select / split_with_sizes / split nodes), bmm and softmax
    (need_weights) or torch's fused CPU attention node (need_weights=False)."""
    loss = _torch_mha_loss(torch, need_weights, same)
    rep = verify(loss, mode="local")
    assert rep.ok and rep.mode == "local", str(rep)
    names = {n.name for n in rep.nodes}
    assert ("ScaledDotProductFlashAttentionForCpuBackward0" in names) == (not need_weights)
    assert {"qkv": "SelectBackward0", "kv": "SplitWithSizesBackward0",
            "all": "SplitBackward0"}[same] in names


@pytest.mark.parametrize("need_weights", [True, False])
def test_torch_multihead_attention_verifies_exactly_on_a_tiny_case(torch, need_weights):
    rep = verify(_torch_mha_loss(torch, need_weights, "qkv", L=2, N=1, E=2, H=1),
                 mode="exact")
    assert rep.ok and rep.mode == "exact", str(rep)


def _torch_sdpa_loss(torch, shape, **kw):
    torch.manual_seed(1)
    q, k, v = (torch.randn(*shape, dtype=torch.float64, requires_grad=True) for _ in range(3))
    if kw.pop("mask", False):
        kw["attn_mask"] = torch.randn(shape[-2], shape[-2], dtype=torch.float64)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    return (out * out).sum(), out.grad_fn.name()


@pytest.mark.parametrize("kw", [{}, {"mask": True}, {"is_causal": True}, {"scale": 0.3}],
                         ids=["plain", "mask", "causal", "scale"])
def test_torch_sdpa_fused_cpu_node_verifies(torch, kw):
    """4-D q, k, v of one head size: torch records its fused CPU node; its meaning is
    symgrad's math-path attention with the node's saved mask, causality and scale."""
    tiny, node = _torch_sdpa_loss(torch, (1, 1, 2, 2), **dict(kw))
    assert node == "ScaledDotProductFlashAttentionForCpuBackward0"
    rep = verify(tiny, mode="exact")
    assert rep.ok and rep.mode == "exact", str(rep)
    bigger, _ = _torch_sdpa_loss(torch, (2, 3, 5, 4), **dict(kw))
    rep = verify(bigger, mode="local")
    assert rep.ok and rep.mode == "local", str(rep)


def test_torch_sdpa_math_path_verifies(torch):
    """2-D inputs take torch's math path: mul, matmul, _safe_softmax (SafeSoftmaxBackward0)."""
    loss, _ = _torch_sdpa_loss(torch, (2, 2))
    rep = verify(loss, mode="exact")
    assert rep.ok and "SafeSoftmaxBackward0" in {n.name for n in rep.nodes}, str(rep)
    loss, _ = _torch_sdpa_loss(torch, (5, 3))
    assert verify(loss, mode="local").ok


def test_a_wrong_meaning_of_the_fused_attention_node_is_caught(torch, monkeypatch):
    """The fused node is really checked: a meaning with another scale is a mismatch."""
    from symgrad.symbolic import torch_graph

    right = torch_graph._FlashAttentionForCpu.forward

    def wrong(ctx, q, k, v, mask, p, causal, scale):
        return right(ctx, q, k, v, mask, p, causal, 0.9)

    monkeypatch.setattr(torch_graph._FlashAttentionForCpu, "forward", staticmethod(wrong))
    for mode, shape in (("exact", (1, 1, 2, 2)), ("local", (2, 3, 5, 4))):
        loss, _ = _torch_sdpa_loss(torch, shape)
        rep = verify(loss, mode=mode)
        assert not rep.ok and rep.status == "mismatch", str(rep)
        bad = [n.name for n in rep.nodes if n.status != "ok"]
        assert bad == ["ScaledDotProductFlashAttentionForCpuBackward0"], bad
