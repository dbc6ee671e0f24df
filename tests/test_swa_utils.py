"""symgrad.optim.swa_utils against torch.optim.swa_utils: an averaged model (SWA's mean, an
EMA by ``avg_fn`` or ``multi_avg_fn``, buffers averaged or copied) follows torch's through a
training run, ``update_bn`` recomputes the same BatchNorm statistics, and SWALR gives the
same learning rates bit for bit (the schedule is float64 arithmetic in torch's order)."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg

SIZES = [4, 6, 3]
BATCH = 8
STEPS = 6
# Roundings per training step in a weight (the forward's mm over fan_in, BatchNorm's
# mean and variance over the batch, tanh, the loss, the backward through BatchNorm (3
# batch sums) and the mm over fan_out, the weight's mm over the batch, SGD's update) and
# per averaging (a lerp or a difference, a division and an addition: 3)
STEP_TERMS = sum(SIZES[:-1]) + 5 * BATCH + sum(SIZES[1:]) + 12 + 3


def _model(lib):
    return lib.nn.Sequential(lib.nn.Linear(SIZES[0], SIZES[1], dtype=lib.float64),
                             lib.nn.BatchNorm1d(SIZES[1], dtype=lib.float64), lib.nn.Tanh(),
                             lib.nn.Linear(SIZES[1], SIZES[2], dtype=lib.float64))


def _twins(torch):
    sg.manual_seed(7)
    ours, theirs = _model(sg), _model(torch)
    with torch.no_grad():
        for p, tp in zip(ours.parameters(), theirs.parameters(), strict=True):
            tp.copy_(torch.from_numpy(p.detach().numpy().copy()))
    return {sg: ours, torch: theirs}


def _batches(lib, n=3):
    r = np.random.default_rng(3)
    return [(lib.tensor(r.standard_normal((BATCH, SIZES[0]))),
             lib.tensor(r.standard_normal((BATCH, SIZES[-1])))) for _ in range(n)]


def _train_and_average(lib, model, make_avg):
    opt = lib.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    avg = make_avg(lib, model)
    batches = _batches(lib)
    for step in range(STEPS):
        x, y = batches[step % len(batches)]
        opt.zero_grad()
        lib.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if step >= 1:  # from the second step on, as SWA starts after a warm-up
            avg.update_parameters(model)
    return avg


def _compare_models(ours, theirs):
    sd, tsd = ours.state_dict(), theirs.state_dict()
    assert list(sd) == list(tsd)  # n_averaged, module.0.weight, ... in torch's order
    for k, tv in tsd.items():
        if tv.dtype.is_floating_point:
            assert_close(sd[k], tv, terms=STEPS * STEP_TERMS, msg=k)
        else:
            assert sd[k].tolist() == tv.tolist(), k
            assert sd[k].dtype.name == str(tv.dtype).removeprefix("torch."), k


AVERAGES = {
    "swa": lambda lib, m: lib.optim.swa_utils.AveragedModel(m),
    "swa_buffers": lambda lib, m: lib.optim.swa_utils.AveragedModel(m, use_buffers=True),
    "ema_avg_fn": lambda lib, m: lib.optim.swa_utils.AveragedModel(
        m, avg_fn=lib.optim.swa_utils.get_ema_avg_fn(0.8)),
    "ema_multi": lambda lib, m: lib.optim.swa_utils.AveragedModel(
        m, multi_avg_fn=lib.optim.swa_utils.get_ema_multi_avg_fn(0.7), use_buffers=True),
    "swa_multi": lambda lib, m: lib.optim.swa_utils.AveragedModel(
        m, multi_avg_fn=lib.optim.swa_utils.get_swa_multi_avg_fn()),
}


@pytest.mark.parametrize("kind", sorted(AVERAGES))
def test_averaged_model_follows_torchs(kind, torch):
    models = _twins(torch)
    avgs = {lib: _train_and_average(lib, m, AVERAGES[kind]) for lib, m in models.items()}
    _compare_models(avgs[sg], avgs[torch])
    assert avgs[sg].n_averaged.item() == STEPS - 1
    # the average is not the last model: it moved less
    last = models[sg][0].weight.detach().numpy()
    assert not np.allclose(avgs[sg].module[0].weight.detach().numpy(), last)
    x = _batches(sg)[0][0]
    avgs[sg].eval()
    assert_close(avgs[sg](x), avgs[sg].module(x))  # forward is the module's


def test_update_bn_recomputes_the_running_statistics_as_torch(torch):
    models = _twins(torch)
    avgs = {lib: _train_and_average(lib, m, AVERAGES["swa"]) for lib, m in models.items()}
    for lib, avg in avgs.items():
        before = avg.module[1].momentum
        avg.eval()
        lib.optim.swa_utils.update_bn(_batches(lib), avg)
        assert avg.module[1].momentum == before and not avg.training
    _compare_models(avgs[sg], avgs[torch])
    assert avgs[sg].module[1].num_batches_tracked.item() == 3


def test_update_bn_without_batchnorm_changes_nothing(torch):
    model = sg.nn.Linear(2, 2)
    sd = {k: v.tolist() for k, v in model.state_dict().items()}
    sg.optim.swa_utils.update_bn([sg.ones(1, 2)], model)
    assert {k: v.tolist() for k, v in model.state_dict().items()} == sd


def _swalr(lib, **kw):
    p, q = lib.nn.Parameter(lib.ones(2)), lib.nn.Parameter(lib.ones(1))
    opt = lib.optim.SGD([{"params": [p]}, {"params": [q], "lr": 0.3}], lr=0.1)
    sched = lib.optim.swa_utils.SWALR(opt, **kw)
    out = [sched.get_last_lr()]
    for _ in range(8):
        opt.step()
        sched.step()
        out.append(sched.get_last_lr())
    sd = sched.state_dict()
    return out, sorted(sd), [g["swa_lr"] for g in opt.param_groups]


@pytest.mark.parametrize("kw", [dict(swa_lr=0.05), dict(swa_lr=[0.01, 0.5], anneal_epochs=3),
                                dict(swa_lr=0.02, anneal_epochs=4, anneal_strategy="linear"),
                                dict(swa_lr=0.02, anneal_epochs=0)])
def test_swalr_learning_rates_equal_torchs(kw, torch):
    assert _swalr(sg, **kw) == _swalr(torch, **kw)


def test_swalr_state_dict_round_trip_keeps_the_strategy():
    p = sg.nn.Parameter(sg.ones(1))
    opt = sg.optim.SGD([p], lr=0.1)
    sched = sg.optim.swa_utils.SWALR(opt, swa_lr=0.01, anneal_strategy="linear")
    sd = sched.state_dict()
    assert "anneal_func" not in sd and "optimizer" not in sd
    other = sg.optim.swa_utils.SWALR(sg.optim.SGD([p], lr=0.1), swa_lr=0.01)
    other.load_state_dict(sd)
    assert other.anneal_func is other._linear_anneal


ERRORS = [
    lambda lib: lib.optim.swa_utils.get_ema_avg_fn(1.5),
    lambda lib: lib.optim.swa_utils.get_ema_multi_avg_fn(-0.1),
    lambda lib: lib.optim.swa_utils.SWALR(
        lib.optim.SGD([lib.nn.Parameter(lib.ones(1))], lr=0.1), swa_lr=0.1,
        anneal_strategy="exp"),
    lambda lib: lib.optim.swa_utils.SWALR(
        lib.optim.SGD([lib.nn.Parameter(lib.ones(1))], lr=0.1), swa_lr=0.1, anneal_epochs=-1),
    lambda lib: lib.optim.swa_utils.SWALR(
        lib.optim.SGD([lib.nn.Parameter(lib.ones(1))], lr=0.1), swa_lr=[0.1, 0.2]),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors_are_worded_as_torchs(i, torch):
    msgs = []
    for lib in (sg, torch):
        with pytest.raises(ValueError) as err:
            ERRORS[i](lib)
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1]
