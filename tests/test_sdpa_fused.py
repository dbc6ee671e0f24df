"""scaled_dot_product_attention records torch 2.13's fused CPU node where torch does.

On 4-D inputs torch records one ScaledDotProductFlashAttentionForCpuBackward0 (saving
query, key, value, output, logsumexp, attn_mask, dropout_p, is_causal, scale); elsewhere
(3-D inputs, dropout, a mask needing a gradient, value head dim != query's ...) its math
path. symgrad's op ``scaled_dot_product_flash_attention_for_cpu`` (symgrad/ops/attention.py)
must give the same node, saved names, values, logsumexp and gradients, on both CPU
backends (the numpy reference runs the tensor-op formulas, the cpu one its fused kernel).
"""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg
from symgrad.ops import OPS
from symgrad.ops.attention import FLASH_CPU

FLASH = "ScaledDotProductFlashAttentionForCpuBackward0"
SAVED = ["_saved_attn_mask", "_saved_dropout_p", "_saved_is_causal", "_saved_key",
         "_saved_logsumexp", "_saved_output", "_saved_query", "_saved_scale", "_saved_value"]


def _pair(torch, rng, dtype, shapes):
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    return ([sg.tensor(a, requires_grad=True) for a in arrays],
            [torch.tensor(a, requires_grad=True) for a in arrays])


def _mask(torch, rng, kind, shape, dtype):
    if kind is None:
        return None, None
    if kind == "bool":
        keep = rng.random(shape) > 0.4
        keep[..., 1, :] = False  # a fully masked row: zeros and a logsumexp of 0
        return sg.tensor(keep), torch.tensor(keep)
    m = rng.standard_normal(shape).astype(dtype)
    m[..., 2, :] = -np.inf  # fully masked by -inf
    return sg.tensor(m), torch.tensor(m)


CASES = [
    # id, q shape, k/v shape, mask kind, mask shape, kwargs
    ("plain", (2, 3, 5, 4), (2, 3, 6, 4), None, None, {}),
    ("causal", (2, 3, 5, 4), (2, 3, 5, 4), None, None, {"is_causal": True}),
    ("causal-L<S", (1, 2, 4, 3), (1, 2, 7, 3), None, None, {"is_causal": True}),
    ("causal-L>S", (1, 2, 6, 3), (1, 2, 4, 3), None, None, {"is_causal": True}),
    ("bool-mask", (2, 2, 5, 4), (2, 2, 6, 4), "bool", (5, 6), {}),
    ("float-mask-4d", (2, 2, 5, 4), (2, 2, 6, 4), "float", (2, 1, 5, 6), {}),
    ("scale", (2, 2, 5, 4), (2, 2, 6, 4), None, None, {"scale": 0.7}),
    ("negative-scale", (2, 2, 5, 4), (2, 2, 6, 4), "float", (5, 6), {"scale": -0.3}),
    ("gqa", (2, 4, 5, 4), (2, 2, 6, 4), None, None, {"enable_gqa": True}),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fused_node_values_saved_and_gradients_match_torch(torch, cpu_backend, dtype, case):
    _, qs, ks, kind, mshape, kw = case
    rng = np.random.default_rng(3)
    (q, k, v), (tq, tk, tv) = _pair(torch, rng, dtype, (qs, ks, ks))
    m, tm = _mask(torch, rng, kind, mshape, dtype)
    out = sg.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, **kw)
    t_out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, **kw)
    assert t_out.grad_fn.name() == FLASH  # the oracle: torch takes its fused path here
    assert out.grad_fn.name() == FLASH
    assert sorted(a for a in dir(out.grad_fn) if a.startswith("_saved_")) == SAVED
    assert [n is not None for n, _ in out.grad_fn.next_functions] == [True] * 3
    ours, theirs = out.grad_fn, t_out.grad_fn
    assert ours._saved_is_causal == theirs._saved_is_causal
    assert ours._saved_scale == theirs._saved_scale
    assert ours._saved_dropout_p == theirs._saved_dropout_p
    assert out.stride() == t_out.stride()
    E, S = qs[-1], ks[-2]
    # scores: a dot of E terms; softmax over S; the output a sum of S products
    terms = E + S + 8
    scale = magnitude(t_out, tq, tk, tv)
    assert_close(out, t_out, terms=terms, scale=scale)
    if theirs._saved_attn_mask is None:
        assert ours._saved_attn_mask is None
    else:
        np.testing.assert_array_equal(ours._saved_attn_mask.numpy(),
                                      theirs._saved_attn_mask.detach().numpy())
    lse, t_lse = ours._saved_logsumexp, theirs._saved_logsumexp
    assert tuple(lse.shape) == tuple(t_lse.shape) == qs[:3]
    assert_close(lse, t_lse, terms=terms, scale=magnitude(t_lse) + 1.0)
    g = rng.standard_normal(qs).astype(dtype)
    out.backward(sg.tensor(g))
    t_out.backward(torch.tensor(g))
    for a, b in ((q, tq), (k, tk), (v, tv)):
        assert_close(a.grad, b.grad, terms=3 * terms + E,
                     scale=magnitude(b.grad, t_out, tq, tk, tv) * (1 + abs(kw.get("scale", 1))))


def _math_case(torch, rng, name):
    """Inputs for which torch 2.13 takes the math path (no fused node)."""
    q4, k4 = (2, 2, 5, 4), (2, 2, 6, 4)
    if name == "3d":
        return (q4[1:], k4[1:], k4[1:]), {}
    if name == "dropout":
        return (q4, k4, k4), {"dropout_p": 0.5}
    if name == "value-head-dim":
        return (q4, k4, (2, 2, 6, 7)), {}
    if name == "mask-3d":
        return (q4, k4, k4), {"attn_mask": rng.standard_normal((2, 5, 6))}
    if name == "mask-requires-grad":
        return (q4, k4, k4), {"attn_mask": rng.standard_normal((5, 6)), "mask_grad": True}
    if name == "batch-broadcast":
        return (q4, (1, 2, 6, 4), (1, 2, 6, 4)), {}
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["3d", "dropout", "value-head-dim", "mask-3d",
                                  "mask-requires-grad", "batch-broadcast"])
def test_math_path_where_torch_takes_it(torch, name):
    rng = np.random.default_rng(5)
    shapes, kw = _math_case(torch, rng, name)
    (q, k, v), (tq, tk, tv) = _pair(torch, rng, "float64", shapes)
    kw_t, kw_s = dict(kw), dict(kw)
    if "attn_mask" in kw:
        grad = kw_t.pop("mask_grad", False)
        kw_s.pop("mask_grad", False)
        kw_t["attn_mask"] = torch.tensor(kw["attn_mask"], requires_grad=grad)
        kw_s["attn_mask"] = sg.tensor(kw["attn_mask"], requires_grad=grad)
    t_out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **kw_t)
    out = sg.nn.functional.scaled_dot_product_attention(q, k, v, **kw_s)
    assert t_out.grad_fn.name() != FLASH
    assert out.grad_fn.name() == t_out.grad_fn.name()


def test_head_dim_not_unit_strided_takes_the_math_path(torch):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((2, 2, 4, 5))
    q, tq = sg.tensor(a).transpose(-1, -2), torch.tensor(a).transpose(-1, -2)
    k = rng.standard_normal((2, 2, 6, 4))
    out = sg.nn.functional.scaled_dot_product_attention(q.requires_grad_(), sg.tensor(k),
                                                        sg.tensor(k))
    t_out = torch.nn.functional.scaled_dot_product_attention(
        tq.requires_grad_(), torch.tensor(k), torch.tensor(k))
    assert out.grad_fn.name() == t_out.grad_fn.name() != FLASH


def test_no_gradient_needed_records_nothing(torch):
    q = sg.randn(1, 2, 3, 4)
    assert sg.nn.functional.scaled_dot_product_attention(q, q, q).grad_fn is None


def test_fused_kernel_equals_the_tensor_op_formulas(cpu_backend):
    """The cpu backend's one-pass backward stands in for the registered formulas only while
    it gives what they give; the numpy reference runs the formulas."""
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s) for s in ((2, 4, 5, 3), (2, 2, 6, 3), (2, 2, 6, 3))]
    keep = rng.random((5, 6)) > 0.5
    spec = OPS[FLASH_CPU]
    formula = spec.grads["query"]
    grads = {}
    for fused in (True, False):
        q, k, v = (sg.tensor(a, requires_grad=True) for a in arrays)
        out = sg.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=sg.tensor(keep),
                                                            enable_gqa=True)
        if not fused:  # a formula replaced by an equal one: the engine runs the formulas
            spec.grads["query"] = lambda grad, query, key, value, output, logsumexp, \
                attn_mask, dropout_p, is_causal, scale: formula(
                    grad, query, key, value, output, logsumexp, attn_mask, dropout_p,
                    is_causal, scale)
        try:
            out.backward(sg.ones_like(out))
        finally:
            spec.grads["query"] = formula
        grads[fused] = [t.grad.numpy() for t in (q, k, v)]
    assert spec.grads.pristine
    for a, b in zip(grads[True], grads[False]):
        assert_close(a, b, terms=3 * (3 + 6 + 8), scale=magnitude(b, *arrays))


def test_planted_wrong_backward_is_caught_by_the_verifier():
    """A wrong rule (dq doubled) in the new op: sg.verify says so; the right one passes."""
    sg.manual_seed(0)
    q, k, v = (sg.randn(1, 2, 3, 2, dtype=sg.float64, requires_grad=True) for _ in range(3))
    out = sg.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert sg.verify(out.sum(), mode="exact").ok
    spec = OPS[FLASH_CPU]
    right = spec.grads["query"]
    spec.grads["query"] = lambda grad, query, key, value, output, logsumexp, attn_mask, \
        dropout_p, is_causal, scale: right(grad, query, key, value, output, logsumexp,
                                           attn_mask, dropout_p, is_causal, scale) * 2
    try:
        out = sg.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        for mode in ("exact", "local"):
            assert not sg.verify(out.sum(), mode=mode).ok, mode
    finally:
        spec.grads["query"] = right


def test_rule_audit_proves_the_rules_and_catches_a_wrong_one():
    """The rule audit: each backward equals the derivative of the op's SymPy meaning."""
    from symgrad.symbolic.audit import audit_rules

    (ok,) = audit_rules([FLASH_CPU])
    assert ok.status == "proved", ok
    spec = OPS[FLASH_CPU]
    right = spec.grads["key"]
    spec.grads["key"] = lambda grad, query, key, value, output, logsumexp, attn_mask, \
        dropout_p, is_causal, scale: right(grad, query, key, value, output, logsumexp,
                                           attn_mask, dropout_p, is_causal, scale) * 1.01
    try:
        (bad,) = audit_rules([FLASH_CPU])
    finally:
        spec.grads["key"] = right
    assert bad.status == "failed", bad
