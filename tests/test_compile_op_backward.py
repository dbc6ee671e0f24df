"""The generic compile rule (formulas.op_backward) reads each saved operand the backend's
fused backward takes from a precomputed plan: a value of the step, a number fixed at
tracing, or one computed per call (an input's strides). With addmm's own NumPy rule taken
away, a Linear's backward goes through it (addmm saves mat1's sizes and strides) and must
give eager's gradients bit for bit: the same kernel on the same arrays."""

from __future__ import annotations

import copy

import numpy as np

import symgrad as sg
from symgrad import nn
from symgrad.nn import functional as F


def _step(model, opt):
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def test_generic_backward_of_addmm_matches_eager(monkeypatch):
    from symgrad.compile import rules

    monkeypatch.delitem(rules.RULES, "addmm")
    sg.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    model_e = copy.deepcopy(model)
    compiled = sg.compile(_step(model, sg.optim.SGD(model.parameters(), lr=0.1)))
    eager = _step(model_e, sg.optim.SGD(model_e.parameters(), lr=0.1))
    for seed in range(3):
        sg.manual_seed(seed)
        x, y = sg.randn(6, 5), sg.randn(6, 3)
        np.testing.assert_array_equal(compiled(x, y).detach().numpy(),
                                      eager(x, y).detach().numpy())
        for p, q in zip(model.parameters(), model_e.parameters()):
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
            np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
    assert compiled.stats["traces"] == 1 and not compiled.stats["fallbacks"]
    assert "bwd_addmm" in compiled.source()
