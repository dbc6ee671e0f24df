"""gradcheck / gradgradcheck: PyTorch's signature and defaults, and they catch wrong rules."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import symgrad as sg
from symgrad.ops import OPS
from symgrad.testing import GradcheckError, gradcheck, gradgradcheck


def _leaf(*shape, seed=0):
    rng = np.random.default_rng(seed)
    return sg.tensor(rng.uniform(0.5, 1.5, size=shape), dtype=sg.float64, requires_grad=True)


def test_signature_and_defaults_match_torch(torch):
    ours = inspect.signature(gradcheck).parameters
    theirs = inspect.signature(torch.autograd.gradcheck).parameters
    for name in ("eps", "atol", "rtol", "raise_exception", "fast_mode", "nondet_tol"):
        assert ours[name].default == theirs[name].default, name
    ours2 = inspect.signature(gradgradcheck).parameters
    theirs2 = inspect.signature(torch.autograd.gradgradcheck).parameters
    for name in ("eps", "atol", "rtol", "raise_exception", "fast_mode"):
        assert ours2[name].default == theirs2[name].default, name


@pytest.mark.parametrize("fast_mode", [False, True])
def test_correct_gradients_pass(fast_mode):
    x, w = _leaf(3, 4), _leaf(4, 2, seed=1)
    assert gradcheck(lambda a, b: (a @ b).tanh() * a.sum(), (x, w), fast_mode=fast_mode)
    assert gradgradcheck(lambda a, b: (a @ b).sigmoid(), (x, w), fast_mode=fast_mode)


@pytest.mark.parametrize("fast_mode", [False, True])
def test_wrong_rule_is_caught(monkeypatch, fast_mode):
    monkeypatch.setitem(OPS["sin"].grads, "self", lambda grad, self: grad * self.cos() * 1.01)
    x = _leaf(5)
    with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0"):
        gradcheck(lambda a: a.sin(), (x,), fast_mode=fast_mode)
    assert gradcheck(lambda a: a.sin(), (x,), raise_exception=False,
                     fast_mode=fast_mode) is False


def test_wrong_second_derivative_is_caught(monkeypatch):
    # first derivative right, but computed in a way whose own derivative is wrong
    monkeypatch.setitem(OPS["tanh"].grads, "self",
                        lambda grad, result: grad * (1 - result.detach() * result.detach()))
    x = _leaf(3)
    assert gradcheck(lambda a: a.tanh(), (x,))
    with pytest.raises(GradcheckError):
        gradgradcheck(lambda a: a.tanh(), (x,))


def test_float32_inputs_warn_and_no_grad_inputs_raise():
    x = sg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.warns(UserWarning, match="not a double precision"):
        gradcheck(lambda a: a * 2, (x,), atol=1e-2, rtol=1e-2, eps=1e-3)
    with pytest.raises(ValueError, match="at least one input tensor to require gradient"):
        gradcheck(lambda a: a * 2, (sg.tensor([1.0], dtype=sg.float64),))
