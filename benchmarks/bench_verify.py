"""Verifier timings, SymPy-only beside symengine (issue 7's targets).

1. exact mode on a scalarised 2-layer tanh MLP: x 16, W1 32x16, W2 4x32 (640 grads);
   target < 0.5 s with symengine, < 5 s with SymPy alone.
2. local mode on an MLP [784, 256, 256, 10], batch 64, one training step's loss;
   target < 3 s.
3. the per-scalar-op cost of exact mode, which sets the auto-mode budget.

Run: ``.venv/bin/python benchmarks/bench_verify.py`` (prints a table; not a timed test).
"""

from __future__ import annotations

import time

import numpy as np

import symgrad as sg


def small_mlp(seed=0):
    rng = np.random.default_rng(seed)
    x = sg.tensor(rng.standard_normal(16))
    w1 = sg.tensor(rng.standard_normal((32, 16)) * 0.3, requires_grad=True)
    w2 = sg.tensor(rng.standard_normal((4, 32)) * 0.3, requires_grad=True)
    x.name, w1.name, w2.name = "x", "W1", "W2"
    loss = (w2 @ (w1 @ x).tanh()).sum()
    return loss


def big_mlp(seed=0):
    rng = np.random.default_rng(seed)
    sizes = [784, 256, 256, 10]
    x = sg.tensor(rng.standard_normal((64, 784)).astype(np.float32))
    x.name = "x"
    h = x
    params = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        w = sg.tensor((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
                      requires_grad=True)
        bias = sg.tensor(np.zeros(b, dtype=np.float32), requires_grad=True)
        w.name, bias.name = f"W{i + 1}", f"b{i + 1}"
        params += [w, bias]
        h = h @ w + bias
        if i < len(sizes) - 2:
            h = h.relu()
    loss = (h * h).mean()
    return loss, params


def _layer(seed=0):
    rng = np.random.default_rng(seed)
    x = sg.tensor(rng.standard_normal((32, 48)))
    w = sg.tensor(rng.standard_normal((48, 32)) * 0.2, requires_grad=True)
    return (x @ w).tanh().sum()


def timed(fn, repeat=3):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    import symgrad.symbolic as S

    try:
        import symengine  # noqa: F401

        backends = ["sympy", "symengine"]
    except ImportError:
        backends = ["sympy"]
    S.verify(small_mlp(), mode="exact", backend="sympy")  # warm imports
    rows = []
    loss = small_mlp()
    for be in backends:
        t, rep = timed(lambda be=be: S.verify(loss, mode="exact", backend=be))
        assert rep.ok and rep.mode == "exact", rep
        rows.append(("exact, tanh MLP x16 W1 32x16 W2 4x32 (640 grads)", be, t,
                     0.5 if be == "symengine" else 5.0))
    big, _ = big_mlp()
    for be in backends:
        t, rep = timed(lambda be=be: S.verify(big, mode="local", backend=be), repeat=2)
        assert rep.ok and rep.mode == "local", rep
        rows.append(("local, MLP [784,256,256,10] batch 64", be, t, 3.0))
    for be in backends:
        t, rep = timed(lambda be=be: S.verify(big, backend=be), repeat=1)
        rows.append((f"auto on the big MLP (chose {rep.mode})", be, t, 3.0))
    # per scalar op cost of exact mode on a bigger layer: this sets the auto-mode budget
    layer = _layer()
    for be in backends:
        t, rep = timed(lambda be=be: S.verify(layer, mode="exact", backend=be,
                                                     timeout=600), repeat=1)
        assert rep.ok
        rows.append((f"exact: us per scalar op (32x48 @ 48x32 tanh, cost {rep.cost})", be,
                     t / rep.cost * 1e6, None))
    print(f"{'case':58s} {'backend':10s} {'seconds':>9s} {'target':>7s}")
    for case, be, t, target in rows:
        tgt = "-" if target is None else f"{target:g}"
        unit = "" if target is not None else " us"
        print(f"{case:58s} {be:10s} {t:9.3f}{unit} {tgt:>7s}")
    print(f"auto-mode budgets (scalar ops): {S.EXACT_BUDGETS}")


if __name__ == "__main__":
    main()
