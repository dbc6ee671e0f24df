"""The verifier raises no false alarms on correct graphs (issue 18): numbers at full
precision, branches at the recorded values, nan/inf told apart, timeouts honoured."""

from __future__ import annotations

import numpy as np
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


# -- 2. branches are decided at the recorded forward values ------------------------------
def _rounded_mean_graphs(seed):
    """A mean the engine rounded onto a value ``b``: exactly, it lies a hair off ``b``."""
    rng = np.random.default_rng(seed)
    x = _x(rng.standard_normal(7))
    with sg.record():  # keeps the intermediates the verifier reads
        m = x.mean()
        b = float(m.item())
        d = m - b  # recorded 0 exactly; its exact value is (usually) not 0
        return [m.clamp(b - 1, b) * 3, m.clamp(b, b + 1) * 3, m.clamp_max(b) + m.clamp_min(b),
                d.relu() * 3, d.abs() * 3, d.sign() + d,
                m.maximum(sg.tensor(b, dtype=sg.float64)),
                sg.stack([m, sg.tensor(b, dtype=sg.float64) + 0 * m]).max() * 2]


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_a_value_rounded_onto_a_branch_point_takes_the_engines_branch(mode):
    failures = []
    for seed in range(12):
        for k, y in enumerate(_rounded_mean_graphs(seed)):
            rep = sg.verify(y.sum(), mode=mode)
            if not rep.ok:
                failures.append((seed, k, str(rep)))
    assert not failures, failures[0]


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_float32_element_on_a_float32_rounded_bound_is_on_it(mode):
    # float32(0.7) < 0.7: the engine (and torch) compares x with float32(0.7), so x on it
    # is in range and passes its gradient.
    x = _x([0.1, 0.7, 0.8, 0.9, 1.0], dtype=sg.float32)
    for y in (x.clamp(0.7, 0.9), x.clamp_min(0.7), x.clamp(min=0.7)):
        rep = sg.verify((y * 2).sum(), mode=mode)
        assert rep.ok, str(rep)
