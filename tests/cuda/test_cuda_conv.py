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
