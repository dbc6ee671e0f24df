"""sg.compile: a traced training step gives eager's results, falls back where it must.

Every comparison runs the same step twice from identical copies (deepcopy of the model
and optimizer): once eagerly, once compiled, and compares returned losses, parameters,
``.grad`` and optimizer state after each step. Bounds come from tests/_tolerance.py:
``terms`` counts the roundings one step's values go through (the matmul depths and the
elementwise chain), times the number of steps.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg
from symgrad import nn
from symgrad.nn import functional as F

STEPS = 6


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Generated modules go to a temp dir, not the user's ~/.cache."""
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cc"))


class ComposedGELU(nn.Module):
    """GELU (tanh form) from elementary ops: one fused elementwise run of eight ops."""

    def forward(self, x):
        return 0.5 * x * (1.0 + (0.7978845608 * (x + 0.044715 * x ** 3)).tanh())


def _mlp(act=nn.ReLU, sizes=(4, 16, 3), seed=0):
    sg.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def _step_fn(model, opt, loss="mse"):
    def step(x, y):
        opt.zero_grad()
        out = model(x)
        if loss == "mse":
            value = F.mse_loss(out, y)
        else:
            value = F.cross_entropy(out, y)
        value.backward()
        opt.step()
        return value

    return step


def _pair(make_opt, act=nn.ReLU, loss="mse", sizes=(4, 16, 3)):
    """(compiled step, eager step, compiled model/opt, eager model/opt) from one init."""
    model = _mlp(act, sizes)
    opt = make_opt(model.parameters())
    model_e = copy.deepcopy(model)
    opt_e = make_opt(model_e.parameters())
    return (sg.compile(_step_fn(model, opt, loss)), _step_fn(model_e, opt_e, loss),
            (model, opt), (model_e, opt_e))


def _data(batch, sizes=(4, 16, 3), loss="mse", seed=1):
    sg.manual_seed(seed)
    x = sg.randn(batch, sizes[0])
    y = sg.randn(batch, sizes[-1]) if loss == "mse" else sg.randint(0, sizes[-1], (batch,))
    return x, y


def _terms(sizes, steps):
    return steps * (sum(sizes) + 16)


def _assert_same_state(compiled, eager, steps, sizes):
    (model, opt), (model_e, opt_e) = compiled, eager
    terms = _terms(sizes, steps)
    for p, q in zip(model.parameters(), model_e.parameters()):
        assert_close(p, q, terms=terms)
        assert (p.grad is None) == (q.grad is None)
        if q.grad is not None:
            assert_close(p.grad, q.grad, terms=terms)
    for p, q in zip(model.parameters(), model_e.parameters()):
        st, st_e = opt.state.get(p, {}), opt_e.state.get(q, {})
        assert st.keys() == st_e.keys()
        for key in st_e:
            a, b = st[key], st_e[key]
            if isinstance(b, sg.Tensor):
                assert_close(a, b, terms=terms)
            else:
                assert a == b


def _run_both(step, eager, compiled_pair, eager_pair, data, sizes, steps=STEPS):
    for i in range(steps):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a compiled step must not fall back here
            got = step(*data)
        want = eager(*data)
        assert_close(got, want, terms=_terms(sizes, i + 1))
        _assert_same_state(compiled_pair, eager_pair, i + 1, sizes)


@pytest.mark.parametrize("act", [nn.ReLU, nn.Tanh])
def test_sgd_momentum_mlp_matches_eager(act):
    step, eager, c, e = _pair(lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.9,
                                                      weight_decay=1e-3), act)
    _run_both(step, eager, c, e, _data(8), (4, 16, 3))
    assert step.stats["traces"] == 1


@pytest.mark.parametrize("loss", ["mse", "ce"])
def test_adam_mlp_matches_eager(loss):
    step, eager, c, e = _pair(lambda ps: sg.optim.Adam(ps, lr=1e-2), nn.Tanh, loss)
    _run_both(step, eager, c, e, _data(8, loss=loss), (4, 16, 3))
    st = c[1].state[next(iter(c[0].parameters()))]
    assert float(st["step"]) == STEPS


def test_gelu_mlp_with_adam_matches_eager_and_fuses():
    step, eager, c, e = _pair(lambda ps: sg.optim.Adam(ps, lr=1e-2), ComposedGELU)
    _run_both(step, eager, c, e, _data(8), (4, 16, 3))
    src = step.source()
    # x ** 3 as products in the fused loop, tanh as NumPy's ufunc, one fused backward loop
    assert "fused_0_0(" in src and "np.tanh(" in src and "fused_0_b" in src
    assert "adam_group(" in src


_MORE = {
    "flatten-sigmoid-l1": (lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 8), nn.Sigmoid(),
                                                 nn.Linear(8, 2)), lambda o, y: F.l1_loss(o, y)),
    "softmax": (lambda: nn.Sequential(nn.Linear(12, 8), nn.Softmax(dim=1), nn.Linear(8, 2)),
                lambda o, y: F.mse_loss(o, y)),
    "slice-select-cat-stack-clamp": (
        lambda: nn.Sequential(nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 4)),
        lambda o, y: (sg.cat([o[:, 1:3], o[:, :2].clamp(-0.3, 0.4)], 1)[:, :2]
                      - sg.stack([y[:, 0], o[:, 3].clamp_min(-0.2)], 1)).pow(2).mean()
        + o[1].sum()),
    "sum-dim-mean-dim-pow": (lambda: nn.Sequential(nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 2)),
                             lambda o, y: ((o - y) ** 2).sum(dim=1).mean()
                             + o.mean(dim=0).sum() / 7),
}


@pytest.mark.parametrize("case", sorted(_MORE))
def test_more_ops_match_eager(case):
    make, loss_fn = _MORE[case]
    sg.manual_seed(0)
    model = make()
    model_e = copy.deepcopy(model)
    opt, opt_e = sg.optim.Adam(model.parameters(), lr=1e-2), \
        sg.optim.Adam(model_e.parameters(), lr=1e-2)

    def make_step(m, o):
        def step(x, y):
            o.zero_grad()
            loss = loss_fn(m(x), y)
            loss.backward()
            o.step()
            return loss
        return step

    step, eager = sg.compile(make_step(model, opt)), make_step(model_e, opt_e)
    sg.manual_seed(1)
    x = sg.randn(5, 3, 4) if case.startswith("flatten") else sg.randn(5, 12)
    y = sg.randn(5, 2)
    sizes = (12, 8, 2)
    _run_both(step, eager, (model, opt), (model_e, opt_e), (x, y), sizes, steps=4)


def test_adamw_and_plain_sgd_match_eager():
    for make in (lambda ps: sg.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
                 lambda ps: sg.optim.SGD(ps, lr=0.05)):
        step, eager, c, e = _pair(make)
        _run_both(step, eager, c, e, _data(5), (4, 16, 3), steps=4)


# -- wide layers: products formed column-major, single-op loops (codegen TPROD_MIN) --------
_WIDE = (256, 256, 256, 10)  # 64 x 256 @ 256 x 256 reaches TPROD_MIN


def _wide_step(model, opt, loss, grads):
    """A training step on the wide MLP; ``grads``: "zero_grad", "accumulate" (no zero_grad:
    the gradients add up over calls) or "first_none" (only the first weight's .grad = None)."""
    def step(x, y):
        if grads == "zero_grad":
            opt.zero_grad()
        elif grads == "first_none":
            model[0].weight.grad = None
        out = model(x)
        value = F.mse_loss(out, y) if loss == "mse" else F.cross_entropy(out, y)
        value.backward()
        opt.step()
        return value

    return step


@pytest.mark.parametrize("act,loss,grads", [
    (nn.ReLU, "ce", "zero_grad"), (nn.Tanh, "mse", "zero_grad"),
    (nn.ReLU, "ce", "accumulate"), (nn.ReLU, "mse", "first_none")])
def test_wide_layers_form_products_column_major_and_match_eager(act, loss, grads):
    """``x @ W.t()`` of nn.Linear formed as ``W @ x.T`` into column-major buffers, relu's
    loops (with the bias add for the relu right after the product), the bias gradient as
    a product with ones, cross_entropy's row loops: eager's values over several steps,
    also when .grad is not cleared (the gradients land in the .grad buffers by addition)
    or cleared for one parameter only."""
    model = _mlp(act, _WIDE)
    make = lambda ps: sg.optim.SGD(ps, lr=0.05, momentum=0.9)  # noqa: E731
    opt = make(model.parameters())
    model_e = copy.deepcopy(model)
    opt_e = make(model_e.parameters())
    step = sg.compile(_wide_step(model, opt, loss, grads))
    eager = _wide_step(model_e, opt_e, loss, grads)
    _run_both(step, eager, (model, opt), (model_e, opt_e), _data(64, _WIDE, loss), _WIDE,
              steps=4)
    src = step.source()
    assert src.count("order='F'") >= 2 and "np.matmul(ONES_" in src
    assert ("bias_relu_rows(" in src) == (act is nn.ReLU)
    assert ("relu_rows_b(" in src) == (act is nn.ReLU)
    assert ("log_softmax_sums(" in src and "nll_rows_b(" in src) == (loss == "ce")


def test_a_product_copied_back_row_major_is_formed_as_written_below_tprod_copy_k():
    """256x64 @ 64x256 + bias read by GELU (not a ufunc) reaches TPROD_MIN, but copying
    the column-major product back row-major (a transposing bias add) costs more than it
    saves at k = 64: formed as written, row-major, and eager's values."""
    from symgrad.compile import codegen

    sizes = (64, 256, 10)
    assert 256 * 64 * 256 >= codegen.TPROD_MIN and 64 < codegen.TPROD_COPY_K
    step, eager, c, e = _pair(lambda ps: sg.optim.SGD(ps, lr=0.05), nn.GELU, sizes=sizes)
    _run_both(step, eager, c, e, _data(256, sizes), sizes, steps=2)
    src = step.source()
    assert "order='F'" not in src and not re.search(r"np\.add\(t\d+\.T", src)
    assert re.search(r"np\.matmul\(v\d+, v\d+, out=b\d+\)", src)


def test_wide_products_read_by_other_ops_and_cross_entropy_options():
    """A bias-free ``x @ W.t()`` read by softmax (not a ufunc: copied back row-major; its
    inner dimension reaches TPROD_COPY_K) and one read by relu (stays column-major, relu's
    own loops), and cross_entropy with ignore_index (some targets ignored) and
    reduction="sum"."""
    sg.manual_seed(4)
    ws = [sg.randn(256, 512) * 0.04, sg.randn(256, 256) * 0.06, sg.randn(10, 256) * 0.06]
    ws = [w.detach().requires_grad_() for w in ws]
    ws_e = [sg.tensor(w.detach().numpy().copy(), requires_grad=True) for w in ws]

    def make(ws, opt):
        def fn(x, y):
            opt.zero_grad()
            h = (x @ ws[0].t()).softmax(dim=1) * 10.0
            h = (h @ ws[1].t()).relu()
            out = h @ ws[2].t()
            loss = F.cross_entropy(out, y, ignore_index=3, reduction="sum")
            loss.backward()
            opt.step()
            return loss
        return fn

    step = sg.compile(make(ws, sg.optim.SGD(ws, lr=0.01)))
    eager = make(ws_e, sg.optim.SGD(ws_e, lr=0.01))
    sg.manual_seed(5)
    x = sg.randn(64, 512)
    y = sg.randint(0, 10, (64,))
    assert (y.numpy() == 3).any()
    for i in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = step(x, y)
        want = eager(x, y)
        terms = (i + 1) * (512 + 2 * 256 + 64 + 16)
        assert_close(got, want, terms=terms, scale=magnitude(want.detach().numpy()) * 64)
        for w, w_e in zip(ws, ws_e):
            assert_close(w, w_e, terms=terms)
            assert_close(w.grad, w_e.grad, terms=terms)
    src = step.source()
    assert "np.copyto(b" in src and "relu_rows(" in src and "bias_relu_rows(" not in src
    bad = sg.tensor(np.where(y.numpy() == 0, 10, y.numpy()))  # a target out of range
    with pytest.raises(IndexError):
        eager(x, bad)
    with pytest.raises(IndexError):
        step(x, bad)


class GELUResidual(nn.Module):
    """Exact GELU whose input also feeds a residual: its gradient has two terms."""

    def forward(self, x):
        return F.gelu(x) * 0.5 + x


@pytest.mark.parametrize("act", [nn.GELU, GELUResidual])
def test_exact_gelu_forward_keeps_what_its_backward_needs(act):
    """From FUSED_MIN elements the forward loop keeps (1 + erf) / 2 and exp(-x^2 / 2) and
    the backward is one pass over them; steps equal eager's."""
    sizes = (4, 64, 3)  # 8 x 64 = 512 elements >= FUSED_MIN
    step, eager, c, e = _pair(lambda ps: sg.optim.AdamW(ps, lr=1e-2), act, sizes=sizes)
    _run_both(step, eager, c, e, _data(8, sizes), sizes)
    src = step.source()
    assert "gelu_save(" in src and "gelu_saved_b(" in src


def test_exact_gelu_loops_equal_the_backends_bit_for_bit():
    """gelu_save / gelu_saved_b do the CPU backend's float32 operations in its order: the
    same bits as eager's gelu and GeluBackward0, special values included."""
    from symgrad.backends.cpu.backend import CpuBackend
    from symgrad.compile import fuse

    mod = fuse.loops()
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(2000) * 3, rng.standard_normal(20) * 1e3,
                        [0.0, -0.0, np.nan, np.inf, -np.inf, 3.92, -3.92, 4.0, 1e-30]])
    x = x.astype(np.float32)
    g = rng.standard_normal(x.size).astype(np.float32)
    out, cdf, ex = (np.empty_like(x) for _ in range(3))
    mod.gelu_save(x, out, cdf, ex)
    np.exp(ex, out=ex)
    with np.errstate(all="ignore"):
        assert np.array_equal(out, CpuBackend.gelu(x), equal_nan=True)
        want = CpuBackend.gelu_backward(g, (True,), "none", x)[0]
        got = np.empty_like(x)
        mod.gelu_saved_b(g, x, cdf, ex, got)
    assert np.array_equal(got, want, equal_nan=True)


def _log_softmax_loops(mod, x: np.ndarray) -> np.ndarray:
    """log_softmax of rows as the generated forward does it (rules.forward_code)."""
    z = mod.log_softmax_shift(x, np.empty_like(x))
    e = np.exp(z)
    sums = mod.log_softmax_sums(e, x.dtype.type(0), np.empty((x.shape[0], 1), x.dtype))
    return np.subtract(z, np.log(sums), out=z)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_sums_are_numpys_pairwise_sums(dtype):
    """The loops' row sum (fuse.ROW_HELPERS) is np.add.reduce's along the rows, bit for bit,
    for every row length up to one pairwise block, on magnitudes spread over 12 decades
    (where the order of the additions shows), and signed zeros (a row of -0.0 sums to 0.0
    in NumPy: its sum starts from zero)."""
    from symgrad.compile import fuse

    mod = fuse.loops()
    rng = np.random.default_rng(3)
    for c in range(1, fuse.PAIRWISE_BLOCK + 1):
        x = (rng.standard_normal((40, c)) * 10.0 ** rng.uniform(-6, 6, (40, c))).astype(dtype)
        x[0] = -0.0
        got = mod.log_softmax_sums(x, dtype(0), np.empty((40, 1), dtype))[:, 0]
        np.testing.assert_array_equal(got.view(f"i{x.itemsize}"),
                                      np.add.reduce(x, axis=-1).view(f"i{x.itemsize}"))


def test_single_op_loops_keep_eagers_special_values():
    """fuse.LOOPS against eager's ops on NaN, infinities and signed zeros: relu (0 for
    -0.0), its mask, log_softmax rows forward and backward (eager's bits; a NaN or infinite
    max gives NaN rows), nll_loss."""
    from symgrad.compile import fuse

    mod = fuse.loops()
    nan, inf = float("nan"), float("inf")
    x = np.array([[-0.0, 0.0, nan, -inf, inf, -1.0, 2.0, 3.0]] * 2, np.float32)
    want = F.relu(sg.tensor(x)).numpy()
    got = mod.relu_rows(x, np.empty_like(x))
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))
    g = np.array([[1.0, -1.0, inf, -2.0, nan, 3.0, -5.0, inf]] * 2, np.float32)
    with np.errstate(invalid="ignore"):
        mask = g * (want > 0)
    got = mod.relu_rows_b(g, want, np.empty_like(g))
    assert np.array_equal(got, mask, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(mask))
    rows = np.array([[1.0, 2.0, 3.0], [nan, 0.0, 1.0], [inf, 0.0, 1.0], [-inf, -inf, -inf],
                     [-inf, 0.0, 5.0], [-1e30, 1e30, 0.0]], np.float32)
    want = F.log_softmax(sg.tensor(rows), dim=1).numpy()
    for width in (0, 5, 37, 122):  # rows of 3 to 125: every form of the pairwise sum
        wide = np.concatenate([rows, np.linspace(-3, 3, 6 * width, dtype=np.float32)
                               .reshape(6, width)], axis=1)
        if width > 30:  # NaN and infinities away from the first column (the row max runs
            wide[0, 17], wide[4, 30], wide[5, width] = nan, inf, -inf  # in four partials)
        with np.errstate(all="ignore"):  # eager's inf - inf
            want_w = F.log_softmax(sg.tensor(wide), dim=1).numpy()
            got_w = _log_softmax_loops(mod, wide)
        assert np.isnan(want_w[1]).all()  # a NaN in the row: NaN everywhere
        np.testing.assert_array_equal(got_w, want_w)  # eager's bits, NaN where eager's
        gw = np.linspace(-1, 1, wide.size, dtype=np.float32).reshape(wide.shape)
        gw[1, 2] = -0.0
        t = sg.tensor(wide, requires_grad=True)
        with np.errstate(all="ignore"):
            F.log_softmax(t, dim=1).backward(sg.tensor(gw))
            got_b = mod.log_softmax_rows_b(gw, np.exp(want_w), np.float32(0),
                                           np.empty_like(gw))
        np.testing.assert_array_equal(got_b, t.grad.numpy())
    t = np.array([2, 0, 1, -100, 0, 1], np.int64)
    out = np.empty(2, np.float32)
    fin = np.isfinite(want).all(axis=1)
    for mean in (True, False):
        keep = fin & (t != -100)
        mod.nll_rows(want[keep], t[keep], -100, mean, out)
        loss = F.nll_loss(sg.tensor(want[keep]), sg.tensor(t[keep]),
                          reduction="mean" if mean else "sum")
        assert_close(out[0], loss.numpy(), terms=8)
        assert out[1] == keep.sum()
    grad = mod.nll_rows_b(np.float32(1), t, -100, True, np.float32(5), np.empty((6, 3),
                                                                               np.float32))
    assert grad[3].tolist() == [0, 0, 0] and grad[0, 2] == np.float32(-1 / 5)


def _chain_fn(w, opt):
    def chain(x):
        opt.zero_grad()
        h = (x * w).tanh() + 1.0
        h = (h * h).sigmoid() - x
        h = (h.exp() * 0.5).relu() / 3.0
        loss = (h - x.neg()).sum()
        loss.backward()
        opt.step()
        return loss

    return chain


def test_fused_elementwise_chain_matches_eager():
    sg.manual_seed(3)
    w = sg.randn(6, 5, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)
    opt, opt_e = sg.optim.SGD([w], lr=0.01), sg.optim.SGD([w_e], lr=0.01)
    step, eager = sg.compile(_chain_fn(w, opt)), _chain_fn(w_e, opt_e)
    x = sg.randn(6, 5)
    for i in range(STEPS):
        got, want = step(x), eager(x)
        terms = (i + 1) * (12 + 30)  # 12 chained ops, a sum of 30
        assert_close(got, want, terms=terms, scale=abs(want.detach().numpy()) * 30)
        assert_close(w, w_e, terms=terms)
        assert_close(w.grad, w_e.grad, terms=terms)
    assert "@njit" in step.source() and "fused_0_0(" in step.source()


def test_large_runs_use_parallel_loops(monkeypatch):
    from symgrad.backends.cpu import backend

    monkeypatch.setattr(backend, "PARALLEL_MIN", 16)  # the (6, 5) chain counts as large
    sg.manual_seed(3)
    w = sg.randn(6, 5, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)
    opt, opt_e = sg.optim.SGD([w], lr=0.01), sg.optim.SGD([w_e], lr=0.01)
    step, eager = sg.compile(_chain_fn(w, opt)), _chain_fn(w_e, opt_e)
    x = sg.randn(6, 5)
    for i in range(3):
        got, want = step(x), eager(x)
        terms = (i + 1) * (12 + 30)
        assert_close(got, want, terms=terms, scale=abs(want.detach().numpy()) * 30)
        assert_close(w, w_e, terms=terms)
    src = step.source()
    assert "in prange(" in src and "parallel=True" in src and "_parallel_lock" in src


def test_fused_backward_loops_are_proved_against_sympy(monkeypatch):
    sg.manual_seed(3)
    w = sg.randn(6, 5, requires_grad=True)
    step = sg.compile(_chain_fn(w, sg.optim.SGD([w], lr=0.01)))
    step(sg.randn(6, 5))
    assert step.verify().ok
    assert step.stats["proofs"] and set(step.stats["proofs"].values()) <= {
        "proved", "checked at 16 points"}

    from symgrad.compile import fuse
    from symgrad.compile.prove import prove_plan

    monkeypatch.setenv("SYMGRAD_COMPILE_FWDBWD", "0")  # the plain fused path (fuse.py's loops)
    wrong = dict(fuse._LOCAL, mul=("{g} * {b}", "{g} * {b}"))  # d(a*b)/db = b: wrong
    monkeypatch.setattr(fuse, "_LOCAL", wrong)
    bad = sg.compile(_chain_fn(w, sg.optim.SGD([w], lr=0.01)))
    with pytest.warns(UserWarning, match="differs from eager's on the traced call"):
        bad(sg.randn(6, 5))  # the self-check after generation catches it first
    assert not bad._entries()
    monkeypatch.setattr(sys.modules["symgrad.compile.step"], "self_check",
                        lambda *a: None)
    bad = sg.compile(_chain_fn(w, sg.optim.SGD([w], lr=0.01)))
    # without the self-check, the proof at generation catches it (not step.verify())
    with pytest.warns(UserWarning, match=r"SymPy proof: fused_0_b\d+: .*differs from SymPy"):
        bad(sg.randn(6, 5))
    assert not bad._entries()
    from symgrad.compile import loader
    from symgrad.compile.codegen import generate
    from symgrad.compile.trace import trace

    opt = sg.optim.SGD([w], lr=0.01)  # held: the program refers to it weakly
    _, program, _ = trace(_chain_fn(w, opt), (sg.randn(6, 5),))
    gen = generate(program, sg.backends.backend_for("cpu"))
    with pytest.raises(AssertionError, match="differs from SymPy"):
        prove_plan(loader.load(gen.text), gen.plan)


def _compiled_and_eager(body, shape=(6, 5), seed=3):
    """(compiled fn, eager fn, w, w_e, x): ``body(x, w)`` returns the loss; SGD steps."""
    sg.manual_seed(seed)
    w = sg.randn(*shape, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)
    x = sg.randn(*shape)

    def make(w, opt):
        def fn(x):
            opt.zero_grad()
            loss = body(x, w)
            loss.backward()
            opt.step()
            return loss
        return fn

    step = sg.compile(make(w, sg.optim.SGD([w], lr=0.01)))
    eager = make(w_e, sg.optim.SGD([w_e], lr=0.01))
    return step, eager, w, w_e, x


def _check_steps(step, eager, w, w_e, x, ops, steps=4):
    n = x.numel()
    for i in range(steps):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback
            got = step(x)
        want = eager(x)
        terms = (i + 1) * (ops + n)
        assert_close(got, want, terms=terms, scale=abs(want.detach().numpy()) * n + 1)
        assert_close(w, w_e, terms=terms)
        assert_close(w.grad, w_e.grad, terms=terms)


def _sigmoid_relu_loss(x, w):
    h = (x * w).sigmoid() * 0.5 + x
    return (h.relu() * h).sum()


def _kernels_of(src: str, group: str = "fused_0") -> list[str]:
    return [line for line in src.splitlines() if line.startswith(f"def {group}")]


def test_fused_forward_and_backward_are_one_loop(monkeypatch):
    """A run feeding the loss's sum: its gradient is written by the forward loop itself
    (one loop where the plain fused path has a forward and a backward loop)."""
    step, eager, w, w_e, x = _compiled_and_eager(_sigmoid_relu_loss)
    _check_steps(step, eager, w, w_e, x, ops=7)
    src = step.source()
    assert len(_kernels_of(src)) == 1 and "fused_0_b" not in src
    monkeypatch.setenv("SYMGRAD_COMPILE_FWDBWD", "0")
    plain, eager, w, w_e, x = _compiled_and_eager(_sigmoid_relu_loss)
    _check_steps(plain, eager, w, w_e, x, ops=7)
    assert len(_kernels_of(plain.source())) == 2  # forward loop + backward loop


def test_fused_loop_shares_subexpressions_and_mean_gradient():
    """sigmoid's exp(-|x|) is computed once for its value and its derivative (SymPy cse);
    the mean's 1/n gradient is folded into the forward loop."""
    step, eager, w, w_e, x = _compiled_and_eager(lambda x, w: ((x * w).sigmoid() * x).mean())
    _check_steps(step, eager, w, w_e, x, ops=4)
    src = step.source()
    (kernel,) = _kernels_of(src)
    body = src.split(kernel, 1)[1].split("\n\n", 1)[0]
    assert body.count("m_exp(") == 1 and "r1[k] =" in body
    assert "fused_0_b" not in src


def test_fused_run_with_two_seeds_has_one_backward_loop():
    """A value of the run is also used outside it: the forward stores the partials of both
    seeds, the backward is ``g1 * P1 + g2 * P2`` in one loop, proved by verify()."""
    def body(x, w):
        h = (x * w).tanh()
        y = h * 2.0 + x
        return y.sum() + (h * h).sum(dim=1).mean()

    step, eager, w, w_e, x = _compiled_and_eager(body)
    _check_steps(step, eager, w, w_e, x, ops=10)
    src = step.source()
    assert "def fused_0_b(" in src and "np.tanh(" in src
    report = step.verify()
    assert report.ok and step.stats["proofs"]["fused_0"] in ("proved", "checked at 16 points")


def test_fused_forward_backward_wrong_partial_is_caught(monkeypatch):
    from symgrad.compile import fwdbwd

    step, *_ = _compiled_and_eager(_sigmoid_relu_loss)
    step(sg.randn(6, 5))
    assert step.verify().ok
    assert step.stats["proofs"]["fused_0"] in ("proved", "checked at 16 points")

    describe = fwdbwd.describe

    def wrong(group, d, parallel):  # d(a*b)/db = b: wrong
        desc = describe(group, d, parallel)
        for op in desc["ops"]:
            if op[0] == "mul":
                op[2] = ["g * b", "g * b"]
        return desc

    monkeypatch.setattr(fwdbwd, "describe", wrong)
    bad, *_ = _compiled_and_eager(_sigmoid_relu_loss)
    with pytest.warns(UserWarning, match="differs from eager's on the traced call"):
        bad(sg.randn(6, 5))  # the self-check after generation catches it first
    monkeypatch.setattr(sys.modules["symgrad.compile.step"], "self_check", lambda *a: None)
    bad, *_ = _compiled_and_eager(_sigmoid_relu_loss)
    with pytest.warns(UserWarning, match=r"failed its SymPy proof: fused_0: gradient of x\d+ "
                                         r"differs from SymPy's derivative at"):
        bad(sg.randn(6, 5))  # without the self-check, the proof at generation catches it
    assert not bad._entries()


def test_forward_only_run_stores_only_what_leaves_it():
    """No backward in the step: the fused loop computes no partial and stores only the
    value returned (the plain path stores every intermediate for its backward)."""
    sg.manual_seed(4)
    w = sg.randn(7, 3, dtype=sg.float64)

    def fn(x):
        return (((x * w).tanh() * 2.0 + 1.0).sigmoid() * x).exp()

    step = sg.compile(fn)
    x = sg.randn(7, 3, dtype=sg.float64)
    for _ in range(3):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = step(x)
        assert_close(got, fn(x), terms=8)
    (group,) = step._entries()[-1].generated.plan.fused_groups
    assert not group.design.wrt and len(group.design.export) == 1
    allocs = [line for line in step.source().splitlines() if "= np.empty((7, 3)" in line]
    assert len(allocs) == 1 and "float64(" in step.source()


def test_new_batch_size_retraces_and_stays_equal():
    step, eager, c, e = _pair(lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.9))
    sizes = (4, 16, 3)
    _run_both(step, eager, c, e, _data(8), sizes, steps=3)
    _run_both(step, eager, c, e, _data(3, seed=2), sizes, steps=3)
    assert step.stats["traces"] == 2
    _run_both(step, eager, c, e, _data(8, seed=3), sizes, steps=2)
    assert step.stats["traces"] == 2  # both signatures stay cached


def test_a_full_cache_runs_new_signatures_eagerly_with_a_warning():
    model = _mlp()
    opt = sg.optim.SGD(model.parameters(), lr=0.1)
    model_e = copy.deepcopy(model)
    opt_e = sg.optim.SGD(model_e.parameters(), lr=0.1)
    step = sg.compile(cache_size=1)(_step_fn(model, opt))
    eager = _step_fn(model_e, opt_e)
    assert_close(step(*_data(4)), eager(*_data(4)))
    with pytest.warns(UserWarning, match="cache_size"):
        got = step(*_data(5))
    assert_close(got, eager(*_data(5)), terms=_terms((4, 16, 3), 2))
    _assert_same_state((model, opt), (model_e, opt_e), 2, (4, 16, 3))
    assert step.stats["traces"] == 1


def test_lr_change_is_read_each_call():
    step, eager, c, e = _pair(lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.5))
    data = _data(4)
    _run_both(step, eager, c, e, data, (4, 16, 3), steps=2)
    for opt in (c[1], e[1]):
        opt.param_groups[0]["lr"] = 0.01
    _run_both(step, eager, c, e, data, (4, 16, 3), steps=2)
    assert step.stats["traces"] == 1


def test_scalar_argument_is_part_of_the_signature():
    step, eager, c, e = _pair(lambda ps: sg.optim.SGD(ps, lr=0.1))
    x, y = _data(4)

    def scaled(f):
        return lambda x, y, k: f(x * k, y)

    s, r = sg.compile(scaled(step.fn)), scaled(eager)
    for k in (1.0, 2.0, 1.0):
        assert_close(s(x, y, k), r(x, y, k), terms=_terms((4, 16, 3), 3))
        _assert_same_state(c, e, 3, (4, 16, 3))
    assert s.stats["traces"] == 2


def test_a_new_param_group_retraces():
    step, eager, c, e = _pair(lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.9))
    data = _data(4)
    _run_both(step, eager, c, e, data, (4, 16, 3), steps=2)
    for _model, opt in (c, e):
        extra = sg.zeros(3, requires_grad=True)
        opt.add_param_group({"params": [extra]})
    _run_both(step, eager, c, e, data, (4, 16, 3), steps=2)
    assert step.stats["traces"] == 2


def test_untraceable_fn_falls_back_with_a_warning():
    model = _mlp()
    opt = sg.optim.SGD(model.parameters(), lr=0.1)
    model_e, opt_e = copy.deepcopy(model), None
    opt_e = sg.optim.SGD(model_e.parameters(), lr=0.1)
    x, y = _data(4)

    def make(m, o):
        def step(x, y):
            o.zero_grad()
            loss = F.mse_loss(m(x), y)
            if loss.item() > 0:  # data-dependent Python control flow
                loss.backward()
                o.step()
            return loss
        return step

    step = sg.compile(make(model, opt))
    eager = make(model_e, opt_e)
    with pytest.warns(UserWarning, match=r"Tensor.item\(\)"):
        got = step(x, y)
    assert_close(got, eager(x, y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            assert_close(step(x, y), eager(x, y), terms=_terms((4, 16, 3), 4))
    for p, q in zip(model.parameters(), model_e.parameters()):
        assert_close(p, q, terms=_terms((4, 16, 3), 4))


@pytest.mark.parametrize("case", ["hook", "anomaly", "inplace", "amsgrad", "arg_type",
                                  "setitem", "init", "kwargs"])
def test_fallback_reasons(case):
    model = _mlp()
    opt = (sg.optim.Adam(model.parameters(), amsgrad=True) if case == "amsgrad"
           else sg.optim.SGD(model.parameters(), lr=0.1))
    x, y = _data(4)

    def fn(x, y, *extra):
        opt.zero_grad()
        out = model(x)
        if case == "inplace":  # on a view (in-place ops on other intermediates compile)
            y = y * 1
            y[:, :1].mul_(2)
        if case == "setitem":
            out = out * 1
            out[0] = 0.0
        if case == "init":
            nn.init.zeros_(model[0].bias)
        loss = F.mse_loss(out, y)
        loss.backward()
        opt.step()
        return loss

    if case == "hook":
        model[0].register_forward_hook(lambda *a: None)
    step = sg.compile(fn)
    match = {"hook": "hooks", "anomaly": "anomaly", "inplace": "in-place op mul_ on a view",
             "amsgrad": "amsgrad", "arg_type": "argument 2", "setitem": "in-place indexing",
             "init": "nn.init", "kwargs": "keyword"}[case]
    with pytest.warns(UserWarning, match=match):
        if case == "anomaly":
            with sg.autograd.detect_anomaly():
                step(x, y)
        elif case == "arg_type":
            step(x, y, object())  # a non-tensor, non-scalar argument
        elif case == "kwargs":
            step(x, y=y)
        else:
            step(x, y)
    assert step.stats["fallbacks"]


def test_a_compiled_step_inside_a_compiled_step_is_traced_through():
    step, eager, c, e = _pair(lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.9))
    outer, outer_e = sg.compile(lambda x, y: step(x, y) * 2), (lambda x, y: eager(x, y) * 2)
    step(*_data(4))  # the inner step compiled on its own first
    eager(*_data(4))
    for _ in range(3):
        assert_close(outer(*_data(4)), outer_e(*_data(4)), terms=_terms((4, 16, 3), 4))
    _assert_same_state(c, e, 4, (4, 16, 3))
    assert outer.stats["traces"] == 1 and not outer.stats["fallbacks"]


def test_generated_code_that_disagrees_with_the_traced_call_falls_back(monkeypatch):
    """The self-check: a wrong rule (or an unseen side effect) never reaches a second call."""
    from symgrad.compile import rules

    monkeypatch.setitem(rules.RULES, "mse_loss", lambda c, ctx, g: {
        0: f"(({ctx.ref(c.inputs[0])} - {ctx.ref(c.inputs[1])}) * {g})"})  # missing 2/n
    step, eager, c, e = _pair(lambda ps: sg.optim.SGD(ps, lr=0.1))
    with pytest.warns(UserWarning, match="differs from eager's on the traced call"):
        step(*_data(4))
    eager(*_data(4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            assert_close(step(*_data(4)), eager(*_data(4)), terms=_terms((4, 16, 3), 3))
    _assert_same_state(c, e, 3, (4, 16, 3))


def test_other_device_arguments_fall_back():
    """cpu and cuda steps compile (CUDA ones: tests/cuda/test_cuda_compile.py); a tensor
    on any other device type makes the signature run eagerly, saying so."""
    from symgrad.compile.guards import signature

    class FakeDevice:
        type = "xla"

    t = sg.randn(2)
    t._device = FakeDevice()
    key, reason = signature((t,))
    assert key is None and "xla" in reason


def test_source_and_no_tensors_in_the_hot_path(monkeypatch):
    step, eager, c, e = _pair(lambda ps: sg.optim.Adam(ps, lr=1e-2))
    x, y = _data(8)
    step(x, y)
    step(x, y)
    src = step.source()
    assert "def run(A, L, E, H):" in src and "np.matmul" in src
    assert "Tensor" not in src and "grad_fn" not in src
    made = []
    wrap = sg.Tensor.__dict__["_wrap"].__func__

    def counting(cls, *a, **k):
        made.append(1)
        return wrap(cls, *a, **k)

    monkeypatch.setattr(sg.Tensor, "_wrap", classmethod(counting))
    from symgrad.autograd import node

    created = []
    monkeypatch.setattr(node.Node, "__init__",
                        lambda self, *a, **k: created.append(1) or None, raising=False)
    step(x, y)
    assert len(made) == 1  # the returned loss only
    assert not created


def test_the_step_keeps_no_tensor_alive_by_itself():
    """No reference cycle: dropping the step (and the fn closing over the model) frees the
    parameters at once, without the cycle collector."""
    import gc
    import weakref

    def build():
        step, _, (model, _), _ = _pair(lambda ps: sg.optim.Adam(ps, lr=1e-2))
        x, y = _data(4)
        step(x, y)
        step(x, y)
        return step, weakref.ref(next(iter(model.parameters())))

    gc.disable()
    try:
        step, ref = build()
        assert ref() is not None
        del step
        assert ref() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("act", [nn.Tanh, ComposedGELU])
def test_verify_returns_an_ok_report(act):
    step, _, (model, _), _ = _pair(lambda ps: sg.optim.Adam(ps, lr=1e-2), act)
    x, y = _data(4)
    step(x, y)
    before = [p.detach().numpy().copy() for p in model.parameters()]
    report = step.verify()
    assert report.ok, report
    for p, b in zip(model.parameters(), before):  # verify has no side effect
        assert np.array_equal(p.detach().numpy(), b)


def test_verify_catches_generated_code_that_disagrees(monkeypatch):
    from symgrad.compile import rules

    monkeypatch.setattr(sys.modules["symgrad.compile.step"], "self_check", lambda *a: None)
    step, _, _, _ = _pair(lambda ps: sg.optim.SGD(ps, lr=0.1), nn.Tanh)
    monkeypatch.setitem(rules.RULES, "addmm", lambda c, ctx, g: {
        0: g, 1: f"np.matmul({g}, {ctx.ref(c.inputs[2])}.T)",
        2: f"(2 * np.matmul({ctx.ref(c.inputs[1])}.T, {g}))"})  # a wrong weight gradient
    step(*_data(4))
    report = step.verify()  # a report, not an exception, naming the gradient
    assert not report.ok and report.status == "mismatch"
    assert report.bad_kernel.startswith("gradient of leaf")
    assert "generated code differs from eager" in str(report)


_CHILD = textwrap.dedent("""
    import json, sys
    import numba
    import symgrad as sg
    from symgrad import nn
    from symgrad.nn import functional as F
    sg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    opt = sg.optim.SGD(model.parameters(), lr=0.1)

    @sg.compile
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    @sg.compile
    def chain(x):
        opt.zero_grad()
        h = model(x).tanh() * 2.0 + 1.0
        loss = (h.sigmoid() * h).sum()
        loss.backward()
        opt.step()
        return loss

    x, y = sg.randn(16, 4), sg.randn(16, 2)
    for _ in range(3):
        step(x, y)
        chain(x)
    from symgrad.compile.fuse import cache_stats
    stats = cache_stats()
    stats["sympy"] = "sympy" in sys.modules
    print(json.dumps(stats))
""")


def test_disk_cache_second_process_compiles_nothing(tmp_path):
    env = dict(os.environ, SYMGRAD_COMPILE_CACHE=str(tmp_path), NUMBA_CACHE_DIR=str(tmp_path))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["kernels"] >= 1 and first["compiled"] >= 1
    assert second["kernels"] == first["kernels"]
    assert second["compiled"] == 0 and second["loaded"] == first["kernels"]
    assert not second["sympy"]  # the fused runs' derivations come from the cache too


_LOOPS_CHILD = textwrap.dedent("""
    import json
    import symgrad as sg
    from symgrad import nn
    from symgrad.compile.fuse import loops

    sg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 3))
    opt = sg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @sg.compile
    def step(x, y):
        opt.zero_grad()
        loss = sg.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    x, y = sg.randn(128, 4), sg.randint(0, 3, (128,))
    step(x, y)
    step(x, y)
    assert not step.stats["fallbacks"], step.stats["fallbacks"]
    mod = loops()
    used = ("relu_rows", "relu_rows_b", "log_softmax_sums", "nll_rows", "sgd_group")
    print(json.dumps({"file": mod.__file__, "source": step.source(), **{
        n: [sum(getattr(mod, n).stats.cache_misses.values()),
            sum(getattr(mod, n).stats.cache_hits.values())] for n in used}}))
""")


def test_shared_loops_are_not_compiled_again_for_an_empty_compile_cache(tmp_path, capsys):
    """The single-op loops and the optimizer updates are fixed code: kept with the CPU
    backend's kernels, so a process whose compile cache is empty (a new cache dir) loads
    them instead of compiling them again (LeNet's first call spent most of its time so)."""
    exec(compile(_LOOPS_CHILD, "loops_child", "exec"), {})  # here: the loops are compiled
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # or loaded
    # a new process with a new (empty) compile cache; the backend's kernel cache as the
    # suite has it
    env = dict(os.environ, SYMGRAD_COMPILE_CACHE=str(tmp_path / "empty"))
    out = subprocess.run([sys.executable, "-c", _LOOPS_CHILD], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    second = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("relu_rows", "relu_rows_b", "log_softmax_sums", "nll_rows", "sgd_group"):
        assert name + "(" in second["source"]
        assert second[name][0] == 0 and second[name][1] >= 1, (name, second[name])
    assert first["file"] == second["file"] and not first["file"].startswith(str(tmp_path))


def _fuzz_fn(steps, leaves, weights):
    """fn of a random program: leaves (parameters) and loss weights live outside it."""
    def fn():
        for x in leaves:
            x.grad = None
        pool, it = [], iter(leaves)
        for step in steps:
            value = next(it) if step[0] == "leaf" else step[2](sg, pool)
            pool.extend(value if isinstance(value, tuple) else (value,))  # split's pieces
        loss = None
        for t, w in zip(pool, weights):
            if w is not None and t.requires_grad:
                term = (t * w).sum()
                loss = term if loss is None else loss + term
        if loss is not None:
            loss.backward()
        return tuple(pool)

    return fn


def _compiled_equals_eager(b):
    """Compile the drawn program ``b`` and check three calls against eager: results, and
    the leaves' gradients (tolerances from the pool's element count). Returns the step."""
    rng = np.random.default_rng(5)
    weights = [sg.tensor(rng.uniform(-1, 1, tuple(t.shape)), dtype=t.dtype)
               if t.dtype.is_floating_point else None for t in b.shadow]
    arrays = [s[1] for s in b.steps if s[0] == "leaf"]
    sides = []
    for _ in range(2):
        leaves = [sg.tensor(a.copy(), requires_grad=True) for a in arrays]
        sides.append((leaves, _fuzz_fn(b.steps, leaves, weights)))
    (leaves_c, fn_c), (leaves_e, fn_e) = sides
    step = sg.compile(fn_c)
    n = sum(max(int(np.prod(t.shape)), 1) for t in b.shadow) + len(b.steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallbacks are expected for many programs
        for _ in range(3):
            got, want = step(), fn_e()
            pool = magnitude(*[t.detach().numpy() for t in want])
            for x, y in zip(got, want):
                assert tuple(x.shape) == tuple(y.shape) and x.dtype == y.dtype
                assert_close(x, y, terms=n, scale=max(magnitude(y.detach().numpy()), pool))
            for k, (p, q) in enumerate(zip(leaves_c, leaves_e)):
                assert (p.grad is None) == (q.grad is None), f"leaf {k}"
                if q.grad is not None:
                    assert_close(p.grad, q.grad, terms=2 * n,
                                 scale=max(magnitude(q.grad.numpy()), pool),
                                 msg=f"leaf {k}")
    return step


def test_random_programs_compiled_equal_eager():
    """Programs drawn from the whole op registry (tests/test_random_programs.py's drawers):
    compiled or fallen back, every call gives eager's values and leaf gradients."""
    pytest.importorskip("hypothesis")
    pytest.importorskip("torch")
    from hypothesis import HealthCheck, Phase, given, reject, settings
    from hypothesis import strategies as st
    from test_random_programs import EXTRA, GENERATORS, NAMES, Builder

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
            for _ in range(data.draw(st.integers(1, 6))):
                if data.draw(st.integers(0, 9)) == 0:
                    data.draw(st.sampled_from(EXTRA))(b)
                else:
                    GENERATORS[data.draw(st.sampled_from(NAMES))](b)
        except RuntimeError:  # a drawer's rare invalid program (not what is tested here)
            reject()
        _compiled_equals_eager(b)

    run()


# -- ops with several outputs: split / chunk / unbind (one node) -----------------------------

class GLU(nn.Module):
    """``a * sigmoid(b)`` of the two halves of the last dim (``chunk``: one SplitBackward0)."""

    def forward(self, h):
        a, b = h.chunk(2, -1)
        return a * b.sigmoid()


class SplitUnbind(nn.Module):
    """Uneven ``split`` with an unused piece (its gradient is zeros) and ``unbind``."""

    def forward(self, h):
        a, _, c = h.split([3, 2, 3], dim=1)
        rows = (a * c).unbind(0)
        return sg.stack([rows[0] * 2.0, rows[-1]], 0).tanh() + a[:2]


class ChunkHeads(nn.Module):
    """Attention-style pieces: each half viewed as (2, 2) and transposed, so its gradient
    reaches the split as a transposed view reshaped (written into the join directly)."""

    def forward(self, h):
        a, b = h.chunk(2, -1)
        n = h.shape[0]
        a2, b2 = a.view(n, 2, 2).transpose(1, 2), b.view(n, 2, 2).transpose(1, 2)
        return (a2 * b2.sigmoid()).reshape(n, 4)


@pytest.mark.parametrize("block,width,opt_kind",
                         [(GLU, 4, "sgd"), (GLU, 4, "momentum"), (SplitUnbind, 3, "sgd"),
                          (ChunkHeads, 4, "momentum")],
                         ids=["glu-sgd", "glu-momentum", "split-unbind-sgd", "heads-momentum"])
def test_several_output_ops_run_compiled_and_equal_eager(block, width, opt_kind):
    """chunk/split/unbind compile (forward: the pieces as views; backward: concatenate or
    stack of the pieces' gradients, zeros for unused pieces): no eager fallback, several
    SGD steps equal eager's."""
    sg.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), block(), nn.Linear(width, 3))
    model_e = copy.deepcopy(model)
    kw = {"lr": 0.05, "momentum": 0.9} if opt_kind == "momentum" else {"lr": 0.05}
    opt, opt_e = sg.optim.SGD(model.parameters(), **kw), sg.optim.SGD(model_e.parameters(), **kw)
    step, eager = _step_fn(model, opt), _step_fn(model_e, opt_e)
    step = sg.compile(step)
    batch = 2 if block is SplitUnbind else 6
    _run_both(step, eager, (model, opt), (model_e, opt_e), _data(batch), (4, 8, 3))
    assert step.stats["traces"] == 1 and step.stats["fallbacks"] == []
    src = step.source()
    # the join: into a buffer of make(), each piece without a reshape's copy
    assert "cat_into(gcat" in src and "np.concatenate((" not in src
    assert ("np.stack((" in src) == (block is SplitUnbind)
    joins = [line for line in src.splitlines() if "cat_into(" in line]
    assert any(re.search(r"\(np\.swapaxes\(.*\), \(6, 4\)\)", line) for line in joins) == \
        (block is ChunkHeads)
    # the unused middle piece joins as a bound zeros constant (Z<value>_<k>)
    assert any(re.search(r"\bZ\d+_\d+\b", line) for line in joins) == (block is SplitUnbind)


def test_cat_into_equals_concatenate_of_the_reshaped_pieces():
    """runtime.cat_into: a piece viewed in the slice's place (a transposed view split
    across a dim), one whose slice cannot be viewed so (flat: reshaped first), a plain one."""
    from symgrad.compile.runtime import cat_into

    rng = np.random.default_rng(0)
    a = np.swapaxes(rng.standard_normal((4, 2, 3)), 1, 2)  # (4, 3, 2) -> (4, 6), a view
    b = rng.standard_normal(8)  # -> (4, 2): the slice out[:, 6:8] is not flat
    c = rng.standard_normal((4, 1))
    parts = ((a, (4, 6)), (b, (4, 2)), (c, (4, 1)))
    want = np.concatenate([x.reshape(shape) for x, shape in parts], axis=1)
    out = np.full((4, 9), np.nan)
    assert cat_into(out, 1, parts) is out
    assert np.array_equal(out, want)


def test_cat_with_an_empty_legacy_input_compiles():
    """cat skips an empty 1-D input (torch's legacy rule); its gradient is empty (found by
    the custom-Function fuzz: the code generator raised KeyError)."""
    a, e, b = sg.randn(3, requires_grad=True), sg.zeros(0, requires_grad=True), \
        sg.randn(2, requires_grad=True)

    def fn():
        for t in (a, e, b):
            t.grad = None
        loss = (sg.cat([a, e, b]) * 2.0).sum()
        loss.backward()
        return loss

    step = sg.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            step()
    assert step._entries()
    assert np.array_equal(a.grad.numpy(), np.full(3, 2.0, np.float32))
    assert e.grad is not None and tuple(e.grad.shape) == (0,)


def test_a_code_generation_crash_falls_back_with_a_warning(monkeypatch):
    """fn already ran eagerly when code generation starts: a bug there must not raise
    out of the call, only keep the signature eager (and say it is a bug)."""
    from symgrad.compile import rules

    def broken(c, ctx, g):
        raise KeyError("boom")

    monkeypatch.setitem(rules.RULES, "mse_loss", broken)
    step, eager, c, e = _pair(lambda ps: sg.optim.SGD(ps, lr=0.1))
    with pytest.warns(UserWarning, match=r"code generation failed \(a sg.compile bug: "
                                         r"KeyError"):
        got = step(*_data(4))
    assert_close(got, eager(*_data(4)))
    _assert_same_state(c, e, 1, (4, 16, 3))


@pytest.mark.parametrize("cut", ["split", "split_sizes", "chunk"])
def test_split_transpose_and_permute_compile_to_numpy_views(cut):
    """split / split_with_sizes / chunk, transpose and permute (negative dims too) are
    NumPy views in the generated code, not the op's call per step: the pieces alias the
    input as eager's do, and values and gradients are eager's bit for bit."""
    sg.manual_seed(3)
    w = sg.randn(6, 12, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)

    def make(w):
        def fn(x):
            w.grad = None
            h = (x @ w).reshape(2, 3, 12)
            if cut == "split":
                a, b, c = h.split(4, dim=-1)
            elif cut == "split_sizes":
                a, b, c = h.split([4, 4, 4], dim=2)
            else:
                a, b, c = h.chunk(3, dim=-1)
            q = a.reshape(2, 3, 2, 2).transpose(1, -2)      # (2, 2, 3, 2)
            k = b.reshape(2, 3, 2, 2).permute(0, 2, -1, 1)  # (2, 2, 2, 3)
            loss = ((q @ k) * c.reshape(2, 3, 2, 2).permute(0, 2, 1, 3).sum()).sum()
            loss.backward()
            return loss
        return fn

    step, eager = sg.compile(make(w)), make(w_e)
    x = sg.randn(6, 6)
    for _ in range(2):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = step(x)
        want = eager(x)
        np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())
        np.testing.assert_array_equal(w.grad.numpy(), w_e.grad.numpy())
    src = step.source()
    assert not re.search(r"fwd_(split|transpose|permute|chunk)", src), src
    assert ".transpose((0, 2, 1, 3))" in src and ".transpose((0, 2, 3, 1))" in src
    assert re.search(r"= v\d+\[:, :, 0:4\]", src) and re.search(r"= v\d+\[:, :, 8:12\]", src)
