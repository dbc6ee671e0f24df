"""Losses against torch 2.13, side by side: smooth_l1_loss, l1_loss, huber_loss, nll_loss,
binary_cross_entropy, kl_div and cross_entropy(label_smoothing=, class probabilities), as
functions and modules, for every reduction: values, gradients (input and, where torch gives
one, target), the whole grad_fn graph (names, saved attribute names, edges), argument errors
and warnings; and ``sg.verify`` proves each graph."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _tolerance import SAFETY, as_array, assert_close, magnitude

import symgrad as sg

N, C = 4, 5


def _arrays(kind, seed=0):
    """(input, target) arrays for a loss kind: regression pairs that hit both branches of
    smooth_l1/huber, probabilities for BCE, log-probabilities for KL, logits and classes."""
    r = np.random.default_rng(seed)
    if kind == "regression":
        x = r.standard_normal((N, C)) * 1.5
        return x, x + r.choice([-2.0, -0.3, 0.2, 1.7], size=(N, C))
    if kind == "prob":
        return r.uniform(0.05, 0.95, (N, C)), r.uniform(0, 1, (N, C))
    if kind in ("kl", "kl_pos"):
        logits = r.standard_normal((N, C))
        logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        q = r.uniform(0.1, 1, (N, C))
        if kind == "kl":
            q[0, 1] = 0.0  # xlogy(0, 0) = 0 (its gradient w.r.t. the target is 0/0, see below)
        return logp, q / q.sum(1, keepdims=True)
    if kind == "classes":
        return r.standard_normal((N, C)) * 2, np.array([0, 3, 1, 3])
    if kind == "classes_ignored":
        return r.standard_normal((N, C)) * 2, np.array([0, -100, 4, 3])
    if kind == "probs_target":
        t = r.uniform(0, 1, (N, C))
        return r.standard_normal((N, C)) * 2, t / t.sum(1, keepdims=True)
    if kind == "one_sample":
        return r.standard_normal(C) * 2, np.array(2)
    raise ValueError(kind)


def _graph(fn, seen=None):
    """Names, saved attribute names and edges of the graph below ``fn``, depth first."""
    if fn is None:
        return None
    name = fn.name().replace("torch::autograd::", "")
    if name == "AccumulateGrad":
        return name
    saved = sorted(a for a in dir(fn) if a.startswith("_saved_"))
    return (name, tuple(saved), tuple(_graph(f) for f, _ in fn.next_functions))


# (loss, kind, kwargs, target requires grad)
CASES = [
    ("smooth_l1_loss", "regression", {}, False),
    ("smooth_l1_loss", "regression", {"beta": 0.5, "reduction": "sum"}, True),
    ("smooth_l1_loss", "regression", {"beta": 2.0, "reduction": "none"}, False),
    ("smooth_l1_loss", "regression", {"beta": 0.0}, False),
    ("smooth_l1_loss", "regression", {"beta": 0.0, "reduction": "none"}, True),
    ("l1_loss", "regression", {}, False),
    ("l1_loss", "regression", {"reduction": "sum"}, True),
    ("l1_loss", "regression", {"reduction": "none"}, False),
    ("huber_loss", "regression", {}, False),
    ("huber_loss", "regression", {"delta": 0.5, "reduction": "sum"}, True),
    ("huber_loss", "regression", {"delta": 1.5, "reduction": "none"}, False),
    ("binary_cross_entropy", "prob", {}, False),
    ("binary_cross_entropy", "prob", {"reduction": "sum"}, True),
    ("binary_cross_entropy", "prob", {"reduction": "none"}, False),
    ("kl_div", "kl", {"reduction": "batchmean"}, False),
    ("kl_div", "kl_pos", {"reduction": "sum"}, True),
    ("kl_div", "kl", {"reduction": "none"}, False),
    ("kl_div", "kl_pos", {"reduction": "batchmean", "log_target": True}, True),
    ("nll_loss", "classes", {}, False),
    ("nll_loss", "classes_ignored", {"reduction": "sum"}, False),
    ("cross_entropy", "classes", {"label_smoothing": 0.1}, False),
    ("cross_entropy", "classes_ignored", {"label_smoothing": 0.2}, False),
    ("cross_entropy", "classes", {"label_smoothing": 0.1, "reduction": "sum"}, False),
    ("cross_entropy", "classes_ignored", {"label_smoothing": 0.3, "reduction": "none"}, False),
    ("cross_entropy", "one_sample", {"label_smoothing": 0.25}, False),
    ("cross_entropy", "probs_target", {}, False),
    ("cross_entropy", "probs_target", {"label_smoothing": 0.1}, False),
    ("cross_entropy", "probs_target", {"reduction": "sum"}, True),
    ("cross_entropy", "probs_target", {"reduction": "none", "label_smoothing": 0.2}, False),
]
WEIGHTED = [
    ("binary_cross_entropy", "prob", {}, "elementwise"),
    ("binary_cross_entropy", "prob", {"reduction": "none"}, "row"),
    ("nll_loss", "classes_ignored", {}, "class"),
    ("cross_entropy", "classes_ignored", {"label_smoothing": 0.1}, "class"),
    ("cross_entropy", "classes", {"label_smoothing": 0.1, "reduction": "none"}, "class"),
    ("cross_entropy", "probs_target", {}, "class"),
    ("cross_entropy", "probs_target", {"label_smoothing": 0.1, "reduction": "sum"}, "class"),
    ("huber_loss", "regression", {"delta": 0.5}, "elementwise"),
    ("huber_loss", "regression", {"reduction": "sum"}, "elementwise"),
    ("l1_loss", "regression", {}, "elementwise"),
    ("l1_loss", "regression", {"reduction": "none"}, "elementwise"),
]


def _weight(shape_kind):
    r = np.random.default_rng(9)
    return {"elementwise": r.uniform(0.5, 2, (N, C)), "row": r.uniform(0.5, 2, C),
            "class": r.uniform(0.5, 2, C)}[shape_kind]


def _run(lib, name, kind, kw, target_grad, weight=None, dtype="float64"):
    x, t = _arrays(kind)
    dt = getattr(lib, dtype)
    xin = lib.tensor(x, dtype=dt, requires_grad=True)
    if t.dtype.kind == "i":
        tin = lib.tensor(t)
    else:
        tin = lib.tensor(t, dtype=dt, requires_grad=target_grad)
    kw = dict(kw)
    if weight is not None:
        kw["weight"] = lib.tensor(weight, dtype=dt)
    F = sg.nn.functional if lib is sg else __import__("torch").nn.functional
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # kl_div's 'mean' warning is checked on its own
        loss = getattr(F, name)(xin, tin, **kw)
    graph = _graph(loss.grad_fn)
    g = np.random.default_rng(3).uniform(0.5, 1.5, tuple(loss.shape))
    loss.backward(lib.tensor(g, dtype=dt), retain_graph=lib is sg)
    tgrad = tin.grad if t.dtype.kind != "i" and target_grad else None
    return loss, graph, xin.grad, tgrad, (xin, tin)


def _check(name, kind, kw, target_grad, torch, weight=None):
    loss, graph, gx, gt, inputs = _run(sg, name, kind, kw, target_grad, weight)
    tloss, tgraph, tgx, tgt, _ = _run(torch, name, kind, kw, target_grad, weight)
    assert graph == tgraph
    x, t = _arrays(kind)
    n = x.size
    # a loss sums n terms of a few roundings each (logs, softmax over C, divisions)
    terms = n + 4 * C + 8
    scale = magnitude(tloss) + magnitude(np.abs(x).sum(), np.abs(t).sum() if t.dtype.kind
                                         == "f" else 0)
    assert_close(loss, tloss, terms=terms, scale=scale)
    # each gradient element is a few roundings of O(1) terms (softmax sums over C)
    assert_close(gx, tgx, terms=4 * C + 8, scale=magnitude(tgx) + 1)
    if target_grad:
        assert_close(gt, tgt, terms=4 * C + 8, scale=magnitude(tgt) + 1)
    return loss, inputs  # the inputs stay alive for the verifier (it reads their values)


@pytest.mark.parametrize("i", range(len(CASES)))
def test_loss_values_grads_and_graph_match_torch(i, torch):
    name, kind, kw, target_grad = CASES[i]
    loss, _inputs = _check(name, kind, kw, target_grad, torch)
    report = sg.verify(loss, gradient=sg.ones_like(loss) if loss.ndim else None)
    assert report.ok, report


@pytest.mark.parametrize("i", range(len(WEIGHTED)))
def test_weighted_losses_match_torch(i, torch):
    name, kind, kw, wkind = WEIGHTED[i]
    loss, _inputs = _check(name, kind, kw, False, torch, weight=_weight(wkind))
    report = sg.verify(loss, gradient=sg.ones_like(loss) if loss.ndim else None)
    assert report.ok, report


@pytest.mark.parametrize("name,expected", [
    ("smooth_l1_loss", "SmoothL1LossBackward0"), ("huber_loss", "HuberLossBackward0"),
    ("binary_cross_entropy", "BinaryCrossEntropyBackward0"), ("l1_loss", "MeanBackward0"),
    ("kl_div", "MeanBackward0"), ("nll_loss", "NllLossBackward0")])
def test_defaults_give_torchs_root_node(name, expected, torch):
    kind = {"binary_cross_entropy": "prob", "kl_div": "kl", "nll_loss": "classes"}.get(
        name, "regression")
    for lib in (sg, torch):
        x, t = _arrays(kind)
        F = sg.nn.functional if lib is sg else torch.nn.functional
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = getattr(F, name)(lib.tensor(x, requires_grad=True), lib.tensor(t))
        assert out.grad_fn.name() == expected
        assert out.dtype == lib.float32 or name == "nll_loss" or x.dtype == np.float64


def test_float32_values_and_grads_match_torch(torch):
    for name, kind, kw, tg in CASES[::3]:
        ours = _run(sg, name, kind, kw, tg, dtype="float32")
        theirs = _run(torch, name, kind, kw, tg, dtype="float32")
        assert ours[0].dtype is sg.float32
        x, _ = _arrays(kind)
        assert_close(ours[0], theirs[0], terms=x.size + 4 * C + 8,
                     scale=magnitude(theirs[0]) + np.abs(x).sum())
        assert_close(ours[2], theirs[2], terms=4 * C + 8, scale=magnitude(theirs[2]) + 1)


MODULES = [
    ("SmoothL1Loss", {}, "regression"), ("SmoothL1Loss", {"beta": 0.5, "reduction": "sum"},
                                         "regression"),
    ("L1Loss", {}, "regression"), ("L1Loss", {"reduction": "none"}, "regression"),
    ("HuberLoss", {"delta": 0.7}, "regression"), ("BCELoss", {}, "prob"),
    ("BCELoss", {"reduction": "sum"}, "prob"), ("KLDivLoss", {"reduction": "batchmean"}, "kl"),
    ("KLDivLoss", {"log_target": True, "reduction": "sum"}, "kl"),
    ("NLLLoss", {"ignore_index": 3}, "classes"),
    ("CrossEntropyLoss", {"label_smoothing": 0.15}, "classes"),
    ("CrossEntropyLoss", {"label_smoothing": 0.15}, "probs_target"),
]


@pytest.mark.parametrize("i", range(len(MODULES)))
def test_loss_modules_match_torch(i, torch):
    cls, kw, kind = MODULES[i]
    x, t = _arrays(kind)
    res = {}
    for lib in (sg, torch):
        m = getattr(lib.nn, cls)(**kw)
        xin = lib.tensor(x, requires_grad=True)
        out = m(xin, lib.tensor(t))
        out.backward(lib.ones_like(out))
        res[lib] = (repr(m), m.reduction, out, xin.grad, _graph(out.grad_fn),
                    [k for k, _ in m.named_buffers()])
    (r, red, out, g, graph, bufs), (tr, tred, tout, tg, tgraph, tbufs) = res[sg], res[torch]
    assert (r, red, graph, bufs) == (tr, tred, tgraph, tbufs)
    assert_close(out, tout, terms=x.size + 4 * C + 8, scale=magnitude(tout) + np.abs(x).sum())
    assert_close(g, tg, terms=4 * C + 8, scale=magnitude(tg) + 1)


def test_module_defaults_match_torch(torch):
    for cls in ("SmoothL1Loss", "L1Loss", "HuberLoss", "BCELoss", "KLDivLoss", "NLLLoss",
                "CrossEntropyLoss"):
        m, tm = getattr(sg.nn, cls)(), getattr(torch.nn, cls)()
        assert repr(m) == repr(tm)
        for attr in ("reduction", "beta", "delta", "log_target", "ignore_index",
                     "label_smoothing"):
            assert getattr(m, attr, None) == getattr(tm, attr, None), (cls, attr)
        assert getattr(m, "weight", None) is None and getattr(tm, "weight", None) is None


def _errors(lib):
    F = sg.nn.functional if lib is sg else __import__("torch").nn.functional
    r = np.random.default_rng(0)
    x = lib.tensor(r.uniform(0.1, 0.9, (3, 4)))
    t = lib.tensor(r.uniform(0.1, 0.9, (3, 4)))
    ti = lib.tensor([0, 2, 1])
    cases = {
        "bce in>1": lambda: F.binary_cross_entropy(x + 1, t),
        "bce t>1": lambda: F.binary_cross_entropy(x, t + 1),
        "bce nan": lambda: F.binary_cross_entropy(x * float("nan"), t),
        "bce shape": lambda: F.binary_cross_entropy(x, t[0]),
        "bce dtype": lambda: F.binary_cross_entropy(x, t.double()),
        "bce w bad": lambda: F.binary_cross_entropy(x, t, weight=lib.ones(3)),
        "sl1 beta<0": lambda: F.smooth_l1_loss(x, t, beta=-1.0),
        "sl1 int": lambda: F.smooth_l1_loss(x.long(), t.long()),
        "hub delta0": lambda: F.huber_loss(x, t, delta=0.0),
        "hub int": lambda: F.huber_loss(x.long(), t.long()),
        "hub w": lambda: F.huber_loss(x, t, weight=lib.ones(4)),
        "l1 w": lambda: F.l1_loss(x, t, weight=lib.ones(4)),
        "l1 red": lambda: F.l1_loss(x, t, reduction="avg"),
        "l1 w red": lambda: F.l1_loss(x, t, reduction="avg", weight=lib.ones(3, 4)),
        "kl red": lambda: F.kl_div(x, t, reduction="avg"),
        "sl1 red": lambda: F.smooth_l1_loss(x, t, reduction="avg"),
        "ce ls 1.5": lambda: F.cross_entropy(x, ti, label_smoothing=1.5),
        "ce prob int": lambda: F.cross_entropy(x, t.long()),
        "ce prob ii": lambda: F.cross_entropy(x, t, ignore_index=1),
        "ce prob ls": lambda: F.cross_entropy(x, t, label_smoothing=2.0),
        "ce prob shape": lambda: F.cross_entropy(x, t[:2]),
        "ce float idx": lambda: F.cross_entropy(x, ti.float()),
    }
    out = {}
    for k, fn in cases.items():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
            out[k] = "no error"
        except Exception as e:  # noqa: BLE001  (type and text are compared)
            out[k] = f"{type(e).__name__}: {e}".replace("torch.", "").replace("symgrad.", "")
    return out


def test_argument_errors_match_torch(torch):
    assert _errors(sg) == _errors(torch)


def _warnings(lib):
    F = sg.nn.functional if lib is sg else __import__("torch").nn.functional
    x, t = lib.ones(3, 4), lib.ones(4)
    texts = []
    for fn in (lambda: F.smooth_l1_loss(x, t), lambda: F.l1_loss(x, t),
               lambda: F.huber_loss(x, t), lambda: F.kl_div(x, x),
               lambda: F.kl_div(x, x, reduction="batchmean"),
               lambda: F.l1_loss(x, x, size_average=False),
               lambda: lib.nn.SmoothL1Loss(reduce=False)):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fn()
        texts.append([str(m.message).replace("torch.", "").replace("symgrad.", "") for m in w])
    return texts


def test_warnings_match_torch(torch):
    assert _warnings(sg) == _warnings(torch)


def test_broadcast_target_matches_torch(torch):
    """A (C,) target against (N, C) input: torch's warning, then broadcast; the gradient of
    the broadcast target is summed back."""
    r = np.random.default_rng(4)
    x, t = r.standard_normal((N, C)), r.standard_normal(C)
    res = {}
    for lib in (sg, torch):
        F = sg.nn.functional if lib is sg else torch.nn.functional
        xin, tin = lib.tensor(x, requires_grad=True), lib.tensor(t, requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = F.smooth_l1_loss(xin, tin, beta=0.5) + F.huber_loss(xin, tin) + \
                F.l1_loss(xin, tin)
        loss.backward()
        res[lib] = loss, xin.grad, tin.grad, _graph(loss.grad_fn)
    assert res[sg][3] == res[torch][3]
    for a, b in zip(res[sg][:3], res[torch][:3], strict=True):
        assert_close(a, b, terms=x.size + 8, scale=magnitude(b) + np.abs(x).sum())


def test_bce_saturates_as_torch(torch):
    """log clamped at -100 at 0 and 1; the input gradient divides by max(x(1-x), 1e-12)."""
    res = {}
    for lib in (sg, torch):
        x = lib.tensor([0.0, 1.0, 0.5, 1e-30], dtype=lib.float64, requires_grad=True)
        t = lib.tensor([1.0, 0.0, 0.5, 0.0], dtype=lib.float64)
        loss = lib.nn.functional.binary_cross_entropy(x, t, reduction="none")
        loss.sum().backward()
        res[lib] = loss, x.grad
    for a, b in zip(res[sg], res[torch], strict=True):
        assert_close(a, b, terms=4)


def test_second_derivatives_match_torch(torch):
    """create_graph=True through the new nodes: their backward formulas are differentiable.
    (kl_div is linear in its input: its gradient is a constant, as in torch.)"""
    for name, kind, kw in (("smooth_l1_loss", "regression", {"beta": 0.5}),
                           ("huber_loss", "regression", {}),
                           ("binary_cross_entropy", "prob", {}),
                           ("cross_entropy", "classes", {"label_smoothing": 0.2}),
                           ("cross_entropy", "probs_target", {"label_smoothing": 0.2})):
        res = {}
        for lib in (sg, torch):
            x, t = _arrays(kind)
            F = sg.nn.functional if lib is sg else torch.nn.functional
            xin = lib.tensor(x, requires_grad=True)
            tin = lib.tensor(t)
            (g,) = lib.autograd.grad(getattr(F, name)(xin, tin, **kw), xin, create_graph=True)
            (gg,) = lib.autograd.grad((g * g).sum(), xin)
            res[lib] = g, gg
        terms = 4 * C + 16
        (g, gg), (tg, tgg) = res[sg], res[torch]
        assert_close(g, tg, terms=terms, scale=magnitude(tg) + 1, msg=name)
        scale = magnitude(tgg) + 1
        if name == "binary_cross_entropy":
            # torch's double backward is its own formula with 1e-12 added to x and 1 - x: a
            # relative change of up to 4e-12 / min(x, 1 - x) in each second derivative; ours
            # differentiates the first backward exactly
            x = _arrays(kind)[0]
            torch_shift = np.abs(as_array(tgg)) * 4e-12 / np.minimum(x, 1 - x)
            scale = scale + torch_shift / (SAFETY * terms * np.finfo(np.float64).eps)
        assert_close(gg, tgg, terms=terms, scale=scale, msg=name)


def test_verify_proves_each_new_node_locally():
    """The verifier's local check (every node against its SymPy Jacobian) on each new op."""
    for name, kind, kw in (("smooth_l1_loss", "regression", {"beta": 0.5}),
                           ("huber_loss", "regression", {"delta": 0.8}),
                           ("binary_cross_entropy", "prob", {}),
                           ("kl_div", "kl_pos", {"reduction": "sum"}),
                           ("cross_entropy", "classes_ignored", {"label_smoothing": 0.2}),
                           ("cross_entropy", "probs_target", {})):
        x, t = _arrays(kind)
        tin = sg.tensor(t) if t.dtype.kind == "i" else sg.tensor(t, requires_grad=True)
        xin = sg.tensor(x, requires_grad=True)
        loss = getattr(sg.nn.functional, name)(xin, tin, **kw)
        report = sg.verify(loss, mode="local")
        assert report.ok, (name, report)


def test_kl_div_target_gradient_at_zero_is_nan_as_torchs(torch):
    """xlogy's rule for its second argument is ``grad * x / y``: at a zero target probability
    torch's target gradient is 0/0 = NaN, and so is symgrad's (the verifier reports it)."""
    res = {}
    for lib in (sg, torch):
        x, t = _arrays("kl")
        tin = lib.tensor(t, requires_grad=True)
        F = sg.nn.functional if lib is sg else torch.nn.functional
        F.kl_div(lib.tensor(x), tin, reduction="sum").backward()
        res[lib] = tin.grad
    assert np.isnan(res[sg].numpy()[0, 1])
    assert_close(res[sg], res[torch], terms=4, scale=magnitude(res[torch]) + 1)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_with_every_target_ignored_has_zero_gradient_as_torch(torch, smoothing):
    x = np.random.default_rng(0).standard_normal((3, 4))
    out = {}
    for lib in (torch, sg):
        t = lib.tensor(x, requires_grad=True)
        loss = lib.nn.functional.cross_entropy(t, lib.tensor([0, 0, 0]), ignore_index=0,
                                               label_smoothing=smoothing)
        (g,) = lib.autograd.grad(loss * 2.0, t)
        out[lib.__name__] = (loss.item(), g.numpy())
    assert np.isnan(out["symgrad"][0]) and np.isnan(out["torch"][0])
    np.testing.assert_array_equal(out["symgrad"][1], out["torch"][1])  # exact zeros, +0.
    assert not np.signbit(out["symgrad"][1]).any()
