"""The verifier raises no false alarms on correct graphs (issue 18): numbers at full
precision, branches at the recorded values, nan/inf told apart, timeouts honoured."""

from __future__ import annotations

import pytest

import symgrad as sg

LO, HI = -0.5835763392294893, 0.17433847556174747  # 17 significant digits each


def _x(values, dtype=sg.float64):
    return sg.tensor(values, dtype=dtype, requires_grad=True)


# -- 1. numbers reach generated code at full precision ----------------------------------
@pytest.mark.parametrize("mode", ["local", "exact"])
@pytest.mark.parametrize("op", [
    lambda x: x.clamp(LO, HI),
    lambda x: x.clamp(min=LO),
    lambda x: x.clamp(max=HI),
    lambda x: x.clamp_min(LO) * 2,
    lambda x: x.clamp_max(HI) * 2,
])
def test_clamp_bounds_with_17_digits_pass_at_the_bound(op, mode):
    x = _x([LO, 0.0, 0.1, HI, 0.3, -0.7])
    rep = sg.verify(op(x).sum(), mode=mode)
    assert rep.ok, str(rep)


def test_generated_code_keeps_every_float_parameter_exactly():
    import sympy

    from symgrad.symbolic.local import lambdify_numpy

    x = sympy.Symbol("x", real=True)
    for c in (HI, LO, 0.1, 1 / 3, 2.0000000000000004, 1e-300, 123456789.12345679):
        f = lambdify_numpy([x], x - sympy.Float(c), {})
        assert f(c) == 0.0, c
