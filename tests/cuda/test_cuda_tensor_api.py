"""The tensor API of issue 20 on "cuda" (simulator in CI): in-place forms and initialisers
write into the device tensor, give the grad_fn and gradients the CPU gives, and the default
device puts new tensors there."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg

X = np.array([0.5, -0.25, 0.75, 1.5], dtype=np.float32)
W = np.array([0.5, 1.5, 0.25, 0.75], dtype=np.float32)


@pytest.mark.parametrize("call", ["cos_()", "exp_()", "sigmoid_()", "relu_()", "pow_(w)",
                                  "clamp_(-0.3, 0.6)", "clamp_min_(w)", "addcmul_(w, w)",
                                  "gt_(w)", "logical_not_()", "mul_(w)", "div_(2)",
                                  "add_(w, alpha=2)", "sub_(w, alpha=0.5)", "add_(2, alpha=3)"])
def test_inplace_forms_on_cuda_match_the_cpu(call):
    got = []
    for device in ("cpu", "cuda"):
        x = sg.tensor(X, requires_grad=True, device=device)
        w = sg.tensor(W, requires_grad=True, device=device)
        a = x * 2
        assert eval("a." + call, {"a": a, "w": w}) is a
        assert a.device.type == device and a._version == 1
        (a * 3).sum().backward()
        got.append((a.grad_fn.name(), a.detach().cpu().numpy(), x.grad.cpu().numpy(),
                    None if w.grad is None else w.grad.cpu().numpy()))
    assert got[0][0] == got[1][0]
    for c, g in zip(got[0][1:], got[1][1:]):
        if c is None:
            assert g is None
        else:
            assert_close(g, c, terms=4)


@pytest.mark.parametrize("call, name", [
    ("uniform_(-1, 1)", "UniformBackward0"), ("normal_()", "NormalBackward0"),
    ("random_(0, 3)", "RandomBackward0"), ("bernoulli_(0.5)", "BernoulliBackward2"),
    ("bernoulli_(p)", "BernoulliBackward1"), ("exponential_()", "ExponentialBackward0")])
def test_initialisers_write_into_the_device_tensor(call, name):
    x = sg.tensor(X, requires_grad=True, device="cuda")
    p = sg.tensor([0.0, 1.0, 0.0, 1.0], device="cuda")
    a = x * 2
    eval("a." + call, {"a": a, "p": p})
    assert a.device.type == "cuda" and a._version == 1 and a.grad_fn.name() == name
    a.sum().backward()
    np.testing.assert_array_equal(x.grad.cpu().numpy(), np.zeros(4, np.float32))
    if call == "bernoulli_(p)":
        assert a.cpu().tolist() == [0.0, 1.0, 0.0, 1.0]


def test_isclose_and_the_default_device_on_cuda():
    a = sg.tensor(X, device="cuda")
    close = sg.isclose(a, a + 1e-9)
    assert close.device.type == "cuda" and close.cpu().tolist() == [True] * 4
    assert sg.allclose(a, a) and sg.equal(a, a.clone())
    try:
        sg.set_default_device("cuda")
        for t in (sg.zeros(2), sg.tensor([1.0]), sg.Tensor(2), sg.rand(2), sg.arange(3)):
            assert t.device.type == "cuda"
        assert repr(sg.get_default_device()) == "device(type='cuda', index=0)"
    finally:
        sg.set_default_device(None)
    assert sg.zeros(2).device.type == "cpu"
