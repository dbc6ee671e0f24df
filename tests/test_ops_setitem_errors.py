"""``__setitem__`` under autograd (CopySlices / CopyBackwards / IndexPutBackward0), the tsv
rows of the op set, and the errors bad indices, dims and shapes raise (torch's types and
key words; no kernel ever sees an unchecked index)."""

from __future__ import annotations

import csv
import pathlib
import warnings

import numpy as np
import pytest
from _oracle import assert_close, graph_signature, run_grads

import symgrad as sg

R = np.random.default_rng(3)


def _u(*shape):
    return R.uniform(-1, 1, size=shape)


def _assign(index, value_fn):
    def program(L, w, b):
        x = w * 1
        x[index(L) if callable(index) else index] = value_fn(L, b)
        return x

    return program


SETITEM = [
    ("row_from_row", _assign(0, lambda L, b: b), [_u(3, 4), _u(4)]),
    ("row_from_scalar_tensor", _assign(0, lambda L, b: b[1]), [_u(3, 4), _u(4)]),
    ("row_from_number", _assign(0, lambda L, b: 5.0), [_u(3, 4), _u(4)]),
    ("tsv_row", _assign(0, lambda L, b: b[1]), [_u(3), _u(3)]),
    ("element", _assign((0, 1), lambda L, b: b[0]), [_u(3, 4), _u(4)]),
    ("slice_broadcast", _assign((slice(None), slice(1, 3)), lambda L, b: b[:2]),
     [_u(3, 4), _u(4)]),
    ("slice_leading_ones", _assign(slice(0, 1), lambda L, b: b), [_u(3, 4), _u(1, 4)]),
    ("step_slice", _assign((slice(None, None, 2), -1), lambda L, b: b * 2), [_u(5, 4), _u(3)]),
    ("none_index", _assign((slice(None), None, 1), lambda L, b: b[:3, None]),
     [_u(3, 4), _u(4)]),
    ("whole_ellipsis", _assign(Ellipsis, lambda L, b: b), [_u(3, 4), _u(4)]),
    ("whole_slice", _assign(slice(None), lambda L, b: b), [_u(3, 4), _u(4)]),
    ("index_list", _assign([0, 2], lambda L, b: b), [_u(3, 4), _u(4)]),
    ("index_list_number", _assign([0, 1], lambda L, b: 3.0), [_u(3, 4), _u(4)]),
    ("index_repeated", _assign([0, 0], lambda L, b: L.stack([b, b * 2])), [_u(3, 4), _u(4)]),
    ("mask", _assign(lambda L: L.tensor([[True, False, True, False]] * 3), lambda L, b: 0.0),
     [_u(3, 4), _u(4)]),
    ("mask_tensor_value", _assign(lambda L: L.tensor([True, False, True]), lambda L, b: b),
     [_u(3, 4), _u(4)]),
    ("slice_then_list", _assign((slice(1, None), [0, 1]), lambda L, b: b[:2]),
     [_u(3, 4), _u(4)]),
    ("int_then_list", _assign((0, [0, 1]), lambda L, b: b[:2]), [_u(3, 4), _u(4)]),
    ("full_then_list", _assign((slice(None), [0, 1]), lambda L, b: 1.0), [_u(3, 4), _u(4)]),
    ("other_dtype_value", _assign(0, lambda L, b: b.float()), [_u(3, 4), _u(4)]),
]


@pytest.mark.parametrize("case", SETITEM, ids=[c[0] for c in SETITEM])
def test_setitem_graph_values_and_grads_match_torch(case, torch, cpu_backend):
    _, fn, arrays = case
    ours, g_ours, _ = run_grads(sg, fn, arrays)
    sig = run_grads.signature
    theirs, g_theirs, _ = run_grads(torch, fn, arrays)
    assert sig == run_grads.signature
    assert_close(ours, theirs, terms=run_grads.terms, inputs=arrays)
    for a, b in zip(g_ours, g_theirs):
        assert_close(a, b, terms=run_grads.terms, inputs=arrays)


@pytest.mark.parametrize("case", SETITEM, ids=[c[0] for c in SETITEM])
def test_setitem_second_derivatives_match_torch(case, torch):
    _, fn, arrays = case

    def squared(L, w, b):  # make the second derivative non-trivial
        x = fn(L, w, b)
        return x * x

    _, g_ours, h_ours = run_grads(sg, squared, arrays, create_graph=True)
    _, g_theirs, h_theirs = run_grads(torch, squared, arrays, create_graph=True)
    for a, b in zip(g_ours, g_theirs):
        assert_close(a, b, terms=run_grads.terms, inputs=arrays)
    for a, b in zip(h_ours, h_theirs):
        assert_close(a, b, terms=run_grads.terms, inputs=arrays)


def test_setitem_keeps_identity_bumps_version_and_rebases_grad_fn():
    w = sg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    b = sg.tensor([5.0, 6.0], requires_grad=True)
    x = w * 1
    old_fn, obj, version = x.grad_fn, x, x._version
    x[0] = b
    assert x is obj and x._version == version + 1
    assert x.grad_fn.name() == "CopySlices"
    assert x.grad_fn.next_functions[0] == (old_fn, 0)
    assert x.grad_fn.next_functions[1][0].variable is b
    assert not [a for a in dir(x.grad_fn) if a.startswith("_saved_")]
    x.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[0, 0], [1, 1]])
    np.testing.assert_array_equal(b.grad.numpy(), [1, 1])


def test_setitem_without_grad_and_on_a_tensor_that_needs_none():
    x = sg.zeros(3)
    x[1] = 2.0
    assert x.grad_fn is None and not x.requires_grad and x._version == 1
    b = sg.tensor(4.0, requires_grad=True)
    x[2] = b  # a tensor without grad becomes part of the graph, as in torch
    assert x.requires_grad and x.grad_fn.name() == "CopySlices"
    assert x.grad_fn.next_functions[0] == (None, 0)
    (x * 3).sum().backward()
    assert b.grad.item() == 3.0
    w = sg.tensor([1.0, 2.0], requires_grad=True)
    with sg.no_grad():
        w[0] = 10.0  # the SGD-style update path
    assert w.tolist() == [10.0, 2.0] and w.grad_fn is None


def test_setitem_on_saved_tensor_makes_backward_fail_like_torch(torch):
    for lib in (sg, torch):
        w = lib.tensor([1.0, 2.0], requires_grad=True)
        y = w.exp()
        z = y * 1
        y[0] = 0.0
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward(retain_graph=True)
            (y * y).sum().backward()  # ExpBackward0 saved y (its result)


@pytest.mark.parametrize("lib_name", ["symgrad", "torch"])
def test_setitem_errors(lib_name, torch):
    L = sg if lib_name == "symgrad" else torch
    w = L.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        w[0] = 1.0
    x = L.zeros(3, 4)
    with pytest.raises(IndexError, match="out of bounds"):
        x[5] = 1.0
    with pytest.raises(IndexError, match="out of bounds"):
        x[[0, 7]] = 1.0
    with pytest.raises(RuntimeError, match="expanded size|must match"):
        x[0] = L.zeros(5)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        x[[0, 1]] = L.zeros(3)
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, 0] = 1.0
    if L is sg:  # torch writes through the broadcast view; symgrad refuses clearly
        y = L.zeros(3).expand(2, 3)
        with pytest.raises(RuntimeError, match="more than one element of the written-to"):
            y[0] = 1.0
        with pytest.raises(IndexError, match="single ellipsis"):
            x[..., ...] = 1.0


def test_assigning_into_a_view_of_a_graph_tensor_rebases_its_base_like_torch(torch):
    grads = []
    for L in (sg, torch):
        w = L.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
        x = w * 1
        x[0][1] = L.tensor(1.0)  # torch: x's grad_fn becomes CopySlices
        assert x.grad_fn.name().endswith("CopySlices")
        z = w * 1
        z[0][1] = 3.0
        assert z.tolist() == [[1.0, 3.0], [3.0, 4.0]]
        (x * z).sum().backward()
        grads.append(w.grad.numpy())
    np.testing.assert_array_equal(grads[0], grads[1])
    with sg.record() if hasattr(sg, "record") else _nullcontext():  # strong input refs
        w = sg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
        y = w * 1
        y[0][1] = sg.tensor(1.0)
        assert y.grad_fn.name() == "CopySlices"
    buf = sg.zeros(2, 2)  # a plain buffer: writing a grad-requiring value into a row view
    with pytest.raises(RuntimeError, match="part of a larger tensor"):
        buf[0][1] = w[0, 0]
    buf[0][1] = 5.0  # no graph involved: a plain write through the view, as in torch
    row = buf[1]
    row[0] = 7.0
    assert buf.tolist() == [[0.0, 5.0], [7.0, 0.0]]


def _nullcontext():
    import contextlib

    return contextlib.nullcontext()


def test_iterating_a_tensor_gives_its_rows(torch):
    for lib in (sg, torch):
        w = lib.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
        rows = list(w)
        assert [r.tolist() for r in rows] == [[1.0, 2.0], [3.0, 4.0]]
        (rows[0] * 2 + rows[1]).sum().backward()
        assert w.grad.tolist() == [[2.0, 2.0], [1.0, 1.0]]
        with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
            iter(lib.tensor(1.0))


# -- tsv rows ----------------------------------------------------------------------------------
# A copy of shared/torch_grad_fn_names.tsv (PyTorch 2.13.0 grad_fn and saved names).
TSV = pathlib.Path(__file__).resolve().parent / "data" / "torch_grad_fn_names.tsv"
NN_ROWS = ("F.linear", "nn.Linear", "F.mse_loss", "F.binary_cross_entropy_with_logits",
           "F.cross_entropy")  # rows of the nn issue


def _rows():
    rows = []
    with open(TSV, newline="") as fh:
        for row in csv.reader(fh, delimiter="\t"):
            if len(row) >= 2 and row[1] and row[0] != "expression" and \
                    not row[0].startswith("(note)"):
                rows.append((row[0], row[1], set((row[2] if len(row) > 2 else "").split())))
    return rows


def _program(expr):
    code = expr.split("  ")[0]
    if " on a " in code:
        code = code.split(" on a ")[0]
    if code.startswith("x = a * 1; x[0] = b[1]"):
        code = "_setitem(a, b)"
    return code


def _setitem(a, b):
    x = a * 1
    x[0] = b[1]
    return x


def _ns(lib, float64):
    rng = np.random.default_rng(11)
    dt = np.float64 if float64 else np.float32

    def leaf(*shape):
        return lib.tensor(rng.uniform(0.5, 2.0, size=shape).astype(dt), requires_grad=True)

    return {**{name: leaf(*shape) for name, shape in NS_SHAPES.items()}, "torch": lib,
            "_setitem": _setitem}


NS_SHAPES = {"a": (3,), "b": (3,), "W": (3, 4), "M": (2, 3), "B1": (2, 3, 4), "B2": (2, 4, 5)}
# No row's op sums over more elements than the namespace holds: the rows' rounding terms.
NS_TERMS = sum(int(np.prod(shape)) for shape in NS_SHAPES.values())


ROWS = [r for r in (_rows() if TSV.exists() else []) if not r[0].startswith(NN_ROWS)]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_every_tsv_row_matches_torch(row, torch):
    expr, name, saved = row
    code = _program(expr)
    f64 = "float64 tensor" in expr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = eval(code, {}, _ns(sg, f64))  # noqa: S307 -- the shared tsv
        theirs = eval(code, {}, _ns(torch, f64))  # noqa: S307
    if isinstance(ours, tuple):
        ours, theirs = ours[0], theirs[0]
    assert ours.grad_fn.name() == name.replace("torch::autograd::", "")
    assert {a for a in dir(ours.grad_fn) if a.startswith("_saved_")} == saved
    assert graph_signature(ours.grad_fn, terms=NS_TERMS) == graph_signature(theirs.grad_fn,
                                                                            terms=NS_TERMS)
    assert_close(ours, theirs, terms=NS_TERMS)


def test_tsv_rows_of_this_issue_are_all_covered():
    names = {r[1].replace("torch::autograd::", "") for r in ROWS}
    for expected in ("UnsafeViewBackward0", "CopySlices", "MaxBackward0", "MaxBackward1",
                     "MinBackward1", "SoftmaxBackward0", "LogSoftmaxBackward0",
                     "LogsumexpBackward0", "SelectBackward0", "SliceBackward0",
                     "IndexBackward0", "CatBackward0", "StackBackward0", "ClampBackward1",
                     "WhereBackward0", "ToCopyBackward0", "PermuteBackward0"):
        assert expected in names


# -- errors ------------------------------------------------------------------------------------
ERRORS = [
    ("int_out_of_range", lambda L, W: W[5], IndexError, "index 5 is out of bounds"),
    ("neg_out_of_range", lambda L, W: W[-4], IndexError, "out of bounds for dimension 0"),
    ("col_out_of_range", lambda L, W: W[:, 7], IndexError, "out of bounds for dimension 1"),
    ("list_out_of_range", lambda L, W: W[[0, 5]], IndexError, "index 5 is out of bounds"),
    ("neg_list_out_of_range", lambda L, W: W[[-9]], IndexError, "out of bounds"),
    ("too_many", lambda L, W: W[1, 2, 3], IndexError, "too many indices"),
    ("zero_dim", lambda L, W: W[0, 0][0], IndexError, "invalid index of a 0-dim tensor"),
    ("bad_mask", lambda L, W: W[L.tensor([True, False])], IndexError, "shape of the mask"),
    ("float_index", lambda L, W: W[0.5], IndexError, "only integers, slices"),
    ("float_tensor_index", lambda L, W: W[L.tensor([0.0])], IndexError, "must be long"),
    ("neg_step", lambda L, W: W[::-1], ValueError, "step must be greater than zero"),
    ("select_fn", lambda L, W: W.select(0, 3), IndexError, "out of range"),
    ("sum_dim", lambda L, W: W.sum(2), IndexError, "Dimension out of range"),
    ("sum_neg_dim", lambda L, W: W.sum(-3), IndexError, "Dimension out of range"),
    ("max_dim", lambda L, W: W.max(2), IndexError, "Dimension out of range"),
    ("softmax_dim", lambda L, W: W.softmax(3), IndexError, "Dimension out of range"),
    ("logsumexp_dim", lambda L, W: W.logsumexp(-3), IndexError, "Dimension out of range"),
    ("transpose_dim", lambda L, W: W.transpose(0, 2), IndexError, "Dimension out of range"),
    ("unsqueeze_dim", lambda L, W: W.unsqueeze(3), IndexError, "Dimension out of range"),
    ("squeeze_dim", lambda L, W: W.squeeze(2), IndexError, "Dimension out of range"),
    ("cat_dim", lambda L, W: L.cat([W, W], 2), IndexError, "Dimension out of range"),
    ("stack_dim", lambda L, W: L.stack([W, W], 3), IndexError, "Dimension out of range"),
    ("argmax_dim", lambda L, W: W.argmax(2), IndexError, "Dimension out of range"),
    ("cat_ndim", lambda L, W: L.cat([W, W[0]]), RuntimeError, "same number of dimensions"),
    ("cat_sizes", lambda L, W: L.cat([W, W[:, :2]]), RuntimeError,
     "Sizes of tensors must match except in dimension 0"),
    ("cat_empty_list", lambda L, W: L.cat([]), ValueError, "non-empty"),
    ("cat_0d", lambda L, W: L.cat([W[0, 0], W[0, 0]]), RuntimeError, "zero-dimensional"),
    ("stack_sizes", lambda L, W: L.stack([W, W.t()]), RuntimeError, "equal size"),
    ("stack_empty", lambda L, W: L.stack([]), RuntimeError, "non-empty"),
    ("reshape_size", lambda L, W: W.reshape(5, -1), RuntimeError, "invalid for input of size 12"),
    ("reshape_two_infer", lambda L, W: W.reshape(-1, -1), RuntimeError,
     "only one dimension can be inferred"),
    ("view_size", lambda L, W: W.view(5, 3), RuntimeError, "invalid for input of size 12"),
    ("view_strides", lambda L, W: W.t().view(12), RuntimeError, "view size is not compatible"),
    ("reshape_empty_infer", lambda L, W: W[:0].reshape(0, -1), RuntimeError,
     "unspecified dimension size -1"),
    ("flatten_order", lambda L, W: W.flatten(1, 0), RuntimeError, "start_dim cannot come after"),
    ("max_empty", lambda L, W: W[:0].max(), RuntimeError, "Expected reduction dim"),
    ("max_empty_dim", lambda L, W: W[:0].max(0), IndexError, "to have non-zero size"),
    ("argmax_empty", lambda L, W: W[:0].argmax(), IndexError, "Expected reduction dim"),
    ("clamp_none", lambda L, W: W.clamp(), RuntimeError, "At least one of 'min' or 'max'"),
    ("bmm_rank", lambda L, W: L.bmm(W, W), RuntimeError, "3D tensor"),
    ("bmm_inner", lambda L, W: L.bmm(W[None], W[None]), RuntimeError, "Expected size"),
    ("matmul_batched_inner", lambda L, W: W[None].expand(2, 3, 4) @ W[None].expand(2, 3, 4),
     RuntimeError, "Expected size"),
    ("matmul_batch_bcast", lambda L, W: W[None].expand(2, 3, 4) @ W.t()[None].expand(3, 4, 3),
     RuntimeError, "must match the size"),
    ("matmul_fold_inner", lambda L, W: W[None] @ W, RuntimeError, "cannot be multiplied"),
    ("permute_dup", lambda L, W: W.permute(0, 0), RuntimeError, "duplicate dims"),
    ("expand_bad", lambda L, W: W.expand(3, 5), RuntimeError, "must match the existing size"),
    ("softmax_int", lambda L, W: L.tensor([1, 2]).softmax(0), NotImplementedError,
     "not implemented for 'Long'"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_errors_match_torch_type_and_words(case, torch):
    _, fn, exc, words = case
    for lib in (sg, torch):
        W = lib.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
        with pytest.raises(exc, match=words):
            fn(lib, W)


def test_no_unchecked_index_reaches_a_kernel(monkeypatch):
    """Bad indices fail in symgrad's checks: the backend's getitem is never called."""
    from symgrad.backends import backend_for

    be = backend_for("cpu")
    calls = []
    orig = type(be).getitem
    monkeypatch.setattr(type(be), "getitem", staticmethod(
        lambda x, i: calls.append(i) or orig(x, i)))
    W = sg.tensor(np.arange(12.0).reshape(3, 4))
    for bad in (5, (9, 0), [0, 3], (slice(None), [4]), sg.tensor([True]), (1, 1, 1),
                (-4,), [[0], [-5]]):
        with pytest.raises(IndexError):
            W[bad]
    assert calls == []


def test_max_ties_split_like_torch(torch):
    for lib in (sg, torch):
        x = lib.tensor([[1.0, 3.0, 3.0], [3.0, 0.0, 2.0]], requires_grad=True)
        x.max().backward()  # all three 3.0 share the gradient evenly
        # 1/3 rounded once (float32), against the float64 1/3
        assert_close(x.grad, [[0, 1 / 3, 1 / 3], [1 / 3, 0, 0]])
        y = lib.tensor([[1.0, 3.0, 3.0]], requires_grad=True)
        r = y.max(1)
        assert r.indices.tolist() == [1]  # the first maximum takes all of it
        r.values.sum().backward()
        assert y.grad.tolist() == [[0.0, 1.0, 0.0]]


def test_comparisons_give_bool_tensors_without_grad_fn(torch):
    for lib in (sg, torch):
        a = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        for r in (a > 1, a >= 2, a < 2, a <= 1, a == 2, a != 2):
            assert r.dtype == lib.bool and r.grad_fn is None and not r.requires_grad
        assert a.argmax().item() == 2 and a.argmin(0, keepdim=True).tolist() == [0]


def test_named_tuple_repr_and_fields():
    r = sg.tensor([[1.0, 5.0], [7.0, 2.0]]).max(1)
    assert r.values.tolist() == [5.0, 7.0] and r.indices.tolist() == [1, 0]
    v, i = r
    assert v is r.values and i is r.indices
    assert repr(r).startswith("symgrad.return_types.max(\nvalues=tensor(")
    assert type(sg.tensor([1.0]).min(0)).__name__ == "min"
