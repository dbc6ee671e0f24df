"""The CUDA backend's fused backward kernels of softmax, log_softmax, addmm and mse_loss
(numba's simulator in CI).

Each case runs the backward three ways: on "cuda" with the fused kernel (which must be
called and must not decline), on "cuda" with the kernel removed from the backend (the
engine then runs the op's tensor-op formulas), and on "cpu" with the CPU backend's fused
kernel. The gradients must agree within the tolerance helper's bounds. Layouts a kernel does
not cover must decline (return None) and still give the right gradients.
"""

from __future__ import annotations

import warnings
import zlib

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg
import symgrad.nn.functional as F
from symgrad.backends import backend_for
from symgrad.backends.cuda.backend import CudaBackend

DTYPES = (np.float32, np.float64)
FUSED = ("softmax_backward", "log_softmax_backward", "addmm_backward", "mse_loss_backward")


def _assert_cuda_backend_is_patched_class():
    be = backend_for("cuda")
    assert be is CudaBackend or isinstance(be, CudaBackend)


class _Spy:
    """Wraps ``CudaBackend.<name>``: counts calls and how many declined (returned None)."""

    def __init__(self, monkeypatch, name):
        self.calls = 0
        self.declined = 0
        orig = getattr(CudaBackend, name)

        def wrapper(*args):
            self.calls += 1
            out = orig(*args)
            if out is None:
                self.declined += 1
            return out

        monkeypatch.setattr(CudaBackend, name, staticmethod(wrapper))


def _np(t):
    return None if t is None else t.detach().cpu().numpy()


def _run(fn, arrays, requires, upstream, device, create_graph=False):
    """Leaves on ``device`` from ``arrays`` (those flagged in ``requires`` need grad; an
    entry may be a callable making the op's input from its leaf, e.g. a transpose), the
    output's backward with the ``upstream`` gradient; returns the leaves' gradients."""
    leaves, inputs = [], []
    for a, r in zip(arrays, requires, strict=True):
        make = None
        if isinstance(a, tuple):
            a, make = a
        leaf = sg.tensor(a, device=device, requires_grad=r)
        leaves.append(leaf)
        inputs.append(make(leaf) if make is not None else leaf)
    out = fn(*inputs)
    if callable(upstream):
        g = upstream(device)
    else:
        g = sg.tensor(upstream, device=device)
    grads = sg.autograd.grad([out], [x for x, r in zip(leaves, requires, strict=True) if r],
                             [g], create_graph=create_graph, allow_unused=True)
    return [_np(x) for x in grads]


def _three_ways(monkeypatch, name, fn, arrays, requires, upstream, *, expect_fused=True):
    """(fused cuda, formulas cuda, cpu) gradients; checks the fused kernel ran (or declined)."""
    with monkeypatch.context() as m:
        spy = _Spy(m, name)
        fused = _run(fn, arrays, requires, upstream, "cuda")
        _assert_cuda_backend_is_patched_class()
        assert spy.calls >= 1, f"{name} was not called"
        if expect_fused:
            assert spy.declined == 0, f"{name} declined"
        else:
            assert spy.declined == spy.calls, f"{name} did not decline"
    with monkeypatch.context() as m:
        m.delattr(CudaBackend, name)
        formulas = _run(fn, arrays, requires, upstream, "cuda")
    with monkeypatch.context() as m:  # create_graph records a graph: formulas, never fused
        spy = _Spy(m, name)
        graphed = _run(fn, arrays, requires, upstream, "cuda", create_graph=True)
        assert spy.calls == 0
    cpu = _run(fn, arrays, requires, upstream, "cpu")
    for a, b in zip(formulas, graphed, strict=True):  # the same formulas: the same values
        if a is not None:
            assert_close(a, b, ulps=0, msg="formulas with and without a recorded graph")
    return fused, formulas, cpu


def _compare(fused, formulas, cpu, *, terms, scale=None, msg=""):
    assert len(fused) == len(formulas) == len(cpu)
    for i, (a, b, c) in enumerate(zip(fused, formulas, cpu, strict=True)):
        assert (a is None) == (b is None) == (c is None)
        if a is None:
            continue
        s = scale[i] if isinstance(scale, (list, tuple)) else scale
        n = terms[i] if isinstance(terms, (list, tuple)) else terms
        assert a.dtype == c.dtype
        assert_close(a, b, terms=n, scale=s, msg=f"{msg} input {i}: fused vs formulas")
        assert_close(a, c, terms=n, scale=s, msg=f"{msg} input {i}: cuda vs cpu")


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


# -- softmax / log_softmax -------------------------------------------------------------------
SOFTMAX_CASES = [
    ((1, 7), -1), ((3, 5), -1), ((3, 5), 0), ((4, 33), -1), ((2, 40), 1), ((5, 3), 1),
    ((2, 3, 5), -1), ((2, 3, 5), 0), ((2, 3, 5), 1), ((7,), 0), ((1, 1), -1), ((3, 1), 0),
]


def _softmax_bound(op, g, shape, dim):
    """terms and scale: a row sum of K terms, then two elementwise ops (exp: a few ulp)."""
    k = shape[dim] if shape else 1
    if op == "softmax":  # sum |g * y| <= max |g| (y >= 0 sums to 1); |result| <= 2 max|g|
        return k + 3, 2 * magnitude(g)
    # log_softmax: the summed terms are g itself; exp(y) <= 1
    return k + 4, float(np.abs(g).sum(axis=dim).max()) + magnitude(g) if g.ndim else 1.0


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", SOFTMAX_CASES)
def test_softmax_fused_matches_formulas_and_cpu(monkeypatch, op, dtype, shape, dim):
    rng = _rng(op, shape, dim, np.dtype(dtype).name)
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    g = rng.standard_normal(shape).astype(dtype)

    def fn(t):
        return getattr(F, op)(t, dim)

    got = _three_ways(monkeypatch, f"{op}_backward", fn, [x], [True], g)
    terms, scale = _softmax_bound(op, g, shape, dim)
    _compare(*got, terms=terms, scale=scale, msg=f"{op}{shape} dim={dim}")


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_noncontiguous_input_and_grad(monkeypatch, op, dtype):
    """A transposed input and a transposed (strided) incoming gradient; a broadcast one
    (stride 0, from sum's backward)."""
    rng = _rng(op, "strided", np.dtype(dtype).name)
    x = rng.standard_normal((6, 4)).astype(dtype)  # used as x.t(): (4, 6)
    gt = rng.standard_normal((6, 4)).astype(dtype)
    for dim in (-1, 0):
        def fn(t, dim=dim):
            return getattr(F, op)(t, dim)

        def upstream(device, gt=gt):
            return sg.tensor(gt, device=device).t()  # a non-contiguous gradient

        got = _three_ways(monkeypatch, f"{op}_backward", fn, [(x, lambda t: t.t())], [True],
                          upstream)
        terms, scale = _softmax_bound(op, gt.T, (4, 6), dim)
        _compare(*got, terms=terms, scale=scale, msg=f"{op} transposed dim={dim}")

        def summed(t, dim=dim):  # the gradient reaching softmax is expanded (stride 0)
            return getattr(F, op)(t, dim).sum()

        got = _three_ways(monkeypatch, f"{op}_backward", summed, [x], [True],
                          np.array(1.5, dtype=dtype))
        terms, scale = _softmax_bound(op, np.full((6, 4), 1.5, dtype), (6, 4), dim)
        _compare(*got, terms=terms, scale=scale, msg=f"{op} expanded grad dim={dim}")


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_zero_dim_and_empty(monkeypatch, op, dtype):
    def fn(t):
        return getattr(F, op)(t, 0)

    got = _three_ways(monkeypatch, f"{op}_backward", fn, [np.array(0.7, dtype=dtype)],
                      [True], np.array(2.0, dtype=dtype))
    _compare(*got, terms=1)
    assert got[0][0] == 0

    def fn1(t):
        return getattr(F, op)(t, 1)

    got = _three_ways(monkeypatch, f"{op}_backward", fn1, [np.zeros((0, 3), dtype)], [True],
                      np.zeros((0, 3), dtype))
    _compare(*got, terms=1)
    assert got[0][0].shape == (0, 3)


# -- addmm -----------------------------------------------------------------------------------
def _mm_scale(a, b, factor=1.0):
    """The magnitude of the summed terms of ``a @ b`` (times |factor|)."""
    return float((np.abs(a) @ np.abs(b)).max()) * abs(factor) if a.size and b.size else 1.0


ADDMM_CASES = [  # (m, k, n, bias shape, beta, alpha)
    (1, 3, 4, (4,), 1, 1), (3, 5, 2, (3, 2), 1, 1), (7, 9, 5, (5,), 0.5, 2.0),
    (4, 1, 6, (1, 6), 2, 1), (5, 6, 1, (5, 1), 1, -0.25), (2, 8, 3, (), 0, 1.5),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n,bshape,beta,alpha", ADDMM_CASES)
@pytest.mark.parametrize("layout", ["contiguous", "mat1_t", "mat2_t", "both_t"])
def test_addmm_fused_matches_formulas_and_cpu(monkeypatch, dtype, m, k, n, bshape, beta,
                                             alpha, layout):
    rng = _rng("addmm", m, k, n, bshape, layout, np.dtype(dtype).name)
    bias = rng.standard_normal(bshape).astype(dtype)
    t1, t2 = layout in ("mat1_t", "both_t"), layout in ("mat2_t", "both_t")
    a = rng.standard_normal((k, m) if t1 else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if t2 else (k, n)).astype(dtype)
    g = rng.standard_normal((m, n)).astype(dtype)
    mat1 = (a, lambda t: t.t()) if t1 else a
    mat2 = (b, lambda t: t.t()) if t2 else b

    def fn(s, x, w):
        return F.addmm(s, x, w, beta=beta, alpha=alpha)

    got = _three_ways(monkeypatch, "addmm_backward", fn, [bias, mat1, mat2],
                      [True, True, True], g)
    a2, b2 = (a.T if t1 else a), (b.T if t2 else b)
    summed = m * n // max(bias.size, 1)  # the engine sums bias's gradient over this many
    terms = [summed + 1, n + 1, m + 1]  # bias: a sum then beta; mat1: K=n; mat2: K=m
    scale = [magnitude(g) * max(abs(beta), 1) * summed, _mm_scale(g, b2.T, alpha),
             _mm_scale(a2.T, g, alpha)]
    _compare(*got, terms=terms, scale=scale, msg=f"addmm {layout} {m}x{k}x{n}")
    # the gradient of a transposed leaf comes back in its layout's shape
    assert got[0][1].shape == a.shape and got[0][2].shape == b.shape


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_linear_uses_fused_addmm(monkeypatch, dtype, rows):
    """nn.Linear's path (mat2 = W.t(), column-major) with only some inputs needing grad and a
    non-contiguous incoming gradient."""
    rng = _rng("linear", rows, np.dtype(dtype).name)
    x = rng.standard_normal((rows, 5)).astype(dtype)
    w = rng.standard_normal((3, 5)).astype(dtype)
    b = rng.standard_normal(3).astype(dtype)
    gt = rng.standard_normal((3, rows)).astype(dtype)

    def upstream(device):
        return sg.tensor(gt, device=device).t()

    for requires in ([True, True, True], [False, True, True], [True, False, False],
                     [False, False, True], [True, True, False]):
        got = _three_ways(monkeypatch, "addmm_backward", lambda x_, w_, b_: F.linear(x_, w_, b_),
                          [x, w, b], requires, upstream)
        _compare(*got, terms=max(rows, 5) + 2, scale=_mm_scale(gt.T, w) + _mm_scale(gt, x)
                 + magnitude(gt) * rows, msg=f"linear {requires}")


# -- mse_loss --------------------------------------------------------------------------------
MSE_CASES = [(1,), (3, 5), (2, 3, 5), (1, 1), (7,)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", MSE_CASES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("requires", [(True, True), (True, False), (False, True)])
def test_mse_loss_fused_matches_formulas_and_cpu(monkeypatch, dtype, shape, reduction,
                                                 requires):
    rng = _rng("mse", shape, reduction, requires, np.dtype(dtype).name)
    x = rng.standard_normal(shape).astype(dtype)
    t = rng.standard_normal(shape).astype(dtype)
    g = (rng.standard_normal(shape) if reduction == "none"
         else np.array(rng.standard_normal())).astype(dtype)

    def fn(a, b):
        return F.mse_loss(a, b, reduction=reduction)

    got = _three_ways(monkeypatch, "mse_loss_backward", fn, [x, t], list(requires), g)
    _compare(*got, terms=3, msg=f"mse {shape} {reduction}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_transposed_and_broadcast(monkeypatch, dtype, reduction):
    rng = _rng("mse-layout", reduction, np.dtype(dtype).name)
    x = rng.standard_normal((5, 3)).astype(dtype)  # used as x.t(): (3, 5)
    t = rng.standard_normal((3, 5)).astype(dtype)

    def fn(a, b):
        return F.mse_loss(a, b, reduction=reduction)

    def upstream(device):
        if reduction != "none":
            return sg.tensor(np.array(0.75, dtype=dtype), device=device)
        return sg.tensor(rng2.copy(), device=device).t()  # a strided incoming gradient

    rng2 = rng.standard_normal((5, 3)).astype(dtype)
    got = _three_ways(monkeypatch, "mse_loss_backward", fn, [(x, lambda a: a.t()), t],
                      [True, True], upstream)
    _compare(*got, terms=3, msg=f"mse transposed {reduction}")
    assert got[0][0].shape == (5, 3)

    tb = rng.standard_normal(5).astype(dtype)  # broadcast target: the engine sums it back
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        got = _three_ways(monkeypatch, "mse_loss_backward", fn, [t, tb], [True, True],
                          upstream if reduction != "none" else rng2.T.copy())
    _compare(*got, terms=3 + 3, scale=[None, 3 * magnitude(got[2][0])],
             msg=f"mse broadcast {reduction}")


# -- declined cases ----------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_mse_loss_mixed_dtypes_decline_and_stay_correct(monkeypatch, reduction):
    """self float32, target float64 (promoted): the kernel declines, the formulas run."""
    rng = _rng("mse-mixed", reduction)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    t = rng.standard_normal((3, 4))
    g = (rng.standard_normal((3, 4)) if reduction == "none" else np.array(1.25))

    def fn(a, b):
        return F.mse_loss(a, b, reduction=reduction)

    got = _three_ways(monkeypatch, "mse_loss_backward", fn, [x, t], [True, True], g,
                      expect_fused=False)
    _compare(*got, terms=4, msg=f"mse mixed {reduction}")
    assert got[0][0].dtype == np.float32 and got[0][1].dtype == np.float64


def test_declines_on_unsupported_arguments():
    """Direct calls: whatever the kernels do not cover returns None (never a wrong array)."""
    be = CudaBackend
    y = be.from_host(np.full((2, 3), 1 / 3, np.float32))
    g64 = be.from_host(np.ones((2, 3)))
    g16 = be.from_host(np.ones((2, 3), np.float16))
    y16 = be.from_host(np.full((2, 3), 1 / 3, np.float16))
    host = np.ones((2, 3), np.float32)
    for name in ("softmax_backward", "log_softmax_backward"):
        fn = getattr(be, name)
        assert fn(g64, (True,), -1, y) is None  # dtypes differ
        assert fn(g16, (True,), -1, y16) is None  # float16: not covered
        assert fn(host, (True,), -1, y) is None  # not a device array
        assert fn(be.from_host(np.ones((3, 2), np.float32)), (True,), -1, y) is None
    m = be.from_host(np.ones((2, 2), np.float32))
    sizes, strides = (2, 2), (2, 1)
    assert be.addmm_backward(m, (True, True, True), 1, 1, m, sizes, strides,
                             be.from_host(np.ones((2, 2))), sizes, strides) is None
    assert be.addmm_backward(m, (True, True, True), np.float32(2), 1, m, sizes, strides, m,
                             sizes, strides) is None
    assert be.addmm_backward(m, (False, True, False), 1, 1, m, sizes, strides, None, sizes,
                             strides) is None  # mat1's grad needs mat2
    assert be.mse_loss_backward(m, (True, True), 1, m,
                                be.from_host(np.ones((2, 2)))) is None
    assert be.mse_loss_backward(g16, (True, True), 2, g16, g16) is None
    assert be.mse_loss_backward(m, (True, True), 1, be.from_host(np.ones((0,), np.float32)),
                                be.from_host(np.ones((0,), np.float32))) is None


def test_fused_kernels_are_on_the_backend():
    for name in FUSED:
        assert callable(getattr(CudaBackend, name))
