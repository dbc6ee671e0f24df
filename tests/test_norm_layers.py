"""layer_norm, batch_norm, dropout and embedding (functions and modules) against torch 2.13:
values, gradients of every input, grad_fn names, saved operands, running statistics,
state_dict keys, reprs, error wording, and the SymPy verifier. Dropout's random numbers
differ from torch's by design: its statistics, mask sharing and seeding are tested."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg


def _saved(node):
    return sorted(a[len("_saved_"):] for a in dir(node) if a.startswith("_saved_"))


def _grads(L, fn, arrays, dtype):
    leaves = [L.tensor(a.astype(dtype), requires_grad=True) for a in arrays]
    out = fn(L, *leaves)
    w = L.tensor(np.random.default_rng(7).uniform(-1, 1, tuple(out.shape)).astype(dtype))
    grads = L.autograd.grad((out * out * w).sum(), leaves, allow_unused=True)
    return out, grads


def _stats(L, c, dtype):
    return (L.tensor(np.linspace(-0.5, 0.5, c).astype(dtype)),
            L.tensor(np.linspace(0.5, 2.0, c).astype(dtype)))


def _bn(training, with_affine=True):
    def fn(L, x, w, b):
        rm, rv = _stats(L, x.shape[1], np.float64 if x.dtype == L.float64 else np.float32)
        return L.nn.functional.batch_norm(x, rm, rv, w if with_affine else None,
                                          b if with_affine else None, training=training,
                                          momentum=0.3)

    return fn


F_CASES = {
    "layer_norm_affine": ((4, 3, 5), (5,), (5,), lambda L, x, w, b:
                          L.nn.functional.layer_norm(x, (5,), w, b)),
    "layer_norm_2d_shape": ((2, 3, 4), (3, 4), (3, 4), lambda L, x, w, b:
                            L.nn.functional.layer_norm(x, [3, 4], w, b, eps=1e-3)),
    "layer_norm_plain": ((3, 6), (6,), (6,), lambda L, x, w, b:
                         L.nn.functional.layer_norm(x, (6,))),
    "layer_norm_weight_only": ((3, 6), (6,), (6,), lambda L, x, w, b:
                               L.nn.functional.layer_norm(x, (6,), w)),
    "batch_norm_train_2d": ((6, 3), (3,), (3,), _bn(True)),
    "batch_norm_train_3d": ((4, 3, 5), (3,), (3,), _bn(True)),
    "batch_norm_train_4d": ((2, 3, 2, 3), (3,), (3,), _bn(True)),
    "batch_norm_train_plain": ((5, 2, 3), (2,), (2,), _bn(True, False)),
    "batch_norm_eval": ((4, 3, 5), (3,), (3,), _bn(False)),
    "batch_norm_eval_plain": ((4, 3), (3,), (3,), _bn(False, False)),
    "batch_norm_no_stats": ((4, 3), (3,), (3,), lambda L, x, w, b:
                            L.nn.functional.batch_norm(x, None, None, w, b, True)),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(F_CASES))
def test_functional_matches_torch(name, dtype, cpu_backend, torch):
    xs, ws, bs, fn = F_CASES[name]
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(bs)]
    out, grads = _grads(sg, fn, arrays, dtype)
    t_out, t_grads = _grads(torch, fn, arrays, dtype)
    n = int(np.prod(xs))
    assert_close(out, t_out, terms=n, scale=magnitude(t_out, *arrays))
    for g, tg in zip(grads, t_grads):
        assert (g is None) == (tg is None)
        if g is not None:
            assert_close(g, tg, terms=4 * n, scale=magnitude(tg, *arrays) ** 3 + 1)
    assert out.grad_fn.name() == t_out.grad_fn.name()
    assert _saved(out.grad_fn) == _saved(t_out.grad_fn)
    assert [f is None for f, _ in out.grad_fn.next_functions] == \
        [f is None for f, _ in t_out.grad_fn.next_functions]


@pytest.mark.parametrize("name", ["layer_norm_affine", "batch_norm_train_3d", "batch_norm_eval"])
def test_second_derivatives_match_torch(name, torch):
    xs, ws, bs, fn = F_CASES[name]
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(bs)]
    results = []
    for L in (sg, torch):
        leaves = [L.tensor(a, requires_grad=True) for a in arrays]
        out = fn(L, *leaves)
        gx = L.autograd.grad((out * out).sum(), leaves[0], create_graph=True)[0]
        results.append([g.detach().numpy() for g in L.autograd.grad(
            (gx * gx).sum(), leaves[:2])])
    for a, b in zip(*results):
        assert_close(a, b, terms=4 * int(np.prod(xs)), scale=magnitude(b, *arrays) ** 3 + 1)


def test_batch_norm_running_statistics_follow_torch(torch):
    rng = np.random.default_rng(5)
    batches = [rng.standard_normal((6, 3, 4)).astype(np.float32) for _ in range(3)]
    for momentum in (0.1, None):
        mods = [L.nn.BatchNorm1d(3, momentum=momentum) for L in (sg, torch)]
        for xb in batches:
            for L, m in zip((sg, torch), mods):
                m(L.tensor(xb))
        s, t = mods
        assert_close(s.running_mean, t.running_mean, terms=24 * 3, scale=magnitude(*batches))
        assert_close(s.running_var, t.running_var, terms=24 * 3,
                     scale=magnitude(*batches) ** 2)
        assert int(s.num_batches_tracked) == int(t.num_batches_tracked) == 3
        for m in mods:
            m.eval()
        out = [m(L.tensor(batches[0])) for L, m in zip((sg, torch), mods)]
        assert_close(out[0], out[1], terms=32, scale=magnitude(out[1], batches[0]))


def test_batch_norm_2d_module_train_and_eval(torch):
    rng = np.random.default_rng(6)
    xb = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    outs = []
    for L in (sg, torch):
        L.manual_seed(0)
        m = L.nn.BatchNorm2d(3)
        with L.no_grad():
            m.weight.copy_(L.tensor([1.0, 2.0, 0.5]))
        x = L.tensor(xb, requires_grad=True)
        y = m(x)
        y.sum().backward()
        m.eval()
        outs.append((y, x.grad, m(L.tensor(xb)), m.running_var, list(m.state_dict())))
    for a, b in zip(outs[0][:4], outs[1][:4]):
        assert_close(a, b, terms=64, scale=magnitude(b, xb) + 1)
    assert outs[0][4] == outs[1][4]


@pytest.mark.parametrize("kwargs", [{}, {"affine": False}, {"track_running_stats": False},
                                    {"bias": False}, {"momentum": None, "eps": 1e-3}])
def test_batch_norm_modules_state_and_repr(kwargs, torch):
    for cls in ("BatchNorm1d", "BatchNorm2d"):
        s, t = getattr(sg.nn, cls)(4, **kwargs), getattr(torch.nn, cls)(4, **kwargs)
        assert list(s.state_dict()) == list(t.state_dict())
        assert repr(s) == repr(t)
        assert [n for n, _ in s.named_parameters()] == [n for n, _ in t.named_parameters()]
    with pytest.raises(ValueError, match="expected 4D input"):
        sg.nn.BatchNorm2d(3)(sg.ones(2, 3))


@pytest.mark.parametrize("kwargs", [{}, {"elementwise_affine": False}, {"bias": False},
                                    {"eps": 1e-3}])
def test_layer_norm_module(kwargs, torch):
    xb = np.random.default_rng(8).standard_normal((2, 3, 4)).astype(np.float32)
    s, t = sg.nn.LayerNorm((3, 4), **kwargs), torch.nn.LayerNorm((3, 4), **kwargs)
    assert list(s.state_dict()) == list(t.state_dict()) and repr(s) == repr(t)
    assert_close(s(sg.tensor(xb)), t(torch.tensor(xb)), terms=24, scale=magnitude(xb))


def test_embedding_matches_torch(cpu_backend, torch):
    w = np.random.default_rng(9).standard_normal((6, 3))
    idx = [[1, 2, 1], [0, 5, 1]]
    for kwargs in ({}, {"padding_idx": 1}, {"padding_idx": -1}, {"scale_grad_by_freq": True}):
        res = []
        for L in (sg, torch):
            weight = L.tensor(w, requires_grad=True)
            y = L.nn.functional.embedding(L.tensor(idx), weight, **kwargs)
            (y * y).sum().backward()
            res.append((y, weight.grad, y.grad_fn))
        assert_close(res[0][0], res[1][0], terms=1, scale=1)
        assert_close(res[0][1], res[1][1], terms=4, scale=magnitude(w))
        assert res[0][2].name() == res[1][2].name() == "EmbeddingBackward0"
        assert _saved(res[0][2]) == _saved(res[1][2])
        assert res[0][2]._saved_padding_idx == res[1][2]._saved_padding_idx
        assert res[0][2]._saved_weight_sym_argsize_0 == 6


def test_embedding_module(torch):
    s, t = sg.nn.Embedding(5, 3, padding_idx=0), torch.nn.Embedding(5, 3, padding_idx=0)
    assert repr(s) == repr(t) and list(s.state_dict()) == list(t.state_dict())
    assert s.weight[0].tolist() == [0.0, 0.0, 0.0]
    out = s(sg.tensor([[0, 4], [2, 0]]))
    out.sum().backward()
    assert tuple(out.shape) == (2, 2, 3) and s.weight.grad[0].tolist() == [0.0, 0.0, 0.0]
    assert s.weight.grad[4].tolist() == [1.0, 1.0, 1.0]


EMBEDDING_ERRORS = [
    lambda L: L.nn.functional.embedding(L.tensor([7]), L.ones(3, 4)),
    lambda L: L.nn.functional.embedding(L.tensor([1.0]), L.ones(3, 4)),
    lambda L: L.nn.functional.dropout(L.ones(3), 1.5),
    lambda L: L.nn.functional.layer_norm(L.ones(3, 5), (4,)),
    lambda L: L.nn.functional.batch_norm(L.ones(3, 2), None, None, training=False),
    lambda L: L.nn.functional.batch_norm(L.ones(1, 2), None, None, training=True),
]


@pytest.mark.parametrize("k", range(len(EMBEDDING_ERRORS)))
def test_errors_have_torch_wording(k, torch):
    messages = []
    for L in (sg, torch):
        with pytest.raises(Exception) as info:
            EMBEDDING_ERRORS[k](L)
        messages.append((type(info.value), str(info.value).splitlines()[0].replace(
            "symgrad.", "torch.")))
    assert messages[0] == messages[1]


def test_embedding_max_norm_says_it_is_not_implemented():
    with pytest.raises(NotImplementedError, match="max_norm"):
        sg.nn.functional.embedding(sg.tensor([0]), sg.ones(3, 2), max_norm=1.0)


# -- dropout -----------------------------------------------------------------------------------
def test_dropout_statistics_and_graph(cpu_backend):
    sg.manual_seed(0)
    x = sg.ones(200, 100, requires_grad=True)
    y = sg.nn.functional.dropout(x, 0.3)
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.7) < 5 * np.sqrt(0.7 * 0.3 / 20000)
    assert set(np.unique(y.detach().numpy())) <= {np.float32(0), np.float32(1) / np.float32(0.7)}
    assert y.grad_fn.name() == "MulBackward0"
    assert _saved(y.grad_fn) == ["other", "self"]
    assert y.grad_fn.next_functions[1] == (None, 0)
    y.backward(sg.ones(200, 100))
    # the backward uses the forward's mask: kept elements get 1/(1-p), dropped ones 0
    assert np.array_equal(x.grad.numpy(), y.detach().numpy())


def test_dropout_edges_and_seeding():
    x = sg.randn(4, 5, requires_grad=True)
    assert sg.nn.functional.dropout(x, 0.0) is x
    assert sg.nn.functional.dropout(x, 0.5, training=False) is x
    zero = sg.nn.functional.dropout(x, 1.0)
    assert zero.abs().sum().item() == 0 and zero.grad_fn.name() == "MulBackward0"
    sg.manual_seed(123)
    a = sg.nn.functional.dropout(x, 0.5)
    sg.manual_seed(123)
    b = sg.nn.functional.dropout(x, 0.5)
    assert sg.equal(a, b)
    m = sg.nn.Dropout(0.5)
    assert repr(m) == "Dropout(p=0.5, inplace=False)"
    m.eval()
    assert m(x) is x
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        sg.nn.Dropout(-0.1)


# -- verifier ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["layer_norm_affine", "layer_norm_plain", "batch_norm_train_2d",
                                  "batch_norm_eval"])
def test_verify_exact(name):
    xs, ws, bs, fn = F_CASES[name]
    rng = np.random.default_rng(10)
    xs = (3, 2) if name.startswith("batch") else (2, 3)
    ws = bs = (xs[1],) if name.startswith("batch") else (3,)
    leaves = [sg.tensor(rng.standard_normal(s), requires_grad=True) for s in (xs, ws, bs)]
    if name.startswith("layer"):
        out = sg.nn.functional.layer_norm(leaves[0], (3,), *(leaves[1:] if "affine" in name
                                                             else (None, None)))
    else:
        out = fn(sg, *leaves)
    loss = (out * sg.tensor(rng.uniform(-1, 1, xs))).sum()
    loss.backward(retain_graph=True)
    report = sg.verify(loss, mode="exact")
    assert report.ok, report


def test_verify_embedding_exact_and_local_on_a_bigger_model():
    rng = np.random.default_rng(11)
    weight = sg.tensor(rng.standard_normal((5, 3)), requires_grad=True)
    # (padding_idx is torch's convention that its row gets no gradient although the forward
    # reads it; the SymPy meaning differentiates it, so the verifier would flag it)
    y = sg.nn.functional.embedding(sg.tensor([[0, 2], [2, 4]]), weight, padding_idx=1)
    loss = (y * y).sum()
    loss.backward(retain_graph=True)
    assert sg.verify(loss, mode="exact").ok
    x = sg.tensor(rng.standard_normal((8, 6)), requires_grad=True)
    w = sg.tensor(rng.standard_normal(6), requires_grad=True)
    h = sg.nn.functional.layer_norm(x, (6,), w)
    h = sg.nn.functional.batch_norm(h, None, None, training=True)
    loss = (h * h * h).sum()
    loss.backward(retain_graph=True)
    report = sg.verify(loss, mode="local")
    assert report.ok, report
