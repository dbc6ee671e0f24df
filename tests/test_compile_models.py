"""sg.compile on real users' steps (issue 33): input gradients, and CNN / transformer layers.

Every comparison runs the same step twice from identical copies (deepcopy of model and
optimizer, clones of the arguments): once eagerly, once compiled with warnings turned
into errors (a fallback to eager fails the test), and compares losses, parameters, their
``.grad``, optimizer state and the arguments' ``.grad`` after each step. Bounds come from
tests/_tolerance.py: ``terms`` counts the roundings a step's values go through (the
reduction lengths along the network) times the number of steps.
"""

from __future__ import annotations

import copy
import os
import warnings

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg
from symgrad import nn
from symgrad.nn import functional as F
from symgrad.ops import OPS

STEPS = 3


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Generated modules go to a temp dir, not the user's ~/.cache."""
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cc"))


def _no_fallback(step, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager is a UserWarning
        return step(*args)


def _assert_same(model, model_e, opt, opt_e, terms):
    for p, q in zip(model.parameters(), model_e.parameters()):
        scale = magnitude(q.detach().numpy())
        assert_close(p, q, terms=terms, scale=scale)
        assert (p.grad is None) == (q.grad is None)
        if q.grad is not None:
            assert_close(p.grad, q.grad, terms=terms)
        st, st_e = opt.state.get(p, {}), opt_e.state.get(q, {})
        assert st.keys() == st_e.keys()
        for key in st_e:
            if isinstance(st_e[key], sg.Tensor):
                assert_close(st[key], st_e[key], terms=terms)


# -- 1. input gradients ----------------------------------------------------------------------
def _mlp(seed=0):
    sg.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 4))


def _saliency_step(model, opt):
    """A step whose argument requires grad: the loss's gradient w.r.t. the input (saliency,
    adversarial examples) and the parameters' update in one."""
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def test_input_gradients_compile_and_equal_eager_over_steps():
    model = _mlp()
    model_e = copy.deepcopy(model)
    opt = sg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_e = sg.optim.SGD(model_e.parameters(), lr=0.1, momentum=0.9)
    step, eager = sg.compile(_saliency_step(model, opt)), _saliency_step(model_e, opt_e)
    sg.manual_seed(3)
    y = sg.tensor([0, 1, 2, 3, 1])
    for i in range(STEPS + 1):
        data = sg.randn(5, 6)
        x, x_e = data.clone().requires_grad_(), data.clone().requires_grad_()
        got, want = _no_fallback(step, x, y), eager(x_e, y)
        terms = (i + 1) * (6 + 16 + 4 + 16)
        assert_close(got, want, terms=terms)
        assert x.grad is not None and x.grad.shape == x.shape
        assert_close(x.grad, x_e.grad, terms=terms)
        assert x.grad.grad_fn is None and not x.grad.requires_grad
        _assert_same(model, model_e, opt, opt_e, terms)
    assert step.stats["fallbacks"] == [] and step.stats["traces"] == 1


def test_input_gradient_accumulates_into_the_existing_grad_as_eager():
    """No zeroing between calls: eager's AccumulateGrad adds into the same ``.grad`` tensor
    in place (a reference to it sees the sum, its version moves); a ``.grad`` kept from a
    call on another input is not overwritten by the next call's."""
    model = _mlp()
    model_e = copy.deepcopy(model)

    def make(m):
        def fn(x):
            loss = (m(x) ** 2).mean()
            loss.backward()
            return loss
        return fn

    step, eager = sg.compile(make(model)), make(model_e)
    sg.manual_seed(4)
    data = sg.randn(3, 6)
    x, x_e = data.clone().requires_grad_(), data.clone().requires_grad_()
    _no_fallback(step, x)
    eager(x_e)
    first, first_e = x.grad, x_e.grad
    kept = first.numpy().copy()
    version = first._version
    for i in range(2):
        _no_fallback(step, x)
        eager(x_e)
        assert x.grad is first and x_e.grad is first_e  # the same tensor, added into
        assert_close(x.grad, x_e.grad, terms=(i + 2) * 40)
    assert first._version > version
    assert_close(x.grad, 3 * kept, terms=3 * 40)
    # another input: a new .grad; the old input's stays as it was
    other = sg.randn(3, 6).requires_grad_()
    before = x.grad.numpy().copy()
    _no_fallback(step, other)
    np.testing.assert_array_equal(x.grad.numpy(), before)
    assert other.grad is not x.grad
    assert step.stats["traces"] == 1


def test_input_grad_set_to_none_inside_fn_and_unused_argument():
    """``x.grad = None`` inside fn (the chain benchmark's form) starts a new ``.grad``; an
    argument that requires grad but gets no gradient keeps ``.grad`` None, as in eager."""
    sg.manual_seed(5)
    w = sg.randn(8, requires_grad=True)

    def fn(x, unused):
        x.grad = None
        w.grad = None
        loss = ((x * w).sin() * 1.1).tanh().sum()
        loss.backward()
        return loss

    step = sg.compile(fn)
    x, u = sg.randn(8).requires_grad_(), sg.randn(8).requires_grad_()
    x_e, u_e = x.detach().clone().requires_grad_(), u.detach().clone().requires_grad_()
    for _ in range(3):
        got = _no_fallback(step, x, u)
        w_grad = w.grad.numpy().copy()
        keep = x.grad
        want = fn(x_e, u_e)
        assert_close(got, want, terms=16)
        assert_close(keep, x_e.grad, terms=16)
        assert_close(w_grad, w.grad, terms=16)
        assert u.grad is None and u_e.grad is None
    assert keep is not x_e.grad


def test_ten_op_chain_with_input_gradients_compiles():
    """The benchmark's chain with ``x.requires_grad`` (issue 33: it ran eagerly)."""
    sg.manual_seed(0)
    w = sg.randn(1000, requires_grad=True)

    def chain_step(x):
        w.grad = None
        x.grad = None
        h = (x * w).sin() * 1.1
        h = h.tanh() + 0.3
        h = (h * h).exp()
        h = (h - 0.2).sigmoid()
        loss = (h * 0.7).relu().sum()
        loss.backward()
        return loss

    step = sg.compile(chain_step)
    x = sg.randn(1000).requires_grad_()
    x_e = x.detach().clone().requires_grad_()
    for _ in range(3):
        got = _no_fallback(step, x)
        gx, gw = x.grad.numpy().copy(), w.grad.numpy().copy()
        want = chain_step(x_e)
        assert_close(got, want, terms=1000 + 10)
        assert_close(gx, x_e.grad, terms=20)
        assert_close(gw, w.grad, terms=20)
    assert step.verify().ok


def test_step_with_input_gradient_verifies_and_catches_a_wrong_one(monkeypatch):
    model = _mlp()
    opt = sg.optim.SGD(model.parameters(), lr=0.1)
    step = sg.compile(_saliency_step(model, opt))
    x = sg.randn(5, 6).requires_grad_()
    y = sg.tensor([0, 1, 2, 3, 1])
    _no_fallback(step, x, y)
    _no_fallback(step, x.detach().clone().requires_grad_(), y)
    report = step.verify()
    assert report.ok
    # the input's gradient is among the checked leaves, named as the step names it
    assert "x" in [r.name for r in report.leaves]
    # a wrong input gradient in the generated code is reported
    entry = step._entries()[-1]
    make = entry.module.make

    def bad_make(K):
        run, bufs = make(K)

        def wrong(A, L, E, H):
            outs = run(A, L, E, H)
            return outs[:-1] + (outs[-1] * 1.01,)
        return wrong, bufs

    monkeypatch.setattr(entry.module, "make", bad_make)
    report = step.verify()  # a report, not an exception, naming the gradient
    assert not report.ok and report.bad_kernel == "gradient of arg0"
    assert "generated code differs from eager" in str(report)


def test_non_leaf_argument_and_twice_passed_argument_run_eagerly_and_equal_eager():
    """A non-leaf argument (eager's backward goes on into its graph) falls back with the
    reason; the same tensor passed twice runs that call eagerly (both gradients add)."""
    sg.manual_seed(6)
    w = sg.randn(4, requires_grad=True)

    def fn(a, b):
        loss = (a * b * w).sum()
        loss.backward()
        return loss

    step = sg.compile(fn)
    base = sg.randn(4, requires_grad=True)
    with pytest.warns(UserWarning, match="argument 0 is not a leaf"):
        step(base * 2, sg.randn(4))
    assert base.grad is not None
    x, z = sg.randn(4).requires_grad_(), sg.randn(4).requires_grad_()
    _no_fallback(step, x, z)  # two leaves: compiled
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = sg.randn(4).requires_grad_()
        t_e = t.detach().clone().requires_grad_()
        step(t, t)
        fn(t_e, t_e)
    assert_close(t.grad, t_e.grad, terms=4)


# -- 2. every op with a backward has a compile rule -------------------------------------------
#: ops with a backward that sg.compile cannot differentiate (none: the ops without a NumPy
#: rule call the engine's backward from the generated code, compile/formulas.py)
KNOWN_NO_RULE: dict[str, str] = {}


def test_every_op_with_a_backward_has_a_compile_rule():
    from symgrad.compile.rules import rule_kind

    missing = sorted(n for n, s in OPS.items() if s.differentiable and s.grads
                     and rule_kind(s) is None and n not in KNOWN_NO_RULE)
    assert not missing, f"ops without a compile rule for their backward: {missing}"
    stale = sorted(n for n in KNOWN_NO_RULE if rule_kind(OPS[n]) is not None)
    assert not stale, f"KNOWN_NO_RULE lists ops that have a rule now: {stale}"


def test_every_drawable_op_compiles_its_backward():
    """One program per differentiable op of the registry (tests/test_random_programs.py's
    drawers: the op on fresh leaves, its outputs weighted into a loss): the compiled step
    equals eager over three calls, and no signature fell back for want of a backward rule
    ("no compile rule for the backward of ..."). ``SYMGRAD_COMPILE_OP_EXAMPLES`` programs per
    op (1; 2 took 12 minutes on a loaded 2-core machine, and passed)."""
    pytest.importorskip("hypothesis")
    pytest.importorskip("torch")
    from hypothesis import HealthCheck, Phase, given, reject, settings
    from hypothesis import strategies as st
    from test_compile import _compiled_equals_eager
    from test_random_programs import GENERATORS, NAMES, Builder

    no_rule: dict[str, list] = {}
    compiled: set = set()

    def for_op(name):
        @settings(derandomize=True, deadline=None, database=None,
                  max_examples=int(os.environ.get("SYMGRAD_COMPILE_OP_EXAMPLES", 1)),
                  phases=(Phase.generate,),
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.filter_too_much])
        @given(st.data())
        def run(data):
            b = Builder(data)
            try:
                b.leaf(b.shape())
                GENERATORS[name](b)
            except RuntimeError:
                reject()
            step = _compiled_equals_eager(b)
            reasons = [r for r in step.stats["fallbacks"] if "no compile rule" in r]
            if reasons:
                no_rule.setdefault(name, []).extend(reasons)
            if not step.stats["fallbacks"] and step._entries():
                compiled.add(name)
        return run

    for name in NAMES:
        for_op(name)()
    assert not no_rule, f"ops whose backward has no compile rule: {no_rule}"
    # most drawn programs compile whole (some fall back for other reasons: value reads
    # in a forward such as nonzero, mixed dtypes ...)
    assert len(compiled) >= len(NAMES) // 2, sorted(set(NAMES) - compiled)


# -- layers: each compiles (no fallback) and equals eager over several steps ------------------
class _Pool(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.kind = kind
        self.fc = nn.Linear(3 * 2 * 2, 4)

    def forward(self, x):
        h = self.conv(x)
        if self.kind == "max":
            h = F.max_pool2d(h, 2)
        elif self.kind == "avg":
            h = F.avg_pool2d(h, 2)
        else:
            h = F.adaptive_avg_pool2d(h, (2, 2))
        return self.fc(h.flatten(1))


class _Conv1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 3, padding=1)
        self.fc = nn.Linear(3 * 16, 4)

    def forward(self, x):
        return self.fc(F.gelu(self.conv(x.flatten(2))).flatten(1))


class _Norms(nn.Module):
    """Training-mode batch norm on batch statistics (``track_running_stats=False``: the
    running-stat update writes into buffers in place, a side effect on state outside fn
    that still falls back, docs/compile.md) and LayerNorm."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(2, track_running_stats=False)
        self.ln = nn.LayerNorm(16)
        self.fc = nn.Linear(32, 4)

    def forward(self, x):
        # the GELU between them: LayerNorm over a channel's positions would cancel batch
        # norm's per-channel bias, leaving it a gradient of pure rounding noise
        h = self.ln(F.gelu(self.bn(x)).flatten(2))
        return self.fc(h.flatten(1))


class _Attention(nn.Module):
    """Embedding, split into heads, sdpa (causal), softmax, gather, scatter, cat/stack."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.qkv = nn.Linear(8, 24)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        idx = (x.flatten(1)[:, :4].abs() * 3).long().clamp(0, 9)
        h = self.emb(idx)                                   # (5, 4, 8)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        q, k, v = (t.view(5, 4, 2, 4).permute(0, 2, 1, 3) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(5, 4, 8)
        y = F.log_softmax(y, -1) + F.softmax(y, 1)
        pick = sg.gather(y, 2, sg.zeros(5, 4, 1, dtype=sg.long))
        spread = sg.zeros(5, 4, 8).scatter(2, sg.ones(5, 4, 1, dtype=sg.long), pick)
        z = sg.cat([y[:, :2], spread[:, 2:]], 1) + sg.stack([y[:, 0]] * 4, 1)
        a, b = z.split([3, 1], dim=1)
        return self.fc(a.sum(1) + b.squeeze(1))


LAYERS = {"max_pool2d": lambda: _Pool("max"), "avg_pool2d": lambda: _Pool("avg"),
          "adaptive_avg_pool2d": lambda: _Pool("adaptive"), "conv1d_gelu": _Conv1d,
          "batch_norm_layer_norm": _Norms, "attention_parts": _Attention}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_layers_compile_and_equal_eager(name):
    sg.manual_seed(0)
    model = LAYERS[name]()
    model_e = copy.deepcopy(model)
    opt = sg.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt_e = sg.optim.SGD(model_e.parameters(), lr=0.05, momentum=0.9)
    step, eager = sg.compile(_saliency_step(model, opt)), _saliency_step(model_e, opt_e)
    sg.manual_seed(1)
    x = sg.randn(5, 2, 4, 4)
    y = sg.tensor([0, 1, 2, 3, 1])
    for i in range(STEPS):
        got, want = _no_fallback(step, x, y), eager(x, y)
        terms = (i + 1) * 200
        assert_close(got, want, terms=terms)
        _assert_same(model, model_e, opt, opt_e, terms)
        for b, b_e in zip(model.buffers(), model_e.buffers()):  # batch norm's running stats
            assert_close(b, b_e, terms=terms)
    assert step.stats["traces"] == 1


# -- LeNet-5 and a 2-layer nanoGPT-shaped step --------------------------------------------------
def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))


def GPT():
    """nanoGPT's model (tied embedding, learned positions from ``arange``, pre-norm blocks,
    causal sdpa, GELU MLP, Dropout(0.0) modules), 2 layers of n_embd 64 and 4 heads: the
    one definition in tests/_nanogpt.py."""
    from _nanogpt import gpt

    return gpt(sg, vocab=65, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.0)


@pytest.mark.parametrize("which", ["lenet", "gpt"])
def test_lenet_and_gpt_steps_compile_without_fallback_and_equal_eager(which):
    sg.manual_seed(0)
    if which == "lenet":
        model = lenet()
        make_opt = lambda ps: sg.optim.SGD(ps, lr=0.01, momentum=0.9)  # noqa: E731
        x, y = sg.randn(64, 1, 28, 28), sg.randint(0, 10, (64,))
        forward = lambda m, a, b: F.cross_entropy(m(a), b)  # noqa: E731
        terms = 25 * 6 + 256 + 120 + 84 + 64 + 100
    else:
        model = GPT()
        make_opt = lambda ps: sg.optim.AdamW(ps, lr=1e-3)  # noqa: E731
        x, y = sg.randint(0, 65, (8, 32)), sg.randint(0, 65, (8, 32))
        forward = lambda m, a, b: m(a, b)  # noqa: E731
        # Adam divides by sqrt(v) + eps: a gradient's rounding is scaled up by lr/eps at
        # most where v is tiny; the reduction lengths (256 hidden, 64 embd, 8*32 rows)
        terms = 2 * (256 + 64 + 8 * 32 + 64)
    model_e = copy.deepcopy(model)
    opt, opt_e = make_opt(model.parameters()), make_opt(model_e.parameters())

    def make(m, o):
        def step(a, b):
            o.zero_grad()
            loss = forward(m, a, b)
            loss.backward()
            o.step()
            return loss
        return step

    step, eager = sg.compile(make(model, opt)), make(model_e, opt_e)
    for i in range(STEPS):
        got, want = _no_fallback(step, x, y), eager(x, y)
        assert_close(got, want, terms=(i + 1) * terms)
        for p, q in zip(model.parameters(), model_e.parameters()):
            assert_close(p.grad, q.grad, terms=(i + 1) * terms)
            assert_close(p, q, terms=(i + 1) * terms, scale=magnitude(q.detach().numpy()))
    assert step.stats["fallbacks"] == [] and step.stats["traces"] == 1


@pytest.mark.parametrize("dims", [(11, 8, 1, 2, 8), (11, 8, 2, 4, 16), (65, 8, 1, 4, 32)],
                         ids=["embd8", "embd16-2layers", "vocab65"])
def test_small_gpt_steps_with_adamw_compile_and_equal_eager_bit_for_bit(dims):
    """Small nanoGPTs with AdamW compile (no fallback) and stay eager's bits: gradients,
    parameters and Adam's moments. Adam divides a gradient by its own size, so a key bias's
    gradient (zero but for rounding: softmax cancels it) that rounds differently moves the
    parameter by a whole learning rate; the compiled cross-entropy, summing its rows in
    another order than eager's, made the self-check send these steps back to eager."""
    from _nanogpt import gpt

    vocab, block, n_layer, n_head, n_embd = dims
    sg.manual_seed(1)
    model = gpt(sg, vocab=vocab, block_size=block, n_layer=n_layer, n_head=n_head,
                n_embd=n_embd)
    model_e = copy.deepcopy(model)
    opt, opt_e = (sg.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, model_e))
    x, y = sg.randint(0, vocab, (4, block)), sg.randint(0, vocab, (4, block))

    def make(m, o):
        def step(a, b):
            o.zero_grad()
            loss = m(a, b)
            loss.backward()
            o.step()
            return loss
        return step

    step, eager = sg.compile(make(model, opt)), make(model_e, opt_e)
    for _ in range(3):
        got, want = _no_fallback(step, x, y), eager(x, y)
        assert_close(got, want, terms=4 * block)  # the loss: its sum in float64 (nll_rows)
        for p, q in zip(model.parameters(), model_e.parameters()):
            np.testing.assert_array_equal(p.grad.numpy(), q.grad.numpy())
            np.testing.assert_array_equal(p.detach().numpy(), q.detach().numpy())
            for key in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_array_equal(opt.state[p][key].numpy(),
                                              opt_e.state[q][key].numpy())
    assert step.stats["fallbacks"] == [] and step.stats["traces"] == 1


# -- background compilation ----------------------------------------------------------------
def test_background_compile_runs_eagerly_until_ready_then_equals_eager():
    """``compile(background=True)``: the first call returns the traced (eager) result while
    the code is generated and compiled in a thread; calls meanwhile run eagerly; once ready
    (``wait``) the compiled steps carry on from the eager state exactly as eager steps do,
    with no fallback, and the step verifies. The self-check compares with the state the
    traced call left, although the eager calls meanwhile changed the parameters."""
    from symgrad.compile.step import Entry, _Pending

    model, model_e = _mlp(1), _mlp(1)
    opt = sg.optim.Adam(model.parameters(), lr=1e-2)
    opt_e = sg.optim.Adam(model_e.parameters(), lr=1e-2)
    step = sg.compile(_saliency_step(model, opt), background=True)
    eager = _saliency_step(model_e, opt_e)
    sg.manual_seed(3)
    x, y = sg.randn(5, 6), sg.randint(0, 4, (5,))
    states = []
    for i in range(8):
        if i == 4:
            step.wait()
        states.append(type(next(iter(step._cache.values()))) if step._cache else None)
        loss = _no_fallback(step, x, y)
        loss_e = eager(x, y)
        assert_close(loss, loss_e, terms=64, scale=magnitude(loss_e))
    assert states[0] is None and states[-1] is Entry  # traced, then compiled
    assert all(s in (_Pending, Entry) for s in states[1:])
    assert step.stats["fallbacks"] == [] and step.stats["traces"] == 1
    _assert_same(model, model_e, opt, opt_e, terms=64)
    step.verify()
