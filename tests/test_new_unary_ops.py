"""The ops added on the stanza path (docs/adding-an-op.md), unary and binary: torch parity
of values, gradients, grad_fn names and second derivatives on the numpy and cpu backends
(tests/cuda/test_cuda_new_unary_ops.py: the cuda backend under the simulator), the in-place
forms, the verifier in exact and local mode, and the rule audit."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad import backends

torch = pytest.importorskip("torch")
SGF, TF = sg.nn.functional, torch.nn.functional


def _range(lo, hi, special=()):
    def sample(rng, n):
        x = rng.uniform(lo, hi, n)
        x[:len(special)] = special[:n]
        return x
    return sample


#: op -> (symgrad function (L, *xs), torch function (*xs), one sampler(rng, n) per input,
#: torch grad_fn name)
CASES = {
    "log2": (lambda L, x: L.log2(x), torch.log2,
             (_range(0.05, 8.0, (1.0, 2.0, 0.5, 1024.0, 1e-9)),), "Log2Backward0"),
    "log10": (lambda L, x: L.log10(x), torch.log10,
              (_range(0.05, 8.0, (1.0, 10.0, 1000.0, 0.1, 1e-9)),), "Log10Backward0"),
    "log1p": (lambda L, x: L.log1p(x), torch.log1p,
              (_range(-0.9, 4.0, (0.0, -0.0, 1e-9, -0.5)),), "Log1PBackward0"),
    "expm1": (lambda L, x: L.expm1(x), torch.expm1,
              (_range(-4.0, 4.0, (0.0, -0.0, 1e-9, -30.0)),), "Expm1Backward0"),
    "erf": (lambda L, x: L.erf(x), torch.erf,
            (_range(-4.0, 4.0, (0.0, -0.0, 1e-9, 6.0, -6.0)),), "ErfBackward0"),
    "silu": (lambda L, x: L.nn.functional.silu(x), TF.silu,
             (_range(-20.0, 20.0, (0.0, -0.0, 1e-9, -100.0, 100.0, -800.0)),),
             "SiluBackward0"),
    # above the threshold softplus is x itself (torch's numerics): values on both sides
    "softplus": (lambda L, x: L.nn.functional.softplus(x), TF.softplus,
                 (_range(-30.0, 30.0, (0.0, 20.0, 20.5, 19.5, -100.0, 1e-9)),),
                 "SoftplusBackward0"),
    "softplus_beta": (lambda L, x: L.nn.functional.softplus(x, beta=2.0, threshold=1.0),
                      lambda x: TF.softplus(x, beta=2.0, threshold=1.0),
                      (_range(-3.0, 3.0, (0.0, 0.5, 0.25, 0.75, -5.0)),), "SoftplusBackward0"),
    # atan2 at the origin: torch's gradients are 0 (signed), not NaN
    "atan2": (lambda L, a, b: L.atan2(a, b), torch.atan2,
              (_range(-3.0, 3.0, (0.0, 0.0, 1.0, -0.0, 1e-30)),
               _range(-3.0, 3.0, (0.0, -0.0, 0.0, -2.0, 0.0))), "Atan2Backward0"),
    # issue 21's activations
    "gelu": (lambda L, x: L.nn.functional.gelu(x), TF.gelu,
             (_range(-8.0, 8.0, (0.0, -0.0, 1e-9, -40.0, 40.0)),), "GeluBackward0"),
    "gelu_tanh": (lambda L, x: L.nn.functional.gelu(x, approximate="tanh"),
                  lambda x: TF.gelu(x, approximate="tanh"),
                  (_range(-8.0, 8.0, (0.0, -0.0, 1e-9, -40.0, 40.0)),), "GeluBackward0"),
    "leaky_relu": (lambda L, x: L.nn.functional.leaky_relu(x, 0.2),
                   lambda x: TF.leaky_relu(x, 0.2),
                   (_range(-3.0, 3.0, (0.0, -0.0, 1e-9)),), "LeakyReluBackward0"),
    "elu": (lambda L, x: L.nn.functional.elu(x, 0.7), lambda x: TF.elu(x, 0.7),
            (_range(-5.0, 3.0, (0.0, -0.0, 1e-9, -800.0)),), "EluBackward0"),
    "logsigmoid": (lambda L, x: L.nn.functional.logsigmoid(x), TF.logsigmoid,
                   (_range(-10.0, 10.0, (0.0, -0.0, -800.0, 800.0, 40.0)),),
                   "LogSigmoidBackward0"),
    "hardtanh": (lambda L, x: L.nn.functional.hardtanh(x, -0.5, 1.0),
                 lambda x: TF.hardtanh(x, -0.5, 1.0),
                 (_range(-2.0, 2.0, (-0.5, 1.0, 0.0, -0.0)),), "HardtanhBackward0"),
    "hypot": (lambda L, a, b: L.hypot(a, b), torch.hypot,
              (_range(-3.0, 3.0, (3.0, -0.5, 1e200)), _range(-3.0, 3.0, (4.0, 0.0, 1e200))),
              "HypotBackward0"),
}

#: roundings behind a value and a gradient where they exceed the defaults below: gelu's
#: tanh form is ~7 operations forward and ~18 backward (torch's order; its tanh may differ
#: from NumPy's by an ulp or two, amplified by 1 - tanh^2)
TERMS = {"gelu_tanh": (7, 18, 36)}

SIZES = (12, 600)  # a few values (Python / NumPy paths) and above FUSED_MIN (Numba loops)
# roundings behind each compared value, beyond the libm call's own (a couple of ulp on
# either side): the forward is one call; a gradient is the forward's value, one or two
# arithmetic steps and the product with the weight; a second derivative about twice that
VALUE_TERMS, GRAD_TERMS, SECOND_TERMS = 2, 4, 8


@pytest.fixture(params=["cpu", "numpy"])
def cpu_backend(request):
    previous = backends.set_cpu_backend(request.param)
    yield request.param
    backends.set_cpu_backend(previous)


def _pair(op, dtype, n, seed=0):
    """The op's inputs (a tuple) and a weight for the output."""
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):  # 1e200 in float32 is inf, as in torch
        xs = tuple(sample(rng, n).astype(dtype) for sample in CASES[op][2])
    w = rng.standard_normal(n).astype(dtype)
    return xs, w


def _run_sg(op, xs, w, device="cpu"):
    fn = CASES[op][0]
    ts = [sg.tensor(x, requires_grad=True, device=device) for x in xs]
    y = fn(sg, *ts)
    (y * sg.tensor(w, device=device)).sum().backward()
    return y, [t.grad for t in ts]


def _run_torch(op, xs, w):
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    y = CASES[op][1](*ts)
    (y * torch.tensor(w)).sum().backward()
    return y, [t.grad for t in ts]


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", SIZES)
def test_values_grads_and_grad_fn_match_torch(op, dtype, n, cpu_backend):
    xs, w = _pair(op, dtype, n)
    y, gs = _run_sg(op, xs, w)
    ty, tgs = _run_torch(op, xs, w)
    assert y.grad_fn.name() == ty.grad_fn.name() == CASES[op][3]
    # torch's logsigmoid also saves its CPU kernel's buffer exp(-|x|) (docs/differences.md)
    assert sorted(k for k in dir(y.grad_fn) if k.startswith("_saved_")) == \
        sorted(k for k in dir(ty.grad_fn) if k.startswith("_saved_") and k != "_saved_buffer")
    assert y.dtype.name == str(ty.dtype).split(".")[1]
    value_terms, grad_terms, _ = TERMS.get(op, (VALUE_TERMS, GRAD_TERMS, SECOND_TERMS))
    assert_close(y, ty, terms=value_terms)
    for g, tg in zip(gs, tgs):
        assert_close(g, tg, terms=grad_terms)


@pytest.mark.parametrize("op", sorted(CASES))
def test_second_derivatives_match_torch(op, cpu_backend):
    (xs, w) = _pair(op, np.float64, 12, seed=3)
    xs = tuple(x[6:] for x in xs)  # away from the sampled specials (the origin of atan2)
    w = w[6:]
    ts = [sg.tensor(x, requires_grad=True) for x in xs]
    gs = sg.autograd.grad((CASES[op][0](sg, *ts) * sg.tensor(w)).sum(), ts, create_graph=True)
    if not any(g.requires_grad for g in gs):
        # piecewise linear (leaky_relu, hardtanh): the gradient is a select, constant in x.
        # torch attaches it to x anyway and gives zeros (docs/differences.md)
        tts = [torch.tensor(x, requires_grad=True) for x in xs]
        tgs = torch.autograd.grad((CASES[op][1](*tts) * torch.tensor(w)).sum(), tts,
                                  create_graph=True)
        tggs = torch.autograd.grad(sum(g.sum() for g in tgs), tts)
        assert all(not t.any() for t in tggs)
        for g, tg in zip(gs, tgs):
            assert_close(g, tg, terms=GRAD_TERMS)
        return
    ggs = sg.autograd.grad(sum(g.sum() for g in gs), ts)
    tts = [torch.tensor(x, requires_grad=True) for x in xs]
    tgs = torch.autograd.grad((CASES[op][1](*tts) * torch.tensor(w)).sum(), tts,
                              create_graph=True)
    tggs = torch.autograd.grad(sum(g.sum() for g in tgs), tts)
    _, grad_terms, second_terms = TERMS.get(op, (VALUE_TERMS, GRAD_TERMS, SECOND_TERMS))
    for g, tg, gg, tgg in zip(gs, tgs, ggs, tggs):
        assert_close(g, tg, terms=grad_terms)
        assert_close(gg, tgg, terms=second_terms)


@pytest.mark.parametrize("op", [o for o in sorted(CASES) if hasattr(torch, o + "_")])
def test_inplace_forms_match_torch(op):
    (x,), w = _pair(op, np.float64, 8)
    a = sg.tensor(x, requires_grad=True)
    b = a * 1.0
    getattr(b, op + "_")()
    (b * sg.tensor(w)).sum().backward()
    ta = torch.tensor(x, requires_grad=True)
    tb = ta * 1.0
    getattr(tb, op + "_")()
    (tb * torch.tensor(w)).sum().backward()
    assert b.grad_fn.name() == tb.grad_fn.name()
    assert_close(b, tb, terms=VALUE_TERMS)
    assert_close(a.grad, ta.grad, terms=GRAD_TERMS)
    c = sg.tensor(x)
    getattr(sg, op + "_")(c)
    assert_close(c, tb, terms=VALUE_TERMS)


@pytest.mark.parametrize("op", sorted(CASES))
def test_verify_exact_and_local(op):
    xs, _ = _pair(op, np.float64, 12, seed=5)
    ts = [sg.tensor(x[6:].reshape(2, 3), requires_grad=True) for x in xs]
    names = {f"x{i}": t for i, t in enumerate(ts)}
    rep = sg.verify((CASES[op][0](sg, *ts) * ts[0]).sum(), names=names, mode="exact")
    assert rep.ok and rep.mode == "exact", str(rep)
    bigs = [sg.tensor(x.reshape(20, 30), requires_grad=True)
            for x in _pair(op, np.float64, 600, seed=6)[0]]
    rep = sg.verify(CASES[op][0](sg, *bigs).sum(), mode="local")
    assert rep.ok and rep.mode == "local", str(rep)


@pytest.mark.parametrize("op", sorted(CASES))
def test_the_rule_audit_proves_the_backward(op):
    from symgrad.symbolic.audit import audit_rules

    (row,) = audit_rules([{"softplus_beta": "softplus"}.get(op, op)])
    assert row.status == "proved", row.detail
