"""The Numba CPU backend: fused backward = formula backward, kernels = reference, safety.

Tests named ``test_kernel_*`` are also run once under ``NUMBA_BOUNDSCHECK=1``
(tests/test_cpu_threads.py::test_kernels_under_boundscheck).
"""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg
from symgrad import backends
from symgrad.backends.cpu import backend as cpu_mod
from symgrad.backends.numpy_backend import NumpyBackend
from symgrad.ops import OPS

CPU = backends.get_backend("cpu")


def to_torch(torch, t: sg.Tensor):
    """The same values as a torch leaf (requires_grad as on ``t``)."""
    x = torch.from_numpy(np.array(t.detach().numpy(), copy=True))
    return x.requires_grad_(True) if t.requires_grad else x


@pytest.fixture
def on_cpu():
    previous = backends.set_cpu_backend("cpu")
    yield CPU
    backends.set_cpu_backend(previous)


@pytest.fixture(params=["numpy", "serial", "parallel"])
def mode(request, monkeypatch):
    """Each size tier on small arrays: NumPy expressions (the default below FUSED_MIN),
    serial Numba kernels, parallel Numba kernels."""
    if request.param != "numpy":
        monkeypatch.setattr(cpu_mod, "FUSED_MIN", 2)
    if request.param == "parallel":
        monkeypatch.setattr(cpu_mod, "PARALLEL_MIN", 8)
    return request.param


def _positive(rng, shape, dtype):
    return np.asarray(rng.random(shape) + 0.5, dtype=dtype)


def _signed(rng, shape, dtype):
    a = np.asarray(rng.standard_normal(shape), dtype=dtype)
    if a.size > 2:
        a.reshape(-1)[:2] = 0  # the kinks: relu'(0) = abs'(0) = 0
    return a


# op name -> (builder of the output from tensors, list of input kinds); "p" positive,
# "s" signed, "c" a bool condition, numbers stay numbers
CASES = {
    "neg": (lambda x: -x, "s"),
    "exp": (lambda x: x.exp(), "s"),
    "log": (lambda x: x.log(), "p"),
    "sin": (lambda x: x.sin(), "s"),
    "cos": (lambda x: x.cos(), "s"),
    "tanh": (lambda x: x.tanh(), "s"),
    "sigmoid": (lambda x: x.sigmoid(), "s"),
    "sqrt": (lambda x: x.sqrt(), "p"),
    "relu": (lambda x: x.relu(), "s"),
    "abs": (lambda x: x.abs(), "s"),
    "sign": (lambda x: x.sign(), "s"),
    "reciprocal": (lambda x: x.reciprocal(), "p"),
    "log1p": (lambda x: x.log1p(), "p"),
    "log2": (lambda x: x.log2(), "p"),
    "log10": (lambda x: x.log10(), "p"),
    "expm1": (lambda x: x.expm1(), "s"),
    "pow": (lambda x: x ** 3, "s"),
    "pow-frac": (lambda x: x ** 2.5, "p"),
    "pow-zero": (lambda x: x ** 0, "s"),
    "mul": (lambda a, b: a * b, "ss"),
    "mul-scalar": (lambda a: a * 2.5, "s"),
    "mul-one-grad": (lambda a, b: a * b.detach(), "ss"),
    "mul-other-grad": (lambda a, b: a.detach() * b, "ss"),
    "div": (lambda a, b: a / b, "sp"),
    "div-scalar": (lambda a: a / 4.0, "s"),
    "div-other-grad": (lambda a, b: a.detach() / b, "sp"),
    "div-self-grad": (lambda a, b: a / b.detach(), "sp"),
    "where": (lambda c, a, b: sg.where(c, a, b), "css"),
    "where-left": (lambda c, a, b: sg.where(c, a, b.detach()), "css"),
    "where-right": (lambda c, a, b: sg.where(c, a.detach(), b), "css"),
    "erf": (lambda x: x.erf(), "s"),
    "silu": (lambda x: _nnf(x).silu(x), "s"),
    "softplus": (lambda x: _nnf(x).softplus(x), "s"),
    "softplus-beta": (lambda x: _nnf(x).softplus(x, beta=2.0, threshold=1.0), "s"),
    "gelu": (lambda x: _nnf(x).gelu(x), "s"),
    "gelu_tanh": (lambda x: _nnf(x).gelu(x, approximate="tanh"), "s"),
    "leaky_relu": (lambda x: _nnf(x).leaky_relu(x, 0.2), "s"),
    "elu": (lambda x: _nnf(x).elu(x, 0.7), "s"),
    "logsigmoid": (lambda x: _nnf(x).logsigmoid(x), "s"),
    "hardtanh": (lambda x: _nnf(x).hardtanh(x, -0.5, 0.8), "s"),
    "maximum": (lambda a, b: a.maximum(b), "ss"),
    "maximum-ties": (lambda a: a.maximum(a.detach()), "s"),
    "minimum": (lambda a, b: a.minimum(b), "ss"),
    "atan2": (lambda a, b: a.atan2(b), "ss"),
    "hypot": (lambda a, b: a.hypot(b), "ss"),
    "softmax": (lambda x: x.softmax(-1), "s"),
    "softmax-first-dim": (lambda x: x.softmax(0), "s"),
    "log_softmax": (lambda x: x.log_softmax(-1), "s"),
    "log_softmax-first-dim": (lambda x: x.log_softmax(0), "s"),
}


def _nnf(t):
    """``nn.functional`` of the tensor's library (the cases run on symgrad and on torch)."""
    return sg.nn.functional if isinstance(t, sg.Tensor) else __import__("torch").nn.functional


# fused backward rules whose inputs do not fit NN_CASES (integer indices, an indices output):
# each has its own test against the formulas and torch, named here
DEDICATED_FUSED_TESTS = {
    "embedding": "test_kernel_embedding_fused_backward_equals_formula_and_torch",
    "max_pool2d_with_indices": "test_kernel_max_pool_fused_backward_equals_formula_and_torch",
    "scaled_dot_product_flash_attention_for_cpu":
        "test_sdpa_fused::test_fused_kernel_equals_the_tensor_op_formulas",
}


def test_every_elementwise_fused_op_has_a_case_and_a_backend_rule():
    fused = {name for name, spec in OPS.items() if spec.fused_backward}
    assert fused == ({c.split("-")[0] for c in CASES} | {c.split("-")[0] for c in NN_CASES}
                     | set(DEDICATED_FUSED_TESTS))
    for test_name in DEDICATED_FUSED_TESTS.values():
        module, _, name = test_name.rpartition("::")  # "module::test" names another file's
        where = vars(importlib.import_module(module)) if module else globals()
        assert callable(where.get(name)), test_name
    for name in fused:
        assert callable(getattr(CPU, OPS[name].fused_backward))
        assert not hasattr(NumpyBackend, OPS[name].fused_backward)  # the oracle stays plain


def _inputs(rng, kinds, shape, dtype, broadcast=False):
    out = []
    for k, kind in enumerate(kinds):
        shp = shape[-1:] if broadcast and k == len(kinds) - 1 and shape else shape
        if kind == "c":
            out.append(sg.tensor(rng.random(shape) > 0.5))
        else:
            make = _positive if kind == "p" else _signed
            out.append(sg.tensor(make(rng, shp, dtype), requires_grad=True))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("shape", [(), (5,), (4, 6)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_backward_equals_formula_backward(case, shape, dtype, mode, on_cpu, rng, torch):
    """Fused kernel (no graph recorded) and tensor-op formulas (create_graph) agree, and
    both agree with torch."""
    fn, kinds = CASES[case]
    xs = _inputs(rng, kinds, shape, dtype)
    y = fn(*xs)
    g = sg.tensor(np.asarray(rng.standard_normal(shape), dtype=dtype))
    leaves = [x for x in xs if x.requires_grad]
    fused = sg.autograd.grad(y, leaves, g, retain_graph=True, allow_unused=True)
    formula = sg.autograd.grad(y, leaves, g, create_graph=True, allow_unused=True)
    # the forward op, its partial (up to three roundings, an elementary function among
    # them) and the product with g; softmax's partial sums over its dim. Partials such as
    # 1 - y*y or (g - sum(g s)) s cancel: |g| and the inputs join the scale.
    terms = 6 + (max(shape[-1], shape[0]) if shape and "softmax" in case else 0)
    txs = [to_torch(torch, x) for x in xs]
    ty = fn(*txs) if "where" not in case else torch.where(txs[0], *[
        t if xs[i + 1].requires_grad and not _detached(case, i) else t.detach()
        for i, t in enumerate(txs[1:])])
    tleaves = [t for t, x in zip(txs, xs) if x.requires_grad]
    expected = torch.autograd.grad(ty, tleaves, to_torch(torch, g), allow_unused=True)
    for a, b, e in zip(fused, formula, expected):
        if e is None:
            assert a is None or not a.numpy().any()
            continue
        assert a.dtype is b.dtype and a.shape == b.shape == tuple(e.shape)
        scale = magnitude(e, g, *xs)
        assert_close(a, b, terms=terms, scale=scale, msg="fused vs formula")
        assert_close(a, e, terms=terms, scale=scale, msg="fused vs torch")


def _detached(case, i):
    return (case == "where-left" and i == 1) or (case == "where-right" and i == 0)


@pytest.mark.parametrize("case", ["mul", "div", "where"])
def test_fused_backward_with_broadcasting_equals_torch(case, on_cpu, rng, torch):
    fn, kinds = CASES[case]
    xs = _inputs(rng, kinds, (3, 4), np.float32, broadcast=True)
    y = fn(*xs)
    y.sum().backward()
    txs = [to_torch(torch, x) for x in xs]
    ty = fn(*txs) if case != "where" else torch.where(*txs)
    ty.sum().backward()
    # the broadcast input's gradient sums 3 rows of partials: its terms are the gradient
    # of that input expanded to (3, 4), their |sum| the elementwise scale
    full = [t.detach().expand(3, 4).clone().requires_grad_(t.requires_grad) for t in txs]
    fy = fn(*full) if case != "where" else torch.where(*full)
    fy.sum().backward()
    for x, t, f in zip(xs, txs, full):
        if x.requires_grad:
            assert x.grad.shape == x.shape
            terms = f.grad.abs().sum_to_size(t.shape).numpy()
            assert_close(x.grad, t.grad, terms=3 + 3, scale=terms)


class _Counting:
    """A backend proxy counting every kernel call (the engine's view of "one kernel")."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)

        return counted


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("shape", [(), (7,), (300,)])
def test_an_elementwise_backward_makes_exactly_one_backend_call(case, shape, rng):
    counting = _Counting(CPU)
    backends.register_backend("counting", counting)
    previous = backends.set_cpu_backend("counting")
    try:
        fn, kinds = CASES[case]
        xs = _inputs(rng, kinds, shape, np.float64)
        y = fn(*xs)
        g = sg.ones_like(y)
        counting.calls.clear()
        y.backward(g)
        assert len(counting.calls) == 1, counting.calls
        assert counting.calls[0].endswith("_backward")
        counting.calls.clear()  # the formula form needs more than one kernel
        xs = _inputs(rng, kinds, shape, np.float64)
        sg.autograd.grad(fn(*xs), [x for x in xs if x.requires_grad], g, create_graph=True,
                         allow_unused=True)
        assert not any(c.endswith("_backward") for c in counting.calls)
    finally:
        backends.set_cpu_backend(previous)
        del backends._BACKENDS["counting"]


@pytest.mark.parametrize("reduce", ["sum", "mean", "transposed"])
def test_expanded_or_strided_grads_still_take_the_fused_kernel(reduce, mode, rng, torch):
    """After sum/mean the grad is an expanded scalar (strides 0); after .t() it is strided."""
    counting = _Counting(CPU)
    backends.register_backend("counting", counting)
    previous = backends.set_cpu_backend("counting")
    try:
        x = sg.tensor(rng.standard_normal((30, 20)), requires_grad=True)
        w = sg.tensor(rng.standard_normal((30, 20)), requires_grad=True)
        y = (x.tanh() * w)
        y = y.sum() if reduce == "sum" else y.mean() if reduce == "mean" else y.t()
        counting.calls.clear()
        y.backward(None if reduce != "transposed" else sg.ones(20, 30, dtype=sg.float64))
        assert "tanh_backward" in counting.calls and "mul_backward" in counting.calls
        assert not {"mul", "sub", "neg"} & set(counting.calls), counting.calls
    finally:
        backends.set_cpu_backend(previous)
        del backends._BACKENDS["counting"]
    tx, tw = to_torch(torch, x), to_torch(torch, w)
    ty = tx.tanh() * tw
    ty = ty.sum() if reduce == "sum" else ty.mean() if reduce == "mean" else ty.t()
    ty.backward(None if reduce != "transposed" else torch.ones(20, 30, dtype=torch.float64))
    # x.grad = g w (1 - t*t): tanh, three roundings, 1 - t*t cancels (scale |g w| (1 + t*t)
    # <= 2 |g w|); w.grad = g t: tanh and one product
    g = 1 / x.numel() if reduce == "mean" else 1.0
    assert_close(x.grad, tx.grad, terms=5, scale=2 * g * magnitude(w))
    assert_close(w.grad, tw.grad, terms=3)


def test_fused_path_checks_saved_versions(on_cpu):
    x = sg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1  # a non-leaf that sin saves
    z = y.sin()
    with sg.no_grad():
        y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


# -- kernels against the NumPy reference (also run under NUMBA_BOUNDSCHECK=1) -------------------
UNARY = ("neg", "exp", "log", "sin", "cos", "tanh", "sigmoid", "relu", "sqrt", "abs")
BINARY = ("add", "sub", "mul", "div")
# Rounding terms of each kernel against the reference, elementwise relative to |reference|:
# +, -, *, /, sqrt are correctly rounded (fastmath is off) and neg/abs/relu exact: 1; an
# elementary function may come from two libraries (libm, NumPy's SIMD loops), each within
# a few ulp: 2; sigmoid = 1 / (1 + exp(-|x|)) adds an add and a division: 3.
UNARY_TERMS = {"exp": 2, "log": 2, "sin": 2, "cos": 2, "tanh": 2, "sigmoid": 3}


def _special(rng, n, dtype):
    a = rng.standard_normal(n).astype(dtype) * 3
    a[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, -1.0]
    return a


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_forward_matches_reference(dtype, mode, rng):
    x = _special(rng, 40, dtype)
    for name in UNARY:
        with np.errstate(all="ignore"):
            ref = getattr(NumpyBackend, name)(x)
            got = getattr(CPU, name)(x)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert_close(got, ref, terms=UNARY_TERMS.get(name, 1), scale=np.abs(ref), msg=name)
    for v in x[:8]:  # one value (the scalar fast paths): same value, no warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for name in ("exp", "log", "sqrt", "relu"):
                got = getattr(CPU, name)(np.array(v, dtype))
                with np.errstate(all="ignore"):
                    ref = getattr(NumpyBackend, name)(np.array(v, dtype))
                assert np.asarray(got).dtype == np.asarray(ref).dtype, name
                np.testing.assert_array_equal(got, ref, err_msg=name)
    y = _special(rng, 40, dtype)[::-1].copy()
    for name in BINARY:
        for a, b in ((x, y), (x, 2.5), (3, y), (x.reshape(5, 8), y.reshape(5, 8))):
            with np.errstate(all="ignore"):
                ref = getattr(NumpyBackend, name)(a, b)
            got = getattr(CPU, name)(a, b)
            assert got.dtype == ref.dtype and got.shape == ref.shape, name
            assert_close(got, ref, scale=np.abs(ref), msg=name)  # one rounding
    with np.errstate(all="ignore"):
        got = CPU.addcmul(x, y, x, 0.5)
        # a product and a sum, elementwise relative to the terms |x| + |0.5 y x|
        assert_close(got, x + 0.5 * (y * x), terms=2,
                     scale=np.abs(x) + np.abs(0.5 * (y * x)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_reductions_and_copy(dtype, mode, rng):
    x = rng.standard_normal((6, 7)).astype(dtype)
    for axis, keep in ((None, False), (None, True), ((0, 1), False), ((1,), True), ((-1,), False),
                       ((0,), True), (1, False)):
        got = CPU.sum(x, axis, keep)
        ref = NumpyBackend.sum(x, axis, keep)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        # another summation order: n terms, relative to each result's sum of |terms|
        n = x.size // ref.size
        assert_close(got, ref, terms=n, scale=NumpyBackend.sum(np.abs(x), axis, keep))
    c = CPU.copy(x.T)
    assert c.flags.c_contiguous and np.array_equal(c, x.T)
    c = CPU.copy(x)
    assert not np.shares_memory(c, x) and np.array_equal(c, x)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sum_over_rows_is_the_compiled_steps_gemv(dtype, rng):
    """A 2-D sum over rows (eager's bias gradients) from SUM_ROWS_GEMV_MIN rows is the
    product with ones that sg.compile's code computes: the same bits, another order than
    NumPy's."""
    n = cpu_mod.SUM_ROWS_GEMV_MIN
    for x in (rng.standard_normal((5 * n, 9)).astype(dtype),
              rng.standard_normal((9, 5 * n)).astype(dtype).T):  # column-major too
        for axis in ((0,), 0, (-2,)):
            got = CPU.sum(x, axis, False)
            assert got.dtype == x.dtype and got.shape == (9,)
            assert np.array_equal(got, np.matmul(np.ones(x.shape[0], dtype), x))
            ref = NumpyBackend.sum(x, axis, False)
            assert_close(got, ref, terms=x.shape[0], scale=NumpyBackend.sum(np.abs(x), 0))
    w = sg.randn(3, 9, requires_grad=True, dtype=sg.float64 if dtype == np.float64 else None)
    b = sg.zeros(3, requires_grad=True, dtype=w.dtype)
    x = sg.randn(4 * n, 9, dtype=w.dtype)
    y = x @ w.t() + b
    y.retain_grad()
    y.pow(2).sum().backward()
    assert np.array_equal(b.grad.numpy(), np.matmul(np.ones(4 * n, dtype), y.grad.numpy()))


def test_kernel_fuzz_random_layouts_match_reference(mode):
    """Shapes, dtypes, strides and broadcasting drawn at random: never a crash, same values."""
    rng = np.random.default_rng(7)
    for _ in range(60):
        ndim = int(rng.integers(0, 4))
        shape = tuple(int(s) for s in rng.integers(1, 5, ndim))
        dtype = [np.float32, np.float64, np.int64][int(rng.integers(0, 3))]
        a = (rng.standard_normal(shape) * 4).astype(dtype)
        if ndim >= 2 and rng.random() < 0.3:
            a = a.swapaxes(0, 1)  # not contiguous
        b_shape = a.shape[int(rng.integers(0, ndim + 1)):] if ndim else ()
        b = (rng.standard_normal(b_shape) * 4 + 0.1).astype(dtype)
        with np.errstate(all="ignore"):
            for name in UNARY:
                if dtype == np.int64 and name in ("exp", "log", "sin", "cos", "tanh", "sqrt",
                                                   "sigmoid"):
                    continue
                _close(getattr(CPU, name)(a), getattr(NumpyBackend, name)(a), name,
                       UNARY_TERMS.get(name, 1))
            for name in BINARY:
                _close(getattr(CPU, name)(a, b), getattr(NumpyBackend, name)(a, b), name)
            g = np.ones(np.broadcast_shapes(a.shape, b.shape), dtype)
            for kernel, args in (("mul_backward", (b, a)), ("div_backward", (b, a))):
                outs = getattr(CPU, kernel)(g, (True, True), *args)
                if outs is not None:  # declined layouts go to the formula
                    assert outs[0].shape == g.shape
        _close(CPU.sum(a), NumpyBackend.sum(a), "sum", max(a.size, 1),
               NumpyBackend.sum(np.abs(a)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_gather_and_scatter_add_rows(dtype, mode, monkeypatch):
    """Rows picked by an int64 array (repeats, negatives), and the backward's scatter-add."""
    monkeypatch.setattr(cpu_mod, "FUSED_MIN", 2)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 7)).astype(dtype)
    for idx in (np.array([3, -1, 3, 0, 49, -50]), np.arange(50)[::-1].copy(),
                np.array([7], dtype=np.int32)):
        for index in (idx, (idx,), (idx, slice(None))):
            np.testing.assert_array_equal(CPU.getitem(x, index), NumpyBackend.getitem(x, index))
        v = rng.standard_normal((idx.size, 7)).astype(dtype)
        got = CPU.index_put(np.zeros_like(x), (idx,), v, True)
        ref = NumpyBackend.index_put(np.zeros_like(x), (idx,), v, True)
        # a row hit k times sums k values, in any order: k terms of |v| summed per element
        hits = np.bincount(idx % 50, minlength=50)
        scale = NumpyBackend.index_put(np.zeros_like(x), (idx,), np.abs(v), True)
        assert_close(got, ref, terms=int(hits.max()), scale=scale)
    for other in ((slice(None), np.array([1, 6])), (np.array([0, 2]), np.array([1, 6])),
                  np.array([[1, 2]]), (np.array([1]), Ellipsis)):  # not a row pick: NumPy
        np.testing.assert_array_equal(CPU.getitem(x, other), NumpyBackend.getitem(x, other))
    for bad in (np.array([50]), np.array([-51])):  # NumPy's own error, no kernel call
        with pytest.raises(IndexError):
            CPU.getitem(x, bad)
        with pytest.raises(IndexError):
            CPU.index_put(np.zeros_like(x), (bad,), np.ones((1, 7), dtype), True)


def test_indexing_backward_with_repeated_rows_matches_torch(on_cpu, torch, monkeypatch):
    monkeypatch.setattr(cpu_mod, "FUSED_MIN", 2)
    monkeypatch.setattr(cpu_mod, "PARALLEL_MIN", 8)
    w = sg.tensor(np.arange(40.0).reshape(10, 4), requires_grad=True)
    idx = sg.tensor([1, 1, -1, 3, 1])
    (w[idx] * sg.arange(20.0).reshape(5, 4)).sum().backward()
    tw = to_torch(torch, w)
    (tw[torch.tensor([1, 1, -1, 3, 1])] * torch.arange(20.0).reshape(5, 4)).sum().backward()
    # sums of small integers: exact in float64, in any order
    np.testing.assert_array_equal(w.grad.numpy(), tw.grad.numpy())


def _close(got, ref, name, terms=1, scale=None):
    """Kernel against reference: ``terms`` roundings (see UNARY_TERMS), elementwise relative
    to |reference| unless a scale is given; integer results exactly."""
    assert got.shape == ref.shape and got.dtype == ref.dtype, name
    assert_close(got, ref, terms=terms, scale=np.abs(ref) if scale is None else scale,
                 msg=name)


def test_kernel_inputs_are_validated_before_the_call(mode):
    """Mismatched lengths never reach a kernel: the backend declines or uses NumPy."""
    g = np.ones(10)
    assert CPU.tanh_backward(g, (True,), np.ones(4)) is None
    assert CPU.tanh_backward(g, (True,), np.ones(10, np.float32)) is None
    strided = np.linspace(0, 1, 20)[::2]  # not contiguous: NumPy computes it
    (got,) = CPU.tanh_backward(g, (True,), strided)
    # g (1 - y y): three roundings; 1 - y y cancels, so relative to 1 + y y
    assert_close(got, 1 - strided * strided, terms=3, scale=1 + strided * strided)
    assert CPU.mul_backward(g, (True, True), np.ones(4), np.ones(10)) is None
    with pytest.raises(ValueError):
        CPU.add(np.ones(10), np.ones(4))  # NumPy's broadcast error, no kernel call
    assert CPU.where_backward(g, (False, True, True), np.ones(10)) is None  # not bool


# -- the public API on this backend ----------------------------------------------------------
def test_large_tensors_use_parallel_kernels_and_match_torch(on_cpu, rng, torch, monkeypatch):
    monkeypatch.setattr(cpu_mod, "PARALLEL_MIN", 1000)
    a = sg.tensor(rng.standard_normal((50, 40)).astype(np.float32), requires_grad=True)
    b = sg.tensor(rng.standard_normal((50, 40)).astype(np.float32), requires_grad=True)
    y = (sg.addcmul(a, a, b, value=0.5).tanh() * b).sigmoid().sum()
    y.backward()
    ta, tb = to_torch(torch, a), to_torch(torch, b)
    (torch.addcmul(ta, ta, tb, value=0.5).tanh() * tb).sigmoid().sum().backward()
    assert np.isfinite(y.item())
    # forward: addcmul 2, tanh 2, mul 1, sigmoid 3; backward: sigmoid' 2, mul 1, tanh' 2,
    # addcmul's partials 2, a's two paths added 1 (no sums over elements)
    terms = 2 + 2 + 1 + 3 + 2 + 1 + 2 + 2 + 1
    assert_close(a.grad, ta.grad, terms=terms)
    assert_close(b.grad, tb.grad, terms=terms)


def test_addcmul_matches_torch(cpu_backend, torch):
    a = sg.tensor([[1.0, -2.0], [0.5, 3.0]], requires_grad=True)
    b = sg.tensor([2.0, -1.0], requires_grad=True)
    y = sg.addcmul(a, a, b, value=2.0)
    assert y.grad_fn.name() == "AddcmulBackward0"
    assert y.grad_fn._saved_value == 2.0 and y.grad_fn._saved_tensor1 is a
    y.sum().backward()
    ta, tb = to_torch(torch, a), to_torch(torch, b)
    torch.addcmul(ta, ta, tb, value=2.0).sum().backward()
    # small dyadic values: every product and sum is exact
    np.testing.assert_array_equal(a.grad.numpy(), ta.grad.numpy())
    np.testing.assert_array_equal(b.grad.numpy(), tb.grad.numpy())
    with pytest.raises(TypeError, match="tensor1"):
        sg.addcmul(a, 2.0, b)


def test_cpu_backend_is_the_default_unless_the_environment_says_numpy():
    import os
    import subprocess
    import sys

    code = "import symgrad; print(type(symgrad.backends.backend_for('cpu')).__name__)"
    env = {k: v for k, v in os.environ.items() if k != "SYMGRAD_CPU_BACKEND"}
    names = [subprocess.run([sys.executable, "-c", code], env=extra, capture_output=True,
                            text=True, check=True).stdout.strip()
             for extra in (env, {**env, "SYMGRAD_CPU_BACKEND": "numpy"})]
    assert names == ["CpuBackend", "NumpyBackend"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_add_scaled_in_place_matches_torch_add_alpha(dtype, mode, rng, torch):
    """SGD's ``p += -lr * grad`` runs as one in-place pass; every tier gives torch's
    ``add_(other, alpha=)`` (alpha rounded to the tensor's dtype, as torch does)."""
    be = cpu_mod.CpuBackend()
    dst = rng.standard_normal(200).astype(dtype)  # below the default FUSED_MIN
    src = rng.standard_normal(200).astype(dtype)
    scale = np.abs(dst) + np.abs(dtype(-0.013) * src)  # the two terms, elementwise
    expected = torch.from_numpy(dst.copy()).add_(torch.from_numpy(src), alpha=-0.013).numpy()
    buffer = dst
    calls = []
    real_run = cpu_mod._run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod, "_run", lambda name, *a: (calls.append(name), real_run(name, *a)))
        assert be.add_scaled_(dst, src, -0.013) is None
    assert dst is buffer  # in place
    assert calls == ([] if mode == "numpy" else ["add_scaled_f"])
    # alpha * src, then the sum (torch may fuse them as an FMA): two roundings
    assert_close(dst, expected, terms=2, scale=scale)
    # shapes a kernel does not take (broadcasting, mixed dtypes) go to NumPy
    row = np.ones((4, 3), dtype)
    be.add_scaled_(row, np.arange(3, dtype=dtype), 2.0)
    np.testing.assert_array_equal(row, 1 + 2 * np.arange(3, dtype=dtype)[None, :].repeat(4, 0))


def test_large_matmul_results_reuse_pooled_buffers_without_clobbering(rng):
    """A weight gradient is freed by zero_grad and made again by the next backward: big
    2-D matmul results come from the buffer pool (no fresh pages), never from a live one."""
    be = cpu_mod.CpuBackend()
    a = rng.standard_normal((256, 64)).astype(np.float32)
    b = rng.standard_normal((64, 784)).astype(np.float32)
    assert 256 * 784 * 4 >= cpu_mod.POOL_MIN
    first = be.matmul(a, b)
    # K = 64 products summed (BLAS may block them differently), relative to |a| @ |b|
    scale = np.abs(a) @ np.abs(b)
    assert_close(first, a @ b, terms=64, scale=scale)
    keep = first.copy()
    second = be.matmul(a * 2, b)  # `first` is alive: a different buffer
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, keep)
    assert_close(second, 2 * keep, terms=64, scale=2 * scale)
    address = first.__array_interface__["data"][0]
    del first
    third = be.matmul(a, b)  # the freed buffer comes back
    assert third.__array_interface__["data"][0] == address
    assert_close(third, keep, terms=64, scale=scale)
    # small, batched or mixed-dtype products are plain np.matmul
    small = be.matmul(a[:2], b[:, :3])
    assert_close(small, a[:2] @ b[:, :3], terms=64, scale=scale[:2, :3])
    batched = be.matmul(np.stack([a, a]), b)
    assert batched.shape == (2, 256, 784)



# the nn ops with fused backward rules: (builder given the library, see _lib, then the
# inputs; input shapes); every input requires grad
NN_CASES = {
    # nn.Linear: bias, x, W.t() (mat2 column-major: its grad comes back in W's layout)
    "addmm": (lambda m, b, x, w: m.addmm(b, x, w.t()), [(5,), (3, 4), (5, 4)]),
    "addmm-batch-bias": (lambda m, b, x, w: m.addmm(b, x, w), [(3, 5), (3, 4), (4, 5)]),
    "addmm-scaled": (lambda m, b, x, w: m.addmm(b, x, w, beta=0.5, alpha=-2.0),
                     [(1, 5), (3, 4), (4, 5)]),
    "addmm-transposed-mat1": (lambda m, b, x, w: m.addmm(b, x.t(), w),
                              [(5,), (4, 3), (4, 5)]),
    "mse_loss": (lambda m, a, b: m.nn.functional.mse_loss(a, b), [(3, 4), (3, 4)]),
    "mse_loss-sum": (lambda m, a, b: m.nn.functional.mse_loss(a, b, reduction="sum"),
                     [(6,), (6,)]),
    "mse_loss-none": (lambda m, a, b: m.nn.functional.mse_loss(a, b, reduction="none"),
                      [(2, 3), (2, 3)]),
    "mse_loss-broadcast": (lambda m, a, b: m.nn.functional.mse_loss(a, b), [(3, 4), (4,)]),
    # conv: im2col + batched BLAS forward/backward (backends/conv_numpy.py)
    "convolution": (lambda m, x, w, b: m.nn.functional.conv2d(x, w, b, stride=2, padding=1,
                                                              groups=2),
                    [(2, 4, 6, 5), (6, 2, 3, 3), (6,)]),
    "convolution-1d": (lambda m, x, w: m.nn.functional.conv1d(x, w, padding=2, dilation=2),
                       [(3, 2, 7), (4, 2, 3)]),
    # layer norm: one Numba pass per row forward and backward (from FUSED_MIN elements)
    "native_layer_norm": (lambda m, x, w, b: m.nn.functional.layer_norm(x, (16,), w, b),
                          [(4, 8, 16), (16,), (16,)]),
    "native_layer_norm-two-dims": (lambda m, x, w, b: m.nn.functional.layer_norm(
        x, (8, 16), w, b), [(4, 8, 16), (8, 16), (8, 16)]),
    "native_layer_norm-no-affine": (lambda m, x: m.nn.functional.layer_norm(x, (64,)),
                                    [(2, 3, 64)]),
    # scaled_dot_product_attention's _safe_softmax: softmax's fused backward kernel
    "safe_softmax": (lambda m, a: m.safe_softmax(a, -1), [(3, 4)]),
    "safe_softmax-first-dim": (lambda m, a: m.safe_softmax(a, 0), [(3, 4)]),
}


def _lib(module):
    """What the NN_CASES builders call, from symgrad or from torch."""
    import types

    addmm = module.nn.functional.addmm if module is sg else module.addmm
    if module is sg:
        from symgrad.ops._ints import u64

        def safe_softmax(x, dim):
            return sg.autograd.function.apply(OPS["safe_softmax"], (x,), {"dim": u64(dim)})
    else:
        safe_softmax = module._safe_softmax
    return types.SimpleNamespace(addmm=addmm, nn=module.nn, safe_softmax=safe_softmax)


@pytest.mark.parametrize("case", sorted(NN_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.filterwarnings("ignore:Using a target size")  # torch, on the broadcast case
def test_nn_fused_backward_equals_formulas_and_torch(case, dtype, on_cpu, rng, torch):
    """addmm's, mse_loss's and conv's one-call backward (no graph recorded) agrees with their
    tensor-op formulas (create_graph) and with torch, values and memory layout alike."""
    fn, shapes = NN_CASES[case]
    xs = [sg.tensor(_signed(rng, shp, dtype), requires_grad=True) for shp in shapes]
    y = fn(_lib(sg), *xs)
    g = sg.tensor(np.asarray(rng.standard_normal(y.shape), dtype=dtype))
    calls = []
    kernel = OPS[case.split("-")[0]].fused_backward
    real = getattr(cpu_mod.CpuBackend, kernel)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod.CpuBackend, kernel,
                   staticmethod(lambda *a: calls.append(1) or real(*a)))
        fused = sg.autograd.grad(y, xs, g, retain_graph=True)
        assert calls == [1]
        formula = sg.autograd.grad(y, xs, g, create_graph=True)
        assert calls == [1]  # recording a graph: the formulas ran
    txs = [to_torch(torch, x) for x in xs]
    expected = torch.autograd.grad(fn(_lib(torch), *txs), txs, to_torch(torch, g))
    # the products and reductions (matmul K, the bias's batch sum, the loss's mean) run over
    # at most all elements in play; they sum products of g, the inputs and alpha/beta (<= 2)
    terms = sum(x.numel() for x in xs) + y.numel()
    for a, b, e in zip(fused, formula, expected, strict=True):
        assert a.dtype is b.dtype and a.shape == b.shape == tuple(e.shape)
        assert a.stride() == b.stride() == e.stride()
        scale = magnitude(e, *xs) * 2 * max(1.0, magnitude(g))
        assert_close(a, b, terms=terms, scale=scale, msg="fused vs formula")
        assert_close(a, e, terms=terms, scale=scale, msg="fused vs torch")


def test_linear_bias_gradient_passed_through_never_aliases_the_callers_gradient(on_cpu, rng):
    """addmm's fused backward hands the incoming gradient itself to a same-shape bias; it
    keeps that gradient's storage, so the bias's .grad is never the caller's tensor (which
    the next backward would then accumulate into)."""
    b = sg.tensor(np.zeros((2, 3), np.float32), requires_grad=True)
    x = sg.tensor(rng.standard_normal((2, 4)).astype(np.float32))
    w = sg.tensor(rng.standard_normal((4, 3)).astype(np.float32))
    g = sg.ones(2, 3)
    for _ in range(2):
        sg.nn.functional.addmm(b, x, w).backward(g)
    assert not np.shares_memory(b.grad.numpy(), g.numpy())
    np.testing.assert_array_equal(g.numpy(), np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(b.grad.numpy(), np.full((2, 3), 2, np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_outer_product_matmul_equals_numpy(dtype, mode, rng):
    """A k=1 matmul (batch-1 weight gradient) runs as one multiply per element: the same
    values as gemm, for contiguous and transposed operands."""
    be = cpu_mod.CpuBackend()
    g = rng.standard_normal((1, 20)).astype(dtype)  # 200 elements: NumPy by default
    x = rng.standard_normal((1, 10)).astype(dtype)
    calls = []
    real_run = cpu_mod._run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod, "_run", lambda name, *a: (calls.append(name), real_run(name, *a)))
        out = be.matmul(g.T, x)  # (20, 1) @ (1, 10), g.T is a strided view
        wide = be.matmul(np.ascontiguousarray(x.T), g)
    assert calls == ([] if mode == "numpy" else ["outer_f", "outer_f"])
    np.testing.assert_array_equal(out, np.matmul(g.T, x))
    np.testing.assert_array_equal(wide, np.matmul(x.T, g))
    assert out.shape == (20, 10) and out.flags.c_contiguous


@pytest.mark.parametrize("mode", ["serial", "parallel"])
def test_kernel_gelu_float32_loops_equal_the_stanza_and_torch(mode, monkeypatch, torch):
    """Exact GELU on float32 from FUSED_MIN elements runs Numba loops with erf from
    polynomials (the C library's erf only near a float32 rounding boundary): forward and
    backward equal the stanza's NumPy expressions (erf rounded from the C library's) bit for
    bit, the special values included, and torch to float32 rounding."""
    if mode == "parallel":
        monkeypatch.setattr(cpu_mod, "PARALLEL_MIN", 8)
    rng = np.random.default_rng(7)
    x = np.concatenate([np.linspace(-6, 6, 3001), rng.standard_normal(1500) * 3,
                        [0.0, -0.0, 1e-30, -1e-38, 3.92, 3.93, 4.0, -4.0, 1.0, -1.0, 30.0,
                         -30.0, np.inf, -np.inf, np.nan]]).astype(np.float32)
    g = rng.standard_normal(x.shape).astype(np.float32)
    assert x.size >= cpu_mod.FUSED_MIN
    calls = []
    real_run = cpu_mod._run
    monkeypatch.setattr(cpu_mod, "_run", lambda name, *a: (calls.append(name),
                                                           real_run(name, *a))[1])
    t = sg.tensor(x, requires_grad=True)
    y = sg.nn.functional.gelu(t)
    y.backward(sg.tensor(g))
    assert {"gelu_f32", "gelu_b_prep_f32", "gelu_b_f32"} <= set(calls)
    with np.errstate(all="ignore"):
        ref_y = NumpyBackend.gelu(x)
        (ref_g,) = cpu_mod._gelu_backward_stanza(g, (True,), "none", x)
    for got, ref in ((y.detach().numpy(), ref_y), (t.grad.numpy(), ref_g)):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
        ok = ~np.isnan(ref)
        ulps = np.abs(got[ok].view(np.int32).astype(np.int64)
                      - ref[ok].view(np.int32).astype(np.int64))
        assert ulps.max() == 0
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.gelu(tx)
    ty.backward(torch.tensor(g))
    ok = np.isfinite(x)
    assert_close(y.detach().numpy()[ok], ty.detach().numpy()[ok], terms=8,
                 scale=np.abs(x[ok]) + 1)
    assert_close(t.grad.numpy()[ok], tx.grad.numpy()[ok], terms=8,
                 scale=np.abs(g[ok]) * (np.abs(x[ok]) + 1))


def test_kernel_erf_rounds_to_the_c_librarys_erf_in_float32():
    """The kernels' erf (``erf_f32_rows`` in its erf-only mode, in groups of ERF_GROUP as
    the GELU loops call it) is the C library's erf rounded to float32 on an even sample of
    every float32 in (0, 4.2) and its negatives (erf is odd; from 3.92 it rounds to 1): a
    polynomial with a wrong coefficient or a broken evaluation order would differ on many
    of them (benchmarks/erf_exhaustive.py checks every float32)."""
    import math

    from numba import njit

    from symgrad.backends.cpu import kernels

    rows, group, only = kernels.erf_f32_rows, kernels.ERF_GROUP, kernels.ERF_ONLY

    @njit
    def run(t, out):
        one = np.float32(1)
        for lo in range(0, t.size, group):
            rows(t, one, np.uint64(lo), np.uint64(min(lo + group, t.size)), only, out, out,
                 out)

    lo, hi = np.array([0.0, 4.2], np.float32).view(np.int32)
    t = np.arange(lo + 1, hi, 4099, dtype=np.int32).view(np.float32)
    got = np.empty_like(t)
    run(t, got)
    want = np.frompyfunc(math.erf, 1, 1)(t.astype(np.float64)).astype(np.float64)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    run(-t, got)
    np.testing.assert_array_equal(got, -want.astype(np.float32))


def test_kernel_erf_rows_take_the_c_librarys_erf_near_a_float32_rounding_boundary():
    """The GELU loops' erf (``erf_f32_rows``) rounded to float32 is the C library's erf
    rounded to float32 where its polynomials alone round the other way (arguments found by
    scanning every float32), around the ends of the polynomials' ranges, on subnormals and
    the special values; each argument fills a group of its own, alone (the group takes the
    polynomial of its range) or after a sentinel that makes the group take the |t| < 2
    polynomial or the full selection; compiled with FMA contraction (as the kernels are)
    and without. Without the fallback to the C library, or with a wrong choice of
    polynomial, some would differ."""
    import math

    from numba import njit

    from symgrad.backends.cpu import kernels

    rows, group, only = kernels.erf_f32_rows, kernels.ERF_GROUP, kernels.ERF_ONLY
    one = np.float32(1)

    def run(t, out):
        for g in range((t.size + group - 1) // group):
            rows(t, one, np.uint64(g * group), np.uint64(min(g * group + group, t.size)),
                 only, out, out, out)

    # each polynomial alone rounds wrong: erf_small at the first three, erf_mid, erf_tail
    hard = np.array([0.29928043484687805, 0.4595514237880707, 0.5165169835090637,
                     1.960774302482605, 3.100735902786255], np.float32)
    alone = [kernels.erf_small.py_func(float(v)) if v < 1 else kernels.erf_full.py_func(float(v))
             for v in hard]
    assert (np.float32(alone) != np.array([math.erf(v) for v in hard], np.float32)).all()
    edges = np.array([1.0, 2.0, 3.92, 3.9192059], np.float32).view(np.int32)
    edges = (edges[:, None] + np.arange(-3, 4)).ravel().view(np.float32)
    special = np.array([0.0, 1e-45, 1e-40, 1.1754942e-38, 1.1754944e-38, 1e-30, 30.0,
                        np.inf, np.nan], np.float32)
    t = np.concatenate([hard, edges, special])
    t = np.concatenate([t, -t])
    want = np.array([math.erf(v) for v in t.astype(np.float64)], np.float32)
    for fastmath in ({"contract"}, False):
        loop = njit(fastmath=fastmath)(run)
        for sentinel in (None, 1.5, 3.0):
            u, w = np.repeat(t, group), np.repeat(want, group)
            if sentinel is not None:
                u[::group], w[::group] = sentinel, math.erf(sentinel)
            got = np.empty_like(u)
            loop(u, got)
            np.testing.assert_array_equal(got, w)


def test_kernel_layer_norm_runs_one_loop_each_way_from_fused_min(monkeypatch, rng):
    """A layer norm from FUSED_MIN elements is one Numba pass forward and one backward (the
    values are compared with the formulas and torch in test_nn_fused_backward_...)."""
    calls = []
    real_run = cpu_mod._run
    monkeypatch.setattr(cpu_mod, "_run", lambda name, *a: (calls.append(name),
                                                           real_run(name, *a))[1])
    x = sg.tensor(rng.standard_normal((4, 8, 16)).astype(np.float32), requires_grad=True)
    ln = sg.nn.LayerNorm(16)
    ln(x).sum().backward()
    assert calls.count("layer_norm_rows") == 1 and calls.count("layer_norm_rows_b") == 1
    assert x.grad.shape == x.shape and ln.weight.grad.shape == ln.bias.grad.shape == (16,)
    np.testing.assert_array_equal(ln.bias.grad.numpy(), np.full(16, 32, np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_softmax_forward_loops_match_reference_and_torch(dtype, monkeypatch, torch):
    """softmax and _safe_softmax along the last dim from FUSED_MIN elements run two Numba
    passes around NumPy's exp: the reference's values to rounding of the row sums, NaN rows
    where it has them, zero rows for a safe softmax of all -inf rows; other dims decline."""
    from symgrad.ops._ints import u64

    calls = []
    real_run = cpu_mod._run
    monkeypatch.setattr(cpu_mod, "_run", lambda name, *a: (calls.append(name),
                                                           real_run(name, *a))[1])
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 4, 16, 16)) * 3).astype(dtype)
    x[..., np.triu(np.ones((16, 16), bool), 1)] = -np.inf  # a causal mask
    x[0, 0, 5, :] = -np.inf  # a dead row
    x[1, 1, 3, 4] = np.nan
    t = sg.tensor(x)

    def safe(z, dim):
        return sg.autograd.function.apply(OPS["safe_softmax"], (z,), {"dim": u64(dim)})

    got = {"safe": safe(t, -1), "plain": sg.softmax(t, -1), "dim2": sg.softmax(t, 2)}
    assert calls.count("softmax_norm_rows") == 2  # the last-dim ones
    with np.errstate(all="ignore"):
        ref = {"safe": OPS["safe_softmax"].forward(NumpyBackend(), x, u64(-1)),
               "plain": OPS["softmax"].forward(NumpyBackend(), x, -1),
               "dim2": OPS["softmax"].forward(NumpyBackend(), x, 2)}
    tx = torch.tensor(x)
    expected = {"safe": torch._safe_softmax(tx, -1), "plain": torch.softmax(tx, -1),
                "dim2": torch.softmax(tx, 2)}
    assert not np.isnan(got["safe"].numpy()[0, 0, 5]).any()
    np.testing.assert_array_equal(got["safe"].numpy()[0, 0, 5], 0)
    for k in got:
        for other in (ref[k], expected[k].numpy()):
            assert_close(got[k].numpy(), other, terms=16, scale=1.0, msg=k)  # a row's sum


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_kernel_embedding_fused_backward_equals_formula_and_torch(padding_idx, on_cpu, torch):
    """EmbeddingBackward0's one-pass kernel (repeated indices add up, in the formula's
    order) gives the formula's gradient bit for bit and torch's; with a padding row the
    kernel declines and the formula zeroes that row."""
    rng = np.random.default_rng(5)
    w = sg.tensor(rng.standard_normal((20, 16)).astype(np.float32), requires_grad=True)
    idx = rng.integers(0, 20, (6, 9))
    idx[0, :4] = 3  # repeats, and the padding row when padding_idx is 3
    g = sg.tensor(rng.standard_normal((6, 9, 16)).astype(np.float32))
    y = sg.nn.functional.embedding(sg.tensor(idx), w, padding_idx=padding_idx)
    calls = []
    real = cpu_mod.CpuBackend.embedding_backward
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod.CpuBackend, "embedding_backward",
                   staticmethod(lambda *a: calls.append(real(*a)) or calls[-1]))
        (fused,) = sg.autograd.grad(y, [w], g, retain_graph=True)
        (formula,) = sg.autograd.grad(y, [w], g, create_graph=True)
    assert len(calls) == 1 and (calls[0] is None) == (padding_idx is not None)
    np.testing.assert_array_equal(fused.numpy(), formula.detach().numpy())
    tw = torch.tensor(w.detach().numpy(), requires_grad=True)
    ty = torch.nn.functional.embedding(torch.tensor(idx), tw, padding_idx=padding_idx)
    (expected,) = torch.autograd.grad(ty, [tw], torch.tensor(g.numpy()))
    assert_close(fused.numpy(), expected.numpy(), terms=idx.size, scale=magnitude(g))


@pytest.mark.parametrize("args", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                  dict(kernel_size=2, dilation=2, ceil_mode=True)])
def test_kernel_max_pool_forward_loop_equals_reference_and_torch(args, monkeypatch, torch):
    """max_pool2d's windows in one Numba pass from FUSED_MIN elements: the reference's values
    and indices exactly (ties: the first maximum; a NaN: the first NaN), and torch's on
    finite inputs."""
    calls = []
    real_run = cpu_mod._run
    monkeypatch.setattr(cpu_mod, "_run", lambda name, *a: (calls.append(name),
                                                           real_run(name, *a))[1])
    rng = np.random.default_rng(11)
    x = np.round(rng.standard_normal((2, 3, 9, 10)), 1).astype(np.float32)  # many ties
    xn = x.copy()
    xn[0, 0, 1, 1] = xn[1, 2, 4, 5] = np.nan
    for data in (x, xn):
        got = sg.nn.functional.max_pool2d(sg.tensor(data), return_indices=True, **args)
        with np.errstate(all="ignore"):
            ref = OPS["max_pool2d_with_indices"].forward(
                NumpyBackend(), data, *[_max_param(args, k) for k in (
                    "kernel_size", "stride", "padding", "dilation", "ceil_mode")])
        np.testing.assert_array_equal(got[0].numpy(), ref[0])
        np.testing.assert_array_equal(got[1].numpy(), ref[1])
    assert calls.count("max_pool_taps") == 2
    expected = torch.nn.functional.max_pool2d(torch.tensor(x), return_indices=True, **args)
    plain = sg.nn.functional.max_pool2d(sg.tensor(x), return_indices=True, **args)
    np.testing.assert_array_equal(plain[0].numpy(), expected[0].numpy())
    np.testing.assert_array_equal(plain[1].numpy(), expected[1].numpy())


def _max_param(args: dict, key: str):
    """max_pool2d_with_indices's forward arguments as F.max_pool2d records them."""
    k = args["kernel_size"]
    return {"kernel_size": (k, k), "stride": (args.get("stride", k),) * 2,
            "padding": (args.get("padding", 0),) * 2, "dilation": (args.get("dilation", 1),) * 2,
            "ceil_mode": args.get("ceil_mode", False)}[key]


@pytest.mark.parametrize("args", [dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1)])
def test_kernel_max_pool_fused_backward_equals_formula_and_torch(args, on_cpu, torch):
    """MaxPool2DWithIndicesBackward0's one-pass kernel: the formula's gradient bit for bit
    (overlapping windows add in its order) and torch's."""
    rng = np.random.default_rng(13)
    x = sg.tensor(np.round(rng.standard_normal((2, 3, 16, 18)), 1).astype(np.float32),
                  requires_grad=True)
    y = sg.nn.functional.max_pool2d(x, **args)
    g = sg.tensor(rng.standard_normal(y.shape).astype(np.float32))
    calls = []
    real = cpu_mod.CpuBackend.max_pool2d_with_indices_backward
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod.CpuBackend, "max_pool2d_with_indices_backward",
                   staticmethod(lambda *a: calls.append(real(*a)) or calls[-1]))
        (fused,) = sg.autograd.grad(y, [x], g, retain_graph=True)
        (formula,) = sg.autograd.grad(y, [x], g, create_graph=True)
    assert len(calls) == 1 and calls[0] is not None
    np.testing.assert_array_equal(fused.numpy(), formula.detach().numpy())
    tx = torch.tensor(x.detach().numpy(), requires_grad=True)
    (expected,) = torch.autograd.grad(torch.nn.functional.max_pool2d(tx, **args), [tx],
                                      torch.tensor(g.numpy()))
    assert_close(fused.numpy(), expected.numpy(), terms=9, scale=magnitude(g))
