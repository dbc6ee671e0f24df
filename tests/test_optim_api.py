"""symgrad.optim against torch.optim for AdamW, RMSprop, Adagrad and SGD's variants: 20 steps
from identical weights and data give the same parameters *and* optimizer state (float64,
within the rounding bound of 20 steps), per param group hyperparameters included; the param
groups, state dicts (structure, keys, resuming), reprs, defaults and argument errors are
torch's."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg

SIZES = [4, 6, 3]
BATCH = 8
# Roundings one step can put into a first-layer weight or a state buffer: the forward (mm
# over fan_in, bias, tanh), the loss gradient, the backward (mm over fan_out, tanh'), the
# weight's mm over the batch, and the longest update (RMSprop centered with momentum and
# weight decay: decay, square average (3), lerp (3), sqrt, eps, division, buffer (2),
# the step: 14).
STEP_TERMS = sum(SIZES[:-1]) + 4 * (len(SIZES) - 1) + 2 + sum(SIZES[2:]) + 3 + BATCH + 14
STEPS = 20


def _model(lib):
    return lib.nn.Sequential(lib.nn.Linear(SIZES[0], SIZES[1], dtype=lib.float64),
                             lib.nn.Tanh(),
                             lib.nn.Linear(SIZES[1], SIZES[2], dtype=lib.float64))


def _twins(torch):
    sg.manual_seed(5)
    ours, theirs = _model(sg), _model(torch)
    with torch.no_grad():
        for p, tp in zip(ours.parameters(), theirs.parameters(), strict=True):
            tp.copy_(torch.from_numpy(p.detach().numpy().copy()))
    return ours, theirs


def _data(lib):
    r = np.random.default_rng(21)
    return lib.tensor(r.standard_normal((BATCH, SIZES[0]))), \
        lib.tensor(r.standard_normal((BATCH, SIZES[-1])))


def _groups(model, split):
    ps = list(model.parameters())
    if split is None:
        return ps
    return [{"params": ps[:2]}, {"params": ps[2:], **split}]


def _train(lib, model, opt, steps=STEPS, freeze_last=False):
    x, y = _data(lib)
    for _ in range(steps):
        opt.zero_grad()
        loss = lib.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if freeze_last:  # a parameter without a gradient is skipped, its state untouched
            list(model.parameters())[-1].grad = None
        opt.step()


def _compare(ours, theirs, opt, topt, steps=STEPS):
    terms = steps * STEP_TERMS
    for p, tp in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert_close(p, tp, terms=terms)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sorted(sd["state"]) == sorted(tsd["state"])
    for i, tst in tsd["state"].items():
        st = sd["state"][i]
        assert list(st) == list(tst), i  # the same buffers, in torch's order
        for k, tv in tst.items():
            v = st[k]
            if isinstance(tv, (int, float)) or tv.ndim == 0:  # the step count
                assert float(v) == float(tv) and v.dtype is sg.float32
            else:
                assert_close(v, tv, terms=terms, msg=f"state[{i}][{k!r}]")
    strip = ("params",)
    assert [{k: v for k, v in g.items() if k not in strip} for g in sd["param_groups"]] == \
        [{k: v for k, v in g.items() if k not in strip} for g in tsd["param_groups"]]
    assert [g["params"] for g in sd["param_groups"]] == \
        [g["params"] for g in tsd["param_groups"]]


CASES = {
    "AdamW": [dict(), dict(lr=0.01, weight_decay=0.1), dict(lr=0.02, amsgrad=True),
              dict(lr=0.01, betas=(0.8, 0.9), eps=1e-6, maximize=True)],
    "RMSprop": [dict(), dict(lr=0.005, alpha=0.9), dict(lr=0.01, momentum=0.8),
                dict(lr=0.01, centered=True), dict(lr=0.01, centered=True, momentum=0.5,
                                                   weight_decay=0.05),
                dict(lr=0.001, maximize=True, eps=1e-4)],
    "Adagrad": [dict(), dict(lr=0.1, lr_decay=0.05), dict(lr=0.05, weight_decay=0.1),
                dict(lr=0.05, initial_accumulator_value=0.5, eps=1e-6),
                dict(lr=0.02, maximize=True)],
    "SGD": [dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
            dict(lr=0.05, momentum=0.7, dampening=0.4), dict(lr=0.1, weight_decay=0.2)],
}
PARAMS = [(name, i) for name, cases in CASES.items() for i in range(len(cases))]
SPLITS = {"AdamW": {"lr": 0.03, "weight_decay": 0.0}, "RMSprop": {"lr": 0.02, "alpha": 0.95},
          "Adagrad": {"lr": 0.2, "lr_decay": 0.1}, "SGD": {"lr": 0.01, "momentum": 0.5}}


@pytest.mark.parametrize("name,i", PARAMS)
def test_20_steps_match_torch_in_parameters_and_state(name, i, torch):
    ours, theirs = _twins(torch)
    kw = CASES[name][i]
    opt = getattr(sg.optim, name)(ours.parameters(), **kw)
    topt = getattr(torch.optim, name)(theirs.parameters(), **kw)
    _train(sg, ours, opt)
    _train(torch, theirs, topt)
    _compare(ours, theirs, opt, topt)


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_param_groups_with_own_hyperparameters_and_frozen_params_match_torch(name, torch):
    ours, theirs = _twins(torch)
    kw = CASES[name][-1] if name != "SGD" else CASES[name][0]
    opt = getattr(sg.optim, name)(_groups(ours, SPLITS[name]), **kw)
    topt = getattr(torch.optim, name)(_groups(theirs, SPLITS[name]), **kw)
    _train(sg, ours, opt, freeze_last=True)
    _train(torch, theirs, topt, freeze_last=True)
    _compare(ours, theirs, opt, topt)


@pytest.mark.parametrize("name", sorted(CASES))
def test_defaults_and_repr_match_torch(name, torch):
    p, tp = sg.nn.Parameter(sg.ones(2)), torch.nn.Parameter(torch.ones(2))
    kw = {"lr": 0.1} if name == "SGD" else {}
    opt, topt = getattr(sg.optim, name)([p], **kw), getattr(torch.optim, name)([tp], **kw)
    assert opt.defaults == topt.defaults
    assert repr(opt) == repr(topt)
    assert opt.param_groups[0].keys() == topt.param_groups[0].keys()
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sd["param_groups"] == tsd["param_groups"]
    assert list(sd["state"]) == list(tsd["state"])  # Adagrad's state exists from the start
    for i, st in tsd["state"].items():
        assert {k: v.tolist() for k, v in sd["state"][i].items()} == \
            {k: v.tolist() for k, v in st.items()}


@pytest.mark.parametrize("name", ["AdamW", "RMSprop", "Adagrad"])
def test_state_dict_resumes_training_as_torch(name, torch, tmp_path):
    """Train 5 steps, checkpoint, train 5 more; a fresh optimizer loaded from the checkpoint
    (other hyperparameters given) continues exactly as the uninterrupted one."""
    kw = CASES[name][1]
    ours, theirs = _twins(torch)
    opt = getattr(sg.optim, name)(ours.parameters(), **kw)
    _train(sg, ours, opt, steps=5)
    sg.save({"model": ours.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt")
    _train(sg, ours, opt, steps=5)
    ckpt = sg.load(tmp_path / "ckpt")
    resumed = _model(sg)
    resumed.load_state_dict(ckpt["model"])
    opt2 = getattr(sg.optim, name)(resumed.parameters(), lr=0.5)
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.param_groups[0]["lr"] == kw["lr"]
    _train(sg, resumed, opt2, steps=5)
    for a, b in zip(resumed.parameters(), ours.parameters(), strict=True):
        np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())
    # and both sides agree with torch's uninterrupted run
    topt = getattr(torch.optim, name)(theirs.parameters(), **kw)
    _train(torch, theirs, topt, steps=10)
    _compare(resumed, theirs, opt2, topt, steps=10)


def test_adamw_is_adam_with_decoupled_decay_and_stays_so_after_loading(torch):
    p = sg.nn.Parameter(sg.ones(2))
    opt = sg.optim.AdamW([p])
    assert isinstance(opt, sg.optim.Adam)
    sd = opt.state_dict()
    sd["param_groups"][0]["decoupled_weight_decay"] = False
    opt.load_state_dict(sd)
    assert opt.param_groups[0]["decoupled_weight_decay"] is True
    tp = torch.nn.Parameter(torch.ones(2))
    topt = torch.optim.AdamW([tp])
    tsd = topt.state_dict()
    tsd["param_groups"][0]["decoupled_weight_decay"] = False
    topt.load_state_dict(tsd)
    assert topt.param_groups[0]["decoupled_weight_decay"] is True


ARG_ERRORS = [
    ("RMSprop", dict(lr=-1.0)), ("RMSprop", dict(eps=-1.0)), ("RMSprop", dict(momentum=-1.0)),
    ("RMSprop", dict(weight_decay=-1.0)), ("RMSprop", dict(alpha=-1.0)),
    ("Adagrad", dict(lr=-1.0)), ("Adagrad", dict(lr_decay=-1.0)),
    ("Adagrad", dict(weight_decay=-1.0)), ("Adagrad", dict(initial_accumulator_value=-1.0)),
    ("Adagrad", dict(eps=-1.0)), ("AdamW", dict(lr=-1.0)), ("AdamW", dict(betas=(1.0, 0.9))),
    ("AdamW", dict(weight_decay=-0.1)), ("Adagrad", dict(fused=True, foreach=True)),
]


@pytest.mark.parametrize("i", range(len(ARG_ERRORS)))
def test_argument_errors_match_torch(i, torch):
    name, kw = ARG_ERRORS[i]
    msgs = []
    for lib in (sg, torch):
        with pytest.raises((ValueError, RuntimeError)) as err:
            getattr(lib.optim, name)([lib.nn.Parameter(lib.ones(2))], **kw)
        msgs.append((type(err.value), str(err.value)))
    assert msgs[0] == msgs[1]


def test_differentiable_steps_are_refused_by_name():
    with pytest.raises(NotImplementedError, match="differentiable=True"):
        sg.optim.RMSprop([sg.nn.Parameter(sg.ones(1))], differentiable=True)


def test_duplicate_parameters_in_a_group_warn_as_torch(torch):
    for lib in (sg, torch):
        p = lib.nn.Parameter(lib.ones(1))
        with pytest.warns(UserWarning, match="duplicate parameters"):
            lib.optim.SGD([p, p], lr=0.1)


def test_steps_bump_version_counters_of_parameters():
    for name in ("AdamW", "RMSprop", "Adagrad"):
        w = sg.nn.Parameter(sg.tensor([1.0, 2.0]))
        opt = getattr(sg.optim, name)([w], lr=0.1)
        (w * w).sum().backward()
        stale = (w * w).sum()
        opt.step()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            stale.backward()
