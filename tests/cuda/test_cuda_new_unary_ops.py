"""The ops added on the stanza path (tests/test_new_unary_ops.py) on the CUDA backend (numba's
simulator in CI) against torch: values, gradients of every input, grad_fn names."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close
from test_new_unary_ops import (
    CASES,
    GRAD_TERMS,
    SECOND_TERMS,
    TERMS,
    VALUE_TERMS,
    _pair,
    _run_sg,
    _run_torch,
)


@pytest.mark.parametrize("op", sorted(CASES))
def test_cuda_matches_torch(op):
    value_terms, grad_terms, _ = TERMS.get(op, (VALUE_TERMS, GRAD_TERMS, SECOND_TERMS))
    for dtype in (np.float32, np.float64):
        xs, w = _pair(op, dtype, 600)
        y, gs = _run_sg(op, xs, w, device="cuda")
        ty, tgs = _run_torch(op, xs, w)
        assert y.grad_fn.name() == ty.grad_fn.name()
        assert_close(y.detach().cpu(), ty, terms=value_terms)
        for g, tg in zip(gs, tgs):
            assert_close(g.cpu(), tg, terms=grad_terms)
