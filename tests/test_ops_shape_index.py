"""PyTorch-oracle tests for the complete op set (issue 3): shape ops, batched matmul,
reductions with indices, softmax family, clamp/where/cat/stack and indexing.

For every case: values, first gradients, second derivatives (create_graph) and the whole
recorded graph (grad_fn names, next_functions structure, every ``_saved_*`` name and
value) must match torch, on every registered CPU backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from _oracle import assert_close, run_grads
from _tolerance import magnitude

import symgrad as sg

R = np.random.default_rng(0)


def _distinct(*shape):
    """Values with no ties (max/min/clamp kinks never sit on an input)."""
    n = int(np.prod(shape))
    return (R.permutation(n) * 0.37 - n * 0.15 + R.uniform(0, 0.05, n)).reshape(shape)


def _ties(*shape):
    return np.round(R.uniform(-1, 1, size=shape) * 1.5).astype(np.float64)


D = _distinct
CASES = [
    # shape ops, with negative dims and size-1 / empty dims
    ("transpose_neg", lambda L, x: x.transpose(-1, 0), [D(2, 3, 4)]),
    ("mT", lambda L, x: x.mT, [D(2, 3, 4)]),
    ("T", lambda L, x: x.T, [D(3, 4)]),
    ("permute_neg", lambda L, x: x.permute(-1, 0, 1), [D(2, 3, 4)]),
    ("flatten_mid", lambda L, x: x.flatten(1), [D(2, 3, 4)]),
    ("flatten_1d", lambda L, x: x.flatten() * 2, [D(3)]),
    ("flatten_0d", lambda L, x: x.flatten(), [np.array(1.5)]),
    ("flatten_nc", lambda L, x: x.t().flatten(), [D(3, 4)]),
    ("reshape_nc", lambda L, x: x.t().reshape(12), [D(3, 4)]),
    ("reshape_nc_viewable", lambda L, x: x.t().reshape(4, 3, 1), [D(3, 4)]),
    ("reshape_expanded", lambda L, x: x.expand(2, 3, 4).reshape(6, 4), [D(3, 4)]),
    ("reshape_slice_view", lambda L, x: x[:, 1:3].reshape(6), [D(3, 4)]),
    ("reshape_same", lambda L, x: x.reshape(3, 4), [D(3, 4)]),
    ("reshape_empty", lambda L, x: x.reshape(0, 2, 3), [np.zeros((2, 0, 3))]),
    ("contiguous", lambda L, x: x.t().contiguous(), [D(3, 4)]),
    ("squeeze_all", lambda L, x: x.squeeze(), [D(3, 1, 4, 1)]),
    ("squeeze_dim_neg", lambda L, x: x.squeeze(-1), [D(3, 4, 1)]),
    ("squeeze_noop", lambda L, x: x.squeeze(0), [D(3, 4)]),
    ("squeeze_dims", lambda L, x: x.squeeze((0, -1)), [D(1, 3, 1)]),
    ("unsqueeze_neg", lambda L, x: x.unsqueeze(-1), [D(3)]),
    ("unsqueeze_0d", lambda L, x: x.unsqueeze(0), [np.array(2.0)]),
    ("expand_neg1", lambda L, x: x.expand(2, -1, 4), [D(3, 1)]),
    ("expand_empty", lambda L, x: x.expand(0, 3), [D(3)]),
    ("sum_neg_dims", lambda L, x: x.sum((0, -1)), [D(2, 3, 4)]),
    ("mean_neg_keepdim", lambda L, x: x.mean(-2, keepdim=True), [D(2, 3, 4)]),
    ("sum_empty", lambda L, x: x.sum(0), [np.zeros((0, 3))]),
    ("to_float_double", lambda L, x: x.double().float() * 1.0, [D(3).astype(np.float32)]),
    ("rdiv", lambda L, x: 2 / x, [D(3) + 10]),
    # matmul family
    ("bmm", lambda L, x, y: L.bmm(x, y), [D(2, 3, 4), D(2, 4, 5)]),
    ("matmul_3d_3d", lambda L, x, y: x @ y, [D(2, 3, 4), D(2, 4, 5)]),
    ("matmul_3d_2d", lambda L, x, y: x @ y, [D(2, 3, 4), D(4, 5)]),
    ("matmul_3d_1d", lambda L, x, y: x @ y, [D(2, 3, 4), D(4)]),
    ("matmul_2d_3d", lambda L, x, y: x @ y, [D(5, 3), D(2, 3, 4)]),
    ("matmul_1d_3d", lambda L, x, y: x @ y, [D(3), D(2, 3, 4)]),
    ("matmul_4d_3d_bcast", lambda L, x, y: x @ y, [D(2, 1, 3, 4), D(5, 4, 2)]),
    ("matmul_3d_batch1", lambda L, x, y: x @ y, [D(1, 3, 4), D(2, 4, 5)]),
    ("matmul_4d_1d", lambda L, x, y: x @ y, [D(2, 2, 3, 4), D(4)]),
    ("matmul_transposed_batch", lambda L, x, y: x.transpose(0, 1) @ y, [D(3, 2, 4), D(4, 2)]),
    # max / min
    ("max_all", lambda L, x: x.max(), [D(3, 4)]),
    ("min_all", lambda L, x: x.min(), [D(3, 4)]),
    ("max_all_ties", lambda L, x: x.max(), [np.array([[1.0, 3.0], [3.0, 3.0]])]),
    ("min_all_ties", lambda L, x: x.min(), [np.array([1.0, -2.0, -2.0])]),
    ("max_dim", lambda L, x: x.max(1), [D(3, 4)]),
    ("max_dim_neg_keepdim", lambda L, x: x.max(-1, keepdim=True), [D(2, 3, 4)]),
    ("min_dim", lambda L, x: x.min(0), [D(3, 4)]),
    ("max_dim_ties", lambda L, x: x.max(1), [np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])]),
    ("max_dim_size1", lambda L, x: x.max(1).values, [D(3, 1)]),
    ("max_dim_0d", lambda L, x: x.max(0), [np.array(2.5)]),
    ("max_dim_empty_other", lambda L, x: x.max(1), [np.zeros((0, 3))]),
    ("maximum", lambda L, x, y: L.maximum(x, y), [D(3, 4), D(4)]),
    ("minimum_ties", lambda L, x, y: L.minimum(x, y), [np.array([1.0, 2.0, 3.0]),
                                                       np.array([1.0, 0.0, 3.0])]),
    ("max_binary", lambda L, x, y: L.max(x, y), [D(3), D(3)]),
    # softmax family
    ("softmax", lambda L, x: x.softmax(1), [D(3, 4)]),
    ("softmax_neg", lambda L, x: x.softmax(-1), [D(2, 3, 4)]),
    ("softmax_big", lambda L, x: L.softmax(x * 200, 0), [D(5)]),
    ("softmax_0d", lambda L, x: x.softmax(0), [np.array(1.0)]),
    ("softmax_dtype", lambda L, x: x.softmax(0, dtype=L.float64), [D(3).astype(np.float32)]),
    ("log_softmax", lambda L, x: x.log_softmax(1), [D(3, 4)]),
    ("log_softmax_neg", lambda L, x: L.log_softmax(x * 100, -1), [D(2, 3)]),
    ("logsumexp", lambda L, x: x.logsumexp(1), [D(3, 4)]),
    ("logsumexp_neg_keepdim", lambda L, x: x.logsumexp(-1, keepdim=True), [D(2, 3)]),
    ("logsumexp_dims", lambda L, x: x.logsumexp((0, -1)), [D(2, 3, 4)]),
    ("logsumexp_big", lambda L, x: (x * 500).logsumexp(0), [D(4)]),
    ("logsumexp_0d", lambda L, x: x.logsumexp(0), [np.array(0.5)]),
    ("softmax_empty", lambda L, x: x.softmax(1), [np.zeros((2, 0))]),
    ("logsumexp_empty", lambda L, x: x.logsumexp(1), [np.zeros((2, 0))]),
    # clamp / where / cat / stack
    ("clamp", lambda L, x: x.clamp(-0.5, 0.5), [D(3, 4) / 10]),
    ("clamp_min_only", lambda L, x: x.clamp(min=0), [D(3, 4)]),
    ("clamp_max_only", lambda L, x: x.clamp(max=0.2), [D(3, 4)]),
    ("clamp_min_fn", lambda L, x: x.clamp_min(0.1), [D(5)]),
    ("clamp_max_fn", lambda L, x: L.clamp_max(x, 0.1), [D(5)]),
    ("clamp_at_bounds", lambda L, x: x.clamp(0, 1), [np.array([0.0, 1.0, 0.5, 2.0, -1.0])]),
    ("clamp_tensor", lambda L, x, lo, hi: x.clamp(lo, hi), [D(3, 4), D(4) - 1, D(3, 1) + 1]),
    ("clamp_tensor_min", lambda L, x, lo: L.clamp(x, min=lo), [D(3, 4), D(4)]),
    ("where", lambda L, x, y: L.where(x > 0, x, y), [D(3, 4), D(4)]),
    ("where_scalar", lambda L, x: L.where(x > 0, x, 0.0), [D(3, 4)]),
    ("cat", lambda L, x, y: L.cat([x, y]), [D(2, 3), D(4, 3)]),
    ("cat_neg", lambda L, x, y, z: L.cat([x, y, z], -1), [D(2, 3), D(2, 1), D(2, 2)]),
    ("cat_legacy_empty", lambda L, x, y: L.cat([x, y, x]), [D(2, 3), np.zeros(0)]),
    ("cat_empty_dim", lambda L, x, y: L.cat((x, y), 1), [np.zeros((2, 0)), D(2, 2)]),
    ("cat_one", lambda L, x: L.cat([x]), [D(2, 3)]),
    ("cat_promote", lambda L, x, y: L.cat([x, y]), [D(2, 3).astype(np.float32), D(1, 3)]),
    ("stack", lambda L, x, y: L.stack([x, y]), [D(2, 3), D(2, 3)]),
    ("stack_neg", lambda L, x, y, z: L.stack([x, y, z], -1), [D(3), D(3), D(3)]),
    ("stack_0d", lambda L, x, y: L.stack([x, y]), [np.array(1.0), np.array(2.0)]),
    # indexing
    ("select_int", lambda L, x: x[1], [D(3, 4)]),
    ("select_neg", lambda L, x: x[-1], [D(3, 4)]),
    ("select_1d", lambda L, x: x[2], [D(4)]),
    ("select_two", lambda L, x: x[0, -2], [D(3, 4)]),
    ("select_fn", lambda L, x: x.select(-1, -1), [D(3, 4)]),
    ("slice", lambda L, x: x[:, 1:3], [D(3, 4)]),
    ("slice_step", lambda L, x: x[::2, 1::2], [D(5, 4)]),
    ("slice_neg_start", lambda L, x: x[-2:], [D(3, 4)]),
    ("slice_neg_stop", lambda L, x: x[:, :-1], [D(3, 4)]),
    ("slice_full_alone", lambda L, x: x[:], [D(3, 4)]),
    ("slice_out_of_range", lambda L, x: x[1:100, -100:2], [D(3, 4)]),
    ("slice_empty", lambda L, x: x[2:1], [D(3, 4)]),
    ("narrow", lambda L, x: x.narrow(1, 1, 2), [D(3, 4)]),
    ("ellipsis", lambda L, x: x[...], [D(3, 4)]),
    ("full_tuple", lambda L, x: x[:, :], [D(3, 4)]),
    ("two_ellipsis", lambda L, x: x[..., ...], [D(3, 4)]),
    ("ellipsis_none", lambda L, x: x[..., None, 0], [D(2, 3, 4)]),
    ("ellipsis_int", lambda L, x: x[..., 1], [D(2, 3, 4)]),
    ("none", lambda L, x: x[None], [D(3, 4)]),
    ("none_mixed", lambda L, x: x[None, :, None, 1], [D(3, 4)]),
    ("int_tensor_0d", lambda L, x: x[L.tensor(1)], [D(3, 4)]),
    ("list_index", lambda L, x: x[[0, 2]], [D(3, 4)]),
    ("list_repeated", lambda L, x: x[[0, 2, 0, 0]], [D(3, 4)]),
    ("list_neg", lambda L, x: x[[-1, 0]], [D(3, 4)]),
    ("tensor_2d_index", lambda L, x: x[:, L.tensor([[0, 1], [3, 3]])], [D(3, 4)]),
    ("two_lists", lambda L, x: x[[0, 1, 1], [1, 2, 2]], [D(3, 4)]),
    ("slice_then_list", lambda L, x: x[1:, [0, 1]], [D(3, 4)]),
    ("int_then_list", lambda L, x: x[1, [0, 3, 3]], [D(3, 4)]),
    ("split_adv", lambda L, x: x[[0, 1], :, [1, 0]], [D(2, 3, 4)]),
    ("int_slice_list", lambda L, x: x[0, :, [0, 1]], [D(2, 3, 4)]),
    ("mask", lambda L, x: x[x > 0], [D(3, 4)]),
    ("mask_rows", lambda L, x: x[L.tensor([True, False, True])], [D(3, 4)]),
    ("mask_cols", lambda L, x: x[:, L.tensor([True, False, True, True])], [D(3, 4)]),
    ("mask_none_true", lambda L, x: x[x > 100], [D(3, 4)]),
    ("bool_true", lambda L, x: x[True], [D(3, 4)]),
    ("bool_false", lambda L, x: x[False], [D(3, 4)]),
    ("empty_list", lambda L, x: x[[]], [D(3, 4)]),
    ("chained", lambda L, x: x[1:][0][[1, 1]], [D(3, 4)]),
]


def _ids(cases):
    return [c[0] for c in cases]


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_values_grads_and_graph_match_torch(case, torch, cpu_backend):
    _, fn, arrays = case
    ours, g_ours, _ = run_grads(sg, fn, arrays)
    sig_ours = run_grads.signature
    theirs, g_theirs, _ = run_grads(torch, fn, arrays)
    assert sig_ours == run_grads.signature
    assert ours.dtype.name == str(theirs.dtype).replace("torch.", "")
    terms = run_grads.terms
    assert_close(ours, theirs, terms=terms, inputs=arrays)
    assert (g_ours is None) == (g_theirs is None)
    for a, b in zip(g_ours or (), g_theirs or ()):
        assert_close(a, b, terms=terms, inputs=arrays)
    full_ours, full_theirs = fn(sg, *[sg.tensor(a) for a in arrays]), fn(torch, *[
        torch.tensor(a) for a in arrays])
    if isinstance(full_theirs, tuple):  # named tuple: values, indices
        assert full_ours.values is full_ours[0] and full_ours.indices is full_ours[1]
        np.testing.assert_array_equal(full_ours.indices.numpy(), full_theirs.indices.numpy())


SECOND = [c for c in CASES if c[0] not in ("flatten_0d", "reshape_empty", "sum_empty")]

# Cases whose input is scaled by k before the op: d/dx sum(g * g) = sum 2 g dg/dx carries
# k twice more, so its terms are of size 2 |g| k^2 while the result, where softmax
# saturates (p (1 - p) ~ 1e-16), is tiny: the terms' magnitude is the scale, not the result.
INPUT_SCALE = {"log_softmax_neg": 100.0}


def _hessian_scale(case, g, arrays):
    k = INPUT_SCALE.get(case[0])
    if k is None or g is None:
        return None  # the default: the magnitude of the result and of the inputs
    return max(magnitude(*arrays), 2 * magnitude(g) * k * k)


@pytest.mark.parametrize("case", SECOND, ids=_ids(SECOND))
def test_second_derivatives_match_torch(case, torch):
    _, fn, arrays = case
    _, g_ours, h_ours = run_grads(sg, fn, arrays, create_graph=True)
    _, g_theirs, h_theirs = run_grads(torch, fn, arrays, create_graph=True)
    terms = run_grads.terms
    for a, b in zip(g_ours or (), g_theirs or ()):
        assert_close(a, b, terms=terms, inputs=arrays)
    if h_ours is None or h_theirs is None:  # no second-order dependence: all zeros
        for h in (h_ours or h_theirs or ()):
            assert_close(h, None)
        return
    for a, b, g in zip(h_ours, h_theirs, g_theirs):
        assert_close(a, b, terms=terms, inputs=arrays, scale=_hessian_scale(case, g, arrays))


CAT_LAYOUTS = [
    # shapes before the permutation, permutation of each, cat dim
    ([(4, 6, 3), (4, 6, 3)], [(1, 0, 2), (1, 0, 2)], 1),
    ([(4, 6, 3), (6, 2, 3)], [(1, 0, 2), (0, 1, 2)], 1),
    ([(3, 5), (3, 5)], [(1, 0), (1, 0)], 0),
    ([(2, 4, 5, 3), (2, 4, 5, 3)], [(0, 3, 1, 2), (0, 3, 1, 2)], 1),
    ([(2, 4, 5, 3), (2, 3, 4, 5)], [(0, 3, 1, 2), (0, 1, 2, 3)], 0),
    ([(2, 3, 4, 5, 2), (2, 3, 4, 5, 2)], [(0, 4, 1, 2, 3), (0, 4, 1, 2, 3)], 2),
]


@pytest.mark.parametrize("case", CAT_LAYOUTS, ids=range(len(CAT_LAYOUTS)))
def test_cat_output_layout_follows_torch(case, torch, cpu_backend):
    """torch.cat writes a contiguous result unless every 4-D/5-D input is channels-last
    (then channels-last), whatever the first input's strides: later views (MHA's heads-first
    k and v after add_zero_attn) record ViewBackward0 or ReshapeAliasBackward0 from it."""
    shapes, perms, dim = case
    arrays = [R.standard_normal(s) for s in shapes]
    ours = sg.cat([sg.tensor(a).permute(*p) for a, p in zip(arrays, perms)], dim)
    theirs = torch.cat([torch.tensor(a).permute(*p) for a, p in zip(arrays, perms)], dim)
    assert ours.stride() == theirs.stride()
    assert ours.is_contiguous() == theirs.is_contiguous()
    assert_close(ours, theirs, terms=1)


STACK_LAYOUTS = [([(3, 5), (3, 5)], [(1, 0), (1, 0)], d) for d in (0, 1, 2, -1)] + [
    ([(4, 6, 3), (6, 4, 3)], [(1, 0, 2), (0, 1, 2)], 1)]


@pytest.mark.parametrize("case", STACK_LAYOUTS, ids=range(len(STACK_LAYOUTS)))
def test_stack_output_layout_follows_torch(case, torch, cpu_backend):
    """torch.stack of transposed inputs is contiguous, so a later reshape records
    ViewBackward0 (numpy's stack would follow the inputs' strides: UnsafeViewBackward0)."""
    shapes, perms, dim = case
    arrays = [R.standard_normal(s) for s in shapes]
    ours = sg.stack([sg.tensor(a, requires_grad=True).permute(*p)
                     for a, p in zip(arrays, perms)], dim)
    theirs = torch.stack([torch.tensor(a, requires_grad=True).permute(*p)
                          for a, p in zip(arrays, perms)], dim)
    assert ours.stride() == theirs.stride()
    assert ours.reshape(-1).grad_fn.name() == theirs.reshape(-1).grad_fn.name()
    assert_close(ours, theirs, terms=1)
