"""Issue 21 tensor functions against torch 2.13: values, gradients (and second derivatives
for a few), grad_fn names, saved operand names, error wording, and the SymPy verifier.

Each case is ``fn(L, x)`` run on ``L = symgrad`` and ``L = torch`` over the same float
input; the loss is ``sum(out * weights)`` with fixed weights so every gradient element
is exercised.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg


def _idx(L, a):
    return L.tensor(np.asarray(a, dtype=np.int64))


CASES = {
    "gather_dim1": ((3, 4), lambda L, x: x.gather(1, _idx(L, [[0, 3], [1, 1], [2, 0]]))),
    "gather_dim0": ((3, 4), lambda L, x: L.gather(x, 0, _idx(L, [[0, 2, 1, 0]]))),
    "gather_neg": ((2, 3, 2), lambda L, x: x.gather(-1, _idx(L, np.zeros((2, 3, 1))))),
    "scatter_src": ((3, 4), lambda L, x: x.scatter(0, _idx(L, [[0, 1, 2, 0], [1, 0, 0, 2]]),
                                                   x[:2] * 2)),
    "scatter_value": ((3, 4), lambda L, x: x.scatter(1, _idx(L, [[0], [3], [1]]), 1.5)),
    "scatter_add": ((3, 4), lambda L, x: x.scatter_add(0, _idx(L, [[0, 1, 2, 0], [0, 0, 2, 2]]),
                                                       x[1:] * 3)),
    "scatter_add_fn": ((4,), lambda L, x: L.scatter_add(x, 0, _idx(L, [1, 1, 3]), x[:3])),
    "index_select": ((3, 4), lambda L, x: x.index_select(1, _idx(L, [0, 2, 2]))),
    "index_select_fn": ((3, 4), lambda L, x: L.index_select(x, 0, _idx(L, [2, 0]))),
    "index_select_0d_index": ((3, 4), lambda L, x: x.index_select(0, _idx(L, 1))),
    "index_add": ((3, 4), lambda L, x: x.index_add(1, _idx(L, [0, 2, 0]), x[:, 1:] * 1,
                                                   alpha=2)),
    "index_add_fn": ((3, 4), lambda L, x: L.index_add(x, 0, _idx(L, [1]), x[:1] * 1)),
    "masked_fill": ((3, 4), lambda L, x: x.masked_fill(x > 0.2, 1.0)),
    "masked_fill_broadcast": ((3, 4), lambda L, x: L.masked_fill(
        x, L.tensor([True, False, True, False]), -2.0)),
    # a 0-dim tensor value (MaskedFillBackward1): its gradient, the sum over the masked
    # places, flows on into x through the value's own graph
    "masked_fill_tensor": ((3, 4), lambda L, x: x.masked_fill(x > 0.2, x[1, 2] * 2)),
    "masked_fill_tensor_bcast": ((3, 4), lambda L, x: L.masked_fill(
        x, L.tensor([True, False, True, False]), x.sum())),
    "masked_fill_const_tensor": ((3, 4), lambda L, x: x.masked_fill(
        x > 0, L.tensor(0.5, dtype=L.float64))),
    "masked_fill_inplace": ((3, 4), lambda L, x: (x * 1).masked_fill_(x < 0, x.max())),
    "take_along_dim": ((3, 4), lambda L, x: L.take_along_dim(x, _idx(L, [[0], [1], [3]]), 1)),
    "take_along_dim_bcast": ((3, 4), lambda L, x: x.take_along_dim(_idx(L, [[0, 2]]), 1)),
    "take_along_dim_flat": ((3, 4), lambda L, x: L.take_along_dim(x, _idx(L, [5, 0, 11]))),
    "cumsum1": ((3, 4), lambda L, x: x.cumsum(1)),
    "cumsum0": ((3, 4, 2), lambda L, x: L.cumsum(x, dim=-3)),
    "cumsum_dtype": ((5,), lambda L, x: x.cumsum(0, dtype=L.float64)),
    "cumprod": ((3, 4), lambda L, x: x.cumprod(1)),
    "cumprod_zeros": ((3, 5), lambda L, x: (x * (x.abs() > 0.3)).cumprod(1)),
    "cumprod_two_zeros": ((6,), lambda L, x: L.cumprod(
        x * L.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0], dtype=x.dtype), 0)),
    "var_dim": ((3, 4), lambda L, x: x.var(1)),
    "var_all": ((3, 4), lambda L, x: x.var()),
    "var_correction0": ((3, 4, 2), lambda L, x: x.var((0, 2), correction=0, keepdim=True)),
    "var_unbiased_false": ((3, 4), lambda L, x: L.var(x, 0, False)),
    "var_correction2": ((5, 3), lambda L, x: x.var(0, correction=2)),
    "std_dim": ((3, 4), lambda L, x: x.std(-1, keepdim=True)),
    "std_all": ((3, 4), lambda L, x: L.std(x)),
    "std_correction0": ((3, 4), lambda L, x: x.std(0, correction=0)),
    "norm": ((3, 4), lambda L, x: x.norm()),
    "norm_p1_dim": ((3, 4), lambda L, x: x.norm(p=1, dim=1)),
    "norm_fro_dim": ((3, 4), lambda L, x: L.norm(x, "fro", dim=0, keepdim=True)),
    "vector_norm_inf": ((3, 4), lambda L, x: L.linalg.vector_norm(x, ord=math.inf)),
    "vector_norm_inf_dim": ((3, 4), lambda L, x: L.linalg.vector_norm(x, ord=math.inf, dim=1)),
    "vector_norm_neg_inf": ((3, 4), lambda L, x: L.linalg.vector_norm(x, -math.inf, 0)),
    "vector_norm_p3": ((3, 4), lambda L, x: L.linalg.vector_norm(x, ord=3, dim=(0, 1))),
    "vector_norm_p_half": ((3, 4), lambda L, x: L.linalg.vector_norm(x, ord=0.5, dim=1)),
    "vector_norm_p1_5": ((2, 3), lambda L, x: L.linalg.vector_norm(x, 1.5, keepdim=True)),
    "flip": ((3, 4), lambda L, x: x.flip(0)),
    "flip_dims": ((2, 3, 4), lambda L, x: L.flip(x, (0, -1))),
    "sort": ((3, 4), lambda L, x: x.sort(1)[0]),
    "sort_desc": ((3, 4, 2), lambda L, x: L.sort(x, 0, descending=True).values),
    "topk": ((3, 5), lambda L, x: x.topk(2)[0]),
    "topk_smallest": ((4, 3), lambda L, x: L.topk(x, 3, dim=0, largest=False).values),
    "tril": ((3, 4), lambda L, x: x.tril()),
    "triu_batched": ((2, 3, 4), lambda L, x: L.triu(x, 1)),
    "tril_neg": ((4, 3), lambda L, x: L.tril(x, -1)),
    "roll": ((3, 4), lambda L, x: x.roll(1, 0)),
    "roll_flat": ((3, 4), lambda L, x: L.roll(x, 5)),
    "roll_dims": ((3, 4), lambda L, x: x.roll((1, -1), (0, 1))),
    "repeat": ((3, 4), lambda L, x: x.repeat(2, 1)),
    "repeat_new_dims": ((2, 3), lambda L, x: x.repeat(2, 1, 3)),
    "tile": ((3, 4), lambda L, x: L.tile(x, (2,))),
    "outer": ((2, 3), lambda L, x: L.outer(x[0], x[1])),
    "einsum_mm": ((3, 4), lambda L, x: L.einsum("ij,kj->ik", x, x * 2)),
    "einsum_bmm": ((2, 3, 3), lambda L, x: L.einsum("bij,bjk->bik", x, x.flip(0))),
    "einsum_sum": ((3, 4), lambda L, x: L.einsum("ij->", x)),
    "einsum_rowdot": ((3, 4), lambda L, x: L.einsum("ij,ij->i", x, x.flip(1))),
    "einsum_transpose": ((3, 4), lambda L, x: L.einsum("ij->ji", x)),
    "einsum_chain": ((3, 3), lambda L, x: L.einsum("ij,jk,kl->il", x, x.tril(), x * 3)),
    "einsum_implicit": ((2, 3, 4), lambda L, x: L.einsum("bij,bkj", x, x + 1)),
    "einsum_list": ((3, 4), lambda L, x: L.einsum("ijk->j", [x.reshape(2, 3, 2)])),
    # a repeated index within one operand (DiagonalBackward0) and ``...`` (broadcast dims)
    "einsum_diag": ((3, 3), lambda L, x: L.einsum("ii->i", x)),
    "einsum_trace": ((3, 3), lambda L, x: L.einsum("ii", x)),
    "einsum_diag_batched": ((2, 3, 3), lambda L, x: L.einsum("...ii->...i", x)),
    "einsum_iji": ((2, 3, 2), lambda L, x: L.einsum("iji->j", x)),
    "einsum_iii": ((2, 2, 2), lambda L, x: L.einsum("iii->i", x)),
    "einsum_diag_times": ((3, 3), lambda L, x: L.einsum("ii,ij->j", x, x * 2)),
    "einsum_ellipsis_bmm": ((2, 3, 3), lambda L, x: L.einsum("...ij,...jk->...ik", x,
                                                             x.flip(0))),
    "einsum_ellipsis_trailing": ((2, 3, 4), lambda L, x: L.einsum("ij...,kj...->ik...", x,
                                                                  x * 2)),
    "einsum_ellipsis_broadcast": ((2, 1, 3), lambda L, x: L.einsum("...,...->...", x,
                                                                   x[0].t())),
    "einsum_ellipsis_summed": ((2, 3, 4), lambda L, x: L.einsum("i...->i", x)),
    "einsum_ellipsis_implicit": ((2, 3, 4), lambda L, x: L.einsum("...j,j", x, x[0, 0])),
    "einsum_elementwise": ((3, 4), lambda L, x: L.einsum("ij,ij->ij", x, x.flip(0))),
    "einsum_identity": ((3, 4), lambda L, x: L.einsum("ij", x)),
    "diagonal": ((2, 3, 4), lambda L, x: x.diagonal(1, 0, 2)),
    "diagonal_neg": ((3, 4), lambda L, x: L.diagonal(x, -1, -1, 0)),
}


def _input(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, shape).astype(dtype)


def _run(L, name, data, create_graph=False):
    shape, fn = CASES[name]
    x = L.tensor(data, requires_grad=True)
    out = fn(L, x)
    w = L.tensor(np.random.default_rng(1).uniform(-1, 1, tuple(out.shape)).astype(data.dtype))
    loss = (out * w).sum()
    (g,) = L.autograd.grad(loss, x, create_graph=create_graph)
    return x, out, g


def _saved(node):
    return sorted(a[len("_saved_"):] for a in dir(node) if a.startswith("_saved_"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_grads_and_graph_match_torch(name, dtype, cpu_backend, torch):
    data = _input(CASES[name][0], dtype)
    _, out, g = _run(sg, name, data)
    _, t_out, t_g = _run(torch, name, data)
    n = data.size
    assert_close(out, t_out, terms=n, scale=magnitude(t_out, data, 1.0) ** 2 + 1)
    assert_close(g, t_g, terms=n * n, scale=magnitude(t_g, data, 1.0) ** 2 + 1)
    assert out.grad_fn.name() == t_out.grad_fn.name()
    assert _saved(out.grad_fn) == _saved(t_out.grad_fn)


SECOND_ORDER = ["gather_dim1", "scatter_add", "index_select", "index_add", "cumsum1",
                "cumprod", "cumprod_zeros", "var_dim", "std_all", "norm", "vector_norm_p3",
                "flip", "masked_fill", "sort", "topk", "tril", "roll", "repeat", "outer",
                "masked_fill_tensor", "masked_fill_tensor_bcast", "einsum_diag_times",
                "einsum_ellipsis_bmm", "diagonal"]


@pytest.mark.parametrize("name", SECOND_ORDER)
def test_second_derivatives_match_torch(name, cpu_backend, torch):
    data = _input(CASES[name][0], np.float64, seed=3)
    results = []
    for L in (sg, torch):
        x, _, g = _run(L, name, data, create_graph=True)
        v = L.tensor(np.random.default_rng(2).uniform(-1, 1, data.shape))
        if not g.requires_grad:  # a linear op: its gradient does not depend on x
            results.append(np.zeros(data.shape))
            continue
        (gg,) = L.autograd.grad((g * v).sum(), x, allow_unused=True)
        results.append(np.zeros(data.shape) if gg is None else gg.detach().numpy())
    assert_close(results[0], results[1], terms=data.size ** 2,
                 scale=magnitude(results[1], data, 1.0) ** 3 + 1)


def test_sort_indices_and_return_types(torch):
    data = _input((3, 5), np.float64, seed=8)
    for dim, desc in ((1, False), (0, True)):
        s = sg.tensor(data).sort(dim, descending=desc)
        t = torch.tensor(data).sort(dim, descending=desc)
        assert np.array_equal(s.indices.numpy(), t.indices.numpy())
        assert np.array_equal(sg.tensor(data).argsort(dim, descending=desc).numpy(),
                              torch.tensor(data).argsort(dim, descending=desc).numpy())
    s, t = sg.tensor(data).topk(2), torch.tensor(data).topk(2)
    assert type(s).__name__ == type(t).__name__ == "topk"
    assert np.array_equal(s.indices.numpy(), t.indices.numpy())
    assert type(sg.tensor(data).sort()).__name__ == "sort"
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        sg.tensor(data).topk(9)


def test_einsum_outer_product_and_errors(torch):
    data = _input((2, 3), np.float64, seed=9)
    res = [L.einsum("i,j->ij", L.tensor(data[0]), L.tensor(data[1])) for L in (sg, torch)]
    assert_close(res[0], res[1], terms=1)
    errors = [("...ij", (3,)), ("ii->i", (3, 2)), ("i..j", (3, 3)), ("i......", (3, 3)),
              ("ij", (2, 3, 4)), ("i->j", (3,)), ("ij->ii", (3, 3)),
              ("...ij,...jk", (2, 3, 4), (5, 4, 2)), ("ij,j,k", (3, 3), (3,)),
              ("ij", (3, 3), (3, 3))]
    for eq, *shapes in errors:
        messages = []
        for L in (sg, torch):
            with pytest.raises(RuntimeError) as info:
                L.einsum(eq, *[L.ones(*s) for s in shapes])
            messages.append(str(info.value))
        assert messages[0] == messages[1], eq


def test_saved_operands_read_back_like_torch(torch):
    x = sg.tensor(_input((3, 4), np.float64), requires_grad=True)
    idx = sg.tensor([[0, 1], [2, 3], [1, 1]])
    y = x.gather(1, idx)
    assert y.grad_fn._saved_index is idx and y.grad_fn._saved_dim == 1
    assert y.grad_fn._saved_sparse_grad is False
    assert x.cumsum(-1).grad_fn._saved_dim == 2 ** 64 - 1  # torch's unsigned int64 view
    v = x.var(1, keepdim=True)
    assert v.grad_fn._saved_correction == 1 and v.grad_fn._saved_keepdim is True
    assert x.index_select(0, sg.tensor([1])).grad_fn._saved_self_sym_sizes == (3, 4)
    assert x.flip(0, 1).grad_fn._saved_dims == (0, 1)


def test_integer_inputs_keep_torch_dtypes(torch):
    for L in (sg, torch):
        t = L.tensor([1, 2, 3])
        assert str(t.cumsum(0).dtype).endswith("int64")
        assert str(L.tensor([True, False]).cumsum(0).dtype).endswith("int64")
        assert t.cumprod(0).tolist() == [1, 2, 6]
        assert t.flip(0).tolist() == [3, 2, 1]
        assert t.gather(0, L.tensor([2, 0])).tolist() == [3, 1]


ERRORS = [
    (lambda L, x: x.gather(1, L.tensor([[0.0]])), RuntimeError),
    (lambda L, x: x.gather(1, L.tensor([[5]])), RuntimeError),
    (lambda L, x: x.gather(1, L.tensor([[-1]])), RuntimeError),
    (lambda L, x: x.gather(1, L.tensor([5])), RuntimeError),
    (lambda L, x: x.gather(1, L.zeros(5, 2, dtype=L.int64)), RuntimeError),
    (lambda L, x: x.gather(2, L.zeros(3, 2, dtype=L.int64)), IndexError),
    (lambda L, x: x.scatter(0, L.tensor([[5]]), 1.0), RuntimeError),
    (lambda L, x: x.scatter(0, L.tensor([[1.0]]), 1.0), RuntimeError),
    (lambda L, x: x.scatter_add(0, L.tensor([[1]]), L.ones(3, 4, dtype=L.float64)),
     RuntimeError),
    (lambda L, x: x.index_select(0, L.tensor([5])), IndexError),
    (lambda L, x: x.index_select(0, L.tensor([1.0])), RuntimeError),
    (lambda L, x: x.index_select(0, L.tensor([[1]])), IndexError),
    (lambda L, x: x.index_add(0, L.tensor([5]), L.ones(1, 4)), RuntimeError),
    (lambda L, x: x.index_add(0, L.tensor([1]), L.ones(2, 4)), RuntimeError),
    (lambda L, x: x.masked_fill(L.tensor([1, 0, 1, 0]), 1.0), RuntimeError),
    (lambda L, x: x.masked_fill(x > 0, L.ones(1, requires_grad=True)), RuntimeError),
    (lambda L, x: L.zeros(3, 4, dtype=L.int64).masked_fill(
        x > 0, L.tensor(1.0, requires_grad=True)), RuntimeError),
    (lambda L, x: x.cumsum(2), IndexError),
    (lambda L, x: L.tensor([1, 2]).var(), RuntimeError),
    (lambda L, x: x.flip(0, 0), RuntimeError),
]


@pytest.mark.parametrize("k", range(len(ERRORS)))
def test_errors_have_torch_wording(k, torch):
    fn, kind = ERRORS[k]
    messages = []
    for L in (sg, torch):
        with pytest.raises(kind) as info:
            fn(L, L.ones(3, 4))
        messages.append(str(info.value).splitlines()[0])
    assert messages[0] == messages[1]


@pytest.mark.parametrize("name", ["gather_dim1", "scatter_src", "scatter_value",
                                  "scatter_add", "index_select", "index_add", "masked_fill",
                                  "masked_fill_tensor", "masked_fill_inplace", "einsum_diag",
                                  "einsum_trace", "einsum_diag_times", "einsum_ellipsis_bmm",
                                  "einsum_ellipsis_broadcast", "diagonal_neg",
                                  "take_along_dim", "cumsum1", "cumprod", "cumprod_zeros",
                                  "var_dim", "std_all", "norm", "norm_p1_dim",
                                  "vector_norm_inf_dim", "vector_norm_p3", "flip_dims",
                                  "sort", "topk", "triu_batched", "roll_dims", "roll_flat",
                                  "repeat_new_dims", "outer", "einsum_chain",
                                  "einsum_implicit"])
def test_verify_exact(name):
    data = _input(CASES[name][0], np.float64, seed=4)
    x = sg.tensor(data, requires_grad=True)
    loss = (CASES[name][1](sg, x) * 1.5).sum()
    loss.backward(retain_graph=True)
    report = sg.verify(loss, mode="exact")
    assert report.ok, report


def test_verify_local_on_a_bigger_program():
    rng = np.random.default_rng(6)
    x = sg.tensor(rng.uniform(0.5, 1.5, (6, 8)), requires_grad=True)
    idx = sg.tensor(rng.integers(0, 8, (6, 3)))
    y = x.gather(1, idx).cumsum(1).index_select(0, sg.tensor([0, 2, 5]))
    z = y.var(1) + x.norm(dim=1)[:3] + x.cumprod(0).std(0)[:3] + x.flip(1).sum(1)[:3]
    loss = z.sum()
    loss.backward(retain_graph=True)
    report = sg.verify(loss, mode="local")
    assert report.ok, report


@pytest.mark.parametrize("dtypes", [(np.float32, np.float64), (np.float64, np.float32)])
def test_masked_fill_tensor_value_gradient_and_dtypes_match_torch(dtypes, cpu_backend, torch):
    """The value's gradient is the sum of the incoming gradient over the masked places, in
    the value's own dtype; the result keeps the input's dtype; one node, two edges."""
    x_dt, v_dt = dtypes
    data = _input((3, 4), x_dt, seed=7)
    mask = data > 0
    w = np.random.default_rng(2).uniform(-1, 1, (3, 4)).astype(x_dt)
    res = []
    for L in (sg, torch):
        x = L.tensor(data, requires_grad=True)
        v = L.tensor(np.array(0.75, dtype=v_dt), requires_grad=True)
        y = x.masked_fill(L.tensor(mask), v)
        node = y.grad_fn
        assert node.name() == "MaskedFillBackward1"
        assert node._saved_mask.tolist() == mask.tolist()
        assert [type(n).__name__ for n, _ in node.next_functions] == ["AccumulateGrad"] * 2
        (y * L.tensor(w)).sum().backward()
        res.append((y.detach().numpy(), str(y.dtype), x.grad.numpy(), v.grad.numpy(),
                    str(v.grad.dtype)))
    (y, ydt, gx, gv, gvdt), (ty, tydt, tgx, tgv, tgvdt) = res
    assert ydt.split(".")[-1] == tydt.split(".")[-1] and gvdt.split(".")[-1] == tgvdt.split(".")[-1]
    assert_close(y, ty, terms=1)
    assert_close(gx, tgx, terms=1)
    # summed in x's dtype, kept in v's: one of them is float32
    assert_close(gv, tgv, terms=data.size, scale=np.abs(w).sum(), dtype=np.float32)
    assert_close(gv, w[mask].sum(), terms=data.size, scale=np.abs(w).sum(), dtype=np.float32)
