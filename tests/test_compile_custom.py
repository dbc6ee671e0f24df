"""sg.compile with custom autograd Functions inside the step (issue 22).

The Function's forward ops and the ops its backward ran in the traced call are replayed by
the generated code; every test runs the same step compiled and eagerly from identical
copies and compares the returned loss, parameters, ``.grad`` and optimizer state after
each step (bounds from tests/_tolerance.py, as in tests/test_compile.py).
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad import nn
from symgrad.autograd import Function, once_differentiable
from symgrad.nn import functional as F

STEPS = 6
SIZES = (4, 16, 3)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Generated modules go to a temp dir, not the user's ~/.cache."""
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cc"))


class ScaledTanh(Function):
    """2 tanh(k x): a saved intermediate and a Python number kept on ctx."""

    @staticmethod
    def forward(ctx, x, k):
        y = (x * k).tanh()
        ctx.save_for_backward(y)
        ctx.k = k
        return y * 2.0

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * 2.0 * ctx.k * (1 - y * y), None


class CustomLinear(Function):
    """x W^T + b with its own backward: needs_input_grad, a broadcast bias gradient."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return x.mm(w.t()) + b

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g.mm(w) if ctx.needs_input_grad[0] else None
        return gx, g.t().mm(x), g  # g is (batch, out): the engine sums it to b's shape


class Exp(Function):
    """A saved output (unpacked as a new tensor in backward); setup_context style."""

    @staticmethod
    def forward(x):
        return x.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * y


class SplitHalves(Function):
    """Two outputs, one unused by the loss (backward sees zeros for it); an input returned
    as it is."""

    @staticmethod
    def forward(ctx, x):
        return x * 1.5, x.sin(), x

    @staticmethod
    def backward(ctx, ga, gb, gc):
        return ga * 1.5 + gc + gb * 0.0


class Net(nn.Module):
    def __init__(self, sizes=SIZES) -> None:
        super().__init__()
        self.l1 = nn.Linear(sizes[0], sizes[1])
        self.l2 = nn.Linear(sizes[1], sizes[2])

    def forward(self, x, k=0.5):
        h = ScaledTanh.apply(self.l1(x), k)
        a, _unused, same = SplitHalves.apply(h)
        h = Exp.apply(a * 0.1) + same
        return CustomLinear.apply(h, self.l2.weight, self.l2.bias)


def _step_fn(model, opt):
    def step(x, y, k):
        opt.zero_grad()
        loss = F.mse_loss(model(x, k), y)
        loss.backward()
        opt.step()
        return loss

    return step


def _terms(steps: int) -> int:
    return steps * (sum(SIZES) + 24)


def _assert_same_state(model, opt, model_e, opt_e, terms: int) -> None:
    for p, q in zip(model.parameters(), model_e.parameters()):
        assert_close(p, q, terms=terms)
        assert (p.grad is None) == (q.grad is None)
        if q.grad is not None:
            assert_close(p.grad, q.grad, terms=terms)
        st, st_e = opt.state.get(p, {}), opt_e.state.get(q, {})
        assert st.keys() == st_e.keys()
        for key, b in st_e.items():
            if isinstance(b, sg.Tensor):
                assert_close(st[key], b, terms=terms)
            else:
                assert st[key] == b


def _pair(make_opt):
    sg.manual_seed(0)
    model = Net()
    model_e = copy.deepcopy(model)
    opt, opt_e = make_opt(model.parameters()), make_opt(model_e.parameters())
    return sg.compile(_step_fn(model, opt)), _step_fn(model_e, opt_e), \
        (model, opt, model_e, opt_e)


def _data(batch=8, seed=1):
    sg.manual_seed(seed)
    return sg.randn(batch, SIZES[0]), sg.randn(batch, SIZES[-1])


@pytest.mark.parametrize("make_opt", [
    lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-3),
    lambda ps: sg.optim.Adam(ps, lr=1e-2)], ids=["sgd", "adam"])
def test_custom_functions_in_a_compiled_step_match_eager(make_opt):
    step, eager, state = _pair(make_opt)
    x, y = _data()
    for i in range(STEPS):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback
            got = step(x, y, 0.5)
        want = eager(x, y, 0.5)
        assert_close(got, want, terms=_terms(i + 1))
        _assert_same_state(*state, terms=_terms(i + 1))
    assert step.stats["traces"] == 1 and not step.stats["fallbacks"]
    assert step.verify().ok  # the Functions' backwards are right, and so is the code
    src = step.source()
    assert "def run(" in src and "Tensor" not in src
    # the compiled calls ran the generated module, not the eager Function
    calls = []
    orig = ScaledTanh.forward
    ScaledTanh.forward = staticmethod(lambda ctx, x, k: calls.append(1) or orig(ctx, x, k))
    try:
        step(x, y, 0.5)
    finally:
        ScaledTanh.forward = staticmethod(orig)
    assert not calls


def test_a_scalar_argument_stored_on_ctx_is_guarded():
    """ctx.k comes from fn's argument k: a new k is a new signature (retrace), never the
    traced k baked in."""
    step, eager, state = _pair(lambda ps: sg.optim.SGD(ps, lr=0.1))
    x, y = _data()
    for i, k in enumerate((0.5, 2.0, 0.5, 2.0)):
        assert_close(step(x, y, k), eager(x, y, k), terms=_terms(i + 1))
        _assert_same_state(*state, terms=_terms(i + 1))
    assert step.stats["traces"] == 2


class WrongTanh(Function):
    @staticmethod
    def forward(ctx, x):
        y = x.tanh()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 + y * y)  # the sign of y * y is wrong


def _wrong_fn(w, opt):
    def step(x):
        opt.zero_grad()
        loss = (WrongTanh.apply(x.mm(w)) * 2.0).sum()
        loss.backward()
        opt.step()
        return loss

    return step


def test_a_wrong_backward_is_reproduced_and_verify_reports_it():
    sg.manual_seed(2)
    w = sg.randn(3, 4, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)
    step = sg.compile(_wrong_fn(w, sg.optim.SGD([w], lr=0.1)))
    eager = _wrong_fn(w_e, sg.optim.SGD([w_e], lr=0.1))
    x = sg.randn(5, 3)
    for i in range(4):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = step(x)
        assert_close(got, eager(x), terms=(i + 1) * 16)
        assert_close(w.grad, w_e.grad, terms=(i + 1) * 16)  # the wrong gradient, as eager
        assert_close(w, w_e, terms=(i + 1) * 16)
    # and the wrong one it is: the true derivative of sum(2 tanh(x w)) differs
    h = np.tanh(x.numpy() @ w.detach().numpy())
    true = x.numpy().T @ (2.0 * (1 - h * h))
    step(x)
    assert not np.allclose(w.grad.numpy(), true, rtol=0.1)
    report = step.verify()
    assert not report.ok
    assert "WrongTanhBackward" in str(report)


class ItemInBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0 if g.sum().item() > 0 else g  # data-dependent Python


class BranchInForward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0 if bool((x > 0).all()) else x * 3.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


class Dirty(Function):
    """Changes its input in place through a view of it (mark_dirty on an intermediate that
    is no view compiles: tests/test_compile_inplace.py)."""

    @staticmethod
    def forward(ctx, x):
        x.view(-1).mul_(2.0)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


class NewTensorInBackward(Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, g):
        return g * 2.0 + sg.zeros_like(g)  # made outside the traced ops


@pytest.mark.parametrize("fcls,match", [
    (ItemInBackward, r"Tensor.item\(\)"), (BranchInForward, r"Tensor.__bool__"),
    (Dirty, "on a view or on a tensor that has views"),
    (NewTensorInBackward, "made inside fn outside the traced ops")])
def test_untraceable_custom_functions_fall_back_with_a_warning(fcls, match):
    sg.manual_seed(0)
    w = sg.randn(3, 4, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)

    def make(w, opt):
        def step(x):
            opt.zero_grad()
            loss = fcls.apply(x.mm(w) * 1.0).sum()
            loss.backward()
            opt.step()
            return loss

        return step

    step = sg.compile(make(w, sg.optim.SGD([w], lr=0.1)))
    eager = make(w_e, sg.optim.SGD([w_e], lr=0.1))
    x = sg.randn(5, 3)
    with pytest.warns(UserWarning, match=match):
        got = step(x)
    assert_close(got, eager(x))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(2):
            assert_close(step(x), eager(x), terms=(i + 2) * 16)
    assert_close(w, w_e, terms=48)
    assert not step._entries() and step.stats["fallbacks"]


class Square(Function):
    """c x^2; saves None next to x."""

    @staticmethod
    def forward(ctx, x, c):
        ctx.save_for_backward(x, None)
        ctx.c = c
        return x * x * c

    @staticmethod
    def backward(ctx, g):
        x, none = ctx.saved_tensors
        assert none is None
        return g * 2.0 * x * ctx.c, None


class ExpAndArgmax(Function):
    """A non-differentiable integer output next to a differentiable one."""

    @staticmethod
    def forward(ctx, x):
        idx = x.argmax(dim=1)
        ctx.mark_non_differentiable(idx)
        ctx.save_for_backward(x)
        return x.exp(), idx

    @staticmethod
    def backward(ctx, g, _g_idx):
        (x,) = ctx.saved_tensors
        return g * x.exp()


class BiasAdd(Function):
    """A bias gradient reduced by the Function itself (sum over dim 0)."""

    @staticmethod
    def forward(ctx, x, b):
        return x + b

    @staticmethod
    def backward(ctx, g):
        return g, g.sum(dim=0)


class TwoWays(Function):
    """set_materialize_grads(False): backward sees None for the output without gradient."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x * 2.0, x.cos()

    @staticmethod
    def backward(ctx, ga, gb):
        (x,) = ctx.saved_tensors
        g = ga * 2.0 if ga is not None else None
        if gb is not None:
            gb = -gb * x.sin()
            g = gb if g is None else g + gb
        return g


def _unmaterialized(w, b, x):
    a, _ = TwoWays.apply(x * w)
    _, c = TwoWays.apply(x + b)
    return (a * a).sum() + c.sum()


def _in_chain(w, b, x):
    """Custom Functions between fused elementwise runs (before and after them)."""
    h = ((x * w).tanh() + 1.0) * 0.5
    h = Square.apply(h, 3.0)
    h = Square.apply(h.sin() * 2.0, 0.5).sigmoid() * 1.5 - 0.1
    return BiasAdd.apply(h, b).exp().mean()


def _non_differentiable_output(w, b, x):
    y, idx = ExpAndArgmax.apply(x * w)
    return (y * 0.1).sum() + (b * b).sum() + idx.sum() * 0


def _applied_without_grad(w, b, x):
    with sg.no_grad():  # no node: only the forward's ops are traced
        z = Square.apply(x, 2.0)
    return (z * w).sum() + b.sum()


@pytest.mark.parametrize("loss_fn", [_in_chain, _non_differentiable_output,
                                     _applied_without_grad, _unmaterialized])
def test_more_custom_function_shapes_match_eager(loss_fn):
    sg.manual_seed(0)
    w, b = sg.randn(6, 5, requires_grad=True), sg.randn(5, requires_grad=True)
    w_e, b_e = (sg.tensor(t.detach().numpy().copy(), requires_grad=True) for t in (w, b))

    def make(w, b, opt):
        def step(x):
            opt.zero_grad()
            loss = loss_fn(w, b, x)
            loss.backward()
            opt.step()
            return loss

        return step

    step = sg.compile(make(w, b, sg.optim.Adam([w, b], lr=1e-2)))
    eager = make(w_e, b_e, sg.optim.Adam([w_e, b_e], lr=1e-2))
    x = sg.randn(6, 5)
    for i in range(4):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = step(x)
        terms = (i + 1) * (16 + 30)  # 16 chained ops, a sum of 30
        assert_close(got, eager(x), terms=terms)
        for p, q in ((w, w_e), (b, b_e)):
            assert_close(p, q, terms=terms)
            assert_close(p.grad, q.grad, terms=terms)
    assert step.stats["traces"] == 1 and step._entries()


def test_a_custom_function_step_keeps_no_tensor_alive_by_itself():
    """No reference cycle through the traced Functions: dropping the step (and the fn
    closing over the model) frees the parameters at once, without the cycle collector."""
    import gc
    import weakref

    def build():
        step, _, (model, _, _, _) = _pair(lambda ps: sg.optim.Adam(ps, lr=1e-2))
        x, y = _data()
        step(x, y, 0.5)
        step(x, y, 0.5)
        return step, weakref.ref(model.l2.weight)

    gc.collect()
    gc.disable()
    try:
        step, ref = build()
        assert ref() is not None and step._entries()
        del step
        assert ref() is None
    finally:
        gc.enable()


# -- random programs with custom Functions ---------------------------------------------------
class _CScale(Function):
    @staticmethod
    def forward(ctx, x, c):
        ctx.c = c
        return x * c

    @staticmethod
    def backward(ctx, g):
        return g * ctx.c, None


class _CTanh(Function):
    @staticmethod
    def forward(ctx, x):
        y = x.tanh()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)


class _CMul(Function):
    """Broadcasting product: the engine (and the generated code) sums each gradient back."""

    @staticmethod
    def forward(ctx, x, y):
        ctx.save_for_backward(x, y)
        return x * y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * y, g * x


class _CSum(Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim, ctx.shape = dim, tuple(x.shape)
        return x.sum(dim=dim, keepdim=True)

    @staticmethod
    def backward(ctx, g):
        return g.expand(*ctx.shape), None


def _custom_generators(st):
    """Drawers in the style of tests/test_random_programs.py (``st``: hypothesis's
    strategies, optional at import)."""

    def scale(b):
        i = b.pick()
        c = b.draw(st.sampled_from([-1.5, 0.5, 2.0]))
        b.op("custom_scale", lambda L, P: _CScale.apply(P[i], c))

    def tanh(b):
        i = b.pick()
        b.op("custom_tanh", lambda L, P: _CTanh.apply(P[i]))

    def mul(b):
        i = b.pick()
        j = b.pick(make=lambda: b.bshape(tuple(b.shadow[i].shape)))
        try:
            np.broadcast_shapes(tuple(b.shadow[i].shape), tuple(b.shadow[j].shape))
        except ValueError:
            j = b.leaf(b.bshape(tuple(b.shadow[i].shape)))
        b.op("custom_mul", lambda L, P: _CMul.apply(P[i], P[j]))

    def csum(b):
        i = b.pick(lambda t: t.ndim > 0)
        d = b.dim(b.shadow[i])
        b.op("custom_sum", lambda L, P: _CSum.apply(P[i], d))

    return [scale, tanh, mul, csum]


def test_random_programs_with_custom_functions_compiled_equal_eager():
    """tests/test_compile.py's random programs with custom Functions drawn among the
    registry's ops (a third of the steps): compiled or fallen back, every call gives
    eager's values and leaf gradients."""
    pytest.importorskip("hypothesis")
    pytest.importorskip("torch")
    import os

    from hypothesis import HealthCheck, Phase, given, reject, settings
    from hypothesis import strategies as st
    from test_compile import _compiled_equals_eager
    from test_random_programs import GENERATORS, NAMES, Builder

    customs = _custom_generators(st)
    compiled = []

    @settings(derandomize=True, max_examples=int(os.environ.get("SYMGRAD_COMPILE_FUZZ", 30)),
              deadline=None, database=None, phases=(Phase.explicit, Phase.generate),
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much])
    @given(st.data())
    def run(data):
        b = Builder(data)
        try:
            for _ in range(data.draw(st.integers(1, 3))):
                b.leaf(b.shape())
            for _ in range(data.draw(st.integers(2, 6))):
                if data.draw(st.integers(0, 2)) == 0:
                    data.draw(st.sampled_from(customs))(b)
                else:
                    GENERATORS[data.draw(st.sampled_from(NAMES))](b)
        except RuntimeError:
            reject()
        step = _compiled_equals_eager(b)
        bugs = [r for r in step.stats["fallbacks"] if "sg.compile bug" in r]
        assert not bugs, bugs
        if step._entries() and any(s[1].startswith("custom_") for s in b.steps
                                   if s[0] == "op"):
            compiled.append(1)

    run()
    print(f"{len(compiled)} programs with custom Functions compiled")
    assert compiled  # some programs with custom Functions did compile (not all fell back)
