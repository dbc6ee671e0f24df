"""Optimizers on a CUDA parameter (numba's simulator in CI, a GPU where one exists)."""

from __future__ import annotations

import pytest
from _tolerance import assert_close

import symgrad as sg

# roundings in one step of the most involved update (Adam: grad, two moments, bias
# corrections, sqrt, eps, division, the parameter update) on a 3-element parameter
ONE_STEP_TERMS = 16


@pytest.mark.parametrize("name", ["Adam", "AdamW", "RMSprop", "Adagrad", "SGD"])
def test_steps_on_a_cuda_parameter_keep_the_step_count_on_the_cpu(name):
    """As torch (not capturable): ``state['step']`` stays a CPU tensor; the update runs on
    the parameter's device and equals the CPU update within one step's roundings."""
    out = {}
    for dev in ("cpu", "cuda"):
        w = sg.nn.Parameter(sg.tensor([1.0, -2.0, 0.5], dtype=sg.float64, device=dev))
        opt = getattr(sg.optim, name)([w], lr=0.1, **({"momentum": 0.9} if name == "SGD"
                                                       else {}))
        for _ in range(3):
            opt.zero_grad()
            (w * w).sum().backward()
            opt.step()
        if "step" in opt.state[w]:
            assert opt.state[w]["step"].device.type == "cpu"
        out[dev] = w.detach().cpu()
    assert_close(out["cuda"], out["cpu"], terms=3 * ONE_STEP_TERMS)
