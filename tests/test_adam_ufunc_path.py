"""Adam's NumPy ufunc update (optim/adam.py ``_update_numpy``) against its backend calls.

The ufunc form writes into the state in place with one scratch array; it must give the
same bits as the backend calls it replaces, for Adam (L2 decay) and AdamW (decoupled).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import symgrad as sg
from symgrad.optim import adam as adam_mod


def _train(monkeypatch, path: str, opt_cls, dtype, wd: float = 0.1,
           **kw) -> tuple[list, int]:
    """Four steps on two parameters through ``path``: "loop" (the one-pass loop, where the
    CPU backend allows it), "ufunc" (the NumPy ufuncs) or "backend" (the backend calls);
    returns the parameters and moments, and how many updates took ``path``."""
    sg.manual_seed(0)
    ps = [sg.randn(5, 7, dtype=dtype, requires_grad=True),
          sg.randn(300, dtype=dtype, requires_grad=True)]
    opt = opt_cls(ps, lr=0.01, weight_decay=wd, **kw)
    calls = {"loop": 0, "ufunc": 0}
    for name, attr in (("loop", "_update_loop"), ("ufunc", "_update_numpy")):
        real = getattr(adam_mod, attr)
        monkeypatch.setattr(adam_mod, attr,
                            lambda *a, real=real, name=name: (calls.__setitem__(
                                name, calls[name] + 1), real(*a)))
    if path == "ufunc":
        monkeypatch.setattr(adam_mod, "_loop_ok", lambda *a: False)
    elif path == "backend":
        monkeypatch.setattr(adam_mod, "_NUMPY_BACKENDS", frozenset())
    for _ in range(4):
        opt.zero_grad()
        ((ps[0] ** 2).sum() + ps[1].sin().sum()).backward()
        opt.step()
    monkeypatch.undo()
    out = [p.detach().numpy().copy() for p in ps]
    for p in ps:
        out += [opt.state[p][k].numpy().copy() for k in ("exp_avg", "exp_avg_sq")]
        assert opt.state[p]["step"].item() == 4
    return out, calls.get(path, 0)


@pytest.mark.parametrize("wd", [0.1, 0])
@pytest.mark.parametrize("dtype", [sg.float32, sg.float64])
@pytest.mark.parametrize("opt_cls", [sg.optim.Adam, sg.optim.AdamW])
def test_loop_and_ufunc_updates_are_bitwise_the_backend_update(monkeypatch, cpu_backend,
                                                              opt_cls, dtype, wd):
    """The one-pass loop (Adam's L2 decay, AdamW's decoupled decay, no decay) and the
    ufuncs give the backend calls' bits."""
    slow, _ = _train(monkeypatch, "backend", opt_cls, dtype, wd)
    ufunc, n_ufunc = _train(monkeypatch, "ufunc", opt_cls, dtype, wd)
    expect_loop = 8 if cpu_backend == "cpu" else 0  # the NumPy backend never runs Numba
    loop, n_loop = _train(monkeypatch, "loop", opt_cls, dtype, wd)
    assert n_ufunc == 8 and n_loop == expect_loop
    for a, b, c in zip(loop, ufunc, slow):
        assert a.dtype == dtype.np
        np.testing.assert_array_equal(b, c)
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("betas", [(np.float64(0.9), 0.999),
                                   (np.float64(0.9), np.float64(0.999))])
def test_numpy_float_betas_act_as_python_floats(monkeypatch, torch, betas):
    """torch takes NumPy float64 betas (a float subclass) and its ops treat them as Python
    scalars: rounded to the parameters' dtype. Adam turns them into floats, so they give
    the bits of Python-float betas (the loop; NumPy alone would compute in float64), and
    they match torch."""
    want, _ = _train(monkeypatch, "loop", sg.optim.AdamW, sg.float32, betas=(0.9, 0.999))
    got, n_loop = _train(monkeypatch, "loop", sg.optim.AdamW, sg.float32, betas=betas)
    assert n_loop == 8
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    sg.manual_seed(0)
    init = [sg.randn(5, 7), sg.randn(300)]
    tp = [torch.tensor(x.numpy(), requires_grad=True) for x in init]
    opt = torch.optim.AdamW(tp, lr=0.01, weight_decay=0.1, betas=betas)
    for _ in range(4):
        opt.zero_grad()
        ((tp[0] ** 2).sum() + tp[1].sin().sum()).backward()
        opt.step()
    for a, b in zip(got[:2], tp):  # a few float32 roundings apart at most (sin's gradient
        tol = 64 * np.finfo(np.float32).eps  # and the BLAS-free sums agree to rounding)
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("betas", [(np.float64(0.9), 0.999), (0.9, 0.999), "tensors"])
@pytest.mark.parametrize("path", ["loop", "ufunc"])
def test_a_zero_dim_parameter_updates_as_torchs(monkeypatch, torch, betas, path):
    """A 0-d parameter (a learned scale) with Python, NumPy or tensor betas, through the
    loop or the ufuncs (taken where the loop cannot be, e.g. a gradient sharing memory with
    the state): ufuncs on 0-d arrays return scalars, which used to fail with "return arrays
    must be of ArrayType"."""
    calls = []
    real = adam_mod._update_numpy
    monkeypatch.setattr(adam_mod, "_update_numpy", lambda *a: (calls.append(1), real(*a)))
    if path == "ufunc":
        monkeypatch.setattr(adam_mod, "_loop_ok", lambda *a: False)

    def make(lib):
        b = (lib.tensor(0.9), lib.tensor(0.999)) if betas == "tensors" else betas
        p = lib.tensor(1.5, requires_grad=True)
        return p, lib.optim.Adam([p], lr=0.1, betas=b, weight_decay=0.01)

    (p, opt), (tp, topt) = make(sg), make(torch)
    for _ in range(3):
        for q, o in ((p, opt), (tp, topt)):
            o.zero_grad()
            (q * q).backward()
            o.step()
        tol = 8 * np.finfo(np.float32).eps
        np.testing.assert_allclose(p.item(), tp.item(), rtol=tol)
    assert p.shape == () and opt.state[p]["exp_avg"].shape == ()
    assert len(calls) == (3 if path == "ufunc" else 0)


@pytest.mark.parametrize("betas, message", [
    ((np.float32(0.9), np.float32(0.999)), "betas must be either both floats or both Tensors"),
    ((0, 0.999), "betas must be either both floats or both Tensors"),
    ("mixed", "betas must be either both floats or both Tensors"),
    ("two-element", "Boolean value of Tensor with more than one value is ambiguous"),
])
def test_betas_are_checked_as_torch_checks_them(torch, betas, message):
    for lib in (torch, sg):
        b = {"mixed": (lib.tensor(0.9), 0.999),
             "two-element": (lib.tensor([0.9, 0.9]), lib.tensor(0.999))}.get(betas, betas)
        p = lib.zeros(2, requires_grad=True)
        error = RuntimeError if betas == "two-element" else ValueError
        with pytest.raises(error, match=re.escape(message)):
            lib.optim.Adam([p], betas=b)


@pytest.mark.parametrize("kw", [{"amsgrad": True}, {"maximize": True}])
def test_other_variants_still_match_torch(monkeypatch, kw):
    torch = pytest.importorskip("torch", reason="torch 2.13 is the test oracle")
    got, _ = _train(monkeypatch, "loop", sg.optim.AdamW, sg.float32, **kw)
    sg.manual_seed(0)
    init = [sg.randn(5, 7), sg.randn(300)]
    tp = [torch.tensor(x.numpy(), requires_grad=True) for x in init]
    opt = torch.optim.AdamW(tp, lr=0.01, weight_decay=0.1, **kw)
    for _ in range(4):
        opt.zero_grad()
        ((tp[0] ** 2).sum() + tp[1].sin().sum()).backward()
        opt.step()
    eps = np.finfo(np.float32).eps
    for a, b in zip(got[:2], tp):
        np.testing.assert_allclose(a, b.detach().numpy(), rtol=64 * eps, atol=64 * eps)


def test_parameter_version_is_bumped_by_the_ufunc_update():
    p = sg.randn(4, requires_grad=True)
    opt = sg.optim.AdamW([p])
    y = p * p  # saves p
    (p.sum()).backward()
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
