"""Adam's NumPy ufunc update (optim/adam.py ``_update_numpy``) against its backend calls.

The ufunc form writes into the state in place with one scratch array; it must give the
same bits as the backend calls it replaces, for Adam (L2 decay) and AdamW (decoupled).
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad as sg
from symgrad.optim import adam as adam_mod


def _train(monkeypatch, ufunc: bool, opt_cls, dtype, **kw) -> tuple[list, int]:
    sg.manual_seed(0)
    ps = [sg.randn(5, 7, dtype=dtype, requires_grad=True),
          sg.randn(300, dtype=dtype, requires_grad=True)]
    opt = opt_cls(ps, lr=0.01, weight_decay=0.1, **kw)
    calls = []
    real = adam_mod._update_numpy
    monkeypatch.setattr(adam_mod, "_update_numpy", lambda *a: (calls.append(1), real(*a)))
    if not ufunc:
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
    return out, len(calls)


@pytest.mark.parametrize("dtype", [sg.float32, sg.float64])
@pytest.mark.parametrize("opt_cls", [sg.optim.Adam, sg.optim.AdamW])
def test_ufunc_update_is_bitwise_the_backend_update(monkeypatch, opt_cls, dtype):
    fast, n_fast = _train(monkeypatch, True, opt_cls, dtype)
    slow, n_slow = _train(monkeypatch, False, opt_cls, dtype)
    assert n_fast == 8 and n_slow == 0
    for a, b in zip(fast, slow):
        assert a.dtype == dtype.np
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kw", [{"amsgrad": True}, {"maximize": True}])
def test_other_variants_still_match_torch(monkeypatch, kw):
    torch = pytest.importorskip("torch", reason="torch 2.13 is the test oracle")
    got, _ = _train(monkeypatch, True, sg.optim.AdamW, sg.float32, **kw)
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
