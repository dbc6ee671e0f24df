"""symgrad.nn against torch.nn: grad_fn and saved names, loss values and gradients, the
Module API (traversal, modes, state dicts, reprs), Parameter, Linear's init, save/load."""

from __future__ import annotations

import csv
import io
import math
import pathlib
import pickle
from collections import OrderedDict

import numpy as np
import pytest
from _oracle import program_terms
from _tolerance import assert_close, magnitude

import symgrad as sg
import symgrad.nn as nn
import symgrad.nn.functional as F

# A copy of shared/torch_grad_fn_names.tsv (PyTorch 2.13.0 grad_fn and saved names).
TSV = pathlib.Path(__file__).resolve().parent / "data" / "torch_grad_fn_names.tsv"


def _lib_F(lib):
    if lib is sg:
        return F
    import torch.nn.functional as TF

    return TF


def _leaf(lib, arr, requires_grad=True):
    return lib.tensor(np.array(arr, copy=True), requires_grad=requires_grad)


# -- the nn/loss rows of the tsv ---------------------------------------------------------------
def _row_linear(lib):
    rng = np.random.default_rng(0)
    M = _leaf(lib, rng.standard_normal((2, 3)))
    W = _leaf(lib, rng.standard_normal((4, 3)))
    b = _leaf(lib, rng.standard_normal(4))
    return _lib_F(lib).linear(M, W, b), {"M": M, "W": W, "b": b}


def _row_mse(lib):
    rng = np.random.default_rng(1)
    a = _leaf(lib, rng.standard_normal(3))
    b = _leaf(lib, rng.standard_normal(3), requires_grad=False)
    return _lib_F(lib).mse_loss(a, b), {"a": a, "b": b}


def _row_bce(lib):
    rng = np.random.default_rng(2)
    a = _leaf(lib, rng.standard_normal(3))
    t = _leaf(lib, rng.uniform(0, 1, 3), requires_grad=False)
    return _lib_F(lib).binary_cross_entropy_with_logits(a, t), {"a": a, "t": t}


def _row_cross_entropy(lib):
    rng = np.random.default_rng(3)
    M = _leaf(lib, rng.standard_normal((2, 3)))
    target = lib.tensor([0, 2])
    return _lib_F(lib).cross_entropy(M, target), {"M": M, "target": target}


NN_ROWS = {
    "nn.Linear(3, 4)(M)": _row_linear,
    "F.mse_loss(a, b)": _row_mse,
    "F.binary_cross_entropy_with_logits(a, t)": _row_bce,
    "F.cross_entropy(M, tensor([0, 2]))": _row_cross_entropy,
}


def _saved_names(node):
    return {a for a in dir(node) if a.startswith("_saved_")}


def _same_value(mine, ref, torch, terms):
    if isinstance(ref, torch.Tensor):
        assert isinstance(mine, sg.Tensor)
        assert_close(mine, ref, terms=terms)
    elif ref is None:
        assert mine is None
    else:
        assert mine == ref


@pytest.mark.parametrize("row", sorted(NN_ROWS))
def test_nn_rows_grad_fn_and_saved_names_match_torch(row, torch):
    ours, our_inputs = NN_ROWS[row](sg)
    theirs, their_inputs = NN_ROWS[row](torch)
    g, tg = ours.grad_fn, theirs.grad_fn
    assert g.name() == tg.name()
    assert _saved_names(g) == _saved_names(tg)
    for attr in sorted(_saved_names(tg)):
        if attr == "_saved_ignore_index":  # torch reads -100 back as 2**64 - 100
            assert getattr(g, attr) == -100 and getattr(tg, attr) % 2 ** 64 == 2 ** 64 - 100
            continue
        # a saved value is an input or the row's one op's result, whose reductions span
        # at most the row's elements
        terms = sum(int(np.prod(v.shape)) for v in their_inputs.values())
        _same_value(getattr(g, attr), getattr(tg, attr), torch, terms)
    # saved inputs are the user's own objects, as in torch
    for attr, name in (("_saved_self", "a"), ("_saved_target", "b"), ("_saved_target", "t"),
                       ("_saved_mat1", "M"), ("_saved_target", "target")):
        if name in their_inputs and attr in _saved_names(tg) and \
                getattr(tg, attr) is their_inputs[name]:
            assert getattr(g, attr) is our_inputs[name], (attr, name)
    # the edges: one per differentiable input, with torch's node names
    names = [None if n is None else n.name().replace("torch::autograd::", "")
             for n, _ in g.next_functions]
    tnames = [None if n is None else n.name().replace("torch::autograd::", "")
              for n, _ in tg.next_functions]
    assert names == tnames


@pytest.mark.parametrize("row", sorted(NN_ROWS))
def test_nn_rows_match_the_shared_tsv(row):
    with open(TSV, newline="") as fh:
        rows = {r[0].split("  ")[0]: (r[1], set(r[2].split()) if len(r) > 2 else set())
                for r in csv.reader(fh, delimiter="\t") if len(r) >= 2}
    name, saved = rows[row]
    node = NN_ROWS[row](sg)[0].grad_fn
    assert node.name() == name
    assert _saved_names(node) == saved


def test_cross_entropy_is_nll_over_log_softmax_and_saves_total_weight(torch):
    out, ins = _row_cross_entropy(sg)
    node = out.grad_fn
    assert node.next_functions[0][0].name() == "LogSoftmaxBackward0"
    assert node._saved_target is ins["target"]
    assert node._saved_total_weight.item() == 2.0 and node._saved_weight is None
    assert node._saved_reduction == 1


# -- loss values and gradients vs torch --------------------------------------------------------
def _compare(fn, arrays, torch, grad_inputs=None, consts=()):
    """Run fn(lib, *tensors) in both libraries (float64); compare output and input grads.

    The bound (tests/_tolerance.py): no loss or layer here reduces over more elements than
    its inputs and output hold (``program_terms``); the summed terms are products of the
    inputs, the cotangent (<= 1.5) and the constant weights ``consts``, and may cancel (a
    gradient such as sigmoid(x) - t): their magnitude joins the result's in the scale."""
    grad_inputs = grad_inputs if grad_inputs is not None else range(len(arrays))
    results = []
    for lib in (sg, torch):
        xs = [lib.tensor(np.array(a, copy=True), requires_grad=i in grad_inputs
                         and np.asarray(a).dtype.kind == "f") for i, a in enumerate(arrays)]
        out = fn(lib, *xs)
        cot = np.random.default_rng(9).uniform(0.5, 1.5, size=tuple(out.shape))
        (out * lib.tensor(cot)).sum().backward()
        results.append((out.detach().numpy(), [None if x.grad is None else x.grad.numpy()
                                               for x in xs]))
    (o, gs), (to, tgs) = results
    terms = program_terms([np.asarray(a) for a in arrays], np.shape(to))
    floats = [a for a in arrays if np.asarray(a).dtype.kind == "f"]
    weight = 1.5 * np.prod([max(1.0, magnitude(c)) for c in consts if c is not None])
    assert_close(o, to, terms=terms, scale=magnitude(to, *floats) * weight)
    for g, tg in zip(gs, tgs, strict=True):
        assert (g is None) == (tg is None)
        if g is not None:
            assert_close(g, tg, terms=terms, scale=magnitude(tg, *floats) * weight)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_matches_torch(reduction, torch, rng):
    a, b = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    _compare(lambda L, x, y: _lib_F(L).mse_loss(x, y, reduction=reduction), [a, b], torch)


def test_mse_loss_broadcasts_with_torchs_warning(torch, rng):
    a, b = rng.standard_normal((4, 3)), rng.standard_normal(3)
    with pytest.warns(UserWarning, match="target size"):
        _compare(lambda L, x, y: _lib_F(L).mse_loss(x, y), [a, b], torch)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("extras", ["plain", "weight", "pos_weight", "both"])
def test_bce_with_logits_matches_torch(reduction, extras, torch, rng):
    x = rng.standard_normal((5, 3)) * 4
    x[0, 0], x[0, 1] = 40.0, -40.0  # far tails stay finite and exact
    t = rng.uniform(0, 1, (5, 3))
    w = rng.uniform(0.5, 2, 3) if extras in ("weight", "both") else None
    pw = rng.uniform(0.5, 3, 3) if extras in ("pos_weight", "both") else None

    def fn(L, x, t):
        return _lib_F(L).binary_cross_entropy_with_logits(
            x, t, weight=None if w is None else L.tensor(w),
            pos_weight=None if pw is None else L.tensor(pw), reduction=reduction)

    _compare(fn, [x, t], torch, consts=(w, pw))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_matches_torch(reduction, weighted, torch, rng):
    x = rng.standard_normal((6, 4))
    target = np.array([0, 3, 1, -100, 2, 3])
    w = rng.uniform(0.5, 2, 4) if weighted else None

    def ce(L, x, t):
        return _lib_F(L).cross_entropy(x, t, weight=None if w is None else L.tensor(w),
                                       reduction=reduction)

    _compare(ce, [x, target], torch, grad_inputs=[0], consts=(w,))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [-100, 3])
def test_nll_loss_matches_torch(reduction, weighted, ignore_index, torch, rng):
    x = rng.standard_normal((6, 4))
    target = np.array([0, 3, 1, -100, 2, 3]) if ignore_index == -100 else \
        np.array([0, 1, 2, 0, 3, 3])
    w = rng.uniform(0.5, 2, 4) if weighted else None

    def nll(L, x, t):
        return _lib_F(L).nll_loss(x, t, weight=None if w is None else L.tensor(w),
                                  ignore_index=ignore_index, reduction=reduction)

    _compare(nll, [x, target], torch, grad_inputs=[0], consts=(w,))
    _compare(nll, [x[0], target[0]], torch, grad_inputs=[0], consts=(w,))  # (C,) and ()


def test_cross_entropy_on_one_sample_and_on_probabilities(torch, rng):
    x = rng.standard_normal(5)
    _compare(lambda L, x, t: _lib_F(L).cross_entropy(x, t), [x, np.array(2)], torch, [0])
    xb = rng.standard_normal((3, 4))
    p = rng.dirichlet(np.ones(4), size=3)
    for reduction in ("mean", "sum", "none"):
        _compare(lambda L, x, t, r=reduction: _lib_F(L).cross_entropy(x, t, reduction=r),
                 [xb, p], torch, [0])


def test_loss_second_derivatives_match_torch(torch, rng):
    """Backward formulas are tensor ops, so create_graph=True differentiates them again."""
    x, t = rng.standard_normal((3, 2)), rng.uniform(0, 1, (3, 2))
    pw = rng.uniform(0.5, 2, 2)
    hs = []
    for lib in (sg, torch):
        xs, ts = lib.tensor(x, requires_grad=True), lib.tensor(t, requires_grad=True)
        Fl = _lib_F(lib)
        loss = Fl.mse_loss(xs, ts) + Fl.binary_cross_entropy_with_logits(
            xs, ts, pos_weight=lib.tensor(pw)) + Fl.cross_entropy(xs, lib.tensor([1, 0, 1]))
        gx, gt = lib.autograd.grad(loss, (xs, ts), create_graph=True)
        hs.append([h.numpy() for h in lib.autograd.grad((gx * gx).sum() + (gt * gx).sum(),
                                                        (xs, ts))])
    # the three losses over 6 elements, differentiated twice: program_terms over x, t and
    # the output; the terms are products of x, t and pos_weight (<= 2), and may cancel
    terms = program_terms([x, t], (), create_graph=True)
    for h, th in zip(*hs, strict=True):
        assert_close(h, th, terms=terms, scale=magnitude(th, x, t) * 2)


@pytest.mark.parametrize("shape,bias", [((2, 3), True), ((2, 3), False), ((3,), True),
                                        ((3,), False), ((2, 5, 3), True), ((2, 5, 3), False)])
def test_linear_matches_torch_on_every_input_rank(shape, bias, torch, rng):
    x, W, b = rng.standard_normal(shape), rng.standard_normal((4, 3)), rng.standard_normal(4)
    if bias:
        _compare(lambda L, x, W, b: _lib_F(L).linear(x, W, b), [x, W, b], torch)
    else:
        _compare(lambda L, x, W: _lib_F(L).linear(x, W), [x, W], torch)
    out = F.linear(sg.tensor(x), sg.tensor(W, requires_grad=True), sg.tensor(b) if bias else None)
    tout = torch.nn.functional.linear(torch.tensor(x), torch.tensor(W, requires_grad=True),
                                      torch.tensor(b) if bias else None)
    assert out.grad_fn.name() == tout.grad_fn.name()
    assert [n is None or n.name() for n, _ in out.grad_fn.next_functions] == \
        [n is None or n.name() for n, _ in tout.grad_fn.next_functions]


def test_linear_module_float32_matches_torch(torch):
    lin = nn.Linear(3, 2)
    tlin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        tlin.weight.copy_(torch.from_numpy(lin.weight.detach().numpy()))
        tlin.bias.copy_(torch.from_numpy(lin.bias.detach().numpy()))
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    y, ty = lin(sg.tensor(x)), tlin(torch.tensor(x))
    assert y.dtype is sg.float32
    # BLAS and torch sum the K = 3 products and the bias in different orders: 4 terms of
    # |x| @ |W|.T + |b|, elementwise
    w, b = lin.weight.detach().numpy(), lin.bias.detach().numpy()
    assert_close(y, ty, terms=4, scale=np.abs(x) @ np.abs(w).T + np.abs(b))
    y.sum().backward()
    ty.sum().backward()
    assert_close(lin.weight.grad, tlin.weight.grad, terms=4)  # sums of 4 positive rows
    # addmm's backward lays the gradient out like W.t(), so W.grad is contiguous (as torch's)
    assert lin.weight.grad.is_contiguous() and tlin.weight.grad.is_contiguous()
    np.testing.assert_array_equal(lin.bias.grad.numpy(), tlin.bias.grad.numpy())  # 4 ones


# -- errors: torch's exception types and key words ---------------------------------------------
ERROR_CASES = [
    ("bad_reduction", lambda L, T: _lib_F(L).mse_loss(T(2, 3), T(2, 3), reduction="avg"),
     ValueError, "not a valid value for reduction"),
    ("bce_shape", lambda L, T: _lib_F(L).binary_cross_entropy_with_logits(T(2, 3), T(3)),
     ValueError, "must be the same as input size"),
    ("nll_out_of_bounds", lambda L, T: _lib_F(L).nll_loss(T(2, 3), L.tensor([0, 5])),
     IndexError, "out of bounds"),
    ("nll_negative", lambda L, T: _lib_F(L).nll_loss(T(2, 3), L.tensor([0, -3])),
     IndexError, "out of bounds"),
    ("nll_batch", lambda L, T: _lib_F(L).nll_loss(T(2, 3), L.tensor([0, 1, 2])),
     ValueError, "batch_size"),
    ("nll_float_target", lambda L, T: _lib_F(L).nll_loss(T(2, 3), L.tensor([0.0, 1.0])),
     RuntimeError, "Long"),
    ("linear_shape", lambda L, T: _lib_F(L).linear(T(2, 3), T(4, 5)),
     RuntimeError, "cannot be multiplied"),
    ("linear_dtype", lambda L, T: _lib_F(L).linear(T(2, 3).double(), T(4, 3), T(4)),
     RuntimeError, "same dtype"),
    ("mse_int", lambda L, T: _lib_F(L).mse_loss(L.tensor([1, 2]), L.tensor([1, 2])),
     NotImplementedError, "Long"),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_errors_match_torch(case, torch):
    _, fn, exc, words = case
    for lib in (sg, torch):
        def T(*shape, lib=lib):
            return lib.ones(*shape)

        with pytest.raises(exc, match=words):
            fn(lib, T)


# -- Module API --------------------------------------------------------------------------------
def _pair(lib):
    return lib.nn.Sequential(lib.nn.Linear(2, 3), lib.nn.ReLU(),
                             lib.nn.Sequential(lib.nn.Tanh(), lib.nn.Sigmoid()),
                             lib.nn.MSELoss(), lib.nn.BCEWithLogitsLoss(),
                             lib.nn.CrossEntropyLoss(), lib.nn.Linear(2, 3, bias=False))


def test_module_repr_traversal_and_state_dict_keys_match_torch(torch):
    m, tm = _pair(sg), _pair(torch)
    assert repr(m) == repr(tm)
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()]
    assert [type(c).__name__ for c in m.children()] == [type(c).__name__ for c in tm.children()]
    assert [type(c).__name__ for c in m.modules()] == [type(c).__name__ for c in tm.modules()]
    assert [n for n, _ in m.named_modules()] == [n for n, _ in tm.named_modules()]
    assert list(m.state_dict()) == list(tm.state_dict())
    assert [tuple(p.shape) for p in m.parameters()] == [tuple(p.shape) for p in tm.parameters()]
    assert len(m) == len(tm) and type(m[1]).__name__ == "ReLU"
    assert repr(m[-1]) == repr(tm[-1]) and repr(m[1:3]) == repr(tm[1:3])
    assert repr(nn.ReLU(inplace=True)) == repr(torch.nn.ReLU(inplace=True))


def test_parameter_is_a_tensor_with_torchs_repr(torch):
    p = nn.Parameter(sg.tensor([1.0, 2.0]))
    assert isinstance(p, sg.Tensor) and isinstance(p, nn.Parameter)
    assert p.requires_grad and p.is_leaf and p.grad_fn is None
    assert repr(p) == repr(torch.nn.Parameter(torch.tensor([1.0, 2.0])))
    q = p * 2  # ops give plain tensors
    assert type(q) is sg.Tensor and q.grad_fn.name() == "MulBackward0"
    frozen = nn.Parameter(sg.zeros(2), requires_grad=False)
    assert not frozen.requires_grad
    data = sg.ones(3)
    assert nn.Parameter(data)._storage is data._storage  # shares memory with data, as torch
    assert nn.Parameter(data).numel() == 3


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 3)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(3, 1)
        self.scale = nn.Parameter(sg.ones(1))
        self.register_buffer("offset", sg.zeros(1))
        self.note = "plain attribute"

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) * self.scale + self.offset


def test_custom_module_registers_by_attribute():
    net = _Net()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["scale", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert [n for n, _ in net.named_buffers()] == ["offset"]
    assert list(net.state_dict()) == ["scale", "offset", "fc1.weight", "fc1.bias",
                                      "fc2.weight", "fc2.bias"]
    assert [n for n, _ in net.named_children()] == ["fc1", "act", "fc2"]
    assert net.note == "plain attribute"
    out = net(sg.ones(2, 4))
    assert tuple(out.shape) == (2, 1)
    with pytest.raises(TypeError, match="cannot assign"):
        net.scale = sg.ones(1)
    net.scale = None
    assert [n for n, _ in net.named_parameters()][0] == "fc1.weight"
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = net.missing
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()(1)

    class Early(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(sg.ones(1))

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Early()


def test_train_eval_and_requires_grad_propagate():
    net = _Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_zero_grad_set_to_none_or_zeroes_in_place():
    net = _Net()
    net(sg.ones(2, 4)).sum().backward()
    grads = [p.grad for p in net.parameters()]
    assert all(g is not None for g in grads)
    net.zero_grad(set_to_none=False)
    for p, g in zip(net.parameters(), grads, strict=True):
        assert p.grad is g and not g.numpy().any()
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_state_dict_roundtrip_and_torchs_load_errors(torch):
    a, b = _Net(), _Net()
    sd = a.state_dict()
    assert not any(v.requires_grad for v in sd.values())
    assert sd["fc1.weight"]._storage is a.fc1.weight._storage  # detached views, as torch
    result = b.load_state_dict(sd)
    assert repr(result) == "<All keys matched successfully>"
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
        assert p._storage is not q._storage
    for lib in (sg, torch):
        lin = lib.nn.Linear(2, 3)
        with pytest.raises(RuntimeError) as err:
            lin.load_state_dict({"weight": lib.ones(3, 3), "bias": lib.ones(3),
                                 "foo": lib.ones(1)})
        msg = str(err.value).replace("torch.Size", "Size").replace("symgrad.Size", "Size")
        assert msg.startswith("Error(s) in loading state_dict for Linear:")
        assert 'Unexpected key(s) in state_dict: "foo".' in msg
        assert "size mismatch for weight: copying a param with shape Size([3, 3])" in msg
        with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "weight", '
                                               '"bias"'):
            lin.load_state_dict({})
        res = lin.load_state_dict({"bias": lib.zeros(3)}, strict=False)
        assert res.missing_keys == ["weight"] and res.unexpected_keys == []


def test_module_to_dtype_keeps_parameter_identity_and_cuda_is_explicit():
    lin = nn.Linear(3, 2)
    w = lin.weight
    before = w.detach().numpy().copy()
    assert lin.double() is lin
    assert lin.weight is w and w.dtype is sg.float64 and w.requires_grad
    np.testing.assert_array_equal(w.detach().numpy(), before)  # float32 -> float64: exact
    assert lin(sg.ones(1, 3, dtype=sg.float64)).dtype is sg.float64
    lin.float()
    assert w.dtype is sg.float32
    if not sg.cuda.is_available():
        with pytest.raises(RuntimeError, match="NUMBA_ENABLE_CUDASIM"):
            lin.to("cuda")


def test_sequential_from_ordered_dict_and_append():
    seq = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", nn.ReLU())]))
    assert [n for n, _ in seq.named_children()] == ["fc", "act"]
    seq.append(nn.Sigmoid())
    assert [n for n, _ in seq.named_children()] == ["fc", "act", "2"]
    assert len(list(iter(seq))) == 3
    with pytest.raises(IndexError):
        seq[3]


# -- Linear's default init ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [sg.float32, sg.float64])
def test_linear_init_follows_torchs_bounds(dtype, torch):
    """kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(in), 1/sqrt(in)); the bias uses the same bound."""
    sg.manual_seed(0)
    fan_in, fan_out = 400, 300
    lin = nn.Linear(fan_in, fan_out, dtype=dtype)
    bound = 1 / math.sqrt(fan_in)
    w = lin.weight.detach().numpy().astype(np.float64).ravel()
    b = lin.bias.detach().numpy().astype(np.float64)
    assert lin.weight.dtype is dtype and tuple(lin.weight.shape) == (fan_out, fan_in)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    n = w.size
    assert abs(w.mean()) < 5 * bound / math.sqrt(3 * n)  # 5 sigma of the mean
    assert abs(w.var() / (bound ** 2 / 3) - 1) < 0.02  # variance of U(-b, b) is b^2/3
    assert w.min() < -0.999 * bound and w.max() > 0.999 * bound  # fills the whole interval
    counts, _ = np.histogram(w, bins=20, range=(-bound, bound))
    expected = n / 20
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 50  # 19 degrees of freedom: p < 1e-4 for a correct uniform
    # torch's own Linear has the same support
    tw = torch.nn.Linear(fan_in, fan_out).weight.detach().numpy()
    assert np.abs(tw).max() <= bound and np.abs(tw).max() > 0.999 * bound
    assert abs(tw.var() / w.var() - 1) < 0.03
    # different draws per layer and per seed; the same draws for the same seed
    sg.manual_seed(0)
    again = nn.Linear(fan_in, fan_out, dtype=dtype).weight.detach().numpy()
    np.testing.assert_array_equal(again, lin.weight.detach().numpy())


# -- save / load -------------------------------------------------------------------------------
def test_save_load_tensors_and_state_dicts(tmp_path):
    net = _Net()
    path = tmp_path / "net.sg"
    sg.save(net.state_dict(), path)
    other = _Net()
    other.load_state_dict(sg.load(path))
    x = sg.ones(2, 4)
    np.testing.assert_array_equal(net(x).detach().numpy(), other(x).detach().numpy())
    buf = io.BytesIO()
    t = sg.tensor([[1.0, 2.0]], dtype=sg.float64, requires_grad=True)
    sg.save({"t": t, "p": nn.Parameter(sg.ones(2)), "meta": [1, "a"]}, buf)
    buf.seek(0)
    back = sg.load(buf)
    assert back["t"].dtype is sg.float64 and back["t"].requires_grad
    assert back["t"].tolist() == [[1.0, 2.0]] and isinstance(back["p"], nn.Parameter)
    assert back["meta"] == [1, "a"]


def test_load_refuses_arbitrary_objects_unless_trusted():
    buf = io.BytesIO()
    pickle.dump({"obj": _Net}, buf)
    buf.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        sg.load(buf)
    buf.seek(0)
    assert sg.load(buf, weights_only=False)["obj"] is _Net


def test_no_reference_cycles_in_a_trained_module(no_gc):
    import gc
    import weakref

    net = _Net()
    loss = F.mse_loss(net(sg.ones(3, 4)), sg.zeros(3, 1))
    loss.backward()
    ref = weakref.ref(net.fc1.weight)
    del net, loss
    assert ref() is None
    assert gc.collect() == 0


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_functions_and_modules_match_torch(name, torch, rng):
    x = rng.standard_normal((3, 4))
    _compare(lambda L, x: getattr(_lib_F(L), name)(x, 1), [x], torch)
    _compare(lambda L, x: getattr(_lib_F(L), name)(x, dim=0), [x], torch)
    module = {"softmax": "Softmax", "log_softmax": "LogSoftmax"}[name]
    _compare(lambda L, x: getattr(L.nn, module)(dim=-1)(x), [x], torch)
    assert repr(getattr(nn, module)(dim=1)) == repr(getattr(torch.nn, module)(dim=1))
    out = getattr(F, name)(sg.tensor(x, requires_grad=True), 1)
    assert out.grad_fn.name() == {"softmax": "SoftmaxBackward0",
                                  "log_softmax": "LogSoftmaxBackward0"}[name]


# -- the ops' SymPy meaning: their forwards replayed on symbols are exact ----------------------
def _replay_cases(rng):
    w, pw = sg.tensor(rng.uniform(0.5, 2, 3)), sg.tensor(rng.uniform(1, 2, 3))
    x23, t23 = rng.standard_normal((2, 3)), rng.uniform(0, 1, (2, 3))
    cases = [("addmm", [rng.standard_normal(3), rng.standard_normal((2, 4)),
                        rng.standard_normal((4, 3))], {"beta": 0.5, "alpha": 2})]
    for red in (0, 1, 2):
        cases += [
            ("mse_loss", [x23, rng.standard_normal((2, 3))], {"reduction": red}),
            ("binary_cross_entropy_with_logits", [x23, t23], {"reduction": red}),
            ("binary_cross_entropy_with_logits", [x23, t23],
             {"reduction": red, "weight": w, "pos_weight": pw}),
            ("nll_loss", [rng.standard_normal((3, 4))],
             {"reduction": red, "target": sg.tensor([0, 3, -100]),
              "weight": sg.tensor(rng.uniform(0.5, 2, 4)), "ignore_index": -100}),
            ("nll_loss", [rng.standard_normal(4)],
             {"reduction": red, "target": sg.tensor(2), "weight": None, "ignore_index": -100}),
        ]
    return cases


def test_structural_forwards_replayed_on_sympy_are_exact(rng):
    """STRUCTURAL claims: the forward on object arrays of symbols is the op's meaning."""
    import sympy

    from symgrad.backends.numpy_backend import NumpyBackend
    from symgrad.backends.sympy_backend import SympyBackend
    from symgrad.ops import OPS

    sym_be, num_be = SympyBackend(), NumpyBackend()
    for name, arrays, params in _replay_cases(rng):
        symbols = [np.array([sympy.Symbol(f"x{k}_{i}") for i in range(a.size)],
                            dtype=object).reshape(a.shape) for k, a in enumerate(arrays)]
        out_s = OPS[name].forward(sym_be, *symbols, **params)
        out_n = OPS[name].forward(num_be, *arrays, **params)
        if isinstance(out_n, tuple):
            out_s, out_n = out_s[0], out_n[0]
        subs = {s: float(v) for sa, a in zip(symbols, arrays, strict=True)
                for s, v in zip(sa.ravel(), a.ravel(), strict=True)}
        values = [float(sympy.sympify(e).xreplace(subs))
                  for e in np.asarray(out_s, dtype=object).ravel()]
        # SymPy evaluates the expression at 53 bits, op by op, in its own order: the
        # forward's roundings (its reductions span at most the case's elements), relative
        # to the inputs, the weights and the result
        consts = [v for v in params.values() if isinstance(v, sg.Tensor)]
        assert_close(np.reshape(values, np.shape(out_n)), out_n,
                     terms=program_terms(arrays, np.shape(out_n)),
                     scale=magnitude(out_n, *arrays) * max([1.0] + [magnitude(c) for c in
                                                                   consts]) * 2,
                     msg=f"{name} {params}")
