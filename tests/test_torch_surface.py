"""Names and wording training scripts meet (issue 31, scope 1), side by side with torch 2.13:
NumPy spellings of reduction arguments, ``all``/``any`` as functions, indexing with a
``range``, ``one_hot``, ``multinomial``, ``unique``, the MSE loss with an integer target,
error messages of batch_norm / einsum / conv, and ``load`` of a ``torch.save`` file."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
import symgrad.nn.functional as F


def _both(torch, fn, *arrays):
    """``fn(lib, *tensors)`` on symgrad and torch."""
    return (fn(sg, *[sg.tensor(a) for a in arrays]),
            fn(torch, *[torch.tensor(a) for a in arrays]))


def _np(t):
    return np.asarray(t.detach().cpu().numpy()) if hasattr(t, "detach") else np.asarray(t)


def _same_error(torch, fn, *arrays, exc=RuntimeError):
    with pytest.raises(exc) as theirs:
        fn(torch, *[torch.tensor(a) for a in arrays])
    with pytest.raises(exc) as ours:
        fn(sg, *[sg.tensor(a) for a in arrays])
    assert str(ours.value) == str(theirs.value)


X = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5


@pytest.mark.parametrize("call", [
    lambda L, x: x.sum(1, keepdims=True),
    lambda L, x: L.sum(x, axis=0, keepdims=True),
    lambda L, x: x.mean(axis=1, keepdims=True),
    lambda L, x: x.max(1, keepdims=True).values,
    lambda L, x: x.std(1, keepdims=True),
    lambda L, x: x.var(axis=0),
    lambda L, x: x.logsumexp(1, keepdims=True),
    lambda L, x: x.argmax(1, keepdims=True),
    lambda L, x: L.all(x > -6),
    lambda L, x: L.any(x > 5, dim=1),
    lambda L, x: L.all(x > 0, 0, keepdims=True),
    lambda L, x: x[range(1, 3)],
    lambda L, x: x[:, range(0, 4, 2)],
    lambda L, x: x[range(0)],
])
def test_numpy_spellings_functions_and_range_index_match_torch(torch, call):
    ours, theirs = _both(torch, call, X)
    assert ours.shape == tuple(theirs.shape)
    assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
    # reductions over at most 4 elements of a (3, 4) float32 tensor (std/var/logsumexp add
    # a root, a division and an exp/log): the scale is the data's, not the result's
    assert_close(_np(ours), _np(theirs), terms=16, scale=np.abs(X).max() + 1.0)


def test_range_index_gradient_matches_torch(torch):
    grads = []
    for lib in (sg, torch):
        x = lib.tensor(X, requires_grad=True)
        y = x[range(1, 3)]
        assert y.grad_fn.name() == "IndexBackward0"
        (y * y).sum().backward()
        grads.append(_np(x.grad))
    np.testing.assert_array_equal(*grads)


def test_both_spellings_at_once_is_an_error():
    with pytest.raises(TypeError, match="multiple values for argument 'keepdim'"):
        sg.ones(2, 2).sum(1, keepdim=True, keepdims=True)


@pytest.mark.parametrize("args", [((np.array([0, 2, 1]),), -1),
                                  ((np.array([[0, 2], [1, 1]]),), 5),
                                  ((np.array([], dtype=np.int64),), 3),
                                  ((np.array(2),), 3)])
def test_one_hot_matches_torch(torch, args):
    (idx,), classes = args
    ours, theirs = _both(torch, lambda L, t: L.nn.functional.one_hot(t, classes), idx)
    assert ours.dtype == sg.int64 and ours.grad_fn is None
    np.testing.assert_array_equal(_np(ours), _np(theirs))


@pytest.mark.parametrize("idx,classes", [(np.array([0.0, 2.0]), -1),
                                         (np.array([0, 5]), 3),
                                         (np.array([-1, 1]), 3),
                                         (np.array([], dtype=np.int64), -1)])
def test_one_hot_errors_match_torch(torch, idx, classes):
    _same_error(torch, lambda L, t: L.nn.functional.one_hot(t, classes), idx)


@pytest.mark.parametrize("probs,n,replacement", [
    ([0.2, 0.8], 3, False), ([1, 2], 1, False), ([0.2, 0.8], 0, True),
    ([[[0.5, 0.5]]], 1, True), (1.0, 1, True), ([-0.2, 0.8], 1, True),
    ([0.2, float("inf")], 1, True), ([[0.0, 0.0]], 1, True)])
def test_multinomial_errors_match_torch(torch, probs, n, replacement):
    _same_error(torch, lambda L, p: L.multinomial(p, n, replacement), np.array(probs))


def test_multinomial_draws_follow_the_weights():
    sg.manual_seed(0)
    p = sg.tensor([[0.1, 0.0, 0.9], [0.0, 1.0, 0.0]], dtype=sg.float64)
    draws = p.multinomial(4000, replacement=True)
    assert draws.shape == (2, 4000) and draws.dtype == sg.int64
    counts = np.bincount(_np(draws)[0], minlength=3)
    assert counts[1] == 0 and (_np(draws)[1] == 1).all()
    # 3600 expected draws of category 2: 6 standard deviations (sqrt(4000 * .9 * .1) = 19)
    assert abs(counts[2] - 3600) < 6 * 19
    # without replacement: every category once, zero-weight ones last (as torch's kernel)
    once = sg.multinomial(sg.tensor([0.2, 0.0, 0.8]), 3)
    assert sorted(_np(once).tolist()) == [0, 1, 2] and _np(once)[-1] == 1


@pytest.mark.parametrize("values,kwargs", [
    (np.array([3, 1, 2, 3, 1]), dict(return_inverse=True, return_counts=True)),
    (np.array([2.0, 1.0, 2.0]), dict(return_inverse=True)),
    (np.array([[2, 1], [2, 1], [0, 1]]), dict(dim=0, return_counts=True)),
    (np.array([[2, 1], [2, 1]]), dict(dim=1, return_inverse=True, return_counts=True)),
    (np.array([[2, 1], [2, 1]]), dict()),
    (np.array([True, False, True]), dict(return_counts=True)),
])
def test_unique_matches_torch(torch, values, kwargs):
    ours, theirs = _both(torch, lambda L, t: L.unique(t, **kwargs), values)
    ours_m, _ = _both(torch, lambda L, t: t.unique(**kwargs), values)
    ours, theirs, ours_m = [r if isinstance(r, tuple) else (r,) for r in (ours, theirs, ours_m)]
    assert len(ours) == len(theirs) == len(ours_m)
    for a, b, m in zip(ours, theirs, ours_m):
        assert a.shape == tuple(b.shape)
        np.testing.assert_array_equal(_np(a), _np(b))
        np.testing.assert_array_equal(_np(m), _np(b))


@pytest.mark.parametrize("target", [np.array([1, 2, 3]), np.array([True, False, True])])
def test_mse_loss_promotes_an_integer_target_as_torch(torch, target):
    x = np.array([0.5, -1.0, 2.5], dtype=np.float32)
    out = []
    for lib in (sg, torch):
        inp = lib.tensor(x, requires_grad=True)
        loss = lib.nn.MSELoss()(inp, lib.tensor(target))
        assert loss.grad_fn.name() == "MseLossBackward0"
        loss.backward()
        out.append((_np(loss), _np(inp.grad), str(loss.dtype).split(".")[-1]))
    assert out[0][2] == out[1][2] == "float32"
    # a mean of 3 squares and its gradient 2 (x - t) / 3
    assert_close(out[0][0], out[1][0], terms=3, dtype=np.float32)
    assert_close(out[0][1], out[1][1], terms=3, dtype=np.float32)


def test_mse_loss_of_two_integer_tensors_names_the_type_as_torch(torch):
    with pytest.raises(NotImplementedError) as theirs:
        torch.nn.functional.mse_loss(torch.tensor([1, 2]), torch.tensor([1, 3]))
    with pytest.raises(NotImplementedError) as ours:
        F.mse_loss(sg.tensor([1, 2]), sg.tensor([1, 3]))
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("call", [
    lambda L, x: L.nn.functional.batch_norm(x, L.zeros(2), L.ones(3)),
    lambda L, x: L.nn.functional.batch_norm(x, L.zeros(3), L.ones(2)),
    lambda L, x: L.nn.functional.batch_norm(x, L.zeros(3), L.ones(3), L.ones(4)),
    lambda L, x: L.nn.functional.batch_norm(x, L.zeros(3), L.ones(3), None, L.ones(1)),
    lambda L, x: L.nn.BatchNorm1d(2)(x),
    lambda L, x: L.einsum("ij,jk->ik", x, L.ones(4, 5)),
    lambda L, x: L.einsum("ij,kj->ik", x, L.ones(2, 2)),
    lambda L, x: L.nn.functional.conv2d(x.reshape(1, 1, 4, 3).double(), L.ones(1, 1, 2, 2)),
    lambda L, x: L.nn.functional.conv2d(x.reshape(1, 1, 4, 3), L.ones(1, 1, 2, 2).double()),
    lambda L, x: L.nn.functional.conv1d(x.reshape(1, 4, 3).double(), L.ones(1, 4, 2)),
])
def test_error_wording_matches_torch(torch, call):
    _same_error(torch, call, np.ones((4, 3), dtype=np.float32))


def test_load_reads_a_torch_checkpoint(torch, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    path = tmp_path / "model.pt"
    extra = {"model": model.state_dict(), "step": 7, "t": torch.arange(12.).reshape(3, 4).t(),
             "p": torch.nn.Parameter(torch.ones(2)), "i": torch.tensor([1, 2], dtype=torch.int32),
             "h": torch.tensor([0.5, -2.0], dtype=torch.float16),
             "b": torch.tensor([1.5, 3.0], dtype=torch.bfloat16),
             "dtypes": [torch.float16, torch.bfloat16, torch.int32, torch.uint8]}
    torch.save(extra, path)
    loaded = sg.load(path)
    ours = sg.nn.Sequential(sg.nn.Linear(3, 4), sg.nn.ReLU(), sg.nn.Linear(4, 2))
    ours.load_state_dict(loaded["model"])
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_array_equal(_np(ours(sg.tensor(x))), _np(model(torch.tensor(x))))
    assert loaded["step"] == 7
    np.testing.assert_array_equal(_np(loaded["t"]), _np(extra["t"]))  # strides honoured
    assert isinstance(loaded["p"], sg.nn.Parameter) and loaded["p"].requires_grad
    # torch's dtypes are kept (issue 31), values bit for bit
    assert loaded["i"].dtype == sg.int32 and _np(loaded["i"]).tolist() == [1, 2]
    assert loaded["h"].dtype == sg.float16 and _np(loaded["h"]).tolist() == [0.5, -2.0]
    assert loaded["b"].dtype == sg.bfloat16 and _np(loaded["b"]).tolist() == [1.5, 3.0]
    assert loaded["dtypes"] == [sg.float16, sg.bfloat16, sg.int32, sg.uint8]


def test_load_refuses_code_in_a_torch_checkpoint(torch, tmp_path):
    path = tmp_path / "module.pt"
    torch.save(torch.nn.Linear(2, 2), path)  # a whole module: unpickling it would run code
    import pickle

    with pytest.raises(pickle.UnpicklingError, match="state_dict"):
        sg.load(path)


@pytest.mark.parametrize("xs,ws,kw", [
    ((1, 1, 4, 3), (1, 1, 2, 2), {}), ((2, 4, 8, 8), (6, 4, 3, 3), {}),
    ((1, 4, 8, 8), (6, 4, 3, 3), {}), ((1, 2, 8, 8), (2, 1, 3, 3), {"groups": 2}),
    ((1, 1, 8, 8), (1, 1, 5, 5), {}), ((1, 4, 80, 80), (1, 4, 1, 1), {"stride": 2}),
    ((2, 3, 9), (4, 3, 3), {}), ((1, 3, 9), (4, 3, 3), {"stride": 2})])
@pytest.mark.parametrize("which", ["weight", "input"])
def test_conv_dtype_mismatch_worded_as_torch_for_the_kernel_it_picks(torch, xs, ws, kw, which):
    """torch words a float32/float64 mismatch by the kernel it would run (oneDNN or not)."""
    def call(L):
        x, w = L.zeros(*xs), L.zeros(*ws)
        x, w = (x, w.double()) if which == "weight" else (x.double(), w)
        conv = L.nn.functional.conv2d if len(xs) == 4 else L.nn.functional.conv1d
        return conv(x, w, **kw)

    with pytest.raises(RuntimeError) as theirs:
        call(torch)
    with pytest.raises(RuntimeError) as ours:
        call(sg)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("data", [[[1.0, 2.0, 0.0], [3.0, 4.0, 5.0]], [[1.0, 2.0, 3.0], [3, 4, 5]],
                                  [[0.0, 2.0, 0.0], [3.0, 4.0, 5.0]], [[1.5]]])
@pytest.mark.parametrize("dim,keep", [(None, False), (0, False), (1, True), (-1, False)])
def test_prod_values_gradients_and_nodes_match_torch(torch, data, dim, keep):
    out = []
    for lib in (sg, torch):
        x = lib.tensor(data, dtype=lib.float64, requires_grad=True)
        y = x.prod() if dim is None else x.prod(dim, keepdim=keep)
        names = sorted(a for a in dir(y.grad_fn) if a.startswith("_saved_"))
        (y * 3.0).sum().backward()
        out.append((_np(y), _np(x.grad), y.grad_fn.name(), names))
    assert out[0][2:] == out[1][2:]
    # products of at most 6 factors (and the quotient result / x) in float64
    assert_close(out[0][0], out[1][0], terms=6, dtype=np.float64)
    assert_close(out[0][1], out[1][1], terms=6, dtype=np.float64)


def test_prod_dtypes_and_empty_match_torch(torch):
    for make in (lambda L: L.tensor([1, 2, 3]).prod(), lambda L: L.tensor([True, True]).prod(),
                 lambda L: L.tensor([1.0, 2.0]).prod(dtype=L.float64),
                 lambda L: L.zeros(0).prod(), lambda L: L.zeros(2, 0).prod(1, keepdim=True),
                 lambda L: L.tensor([[2, 3], [4, 5]]).prod(axis=0, keepdims=True)):
        ours, theirs = make(sg), make(torch)
        assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
        np.testing.assert_array_equal(_np(ours), _np(theirs))


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_prod_is_verified_with_and_without_zeros(mode):
    for data in ([[1.0, 2.0, 0.5], [3.0, 4.0, 5.0]], [[1.0, 0.0, 0.0], [3.0, 0.0, 5.0]]):
        x = sg.tensor(data, dtype=sg.float64, requires_grad=True)
        report = sg.verify((x.prod(1) * sg.tensor([1.0, -2.0], dtype=sg.float64)).sum()
                           + x.prod(), names={"x": x}, mode=mode)
        assert report.ok, report


def _chain(node, depth=4):
    names = []
    while node is not None and len(names) < depth:
        names.append(node.name().split("::")[-1])
        nxt = [f for f, _ in node.next_functions if f is not None]
        node = nxt[0] if nxt else None
    return names


@pytest.mark.parametrize("xs,ts", [((2, 3, 4, 5), (2, 4, 5)), ((2, 3, 4), (2, 4)),
                                   ((2, 3, 2, 2, 3), (2, 2, 2, 3)), ((0, 3, 4), (0, 4))])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("loss", ["nll_loss", "cross_entropy"])
def test_nll_loss_nd_matches_torch(torch, xs, ts, reduction, weighted, loss):
    """(N, C, d1, ...) scores: NllLoss2DBackward0 on 4-D input, views around it otherwise,
    values and gradients as torch's (an ignored class among the targets)."""
    rng = np.random.default_rng(len(xs) * 10 + len(reduction))
    x, t = rng.standard_normal(xs), rng.integers(-1, 3, ts)
    w = rng.uniform(0.5, 2.0, 3)
    out = []
    for lib in (sg, torch):
        xx = lib.tensor(x, requires_grad=True)
        kw = {"weight": lib.tensor(w) if weighted else None, "reduction": reduction,
              "ignore_index": -1}
        value = getattr(lib.nn.functional, loss)(xx, lib.tensor(t), **kw)
        chain = _chain(value.grad_fn)
        value.sum().backward()
        out.append((_np(value), _np(xx.grad), chain))
    assert out[0][2] == out[1][2]
    # a log-softmax over 3 classes and a (weighted) mean over at most 60 terms, in float64
    eps = np.finfo(np.float64).eps
    np.testing.assert_allclose(out[0][0], out[1][0], rtol=64 * eps, atol=64 * eps)
    np.testing.assert_allclose(out[0][1], out[1][1], rtol=64 * eps, atol=64 * eps)


@pytest.mark.parametrize("xs,ts", [((2, 3, 4, 5), (2, 4, 4)), ((2, 3, 4), (2, 5)),
                                   ((2, 3, 4, 5), (3, 4, 5)), ((2, 3, 4, 5, 6), (2, 4, 5))])
def test_nll_loss_nd_shape_errors_match_torch(torch, xs, ts):
    with pytest.raises((RuntimeError, ValueError)) as theirs:
        torch.nn.functional.nll_loss(torch.zeros(xs), torch.zeros(ts, dtype=torch.long))
    with pytest.raises(type(theirs.value)) as ours:
        F.nll_loss(sg.zeros(xs), sg.zeros(ts, dtype=sg.int64))
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_nll_loss_nd_is_verified(mode):
    rng = np.random.default_rng(5)
    for xs, ts in (((2, 3, 2, 2), (2, 2, 2)), ((2, 3, 3), (2, 3))):
        x = sg.tensor(rng.standard_normal(xs), requires_grad=True)
        loss = F.cross_entropy(x, sg.tensor(rng.integers(0, 3, ts)),
                               weight=sg.tensor([1.0, 2.0, 0.5], dtype=sg.float64))
        assert sg.verify(loss, names={"x": x}, mode=mode).ok
