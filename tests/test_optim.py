"""symgrad.optim against torch.optim: 20 steps from identical weights and data give the same
parameters (float64, within the rounding bound of 20 steps' operations), for every SGD and
Adam variant; param groups, zero_grad, state dicts and argument checks behave as torch's."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
import symgrad.nn as nn
import symgrad.nn.functional as F

SIZES = [5, 8, 6, 3]
BATCH = 16
# Roundings one training step can put into a first-layer weight: the forward (each layer's
# mm over fan_in, bias, activation (2)), the loss's gradient (sub, scale), the backward down
# to the first layer (each later layer's mm over its fan_out and the activation's partial
# (3)), the weight's mm over the batch, and the optimizer's update (Adam's is the longest:
# weight decay, two moments, bias corrections, sqrt, eps, division, the step: 12).
STEP_TERMS = (sum(SIZES[:-1]) + 4 * (len(SIZES) - 1) + 2
              + sum(SIZES[2:]) + 3 * (len(SIZES) - 2) + BATCH + 12)


def _mlp(lib, act):
    layers = []
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:], strict=True)):
        layers.append(lib.nn.Linear(a, b, bias=i != 1, dtype=lib.float64))
        if i < len(SIZES) - 2:
            layers.append(act(lib))
    return lib.nn.Sequential(*layers)


def _twins(torch, act=lambda L: L.nn.Tanh()):
    """The same MLP in both libraries (symgrad's init copied into torch)."""
    sg.manual_seed(3)
    ours = _mlp(sg, act)
    theirs = _mlp(torch, act)
    with torch.no_grad():
        for p, tp in zip(ours.parameters(), theirs.parameters(), strict=True):
            tp.copy_(torch.from_numpy(p.detach().numpy().copy()))
    return ours, theirs


def _data():
    rng = np.random.default_rng(11)
    return rng.standard_normal((BATCH, SIZES[0])), rng.standard_normal((BATCH, SIZES[-1]))


def _train(lib, model, opt, steps=20, loss_fn=None):
    x, y = (lib.tensor(a) for a in _data())
    Fl = F if lib is sg else __import__("torch").nn.functional
    for _ in range(steps):
        opt.zero_grad()
        loss = (loss_fn or Fl.mse_loss)(model(x), y)
        loss.backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def _assert_same(ours, theirs, steps=20):
    """Parameters after ``steps`` steps agree within the rounding bound of ``steps`` times
    one step's operations (each step starts from the previous one's rounded parameters;
    at these learning rates a step does not amplify a perturbation of the parameters)."""
    for a, b in zip(ours, theirs, strict=True):
        assert_close(a, b, terms=steps * STEP_TERMS)


SGD_CASES = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.05, momentum=0.9),
    "dampening": dict(lr=0.05, momentum=0.8, dampening=0.3),
    "weight_decay": dict(lr=0.05, momentum=0.9, weight_decay=0.01),
    "nesterov": dict(lr=0.05, momentum=0.9, nesterov=True),
    "nesterov_wd": dict(lr=0.05, momentum=0.5, nesterov=True, weight_decay=0.1),
    "maximize": dict(lr=0.01, momentum=0.5, maximize=True),
}

ADAM_CASES = {
    "defaults": dict(),
    "lr_betas": dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6),
    "weight_decay": dict(lr=0.01, weight_decay=0.05),
    "amsgrad": dict(lr=0.02, amsgrad=True),
    "amsgrad_wd": dict(lr=0.02, amsgrad=True, weight_decay=0.1),
    "decoupled": dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
    "maximize": dict(lr=0.001, maximize=True),
}


@pytest.mark.parametrize("case", sorted(SGD_CASES))
def test_sgd_20_steps_match_torch(case, torch):
    ours, theirs = _twins(torch)
    kw = SGD_CASES[case]
    got = _train(sg, ours, sg.optim.SGD(ours.parameters(), **kw))
    want = _train(torch, theirs, torch.optim.SGD(theirs.parameters(), **kw))
    _assert_same(got, want)
    with pytest.raises(AssertionError, match="not close"):  # it moved
        assert_close(got[0], _twins(torch)[0][0].weight, terms=20 * STEP_TERMS)


@pytest.mark.parametrize("case", sorted(ADAM_CASES))
def test_adam_20_steps_match_torch(case, torch):
    ours, theirs = _twins(torch, act=lambda L: L.nn.ReLU())
    kw = ADAM_CASES[case]
    got = _train(sg, ours, sg.optim.Adam(ours.parameters(), **kw))
    want = _train(torch, theirs, torch.optim.Adam(theirs.parameters(), **kw))
    _assert_same(got, want)


def test_adam_state_matches_torchs(torch):
    ours, theirs = _twins(torch)
    opt, topt = sg.optim.Adam(ours.parameters(), amsgrad=True), \
        torch.optim.Adam(theirs.parameters(), amsgrad=True)
    _train(sg, ours, opt, steps=3)
    _train(torch, theirs, topt, steps=3)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sorted(sd["state"]) == sorted(tsd["state"])
    for i, st in tsd["state"].items():
        assert sorted(sd["state"][i]) == sorted(st)
        assert sd["state"][i]["step"].item() == st["step"].item() == 3.0
        assert sd["state"][i]["step"].dtype is sg.float32
        for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
            assert_close(sd["state"][i][k], st[k], terms=3 * STEP_TERMS)  # 3 steps
    assert sd["param_groups"][0]["params"] == tsd["param_groups"][0]["params"]
    for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
        assert sd["param_groups"][0][key] == tsd["param_groups"][0][key]


def test_param_groups_with_their_own_hyperparameters_match_torch(torch):
    ours, theirs = _twins(torch)

    def groups(model):
        ps = list(model.parameters())
        return [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.2, "momentum": 0.5}]

    opt = sg.optim.SGD(groups(ours), lr=0.05, momentum=0.9)
    topt = torch.optim.SGD(groups(theirs), lr=0.05, momentum=0.9)
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.2]
    assert [g["momentum"] for g in opt.param_groups] == [0.9, 0.5]
    _assert_same(_train(sg, ours, opt), _train(torch, theirs, topt))
    extra = nn.Parameter(sg.zeros(2))
    opt.add_param_group({"params": [extra], "lr": 1.0})
    assert opt.param_groups[-1]["momentum"] == 0.9 and opt.param_groups[-1]["params"] == [extra]
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [extra]})


def test_state_dict_roundtrip_resumes_training_exactly(torch, tmp_path):
    ours, theirs = _twins(torch)
    opt = sg.optim.Adam(ours.parameters(), lr=0.01)
    _train(sg, ours, opt, steps=5)
    sg.save({"model": ours.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt")
    reference = _train(sg, ours, opt, steps=5)

    ckpt = sg.load(tmp_path / "ckpt")
    sg.manual_seed(99)
    resumed = _mlp(sg, lambda L: L.nn.Tanh())
    resumed.load_state_dict(ckpt["model"])
    opt2 = sg.optim.Adam(resumed.parameters(), lr=0.5)
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.param_groups[0]["lr"] == 0.01
    for a, b in zip(_train(sg, resumed, opt2, steps=5), reference, strict=True):
        np.testing.assert_array_equal(a, b)  # the same kernels on the same state: exact


def test_zero_grad_and_steps_skip_parameters_without_grad():
    w = nn.Parameter(sg.tensor([1.0, 2.0]))
    frozen = nn.Parameter(sg.tensor([5.0]))
    opt = sg.optim.SGD([w, frozen], lr=0.5)
    (w * w).sum().backward()
    v = w._version
    opt.step()
    assert w.tolist() == [0.0, 0.0] and frozen.tolist() == [5.0]
    assert w._version == v + 1  # in-place update bumps the version counter
    g = w.grad
    opt.zero_grad(set_to_none=False)
    assert w.grad is g and w.grad.tolist() == [0.0, 0.0]
    opt.zero_grad()
    assert w.grad is None


def test_step_invalidates_graphs_that_saved_the_parameter():
    w = nn.Parameter(sg.tensor([1.0, 2.0]))
    opt = sg.optim.SGD([w], lr=0.1)
    (w * w).sum().backward()
    stale = (w * w).sum()
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        stale.backward()


def test_closure_is_evaluated_with_grad(torch):
    w = nn.Parameter(sg.tensor([3.0]))
    opt = sg.optim.SGD([w], lr=0.25)

    def closure():
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    with sg.no_grad():
        loss = opt.step(closure)
    assert loss.item() == 9.0 and w.item() == 1.5


ARG_ERRORS = [
    (lambda L, ps: L.optim.SGD(ps, lr=-1), "Invalid learning rate"),
    (lambda L, ps: L.optim.SGD(ps, lr=0.1, momentum=-0.5), "Invalid momentum"),
    (lambda L, ps: L.optim.SGD(ps, lr=0.1, weight_decay=-1), "Invalid weight_decay"),
    (lambda L, ps: L.optim.SGD(ps, lr=0.1, nesterov=True), "Nesterov momentum requires"),
    (lambda L, ps: L.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1, nesterov=True),
     "Nesterov momentum requires"),
    (lambda L, ps: L.optim.Adam(ps, betas=(1.0, 0.9)), "Invalid beta parameter at index 0"),
    (lambda L, ps: L.optim.Adam(ps, betas=(0.9, -0.1)), "Invalid beta parameter at index 1"),
    (lambda L, ps: L.optim.Adam(ps, eps=-1), "Invalid epsilon"),
    (lambda L, ps: L.optim.Adam([], lr=0.1), "empty parameter list"),
]


@pytest.mark.parametrize("i", range(len(ARG_ERRORS)))
def test_argument_errors_match_torch(i, torch):
    fn, words = ARG_ERRORS[i]
    for lib in (sg, torch):
        with pytest.raises(ValueError, match=words):
            fn(lib, [lib.nn.Parameter(lib.ones(2))])


def test_repr_lists_the_group_hyperparameters():
    opt = sg.optim.SGD([nn.Parameter(sg.ones(1))], lr=0.1, momentum=0.9)
    text = repr(opt)
    assert text.startswith("SGD (\nParameter Group 0\n")
    assert "    lr: 0.1\n" in text and "    momentum: 0.9\n" in text and text.endswith("\n)")
    with pytest.raises(TypeError, match="iterable of Tensors"):
        sg.optim.SGD(nn.Parameter(sg.ones(1)), lr=0.1)
    with pytest.raises(ValueError, match="non-leaf"):
        sg.optim.SGD([nn.Parameter(sg.ones(1)) * 2], lr=0.1)
