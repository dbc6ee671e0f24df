"""Shared fixtures: the torch oracle, and running tests on every CPU backend."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import symgrad as sg
from symgrad import backends

# tests/cuda need numba's CUDA simulator, which must be switched on before numba loads: they
# run in their own pytest process (`make test` has the line), or on a GPU (SYMGRAD_TEST_CUDA=1).
if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" and os.environ.get("SYMGRAD_TEST_CUDA") != "1":
    collect_ignore = ["cuda"]


@pytest.fixture(params=sorted(n for n in backends._BACKENDS if n != "sympy"))
def cpu_backend(request):
    """Run the test once per registered CPU backend (numpy reference, numba cpu)."""
    previous = backends.set_cpu_backend(request.param)
    yield request.param
    backends.set_cpu_backend(previous)


@pytest.fixture
def torch():
    return pytest.importorskip("torch",
                               reason="PyTorch is the test oracle; `make test` installs it")


@pytest.fixture
def no_gc():
    """Disable the cycle collector: memory must be freed by reference counting alone."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    yield
    if was:
        gc.enable()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def to_torch(torch, t: sg.Tensor, requires_grad=None):
    x = torch.from_numpy(np.array(t.detach().numpy(), copy=True))
    if requires_grad if requires_grad is not None else t.requires_grad:
        x.requires_grad_(True)
    return x
