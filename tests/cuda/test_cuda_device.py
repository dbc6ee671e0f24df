"""The device model on "cuda" (simulator in CI): launches and host transfers per op, exact
device memory, device errors, moving tensors and models, and kernels the parity tests
reach only partly (split reductions, atomics, random numbers, fused backward)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad.backends.cuda import allocator
from symgrad.backends.cuda.backend import CudaBackend as B

R = np.random.default_rng(0)


@pytest.fixture
def counters():
    """Kernel launches and host<->device transfers, counted at numba's own entry points."""
    from tests.cuda._count import Counter

    with Counter() as c:
        yield c


def dev(*shape, requires_grad=False, dtype=np.float32):
    return sg.tensor(R.uniform(-1, 1, size=shape).astype(dtype), device="cuda",
                     requires_grad=requires_grad)


# -- launches and host transfers -------------------------------------------------------------
OPS = [
    # (id, fn, inputs, launches: exact count where the op is one fused kernel, else None)
    ("add", lambda x, y: x + y, [(3, 4), (3, 4)], 1),
    ("add_broadcast", lambda x, y: x + y, [(3, 4), (4,)], 1),
    ("mul_scalar", lambda x: x * 2.5, [(3, 4)], 1),
    ("exp", lambda x: x.exp(), [(5,)], 1),
    ("sigmoid", lambda x: x.sigmoid(), [(5,)], 1),
    ("where", lambda x, y: sg.where(x > 0, x, y), [(3, 4), (3, 4)], 2),
    ("sum_all", lambda x: x.sum(), [(3, 4)], 1),
    ("sum_dim", lambda x: x.sum(1), [(3, 4)], 1),
    ("sum_split", lambda x: x.sum(), [(80,)], 2),  # long row: partials, then their sum
    ("mean", lambda x: x.mean(0), [(3, 4)], 1),
    ("max_dim", lambda x: x.max(1).values, [(3, 4)], None),
    ("argmax", lambda x: x.argmax(), [(3, 4)], 1),
    ("mm", lambda x, y: x @ y, [(3, 4), (4, 5)], 1),
    ("bmm", lambda x, y: x @ y, [(2, 3, 4), (2, 4, 5)], 1),
    ("mm_transposed_views", lambda x, y: x.t() @ y.t(), [(4, 3), (5, 4)], 1),
    ("transpose_view", lambda x: x.t(), [(3, 4)], 0),
    ("expand_view", lambda x: x.expand(3, 4), [(4,)], 0),
    ("slice_view", lambda x: x[1:, ::2], [(3, 4)], 0),
    ("reshape_copy", lambda x: x.t().reshape(12), [(3, 4)], 1),
    ("gather", lambda x, i: x[i], [(4, 3), "index"], 1),
    ("softmax", lambda x: x.softmax(1), [(3, 4)], None),
    ("logsumexp", lambda x: x.logsumexp(1), [(3, 4)], None),
    ("cat", lambda x, y: sg.cat([x, y]), [(2, 3), (1, 3)], 2),
    ("cast", lambda x: x.double(), [(3,)], 1),
    ("relu_backward", lambda x: x.relu(), [(3, 4)], None),
]


@pytest.mark.parametrize("case", OPS, ids=[c[0] for c in OPS])
def test_ops_launch_kernels_without_host_transfers(case, counters):
    _, fn, shapes, launches = case
    xs = []
    for s in shapes:
        if s == "index":
            xs.append(sg.tensor([2, 0, 2], device="cuda"))
        else:
            xs.append(dev(*s, requires_grad=True))
    counters.reset()
    out = fn(*xs)
    assert counters.transfers == 0, counters.names
    if launches is not None:
        assert counters.launches == launches, counters.names
    else:
        assert counters.launches >= 1
    assert out.device == sg.device("cuda:0")
    # the backward runs on the device too, with no host copy
    counters.reset()
    out.sum().backward() if out.dtype.is_floating_point else None
    assert counters.transfers == 0, counters.names
    for x in xs:
        if x.requires_grad and x.grad is not None:
            assert x.grad.device == sg.device("cuda:0")


def test_training_step_stays_on_the_device(counters):
    """forward, loss, backward and an SGD update: kernels only, not one host copy."""
    model = sg.nn.Sequential(sg.nn.Linear(4, 8), sg.nn.ReLU(), sg.nn.Linear(8, 2)).to("cuda")
    opt = sg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = dev(5, 4), dev(5, 2)
    for _ in range(2):
        counters.reset()
        opt.zero_grad()
        loss = sg.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        assert counters.transfers == 0, counters.names
        assert counters.launches > 5
    assert loss.item() == float(loss.cpu())  # the same device value, copied twice: exact


def test_transfers_happen_exactly_at_to_and_item(counters):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    sg.tensor(0.0, device="cuda")  # the backend's one-time set-up (its error flag) first:
    counters.reset()  # run alone, this test would otherwise count that launch
    x = sg.tensor(a, device="cuda")
    assert (counters.h2d, counters.d2h, counters.launches) == (1, 0, 0)
    counters.reset()
    back = x.cpu()
    assert (counters.h2d, counters.d2h) == (0, 1)
    np.testing.assert_array_equal(back.numpy(), a)
    counters.reset()
    assert x[1, 2].item() == 5.0
    assert counters.d2h == 1


def test_launch_counter_of_the_backend_agrees_with_numba(counters):
    from symgrad.backends.cuda import kernels

    x, y = dev(3, 4, requires_grad=True), dev(4, 2)
    before = kernels.stats["launches"]
    counters.reset()
    ((x @ y).tanh() * 2).sum().backward()
    assert kernels.stats["launches"] - before == counters.launches > 0


# -- memory ----------------------------------------------------------------------------------
def test_device_memory_is_exact_bytes_and_views_are_free(no_gc):
    base = sg.cuda.memory_allocated()
    live = allocator.live_bytes()
    x = sg.zeros(3, 5, device="cuda")  # float32
    assert sg.cuda.memory_allocated() - base == 60
    assert sg.memory_allocated("cuda") - base == 60
    v = x.t()[1:]  # views share the storage
    e = x[0].expand(4, 5)
    assert sg.cuda.memory_allocated() - base == 60
    y = sg.ones(7, dtype=sg.float64, device="cuda")
    assert sg.cuda.memory_allocated() - base == 60 + 56
    assert allocator.live_bytes() - live == 60 + 56  # the allocator sees the same bytes
    del x
    assert sg.cuda.memory_allocated() - base == 60 + 56  # views keep the block alive
    del v, e
    assert sg.cuda.memory_allocated() - base == 56
    assert allocator.live_bytes() - live == 56
    del y
    assert sg.cuda.memory_allocated() == base and allocator.live_bytes() == live


def test_peak_reserved_and_empty_cache(no_gc):
    sg.cuda.reset_peak_memory_stats()
    base = sg.cuda.memory_allocated()
    x = sg.zeros(1000, device="cuda")
    assert sg.cuda.max_memory_allocated() == base + 4000
    reserved = sg.cuda.memory_reserved()
    assert reserved >= 4096  # blocks are 512-byte multiples
    del x
    assert sg.cuda.memory_allocated() == base
    assert sg.cuda.max_memory_allocated() == base + 4000
    assert sg.cuda.memory_reserved() == reserved  # cached for reuse
    y = sg.zeros(1000, device="cuda")  # reuses the cached block
    assert sg.cuda.memory_reserved() == reserved
    del y
    sg.cuda.empty_cache()
    assert sg.cuda.memory_reserved() <= reserved - 4096
    sg.cuda.reset_peak_memory_stats()
    assert sg.cuda.max_memory_allocated() == base


def test_graph_frees_device_memory_after_backward(no_gc):
    base = sg.cuda.memory_allocated()
    w = dev(4, 4, requires_grad=True)
    x = dev(3, 4)
    loss = (x @ w).tanh().sum()
    assert sg.cuda.memory_allocated() > base + 2 * 64
    loss.backward()
    # w, x, loss and w.grad remain; the graph's saved tensors are gone
    assert sg.cuda.memory_allocated() - base == 64 + 48 + 4 + 64
    del w, x, loss
    assert sg.cuda.memory_allocated() == base


def test_mlp_memory_trace_on_cuda_is_byte_exact(no_gc):
    from tests.test_memory_trace import SMALL, test_memory_trace_is_byte_exact

    test_memory_trace_is_byte_exact("cuda", SMALL, None)


# -- errors and the device model -------------------------------------------------------------
def test_device_mismatch_is_torchs_error():
    a, b = sg.ones(2, device="cuda"), sg.ones(2)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, "
                       r"but found at least two devices, (cuda:0 and cpu|cpu and cuda:0)!"):
        a + b
    with pytest.raises(RuntimeError, match="same device"):
        sg.mm(sg.ones(2, 2), sg.ones(2, 2, device="cuda"))


def test_no_gpu_error_names_the_simulator_variable():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    code = ("import symgrad as sg\nassert not sg.cuda.is_available()\n"
            "assert sg.cuda.device_count() == 0\n"
            "try:\n    sg.zeros(2, device='cuda')\nexcept RuntimeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "CUDA is not available" in out.stdout and "NUMBA_ENABLE_CUDASIM=1" in out.stdout


def test_import_symgrad_does_not_import_numba_cuda():
    code = "import sys, symgrad\nprint('numba.cuda' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_device_api_and_moves():
    assert sg.cuda.is_available() and sg.cuda.device_count() == 1
    assert sg.cuda.current_device() == 0
    sg.cuda.synchronize()
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        sg.zeros(2, device="cuda:1")
    x = sg.tensor([1.0, 2.0], requires_grad=True)
    y = x.cuda()
    assert y.device == sg.device("cuda", 0) and str(y.device) == "cuda:0" and y.is_cuda
    assert y.grad_fn.name() == "ToCopyBackward0"
    assert y.cuda() is y and y.to("cuda:0") is y
    assert repr(y) == "tensor([1., 2.], device='cuda:0', grad_fn=<ToCopyBackward0>)"
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
        y.detach().numpy()
    z = (y * 3).cpu()
    assert z.grad_fn.name() == "ToCopyBackward0" and z.device == sg.device("cpu")
    z.sum().backward()
    assert x.grad.device == sg.device("cpu") and x.grad.tolist() == [3.0, 3.0]
    d = y.to("cuda", sg.float64)
    assert d.dtype is sg.float64 and d.is_cuda


def test_module_to_cuda_moves_parameters():
    m = sg.nn.Linear(3, 2)
    w = m.weight.detach().numpy().copy()
    m.to("cuda")
    assert all(p.device == sg.device("cuda:0") and p.is_leaf for p in m.parameters())
    np.testing.assert_array_equal(m.weight.detach().cpu().numpy(), w)
    out = m(dev(4, 3))
    out.sum().backward()
    assert m.weight.grad.device == sg.device("cuda:0")


def test_out_of_range_device_index_is_reported_at_sync():
    x = dev(3)
    idx = B.from_host(np.array([0, 5]))
    B.getitem(x._data, (idx,))  # the kernel reads element 0 instead, never out of bounds
    with pytest.raises(IndexError, match="out of range"):
        sg.cuda.synchronize()
    sg.cuda.synchronize()  # reported once


# -- kernels ---------------------------------------------------------------------------------
def _h(a):
    return B.to_host(a)


@pytest.mark.parametrize("shape,axis", [((70,), None), ((3, 50), 1), ((50, 3), 0),
                                        ((2, 3, 40), (0, 2)), ((4, 0), 1)])
def test_reductions_with_split_rows_match_numpy(shape, axis):
    a = R.standard_normal(shape)
    x = B.from_host(a)
    # a split row sums in another order than numpy's pairwise sum: n terms, each result
    # relative to the sum of |terms| of its own row (elementwise scale)
    n = max(a.size // max(np.asarray(a.sum(axis)).size, 1), 1)
    assert_close(_h(B.sum(x, axis)), a.sum(axis), terms=n, scale=np.abs(a).sum(axis))
    with np.errstate(all="ignore"):  # the mean of an empty row is nan, as in numpy
        want = a.mean(axis, keepdims=True)
        scale = np.abs(a).mean(axis, keepdims=True)
    assert_close(_h(B.mean(x, axis, True)), want, terms=n + 1,  # the sum, then the division
                 scale=np.nan_to_num(scale))
    if a.size:
        np.testing.assert_array_equal(_h(B.amax(x, axis)), a.max(axis))
        np.testing.assert_array_equal(_h(B.amin(x, axis)), a.min(axis))


def test_sum_of_ints_and_bools_and_dtype_argument():
    a = np.array([[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(_h(B.sum(B.from_host(a), (0,))), [5, 7, 9])
    assert _h(B.sum(B.from_host(a > 2))) == 4
    s = B.sum(B.from_host(a.astype(np.float32)), None, False, np.float64)
    assert s.dtype == np.float64 and _h(s) == 21


def test_argmax_first_of_ties_and_nan():
    a = np.array([[1.0, 3.0, 3.0, 0.0], [np.nan, 2.0, np.nan, 9.0], [5.0, 5.0, 5.0, 5.0]])
    x = B.from_host(a)
    np.testing.assert_array_equal(_h(B.argmax(x, 1)), np.argmax(a, 1))
    np.testing.assert_array_equal(_h(B.argmin(x, 1)), np.argmin(a, 1))
    assert _h(B.argmax(B.from_host(a[[0, 2]]))) == np.argmax(a[[0, 2]])


@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 6)), ((11, 5), (5, 9)), ((9,), (9, 3)),
                                   ((2, 1, 3, 4), (5, 4, 2)), ((6,), (6,)), ((3, 5), (5,))])
def test_tiled_matmul_matches_numpy(sa, sb):
    a, b = R.standard_normal(sa), R.standard_normal(sb)
    # tiles accumulate the K products in another order than BLAS: K terms of |a| @ |b|
    assert_close(_h(B.matmul(B.from_host(a), B.from_host(b))), a @ b, terms=sa[-1],
                 scale=np.abs(a) @ np.abs(b))


def test_matmul_reads_strided_operands_in_place(counters):
    a, b = R.standard_normal((6, 4)), R.standard_normal((3, 6))
    x, y = B.from_host(a), B.from_host(b)
    counters.reset()
    out = B.matmul(B.transpose(x, (1, 0)), B.transpose(y, (1, 0)))
    assert counters.launches == 1
    assert_close(_h(out), a.T @ b.T, terms=6, scale=np.abs(a.T) @ np.abs(b.T))


def test_scatter_add_accumulates_repeated_indices_atomically():
    x = B.full((4, 3), 0.0, np.float64)
    idx = B.from_host(np.array([1, 3, 1, 1]))
    vals = B.from_host(np.arange(12.0).reshape(4, 3))
    B.index_put(x, (idx,), vals, True)
    want = np.zeros((4, 3))
    np.add.at(want, np.array([1, 3, 1, 1]), np.arange(12.0).reshape(4, 3))
    np.testing.assert_array_equal(_h(x), want)
    y = B.full((3, 4), 0, np.int64)
    B.index_put(y, (slice(None), B.from_host(np.array([0, 0, 2]))), 1, True)
    np.testing.assert_array_equal(_h(y), [[2, 0, 1, 0]] * 3)


def test_inplace_kernels_write_through_strided_views():
    a = np.arange(12.0).reshape(3, 4)
    x = B.from_host(a)
    view = B.transpose(B.getitem(x, (slice(None), slice(1, None, 2))), (1, 0))  # (2, 3)
    B.add_(view, B.from_host(np.array([10.0, 20.0, 30.0])))
    B.mul_(view, 2)
    want = a.copy()
    want[:, 1::2] = (want[:, 1::2] + np.array([[10.0], [20.0], [30.0]])) * 2
    np.testing.assert_array_equal(_h(x), want)
    B.fill_(B.getitem(x, (0,)), -1)
    want[0] = -1
    np.testing.assert_array_equal(_h(x), want)


def test_random_numbers_are_made_on_the_device(counters):
    counters.reset()
    u = B.random((4000,), np.float32, False, seed=123)
    n = B.random((4000,), np.float64, True, seed=123, offset=4000)
    assert counters.transfers == 0 and counters.launches == 2
    hu, hn = _h(u), _h(n)
    assert 0.0 <= hu.min() and hu.max() < 1.0 and abs(hu.mean() - 0.5) < 0.02
    assert abs(hn.mean()) < 0.05 and abs(hn.std() - 1) < 0.05
    np.testing.assert_array_equal(_h(B.random((4000,), np.float32, False, seed=123)), hu)
    assert not np.array_equal(_h(B.random((10,), np.float32, False, seed=124)), hu[:10])


def test_fused_backward_kernels_equal_the_tensor_formulas():
    from symgrad.ops import OPS

    g, x = dev(3, 4, dtype=np.float64), dev(3, 4, dtype=np.float64)
    r = x.tanh()
    (out,) = B.tanh_backward(g._data, (True,), r._data)
    ref = OPS["tanh"].grads["self"](g, result=r)
    # g * (1 - r * r): three roundings (a GPU may fuse r * r into 1 - ... as an FMA), and
    # 1 - r * r cancels, so the scale is |g| * (1 + r * r), elementwise
    hg, hr = g.cpu().numpy(), r.cpu().numpy()
    assert_close(_h(out), ref, terms=3, scale=np.abs(hg) * (1 + hr * hr))
    y = dev(3, 4, dtype=np.float64) + 2
    ga, gb = B.div_backward(g._data, (True, True), y._data, x._data)
    assert_close(_h(ga), g / y)  # one correctly rounded op
    assert_close(_h(gb), -g * x / (y * y), terms=3)  # products and a quotient: no cancellation
    ga, gb = B.mul_backward(g._data, (True, True), y._data, x._data)
    assert_close(_h(ga), g * y)
    # a saved operand that broadcasts to the gradient is read by strides; one that does not,
    # or of another dtype, is declined (the tensor-op formulas run)
    (out,) = B.tanh_backward(g._data, (True,), r[0]._data)
    assert_close(_h(out), OPS["tanh"].grads["self"](g, result=r[0]), terms=3,
                 scale=np.abs(hg) * (1 + hr[0] * hr[0]))
    assert B.tanh_backward(g._data, (True,), dev(5, dtype=np.float64)._data) is None
    assert B.tanh_backward(g._data, (True,), dev(3, 4, dtype=np.float32)._data) is None


def test_profiler_device_column_says_unavailable_under_the_simulator():
    from symgrad.autograd import profiler

    x = dev(3, 4, requires_grad=True)
    with profiler.profile(use_device="cuda") as prof:
        (x.exp() @ x.t()).sum().backward()
    table = prof.key_averages().table()
    assert "Self CUDA" in table and "symgrad::mm" in table
    row = next(line for line in table.splitlines() if "symgrad::mm" in line)
    assert row.count("unavailable") == 4
    assert "Self CUDA time total: unavailable (timed CUDA events do not work under the " \
           "numba.cuda simulator)" in table
    assert all(e.device_time_ns == 0 for e in prof.function_events)
