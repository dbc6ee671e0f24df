"""sg.compile's optimizer update: one loop call per (param group, dtype) over all its
parameters (fuse.UPDATE_KERNELS' sgd_group / adam_group), bit for bit eager's update.

The step's gradients are exact (each parameter's is ``x * w``: one rounding, the same in
both), so the parameters and the optimizer state after each step must have the very bits
eager's ``optimizer.step()`` gives, not merely be close.
"""

from __future__ import annotations

import copy
import re
import warnings

import numpy as np
import pytest

import symgrad as sg
from symgrad import nn

SHAPES = [(3, 4), (5,), (), (1,), (2, 1, 3)]


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cc"))


def _setup(make_opt, shapes=SHAPES, dtypes=None, unused=False, groups=None):
    """(params, weights, optimizer) and an identical eager copy. ``unused``: one more
    parameter the loss never reads (no gradient: the update skips it)."""
    sg.manual_seed(0)
    dtypes = dtypes or [sg.float32] * len(shapes)
    ps = [nn.Parameter(sg.randn(*s, dtype=d)) for s, d in zip(shapes, dtypes)]
    ws = [sg.randn(*s, dtype=d) for s, d in zip(shapes, dtypes)]
    extra = [nn.Parameter(sg.randn(4))] if unused else []

    def opt_for(params):
        if groups is None:
            return make_opt(params)
        return make_opt([{"params": [params[i] for i in idx], **kw} for idx, kw in groups])

    ps_e = copy.deepcopy(ps + extra)
    return (ps + extra, ws, opt_for(ps + extra)), (ps_e, ws, opt_for(ps_e))


def _fn(params, ws, opt):
    n = len(ws)

    def step(x):
        opt.zero_grad()
        loss = None
        for p, w in zip(params[:n], ws):
            term = (p * w).sum()
            term = term if term.dtype == sg.float32 else term.float()
            loss = term if loss is None else loss + term
        loss = loss * x
        loss.backward()
        opt.step()
        return loss

    return step


def _bits(t):
    return t.detach().numpy().tobytes()


def _same(compiled, eager):
    (ps, _, opt), (ps_e, _, opt_e) = compiled, eager
    for i, (p, q) in enumerate(zip(ps, ps_e)):
        assert p.dtype == q.dtype and _bits(p) == _bits(q), f"parameter {i}"
        assert (p.grad is None) == (q.grad is None)
        if q.grad is not None:
            assert _bits(p.grad) == _bits(q.grad), f"gradient {i}"
        st, st_e = opt.state.get(p, {}), opt_e.state.get(q, {})
        assert st.keys() == st_e.keys(), i
        for key, b in st_e.items():
            a = st[key]
            assert a.dtype == b.dtype and _bits(a) == _bits(b), f"{key} of parameter {i}"


def _run(compiled, eager, steps=4, between=None):
    step, step_e = sg.compile(_fn(*compiled)), _fn(*eager)
    for i in range(steps):
        x = sg.tensor(1.5 - 0.25 * i)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback to eager
            step(x)
        step_e(x)
        _same(compiled, eager)
        if between is not None:
            between(i)
    return step


def _calls(src: str, name: str) -> int:
    return len(re.findall(rf"\b{name}\(", src))


OPTS = {
    "sgd": lambda ps: sg.optim.SGD(ps, lr=0.1),
    "sgd-wd": lambda ps: sg.optim.SGD(ps, lr=0.1, weight_decay=0.01),
    "sgd-momentum": lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd-momentum-wd": lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda ps: sg.optim.Adam(ps, lr=1e-2),
    "adam-wd": lambda ps: sg.optim.Adam(ps, lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1),
    "adamw": lambda ps: sg.optim.AdamW(ps, lr=3e-2, weight_decay=0.1),
}


@pytest.mark.parametrize("name", list(OPTS))
def test_one_call_per_group_bitwise_eager(name):
    compiled, eager = _setup(OPTS[name], unused=True)
    step = _run(compiled, eager)
    src = step.source()
    kind = name.split("-")[0].replace("adamw", "adam")
    assert _calls(src, f"{kind}_group") == 1, src
    assert _calls(src, f"{kind}_update") == 0
    # the parameter without a gradient: not updated, no state made
    assert _bits(compiled[0][-1]) == _bits(eager[0][-1]) and compiled[0][-1] not in \
        compiled[2].state


def test_param_groups_and_dtypes_one_call_each():
    """Two groups (their own lr and weight decay), the first with a float64 parameter: one
    call per (group, dtype)."""
    groups = [([0, 1, 2], {"lr": 1e-2}), ([3, 4], {"lr": 5e-2, "weight_decay": 0.2})]
    dtypes = [sg.float32, sg.float64, sg.float32, sg.float32, sg.float32]
    compiled, eager = _setup(lambda g: sg.optim.AdamW(g), dtypes=dtypes, groups=groups)
    src = _run(compiled, eager).source()
    assert _calls(src, "adam_group") == 3, src
    assert _calls(src, "adam_update") == 0


def test_step_counts_that_differ_between_parameters():
    """Adam's bias corrections come from each parameter's own step count: counts that
    differ when the step is compiled (some parameters stepped more often eagerly), and a
    count changed in place between compiled calls (as a loaded state would)."""
    compiled, eager = _setup(lambda ps: sg.optim.Adam(ps, lr=1e-2, betas=(0.9, 0.99)))
    for ps, ws, opt in (compiled, eager):
        for k in range(4):  # all parameters once, the first two 3 times more
            opt.zero_grad()
            sum(((p * w).sum() for p, w in zip(ps[:2 if k else 5], ws)), sg.tensor(0.)
                ).backward()
            opt.step()

    def bump(i):
        if i == 1:
            for ps, _, opt in (compiled, eager):
                opt.state[ps[2]]["step"].fill_(1000.0)
                opt.state[ps[3]]["step"].fill_(3e6)

    steps = [float(compiled[2].state[p]["step"]) for p in compiled[0]]
    assert steps == [4.0, 4.0, 1.0, 1.0, 1.0]
    step = _run(compiled, eager, steps=4, between=bump)
    assert [float(compiled[2].state[p]["step"]) for p in compiled[0]] == \
        [8.0, 8.0, 1002.0, 3e6 + 2, 5.0]
    assert step.stats["traces"] == 1 and _calls(step.source(), "adam_group") == 1


def test_step_count_of_another_dtype_takes_the_per_parameter_update():
    """A float64 step count (a loaded state) cannot go through adam_group's float32 read:
    the step is traced again and that parameter is updated on its own, still as eager."""
    compiled, eager = _setup(lambda ps: sg.optim.Adam(ps, lr=1e-2))

    def swap(i):
        if i == 1:
            for ps, _, opt in (compiled, eager):
                opt.state[ps[1]]["step"] = sg.tensor(2.0, dtype=sg.float64)

    step = _run(compiled, eager, steps=4, between=swap)
    assert step.stats["traces"] == 2
    src = step.source()  # the latest code (the first was dropped)
    assert _calls(src, "adam_group") == 1 and _calls(src, "adam_update") == 1


def test_betas_that_are_not_python_numbers_take_the_per_parameter_update():
    """NumPy betas: the group loop computes the bias corrections from Python floats, so a
    step traced with them keeps its per-parameter code, and changing them to Python floats
    traces again into the group loop (the flag ``float_betas``), which is then eager's."""
    shapes = [s for s in SHAPES if s]  # eager's NumPy update fails on a 0-d parameter
    (ps, ws, opt), _ = _setup(lambda ps: sg.optim.Adam(ps, lr=1e-2,
                                                       betas=(np.float64(0.9), 0.999)),
                              shapes=shapes)
    step = sg.compile(_fn(ps, ws, opt))
    for _ in range(2):
        step(sg.tensor(1.0))
    first = step.source()
    opt.param_groups[0]["betas"] = (0.9, 0.999)
    ps_e = copy.deepcopy(ps)
    eager = (ps_e, ws, sg.optim.Adam(ps_e, lr=1e-2))
    eager[2].load_state_dict(opt.state_dict())
    step_e = _fn(*eager)
    for i in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            step(sg.tensor(1.0 + i))
        step_e(sg.tensor(1.0 + i))
        _same((ps, ws, opt), eager)
    latest = step.source()
    assert step.stats["traces"] == 2
    assert _calls(first, "adam_update") == len(shapes) and _calls(first, "adam_group") == 0
    assert _calls(latest, "adam_group") == 1 and _calls(latest, "adam_update") == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bias_corrections_in_the_loop_are_pythons(dtype):
    """adam_group computes ``dt(-(lr / (1 - beta1 ** t)))`` and ``dt((1 - beta2 ** t) **
    0.5)`` per parameter in the loop: the same bits as Python's (eager's) for step counts
    1..10^6 (every one for the default betas, a spread for others). float64 parameters see
    the float64 values unrounded: libm's pow(x, 0.5) is not sqrt(x) for ~0.1% of x, so this
    fails if the loop's pow became a sqrt."""
    from symgrad.compile.fuse import loops

    mod = loops()
    n = 1_000_000
    dt = dtype
    for lr, b1, b2, every in ((1e-3, 0.9, 0.999, 1), (3e-4, 0.9, 0.95, 101),
                              (0.1, 0.8, 0.9999, 101), (1e-2, 0.5, 0.99, 101)):
        counts = np.arange(1, n + 1, every, dtype=np.float32)
        k = counts.size
        # one element per "parameter" (g = 0, m = 1, v = 1, eps = 0, no decay): the update
        # writes p = p + (m * neg_step) / (sqrt(v) / bc2 + eps) = 0 + neg_step / (1 / bc2)
        p, g, m, v = np.zeros(k, dt), np.zeros(k, dt), np.ones(k, dt), np.ones(k, dt)
        steps = counts - 1  # the loop increments them first
        # the table runtime.update_table makes, one row per element (each its own
        # "parameter" of size 1): data addresses, then the size
        table = np.empty((k, 6), np.int64)
        for j, a in enumerate((p, g, m, v, steps)):
            table[:, j] = a.ctypes.data + a.itemsize * np.arange(k)
        table[:, 5] = 1
        mod.adam_group(table, dt(0), dt(1), dt(0), lr, b1, b2, 0.5, dt(0), dt(0), 0, dt(1))
        assert np.array_equal(steps, counts)
        ts = counts.tolist()  # Python's float arithmetic, then rounded to dt as dt(x)
        neg = np.array([-(lr / (1 - b1 ** t)) for t in ts]).astype(dt)
        bc2 = np.array([(1 - b2 ** t) ** 0.5 for t in ts]).astype(dt)
        assert all(dt(-(lr / (1 - b1 ** t))) == x for t, x in zip(ts[:1000], neg))
        want = dt(0) + (dt(1) * neg) / (np.sqrt(dt(1)) / bc2 + dt(0))
        assert p.tobytes() == want.tobytes(), (lr, b1, b2)
