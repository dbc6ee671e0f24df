"""symgrad.optim.lr_scheduler against torch.optim.lr_scheduler: over 50 steps in torch's
order (``opt.step()`` then ``sched.step()``), every scheduler gives the same learning rates,
``last_epoch`` and (where it cycles them) momenta as torch. The schedules are float64
arithmetic on Python floats done in the same order, so they are compared exactly; the call
order raises no warning (warnings are errors here), and the wrong order warns as torch."""

from __future__ import annotations

import warnings

import pytest

import symgrad as sg


def _opt(lib, kind):
    p, q = lib.nn.Parameter(lib.ones(2)), lib.nn.Parameter(lib.ones(1))
    groups = [{"params": [p]}, {"params": [q], "lr": 0.3}]
    if kind == "adam":
        return lib.optim.Adam(groups, lr=0.1)
    if kind == "sgd":
        return lib.optim.SGD(groups, lr=0.1, momentum=0.9)
    return getattr(lib.optim, kind)(groups, lr=0.1)


def _sched(S, o, name):
    return {
        "StepLR": lambda: S.StepLR(o, 7, gamma=0.5),
        "StepLR_default": lambda: S.StepLR(o, step_size=10),
        "MultiStepLR": lambda: S.MultiStepLR(o, [3, 10, 10, 25], gamma=0.3),
        "ExponentialLR": lambda: S.ExponentialLR(o, 0.93),
        "CosineAnnealingLR": lambda: S.CosineAnnealingLR(o, 12, eta_min=0.001),
        "CosineAnnealingLR_default": lambda: S.CosineAnnealingLR(o, T_max=50),
        "LambdaLR": lambda: S.LambdaLR(o, [lambda e: 0.95 ** e, lambda e: 1 / (e + 1)]),
        "LambdaLR_one": lambda: S.LambdaLR(o, lambda e: min(1.0, (e + 1) / 10)),
        "OneCycleLR": lambda: S.OneCycleLR(o, max_lr=[1.0, 2.0], total_steps=51),
        "OneCycleLR_three_phase": lambda: S.OneCycleLR(o, max_lr=1.0, epochs=5,
                                                       steps_per_epoch=11, three_phase=True,
                                                       anneal_strategy="linear"),
        "LinearLR": lambda: S.LinearLR(o, start_factor=0.25, total_iters=8),
        "ConstantLR": lambda: S.ConstantLR(o, factor=0.5, total_iters=4),
        "PolynomialLR": lambda: S.PolynomialLR(o, total_iters=30, power=2.0),
        "MultiplicativeLR": lambda: S.MultiplicativeLR(o, lambda e: 0.97),
        "CosineAnnealingWarmRestarts": lambda: S.CosineAnnealingWarmRestarts(
            o, T_0=5, T_mult=2, eta_min=0.01),
        "CyclicLR": lambda: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=4,
                                       mode="triangular2"),
        "SequentialLR": lambda: S.SequentialLR(
            o, [S.LinearLR(o, 0.1, total_iters=5), S.ExponentialLR(o, 0.9)], milestones=[5]),
        "ChainedScheduler": lambda: S.ChainedScheduler(
            [S.ConstantLR(o, 0.5, total_iters=3), S.ExponentialLR(o, 0.9)]),
    }[name]()


NAMES = ["StepLR", "StepLR_default", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
         "CosineAnnealingLR_default", "LambdaLR", "LambdaLR_one", "OneCycleLR",
         "OneCycleLR_three_phase", "LinearLR", "ConstantLR", "PolynomialLR",
         "MultiplicativeLR", "CosineAnnealingWarmRestarts", "CyclicLR", "SequentialLR",
         "ChainedScheduler"]


def _run(lib, name, kind, steps=50):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's order warns nothing
        o = _opt(lib, kind)
        s = _sched(lib.optim.lr_scheduler, o, name)
        seq = [(s.get_last_lr(), getattr(s, "last_epoch", None))]
        for _ in range(steps):
            o.step()
            s.step()
            g = o.param_groups[0]
            seq.append((s.get_last_lr(), getattr(s, "last_epoch", None), g.get("momentum"),
                        g.get("betas"), [gr["lr"] for gr in o.param_groups]))
    return seq


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("name", NAMES)
def test_50_steps_of_learning_rates_equal_torchs(name, kind, torch):
    ours, theirs = _run(sg, name, kind), _run(torch, name, kind)
    assert ours == theirs  # the same float64 operations in the same order: bit for bit


# the other optimizers under the schedulers that set lr, and (those with betas) OneCycleLR,
# which cycles beta1 as it cycles SGD's momentum
OTHER_OPTIMIZERS = ["Adadelta", "Adamax", "NAdam", "RAdam", "ASGD", "Rprop", "Adafactor",
                    "RMSprop", "Adagrad", "AdamW"]


@pytest.mark.parametrize("name", ["StepLR", "OneCycleLR", "CosineAnnealingWarmRestarts"])
@pytest.mark.parametrize("kind", OTHER_OPTIMIZERS)
def test_other_optimizers_follow_the_schedules_as_torchs(name, kind, torch):
    if name == "OneCycleLR" and kind in ("Adadelta", "ASGD", "Adagrad", "Rprop", "Adafactor"):
        for lib in (sg, torch):  # nothing to cycle: refused as torch refuses it
            with pytest.raises(ValueError, match="optimizer must support momentum or beta1"):
                _run(lib, name, kind)
        return
    ours, theirs = _run(sg, name, kind), _run(torch, name, kind)
    assert ours == theirs


def _plateau(lib, **kw):
    o = _opt(lib, "sgd")
    s = lib.optim.lr_scheduler.ReduceLROnPlateau(o, **kw)
    losses = [1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.8, 0.8, 0.8, 0.8, 0.8, 0.79999, 0.8,
              0.8, 0.8, 0.8] * 3
    out = []
    for loss in losses:
        o.step()
        s.step(lib.tensor(loss) if kw.get("mode") == "max" else loss)
        out.append((s.get_last_lr(), s.last_epoch, s.num_bad_epochs, s.best,
                    s.cooldown_counter))
    return out


@pytest.mark.parametrize("kw", [dict(), dict(patience=2, factor=0.5, cooldown=1, min_lr=0.01),
                                dict(mode="max", threshold_mode="abs", threshold=0.01,
                                     patience=1, min_lr=[0.0, 0.2]),
                                dict(threshold=0.1, patience=0, eps=0.05)])
def test_reduce_lr_on_plateau_matches_torch(kw, torch):
    assert _plateau(sg, **kw) == _plateau(torch, **kw)


def test_state_dict_and_resuming_match_torch(torch):
    def run(lib):
        o = _opt(lib, "sgd")
        s = lib.optim.lr_scheduler.StepLR(o, 3, gamma=0.5)
        for _ in range(4):
            o.step()
            s.step()
        sd = s.state_dict()
        o2 = _opt(lib, "sgd")
        o2.load_state_dict(o.state_dict())
        s2 = lib.optim.lr_scheduler.StepLR(o2, 99)
        s2.load_state_dict(sd)
        for _ in range(4):
            o2.step()
            s2.step()
        return sorted(sd), sd["last_epoch"], s2.get_last_lr(), s2.last_epoch, \
            [g["initial_lr"] for g in o2.param_groups]

    assert run(sg) == run(torch)


def _warning_texts(lib):
    out = []
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        o = _opt(lib, "sgd")
        s = lib.optim.lr_scheduler.StepLR(o, 2)
        s.step()  # before opt.step()
        s.get_lr()  # outside step()
        s.step(5)  # the deprecated epoch argument (closed form)
        out.append((s.get_last_lr(), s.last_epoch))
    out.append([str(x.message)[:70] for x in w])
    return out


def test_wrong_call_order_and_deprecated_uses_warn_as_torch(torch):
    assert _warning_texts(sg) == _warning_texts(torch)


def test_errors_match_torch(torch):
    def run(lib):
        S = lib.optim.lr_scheduler
        o = _opt(lib, "sgd")
        msgs = []
        for fn in (lambda: S.StepLR("not an optimizer", 3),
                   lambda: S.StepLR(o, 3, last_epoch=4),
                   lambda: S.LambdaLR(o, [lambda e: 1.0]),
                   lambda: S.OneCycleLR(o, max_lr=1.0),
                   lambda: S.OneCycleLR(o, max_lr=1.0, total_steps=0),
                   lambda: S.ReduceLROnPlateau(o, factor=1.0),
                   lambda: S.ReduceLROnPlateau(o, mode="avg"),
                   lambda: S.LinearLR(o, start_factor=0)):
            try:
                fn()
                msgs.append("no error")
            except Exception as e:  # noqa: BLE001  (type and text are compared)
                msgs.append(f"{type(e).__name__}: {e}")
        o2 = _opt(lib, "sgd")
        s = S.OneCycleLR(o2, max_lr=1.0, total_steps=2)
        o2.step()
        s.step()
        o2.step()
        s.step()
        try:
            s.step()
        except ValueError as e:
            msgs.append(str(e))
        return msgs

    assert run(sg) == run(torch)
