"""The unary ops added on the stanza path (docs/adding-an-op.md): torch parity of values,
gradients, grad_fn names and second derivatives on the numpy and cpu backends (and cuda
when present, e.g. under NUMBA_ENABLE_CUDASIM=1), the in-place forms, the verifier in
exact and local mode, and the rule audit."""

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


#: op -> (symgrad function, torch function, sampler(rng, n), torch grad_fn name)
CASES = {
    "log1p": (lambda L, x: L.log1p(x), torch.log1p,
              _range(-0.9, 4.0, (0.0, -0.0, 1e-9, -0.5)), "Log1PBackward0"),
    "expm1": (lambda L, x: L.expm1(x), torch.expm1,
              _range(-4.0, 4.0, (0.0, -0.0, 1e-9, -30.0)), "Expm1Backward0"),
}

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
    rng = np.random.default_rng(seed)
    x = CASES[op][2](rng, n).astype(dtype)
    w = rng.standard_normal(n).astype(dtype)
    return x, w


def _run_sg(op, x, w, device="cpu"):
    fn = CASES[op][0]
    t = sg.tensor(x, requires_grad=True, device=device)
    y = fn(sg, t)
    (y * sg.tensor(w, device=device)).sum().backward()
    return y, t.grad


def _run_torch(op, x, w):
    t = torch.tensor(x, requires_grad=True)
    y = CASES[op][1](t)
    (y * torch.tensor(w)).sum().backward()
    return y, t.grad


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", SIZES)
def test_values_grads_and_grad_fn_match_torch(op, dtype, n, cpu_backend):
    x, w = _pair(op, dtype, n)
    y, g = _run_sg(op, x, w)
    ty, tg = _run_torch(op, x, w)
    assert y.grad_fn.name() == ty.grad_fn.name() == CASES[op][3]
    assert y.dtype.name == str(ty.dtype).split(".")[1]
    assert_close(y, ty, terms=VALUE_TERMS)
    assert_close(g, tg, terms=GRAD_TERMS)


@pytest.mark.parametrize("op", sorted(CASES))
def test_second_derivatives_match_torch(op, cpu_backend):
    x, w = _pair(op, np.float64, 12, seed=3)
    t = sg.tensor(x, requires_grad=True)
    (g,) = sg.autograd.grad((CASES[op][0](sg, t) * sg.tensor(w)).sum(), t, create_graph=True)
    (gg,) = sg.autograd.grad(g.sum(), t)
    tt = torch.tensor(x, requires_grad=True)
    (tg,) = torch.autograd.grad((CASES[op][1](tt) * torch.tensor(w)).sum(), tt,
                                create_graph=True)
    (tgg,) = torch.autograd.grad(tg.sum(), tt)
    assert_close(g, tg, terms=GRAD_TERMS)
    assert_close(gg, tgg, terms=SECOND_TERMS)


@pytest.mark.parametrize("op", [o for o in sorted(CASES) if hasattr(torch, o + "_")])
def test_inplace_forms_match_torch(op):
    x, w = _pair(op, np.float64, 8)
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
    x, _ = _pair(op, np.float64, 6, seed=5)
    t = sg.tensor(x.reshape(2, 3), requires_grad=True)
    rep = sg.verify((CASES[op][0](sg, t) * t).sum(), names={"x": t}, mode="exact")
    assert rep.ok and rep.mode == "exact", str(rep)
    big = sg.tensor(_pair(op, np.float64, 600, seed=6)[0].reshape(20, 30), requires_grad=True)
    rep = sg.verify(CASES[op][0](sg, big).sum(), names={"big": big}, mode="local")
    assert rep.ok and rep.mode == "local", str(rep)


@pytest.mark.parametrize("op", sorted(CASES))
def test_the_rule_audit_proves_the_backward(op):
    from symgrad.symbolic.audit import audit_rules

    (row,) = audit_rules([op])
    assert row.status == "proved", row.detail
