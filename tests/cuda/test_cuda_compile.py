"""sg.compile on 'cuda', under the simulator.

Whole steps (symgrad/compile/cuda_step.py): MLP training steps compiled on CUDA tensors
equal eager on 'cuda' every step (parameters, .grad, optimizer state, returned loss), with
no host transfer per call; what the CUDA path does not support falls back with a reason.
Fused elementwise runs as numba.cuda kernels (cuda_fused.py): the forward+partials kernel
and the g*P backward kernel of a run, derived by fwdbwd.py from a traced step, against
eager on 'cuda'."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
from _count import Counter
from _tolerance import assert_close

import symgrad as sg
from symgrad.backends.cuda.backend import CudaBackend
from symgrad.compile import cuda_fused


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cc"))


def _group_of(body, shape=(4, 5), seed=3):
    """Trace ``body(x, w)`` (the loss) in a CPU compiled step; its first fused run."""
    sg.manual_seed(seed)
    w = sg.randn(*shape, requires_grad=True)
    x = sg.randn(*shape)

    def fn(x):
        w.grad = None
        loss = body(x, w)
        loss.backward()
        return loss

    step = sg.compile(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(x)
    group = step._entries()[-1].generated.plan.fused_groups[0]
    return group, x, w


def _device_inputs(group, x, w) -> dict:
    arrays = {}
    for j, v in enumerate(group.inputs):
        t = x if v.kind == "arg" else w
        arrays[f"in{j}"] = CudaBackend.from_host(np.ascontiguousarray(t.detach().numpy()))
    return arrays


def _eager_cuda(body, x, w, seeds_out=False):
    xc = x.to("cuda")
    wc = w.detach().to("cuda").requires_grad_()
    loss = body(xc, wc)
    loss.backward()
    return loss, wc


def _run(group, x, w):
    code = cuda_fused.derive(group, group.design)
    name = f"run{group.index}"
    module = cuda_fused.load(name, code)
    dev = _device_inputs(group, x, w)
    n = dev["in0"].size
    dt = group.calls[0].outputs[0].dtype
    keep = {}
    bufs = {k: cuda_fused.flat(a) for k, a in dev.items()}
    names = {p for st in code["stages"] for p in st[2]}
    if code["backward"]:
        names |= set(code["backward"]["params"])
    for p in sorted(names - set(bufs)):
        keep[p] = CudaBackend.empty((n,), dt)
        bufs[p] = cuda_fused.flat(keep[p])
    return code, module, name, bufs, keep


def _chain(x, w):
    h = (x * w).sin() * 1.1
    h = h.tanh() + 0.3
    h = (h * h).exp()
    h = (h - 0.2).sigmoid()
    return ((h * 0.7).relu()).sum()


def test_fused_chain_is_one_cuda_kernel_with_its_gradient():
    """A run into the loss's sum: one kernel writes the chain's value and w's gradient,
    with no host transfer; both equal eager's on 'cuda'."""
    group, x, w = _group_of(_chain)
    d = group.design
    assert d.const == 1.0 and len(d.wrt) == 1
    code, module, name, bufs, keep = _run(group, x, w)
    assert len(code["kernels"]) == 1 and code["backward"] is None
    assert "cuda.grid(1)" in cuda_fused.module_text(name, code)
    with Counter() as c:
        cuda_fused.forward(module, name, code, bufs)
    assert c.launches == 1 and c.transfers == 0
    loss, wc = _eager_cuda(_chain, x, w)
    (ex,) = [f"ex{p}" for p in d.export]
    got_h = CudaBackend.to_host(keep[ex]).sum(dtype=np.float64)
    terms = 12 + w.numel()
    assert_close(np.float32(got_h), loss.detach().cpu(), terms=terms)
    got_g = CudaBackend.to_host(keep[f"r{d.wrt[0]}"]).reshape(w.shape)
    assert_close(got_g, wc.grad.cpu(), terms=terms)


def _two_seeds(x, w):
    h = (x * w).tanh()
    y = h * 2.0 + x
    return y.sum() + (h * h).sum(dim=1).mean()


def test_fused_run_with_two_seeds_forward_and_backward_kernels():
    """Values used outside the run: the forward kernel stores both seeds' partials; the
    backward kernel is g1 * P1 + g2 * P2, fed with the outside gradients on the device."""
    group, x, w = _group_of(_two_seeds)
    d = group.design
    assert d.const is None and len(d.seeds) == 2
    code, module, name, bufs, keep = _run(group, x, w)
    cuda_fused.forward(module, name, code, bufs)
    # the gradients reaching the seeds, as eager computes them: h (the first seed) gets
    # 2 h / rows from the mean of its squares' row sums, y (the second) ones from its sum
    h = np.tanh(x.numpy() * w.detach().numpy())
    incoming = {d.seeds[0]: (2 * h / x.shape[0]).astype(np.float32),
                d.seeds[1]: np.ones_like(h)}
    for p, g in incoming.items():
        keep[f"e{p}"] = CudaBackend.from_host(g.reshape(-1))  # held: the pool reuses blocks
        bufs[f"e{p}"] = cuda_fused.flat(keep[f"e{p}"])
    with Counter() as c:
        cuda_fused.backward(module, name, code, bufs)
    assert c.launches == 1 and c.transfers == 0
    _, wc = _eager_cuda(_two_seeds, x, w)
    got = CudaBackend.to_host(keep[f"r{d.wrt[0]}"]).reshape(w.shape)
    assert_close(got, wc.grad.cpu(), terms=10 + x.shape[1])


# -- whole compiled steps on 'cuda' (cuda_step.py) -----------------------------------------

class _Gelu(sg.nn.Module):
    """GELU (tanh form) from elementary ops, as the benchmark's MLP writes it."""

    def forward(self, x):
        return 0.5 * x * (1 + (0.7978845608 * (x + 0.044715 * x ** 3)).tanh())


_ACTS = {"relu": sg.nn.ReLU, "tanh": sg.nn.Tanh, "gelu": _Gelu}
_OPTS = {"sgd": lambda ps: sg.optim.SGD(ps, lr=0.1),
         "sgd_momentum_wd": lambda ps: sg.optim.SGD(ps, lr=0.1, momentum=0.9,
                                                     weight_decay=1e-2),
         "adam": lambda ps: sg.optim.Adam(ps, lr=1e-2),
         "adamw": lambda ps: sg.optim.AdamW(ps, lr=1e-2, weight_decay=1e-1)}
_SIZES = (5, 8, 3)
_STEPS = 3


def _step_fn(model, opt, loss):
    lossf = sg.nn.functional.mse_loss if loss == "mse" else sg.nn.functional.cross_entropy

    def step(x, y):
        opt.zero_grad()
        out = lossf(model(x), y)
        out.backward()
        opt.step()
        return out
    return step


def _cuda_pair(act, opt, loss):
    sg.manual_seed(0)
    model = sg.nn.Sequential(sg.nn.Linear(_SIZES[0], _SIZES[1]), _ACTS[act](),
                             sg.nn.Linear(_SIZES[1], _SIZES[2])).to("cuda")
    model_e = copy.deepcopy(model)
    o, o_e = _OPTS[opt](model.parameters()), _OPTS[opt](model_e.parameters())
    return (sg.compile(_step_fn(model, o, loss)), _step_fn(model_e, o_e, loss),
            (model, o), (model_e, o_e))


def _cuda_data(i, loss, batch=4):
    sg.manual_seed(100 + i)
    x = sg.randn(batch, _SIZES[0])
    y = sg.randn(batch, _SIZES[-1]) if loss == "mse" else sg.randint(0, _SIZES[-1], (batch,))
    return x.to("cuda"), y.to("cuda")


def _terms(steps):
    # each value is a sum over at most the widest layer plus a few elementwise ops, per
    # step; errors of the steps add up
    return steps * (sum(_SIZES) + 16)


def _assert_same(compiled, eager, steps):
    (model, opt), (model_e, opt_e) = compiled, eager
    terms = _terms(steps)
    for p, q in zip(model.parameters(), model_e.parameters()):
        assert p.device.type == "cuda" and p.grad.device.type == "cuda"
        assert_close(p.detach().cpu(), q.detach().cpu(), terms=terms)
        assert_close(p.grad.cpu(), q.grad.cpu(), terms=terms)
        st, st_e = opt.state.get(p, {}), opt_e.state.get(q, {})
        assert st.keys() == st_e.keys()
        for key, b in st_e.items():
            a = st[key]
            assert a.device == b.device  # Adam's step count stays on the host, as eager's
            assert_close(a.cpu(), b.cpu(), terms=terms)


@pytest.mark.parametrize("act,opt,loss", [
    ("relu", "sgd", "mse"),
    ("tanh", "sgd_momentum_wd", "cross_entropy"),
    ("gelu", "adam", "cross_entropy"),
    ("relu", "adamw", "mse"),
    ("gelu", "sgd_momentum_wd", "mse"),
])
def test_cuda_step_equals_eager_every_step(act, opt, loss):
    """The compiled CUDA step (traced once, then cuda_step's plan) equals eager on 'cuda'
    after every step: loss, parameters, .grad and optimizer state; it never falls back."""
    step, eager, c, e = _cuda_pair(act, opt, loss)
    for i in range(_STEPS):
        x, y = _cuda_data(i, loss)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = step(x, y)
        want = eager(x, y)
        assert got.device.type == "cuda"
        assert_close(got.cpu(), want.detach().cpu(), terms=_terms(i + 1))
        _assert_same(c, e, i + 1)
    assert step.stats["traces"] == 1 and step.stats["fallbacks"] == []
    assert "cuda_step" in step.source()


def test_cuda_step_hot_path_stays_on_the_device():
    """After the trace, a compiled call makes no host<->device transfer (Adam's step count
    lives on the host, as eager keeps it; nll_loss's backward chooses its all-ignored case
on the device where eager's formula reads a count back); reading the loss is the user's
copy."""
    step, eager, c, e = _cuda_pair("gelu", "adam", "cross_entropy")
    x, y = _cuda_data(0, "cross_entropy")
    step(x, y)
    step(x, y)  # the first compiled call
    with Counter() as cnt:
        loss = step(x, y)
    assert cnt.transfers == 0 and cnt.launches > 0
    with Counter() as cnt:
        assert np.isfinite(loss.item())
    assert cnt.d2h >= 1 and cnt.h2d == 0  # the user's read (and the backend's error flag)
    for _ in range(3):
        eager(x, y)
    _assert_same(c, e, 3)


def test_cuda_step_plan_runs_without_tensors():
    """The forward and fused backward kernels run on arrays: the only Tensors a compiled
    call makes are the returned loss (no Node at all)."""
    step, _, _, _ = _cuda_pair("relu", "sgd", "mse")
    x, y = _cuda_data(0, "mse")
    step(x, y)
    made = []
    orig = sg.Tensor.__dict__["_wrap"].__func__

    def counting(cls, *a, **k):
        made.append(1)
        return orig(cls, *a, **k)

    sg.Tensor._wrap = classmethod(counting)
    try:
        step(x, y)
    finally:
        sg.Tensor._wrap = classmethod(orig)
    assert len(made) == 1


def test_cuda_step_with_several_devices_falls_back():
    """Tensors on the CPU and on 'cuda' in one step: eager, with the reason."""
    sg.manual_seed(0)
    a = sg.nn.Linear(3, 2)
    b = sg.nn.Linear(3, 2).to("cuda")
    opt = sg.optim.SGD(list(a.parameters()) + list(b.parameters()), lr=0.1)

    def fn(x, xc):
        opt.zero_grad()
        loss = a(x).sum()
        loss.backward()
        lc = b(xc).sum()
        lc.backward()
        opt.step()
        return loss, lc

    step = sg.compile(fn)
    x = sg.randn(4, 3)
    with pytest.warns(UserWarning, match="several devices"):
        step(x, x.to("cuda"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step(x, x.to("cuda"))
    assert step.stats["traces"] == 1 and not step._entries()


def test_cuda_step_with_custom_function_equals_eager():
    """A custom Function in a CUDA step: its backward's ops (traced) run on the device on
    the incoming gradient and the saved tensor; compiled equals eager every step."""

    class Square(sg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    sg.manual_seed(0)
    w = sg.randn(4, device="cuda").requires_grad_()
    w_e = w.detach().clone().requires_grad_()

    def make(w):
        opt = sg.optim.SGD([w], lr=0.1)

        def fn(x):
            opt.zero_grad()
            loss = (Square.apply(w) * x).sum()
            loss.backward()
            opt.step()
            return loss
        return fn

    step, eager = sg.compile(make(w)), make(w_e)
    for i in range(3):
        x = sg.randn(4).to("cuda")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with Counter() as cnt:
                got = step(x)
        want = eager(x)
        if i:
            assert cnt.transfers == 0
        terms = (i + 1) * 8
        assert_close(got.cpu(), want.detach().cpu(), terms=terms)
        assert_close(w.detach().cpu(), w_e.detach().cpu(), terms=terms)
        assert_close(w.grad.cpu(), w_e.grad.cpu(), terms=terms)
    assert "custom Function Square" in step.source()


def test_cuda_step_follows_lr_changes_and_retraces_on_guards():
    """Hyperparameters are read every call (an LR change is followed, as eager's), and a
    structural change (momentum switched on) retraces instead of running stale code."""
    step, eager, c, e = _cuda_pair("tanh", "sgd", "mse")
    for i in range(2):
        x, y = _cuda_data(i, "mse")
        step(x, y)
        eager(x, y)
    for opt in (c[1], e[1]):
        opt.param_groups[0]["lr"] = 0.03
    x, y = _cuda_data(2, "mse")
    step(x, y)
    eager(x, y)
    _assert_same(c, e, 3)
    assert step.stats["traces"] == 1
    for opt in (c[1], e[1]):
        opt.param_groups[0]["momentum"] = 0.5
    for i in range(3, 5):
        x, y = _cuda_data(i, "mse")
        step(x, y)
        eager(x, y)
    _assert_same(c, e, 5)
    assert step.stats["traces"] == 2 and step.stats["fallbacks"] == []
    assert step.verify().ok  # the retraced entry's (momentum on)


def test_cuda_step_runs_fused_kernels_for_elementwise_runs():
    """The GELU run (8 elementwise ops) is cuda_fused's value+partials kernel and its g*P
    kernel, launched in place of the ops' own kernels; results equal eager's."""
    step, eager, c, e = _cuda_pair("gelu", "sgd", "mse")
    x, y = _cuda_data(0, "mse")
    step(x, y)
    eager(x, y)
    with Counter() as cnt:
        step(x, y)
    eager(x, y)
    assert "fused_0_0" in cnt.names and "fused_0_b" in cnt.names
    assert not any("tanh" in n or "pow" in n for n in cnt.names)
    assert cnt.transfers == 0
    _assert_same(c, e, 2)
    assert "fused kernels fused_0 (mul, pow, mul, add, mul, tanh, add, mul)" in step.source()


def test_cuda_step_fused_run_into_the_loss_writes_the_gradient_in_its_forward():
    """A run whose only seed is the loss's sum: the forward kernel writes the gradient (no
    backward kernel), as on the CPU; compiled equals eager every step."""
    sg.manual_seed(0)
    w = sg.randn(4, 5, device="cuda").requires_grad_()
    w_e = w.detach().clone().requires_grad_()

    def make(w):
        opt = sg.optim.SGD([w], lr=0.05)

        def fn(x):
            opt.zero_grad()
            loss = _chain(x, w)
            loss.backward()
            opt.step()
            return loss
        return fn

    step, eager = sg.compile(make(w)), make(w_e)
    for i in range(3):
        sg.manual_seed(10 + i)
        x = sg.randn(4, 5).to("cuda")
        with Counter() as cnt:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                got = step(x)
        want = eager(x)
        if i:
            assert "fused_0_0" in cnt.names and "fused_0_b" not in cnt.names
            assert cnt.transfers == 0
        terms = (i + 1) * (12 + w.numel())
        assert_close(got.cpu(), want.detach().cpu(), terms=terms)
        assert_close(w.detach().cpu(), w_e.detach().cpu(), terms=terms)
        assert_close(w.grad.cpu(), w_e.grad.cpu(), terms=terms)
