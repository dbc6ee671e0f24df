"""Optimizers on a CUDA parameter (numba's simulator in CI, a GPU where one exists)."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg

# roundings in one step of the most involved update (Adam: grad, two moments, bias
# corrections, sqrt, eps, division, the parameter update) on a 3-element parameter
ONE_STEP_TERMS = 16


@pytest.mark.parametrize("name", ["Adam", "AdamW", "RMSprop", "Adagrad", "SGD", "Adadelta",
                                  "Adamax", "NAdam", "RAdam", "ASGD", "Rprop", "Adafactor"])
def test_steps_on_a_cuda_parameter_keep_the_step_count_on_the_cpu(name):
    """As torch (not capturable): ``state['step']`` stays a CPU tensor (ASGD's goes with the
    parameter, as torch's does); the update runs on the parameter's device and equals the
    CPU update within one step's roundings."""
    out = {}
    for dev in ("cpu", "cuda"):
        w = sg.nn.Parameter(sg.tensor([1.0, -2.0, 0.5], dtype=sg.float64, device=dev))
        opt = getattr(sg.optim, name)([w], lr=0.1, **({"momentum": 0.9} if name == "SGD"
                                                       else {}))
        for _ in range(3):
            opt.zero_grad()
            (w * w).sum().backward()
            opt.step()
        if "step" in opt.state[w]:  # ASGD keeps step (with eta, mu) on the parameter's device
            want = dev if name == "ASGD" else "cpu"
            assert opt.state[w]["step"].device.type == want
        out[dev] = w.detach().cpu()
    assert_close(out["cuda"], out["cpu"], terms=3 * ONE_STEP_TERMS)


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_on_a_cuda_parameter_matches_the_cpu(line_search):
    """Two ``.step()`` calls of 3 iterations on a quartic bowl: the flat
    gradient, directions and line search run on the device and give the CPU's iterates."""
    out = {}
    for dev in ("cpu", "cuda"):
        w = sg.nn.Parameter(sg.tensor([1.0, -2.0, 0.5], dtype=sg.float64, device=dev))
        opt = sg.optim.LBFGS([w], max_iter=3, line_search_fn=line_search)

        def closure(w=w, opt=opt, dev=dev):
            opt.zero_grad()
            r = w - sg.tensor([0.5, 2.0, -1.0], dtype=sg.float64, device=dev)
            loss = (r * r * sg.tensor([1.0, 3.0, 5.0], dtype=sg.float64, device=dev)).sum() \
                + (r ** 4).sum()
            loss.backward()
            return loss

        for _ in range(2):
            opt.step(closure)
        assert opt.state[w]["d"].device.type == dev
        out[dev] = w.detach().cpu()
        assert not np.allclose(out[dev].numpy(), [1.0, -2.0, 0.5])  # it moved
    # per iteration: the two-loop recursion over <= 3 pairs of 3-element dots and axpys,
    # and up to max_eval = 3 closure evaluations (a dozen roundings each): 6 iterations
    assert_close(out["cuda"], out["cpu"], terms=6 * (3 * 8 + 3 * 12))
