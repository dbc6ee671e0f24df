"""The stanza-generated unary ops on the CUDA backend (numba's simulator in CI) against torch."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close
from test_new_unary_ops import CASES, GRAD_TERMS, VALUE_TERMS, _pair, _run_sg, _run_torch


@pytest.mark.parametrize("op", sorted(CASES))
def test_cuda_matches_torch(op):
    for dtype in (np.float32, np.float64):
        x, w = _pair(op, dtype, 600)
        y, g = _run_sg(op, x, w, device="cuda")
        ty, tg = _run_torch(op, x, w)
        assert y.grad_fn.name() == ty.grad_fn.name()
        assert_close(y.detach().cpu(), ty, terms=VALUE_TERMS)
        assert_close(g.cpu(), tg, terms=GRAD_TERMS)
