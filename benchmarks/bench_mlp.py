"""MLP train step (forward, MSE loss, backward, SGD step): symgrad against torch, same run.

    .venv/bin/python benchmarks/bench_mlp.py [--steps N] [--repeats R] [--json]

Each library runs in its own process (thread pools interfere: see PERF-BASELINES.md);
torch, BLAS and Numba use ``--threads`` threads (2 by default). Every process does warm-up
steps (which also compile symgrad's Numba kernels), then ``repeats`` rounds of ``steps``
timed steps; the figure is the median step time of the round with the lowest median.
Models use nn.Linear (with bias) and ReLU.
Targets (issue 6): the big step at most 0.8x torch, the small step at most 0.3x torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {
    "784-256-256-10/b64": ([784, 256, 256, 10], 64),
    "16-128-128-16/b1": ([16, 128, 128, 16], 1),
}
TARGETS = {"784-256-256-10/b64": 0.8, "16-128-128-16/b1": 0.3}
LIBS = ("torch", "symgrad", "symgrad-numpy", "numpy-hand")


def _data(sizes, batch):
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.standard_normal((batch, sizes[0])).astype(np.float32),
            rng.standard_normal((batch, sizes[-1])).astype(np.float32))


def _step_lib(lib_name, sizes, batch):
    """The same training step in torch and in symgrad: their nn/optim APIs are the same."""
    if lib_name == "torch":
        import torch as lib

        lib.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
        x, y = (lib.from_numpy(a) for a in _data(sizes, batch))
    else:
        import symgrad as lib

        x, y = (lib.tensor(a) for a in _data(sizes, batch))
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(lib.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(lib.nn.ReLU())
    model = lib.nn.Sequential(*layers)
    opt = lib.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = lib.nn.functional.mse_loss

    def step():
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    return step


def _step_numpy(sizes, batch):
    """Hand-written NumPy forward/backward: the floor a Python engine can hope for."""
    import numpy as np

    rng = np.random.default_rng(1)
    ws = [rng.uniform(-a ** -0.5, a ** -0.5, (b, a)).astype(np.float32)
          for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
    bs = [np.zeros(b, np.float32) for b in sizes[1:]]
    x, y = _data(sizes, batch)
    lr = np.float32(0.01)

    def step():
        acts = [x]
        h = x
        for i, (w, b) in enumerate(zip(ws, bs, strict=True)):
            h = h @ w.T + b
            if i < len(ws) - 1:
                h = np.maximum(h, 0)
            acts.append(h)
        g = (2.0 / h.size) * (h - y)
        for i in reversed(range(len(ws))):
            if i < len(ws) - 1:
                g = g * (acts[i + 1] > 0)
            gw, gb = g.T @ acts[i], g.sum(0)
            if i:
                g = g @ ws[i]
            ws[i] -= lr * gw
            bs[i] -= lr * gb

    return step


def _measure(lib: str, name: str, steps: int, repeats: int) -> dict:
    sizes, batch = CONFIGS[name]
    if lib == "symgrad-numpy":
        os.environ["SYMGRAD_CPU_BACKEND"] = "numpy"
    if lib == "numpy-hand":
        step = _step_numpy(sizes, batch)
    else:
        step = _step_lib("torch" if lib == "torch" else "symgrad", sizes, batch)
    for _ in range(20):
        step()
    medians, fastest = [], float("inf")
    for _ in range(repeats):
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        medians.append(statistics.median(times))
        fastest = min(fastest, min(times))
    return {"lib": lib, "model": name, "ms": min(medians) * 1e3, "min_ms": fastest * 1e3,
            "ms_rounds": [m * 1e3 for m in medians]}


def _child(lib: str, name: str, steps: int, repeats: int, threads: int) -> dict:
    n = str(threads)
    env = {**os.environ, "BENCH_THREADS": n, "OMP_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n,
           "MKL_NUM_THREADS": n, "NUMBA_NUM_THREADS": n}
    out = subprocess.run([sys.executable, __file__, "--child", lib, name, "--steps", str(steps),
                          "--repeats", str(repeats)], capture_output=True, text=True, check=True,
                         env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2,
                    help="threads for torch, BLAS and Numba in every process (default 2)")
    ap.add_argument("--json", action="store_true", help="print one JSON line per result")
    ap.add_argument("--child", nargs=2, metavar=("LIB", "MODEL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_measure(*args.child, args.steps, args.repeats)))
        return
    print(f"{'model':22s} " + " ".join(f"{lib:>14s}" for lib in LIBS)
          + f" {'symgrad/torch':>14s} {'target':>7s}")
    for name in CONFIGS:
        res = {lib: _child(lib, name, args.steps, args.repeats, args.threads) for lib in LIBS}
        ratio = res["symgrad"]["ms"] / res["torch"]["ms"]
        if args.json:
            for r in res.values():
                print(json.dumps(r))
        print(f"{name:22s} " + " ".join(f"{res[lib]['ms']:11.3f} ms" for lib in LIBS)
              + f" {ratio:13.2f}x {TARGETS[name]:6.1f}x")
        fast = res["symgrad"]["min_ms"] / res["torch"]["min_ms"]
        print(f"{'  fastest single step':22s} "
              + " ".join(f"{res[lib]['min_ms']:11.3f} ms" for lib in LIBS) + f" {fast:13.2f}x")


if __name__ == "__main__":
    main()
