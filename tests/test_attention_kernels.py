"""The cpu backend's fused-attention kernels (kernels.attn_*) against the NumPy path and torch.

CpuBackend.flash_attention / flash_attention_backward run batched BLAS around Numba softmax
passes; attention_numpy.py is the path they replace (and fall back to). Shapes here are
chosen to break what a kernel could get wrong: T not a multiple of a vector width, an odd
head dim, grouped-query heads, strided (transposed) inputs as a GPT passes them, masks
with -inf rows, causal with L != S, a row with NaN, float64, and the parallel twin.
"""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

from symgrad.backends import attention_numpy as ref
from symgrad.backends.cpu import backend as cpu
from symgrad.backends.cpu.backend import CpuBackend

# id, (B, H, Hk, L, S, E), causal, mask shape (None: no mask), scale, strided inputs
CASES = [
    ("odd-causal", (2, 3, 3, 7, 7, 5), True, None, None, False),
    ("gqa-strided-mask", (2, 4, 2, 9, 11, 6), False, (9, 11), None, True),
    ("causal-L>S-mask", (1, 2, 2, 6, 4, 3), True, (1, 2, 6, 4), -0.3, True),
    ("causal-L<S", (2, 2, 1, 5, 8, 4), True, None, 0.7, False),
    ("gpt-shape", (2, 4, 4, 32, 32, 16), True, None, None, True),
]


def _qkv(rng, dims, dtype, strided):
    b, h, hk, L, S, e = dims

    def make(heads, n):
        if strided:  # (B, T, H, E) memory seen as (B, H, T, E), as a GPT's split heads
            return rng.standard_normal((b, n, heads, e)).astype(dtype).transpose(0, 2, 1, 3)
        return rng.standard_normal((b, heads, n, e)).astype(dtype)

    return make(h, L), make(hk, S), make(hk, S)


def _mask(rng, shape, dtype):
    if shape is None:
        return None
    m = rng.standard_normal(shape).astype(dtype)
    m[..., 1, :] = -np.inf  # a fully masked row: output 0, logsumexp 0
    return m


def _torch(torch, q, k, v, mask, causal, scale, g):
    """torch's fused CPU op (its kernel, not the math path) with gradients; GQA heads are
    repeated before the call (autograd sums them back)."""
    tq, tk, tv = (torch.tensor(np.ascontiguousarray(a), requires_grad=True) for a in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    kk, vv = (x.repeat_interleave(rep, dim=1) for x in (tk, tv))
    tm = None
    if mask is not None:
        full = np.broadcast_to(mask, q.shape[:3] + k.shape[2:3]).copy()
        if causal:  # torch's kernel mishandles both at once (sdpa refuses them): fold
            L, S = full.shape[-2:]
            full[..., np.arange(L)[:, None] < np.arange(S)] = -np.inf
            causal = False
        tm = torch.tensor(full)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        tq, kk, vv, 0.0, causal, attn_mask=tm, scale=scale)
    out.backward(torch.tensor(g))
    return out, lse, tq.grad, tk.grad, tv.grad


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernels_match_the_numpy_path_and_torch(torch, dtype, case):
    _, dims, causal, mshape, scale, strided = case
    rng = np.random.default_rng(11)
    q, k, v = _qkv(rng, dims, dtype, strided)
    mask = _mask(rng, mshape, dtype)
    out, lse = CpuBackend.flash_attention(q, k, v, mask, causal, scale)
    r_out, r_lse = ref.flash_attention(q, k, v, mask, causal, scale)
    assert out.dtype == lse.dtype == np.dtype(dtype)
    assert out.strides == r_out.strides  # the query's memory order, as torch's empty_like
    g = rng.standard_normal(out.shape).astype(dtype)
    t_out, t_lse, *t_grads = _torch(torch, q, k, v, mask, causal, scale, g)
    E, S = dims[5], dims[4]
    terms = E + S + 8  # a dot of E, a softmax over S, a sum of S products
    for expected in (r_out, t_out):
        assert_close(out, expected, terms=terms, scale=magnitude(expected, q, k, v))
    for expected in (r_lse, t_lse):
        assert_close(lse, expected, terms=terms, scale=magnitude(expected) + 1.0)
    if mshape is not None:  # the -inf row: zeros and a logsumexp of 0 exactly
        assert not out[:, :, 1].any() and not lse[:, :, 1].any()
    grads = CpuBackend.flash_attention_backward(g, (True, True, True), mask, 0.0, causal, k, lse,
                                                out, q, scale, v)
    r_grads = ref.flash_attention_backward(g, (True, True, True), mask, 0.0, causal, k, lse,
                                           out, q, scale, v)
    f = 1 + abs(scale or 1)
    for a, b, c in zip(grads, r_grads, t_grads):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert_close(a, b, terms=3 * terms + E, scale=magnitude(b, out, q, k, v) * f)
        assert_close(a, c, terms=3 * terms + E, scale=magnitude(c, out, q, k, v) * f)


@pytest.mark.parametrize("scale", [0.5, -0.5])
def test_scores_spanning_far_more_than_exp_s_range(torch, scale):
    """Scores spread over hundreds: only subtracting the true row max keeps exp finite
    (the kernel takes the max on the raw q k^T where that is exact: no mask, scale > 0).
    The oracle is the NumPy path, and torch for scale > 0 (torch 2.13's kernel overflows
    to NaN here with a negative scale)."""
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, (1, 2, 2, 6, 7, 4), np.float32, True)
    q = q * np.float32(40)
    out, lse = CpuBackend.flash_attention(q, k, v, None, True, scale)
    g = rng.standard_normal(out.shape).astype(np.float32)
    grads = CpuBackend.flash_attention_backward(g, (True,) * 3, None, 0.0, True, k, lse, out,
                                                q, scale, v)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    r_out, r_lse = ref.flash_attention(q, k, v, None, True, scale)
    want = [(r_out, r_lse, ref.flash_attention_backward(g, (True,) * 3, None, 0.0, True, k,
                                                          r_lse, r_out, q, scale, v))]
    if scale > 0:
        t_out, t_lse, *t_grads = _torch(torch, q, k, v, None, True, scale, g)
        want.append((t_out, t_lse, t_grads))
    for w_out, w_lse, w_grads in want:
        assert_close(out, w_out, terms=4 + 7 + 8, scale=magnitude(w_out, v))
        assert_close(lse, w_lse, terms=4 + 7 + 8, scale=magnitude(w_lse) + 1.0)
        for a, c in zip(grads, w_grads):
            assert_close(a, c, terms=3 * 19 + 4, scale=magnitude(c, out, q, k, v) * 1.5)


def test_only_the_needed_gradients():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, (1, 2, 2, 5, 5, 3), np.float32, False)
    out, lse = CpuBackend.flash_attention(q, k, v, None, True, None)
    g = np.ones_like(out)
    full = CpuBackend.flash_attention_backward(g, (True, True, True), None, 0.0, True, k, lse,
                                               out, q, None, v)
    for needed in ((True, False, False), (False, True, False), (False, False, True)):
        got = CpuBackend.flash_attention_backward(g, needed, None, 0.0, True, k, lse, out, q,
                                                  None, v)
        for want, a, b in zip(needed, got, full):
            assert (a is None) == (not want)
            if want:
                np.testing.assert_array_equal(a, b)


def test_value_head_dim_differs_from_the_query_s():
    """Ev != E (the op allows it; torch's sdpa sends it down its math path): checked
    against the formulas in float64."""
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((2, 2, 4, 3)), rng.standard_normal((2, 2, 6, 3))
    v = rng.standard_normal((2, 2, 6, 7))
    out, lse = CpuBackend.flash_attention(q, k, v, None, False, None)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(3)
    want_lse = np.log(np.exp(s).sum(-1))
    want = np.exp(s - want_lse[..., None]) @ v
    assert out.shape == (2, 2, 4, 7)
    assert_close(out, want, terms=3 + 6 + 8, scale=magnitude(want, v))
    assert_close(lse, want_lse, terms=3 + 6 + 8, scale=magnitude(want_lse) + 1.0)
    dq, dk, dv = CpuBackend.flash_attention_backward(np.ones_like(out), (True,) * 3, None, 0.0,
                                                     False, k, lse, out, q, None, v)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    p = np.exp(s - want_lse[..., None])
    assert_close(dv, p.swapaxes(-1, -2) @ np.ones_like(out), terms=8, scale=4.0)


def test_nan_rows_and_fully_masked_rows_as_the_numpy_path():
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, (1, 2, 2, 5, 6, 4), np.float32, False)
    q[0, 0, 2, 1] = np.nan  # a row of NaN scores
    mask = np.zeros((5, 6), np.float32)
    mask[3] = -np.inf
    mask[4, :5] = -np.inf
    k[0, 1, 5, 0] = np.nan  # head 1: NaN in the one unmasked column of row 4 only
    out, lse = CpuBackend.flash_attention(q, k, v, mask, False, None)
    r_out, r_lse = ref.flash_attention(q, k, v, mask, False, None)
    assert np.isnan(out[0, 0, 2]).all() and np.isnan(lse[0, 0, 2])
    assert not out[0, 0, 3].any() and not lse[0, 0, 3].any()  # dead: zeros, logsumexp 0
    assert np.isnan(out[0, 1, 3:]).all()  # NaN + -inf is NaN: not a dead row
    assert np.isnan(lse).sum() == np.isnan(r_lse).sum()
    assert_close(out, r_out, terms=20, scale=magnitude(r_out))  # NaN where the path has NaN
    assert_close(lse, r_lse, terms=20, scale=magnitude(r_lse) + 1.0)
    g = np.ones_like(out)
    got = CpuBackend.flash_attention_backward(g, (True,) * 3, mask, 0.0, False, k, lse, out, q,
                                              None, v)
    want = ref.flash_attention_backward(g, (True,) * 3, mask, 0.0, False, k, lse, out, q, None, v)
    for a, b in zip(got, want):
        assert_close(a, b, terms=60, scale=magnitude(b, q, k, v))


def test_parallel_twin_gives_the_serial_bits(monkeypatch):
    """One row per task, nothing summed across tasks: the same bits at any thread count."""
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, (2, 4, 2, 9, 9, 5), np.float32, True)
    mask = _mask(rng, (9, 9), np.float32)
    runs = []
    for limit in (cpu.PARALLEL_MIN, 0):
        monkeypatch.setattr(cpu, "PARALLEL_MIN", limit)
        out, lse = CpuBackend.flash_attention(q, k, v, mask, False, None)
        grads = CpuBackend.flash_attention_backward(np.ones_like(out), (True,) * 3, mask, 0.0,
                                                    False, k, lse, out, q, None, v)
        runs.append((out, lse) + tuple(grads))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("what", ["float16", "bool-mask", "mask-dtype", "mask-shape",
                                  "heads", "empty"])
def test_kernels_decline_what_they_do_not_cover(what):
    """_attn_shapes turns away anything the kernels would misread; the NumPy path (or the
    op's generic lowering, where it declines too) then runs."""
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, (1, 4, 2, 3, 5, 2), np.float32, False)
    mask = None
    if what == "float16":
        q, k, v = (a.astype(np.float16) for a in (q, k, v))
    elif what == "bool-mask":
        mask = np.ones((3, 5), bool)
    elif what == "mask-dtype":
        mask = np.zeros((3, 5), np.float64)
    elif what == "mask-shape":
        mask = np.zeros((4, 5), np.float32)
    elif what == "heads":
        k, v = k[:, :1].repeat(3, 1), v[:, :1].repeat(3, 1)  # 3 key heads for 4 query heads
    else:
        q = q[:, :, :0]
    assert cpu._attn_shapes((q, k, v), mask) is None


def _logits_calls(monkeypatch) -> list:
    """Records each backward that recomputed the probabilities (kernel attn_logits)."""
    calls = []
    real = cpu._run
    monkeypatch.setattr(cpu, "_run", lambda name, *a: (
        calls.append(name) if name == "attn_logits" else None, real(name, *a))[1])
    return calls


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_backward_takes_the_forwards_probabilities_only_from_that_forward(monkeypatch, dtype):
    """The forward's probabilities are kept for its own backward (the same logsumexp,
    query, key, value and mask objects, causal flag and scale); any other call recomputes
    them from the logsumexp. Both agree to rounding with the NumPy path."""
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, (2, 4, 2, 6, 7, 3), dtype, True)
    mask = _mask(rng, (6, 7), dtype)
    out, lse = CpuBackend.flash_attention(q, k, v, mask, False, 0.6)
    g = rng.standard_normal(out.shape).astype(dtype)
    calls = _logits_calls(monkeypatch)
    kept = CpuBackend.flash_attention_backward(g, (True,) * 3, mask, 0.0, False, k, lse, out, q,
                                               0.6, v)
    assert calls == []
    want = ref.flash_attention_backward(g, (True,) * 3, mask, 0.0, False, k, lse, out, q, 0.6,
                                        v)
    others = [(q.copy(), k, v, mask, 0.6), (q, k.copy(), v, mask, 0.6),
              (q, k, v.copy(), mask, 0.6), (q, k, v, mask.copy(), 0.6), (q, k, v, mask, None)]
    for i, (q2, k2, v2, m2, scale) in enumerate(others):
        got = CpuBackend.flash_attention_backward(g, (True,) * 3, m2, 0.0, False, k2, lse, out,
                                                  q2, scale, v2)
        assert calls == ["attn_logits"] * (i + 1)
        if scale is not None:
            for a, b, c in zip(got, kept, want):
                assert_close(a, c, terms=60, scale=magnitude(c, q, k, v))
                assert_close(b, c, terms=60, scale=magnitude(c, q, k, v))
    lse2 = lse.copy()  # another logsumexp object: recomputed
    CpuBackend.flash_attention_backward(g, (True,) * 3, mask, 0.0, False, k, lse2, out, q,
                                        0.6, v)
    assert len(calls) == len(others) + 1


def test_kept_probabilities_go_with_the_graph_and_stay_small(monkeypatch):
    """No reference cycle keeps them (gc off): dropping the graph drops them; a retained
    graph's second backward gives the first one's gradients; past KEEP_PROBS_MAX nothing is
    kept."""
    import gc

    import symgrad as sg

    F = sg.nn.functional
    gc.disable()
    try:
        before = len(cpu._KEPT)
        q, k, v = (sg.randn(2, 3, 8, 4, requires_grad=True) for _ in range(3))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert len(cpu._KEPT) == before + 1
        out.sum().backward(retain_graph=True)
        first = [t.grad.numpy().copy() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        out.sum().backward()
        for t, a in zip((q, k, v), first):
            np.testing.assert_array_equal(t.grad.numpy(), a)
        del out
        assert len(cpu._KEPT) == before
        monkeypatch.setattr(cpu, "KEEP_PROBS_MAX", 2 * 3 * 8 * 8 * 4 - 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert len(cpu._KEPT) == before
        calls = _logits_calls(monkeypatch)
        out.sum().backward()
        assert calls == ["attn_logits"]
    finally:
        gc.enable()
