"""Property test: random op chains verify ``ok`` in exact mode; same names stay distinct."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import symgrad as sg
from symgrad.symbolic import verify

UNARY = {
    "sin": lambda x: x.sin(),
    "cos": lambda x: x.cos(),
    "tanh": lambda x: x.tanh(),
    "sigmoid": lambda x: x.sigmoid(),
    "exp_bounded": lambda x: x.tanh().exp(),
    "log_positive": lambda x: (x * x + 1).log(),
    "sqrt_positive": lambda x: (x * x + 0.5).sqrt(),
    "neg": lambda x: -x,
    "relu": lambda x: x.relu(),
    "abs": lambda x: x.abs(),
    "square": lambda x: x ** 2,
    "scale": lambda x: 2.5 * x - 1,
    "recip": lambda x: 1 / (x * x + 1),
    "transpose": lambda x: x.transpose(0, 1),
    "reshape": lambda x: x.reshape(x.shape[1], x.shape[0]),
    "softmax": lambda x: sg.softmax(x, dim=1),
    "sum_keepdim": lambda x: x.sum(1, keepdim=True).expand(x.shape[0], x.shape[1]),
}
BINARY = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / (y * y + 1),
    "broadcast_row": lambda x, y: x * y[0],
}


@settings(max_examples=50, deadline=None, derandomize=True)
@given(ops=st.lists(st.sampled_from(sorted(UNARY) + sorted(BINARY)), min_size=1, max_size=5),
       seed=st.integers(0, 2**16), same_name=st.booleans(),
       dtype=st.sampled_from(["float32", "float64"]))
def test_random_chains_verify_exactly(ops, seed, same_name, dtype):
    rng = np.random.default_rng(seed)
    dt = getattr(sg, dtype)
    a = sg.tensor(rng.uniform(-1, 1, (2, 2)), dtype=dt, requires_grad=True)
    b = sg.tensor(rng.uniform(-1, 1, (2, 2)), dtype=dt, requires_grad=True)
    a.name = "d"
    b.name = "d" if same_name else "e"
    x = a
    for op in ops:
        x = BINARY[op](x, b) if op in BINARY else UNARY[op](x)
    loss = (x * b).sum()
    rep = verify(loss)
    assert rep.mode == "exact"
    assert rep.ok, str(rep)
    names = sorted(r.name for r in rep.leaves)
    assert names == (["d", "d'"] if same_name else ["d", "e"])
    # Same-named leaves are distinct symbols: had d and d' been one symbol, the gradient
    # of d would have absorbed d''s terms and the exact check above would have failed.
    assert len({r.name for r in rep.leaves}) == 2
