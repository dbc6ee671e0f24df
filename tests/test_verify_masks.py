"""The verifier on graphs whose forward holds -inf: attention masks, causal masks, masked_fill.

torch's math path turns a bool mask into 0/-inf added to the scores; exp, softmax and max
make exact zeros of the -inf, so the values and gradients are finite and correct. Such
graphs must verify ok in exact and local mode (a false alarm is a fault), while a wrong rule
in the same graph is still named, and a genuine nan (softmax of a row that is all -inf, as
torch gives it; inf * 0; log(0) feeding a gradient) is still reported as non-finite.
"""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg
import symgrad.nn.functional as F
from symgrad.ops import OPS
from symgrad.ops.softmax import softmax_backward

NEG_INF = float("-inf")
MODES = ("exact", "local")


def _qkv(seed: int, shape=(2, 3, 4), dtype=sg.float64):
    rng = np.random.default_rng(seed)
    return [sg.tensor(rng.standard_normal(shape).astype(dtype.np), requires_grad=True)
            for _ in range(3)]


def _mask3() -> sg.Tensor:
    """A 3x3 bool attention mask (True = take part) with a masked entry in two rows."""
    return sg.tensor([[True, False, True], [True, True, False], [True, True, True]])


def _sdpa_bool(seed=0):
    q, k, v = _qkv(seed)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=_mask3())
    return (out * out).sum()


def _sdpa_causal(seed=1):
    q, k, v = _qkv(seed)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return (out * out).sum()


def _sdpa_fully_masked_row(seed=2):
    """torch's math path gives zeros (and zero gradient) for a row that attends to nothing."""
    q, k, v = _qkv(seed)
    mask = sg.tensor([[True, False, True], [False, False, False], [True, True, True]])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return (out * out).sum()


def _mha(seed: int, need_weights: bool, **masks):
    sg.manual_seed(seed)
    mha = sg.nn.MultiheadAttention(4, 2, batch_first=True, dtype=sg.float64)
    (x, _, _) = _qkv(seed)
    out, _ = mha(x, x, x, need_weights=need_weights, **masks)
    return (out * out).sum()


def _causal_bool() -> sg.Tensor:
    return sg.tensor([[False, True, True], [False, False, True], [False, False, False]])


def _masked_softmax(seed=3):
    w = _qkv(seed, (2, 3))[0]
    m = sg.tensor([[False, True, False], [True, False, False]])
    return (F.softmax(w.masked_fill(m, NEG_INF), -1) * sg.tensor([0.5, -1.0, 2.0],
                                                                 dtype=sg.float64)).sum()


def _recorded(fn):
    """``fn()`` under ``sg.record()``: the nodes keep the temporary -inf constants."""
    with sg.record():
        return fn()


def _minus_inf_const() -> sg.Tensor:
    return sg.tensor([[1.0, NEG_INF, 2.0], [NEG_INF, 0.5, -1.0]], dtype=sg.float64)


CORRECT = {
    "sdpa bool mask": _sdpa_bool,
    "sdpa is_causal": _sdpa_causal,
    "sdpa fully masked row": _sdpa_fully_masked_row,
    "mha attn_mask weights": lambda: _mha(4, True, attn_mask=~_mask3()),
    "mha attn_mask fused": lambda: _mha(5, False, attn_mask=~_mask3()),
    "mha key_padding_mask weights": lambda: _mha(
        6, True, key_padding_mask=sg.tensor([[False, False, True], [False, True, False]])),
    "mha key_padding_mask fused": lambda: _mha(
        7, False, key_padding_mask=sg.tensor([[False, False, True], [False, True, False]])),
    "mha is_causal weights": lambda: _mha(8, True, attn_mask=_causal_bool(), is_causal=True),
    "mha is_causal fused": lambda: _mha(9, False, attn_mask=_causal_bool(), is_causal=True),
    "masked_fill -inf softmax": _masked_softmax,
    "exp of -inf": lambda: _recorded(lambda: (_qkv(10, (2, 3))[0] + _minus_inf_const())
                                     .exp().sum()),
    "max with -inf": lambda: sg.maximum(_qkv(11, (2, 3))[0], _minus_inf_const()).sum(),
    "max over a dim with -inf": lambda: _recorded(
        lambda: (_qkv(12, (2, 3))[0] + _minus_inf_const()).max(-1).values.sum()),
    "logsumexp with -inf": lambda: _recorded(
        lambda: (_qkv(13, (2, 3))[0] + _minus_inf_const()).logsumexp(-1).sum()),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CORRECT))
def test_minus_inf_masks_verify_ok(case, mode):
    rep = sg.verify(CORRECT[case](), mode=mode)
    assert rep.ok and rep.status == "ok", str(rep)
    assert rep.mode == mode
    assert all(r.status in ("ok", "not checked") for r in rep.leaves), str(rep)
    # the -inf really was in the graph, and the report says where; in torch's fused
    # attention node (4-D sdpa, MultiheadAttention need_weights=False) the mask is the
    # node's saved constant or its causal flag, inside the node's meaning
    inside = any(n.name == "ScaledDotProductFlashAttentionForCpuBackward0" for n in rep.nodes)
    assert inside or any(n.startswith("forward values hold ±inf") and "-inf" in n
                         for n in rep.notes), rep.notes


def test_masked_attention_gradients_match_torch(torch):
    """The graphs above are right: SDPA with a bool and a causal mask, values and gradients
    against torch 2.13 (so 'ok' from the verifier is the right answer)."""
    for kw in ({"attn_mask": _mask3()}, {"is_causal": True}):
        q, k, v = _qkv(20)
        tq, tk, tv = (torch.tensor(t.detach().numpy(), requires_grad=True) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, **kw)
        tkw = {"attn_mask": torch.tensor(kw["attn_mask"].numpy())} if "attn_mask" in kw \
            else kw
        tout = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **tkw)
        (out * out).sum().backward()
        (tout * tout).sum().backward()
        # one query row: a K=4 dot product, a softmax over 3, a V-weighted sum of 3, the loss
        terms = 4 + 3 + 3 + out.numel()
        scale = magnitude(q.detach().numpy(), k.detach().numpy(), v.detach().numpy())
        assert_close(out.detach().numpy(), tout.detach().numpy(), terms=terms, scale=scale)
        for ours, theirs in ((q, tq), (k, tk), (v, tv)):
            assert_close(ours.grad.numpy(), theirs.grad.numpy(), terms=2 * terms,
                         scale=scale ** 3)


# -- wrong rules in masked graphs are still named -------------------------------------------

def _softmax_nan_at_zeros(grad, dim, result):
    """Right wherever softmax is positive; 0 * log(0) = nan where the mask made it 0."""
    return softmax_backward(grad, result, dim) + 0.0 * result.log()


MUTATIONS = {
    # op, input, wrong formula, graph, node that must be named
    # SDPA's math path in torch 2.13 is _safe_softmax (SafeSoftmaxBackward0)
    "softmax 0.1% causal": ("safe_softmax", "self",
                            lambda grad, dim, result:
                            softmax_backward(grad, result, dim) * 1.001,
                            _sdpa_causal, "SafeSoftmaxBackward0"),
    "softmax nan at masked zeros": ("safe_softmax", "self", _softmax_nan_at_zeros, _sdpa_bool,
                                    "SafeSoftmaxBackward0"),
    "mask add 0.1%": ("add", "self", lambda grad: grad * 1.001, _sdpa_bool, "AddBackward0"),
    "masked_fill scaled": ("masked_fill", "self", lambda grad, mask: grad * 1.001,
                           _masked_softmax, "MaskedFillBackward0"),
}
CASES = [(c, m) for c in sorted(MUTATIONS) for m in MODES]
# masked_fill's backward zeroes the gradient at the masked places, nan included, so the
# leaves' gradients stay right and exact mode (end to end) has nothing to find; the local
# check of the node still names the nan its rule makes
MUTATIONS["softmax nan under masked_fill"] = ("softmax", "self", _softmax_nan_at_zeros,
                                              _masked_softmax, "SoftmaxBackward0")
CASES.append(("softmax nan under masked_fill", "local"))


@pytest.mark.parametrize(("case", "mode"), CASES)
def test_wrong_rule_in_a_masked_graph_is_named(case, mode, monkeypatch):
    op, input_name, wrong, build, target = MUTATIONS[case]
    assert sg.verify(build(), mode=mode).ok
    monkeypatch.setitem(OPS[op].grads, input_name, wrong)
    root = build()
    rep = sg.verify(root, mode=mode)
    assert not rep.ok and rep.status == "mismatch", str(rep)
    assert rep.first_bad_node is not None and rep.first_bad_node.name() == target, str(rep)
    bad = [r for r in rep.nodes if r.status in ("mismatch", "error")]
    assert {r.name for r in bad} == {target}, str(rep)


# -- genuine nan/inf are still reported -----------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_softmax_of_a_row_that_is_all_minus_inf_is_non_finite(mode, torch):
    """torch gives nan for such a row (values and gradients); so is the report non-finite."""
    w = _qkv(30, (2, 3))[0]
    m = [[False, True, False], [True, True, True]]
    with sg.record():
        y = F.softmax(w + sg.tensor(np.where(m, NEG_INF, 0.0)), -1)
        root = (y * sg.tensor([0.5, -1.0, 2.0], dtype=sg.float64)).sum()
    tw = torch.tensor(w.detach().numpy(), requires_grad=True)
    ty = torch.softmax(tw + torch.tensor(np.where(m, NEG_INF, 0.0)), -1)
    (ty * torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)).sum().backward()
    assert torch.isnan(ty[1]).all() and torch.isnan(tw.grad[1]).all()
    rep = sg.verify(root, mode=mode)
    assert not rep.ok and rep.status == "non-finite", str(rep)
    assert rep.first_bad_node is None  # no rule is wrong: torch gives the same nan
    (row,) = [r for r in rep.leaves if r.status == "non-finite"]
    assert np.isnan(row.engine_value) and row.worst_index[0] == 1
    assert "the forward of SoftmaxBackward0 gives nan" in row.detail, row.detail


@pytest.mark.parametrize("mode", MODES)
def test_mha_weights_of_a_fully_masked_row_are_non_finite_as_in_torch(mode, torch):
    """need_weights=True takes an explicit softmax: nan for a query with every key padded
    (torch gives nan too); need_weights=False goes through SDPA and gives zeros (ok)."""
    kpm = [[False, False, False], [True, True, True]]
    tm = torch.nn.MultiheadAttention(4, 2, batch_first=True, dtype=torch.float64)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    assert torch.isnan(tm(x, x, x, key_padding_mask=torch.tensor(kpm))[0][1]).all()
    assert not torch.isnan(tm(x, x, x, key_padding_mask=torch.tensor(kpm),
                              need_weights=False)[0]).any()
    rep = sg.verify(_mha(31, True, key_padding_mask=sg.tensor(kpm)), mode=mode)
    assert not rep.ok and rep.status == "non-finite", str(rep)
    assert rep.first_bad_node is None
    rep = sg.verify(_mha(31, False, key_padding_mask=sg.tensor(kpm)), mode=mode)
    assert rep.ok, str(rep)


@pytest.mark.parametrize("mode", MODES)
def test_inf_times_zero_is_non_finite_not_a_wrong_rule(mode):
    w = _qkv(32, (3,))[0]
    c = sg.tensor([float("inf"), 1.0, 2.0], dtype=sg.float64)
    with np.errstate(invalid="ignore"):
        root = (w * 0.0 * c).sum()
    rep = sg.verify(root, mode=mode)
    assert not rep.ok and rep.status == "non-finite", str(rep)
    assert rep.first_bad_node is None
    (row,) = [r for r in rep.leaves if r.status == "non-finite"]
    assert row.worst_index == (0,) and np.isnan(row.engine_value)
    assert "gives nan at [0]" in row.detail, row.detail


@pytest.mark.parametrize("mode", MODES)
def test_log_of_zero_feeding_a_gradient_is_non_finite(mode):
    """exp(log(x)) at x = 0: the forward is finite (exp(-inf) = 0), the gradient 0/0."""
    x = sg.tensor([0.0, 1.5, 2.0], dtype=sg.float64, requires_grad=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        root = x.log().exp().sum()
    assert np.isfinite(root.item())
    rep = sg.verify(root, mode=mode)
    assert not rep.ok and rep.status == "non-finite", str(rep)
    (row,) = [r for r in rep.leaves if r.status == "non-finite"]
    assert row.worst_index == (0,) and "LogBackward0" in row.detail, row.detail


@pytest.mark.parametrize("mode", MODES)
def test_an_infinite_root_with_finite_gradients_is_non_finite(mode):
    w = _qkv(33, (3,))[0]
    root = _recorded(lambda: (w + sg.tensor([NEG_INF, 0.0, 0.0], dtype=sg.float64)).sum())
    rep = sg.verify(root, mode=mode)
    assert not rep.ok and rep.status == "non-finite", str(rep)
    assert any(n.startswith("non-finite value: ") and "the root holds -inf" in n
               for n in rep.notes), rep.notes


@pytest.mark.parametrize("mode", MODES)
def test_a_nan_input_behind_a_finite_gradient_is_still_reported(mode):
    """nan is never a harmless value: a nan input is reported even where where() keeps it
    out of every gradient."""
    w = _qkv(34, (3,))[0]
    x = sg.tensor([1.0, float("nan"), 2.0], dtype=sg.float64)
    with sg.record():
        y = w + x  # nan at [1]; where() keeps it out of the root and of w's gradient
        root = sg.where(y != y, sg.zeros(3, dtype=sg.float64), y).sum()
    assert np.isfinite(root.item())
    rep = sg.verify(root, mode=mode)
    assert not rep.ok and rep.status == "non-finite", str(rep)
    assert all(r.status in ("ok", "not checked") for r in rep.leaves), str(rep)  # finite
    assert any(n.startswith("non-finite value: input x holds nan at [1]")
               for n in rep.notes), rep.notes


@pytest.mark.parametrize("mode", MODES)
def test_a_nan_number_operand_is_reported_even_where_it_is_selected_away(mode):
    """masked_fill(mask, nan) then where(mask, 0, .): root and gradients are finite, but a
    nan entered the graph as a number, which is reported as it is for a nan input."""
    w = _qkv(35, (3,))[0]
    mask = sg.tensor([False, True, False])
    with sg.record():
        root = sg.where(mask, sg.zeros(3, dtype=sg.float64),
                        w.masked_fill(mask, float("nan"))).sum()
    assert np.isfinite(root.item())
    rep = sg.verify(root, mode=mode)
    assert not rep.ok and rep.status == "non-finite", str(rep)
    assert all(r.status in ("ok", "not checked") for r in rep.leaves), str(rep)
    assert any(n.startswith("non-finite value: the number nan is an operand of "
                            "MaskedFillBackward0") for n in rep.notes), rep.notes
