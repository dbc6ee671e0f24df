"""symgrad checks its own ops with its own pytest plugin (the report lands in
test-artifacts/ under `make test`)."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad as sg

POS = (0.4, 1.8)
PROGRAMS = {
    "add_broadcast": (lambda x, y: x + y, [(2, 3), (3,)], None),
    "sub_alpha": (lambda x, y: sg.sub(x, y, alpha=2.0), [(3,), (3,)], None),
    "mul": (lambda x, y: x * y, [(2, 3), (2, 1)], None),
    "div": (lambda x, y: x / y, [(3,), (3,)], POS),
    "pow": (lambda x: x ** 3, [(4,)], None),
    "pow_tensor": (lambda x, y: x ** y, [(3,), (3,)], POS),
    "rpow": (lambda x: 2 ** x, [(3,)], None),
    "exp_log": (lambda x: x.exp() + x.log(), [(3,)], POS),
    "trig": (lambda x: x.sin() * x.cos(), [(4,)], None),
    "tanh_sigmoid": (lambda x: x.tanh() + x.sigmoid(), [(4,)], None),
    "sqrt_abs_relu": (lambda x: x.sqrt() + x.abs() + x.relu(), [(4,)], POS),
    "reductions": (lambda x: x.sum(0) * x.mean(1, keepdim=True), [(3, 2)], None),
    "matmul_family": (lambda a, b, v: (a @ b).t() @ v, [(2, 3), (3, 4), (2,)], None),
    "shape_ops": (lambda x: x.reshape(3, 2).t().unsqueeze(0).expand(2, 2, 3).sum(-1),
                  [(2, 3)], None),
}


def _leaves(shapes, domain, seed=0):
    rng = np.random.default_rng(seed)
    lo, hi = domain or (-1.5, 1.5)
    return [sg.tensor(rng.uniform(lo, hi, size=s), dtype=sg.float64, requires_grad=True)
            for s in shapes]


@pytest.mark.symgrad(mode="exact")
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_op_gradients_are_exact(name, symgrad_check):
    fn, shapes, domain = PROGRAMS[name]
    report = symgrad_check(fn, *_leaves(shapes, domain))
    assert report.ok and report.mode == "exact"
