"""sg.compile: Python constants the trace read are guarded (a change retraces instead of
running the stale generated code), and the disk cache of generated modules is bounded."""

from __future__ import annotations

import copy
import os
import sys
import warnings

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad import nn
from symgrad.nn import functional as F

SCALE = 2.0  # read by Scaled.forward (a global of another function than fn)
OFFSET = 0.25  # read by fn itself


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path / "cc"))


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.scale = 0.5  # a Python float attribute used in forward

    def forward(self, x):
        scale = self.scale if self.training else 1.0  # `training` read: guarded too
        return self.lin(x).tanh() * scale * SCALE


def _pair():
    sg.manual_seed(0)
    model = Scaled()
    model_e = copy.deepcopy(model)

    def make(m, o):
        def step(x, y):
            o.zero_grad()
            loss = F.mse_loss(m(x) + OFFSET, y)
            loss.backward()
            o.step()
            return loss

        return step

    opt, opt_e = sg.optim.SGD(model.parameters(), lr=0.1), \
        sg.optim.SGD(model_e.parameters(), lr=0.1)
    return sg.compile(make(model, opt)), make(model_e, opt_e), (model, model_e)


def _check(step, eager, models, data, calls):
    x, y = data
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = step(x, y)
        calls[0] += 1
        assert_close(got, eager(x, y), terms=calls[0] * 24)
        for p, q in zip(*(m.parameters() for m in models)):
            assert_close(p, q, terms=calls[0] * 24)
            assert_close(p.grad, q.grad, terms=calls[0] * 24)


def test_changed_module_attribute_and_globals_retrace(monkeypatch):
    step, eager, models = _pair()
    sg.manual_seed(1)
    data = sg.randn(6, 4), sg.randn(6, 3)
    calls = [0]
    _check(step, eager, models, data, calls)
    assert step.stats["traces"] == 1
    for m in models:
        m.scale = 1.5  # baked into the generated code: must not stay 0.5
    _check(step, eager, models, data, calls)
    assert step.stats["traces"] == 2
    monkeypatch.setattr(sys.modules[__name__], "SCALE", -1.0)  # a global of Scaled.forward
    _check(step, eager, models, data, calls)
    assert step.stats["traces"] == 3
    monkeypatch.setattr(sys.modules[__name__], "OFFSET", 3.0)  # a global of fn
    _check(step, eager, models, data, calls)
    assert step.stats["traces"] == 4
    for m in models:
        m.eval()  # `training` is an attribute like any other
    _check(step, eager, models, data, calls)
    assert step.stats["traces"] == 5


def test_a_changed_closure_variable_retraces():
    sg.manual_seed(0)
    w = sg.randn(5, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)

    def make(w):
        k = 0.5

        def step(x):
            w.grad = None
            loss = ((x * w).tanh() * k).sum()
            loss.backward()
            return loss

        def set_k(v):
            nonlocal k
            k = v

        return step, set_k

    (fn, set_k), (eager, set_k_e) = make(w), make(w_e)
    step = sg.compile(fn)
    x = sg.randn(5)
    for value in (0.5, 0.5, 3.0, 3.0):
        set_k(value)
        set_k_e(value)
        assert_close(step(x), eager(x), terms=16)
        assert_close(w.grad, w_e.grad, terms=16)
    assert step.stats["traces"] == 2


def test_a_constant_changing_every_call_stops_retracing_with_a_warning():
    step, eager, models = _pair()
    sg.manual_seed(1)
    x, y = sg.randn(6, 4), sg.randn(6, 3)
    warned = []
    for i in range(12):
        for m in models:
            m.scale = 0.1 * (i + 1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = step(x, y)
        warned += [str(w.message) for w in caught]
        assert_close(got, eager(x, y), terms=(i + 1) * 24)
    assert step.stats["traces"] == 9  # the first trace, then cache_size (8) retraces
    assert len(warned) == 1 and "retraced 9 times" in warned[0]
    assert "attribute of module Scaled changed" in warned[0]


def test_the_disk_cache_keeps_at_most_n_modules(tmp_path, monkeypatch):
    """Modules beyond SYMGRAD_COMPILE_CACHE_FILES are deleted oldest first with their
    records; modules this process imported stay (here the older ones are made to look
    like another process's by dropping them from sys.modules)."""
    from symgrad.compile import loader  # noqa: F401  (the submodule, for sys.modules)

    folder = tmp_path / "cc"
    sg.manual_seed(0)
    w = sg.randn(4, requires_grad=True)

    def fn(x):
        w.grad = None
        loss = ((x * w).tanh() * 2.0).sum()
        loss.backward()
        return loss

    step = sg.compile(fn, cache_size=16)
    for n in range(1, 6):  # five signatures: five modules
        step(sg.randn(n, 4))
    files = sorted(folder.glob("symgrad_step_*.py"))
    assert len(files) == 5
    for i, f in enumerate(sorted(files, key=lambda f: f.stat().st_mtime_ns)):
        os.utime(f, ns=(i * 10**9, i * 10**9))  # a definite writing order
        (folder / f"{f.stem}.proof.json").write_text("{}")
        sys.modules.pop(f.stem, None)
    order = [f.stem for f in sorted(files, key=lambda f: f.stat().st_mtime_ns)]
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE_FILES", "3")
    step(sg.randn(6, 4))  # a sixth module: the three oldest go
    left = {f.stem for f in folder.glob("symgrad_step_*.py")}
    assert len(left) == 3 and set(order[3:]) < left
    assert not any((folder / f"{s}.proof.json").exists() for s in order[:3])
    assert not [p for p in (folder / "__pycache__").glob("*") if p.name.split(".")[0]
                in order[:3]]
    x = sg.randn(2, 4)  # an evicted signature still runs from its loaded module
    assert_close(step(x), fn(x))
    assert step.stats["traces"] == 6


# -- values read out of containers and objects (issue 33, scope 4) -------------------------
FLAGS = {"fail": False}


def _apply(loss, opt):
    """A helper fn calls: reads a flag out of a global dict between backward and step."""
    loss.backward()
    if FLAGS["fail"]:
        raise RuntimeError("flagged: no update")
    opt.step()


def test_a_flag_read_from_a_dict_by_a_helper_is_guarded(monkeypatch):
    """Traced with the flag False; set True, the compiled step must raise as eager does
    before the update, not apply the update baked in by the trace."""
    monkeypatch.setitem(FLAGS, "fail", False)
    sg.manual_seed(0)
    w = sg.randn(5, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)

    def make(w, opt):
        def step(x):
            opt.zero_grad()
            loss = ((x * w).tanh() * 0.5).sum()
            _apply(loss, opt)
            return loss

        return step

    step = sg.compile(make(w, sg.optim.SGD([w], lr=0.1)))
    eager = make(w_e, sg.optim.SGD([w_e], lr=0.1))
    x = sg.randn(5)
    calls = 0
    for _ in range(2):
        calls += 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert_close(step(x), eager(x), terms=calls * 8)
        assert_close(w, w_e, terms=calls * 8)
    assert step.stats["traces"] == 1 and not step.stats["fallbacks"]
    FLAGS["fail"] = True
    before = w.detach().numpy().copy()
    with pytest.raises(RuntimeError, match="flagged"):
        eager(x)
    with pytest.raises(RuntimeError, match="flagged"):
        step(x)
    assert (w.detach().numpy() == before).all()  # no update applied
    assert_close(w, w_e, terms=calls * 8)
    assert_close(w.grad, w_e.grad, terms=calls * 8)  # backward ran, as in eager
    FLAGS["fail"] = False
    for _ in range(2):
        calls += 1
        assert_close(step(x), eager(x), terms=calls * 8)
        assert_close(w, w_e, terms=calls * 8)


class _Config:
    scale = 0.5  # a class attribute, read through an instance


CFG = _Config()
CFG.shift = 0.25  # an instance attribute
WEIGHTS = [1.0, 2.0]
OPTIONS = {"a": 1.0, "b": 3.0}


class _Configured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.cfg = {"gain": 2.0}  # a dict on a module, read in forward

    def forward(self, x):
        return self.lin(x).tanh() * self.cfg["gain"]


def test_values_read_from_objects_lists_and_dicts_retrace(monkeypatch):
    """A plain object's attribute (instance and class), a list element, a dict read with a
    key known only at run time (the dict is guarded whole) and a dict on a module: each
    change retraces and the step equals eager after it."""
    monkeypatch.setattr(sys.modules[__name__], "WEIGHTS", [1.0, 2.0])  # mutated below
    sg.manual_seed(0)
    model = _Configured()
    model_e = copy.deepcopy(model)

    def make(m, o):
        def step(x, y):
            o.zero_grad()
            key = "b"
            out = m(x) * _Config.scale * WEIGHTS[1] + CFG.shift * OPTIONS[key]
            loss = F.mse_loss(out, y)
            loss.backward()
            o.step()
            return loss

        return step

    step = sg.compile(make(model, sg.optim.SGD(model.parameters(), lr=0.1)))
    eager = make(model_e, sg.optim.SGD(model_e.parameters(), lr=0.1))
    sg.manual_seed(1)
    data = sg.randn(6, 4), sg.randn(6, 3)
    calls = [0]
    _check(step, eager, (model, model_e), data, calls)
    changes = [lambda: monkeypatch.setattr(_Config, "scale", 1.5),
               lambda: monkeypatch.setattr(CFG, "shift", -1.0),
               lambda: WEIGHTS.__setitem__(1, -3.0),  # the list changed in place
               lambda: monkeypatch.setitem(OPTIONS, "b", 0.5),
               lambda: [monkeypatch.setitem(m.cfg, "gain", 0.1) for m in (model, model_e)]]
    for k, change in enumerate(changes):
        change()
        _check(step, eager, (model, model_e), data, calls)
        assert step.stats["traces"] == k + 2, k


class _Slotted:
    __slots__ = ("gain",)

    def __init__(self) -> None:
        self.gain = 2.0


class _WithProperty:
    def __init__(self) -> None:
        self._shift = 0.5

    @property
    def shift(self) -> float:  # user code: a guard does not run it
        return self._shift


SLOTTED = _Slotted()
NP_CFG = {"scale": np.float32(0.5)}
PROP = _WithProperty()


def _tanh_step(w, read):
    def step(x):
        w.grad = None
        loss = ((x * w).tanh() * read()).sum()
        loss.backward()
        return loss

    return step


def test_slots_and_numpy_scalars_are_guarded_too():
    sg.manual_seed(0)
    w = sg.randn(5, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)

    def read():
        return SLOTTED.gain * float(NP_CFG["scale"])

    step, eager = sg.compile(_tanh_step(w, read)), _tanh_step(w_e, read)
    x = sg.randn(5)
    old = SLOTTED.gain, NP_CFG["scale"]
    try:
        for k, change in enumerate([lambda: setattr(SLOTTED, "gain", -1.0),
                                    lambda: NP_CFG.__setitem__("scale", np.float32(3.0))]):
            change()
            for _ in range(2):
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    assert_close(step(x), eager(x), terms=8)
                assert_close(w.grad, w_e.grad, terms=8)
            assert step.stats["traces"] == k + 1
    finally:
        SLOTTED.gain, NP_CFG["scale"] = old


def test_a_value_read_through_a_property_is_named_as_baked_in():
    sg.manual_seed(0)
    w = sg.randn(5, requires_grad=True)

    def read():
        return PROP.shift

    step = sg.compile(_tanh_step(w, read))
    x = sg.randn(5)
    with pytest.warns(UserWarning, match=r"baked into the compiled step.*PROP\.shift"):
        step(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        step(x)
