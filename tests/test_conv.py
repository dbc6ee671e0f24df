"""Convolution and pooling against torch 2.13 (issue 21, item 1).

Values, gradients (input, weight, bias), the recorded graph (grad_fn names down to the
leaves, ``_saved_*`` values, saved tensors being the user's tensors), float32 and float64,
on both CPU backends; second derivatives; torch's tie rule for max pooling; error wording;
the verifier (exact on a tiny conv+pool graph, local on a bigger one); a LeNet forward.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg
from symgrad.autograd import gradcheck, gradgradcheck

torch = pytest.importorskip("torch")
TF = torch.nn.functional
F = sg.nn.functional

DTYPES = {"float32": (sg.float32, torch.float32), "float64": (sg.float64, torch.float64)}

#: (fn, input shape, weight shape, bias?, kwargs)
CONV_CASES = [
    ("conv2d", (2, 3, 7, 6), (4, 3, 3, 3), True, {}),
    ("conv2d", (2, 4, 7, 7), (6, 2, 3, 3), True, {"stride": 2, "padding": 1, "groups": 2}),
    ("conv2d", (1, 4, 8, 7), (4, 1, 3, 2), False, {"stride": (2, 1), "padding": (1, 0),
                                                     "dilation": (2, 1), "groups": 4}),
    ("conv2d", (2, 2, 6, 6), (3, 2, 3, 3), True, {"padding": "same", "dilation": 2}),
    ("conv2d", (2, 2, 6, 5), (3, 2, 2, 2), True, {"padding": "same"}),  # ConstantPadNd first
    ("conv2d", (2, 2, 6, 5), (3, 2, 3, 2), True, {"padding": "valid", "stride": [2]}),
    ("conv2d", (3, 5, 5), (2, 3, 2, 2), True, {"padding": [1], "dilation": [2]}),  # unbatched
    ("conv2d", (2, 1, 9, 9), (2, 1, 5, 5), True, {"padding": 2, "stride": 3}),
    ("conv1d", (2, 3, 9), (4, 3, 3), True, {}),
    ("conv1d", (2, 4, 9), (6, 2, 2), True, {"stride": 2, "padding": 1, "dilation": 3,
                                             "groups": 2}),
    ("conv1d", (3, 8), (2, 3, 4), False, {"padding": "same"}),  # unbatched, uneven 'same'
    ("conv1d", (1, 2, 5), (2, 2, 5), True, {"padding": "valid"}),
]


def _pair(shape, wshape, bias, dtype, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-1, 1, shape), rng.uniform(-1, 1, wshape)]
    arrays.append(rng.uniform(-1, 1, wshape[0]) if bias else None)
    sd, td = DTYPES[dtype]
    ours = [None if a is None else sg.tensor(a, dtype=sd, requires_grad=True) for a in arrays]
    theirs = [None if a is None else torch.tensor(a, dtype=td, requires_grad=True)
              for a in arrays]
    return ours, theirs


def _graph(fn, out):
    """grad_fn names and non-tensor saved values, depth first down to the leaves."""
    rows, stack = [], [fn]
    while stack:
        node = stack.pop()
        if node is None:
            rows.append(None)
            continue
        saved = {}
        for a in sorted(dir(node)):
            if a.startswith("_saved_"):
                v = getattr(node, a)
                saved[a] = "tensor" if hasattr(v, "shape") else v
        rows.append((node.name().replace("torch::autograd::", ""), saved))
        stack.extend(n for n, _ in getattr(node, "next_functions", ()))
    return rows


def _quiet(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: 'same' with an even kernel
        return call()


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}{c[1]}{c[2]}{c[4]}")
def test_conv_matches_torch(case, dtype, cpu_backend):
    fn, shape, wshape, bias, kw = case
    (x, w, b), (xt, wt, bt) = _pair(shape, wshape, bias, dtype)
    y = _quiet(lambda: getattr(F, fn)(x, w, b, **kw))
    yt = _quiet(lambda: getattr(TF, fn)(xt, wt, bt, **kw))
    taps = wshape[1] * math.prod(wshape[2:])
    assert tuple(y.shape) == tuple(yt.shape)
    assert_close(y, yt, terms=taps + 1, scale=taps + 1)
    g = np.random.default_rng(1).uniform(-1, 1, tuple(yt.shape))
    y.backward(sg.tensor(g, dtype=y.dtype), retain_graph=True)
    yt.backward(torch.tensor(g, dtype=yt.dtype), retain_graph=True)
    positions = math.prod(yt.shape) // yt.shape[-1 - len(wshape[2:])] if yt.ndim else 1
    assert_close(x.grad, xt.grad, terms=wshape[0] * math.prod(wshape[2:]),
                 scale=wshape[0] * math.prod(wshape[2:]))
    assert_close(w.grad, wt.grad, terms=positions, scale=positions)
    if bias:
        assert_close(b.grad, bt.grad, terms=positions, scale=positions)
    assert _graph(y.grad_fn, y) == _graph(yt.grad_fn, yt)


def test_conv_saves_the_users_tensors_and_torchs_values():
    x = sg.randn(2, 4, 7, 7, requires_grad=True)
    w = sg.randn(6, 2, 3, 3, requires_grad=True)
    y = F.conv2d(x, w, None, stride=2, padding=1, groups=2)
    fn = y.grad_fn
    assert fn.name() == "ConvolutionBackward0"
    assert fn._saved_input is x and fn._saved_weight is w
    assert (fn._saved_stride, fn._saved_padding, fn._saved_dilation, fn._saved_groups,
            fn._saved_transposed, fn._saved_output_padding, fn._saved_bias_sym_sizes_opt) == \
        ((2, 2), (1, 1), (1, 1), 2, False, (0, 0), (0,))
    assert fn.next_functions[2] == (None, 0)


#: (fn, input shape, kwargs)
POOL_CASES = [
    ("max_pool2d", (2, 3, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ("max_pool2d", (2, 2, 7, 6), {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0),
                                  "dilation": (2, 1), "ceil_mode": True}),
    ("max_pool2d", (3, 6, 6), {"kernel_size": 2}),
    ("max_pool2d", (1, 2, 5, 5), {"kernel_size": [2], "stride": [1], "padding": [1]}),
    ("avg_pool2d", (2, 3, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
    ("avg_pool2d", (2, 3, 7, 7), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True,
                                  "count_include_pad": False}),
    ("avg_pool2d", (3, 7, 6), {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0),
                               "divisor_override": 2}),
    ("avg_pool2d", (1, 1, 6, 6), {"kernel_size": 2}),
    ("adaptive_avg_pool2d", (2, 3, 7, 5), {"output_size": (3, 2)}),
    ("adaptive_avg_pool2d", (3, 7, 5), {"output_size": (4, None)}),
    ("adaptive_avg_pool2d", (2, 3, 7, 5), {"output_size": 1}),  # torch: MeanBackward1
    ("adaptive_avg_pool2d", (1, 2, 3, 3), {"output_size": 5}),  # windows overlap
]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0]}{c[1]}{c[2]}")
def test_pool_matches_torch(case, ties, dtype, cpu_backend):
    fn, shape, kw = case
    rng = np.random.default_rng(2)
    a = rng.integers(-2, 3, shape).astype(float) if ties else rng.uniform(-1, 1, shape)
    sd, td = DTYPES[dtype]
    x = sg.tensor(a, dtype=sd, requires_grad=True)
    xt = torch.tensor(a, dtype=td, requires_grad=True)
    y, yt = getattr(F, fn)(x, **kw), getattr(TF, fn)(xt, **kw)
    assert tuple(y.shape) == tuple(yt.shape)
    window = 9 * 7  # at most: the sums here are short
    assert_close(y, yt, terms=window, scale=magnitude(a))
    g = rng.uniform(-1, 1, tuple(yt.shape))
    y.backward(sg.tensor(g, dtype=y.dtype), retain_graph=True)
    yt.backward(torch.tensor(g, dtype=yt.dtype), retain_graph=True)
    assert_close(x.grad, xt.grad, terms=window, scale=window)
    assert _graph(y.grad_fn, y) == _graph(yt.grad_fn, yt)


def test_max_pool_indices_and_ties_follow_torch(cpu_backend):
    """Ties: the gradient goes to the index torch returns (its first maximum)."""
    a = np.zeros((1, 1, 4, 4))
    a[0, 0, 1:3, 1:3] = 1.0
    x = sg.tensor(a, requires_grad=True)
    xt = torch.tensor(a, requires_grad=True)
    y, i = F.max_pool2d(x, 3, 1, 1, return_indices=True)
    yt, it = TF.max_pool2d(xt, 3, 1, 1, return_indices=True)
    assert i.dtype is sg.int64 and np.array_equal(i.numpy(), it.numpy())
    assert y.grad_fn._saved_result1 is i and y.grad_fn._saved_self is x
    y.sum().backward()
    yt.sum().backward()
    assert np.array_equal(x.grad.numpy(), xt.grad.numpy())
    ours, theirs = sg.max_pool2d(x, 2).grad_fn, torch.max_pool2d(xt, 2).grad_fn
    assert ours._saved_stride == theirs._saved_stride == ()


def test_second_derivatives():
    sg.manual_seed(0)
    x = sg.randn(1, 2, 4, 4, dtype=sg.float64, requires_grad=True)
    w = sg.randn(2, 1, 2, 2, dtype=sg.float64, requires_grad=True)
    b = sg.randn(2, dtype=sg.float64, requires_grad=True)

    def conv(x, w, b):
        return F.conv2d(x, w, b, padding=1, groups=2, stride=(1, 2))

    assert gradcheck(conv, (x, w, b))
    assert gradgradcheck(conv, (x, w, b))
    assert gradgradcheck(lambda x: F.max_pool2d(x, 2, 1, 1), (x,))
    assert gradgradcheck(lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False), (x,))
    assert gradgradcheck(lambda x: F.adaptive_avg_pool2d(x, (3, 2)), (x,))
    assert _quiet(lambda: gradgradcheck(
        lambda x: F.conv1d(x[0, :, 0], w[:, :, 0], padding="same", groups=2), (x,)))


def test_double_backward_matches_torch():
    rng = np.random.default_rng(3)
    xa, wa = rng.uniform(-1, 1, (2, 2, 5, 5)), rng.uniform(-1, 1, (3, 2, 3, 3))
    out = []
    for L, fn in ((sg, F), (torch, TF)):
        x = L.tensor(xa, requires_grad=True)
        w = L.tensor(wa, requires_grad=True)
        y = fn.conv2d(x, w, padding=1, stride=2)
        gx, gw = L.autograd.grad((y * y).sum(), (x, w), create_graph=True)
        out.append([a.detach().numpy() for a in L.autograd.grad((gx * gx).sum() + gw.sum(),
                                                                (x, w))])
    for a, b in zip(*out):
        assert_close(a, b, terms=200, scale=magnitude(b))


# -- errors: torch's type and wording ---------------------------------------------------------
def _x(L):
    return L.zeros(2, 4, 7, 7)


ERRORS = {
    "channels": lambda L, f: f.conv2d(_x(L), L.zeros(6, 3, 3, 3)),
    "kernel too big": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 9, 9)),
    "negative padding": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3, 3), padding=-1),
    "zero stride": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3, 3), stride=0),
    "zero dilation": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3, 3), dilation=0),
    "zero groups": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3, 3), groups=0),
    "groups and weight": lambda L, f: f.conv2d(_x(L), L.zeros(5, 2, 3, 3), groups=2),
    "groups and input": lambda L, f: f.conv2d(L.zeros(2, 5, 7, 7), L.zeros(6, 2, 3, 3),
                                              groups=2),
    "input rank": lambda L, f: f.conv2d(L.zeros(2, 3), L.zeros(6, 4, 3, 3)),
    "conv1d input rank": lambda L, f: f.conv1d(_x(L), L.zeros(6, 4, 3)),
    "weight rank": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3)),
    "bias shape": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3, 3), L.zeros(5)),
    "same strided": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3, 3), padding="same", stride=2),
    "bad padding string": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3, 3), padding="foo"),
    "stride length": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3, 3), stride=(1, 1, 1)),
    "weight dtype": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3, 3, dtype=L.float64)),
    "bias dtype": lambda L, f: f.conv2d(_x(L), L.zeros(6, 4, 3, 3), L.zeros(6, dtype=L.float64)),
    "pool pad": lambda L, f: f.max_pool2d(_x(L), 3, padding=2),
    "pool too small": lambda L, f: f.max_pool2d(L.zeros(1, 1, 2, 2), 3),
    "pool negative pad": lambda L, f: f.max_pool2d(_x(L), 3, padding=-1),
    "pool zero stride": lambda L, f: f.max_pool2d(_x(L), 3, stride=0),
    "pool zero dilation": lambda L, f: f.max_pool2d(_x(L), 2, dilation=0),
    "pool rank": lambda L, f: f.max_pool2d(L.zeros(7, 7), 2),
    "pool kernel length": lambda L, f: f.max_pool2d(_x(L), (2, 2, 2)),
    "pool pad and dilation": lambda L, f: f.max_pool2d(L.zeros(1, 1, 1, 1), (1, 2), 1, (0, 2),
                                                       dilation=(1, 3)),
    "avg pad": lambda L, f: f.avg_pool2d(_x(L), 3, padding=2),
    "avg too small": lambda L, f: f.avg_pool2d(L.zeros(1, 1, 2, 2), 3),
    "avg rank": lambda L, f: f.avg_pool2d(L.zeros(7, 7), 2),
    "avg divisor": lambda L, f: f.avg_pool2d(_x(L), 2, divisor_override=0),
    "adaptive rank": lambda L, f: f.adaptive_avg_pool2d(L.zeros(7, 7), 2),
    "adaptive negative": lambda L, f: f.adaptive_avg_pool2d(_x(L), -1),
    "adaptive length": lambda L, f: f.adaptive_avg_pool2d(_x(L), (2, 2, 2)),
    "adaptive long": lambda L, f: f.adaptive_avg_pool2d(_x(L).long(), 2),
    "adaptive empty": lambda L, f: f.adaptive_avg_pool2d(L.zeros(2, 3, 0, 4), 2),
    "module groups": lambda L, f: L.nn.Conv2d(4, 6, 3, groups=4),
    "module in groups": lambda L, f: L.nn.Conv2d(3, 6, 3, groups=2),
    "module same strided": lambda L, f: L.nn.Conv2d(4, 6, 3, padding="same", stride=2),
    "module bad padding": lambda L, f: L.nn.Conv2d(4, 6, 3, padding="bar"),
    "module bad padding_mode": lambda L, f: L.nn.Conv2d(4, 6, 3, padding_mode="foo"),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_match_torch(name):
    with pytest.raises(Exception) as theirs:
        ERRORS[name](torch, TF)
    with pytest.raises(type(theirs.value)) as ours:
        ERRORS[name](sg, F)
    assert _unordered_sets(str(ours.value)) == _unordered_sets(str(theirs.value))


def _unordered_sets(message: str) -> str:
    """torch prints some choices as a Python set, whose order varies between runs."""
    import re

    return re.sub(r"\{([^{}]*)\}", lambda m: "{" + ", ".join(sorted(m.group(1).split(", ")))
                  + "}", message)


def test_padding_modes_other_than_zeros_are_not_implemented():
    with pytest.raises(NotImplementedError, match="padding_mode='reflect'"):
        sg.nn.Conv2d(4, 6, 3, padding_mode="reflect")


# -- modules ------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda L: L.nn.Conv2d(4, 6, 3), lambda L: L.nn.Conv2d(4, 6, (3, 2), 2, 1, groups=2,
                                                          bias=False),
    lambda L: L.nn.Conv2d(4, 6, 3, padding="same", dilation=2),
    lambda L: L.nn.Conv1d(4, 6, 3, padding=1, dilation=2),
    lambda L: L.nn.MaxPool2d(2), lambda L: L.nn.MaxPool2d(3, 2, 1, ceil_mode=True),
    lambda L: L.nn.AvgPool2d(2), lambda L: L.nn.AdaptiveAvgPool2d((2, 3))])
def test_module_repr_and_forward_match_torch(make):
    ours, theirs = make(sg), make(torch)
    assert repr(ours) == repr(theirs)
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert tuple(p.shape) == tuple(q.shape)
        with torch.no_grad():
            q.copy_(torch.from_numpy(p.detach().numpy()))
    shape = (2, 4, 9) if isinstance(ours, sg.nn.Conv1d) else (2, 4, 9, 8)
    a = np.random.default_rng(4).uniform(-1, 1, shape).astype(np.float32)
    y, yt = ours(sg.tensor(a)), theirs(torch.tensor(a))
    assert_close(y, yt, terms=40, scale=40)


def test_conv_default_init_bounds():
    """torch's: kaiming_uniform(a=sqrt(5)) is U(+-1/sqrt(fan_in)), the bias the same bound."""
    sg.manual_seed(0)
    m = sg.nn.Conv2d(3, 64, 5)
    bound = 1 / math.sqrt(3 * 25)
    w, b = m.weight.detach().numpy(), m.bias.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    assert np.abs(b).max() <= bound and w.dtype == np.float32
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]


def test_top_level_functions_are_torchs():
    for name in ("conv1d", "conv2d", "max_pool2d"):
        assert hasattr(torch, name) and hasattr(sg, name) and name in sg.__all__
    for name in ("avg_pool2d", "adaptive_avg_pool2d"):
        assert not hasattr(torch, name) and not hasattr(sg, name)
    x = sg.randn(1, 1, 4, 4, requires_grad=True)
    assert sg.max_pool2d(x, 2).grad_fn._saved_stride == ()


# -- the verifier -------------------------------------------------------------------------------
def test_verify_exact_on_a_tiny_conv_pool_graph():
    sg.manual_seed(1)
    x = sg.randn(1, 1, 5, 5, dtype=sg.float64, requires_grad=True)
    w = sg.randn(2, 1, 2, 2, dtype=sg.float64, requires_grad=True)
    b = sg.randn(2, dtype=sg.float64, requires_grad=True)
    y = F.max_pool2d(F.conv2d(x, w, b, padding=1).relu(), 2)
    loss = F.avg_pool2d(y, 2, ceil_mode=True).sum() + F.adaptive_avg_pool2d(y, (2, 1)).sum()
    loss.backward(retain_graph=True)
    report = sg.verify(loss, mode="exact")
    assert report.ok, report
    assert "mode exact" in str(report)


def test_verify_local_on_a_bigger_graph():
    sg.manual_seed(2)
    x = sg.randn(4, 3, 12, 12, requires_grad=True)
    w = sg.randn(6, 3, 3, 3, requires_grad=True)
    b = sg.randn(6, requires_grad=True)
    y = F.adaptive_avg_pool2d(F.max_pool2d(F.conv2d(x, w, b, padding=1).relu(), 2), (3, 3))
    loss = (y * y).sum()
    loss.backward(retain_graph=True)
    report = sg.verify(loss, mode="local")
    assert report.ok, report
    names = {n.name for n in report.nodes}
    assert {"ConvolutionBackward0", "MaxPool2DWithIndicesBackward0",
            "AdaptiveAvgPool2DBackward0"} <= names
    assert all(n.status == "ok" for n in report.nodes)


def test_audit_proves_the_rules():
    from symgrad.symbolic.audit import audit_rules

    ops = ["convolution", "constant_pad_nd", "max_pool2d_with_indices", "avg_pool2d",
           "adaptive_avg_pool2d"]
    assert {r.op: r.status for r in audit_rules(ops)} == dict.fromkeys(ops, "proved")


# -- a LeNet-shaped network ---------------------------------------------------------------------
def _lenet(L):
    nn = L.nn
    return nn.Sequential(nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 4 * 4, 10))


def test_lenet_forward_and_gradients_match_torch(cpu_backend):
    ours, theirs = _lenet(sg), _lenet(torch)
    with torch.no_grad():
        for p, q in zip(ours.parameters(), theirs.parameters()):
            q.copy_(torch.from_numpy(p.detach().numpy()))
    a = np.random.default_rng(5).uniform(0, 1, (8, 1, 28, 28)).astype(np.float32)
    labels = np.arange(8) % 10
    y, yt = ours(sg.tensor(a)), theirs(torch.tensor(a))
    assert_close(y, yt, terms=2 * (25 + 150 + 256), scale=magnitude(yt) + 10)
    F.cross_entropy(y, sg.tensor(labels)).backward(retain_graph=True)
    TF.cross_entropy(yt, torch.tensor(labels)).backward(retain_graph=True)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        assert_close(p.grad, q.grad, terms=2 * (8 * 576 + 256), scale=magnitude(q.grad) + 1,
                     msg=name)
    assert _graph(y.grad_fn, y) == _graph(yt.grad_fn, yt)


def test_no_reference_cycles_in_a_cnn_graph(no_gc):
    """Freed by reference counting alone, create_graph included (double backward)."""
    import gc
    import weakref

    def run():
        net = _lenet(sg)
        x = sg.randn(2, 1, 28, 28, requires_grad=True)
        loss = F.avg_pool2d(net[:3](x), 2, padding=1).sum() + net(x).sum()
        (gx,) = sg.autograd.grad(loss, (x,), create_graph=True)
        gx.sum().backward()
        return weakref.ref(net[0].weight), weakref.ref(loss.grad_fn)

    run()
    gc.collect()  # first use: imports and kernel compilation keep their own objects
    refs = run()
    assert all(r() is None for r in refs)
    assert gc.collect() == 0


def test_strided_views_integers_and_empty_batches_match_torch(cpu_backend):
    rng = np.random.default_rng(6)
    a, wa = rng.uniform(-1, 1, (2, 7, 7, 4)), rng.uniform(-1, 1, (3, 3, 3, 4))
    x, w = sg.tensor(a, requires_grad=True), sg.tensor(wa, requires_grad=True)
    xt, wt = torch.tensor(a, requires_grad=True), torch.tensor(wa, requires_grad=True)
    y = F.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), stride=2, padding=1)
    yt = TF.conv2d(xt.permute(0, 3, 1, 2), wt.permute(0, 3, 1, 2), stride=2, padding=1)
    y.sum().backward()
    yt.sum().backward()
    for ours, theirs in ((y, yt), (x.grad, xt.grad), (w.grad, wt.grad)):
        assert_close(ours, theirs, terms=40, scale=40)
    xi, wi = rng.integers(-3, 3, (2, 4, 5, 5)), rng.integers(-3, 3, (2, 4, 2, 2))
    out = F.conv2d(sg.tensor(xi), sg.tensor(wi))
    assert out.dtype is sg.int64
    assert np.array_equal(out.numpy(), TF.conv2d(torch.tensor(xi), torch.tensor(wi)).numpy())
    for ours, theirs in ((F.conv2d(sg.zeros(0, 4, 5, 5), sg.zeros(2, 4, 2, 2)),
                          TF.conv2d(torch.zeros(0, 4, 5, 5), torch.zeros(2, 4, 2, 2))),
                         (F.max_pool2d(sg.zeros(0, 2, 4, 4), 2),
                          TF.max_pool2d(torch.zeros(0, 2, 4, 4), 2))):
        assert tuple(ours.shape) == tuple(theirs.shape)
