"""Convolution and pooling on the CUDA backend (numba's simulator in CI) against the CPU
backend: the same ops, unchanged (their forwards use only backend kernels), give the same
values, gradients, second derivatives and recorded graph on the device."""

from __future__ import annotations

import numpy as np
import pytest
from test_cuda_parity import check

#: (name, fn(L, *tensors), input arrays): small cases, the simulator runs kernels in Python
CASES = [
    ("conv2d", lambda L, x, w, b: L.nn.functional.conv2d(x, w, b, padding=1),
     ((1, 2, 4, 4), (3, 2, 2, 2), (3,))),
    ("conv2d_groups_stride", lambda L, x, w: L.nn.functional.conv2d(
        x, w, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2),
     ((2, 2, 5, 5), (2, 1, 2, 2))),
    ("conv1d_same", lambda L, x, w, b: L.nn.functional.conv1d(x, w, b, padding="same"),
     ((1, 2, 5), (2, 2, 3), (2,))),
    ("max_pool2d", lambda L, x: L.nn.functional.max_pool2d(x, 2, 1, 1, ceil_mode=True),
     ((1, 2, 4, 5),)),
    ("avg_pool2d", lambda L, x: L.nn.functional.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
     ((1, 2, 5, 4),)),
    ("adaptive_avg_pool2d", lambda L, x: L.nn.functional.adaptive_avg_pool2d(x, (3, 2)),
     ((2, 4, 5),)),
]


def _arrays(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_pool_match_cpu(case):
    _, fn, shapes = case
    for dtype in (np.float32, np.float64):
        check(fn, _arrays(shapes, dtype))


@pytest.mark.parametrize("case", CASES[::2], ids=[c[0] for c in CASES[::2]])
def test_conv_pool_second_derivatives_match_cpu(case):
    _, fn, shapes = case
    check(fn, _arrays(shapes, np.float64, 1), create_graph=True)


def test_max_pool_indices_on_the_device_match_cpu():
    import symgrad as sg

    a = np.random.default_rng(2).integers(-2, 3, (1, 2, 5, 5)).astype(np.float32)  # ties
    outs = [sg.nn.functional.max_pool2d(sg.tensor(a, device=d), 3, 2, 1, return_indices=True)
            for d in ("cpu", "cuda")]
    assert outs[1][1].device.type == "cuda"
    assert np.array_equal(outs[0][1].numpy(), outs[1][1].cpu().numpy())
    assert np.array_equal(outs[0][0].numpy(), outs[1][0].cpu().numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_kernels_run_on_the_device_and_match_torch(dtype, monkeypatch):
    """be.convolution / be.convolution_backward (the im2col and col2im launches around the
    batched matmul) are taken on the device, not the generic lowering, and give torch's
    values and gradients; padding, stride, dilation, groups, conv1d and conv2d."""
    torch = pytest.importorskip("torch")
    from _tolerance import assert_close

    import symgrad as sg
    from symgrad.backends.cuda import kernels as K
    from symgrad.ops import conv as conv_ops

    launches = []
    for name in ("conv_im2col", "conv_col2im"):
        real = getattr(K, name)
        monkeypatch.setattr(K, name, lambda *a, _r=real, _n=name: (launches.append(_n),
                                                                    _r(*a))[1])
    conv_ops.conv_plan.cache_clear()
    cases = [("conv2d", (2, 4, 5, 6), (4, 2, 3, 2),
              {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2), "groups": 2}),
             ("conv1d", (2, 3, 7), (2, 3, 3), {"stride": 2, "padding": 1, "dilation": 2})]
    rng = np.random.default_rng(4)
    for fn, xs, ws, kw in cases:
        xa, wa, ba = (rng.uniform(-1, 1, s).astype(dtype) for s in (xs, ws, ws[:1]))
        ours = [sg.tensor(a, device="cuda", requires_grad=True) for a in (xa, wa, ba)]
        theirs = [torch.tensor(a, requires_grad=True) for a in (xa, wa, ba)]
        y = getattr(sg.nn.functional, fn)(*ours, **kw)
        yt = getattr(torch.nn.functional, fn)(*theirs, **kw)
        g = rng.uniform(-1, 1, tuple(yt.shape)).astype(dtype)
        y.backward(sg.tensor(g, device="cuda"))
        yt.backward(torch.tensor(g))
        assert y.device.type == "cuda" and ours[0].grad.device.type == "cuda"
        terms = 2 * 3 * 2 * 6 + 1  # the longest sum: a weight gradient's N * positions
        for a, e in zip([y] + [t.grad for t in ours], [yt] + [t.grad for t in theirs]):
            assert_close(a.detach().cpu(), e, terms=terms, scale=terms)
    assert launches.count("conv_im2col") == 4 and launches.count("conv_col2im") == 2
    assert conv_ops.conv_plan.cache_info().currsize == 0
