"""The convolution's fast kernels (issue 21: conv2d within 1.5x torch) against torch 2.13.

``be.convolution`` (the forward, on the numpy and cpu backends) and, on the cpu backend,
``be.convolution_backward`` (the fused backward, used when no graph is recorded; the NumPy
oracle keeps running the formulas, as for every fused op) replace the generic lowering of
symgrad/ops/conv.py. These tests check that they are really taken (no ``ConvPlan`` is
built, so neither the per-tap slices nor the int64 col2im index; on the cpu backend the
Numba im2col/col2im loops run), that they give torch's values and gradients for stride,
padding, dilation, groups, conv1d and conv2d in float32 and float64, and that whatever
they do not cover (create_graph, integers, empty batches, replaced formulas) still runs
the generic path with the same results.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad.autograd.function import apply
from symgrad.backends.cpu import backend as cpu_backend_module
from symgrad.ops import OPS
from symgrad.ops import conv as conv_ops

torch = pytest.importorskip("torch")
TF = torch.nn.functional
F = sg.nn.functional

DTYPES = {"float32": (sg.float32, torch.float32), "float64": (sg.float64, torch.float64)}

#: (fn, input shape, weight shape, bias?, kwargs): every geometry the kernels branch on
CASES = [
    ("conv2d", (3, 2, 9, 8), (4, 2, 3, 3), True, {}),
    ("conv2d", (2, 4, 9, 9), (6, 2, 3, 3), True, {"stride": 2, "padding": 1, "groups": 2}),
    ("conv2d", (2, 4, 10, 9), (4, 1, 3, 2), False, {"stride": (2, 3), "padding": (2, 1),
                                                     "dilation": (2, 3), "groups": 4}),
    ("conv2d", (2, 3, 6, 6), (5, 3, 3, 3), True, {"padding": 4}),  # rows all padding
    ("conv2d", (2, 3, 7, 7), (2, 3, 2, 2), True, {"padding": "same", "dilation": 2}),
    ("conv2d", (1, 6, 12, 12), (16, 6, 5, 5), True, {}),  # LeNet's conv2, one image
    ("conv1d", (3, 4, 11), (6, 2, 3), True, {"stride": 2, "padding": 2, "dilation": 3,
                                              "groups": 2}),
    ("conv1d", (2, 3, 9), (4, 3, 4), False, {"padding": 3}),
    ("conv1d", (3, 8), (2, 3, 4), True, {"padding": "same"}),  # unbatched, uneven 'same'
]


def _is_wide(case) -> bool:
    """Stride 1 without padding: the cpu backend's wide columns (one run per tap)."""
    kw = case[4]
    return kw.get("stride", 1) in (1, (1, 1)) and kw.get("padding", 0) in (0, (0, 0))


def _tensors(shape, wshape, bias, dtype, seed=0):
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-1, 1, shape), rng.uniform(-1, 1, wshape),
              rng.uniform(-1, 1, wshape[0]) if bias else None]
    sd, td = DTYPES[dtype]
    ours = [None if a is None else sg.tensor(a, dtype=sd, requires_grad=True) for a in arrays]
    theirs = [None if a is None else torch.tensor(a, dtype=td, requires_grad=True)
              for a in arrays]
    return ours, theirs


@pytest.fixture
def generic_calls(monkeypatch):
    """Counts what the generic lowering builds (ConvPlan, the col2im index) and which Numba
    conv loops the cpu backend runs."""
    conv_ops.conv_plan.cache_clear()
    conv_ops.col2im_index.cache_clear()
    ran = []
    real_run = cpu_backend_module._run

    def run(name, n, *args):
        ran.append(name)
        return real_run(name, n, *args)

    monkeypatch.setattr(cpu_backend_module, "_run", run)

    def counts():
        return {"plans": conv_ops.conv_plan.cache_info().currsize,
                "index": conv_ops.col2im_index.cache_info().currsize,
                "im2col": ran.count("conv_im2col") + ran.count("conv_im2col_wide"),
                "col2im": ran.count("conv_col2im") + ran.count("conv_col2im_wide"),
                "wide": sum(name.endswith("_wide") for name in ran)}

    return counts


def _check_against_torch(case, dtype, after_forward=lambda: None):
    fn, shape, wshape, bias, kw = case
    (x, w, b), (xt, wt, bt) = _tensors(shape, wshape, bias, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch and symgrad: 'same', even kernel
        y = getattr(F, fn)(x, w, b, **kw)
        yt = getattr(TF, fn)(xt, wt, bt, **kw)
    after_forward()
    taps = wshape[1] * math.prod(wshape[2:])
    assert y.dtype is DTYPES[dtype][0]
    assert_close(y, yt, terms=taps + 1, scale=taps + 1)
    g = np.random.default_rng(1).uniform(-1, 1, tuple(yt.shape))
    y.backward(sg.tensor(g, dtype=y.dtype))
    yt.backward(torch.tensor(g, dtype=yt.dtype))
    fan_out = wshape[0] * math.prod(wshape[2:])
    positions = math.prod(yt.shape) // yt.shape[-1 - len(wshape[2:])]
    assert x.grad.dtype is y.dtype and w.grad.dtype is y.dtype
    assert_close(x.grad, xt.grad, terms=fan_out, scale=fan_out)
    assert_close(w.grad, wt.grad, terms=positions, scale=positions)
    if bias:
        assert_close(b.grad, bt.grad, terms=positions, scale=positions)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}{c[1]}{c[2]}{c[4]}")
def test_fast_kernels_match_torch_and_are_taken(case, dtype, cpu_backend, generic_calls):
    def forward_was_fast():
        assert generic_calls()["plans"] == 0  # no generic lowering in the forward

    _check_against_torch(case, dtype, forward_was_fast)
    calls = generic_calls()
    if cpu_backend == "cpu":  # forward + weight grad gather, input grad scatters: Numba
        assert calls == {"plans": 0, "index": 0, "im2col": 2, "col2im": 1,
                         "wide": 3 * _is_wide(case)}, calls
    else:  # the oracle's backward: the formulas (their col2im index), NumPy's gather
        assert calls == {"plans": 1, "index": 1, "im2col": 0, "col2im": 0, "wide": 0}, calls


@pytest.fixture
def on_cpu():
    from symgrad import backends

    previous = backends.set_cpu_backend("cpu")
    yield
    backends.set_cpu_backend(previous)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_fast_backward_equals_the_formulas(dtype, on_cpu, generic_calls):
    """The fused backward and the registered formulas (create_graph runs those) agree."""
    (x, w, b), _ = _tensors((2, 4, 8, 7), (6, 2, 3, 2), True, dtype)
    kw = {"stride": (2, 1), "padding": (1, 2), "dilation": (2, 1), "groups": 2}
    g = sg.tensor(np.random.default_rng(2).uniform(-1, 1, (2, 6, 3, 10)), dtype=x.dtype)
    fast = sg.autograd.grad(F.conv2d(x, w, b, **kw), (x, w, b), g)
    assert generic_calls()["index"] == 0
    formulas = sg.autograd.grad(F.conv2d(x, w, b, **kw), (x, w, b), g, create_graph=True)
    assert generic_calls()["index"] == 1  # the formulas' col2im index was built
    assert formulas[0].grad_fn is not None and formulas[1].grad_fn is not None
    for a, e, terms in zip(fast, formulas, (6 * 6, 2 * 3 * 10, 2 * 3 * 10)):
        assert_close(a, e.detach(), terms=terms, scale=terms)


def test_strided_inputs_and_an_expanded_gradient(cpu_backend, generic_calls):
    """Permuted (non-contiguous) input and weight, and ``sum().backward()``'s expanded
    gradient, through the fast kernels."""
    rng = np.random.default_rng(6)
    a, wa = rng.uniform(-1, 1, (3, 9, 8, 4)), rng.uniform(-1, 1, (5, 3, 3, 4))
    x, w = sg.tensor(a, requires_grad=True), sg.tensor(wa, requires_grad=True)
    xt, wt = torch.tensor(a, requires_grad=True), torch.tensor(wa, requires_grad=True)
    y = F.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), stride=(1, 2), padding=1)
    yt = TF.conv2d(xt.permute(0, 3, 1, 2), wt.permute(0, 3, 1, 2), stride=(1, 2), padding=1)
    assert generic_calls()["plans"] == 0
    y.sum().backward()
    yt.sum().backward()
    assert generic_calls()["plans"] == (0 if cpu_backend == "cpu" else 1)
    for ours, theirs, terms in ((y, yt, 37), (x.grad, xt.grad, 45), (w.grad, wt.grad, 108)):
        assert_close(ours, theirs, terms=terms, scale=terms)


def test_three_spatial_dims_run_the_numpy_gather(cpu_backend, generic_calls):
    """The kernels are not 2-D only: a 3-D convolution (the op itself; symgrad has no
    conv3d function) uses NumPy's as_strided gather (and, on cpu, its tap scatter)."""
    (x, w, b), (xt, wt, bt) = _tensors((2, 2, 5, 6, 5), (3, 2, 2, 3, 2), True, "float64")
    params = {"stride": (1, 2, 1), "padding": (1, 0, 1), "dilation": (1, 1, 2),
              "transposed": False, "output_padding": (0, 0, 0), "groups": 1,
              "bias_sym_sizes_opt": (3,)}
    y = apply(OPS["convolution"], (x, w, b), params)
    yt = TF.conv3d(xt, wt, bt, stride=(1, 2, 1), padding=(1, 0, 1), dilation=(1, 1, 2))
    assert generic_calls()["plans"] == 0
    g = np.random.default_rng(3).uniform(-1, 1, tuple(yt.shape))
    y.backward(sg.tensor(g))
    yt.backward(torch.tensor(g))
    if cpu_backend == "cpu":
        assert generic_calls() == {"plans": 0, "index": 0, "im2col": 0, "col2im": 0,
                                   "wide": 0}
    for ours, theirs in ((y, yt), (x.grad, xt.grad), (w.grad, wt.grad), (b.grad, bt.grad)):
        assert_close(ours, theirs, terms=150, scale=150)


def test_what_the_kernels_decline_runs_the_generic_path(cpu_backend, generic_calls):
    xi, wi = np.arange(2 * 3 * 5 * 5).reshape(2, 3, 5, 5) % 7 - 3, np.ones((2, 3, 2, 2), int)
    out = F.conv2d(sg.tensor(xi), sg.tensor(wi))
    assert out.dtype is sg.int64
    assert np.array_equal(out.numpy(), TF.conv2d(torch.tensor(xi), torch.tensor(wi)).numpy())
    assert generic_calls()["plans"] == 1  # integers: the generic lowering
    empty = F.conv2d(sg.zeros(0, 3, 5, 5), sg.zeros(2, 3, 2, 2))
    assert tuple(empty.shape) == (0, 2, 4, 4)


def test_replaced_formulas_are_not_bypassed(cpu_backend, generic_calls, monkeypatch):
    """A fused kernel stands in for the registered formulas only (GradFormulas.pristine):
    a planted formula runs instead."""
    spec = OPS["convolution"]
    monkeypatch.setitem(spec.grads, "weight", lambda grad, input, weight, stride, padding,
                        dilation, transposed, output_padding, groups, bias_sym_sizes_opt:
                        weight * 0 + 7)
    x = sg.randn(1, 2, 4, 4, requires_grad=True)
    w = sg.randn(3, 2, 2, 2, requires_grad=True)
    F.conv2d(x, w).sum().backward()
    assert np.all(w.grad.numpy() == 7)
    assert generic_calls()["index"] == 1  # the input formula's col2im ran too


def test_parallel_loops_give_the_serial_results(on_cpu, monkeypatch):
    """Above PARALLEL_MIN the Numba im2col/col2im run on all cores, one plane per thread
    (no two threads add into one element): the same bits as the serial loops."""
    (x, w, b), _ = _tensors((3, 4, 9, 8), (6, 4, 3, 3), True, "float32")
    g = sg.tensor(np.random.default_rng(5).uniform(-1, 1, (3, 6, 5, 3)), dtype=sg.float32)

    def run():
        y = F.conv2d(x, w, b, stride=(2, 2), padding=(1, 1), dilation=(1, 2))
        return [y.detach().numpy()] + [t.numpy() for t in sg.autograd.grad(y, (x, w, b), g)]

    serial = run()
    monkeypatch.setattr(cpu_backend_module, "PARALLEL_MIN", 0)
    for a, e in zip(run(), serial, strict=True):
        assert np.array_equal(a, e)


# -- the cpu backend's convolution blocked over images (issue 33) ----------------------------
def _images_per_block(monkeypatch, case, dtype, images):
    """Force blocks of ``images`` images (conv_numpy.BLOCK_BYTES from the case's column
    bytes per image)."""
    from symgrad.backends import conv_numpy

    _, shape, wshape, _, kw = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # 'same' with an even kernel
        y = getattr(TF, case[0])(torch.zeros(shape, dtype=torch.float64),
                                 torch.zeros(wshape, dtype=torch.float64), **kw)
    per_image = shape[-len(wshape[2:]) - 1] * math.prod(wshape[2:]) \
        * math.prod(y.shape[-len(wshape[2:]):]) * np.dtype(dtype).itemsize
    monkeypatch.setattr(conv_numpy, "BLOCK_BYTES", images * per_image)
    batch = shape[0] if len(shape) == len(wshape) else 1
    return -(-batch // images)


@pytest.mark.parametrize("images", [1, 2])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}{c[1]}{c[2]}{c[4]}")
def test_blocks_of_images_match_torch(case, dtype, images, on_cpu, generic_calls,
                                      monkeypatch):
    """Blocks of one or two images (a batch of 3 ends in a partial block), through every
    geometry of CASES: torch's values and gradients, one gather per block in the forward
    and in the weight gradient, one col2im per block in the input gradient."""
    blocks = _images_per_block(monkeypatch, case, dtype, images)
    _check_against_torch(case, dtype)
    assert generic_calls() == {"plans": 0, "index": 0, "im2col": 2 * blocks,
                               "col2im": blocks, "wide": 3 * blocks * _is_wide(case)}


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_blocked_equals_the_whole_batch_passes(dtype, on_cpu, generic_calls, monkeypatch):
    """Blocks of two images (5 images: 2 + 2 + 1) and the whole-batch passes (which run above
    CONV_BLOCKED_MAX column elements) agree: the same output and input gradient bits (each
    element's sum runs in one product either way), the weight and bias gradients within
    their sums' rounding; only the gradients asked for are computed."""
    case = ("conv2d", (5, 4, 9, 8), (6, 2, 3, 3), True,
            {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2), "groups": 2})
    (x, w, b), _ = _tensors(case[1], case[2], True, dtype)
    g = sg.tensor(np.random.default_rng(3).uniform(-1, 1, (5, 6, 5, 8)), dtype=x.dtype)

    def run(inputs):
        y = F.conv2d(x, w, b, **case[4])
        return [y.detach().numpy()] + [t.numpy() for t in sg.autograd.grad(y, inputs, g)]

    blocks = _images_per_block(monkeypatch, case, dtype, 2)
    assert blocks == 3
    blocked = run((x, w, b))
    assert generic_calls()["im2col"] == 2 * blocks
    only_w = run((w,))
    assert generic_calls()["im2col"] == 4 * blocks and generic_calls()["col2im"] == blocks
    monkeypatch.setattr(cpu_backend_module, "CONV_BLOCKED_MAX", 0)
    whole = run((x, w, b))
    assert generic_calls()["im2col"] == 4 * blocks + 2
    assert np.array_equal(blocked[0], whole[0]) and np.array_equal(blocked[1], whole[1])
    positions = 5 * 5 * 8
    assert_close(blocked[2], whole[2], terms=positions, scale=positions)
    assert_close(blocked[3], whole[3], terms=positions, scale=positions)
    assert np.array_equal(only_w[1], blocked[2])


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("case", [
    ("conv2d", (3, 2, 9, 8), (4, 1, 3, 3), True, {"dilation": (2, 1), "groups": 2}),
    ("conv2d", (3, 1, 20, 21), (3, 1, 3, 2), True, {}),  # OW 20: the backward is not wide
    ("conv1d", (3, 4, 11), (6, 2, 3), False, {"dilation": 3, "groups": 2}),
], ids=lambda c: f"{c[0]}{c[1]}{c[2]}{c[4]}")
def test_wide_columns_equal_the_blocked_columns(case, dtype, on_cpu, generic_calls,
                                                monkeypatch):
    """Stride 1 without padding runs on wide columns (one contiguous run of the input per
    tap, over the input's full width): the same output bits as the columns of OW-element
    rows (each output's sum is one product's either way, over the same terms), gradients
    within their sums' rounding, and torch's; the backward only below WIDE_BACKWARD_OW."""
    fn, shape, wshape, bias, kw = case
    (x, w, b), _ = _tensors(shape, wshape, bias, dtype)
    params = (x, w, b) if bias else (x, w)
    y = getattr(F, fn)(x, w, b, **kw)
    g = sg.tensor(np.random.default_rng(4).uniform(-1, 1, tuple(y.shape)), dtype=y.dtype)

    def run():
        out = getattr(F, fn)(x, w, b, **kw)
        return [out.detach().numpy()] + [t.numpy() for t in sg.autograd.grad(out, params, g)]

    before = generic_calls()["wide"]
    wide = run()
    backward_wide = y.shape[-1] < cpu_backend_module.WIDE_BACKWARD_OW
    assert generic_calls()["wide"] - before == 1 + 2 * backward_wide
    monkeypatch.setattr(cpu_backend_module, "_WIDE_ON", False)
    plain = run()
    assert generic_calls()["wide"] - before == 1 + 2 * backward_wide
    assert np.array_equal(wide[0], plain[0])
    fan_out = wshape[0] * math.prod(wshape[2:])
    positions = math.prod(y.shape) // y.shape[1]
    assert_close(wide[1], plain[1], terms=fan_out, scale=fan_out)
    for a, e in zip(wide[2:], plain[2:]):
        assert_close(a, e, terms=positions, scale=positions)
    monkeypatch.setattr(cpu_backend_module, "_WIDE_ON", True)
    _check_against_torch(case, dtype)


@pytest.mark.filterwarnings("ignore:.*invalid value:RuntimeWarning")
def test_wide_columns_with_non_finite_values_follow_torch(on_cpu, generic_calls):
    """The wide columns that are no outputs must add nothing: an infinite or NaN input
    beside them (the forward then runs on the plain columns, the weight gradient's wide
    columns are zeroed there) and a non-finite weight (0 * inf; the backward then runs on
    the plain columns) give torch's results, NaN and infinity positions included."""
    rng = np.random.default_rng(8)
    x = rng.uniform(-1, 1, (2, 2, 7, 6))
    x[0, 1, 2, 5] = np.inf  # in a column that is no output for the taps with kw = 0
    x[1, 0, 6, 5] = np.nan
    w = rng.uniform(-1, 1, (3, 2, 3, 3))
    g = rng.uniform(-1, 1, (2, 3, 5, 4))
    inf_w = np.where(np.arange(w.size).reshape(w.shape) == 4, np.inf, w)
    for weight, wide_calls in ((w, 2), (inf_w, 0)):
        before = generic_calls()["wide"]
        xs = sg.tensor(x, dtype=sg.float32, requires_grad=True)
        ws = sg.tensor(weight, dtype=sg.float32, requires_grad=True)
        xt = torch.tensor(x, dtype=torch.float32, requires_grad=True)
        wt = torch.tensor(weight, dtype=torch.float32, requires_grad=True)
        y, yt = F.conv2d(xs, ws), TF.conv2d(xt, wt)
        y.backward(sg.tensor(g, dtype=sg.float32))
        yt.backward(torch.tensor(g, dtype=torch.float32))
        assert_close(y, yt, terms=19, scale=19)
        assert_close(xs.grad, xt.grad, terms=27, scale=27)
        assert_close(ws.grad, wt.grad, terms=40, scale=40)
        assert generic_calls()["wide"] - before == wide_calls
    finite = sg.tensor(np.nan_to_num(x, posinf=1.0), dtype=sg.float32)
    F.conv2d(finite, sg.tensor(inf_w, dtype=sg.float32))
    assert generic_calls()["wide"] == 3  # a finite input: the forward is wide
