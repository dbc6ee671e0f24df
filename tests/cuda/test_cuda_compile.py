"""sg.compile's fused elementwise runs as numba.cuda kernels (cuda_fused.py), under the
simulator: the forward+partials kernel and the g*P backward kernel of a run, derived by
fwdbwd.py from a traced step, against eager on 'cuda'. Whole CUDA steps still run eagerly
under sg.compile (tests/test_compile.py::test_cuda_arguments_fall_back)."""

from __future__ import annotations

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
