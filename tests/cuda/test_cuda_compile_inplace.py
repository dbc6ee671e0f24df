"""sg.compile of steps with in-place ops on 'cuda' tensors, under the simulator.

The tracer's rewrite (an in-place op recorded as its out-of-place op, the tensor rebound
to the new value) gives the CUDA plan (symgrad/compile/cuda_step.py) ordinary ops, so the
same forms compile there: each equals eager on 'cuda' after every step (returned values,
parameters, .grad, optimizer state) without a warning, and a compiled call makes no host
transfer; what falls back on the CPU falls back here with the same reason."""

from __future__ import annotations

import copy
import warnings

import pytest
from _count import Counter
from _tolerance import assert_close
from test_compile_inplace import SIZES, Double, Net  # the CPU test's model and Function

import symgrad as sg
from symgrad.nn import functional as F

STEPS = 3


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cc"))


def _view(m, h, x):
    t = x * 1
    t[:, :1].mul_(2.0)
    return h + t.sum(1, keepdim=True)


FORMS = {
    "relu_": lambda m, h, x: h.relu_(),
    "add_ a parameter, mul_": lambda m, h, x: h.add_(m.shift).mul_(0.5),
    "clamp_": lambda m, h, x: h.clamp_(-0.5, 0.5),
    "sigmoid_": lambda m, h, x: h.sigmoid_(),
    "masked_fill_": lambda m, h, x: h.masked_fill_(x.sum(1, keepdim=True) > 0, 0.0),
    "copy_": lambda m, h, x: (h * 1).copy_(h * 3.0),
    "on a tensor without grad": lambda m, h, x: h * (x * 1).add_(1.0).sum(1, keepdim=True),
    "mark_dirty": lambda m, h, x: Double.apply(h),
}
OPTIMIZERS = {"sgd": lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-2),
              "adam": lambda ps: sg.optim.Adam(ps, lr=1e-2)}


def _step_fn(model, opt, body):
    def step(x, y):
        opt.zero_grad()
        h = body(model, model.fc1(x), x)
        loss = F.mse_loss(model.fc2(h), y)
        loss.backward()
        opt.step()
        return loss, h

    return step


def _pair(body, opt):
    sg.manual_seed(0)
    model = Net().to("cuda")
    model_e = copy.deepcopy(model)
    o, o_e = OPTIMIZERS[opt](model.parameters()), OPTIMIZERS[opt](model_e.parameters())
    return (sg.compile(_step_fn(model, o, body)), _step_fn(model_e, o_e, body),
            (model, o), (model_e, o_e))


def _data(i):
    sg.manual_seed(100 + i)
    return sg.randn(4, SIZES[0]).to("cuda"), sg.randn(4, SIZES[-1]).to("cuda")


def _terms(steps):
    return steps * (sum(SIZES) + 16)


def _assert_same(compiled, eager, steps):
    (model, opt), (model_e, opt_e) = compiled, eager
    terms = _terms(steps)
    for p, q in zip(model.parameters(), model_e.parameters()):
        assert p.device.type == "cuda"
        assert_close(p.detach().cpu(), q.detach().cpu(), terms=terms)
        assert (p.grad is None) == (q.grad is None)  # shift is unused by some forms
        if q.grad is not None:
            assert_close(p.grad.cpu(), q.grad.cpu(), terms=terms)
        st, st_e = opt.state.get(p, {}), opt_e.state.get(q, {})
        assert st.keys() == st_e.keys()
        for key, b in st_e.items():
            assert_close(st[key].cpu(), b.cpu(), terms=terms)


@pytest.mark.parametrize("form,opt", [(f, "adam") for f in FORMS]
                         + [("relu_", "sgd"), ("mark_dirty", "sgd")])
def test_cuda_inplace_form_compiles_and_equals_eager(form, opt):
    step, eager, c, e = _pair(FORMS[form], opt)
    for i in range(STEPS):
        x, y = _data(i)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = step(x, y)
        want = eager(x, y)
        for a, b in zip(got, want):
            assert a.device.type == "cuda"
            assert_close(a.cpu(), b.detach().cpu(), terms=_terms(i + 1))
        _assert_same(c, e, i + 1)
    assert step.stats["traces"] == 1 and step.stats["fallbacks"] == []
    assert "cuda_step" in step.source()


def test_cuda_inplace_step_hot_path_stays_on_the_device():
    step, _, _, _ = _pair(FORMS["add_ a parameter, mul_"], "adam")
    x, y = _data(0)
    step(x, y)
    step(x, y)
    with Counter() as cnt:
        step(x, y)
    assert cnt.transfers == 0 and cnt.launches > 0


def test_cuda_inplace_on_a_view_falls_back_and_equals_eager():
    step, eager, c, e = _pair(_view, "sgd")
    for i in range(2):
        x, y = _data(i)
        if i == 0:
            with pytest.warns(UserWarning, match="in-place op mul_ on a view"):
                got = step(x, y)
        else:
            got = step(x, y)
        want = eager(x, y)
        assert_close(got[0].cpu(), want[0].detach().cpu(), terms=_terms(i + 1))
        _assert_same(c, e, i + 1)
    assert not step._entries()
