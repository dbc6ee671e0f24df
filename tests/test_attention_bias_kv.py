"""MultiheadAttention's ``add_bias_kv`` and ``add_zero_attn`` against torch, same numbers.

``add_bias_kv`` concatenates the learned ``bias_k``/``bias_v`` (``(1, 1, E)``, repeated over
the batch) onto k and v along the sequence; ``add_zero_attn`` a zero row per head onto the
heads-first k and v. Each pads ``attn_mask`` and ``key_padding_mask`` by one column.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _tolerance import assert_close, magnitude
from test_attention import CHAIN, _backward, _compare_mha_grads, _graph, _leaves, _mha_pair

import symgrad as sg

OPTIONS = [(True, False), (False, True), (True, True)]  # add_bias_kv, add_zero_attn
MASKS = ["none", "bool", "float", "padding", "both"]
L, S, N, E, H = 4, 5, 3, 8, 2


def _opt_id(o):
    return {(True, False): "bias_kv", (False, True): "zero_attn", (True, True): "both_kv"}[o]


def _masks(torch, kind: str, rng, dtype: str, batched=True, mask_shape=(L, S), src=S):
    """Keyword masks for both libraries: an attention mask (True = not allowed; column 0
    always allowed, so no row is fully masked) and/or a key padding mask (last key off)."""
    kw, tkw = {}, {}
    if kind in ("padding", "both"):
        pad = np.zeros((N, src) if batched else (src,), dtype=bool)
        pad[..., -1] = True
        kw["key_padding_mask"], tkw["key_padding_mask"] = sg.tensor(pad), torch.tensor(pad)
    if kind in ("bool", "both"):
        m = rng.random(mask_shape) < 0.4
        m[..., 0] = False
        kw["attn_mask"], tkw["attn_mask"] = sg.tensor(m), torch.tensor(m)
    elif kind == "float":
        m = rng.standard_normal(mask_shape).astype(dtype)
        kw["attn_mask"], tkw["attn_mask"] = sg.tensor(m), torch.tensor(m)
    return kw, tkw


def _shaped(length, batch_first, batched=True, dim=E):
    if not batched:
        return (length, dim)
    return (N, length, dim) if batch_first else (length, N, dim)


def _check(torch, ours, theirs, leaves, tleaves, kw, tkw, rng, src_len):
    """Forward values, attention weights and every leaf's and parameter's gradient."""
    out, weights = ours(*leaves, **kw)
    t_out, t_weights = theirs(*tleaves, **tkw)
    terms = CHAIN + 3 * E + src_len
    assert_close(out, t_out, terms=terms, scale=magnitude(t_out, *tleaves))
    if kw.get("need_weights", True):
        assert_close(weights, t_weights, terms=terms)
    else:
        assert weights is None and t_weights is None
    _backward(out, t_out, rng)
    _compare_mha_grads(ours, theirs, leaves, tleaves, 3 * terms)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("options", OPTIONS, ids=_opt_id)
@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
def test_bias_kv_and_zero_attn_values_and_gradients_match_torch(torch, cpu_backend, options,
                                                                  masks, batch_first,
                                                                  need_weights, dtype):
    add_bias_kv, add_zero_attn = options
    ours, theirs = _mha_pair(torch, dtype, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                             batch_first=batch_first)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    rng = np.random.default_rng(21)
    leaves, tleaves = _leaves(torch, rng, dtype, *(_shaped(n, batch_first) for n in (L, S, S)))
    kw, tkw = _masks(torch, masks, rng, dtype)
    average = not batch_first
    for d in (kw, tkw):
        d.update(need_weights=need_weights, average_attn_weights=average)
    _check(torch, ours, theirs, leaves, tleaves, kw, tkw, rng, S + 2)


EXTRA_CASES = [
    # add_bias_kv, add_zero_attn, kdim, vdim, mask kind, 3-D mask, batched, need_weights
    (True, True, 3, 5, "both", False, True, True),
    (True, False, 3, 5, "float", True, True, False),
    (False, True, 6, 8, "bool", True, True, True),
    (True, True, None, None, "float", True, True, True),
    (True, True, None, None, "both", True, True, False),
    (True, False, None, None, "padding", False, False, True),
    (False, True, 3, 5, "both", False, False, False),
    (True, True, None, None, "float", False, False, True),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", EXTRA_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
def test_bias_kv_with_kdim_vdim_3d_masks_and_unbatched_match_torch(torch, cpu_backend, dtype,
                                                                  case):
    add_bias_kv, add_zero_attn, kdim, vdim, masks, three_d, batched, need_weights = case
    ours, theirs = _mha_pair(torch, dtype, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                             kdim=kdim, vdim=vdim)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    rng = np.random.default_rng(22)
    shapes = (_shaped(L, False, batched), _shaped(S, False, batched, kdim or E),
              _shaped(S, False, batched, vdim or E))
    leaves, tleaves = _leaves(torch, rng, dtype, *shapes)
    mask_shape = ((N if batched else 1) * H, L, S) if three_d else (L, S)
    kw, tkw = _masks(torch, masks, rng, dtype, batched=batched, mask_shape=mask_shape)
    for d in (kw, tkw):
        d.update(need_weights=need_weights, average_attn_weights=False)
    _check(torch, ours, theirs, leaves, tleaves, kw, tkw, rng, S + 2)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("options", OPTIONS, ids=_opt_id)
def test_bias_kv_self_attention_is_causal_matches_torch(torch, options, padding, need_weights):
    """is_causal needs the mask; without a padding mask and weights torch hands SDPA
    ``is_causal=True`` (its causal mask over the grown key length) instead of the mask."""
    ours, theirs = _mha_pair(torch, "float64", add_bias_kv=options[0],
                             add_zero_attn=options[1], batch_first=True)
    rng = np.random.default_rng(23)
    (x,), (tx,) = _leaves(torch, rng, "float64", (N, L, E))
    causal = np.triu(np.ones((L, L), dtype=bool), 1)
    kw = {"attn_mask": sg.tensor(causal), "is_causal": True, "need_weights": need_weights}
    tkw = {"attn_mask": torch.tensor(causal), "is_causal": True, "need_weights": need_weights}
    if padding:
        pad = np.zeros((N, L), dtype=bool)
        pad[:, -1] = True
        kw["key_padding_mask"], tkw["key_padding_mask"] = sg.tensor(pad), torch.tensor(pad)
    _check(torch, ours, theirs, [x] * 3, [tx] * 3, kw, tkw, rng, L + 2)


@pytest.mark.parametrize("options", OPTIONS, ids=_opt_id)
def test_torchs_fast_path_is_skipped_and_values_match_in_eval(torch, options):
    """Eval, no grad, batch_first self-attention with even heads would take torch's fused
    fast path; bias_k/add_zero_attn turn it off, so torch computes what symgrad does."""
    ours, theirs = _mha_pair(torch, "float64", add_bias_kv=options[0],
                             add_zero_attn=options[1], batch_first=True)
    ours.eval()
    theirs.eval()
    x = np.random.default_rng(24).standard_normal((N, L, E))
    pad = np.zeros((N, L), dtype=bool)
    pad[:, -1] = True
    with sg.no_grad():
        out, w = ours(*[sg.tensor(x)] * 3, key_padding_mask=sg.tensor(pad))
    with torch.no_grad():
        t_out, t_w = theirs(*[torch.tensor(x)] * 3, key_padding_mask=torch.tensor(pad))
    assert_close(out, t_out, terms=CHAIN + 3 * E + L + 2, scale=magnitude(t_out, x))
    assert_close(w, t_w, terms=CHAIN + 3 * E + L + 2)


def test_bias_kv_parameters_state_dict_repr_and_init_follow_torch(torch):
    for kw in ({}, {"kdim": 3, "vdim": 5}, {"bias": False}):
        mha = sg.nn.MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True, **kw)
        t = torch.nn.MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True, **kw)
        assert list(mha.state_dict()) == list(t.state_dict())
        assert [n for n, _ in mha.named_parameters()] == [n for n, _ in t.named_parameters()]
        assert [tuple(p.shape) for p in mha.parameters()] == \
            [tuple(p.shape) for p in t.parameters()]
        assert repr(mha) == repr(t)
        assert mha.add_zero_attn is True and tuple(mha.bias_k.shape) == (1, 1, 8)
    plain = sg.nn.MultiheadAttention(8, 2, add_zero_attn=True)
    assert plain.bias_k is None and plain.bias_v is None
    assert "bias_k" not in dict(plain.named_parameters())
    # xavier_normal_ on (1, 1, E): fan_in = fan_out = E, std = sqrt(2 / 2E); the draws come
    # after out_proj's Linear init and the in_proj xavier_uniform_, as torch orders them
    sg.manual_seed(9)
    mha = sg.nn.MultiheadAttention(8, 2, add_bias_kv=True, dtype=sg.float64)
    sg.manual_seed(9)
    sg.nn.Linear(8, 8, dtype=sg.float64)
    sg.nn.init.xavier_uniform_(sg.empty(24, 8, dtype=sg.float64))
    for p in (mha.bias_k, mha.bias_v):
        expected = sg.nn.init.normal_(sg.empty(1, 1, 8, dtype=sg.float64), 0.0, math.sqrt(1 / 8))
        assert sg.equal(p.detach(), expected)


@pytest.mark.parametrize("options", OPTIONS, ids=_opt_id)
def test_padding_mask_length_errors_as_torch(torch, options):
    """The padding mask is checked after the bias/zero columns are added, with torch's
    wording ("key_padded_mask")."""
    messages = []
    for lib in (sg, torch):
        mha = lib.nn.MultiheadAttention(8, 2, add_bias_kv=options[0], add_zero_attn=options[1])
        x = lib.zeros(4, 3, 8)
        with pytest.raises(AssertionError) as err:
            mha(x, x, x, key_padding_mask=lib.zeros(3, 3, dtype=lib.bool))
        messages.append(str(err.value))
    assert messages[0] == messages[1]


def test_verify_local_on_bias_kv_and_zero_attn():
    sg.manual_seed(2)
    mha = sg.nn.MultiheadAttention(4, 2, add_bias_kv=True, add_zero_attn=True).double()
    x = sg.randn(3, 2, 4, dtype=sg.float64, requires_grad=True)
    pad = sg.tensor(np.array([[False, False, True], [False, False, False]]))
    mask = sg.tensor(np.triu(np.full((3, 3), -2.0), 1))
    for need_weights in (True, False):
        with sg.record():
            out, _ = mha(x, x, x, need_weights=need_weights, attn_mask=mask,
                         key_padding_mask=pad)
            loss = (out * out).sum()
        rep = sg.verify(loss, mode="local")
        assert rep.ok and rep.mode == "local", str(rep)
        names = {n.name for n in rep.nodes}
        assert {"CatBackward0", "RepeatBackward0"} <= names


def test_whole_graph_cases_record_the_new_nodes(torch):
    """The bias/zero cases of test_attention's whole-graph comparison record torch's
    RepeatBackward0 + CatBackward0 (bias_k/v) and CatBackward0 with a None edge (zeros),
    around torch's default (fused flash) attention node."""
    ours, theirs = _mha_pair(torch, "float64", add_bias_kv=True, add_zero_attn=True)
    rng = np.random.default_rng(25)
    (x,), (tx,) = _leaves(torch, rng, "float64", (L, N, E))
    out, _ = ours(x, x, x, need_weights=False)
    t_out, _ = theirs(tx, tx, tx, need_weights=False)
    graph = _graph(out.grad_fn)
    assert graph == _graph(t_out.grad_fn)
    names = [n for n, _, _ in graph]
    assert names.count("CatBackward0") == 4 and names.count("RepeatBackward0") == 2
    assert names.count("ScaledDotProductFlashAttentionForCpuBackward0") == 1
    zero_cats = [edges for n, edges, _ in graph if n == "CatBackward0" and edges[1][0] is None]
    assert len(zero_cats) == 2
