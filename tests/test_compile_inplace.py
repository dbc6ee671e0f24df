"""sg.compile of steps with in-place ops: compiled where the rewrite is exact, else eager.

The tracer records ``h.relu_()``, ``h.add_(b)`` ... on a tensor fn computed (no view, none
alive) as the op out of place and rebinds ``h`` to the new value, so the generated code,
its fusion and its backward see an ordinary op; ``ctx.mark_dirty`` in a custom Function
the same way. Each compiled form runs several steps of an MLP against the same step run
eagerly from a deep copy (SGD with momentum and weight decay, and Adam): returned values,
parameters, ``.grad`` and optimizer state must agree within float rounding (bounds from
tests/_tolerance.py, through test_compile's helpers), and no call may warn (a fallback
warns). The cases where the rewrite would be wrong fall back with their reason and still
equal eager; eager's errors are the compiled step's errors.
"""

from __future__ import annotations

import copy
import os
import warnings

import numpy as np
import pytest
from _tolerance import assert_close, magnitude
from test_compile import _assert_same_state, _terms

import symgrad as sg
from symgrad import nn
from symgrad.autograd import Function
from symgrad.nn import functional as F

STEPS = 4
SIZES = (4, 16, 3)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Generated modules go to a temp dir, not the user's ~/.cache."""
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cc"))


class Net(nn.Module):
    """Linear -> (the in-place form under test) -> Linear, with a parameter ``shift`` the
    forms may use as an operand that requires grad."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(SIZES[0], SIZES[1])
        self.fc2 = nn.Linear(SIZES[1], SIZES[2])
        self.shift = nn.Parameter(sg.randn(SIZES[1]) * 0.1)


class Double(Function):
    """2 x, written into its input (``ctx.mark_dirty``), as torch's in-place Functions do."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(2.0)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


class ScaleSaved(Function):
    """x * k written into x, which it saves as its output (saved after mark_dirty)."""

    @staticmethod
    def forward(ctx, x, k):
        x.mul_(k).tanh_()
        ctx.mark_dirty(x)
        ctx.save_for_backward(x)
        ctx.k = k
        return x

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y * y) * ctx.k, None


class DoubleUnmarked(Function):
    """Changes its input in place without saying so (no mark_dirty)."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(2.0)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


_RELU = nn.ReLU(inplace=True)


def _mul_then_iadd(m, h, x, y):
    h.mul_(2)
    h += 1.0
    return h


#: in-place forms that compile: body(model, h, x, y) -> the tensor fn goes on with
FORMS = {
    "relu_": lambda m, h, x, y: h.relu_(),
    "nn.ReLU(inplace=True)": lambda m, h, x, y: _RELU(h),
    "F.relu(inplace=True)": lambda m, h, x, y: F.relu(h, inplace=True),
    "sg.relu_": lambda m, h, x, y: sg.relu_(h),
    "add_ a parameter": lambda m, h, x, y: h.add_(m.shift),
    "add_ alpha": lambda m, h, x, y: h.add_(x.sum(1, keepdim=True), alpha=0.5),
    "mul_ then +=": _mul_then_iadd,
    "sub_ alpha": lambda m, h, x, y: h.sub_(h * 0.5, alpha=2),
    "div_": lambda m, h, x, y: h.div_(m.shift.abs() + 1.0),
    "clamp_": lambda m, h, x, y: h.clamp_(-0.5, 0.5),
    "tanh_": lambda m, h, x, y: h.tanh_(),
    "sigmoid_": lambda m, h, x, y: h.sigmoid_(),
    "exp_": lambda m, h, x, y: h.mul_(0.1).exp_(),
    "masked_fill_": lambda m, h, x, y: h.masked_fill_(x.sum(1, keepdim=True) > 0, 0.0),
    "zero_ and fill_": lambda m, h, x, y: h * (h * 1).zero_().add_(0.5) + (h * 1).fill_(0.25),
    "copy_": lambda m, h, x, y: (h * 1).copy_(h * 3.0),
    "on a tensor without grad": lambda m, h, x, y: h * (x * 1).add_(1.0).mul_(0.5).sum(
        1, keepdim=True),
    "mark_dirty": lambda m, h, x, y: Double.apply(h),
    "mark_dirty, saved output": lambda m, h, x, y: ScaleSaved.apply(h, 0.5),
}

OPTIMIZERS = {
    "sgd": lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: sg.optim.Adam(ps, lr=1e-2),
}


def _step_fn(model, opt, body):
    def step(x, y):
        opt.zero_grad()
        h = body(model, model.fc1(x), x, y)
        loss = F.mse_loss(model.fc2(h), y)
        loss.backward()
        opt.step()
        return loss, h

    return step


def _pair(body, opt="adam"):
    sg.manual_seed(0)
    model = Net()
    model_e = copy.deepcopy(model)
    o, o_e = OPTIMIZERS[opt](model.parameters()), OPTIMIZERS[opt](model_e.parameters())
    return (sg.compile(_step_fn(model, o, body)), _step_fn(model_e, o_e, body),
            (model, o), (model_e, o_e))


def _data(i=0, batch=8):
    sg.manual_seed(10 + i)
    return sg.randn(batch, SIZES[0]), sg.randn(batch, SIZES[-1])


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("form", list(FORMS))
def test_inplace_form_compiles_and_equals_eager(form, opt):
    step, eager, c, e = _pair(FORMS[form], opt)
    for i in range(STEPS):
        x, y = _data(i)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a fallback would warn
            got = step(x, y)
        want = eager(x, y)
        terms = _terms(SIZES, i + 1)
        assert_close(got[0], want[0], terms=terms)
        assert_close(got[1], want[1], terms=terms)  # the tensor changed in place
        _assert_same_state(c, e, i + 1, SIZES)
    assert step.stats["traces"] == 1 and step.stats["fallbacks"] == []
    assert len(step._entries()) == 1


def test_inplace_ops_are_ordinary_ops_in_the_generated_code():
    """mul_ then relu_ on the first layer's output: one fused elementwise run, no write
    into an array the step reads elsewhere."""
    step, _, _, _ = _pair(lambda m, h, x, y: h.mul_(2.0).relu_())
    step(*_data())
    step(*_data(1))
    src = step.source()
    assert "fused_0" in src
    assert step.stats["fallbacks"] == []


@pytest.mark.parametrize("form", ["relu_", "add_ a parameter", "masked_fill_", "mark_dirty",
                                  "mark_dirty, saved output"])
def test_verify_replays_a_step_with_inplace_ops(form):
    """verify()'s replay applies the recorded out-of-place ops (and the Function, which
    changes its input again) and checks the generated code against that graph."""
    step, _, (model, _), _ = _pair(FORMS[form])
    step(*_data())
    before = [p.detach().numpy().copy() for p in model.parameters()]
    report = step.verify()
    assert report.ok, report
    for p, b in zip(model.parameters(), before):  # verify has no side effect
        assert (p.detach().numpy() == b).all()


# -- eager's errors are the compiled step's ---------------------------------------------------
def _leaf_inplace(m, h, x, y):
    m.fc1.weight.mul_(2.0)
    return h


def _saved_then_changed(m, h, x, y):
    h = h.exp()  # saves its output
    h.mul_(0.5)
    return h


@pytest.mark.parametrize("body,match", [
    (_leaf_inplace, "a leaf Variable that requires grad is being used in an in-place"),
    (_saved_then_changed, "modified by an inplace operation"),
    (lambda m, h, x, y: h + Double.apply(m.shift), "a leaf Variable that requires grad has "
                                                "been used in an in-place operation"),
])
def test_eager_errors_are_raised_by_the_compiled_step(body, match):
    step, eager, c, e = _pair(body)
    x, y = _data()
    for _ in range(2):  # the trace raised: nothing is cached, the next call raises again
        with pytest.raises(RuntimeError, match=match):
            step(x, y)
        with pytest.raises(RuntimeError, match=match):
            eager(x, y)
    assert not step._entries() and step.stats["fallbacks"] == []
    _assert_same_state(c, e, 1, SIZES)


# -- what falls back, with its reason ---------------------------------------------------------
def _view_of_intermediate(m, h, x, y):
    t = x * 1
    t[:, :1].mul_(2.0)
    return h + t.sum(1, keepdim=True)


def _has_views(m, h, x, y):
    v = h.view(-1)
    h.relu_()
    return h + v.view(h.shape)


def _argument(m, h, x, y):
    y.mul_(1.5)  # the target, before mse_loss reads it
    return h


def _parameter_no_grad(m, h, x, y):
    with sg.no_grad():
        m.shift.mul_(0.9)
    return h + m.shift


def _buffer(m, h, x, y):
    m.count.add_(1.0)
    return h + m.count


def _other_dtype(m, h, x, y):
    return h.add_(m.offset64)


def _no_grad_on_grad(m, h, x, y):
    with sg.no_grad():
        h.mul_(2.0)
    return h


def _random(m, h, x, y):
    return h * (x * 1).uniform_().sum(1, keepdim=True)


def _setitem(m, h, x, y):
    t = x * 1
    t[0] = 0.0
    return h + t.sum(1, keepdim=True)


def _init(m, h, x, y):
    nn.init.constant_(m.shift, 0.1)
    return h + m.shift


def _detach_(m, h, x, y):
    t = h * 1
    t.detach_()
    return h + t


def _detached_alias(m, h, x, y):
    d = h.detach()
    h.relu_()
    return h + d


FALLBACKS = {
    "view": (_view_of_intermediate, "in-place op mul_ on a view"),
    "tensor with views": (_has_views, "in-place op relu_ on a view or on a tensor that has "
                                      "views"),
    "detached alias": (_detached_alias, "on a view or on a tensor that has views"),
    "argument": (_argument, "in-place op mul_ on argument 1 of fn"),
    "parameter": (_parameter_no_grad, "in-place op mul_ on a parameter"),
    "buffer": (_buffer, "in-place op add_ on a tensor from outside fn"),
    "dtype": (_other_dtype, "eager casts it into float32"),
    "no_grad": (_no_grad_on_grad, "in-place op mul_ under no_grad"),
    "random": (_random, "in-place op uniform_ draws random numbers"),
    "setitem": (_setitem, r"x\[index\] = value"),
    "nn.init": (_init, "nn.init"),
    "detach_": (_detach_, r"detach_\(\)"),
    "no mark_dirty": (lambda m, h, x, y: DoubleUnmarked.apply(h), "without ctx.mark_dirty"),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_what_the_rewrite_cannot_do_falls_back_and_equals_eager(case):
    body, match = FALLBACKS[case]
    step, eager, c, e = _pair(body, "sgd")
    for model, _ in (c, e):
        model.register_buffer("count", sg.zeros(SIZES[1]))
        model.register_buffer("offset64", sg.ones(SIZES[1], dtype=sg.float64))
    for i in range(3):
        x, y = _data(i)
        y_e = y.clone()  # the step may change its argument: each side gets its own
        sg.manual_seed(100 + i)  # the same draws on both sides (uniform_)
        if i == 0:
            with pytest.warns(UserWarning, match=match):
                got = step(x, y)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = step(x, y)
        sg.manual_seed(100 + i)
        want = eager(x, y_e)
        assert_close(got[0], want[0], terms=_terms(SIZES, i + 1))
        assert_close(y, y_e)
        _assert_same_state(c, e, i + 1, SIZES)
        for name in ("count", "offset64"):
            assert_close(getattr(c[0], name), getattr(e[0], name))
    assert not step._entries() and len(step.stats["fallbacks"]) == 1


# -- random programs mixing in-place and out-of-place ops --------------------------------------
def _draw_program(rng) -> list:
    """Steps ``(kind, i, j, c)`` on a pool that starts with two leaves and fn's argument,
    all 3x4: out-of-place ops append to the pool, in-place ones change a pool tensor (a
    leaf, an argument, a view: whatever is drawn, eager decides what is allowed)."""
    kinds = ["mul", "tanh", "exp", "view", "tt", "slice_all", "detach", "relu_", "mul_",
             "add_", "sub_", "clamp_", "sigmoid_", "tanh_", "masked_fill_", "copy_", "zero_",
             "div_", "no_grad mul_", "iadd"]
    steps = []
    for n in range(3, 3 + int(rng.integers(2, 9))):
        kind = str(rng.choice(kinds[:3] if n < 5 else kinds))  # intermediates first
        steps.append((kind, int(rng.integers(0, 2 * n)),
                      int(rng.integers(0, 2 * n)), float(rng.choice([0.5, 2.0, -1.5]))))
    return steps


def _apply_step(pool, kind, i, j, c):
    a, b = pool[i % len(pool)], pool[j % len(pool)]  # the pool grows by out-of-place ops
    new = {"mul": lambda: a * b, "tanh": lambda: a.tanh(), "exp": lambda: (a * 0.3).exp(),
           "view": lambda: a.view(12).view(3, 4), "tt": lambda: a.t().t(),
           "slice_all": lambda: a[:, :], "detach": lambda: a.detach()}.get(kind)
    if new is not None:
        pool.append(new())
        return
    # an in-place op's target: mostly an intermediate, every fifth a leaf or the argument
    a = pool[i % 3] if i % 5 == 0 else pool[3 + i % (len(pool) - 3)]
    if kind == "no_grad mul_":
        with sg.no_grad():
            a.mul_(c)
        return
    {"relu_": lambda: a.relu_(), "mul_": lambda: a.mul_(c), "add_": lambda: a.add_(b),
     "sub_": lambda: a.sub_(b, alpha=c), "clamp_": lambda: a.clamp_(-c * c, c * c),
     "sigmoid_": lambda: a.sigmoid_(), "tanh_": lambda: a.tanh_(),
     "masked_fill_": lambda: a.masked_fill_(b > 0, c), "copy_": lambda: a.copy_(b * c),
     "zero_": lambda: a.zero_(), "div_": lambda: a.div_(b.abs() + 1.0),
     "iadd": lambda: a.__iadd__(c)}[kind]()


def _program_fn(steps, leaves, opt):
    weights = [sg.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4) * (k + 1) / 7)
               for k in range(3 + len(steps))]

    def fn(x):
        opt.zero_grad()
        pool = [leaves[0], leaves[1], x]
        for step in steps:
            _apply_step(pool, *step)
        loss = None
        for t, w in zip(pool, weights):
            if t.requires_grad:
                term = (t * w).sum()
                loss = term if loss is None else loss + term
        loss.backward()
        opt.step()
        return tuple(t * 1 for t in pool)  # values (leaves and x as they are now)

    return fn


def test_random_inplace_programs_compiled_equal_eager():
    """Programs drawn at random from in-place and out-of-place ops on leaves, fn's
    argument, intermediates and their views: compiled or fallen back, every call equals
    eager (values, leaves, gradients), or raises eager's error
    (``SYMGRAD_COMPILE_INPLACE_FUZZ`` programs, 40 by default)."""
    compiled = 0
    for seed in range(int(os.environ.get("SYMGRAD_COMPILE_INPLACE_FUZZ", 40))):
        rng = np.random.default_rng(seed)
        steps = _draw_program(rng)
        init = [rng.uniform(-1, 1, (3, 4)).astype(np.float32) for _ in range(2)]
        sides = []
        for _ in range(2):
            leaves = [sg.tensor(a.copy(), requires_grad=True) for a in init]
            opt = sg.optim.SGD(leaves, lr=0.1, momentum=0.5)
            sides.append((leaves, _program_fn(steps, leaves, opt)))
        (leaves_c, fn_c), (leaves_e, fn_e) = sides
        step = sg.compile(fn_c)
        terms = 8 * (len(steps) + 12)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fallbacks are expected for many programs
            for call in range(3):
                x = sg.tensor(rng.uniform(-1, 1, (3, 4)).astype(np.float32))
                x_e = x.clone()
                got = want = None
                try:
                    got = step(x)
                except RuntimeError as exc:
                    got = exc
                try:
                    want = fn_e(x_e)
                except RuntimeError as exc:
                    want = exc
                what = f"seed {seed} call {call}: {steps}"
                if isinstance(want, Exception):
                    assert isinstance(got, RuntimeError) and str(got) == str(want), what
                    break
                assert not isinstance(got, Exception), f"{what}: {got}"
                for p, q in zip(got, want):
                    assert_close(p, q, terms=terms, scale=magnitude(q.detach().numpy()),
                                 msg=what)
                assert_close(x, x_e, msg=what)
                for p, q in zip(leaves_c, leaves_e):
                    assert_close(p, q, terms=terms, msg=what)
                    assert (p.grad is None) == (q.grad is None), what
                    if q.grad is not None:
                        assert_close(p.grad, q.grad, terms=terms, msg=what)
        compiled += bool(step._entries())
    assert compiled  # some programs compiled (the rest fell back or raised as eager)
