"""Property test: random *correct* graphs never raise a false alarm (issue 18).

Seeded graphs of 2-6 ops over float64 that over-sample the hard cases: elements exactly on
clamp bounds and relu/abs kinks, ties in max/maximum, computed values that round onto a
bound (a bound read back from the computed tensor), log/sqrt near 0, negative bases with
integer exponents, softmax/log_softmax, matmul and indexing. Every graph is verified in
local and exact mode; a ``mismatch`` anywhere is a false alarm (the engine is correct).
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad as sg

N_CHUNKS = 10
PER_CHUNK = 30  # 300 graphs x 2 modes per run (about 20 s on 2 cores)


def _pick(rng, y):
    """An element of ``y``'s recorded value (so a bound or kink lies exactly on it)."""
    a = np.asarray(y.detach().numpy()).reshape(-1)
    return float(a[rng.integers(a.size)])


def _step(rng, y):
    k = int(rng.integers(17))
    if k == 0:  # clamp with a bound on an element, the other one anywhere
        b = _pick(rng, y)
        return y.clamp(b, b + abs(float(rng.standard_normal()))) if rng.random() < 0.5 \
            else y.clamp(b - 1.0, b)
    if k == 1:
        return y.clamp_min(_pick(rng, y))
    if k == 2:
        return y.clamp_max(_pick(rng, y))
    if k == 3:  # kinks at recorded zeros
        return (y - _pick(rng, y)).relu()
    if k == 4:
        return (y - _pick(rng, y)).abs()
    if k == 5:  # ties
        return y.maximum(y.flip(-1) if hasattr(y, "flip") else y * 1.0)
    if k == 6:
        return y.maximum(y * 0 + _pick(rng, y))
    if k == 7:
        return y.amax(-1, keepdim=True) * y if hasattr(y, "amax") else y.max() * y
    if k == 8:  # log / sqrt near 0
        return (y * y + 1e-12).log()
    if k == 9:
        return (y * y + 1e-14).sqrt()
    if k == 10:  # negative bases, integer exponents
        return y ** int(rng.choice([2, 3]))
    if k == 11:
        return (y * y + 0.5) ** -1
    if k == 12:
        return y.softmax(-1) if rng.random() < 0.5 else y.log_softmax(-1)
    if k == 13:
        w = sg.tensor(rng.standard_normal((y.shape[-1], y.shape[-1])), dtype=sg.float64)
        return y @ w
    if k == 14:
        return y[:, 1:3] * 2.0 + y[:, :2]
    if k == 15:
        return y.sigmoid() if rng.random() < 0.5 else y.tanh()
    return y.mean(-1, keepdim=True) + y  # computed values that may round onto others


def _graph(seed):
    rng = np.random.default_rng(seed)
    pool = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, 0.25])
    v = rng.standard_normal((3, 4))
    hard = rng.random(v.shape) < 0.4
    v[hard] = rng.choice(pool, size=int(hard.sum()))
    x = sg.tensor(v, dtype=sg.float64, requires_grad=True)
    with sg.record():
        y = x
        for _ in range(int(rng.integers(2, 7))):
            y = _step(rng, y)
        w = sg.tensor(rng.standard_normal(tuple(y.shape)), dtype=sg.float64)
        return (y * w).sum()


@pytest.mark.parametrize("chunk", range(N_CHUNKS))
def test_no_false_alarms_on_random_correct_graphs(chunk):
    alarms = []
    for seed in range(chunk * PER_CHUNK, (chunk + 1) * PER_CHUNK):
        root = _graph(seed)
        for mode in ("local", "exact"):
            rep = sg.verify(root, mode=mode, timeout=60)
            if rep.status == "mismatch" or rep.first_bad_node is not None:
                alarms.append(f"seed {seed}, {mode}:\n{rep}")
    assert not alarms, f"{len(alarms)} false alarm(s); first:\n{alarms[0]}"
