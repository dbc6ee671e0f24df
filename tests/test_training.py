"""End-to-end training the way tutorials do it: two interleaved half-moons and XOR."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad as sg
import symgrad.nn as nn
import symgrad.nn.functional as F


def half_moons(n: int = 400, noise: float = 0.1, seed: int = 0):
    """Two interleaved half circles (as sklearn's make_moons), labels 0 and 1."""
    rng = np.random.default_rng(seed)
    k = n // 2
    t_out = np.linspace(0, np.pi, k)
    t_in = np.linspace(0, np.pi, n - k)
    outer = np.stack([np.cos(t_out), np.sin(t_out)], 1)
    inner = np.stack([1 - np.cos(t_in), 1 - np.sin(t_in) - 0.5], 1)
    x = np.concatenate([outer, inner]) + rng.normal(0, noise, (n, 2))
    y = np.concatenate([np.zeros(k), np.ones(n - k)])
    perm = rng.permutation(n)
    return x[perm].astype(np.float32), y[perm].astype(np.float32)


def test_half_moons_reach_97_percent_with_bce_and_adam():
    x, y = half_moons()
    sg.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 1))
    opt = sg.optim.Adam(model.parameters(), lr=0.02)
    loss_fn = nn.BCEWithLogitsLoss()
    xs, ys = sg.tensor(x), sg.tensor(y).reshape(-1, 1)
    losses = []
    for _ in range(300):
        opt.zero_grad()
        loss = loss_fn(model(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with sg.no_grad():
        pred = (model(xs) > 0).float()
    accuracy = (pred == ys).float().mean().item()
    assert accuracy >= 0.97, accuracy
    assert losses[-1] < 0.1 < losses[0]


def test_half_moons_with_cross_entropy_and_sgd_momentum():
    x, y = half_moons(seed=1)
    sg.manual_seed(1)
    model = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 2))
    opt = sg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    xs, ys = sg.tensor(x), sg.tensor(y.astype(np.int64))
    for _ in range(400):
        opt.zero_grad()
        loss = F.cross_entropy(model(xs), ys)
        loss.backward()
        opt.step()
    with sg.no_grad():
        logits = model(xs).numpy()
    accuracy = (logits.argmax(1) == y).mean()
    assert accuracy >= 0.97, accuracy


@pytest.mark.parametrize("act", [nn.Tanh, nn.Sigmoid])
def test_xor_reaches_100_percent_with_mse_and_sgd(act):
    x = sg.tensor([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    y = sg.tensor([[0.0], [1.0], [1.0], [0.0]])
    sg.manual_seed(2)
    model = nn.Sequential(nn.Linear(2, 8), act(), nn.Linear(8, 1))
    opt = sg.optim.SGD(model.parameters(), lr=0.2 if act is nn.Tanh else 0.5, momentum=0.9)
    loss_fn = nn.MSELoss()
    for _ in range(300 if act is nn.Tanh else 500):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    with sg.no_grad():
        pred = (model(x) > 0.5).float()
    assert pred.tolist() == y.tolist()
    assert loss.item() < 0.01


def test_parameters_get_grads_after_backward_as_in_a_tutorial():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert all(p.grad is None for p in model.parameters())
    loss = F.mse_loss(model(sg.ones(4, 2)), sg.zeros(4, 1))
    assert loss.grad_fn.name() == "MseLossBackward0"
    assert loss.grad_fn.next_functions[0][0].name() == "AddmmBackward0"
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None and tuple(p.grad.shape) == tuple(p.shape)
        assert p.grad.grad_fn is None and not p.grad.requires_grad
