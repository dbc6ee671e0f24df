"""scaled_dot_product_attention and MultiheadAttention against torch, from the same numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _tolerance import SAFETY, assert_close, magnitude

import symgrad as sg

DTYPES = ["float32", "float64"]
# softmax (exp, max, sum) + scaling + mask add + the chain rule's extra roundings
CHAIN = 16


def _leaves(torch, rng, dtype: str, *shapes):
    """The same random leaves in both libraries (requires_grad)."""
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    ours = [sg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    return ours, theirs


def _backward(out, torch_out, rng):
    """Backpropagate the same random upstream gradient through both results."""
    g = rng.standard_normal(tuple(torch_out.shape)).astype(str(torch_out.dtype)[6:])
    (out * sg.tensor(g)).sum().backward()
    (torch_out * __import__("torch").tensor(g)).sum().backward()


def _mask_pair(torch, kind: str, rng, shape, dtype: str):
    """A bool or float mask (one fully masked row for the bool one) in both libraries."""
    if kind == "none":
        return None, None
    if kind == "bool":
        keep = rng.random(shape) > 0.3
        keep[..., 0, :] = False  # a fully masked row: zeros, not NaN
        keep[..., 1, :] = True
        return sg.tensor(keep), torch.tensor(keep)
    m = rng.standard_normal(shape).astype(dtype)
    return sg.tensor(m), torch.tensor(m)


SDPA_SHAPES = [
    # query, key, value, mask shape
    ((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 7), (4, 6)),
    ((3, 4), (2, 5, 4), (2, 5, 3), (2, 3, 5)),
    ((1, 2, 5, 3), (2, 1, 5, 3), (2, 2, 5, 4), (2, 1, 5, 5)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shapes", SDPA_SHAPES, ids=["4d", "broadcast-q", "broadcast-batch"])
@pytest.mark.parametrize("mask", ["none", "bool", "float"])
def test_sdpa_values_and_gradients_match_torch(torch, cpu_backend, dtype, shapes, mask):
    rng = np.random.default_rng(0)
    (q, k, v), (tq, tk, tv) = _leaves(torch, rng, dtype, *shapes[:3])
    m, tm = _mask_pair(torch, mask, rng, shapes[3], dtype)
    out = sg.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm)
    terms = CHAIN + shapes[0][-1] + shapes[1][-2]
    assert_close(out, expected, terms=terms, scale=magnitude(expected, tv))
    _backward(out, expected, rng)
    for ours, theirs in ((q, tq), (k, tk), (v, tv)):
        assert_close(ours.grad, theirs.grad, terms=2 * terms,
                     scale=magnitude(theirs.grad, tq, tk, tv))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", [{"is_causal": True}, {"scale": 0.3}, {"scale": -0.5},
                                {"is_causal": True, "scale": 2.0}],
                         ids=["causal", "scale", "negative-scale", "causal-scale"])
def test_sdpa_causal_and_scale_match_torch(torch, cpu_backend, dtype, kw):
    rng = np.random.default_rng(1)
    (q, k, v), (tq, tk, tv) = _leaves(torch, rng, dtype, (2, 2, 4, 3), (2, 2, 6, 3),
                                      (2, 2, 6, 5))
    out = sg.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **kw)
    assert_close(out, expected, terms=CHAIN + 9, scale=magnitude(expected, tv))
    _backward(out, expected, rng)
    for ours, theirs in ((q, tq), (k, tk), (v, tv)):
        assert_close(ours.grad, theirs.grad, terms=2 * (CHAIN + 9),
                     scale=magnitude(theirs.grad, tq, tk, tv))


def _node_names(fn) -> list[str]:
    seen, names, stack = set(), [], [fn]
    while stack:
        f = stack.pop()
        if f is None or id(f) in seen:
            continue
        seen.add(id(f))
        names.append(type(f).__name__)
        stack.extend(n for n, _ in f.next_functions)
    return sorted(names)


def test_sdpa_records_the_nodes_of_torchs_math_path(torch):
    """Value head dim != query head dim: torch takes its math path. The graphs have the same
    nodes, torch's ``_safe_softmax`` (SafeSoftmaxBackward0) included."""
    rng = np.random.default_rng(8)
    (q, k, v), (tq, tk, tv) = _leaves(torch, rng, "float64", (2, 3, 4, 5), (2, 3, 6, 5),
                                      (2, 3, 6, 7))
    keep = np.ones((4, 6), dtype=bool)
    ours = _node_names(sg.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=sg.tensor(keep)).grad_fn)
    theirs = _node_names(torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=torch.tensor(keep)).grad_fn)
    assert ours == theirs
    assert "SafeSoftmaxBackward0" in ours


def test_sdpa_grouped_query_attention_matches_torch(torch):
    rng = np.random.default_rng(2)
    (q, k, v), (tq, tk, tv) = _leaves(torch, rng, "float64", (2, 4, 3, 5), (2, 2, 6, 5),
                                      (2, 2, 6, 5))
    out = sg.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)
    assert_close(out, expected, terms=CHAIN + 11, scale=magnitude(expected, tv))
    _backward(out, expected, rng)
    assert_close(k.grad, tk.grad, terms=2 * (CHAIN + 11),
                 scale=magnitude(tk.grad, tq, tk, tv))


def test_sdpa_fully_masked_rows_are_zero_with_zero_gradient(cpu_backend):
    q = sg.randn(1, 3, 4, requires_grad=True)
    keep = sg.tensor([[True, True], [False, False], [True, False]])
    out = sg.nn.functional.scaled_dot_product_attention(q, sg.randn(1, 2, 4), sg.randn(1, 2, 4),
                                                        attn_mask=keep)
    assert (out[0, 1] == 0).all().item()
    out.sum().backward()
    assert not np.isnan(q.grad.numpy()).any()
    assert (q.grad[0, 1] == 0).all().item() and (q.grad[0, 2] == 0).all().item()


@pytest.mark.parametrize("p", [0.3, 0.7])
def test_sdpa_dropout_is_seeded_and_keeps_the_expected_fraction(p):
    def run():
        sg.manual_seed(5)
        q, k, v = sg.ones(1, 64, 8), sg.ones(1, 64, 8), sg.ones(1, 64, 8)
        return sg.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p)

    a, b = run(), run()
    assert sg.equal(a, b)  # reproducible from manual_seed
    # every weight is 1/64 before dropout; kept ones are scaled by 1/(1 - p), so the mean
    # output stays 1 and the kept fraction is near 1 - p (64*64 Bernoulli draws)
    assert abs(a.mean().item() - 1.0) < 4 * math.sqrt(p / (1 - p) / 64 / 64) * 8
    no_drop = sg.nn.functional.scaled_dot_product_attention(sg.ones(1, 4, 8), sg.ones(1, 4, 8),
                                                            sg.ones(1, 4, 8), dropout_p=0.0)
    assert sg.equal(no_drop, sg.ones(1, 4, 8))


@pytest.mark.parametrize("args, kw", [
    (((2, 3, 4), (2, 5, 4), (2, 6, 4)), {}),
    (((4,), (4,), (4,)), {}),
    (((2, 3, 4), (2, 5, 4), (2, 5, 4)), {"attn_mask": "bool", "is_causal": True}),
    (((2, 3, 4), (2, 5, 4), (2, 5, 4)), {"dropout_p": 1.5}),
    (((2, 3, 4), (2, 5, 4), (2, 5, 4)), {"value_dtype": "float64"}),
    (((2, 3, 4), (2, 5, 4), (2, 5, 4)), {"attn_mask": np.ones((3, 5))}),
    (((2, 3, 4), (2, 5, 4), (2, 5, 4)), {"attn_mask": np.ones((3, 5), dtype=np.int64)}),
], ids=["lengths", "rank", "causal-and-mask", "dropout", "dtypes", "mask-double",
        "mask-long"])
def test_sdpa_errors_as_torch(torch, args, kw):
    kw = dict(kw)
    vdtype = kw.pop("value_dtype", "float32")
    if isinstance(kw.get("attn_mask"), str):
        kw["attn_mask"] = np.ones((3, 5), dtype=bool)
    arrays = [np.ones(s, dtype="float32") for s in args]
    arrays[2] = arrays[2].astype(vdtype)
    messages = []
    for lib in (sg, torch):
        kwl = {n: (lib.tensor(x) if isinstance(x, np.ndarray) else x) for n, x in kw.items()}
        with pytest.raises(RuntimeError) as err:
            lib.nn.functional.scaled_dot_product_attention(*map(lib.tensor, arrays), **kwl)
        messages.append(str(err.value))
    assert messages[0] == messages[1]


# -- MultiheadAttention ---------------------------------------------------------------------

def _mha_pair(torch, dtype: str, embed_dim=8, num_heads=2, **kw):
    """A torch MultiheadAttention and a symgrad one loaded from its state dict."""
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(embed_dim, num_heads, **kw).to(getattr(torch, dtype))
    with torch.no_grad():  # torch zeroes the biases; make them count
        for name, p in theirs.named_parameters():
            if "bias" in name:
                p.uniform_(-0.5, 0.5)
    ours = sg.nn.MultiheadAttention(embed_dim, num_heads, **kw).to(getattr(sg, dtype))
    state = {k: sg.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()}
    ours.load_state_dict(state)
    return ours, theirs


def _compare_mha_grads(ours, theirs, leaves, torch_leaves, terms):
    for a, b in zip(leaves, torch_leaves):
        assert_close(a.grad, b.grad, terms=terms, scale=magnitude(b.grad, *torch_leaves))
    params = dict(ours.named_parameters())
    for name, p in theirs.named_parameters():
        assert_close(params[name].grad, p.grad, terms=terms,
                     scale=magnitude(p.grad, *torch_leaves))


MHA_CASES = [
    # batch_first, need_weights, average, key_padding, attn_mask kind, batched
    (False, True, True, False, "none", True),
    (True, True, False, True, "bool", True),
    (False, False, True, True, "float", True),
    (True, False, True, False, "bool", True),
    (False, True, True, True, "none", False),
    (False, False, True, False, "float", False),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("case", MHA_CASES, ids=lambda c: "-".join(map(str, c)))
def test_mha_values_and_gradients_match_torch(torch, cpu_backend, dtype, case):
    batch_first, need_weights, average, padding, mask_kind, batched = case
    ours, theirs = _mha_pair(torch, dtype, batch_first=batch_first)
    rng = np.random.default_rng(3)
    L, S, N, E = 4, 5, 3, 8

    def shaped(length):
        if not batched:
            return (length, E)
        return (N, length, E) if batch_first else (length, N, E)

    leaves, tleaves = _leaves(torch, rng, dtype, shaped(L), shaped(S), shaped(S))
    kw, tkw = {"need_weights": need_weights, "average_attn_weights": average}, {}
    tkw.update(kw)
    if padding:
        pad = np.zeros((N, S) if batched else (S,), dtype=bool)
        pad[..., -1] = True
        kw["key_padding_mask"], tkw["key_padding_mask"] = sg.tensor(pad), torch.tensor(pad)
    if mask_kind != "none":
        m, tm = _mask_pair(torch, mask_kind, rng, (L, S), dtype)
        if mask_kind == "bool":  # MultiheadAttention: True = not allowed; keep rows alive
            m, tm = sg.tensor(~tm.numpy()), ~tm
            m, tm = m & sg.tensor(np.arange(S) != 0), tm & torch.tensor(np.arange(S) != 0)
        kw["attn_mask"], tkw["attn_mask"] = m, tm
    out, weights = ours(*leaves, **kw)
    t_out, t_weights = theirs(*tleaves, **tkw)
    terms = CHAIN + 3 * E + S
    assert_close(out, t_out, terms=terms, scale=magnitude(t_out, *tleaves))
    if need_weights:
        assert_close(weights, t_weights, terms=terms)
    else:
        assert weights is None and t_weights is None
    _backward(out, t_out, rng)
    _compare_mha_grads(ours, theirs, leaves, tleaves, 3 * terms)


def test_mha_separate_kdim_vdim_and_no_bias_match_torch(torch, cpu_backend):
    ours, theirs = _mha_pair(torch, "float64", kdim=3, vdim=5, bias=False)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    rng = np.random.default_rng(4)
    leaves, tleaves = _leaves(torch, rng, "float64", (4, 2, 8), (6, 2, 3), (6, 2, 5))
    out, w = ours(*leaves)
    t_out, t_w = theirs(*tleaves)
    assert_close(out, t_out, terms=CHAIN + 30, scale=magnitude(t_out, *tleaves))
    assert_close(w, t_w, terms=CHAIN + 30)
    _backward(out, t_out, rng)
    _compare_mha_grads(ours, theirs, leaves, tleaves, 3 * (CHAIN + 30))


def test_mha_self_attention_is_causal_matches_torch(torch):
    ours, theirs = _mha_pair(torch, "float64", batch_first=True)
    rng = np.random.default_rng(6)
    (x,), (tx,) = _leaves(torch, rng, "float64", (2, 5, 8))
    causal = np.triu(np.ones((5, 5), dtype=bool), 1)
    for need_weights in (True, False):
        out, _ = ours(x, x, x, attn_mask=sg.tensor(causal), is_causal=True,
                      need_weights=need_weights)
        t_out, _ = theirs(tx, tx, tx, attn_mask=torch.tensor(causal), is_causal=True,
                          need_weights=need_weights)
        assert_close(out, t_out, terms=CHAIN + 30, scale=magnitude(t_out, tx))


def test_mha_state_dict_keys_and_init_follow_torch(torch):
    mha = sg.nn.MultiheadAttention(8, 2)
    t = torch.nn.MultiheadAttention(8, 2)
    assert list(mha.state_dict()) == list(t.state_dict())
    assert repr(mha) == repr(t)
    assert [tuple(p.shape) for p in mha.parameters()] == [tuple(p.shape) for p in t.parameters()]
    assert (mha.in_proj_bias == 0).all().item() and (mha.out_proj.bias == 0).all().item()
    bound = math.sqrt(6.0 / (8 + 24))  # xavier_uniform_ on (3E, E)
    assert mha.in_proj_weight.abs().max().item() <= bound


def test_mha_dropout_is_seeded_in_training_and_off_in_eval():
    mha = sg.nn.MultiheadAttention(8, 2, dropout=0.5)
    x = sg.randn(4, 3, 8)

    def run():
        sg.manual_seed(3)
        return mha(x, x, x)

    (a, wa), (b, wb) = run(), run()
    assert sg.equal(a, b) and sg.equal(wa, wb)
    mha.eval()
    out, weights = mha(x, x, x)
    assert_close(weights.sum(-1), np.ones((3, 4), dtype="float32"), terms=8)


def test_no_reference_cycles_in_attention(no_gc):
    import gc
    import weakref

    mha = sg.nn.MultiheadAttention(8, 2)
    x = sg.randn(4, 3, 8, requires_grad=True)
    for need_weights in (True, False):
        out, _ = mha(x, x, x, need_weights=need_weights,
                     key_padding_mask=sg.tensor(np.eye(3, 4, dtype=bool)))
        out.sum().backward()
    ref = weakref.ref(mha.in_proj_weight)
    del mha, out, x
    assert ref() is None
    assert gc.collect() == 0


def test_mha_refuses_heads_that_do_not_divide_embed_dim():
    with pytest.raises(AssertionError, match="divisible"):
        sg.nn.MultiheadAttention(8, 3)


# -- the verifier -----------------------------------------------------------------------------

def test_verify_local_on_multihead_self_attention():
    sg.manual_seed(0)
    mha = sg.nn.MultiheadAttention(4, 2).double()
    x = sg.randn(3, 2, 4, dtype=sg.float64, requires_grad=True)
    for need_weights in (True, False):
        out, _ = mha(x, x, x, need_weights=need_weights)
        rep = sg.verify((out * out).sum(), mode="local")
        assert rep.ok and rep.mode == "local", str(rep)


def test_verify_exact_on_a_tiny_float_masked_attention():
    sg.manual_seed(1)
    q, k, v = (sg.randn(n, 2, dtype=sg.float64, requires_grad=True) for n in (2, 3, 3))
    out = sg.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=sg.randn(2, 3).double(),
                                                        scale=0.7)
    rep = sg.verify((out * out).sum(), mode="exact")
    assert rep.ok and rep.mode == "exact", str(rep)


def test_verify_accepts_the_minus_infinity_of_a_causal_mask():
    """torch's -inf mask is kept (values equal torch's); softmax makes exact zeros of it, so
    the graph verifies ok (tests/test_verify_masks.py has the cases that must still fail)."""
    q, k, v = (sg.randn(2, 2, dtype=sg.float64, requires_grad=True) for _ in range(3))
    out = sg.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    rep = sg.verify((out * out).sum(), mode="local")
    assert rep.ok and rep.status == "ok", str(rep)


# -- a one-block transformer trained three AdamW steps --------------------------------------

V, T, E, H = 7, 5, 8, 2


def _transformer(lib, need_weights: bool):
    """Embedding (Linear on one-hot), pre-norm attention and GELU MLP blocks, LM head."""

    class LayerNorm(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = lib.nn.Parameter(lib.ones(E, dtype=lib.float64))
            self.bias = lib.nn.Parameter(lib.zeros(E, dtype=lib.float64))

        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) * (x - mean)).mean(-1, keepdim=True)
            return (x - mean) / (var + 1e-5).sqrt() * self.weight + self.bias

    class Block(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = lib.nn.Linear(V, E, bias=False)
            self.ln1, self.ln2 = LayerNorm(), LayerNorm()
            self.attn = lib.nn.MultiheadAttention(E, H, batch_first=True)
            self.mlp = lib.nn.Sequential(lib.nn.Linear(E, 4 * E), lib.nn.GELU(),
                                         lib.nn.Linear(4 * E, E))
            self.head = lib.nn.Linear(E, V)

        def forward(self, onehot):
            x = self.embed(onehot)
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=need_weights)[0]
            x = x + self.mlp(self.ln2(x))
            return self.head(x)

    return Block().double()


def _compare_trained(ours, theirs, terms: int, lr: float, adam_eps: float = 1e-8) -> None:
    """Parameters equal torch's, except the key bias: softmax ignores a shift of a row's
    scores, so its gradient is zero up to rounding noise (~terms * eps), which AdamW turns
    into steps of about ``lr * noise / adam_eps`` in either library."""
    for name, p in theirs.named_parameters():
        mine, p = ours.get_parameter(name).detach().numpy(), p.detach().numpy()
        if name == "attn.in_proj_bias":
            noise_step = lr * SAFETY * terms * np.finfo(np.float64).eps / adam_eps
            assert np.abs(mine[E:2 * E] - p[E:2 * E]).max() <= 3 * noise_step
            mine, p = np.delete(mine, np.s_[E:2 * E]), np.delete(p, np.s_[E:2 * E])
        assert_close(mine, p, terms=terms, scale=max(magnitude(p), lr), msg=name)


@pytest.mark.parametrize("need_weights", [True, False])
def test_one_block_transformer_trains_as_torch_over_three_adamw_steps(torch, cpu_backend,
                                                                       need_weights):
    torch.manual_seed(0)
    theirs = _transformer(torch, need_weights)
    ours = _transformer(sg, need_weights)
    ours.load_state_dict({k: sg.tensor(v.detach().numpy())
                          for k, v in theirs.state_dict().items()})
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, V, (2, T + 1))
    onehot = np.eye(V)[tokens[:, :-1]]
    targets = tokens[:, 1:].reshape(-1)
    opt = sg.optim.AdamW(ours.parameters(), lr=0.01)
    t_opt = torch.optim.AdamW(theirs.parameters(), lr=0.01)
    terms = 0
    for _ in range(3):
        terms += CHAIN + 6 * E + T + V  # roundings one step adds along the longest chain
        for model, optim, lib in ((ours, opt, sg), (theirs, t_opt, torch)):
            optim.zero_grad()
            logits = model(lib.tensor(onehot))
            loss = lib.nn.functional.cross_entropy(logits.reshape(-1, V), lib.tensor(targets))
            loss.backward()
            optim.step()
            if lib is sg:
                our_loss = loss
            else:
                assert_close(our_loss, loss, terms=terms)
        _compare_trained(ours, theirs, terms, lr=0.01)
    logits = ours(sg.tensor(onehot))
    loss = sg.nn.functional.cross_entropy(logits.reshape(-1, V), sg.tensor(targets))
    rep = sg.verify(loss, mode="local")
    assert rep.ok, str(rep)


# -- the softmax and score nodes torch records (issue 21) -------------------------------------
_CORE = ("SafeSoftmaxBackward0", "SoftmaxBackward0", "BaddbmmBackward0", "BmmBackward0")


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_mha_weights_path_records_torchs_softmax_and_baddbmm(torch, mask_kind, batch_first):
    """need_weights=True: bmm (or, with a mask, baddbmm(mask, q, k^T)) then softmax, as
    torch's multi_head_attention_forward records them."""
    ours, theirs = _mha_pair(torch, "float64", batch_first=batch_first)
    rng = np.random.default_rng(5)
    L, N, E = 4, 3, 8
    shape = (N, L, E) if batch_first else (L, N, E)
    (x,), (tx,) = _leaves(torch, rng, "float64", shape)
    kw, tkw = {}, {}
    if mask_kind != "none":
        m = np.triu(np.ones((L, L), dtype=bool), 1)
        kw["attn_mask"] = sg.tensor(m if mask_kind == "bool" else np.where(m, -1.0, 0.5))
        tkw["attn_mask"] = torch.tensor(m if mask_kind == "bool" else np.where(m, -1.0, 0.5))
    out, _ = ours(x, x, x, **kw)
    t_out, _ = theirs(tx, tx, tx, **tkw)
    ours_names, theirs_names = _node_names(out.grad_fn), _node_names(t_out.grad_fn)
    assert [ours_names.count(n) for n in _CORE] == [theirs_names.count(n) for n in _CORE]
    assert ("BaddbmmBackward0" in ours_names) == (mask_kind != "none")
    assert_close(out, t_out, terms=CHAIN + 3 * E + L, scale=magnitude(t_out, tx))


@pytest.mark.parametrize("dtype", DTYPES)
def test_baddbmm_matches_torch(torch, cpu_backend, dtype):
    rng = np.random.default_rng(4)
    shapes = [(1, 3, 2), (2, 3, 4), (2, 4, 2)]
    for beta, alpha in ((1, 1), (0.5, -2.0), (0, 3.0)):
        (a, b1, b2), (ta, tb1, tb2) = _leaves(torch, rng, dtype, *shapes)
        y = sg.baddbmm(a, b1, b2, beta=beta, alpha=alpha)
        ty = torch.baddbmm(ta, tb1, tb2, beta=beta, alpha=alpha)
        assert y.grad_fn.name() == ty.grad_fn.name() == "BaddbmmBackward0"
        assert (y.grad_fn._saved_beta, y.grad_fn._saved_alpha) == (beta, alpha)
        assert y.grad_fn._saved_batch1 is b1 and y.grad_fn._saved_batch2 is b2
        assert_close(y, ty, terms=4 + 2, scale=magnitude(ty, ta, tb1, tb2) ** 2 * 4)
        _backward(y, ty, rng)
        for p, q in ((a, ta), (b1, tb1), (b2, tb2)):
            assert_close(p.grad, q.grad, terms=3 * 4 + 4,
                         scale=magnitude(q.grad, ta, tb1, tb2) ** 2 * 4)
    assert_close(a.baddbmm(b1, b2), torch.baddbmm(ta, tb1, tb2), terms=6,
                 scale=magnitude(ta, tb1, tb2) ** 2 * 4)


@pytest.mark.parametrize("args", [((2, 3), (2, 3, 4), (2, 4, 3)),
                                  ((1, 3, 3), (2, 3), (2, 4, 3)),
                                  ((1, 3, 3), (2, 3, 4), (2, 5, 3)),
                                  ((1, 3, 3), (2, 3, 4), (3, 4, 3))])
def test_baddbmm_errors_as_torch(torch, args):
    messages = []
    for L in (sg, torch):
        with pytest.raises(RuntimeError) as info:
            L.baddbmm(*[L.zeros(*s) for s in args])
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_safe_softmax_node_matches_torch(torch, cpu_backend):
    """torch._safe_softmax: softmax, and zeros (zero gradient) on all -inf rows."""
    from symgrad.ops import OPS
    from symgrad.ops._ints import u64

    data = np.array([[0.5, -1.0, 2.0], [-np.inf, -np.inf, -np.inf], [1.0, -np.inf, 0.0]])
    w = np.random.default_rng(6).uniform(-1, 1, data.shape)
    x, tx = sg.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    y = sg.autograd.function.apply(OPS["safe_softmax"], (x,), {"dim": u64(-1)})
    ty = torch._safe_softmax(tx, -1)
    assert y.grad_fn.name() == ty.grad_fn.name()
    assert y.grad_fn._saved_dim == ty.grad_fn._saved_dim
    assert_close(y.grad_fn._saved_result, ty.grad_fn._saved_result, terms=1)
    assert_close(y, ty, terms=4, scale=1.0)
    (y * sg.tensor(w)).sum().backward()
    (ty * torch.tensor(w)).sum().backward()
    assert_close(x.grad, tx.grad, terms=8, scale=magnitude(w))
    assert not np.isnan(x.grad.numpy()).any()


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_verify_baddbmm_and_masked_multihead_weights(mode):
    """The new nodes are checked by the verifier: baddbmm with a broadcast input (the engine
    sums its gradient back), and MultiheadAttention's masked weights path."""
    rng = np.random.default_rng(11)
    a, b1, b2 = (sg.tensor(rng.uniform(0.5, 1.5, s), requires_grad=True)
                 for s in ((1, 2, 2), (2, 2, 3), (2, 3, 2)))
    with sg.record():
        y = (sg.baddbmm(a, b1, b2, beta=0.5, alpha=-2.0) ** 2).sum()
    assert sg.verify(y, mode=mode).ok
    mha = sg.nn.MultiheadAttention(4, 2).to(sg.float64)
    x = sg.tensor(rng.uniform(-1, 1, (3, 1, 4)), requires_grad=True)
    mask = sg.tensor(np.triu(np.full((3, 3), -2.0), 1))
    with sg.record():
        out, _ = mha(x, x, x, attn_mask=mask)
        loss = (out * out).sum()
    report = sg.verify(loss, mode=mode)
    assert report.ok, report
    assert "BaddbmmBackward0" in {n.name for n in report.nodes}


# -- the whole graph MultiheadAttention records (issue 21) -----------------------------------

def _graph(fn) -> list[tuple]:
    """Every node reachable from ``fn`` in first-visit order: its name, its edges (as indices
    into this list, with output_nr) and its saved operands (tensors by shape, the rest by
    value), so two graphs compare equal only if nodes, edges and saved operands match."""
    ids, order, stack = {}, [], [fn]
    while stack:
        f = stack.pop()
        if f is None or id(f) in ids:
            continue
        ids[id(f)] = len(ids)
        order.append(f)
        stack.extend(n for n, _ in reversed(f.next_functions))

    def saved(f):
        out = {}
        for name in sorted(a for a in dir(f) if a.startswith("_saved_")):
            value = getattr(f, name)
            out[name] = ("tensor", tuple(value.shape)) if hasattr(value, "shape") else (
                tuple(value) if isinstance(value, (list, tuple)) else value)
        return out

    return [(f.name().replace("torch::autograd::", ""),
             [(None if n is None else ids[id(n)], nr) for n, nr in f.next_functions],
             saved(f)) for f in order]


MHA_GRAPH_CASES = [
    # identities of (query, key, value), batch_first, bias, need_weights, masks, batched
    ("qkv", False, True, True, "none", True),
    ("qkv", True, True, False, "none", True),
    ("qkv", False, False, False, "none", True),
    ("qkv", True, False, True, "bool", True),
    ("qkv", False, True, False, "padding", True),
    ("qkv", False, True, True, "none", False),
    ("kv", False, True, True, "none", True),
    ("kv", True, True, False, "float", True),
    ("kv", False, False, True, "none", True),
    ("kv", True, False, False, "padding", True),
    ("all", False, True, True, "none", True),
    ("all", True, True, False, "none", True),
    ("all", False, False, False, "float", True),
    ("all", True, True, True, "padding", True),
    # (add_bias_kv, add_zero_attn): bias_k/v repeated and concatenated, zero rows, masks padded
    ("qkv", False, True, True, "none", True, (True, False)),
    ("qkv", True, True, False, "padding", True, (True, True)),
    ("qkv", False, True, True, "bool", False, (False, True)),
    ("kv", False, False, True, "padding", True, (False, True)),
    ("kv", True, True, False, "float", True, (True, False)),
    ("all", False, True, True, "bool", True, (True, True)),
    ("all", True, False, False, "none", True, (True, True)),
]


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("case", MHA_GRAPH_CASES, ids=lambda c: "-".join(map(str, c)))
def test_mha_records_torchs_whole_graph(torch, case):
    """q is k is v: one packed linear cut by unflatten/unsqueeze/transpose/squeeze/clone and
    select; k is v: split([E, 2E]) of the weight and bias, a q linear and one k/v linear;
    otherwise chunk(3) and three linears. need_weights=False is compared with torch's
    default CPU SDPA (its fused flash node, which symgrad records too). add_bias_kv:
    RepeatBackward0 of bias_k/v and CatBackward0 onto k/v;
    add_zero_attn: CatBackward0 of the heads-first k/v with zeros (a None edge)."""
    same, batch_first, bias, need_weights, masks, batched, *options = case
    bias_kv, zero_attn = options[0] if options else (False, False)
    ours, theirs = _mha_pair(torch, "float64", batch_first=batch_first, bias=bias,
                             add_bias_kv=bias_kv, add_zero_attn=zero_attn)
    rng = np.random.default_rng(12)
    L, S, N, E = 4, 5, 3, 8

    def shaped(length):
        if not batched:
            return (length, E)
        return (N, length, E) if batch_first else (length, N, E)

    lengths = {"qkv": (L, L, L), "kv": (L, S, S), "all": (L, S, S)}[same]
    leaves, tleaves = _leaves(torch, rng, "float64", *(shaped(n) for n in lengths))
    if same == "qkv":
        leaves, tleaves = [leaves[0]] * 3, [tleaves[0]] * 3
    elif same == "kv":
        leaves, tleaves = leaves[:2] + leaves[1:2], tleaves[:2] + tleaves[1:2]
    src = lengths[1]
    kw, tkw = {"need_weights": need_weights}, {"need_weights": need_weights}
    if masks == "padding":
        pad = np.zeros((N, src) if batched else (src,), dtype=bool)
        pad[:, -1] = True
        kw["key_padding_mask"], tkw["key_padding_mask"] = sg.tensor(pad), torch.tensor(pad)
    elif masks != "none":
        m = np.triu(np.ones((L, src), dtype=bool), 1)
        m = m if masks == "bool" else np.where(m, -1.0, 0.5)
        kw["attn_mask"], tkw["attn_mask"] = sg.tensor(m), torch.tensor(m)
    out, _ = ours(*leaves, **kw)
    t_out, _ = theirs(*tleaves, **tkw)
    ours_graph, theirs_graph = _graph(out.grad_fn), _graph(t_out.grad_fn)
    assert ours_graph == theirs_graph
    names = [n for n, _, _ in ours_graph]
    path = same if batched else "all"  # unbatched input is unsqueezed: the identities go
    packed_cuts = {"qkv": ("SelectBackward0", 3), "kv": ("SplitWithSizesBackward0", 1 + bias),
                   "all": ("SplitBackward0", 1 + bias)}[path]
    assert names.count(packed_cuts[0]) == packed_cuts[1]
    assert not batched or ("SqueezeBackward1" in names) == (path != "all")
    assert names.count("RepeatBackward0") == 2 * bias_kv
    assert names.count("CatBackward0") == 2 * (bias_kv + zero_attn)
    assert_close(out, t_out, terms=CHAIN + 3 * E + S + 2, scale=magnitude(t_out, *tleaves))


def test_linear_on_non_contiguous_input_records_matmul_and_add_as_torch(torch):
    """at::linear folds only contiguous N-d input into one addmm; a transposed input (as
    MultiheadAttention's batch_first makes) goes through matmul, then the bias is added."""
    rng = np.random.default_rng(13)
    (x, w, b), (tx, tw, tb) = _leaves(torch, rng, "float64", (3, 4, 5), (2, 5), (2,))
    for transpose in (False, True):
        xi, txi = (x.transpose(0, 1), tx.transpose(0, 1)) if transpose else (x, tx)
        y = sg.nn.functional.linear(xi, w, b)
        ty = torch.nn.functional.linear(txi, tw, tb)
        assert _graph(y.grad_fn) == _graph(ty.grad_fn)
        assert ("AddBackward0" == y.grad_fn.name()) == transpose
        assert_close(y, ty, terms=5 + 1, scale=magnitude(ty, tx, tw, tb))
