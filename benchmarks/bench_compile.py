"""sg.compile against torch eager, torch.compile and symgrad eager: whole training steps.

    .venv/bin/python benchmarks/bench_compile.py [--quick] [--json] [--no-torch-compile]

Workloads (float32, one thread everywhere: OMP/OPENBLAS/MKL/NUMBA threads = 1 are set
before any import in every worker):

* ``small``: MLP 16-128-128-16 (ReLU), batch 1, MSE, SGD(momentum=0.9): zero_grad,
  forward, backward, step
* ``big``: MLP 784-256-256-10 (ReLU), batch 64, cross_entropy, SGD(momentum=0.9)
* ``chain``: a ten-op elementwise chain on 1000 elements, forward + backward
  (``w.grad = None``; ``chain(x * w).sum().backward()``)
* ``gelu``: MLP 128-256-256-10 with GELU written from elementary ops (tanh form), batch 64,
  cross_entropy, Adam

Each variant runs in its own process (thread pools and allocators interfere); without
``--quick`` the variants are rotated over three rounds and the best time of each is kept,
because the machine is shared. Printed: ms per step, the ratio to torch eager, and the
first call (trace + code generation + Numba compile; for sg.compile also "warm": a second
process finding the generated module and its kernels in the disk cache).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "NUMBA_NUM_THREADS")
VARIANTS = ("torch_eager", "torch_compile", "sg_eager", "sg_compile")
WORKLOADS = ("small", "big", "chain", "gelu")


# -- the steps, written once for both libraries ------------------------------------------------
def _chain(h):
    h = h.sin() * 1.1
    h = h.tanh() + 0.3
    h = (h * h).exp()
    h = (h - 0.2).sigmoid()
    h = (h * 0.7).relu()
    return h


def _gelu(x):
    return 0.5 * x * (1.0 + (0.7978845608 * (x + 0.044715 * x ** 3)).tanh())


def _build(lib, F, optim, workload: str):
    """(step fn, its args) for ``workload`` in library ``lib`` (torch or symgrad)."""
    lib.manual_seed(0)
    if workload == "chain":
        w = lib.randn(1000, requires_grad=True)
        x = lib.randn(1000)

        def chain_step(x):
            w.grad = None
            loss = _chain(x * w).sum()
            loss.backward()
            return loss

        return chain_step, (x,)
    sizes, batch = {"small": ((16, 128, 128, 16), 1), "big": ((784, 256, 256, 10), 64),
                    "gelu": ((128, 256, 256, 10), 64)}[workload]
    nn = lib.nn

    class Act(nn.Module):
        def forward(self, x):
            return x.relu() if workload != "gelu" else _gelu(x)

    model = nn.Sequential(nn.Linear(sizes[0], sizes[1]), Act(),
                          nn.Linear(sizes[1], sizes[2]), Act(),
                          nn.Linear(sizes[2], sizes[3]))
    opt = (optim.Adam(model.parameters(), lr=1e-3) if workload == "gelu"
           else optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
    x = lib.randn(batch, sizes[0])
    if workload == "small":
        y = lib.randn(batch, sizes[-1])
        loss_fn = F.mse_loss
    else:
        y = lib.randint(0, sizes[-1], (batch,))
        loss_fn = F.cross_entropy

    def train_step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return train_step, (x, y)


def _best(fn, args, number: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn(*args)
        best = min(best, (time.perf_counter() - t0) / number)
    return best


_NUMBER = {"small": 400, "big": 40, "chain": 400, "gelu": 60}


def worker(variant: str, quick: bool) -> dict:
    """Time every workload with one variant (this process imports one library)."""
    if variant.startswith("torch"):
        import torch

        torch.set_num_threads(1)
        lib, F, optim = torch, torch.nn.functional, torch.optim
    else:
        import symgrad as sg

        lib, F, optim = sg, sg.nn.functional, sg.optim
    out = {}
    for workload in WORKLOADS:
        fn, args = _build(lib, F, optim, workload)
        if variant.endswith("compile"):
            fn = lib.compile(fn)
        try:
            t0 = time.perf_counter()
            fn(*args)
            first = time.perf_counter() - t0
            fn(*args)  # sg.compile: the first run of the generated code
            number = _NUMBER[workload] // (8 if quick else 1)
            ms = _best(fn, args, max(number, 3), 3 if quick else 7) * 1e3
            out[workload] = {"ms": ms, "first_s": first}
            if variant == "sg_compile":  # its own part: code generation + Numba (or cache)
                out[workload]["compile_s"] = fn.stats["compile_s"]
        except Exception as exc:  # torch.compile needs a working C toolchain
            out[workload] = {"unavailable": f"{type(exc).__name__}: {str(exc)[:120]}"}
    return out


def run_worker(variant: str, quick: bool, cache: str, timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "SYMGRAD_COMPILE_CACHE": cache,
           **{v: "1" for v in THREAD_VARS}}
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant] + (
        ["--quick"] if quick else [])
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {w: {"unavailable": f"timed out after {timeout:.0f} s"} for w in WORKLOADS}
    if res.returncode:
        reason = (res.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return {w: {"unavailable": reason} for w in WORKLOADS}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _merge(best: dict, new: dict) -> None:
    """Keep the best ms per workload, and the first call of the first round (the coldest)."""
    for w, r in new.items():
        old = best.get(w)
        if old is None:
            best[w] = r
        elif "ms" in r and ("ms" not in old or r["ms"] < old["ms"]):
            best[w] = {**r, "first_s": old.get("first_s", r["first_s"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=VARIANTS)
    ap.add_argument("--quick", action="store_true", help="one round, fewer repeats")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-torch-compile", action="store_true",
                    help="skip torch.compile (its first call takes tens of seconds)")
    args = ap.parse_args()
    if args.worker:
        for v in THREAD_VARS:
            os.environ[v] = "1"
        print(json.dumps(worker(args.worker, args.quick)))
        return
    variants = [v for v in VARIANTS if not (args.no_torch_compile and v == "torch_compile")]
    rounds = 1 if args.quick else 3
    results: dict[str, dict] = {v: {} for v in variants}
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as cache:
        cold = cold_own = None
        for r in range(rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order:
                res = run_worker(v, args.quick, cache, 900)
                if v == "sg_compile" and cold is None:
                    cold = {w: x.get("first_s") for w, x in res.items()}
                    cold_own = {w: x.get("compile_s") for w, x in res.items()}
                _merge(results[v], res)
        warm = run_worker("sg_compile", True, cache, 900) if "sg_compile" in variants else {}
    summary = {"results": results, "sg_compile_first_call_cold_s": cold,
               "sg_compile_first_call_warm_s": {w: x.get("first_s") for w, x in warm.items()},
               "sg_compile_own_cold_s": cold_own,
               "sg_compile_own_warm_s": {w: x.get("compile_s") for w, x in warm.items()}}
    if args.json:
        print(json.dumps(summary))
        return
    _print(summary, variants)


def _print(summary: dict, variants: list) -> None:
    res = summary["results"]
    print("ms per step (1 thread, best of the rounds); ratio = variant / torch eager; "
          "first call in s (first round)")
    print(f"{'workload':8} " + " ".join(f"{v:>24}" for v in variants))
    for w in WORKLOADS:
        base = res.get("torch_eager", {}).get(w, {}).get("ms")
        cells = []
        for v in variants:
            r = res[v].get(w, {})
            if "ms" not in r:
                cells.append(f"{'unavailable':>24}")
                continue
            ratio = f"{r['ms'] / base:.2f}x" if base else "-"
            cells.append(f"{r['ms']:9.3f} ({ratio:>6}) {r['first_s']:5.1f}s")
        print(f"{w:8} " + " ".join(cells))
    for v in variants:
        for w in WORKLOADS:
            reason = res[v].get(w, {}).get("unavailable")
            if reason:
                print(f"{v} {w}: unavailable: {reason}")
    cold, warm = summary["sg_compile_first_call_cold_s"], summary["sg_compile_first_call_warm_s"]
    if cold:
        own, own_warm = summary["sg_compile_own_cold_s"], summary["sg_compile_own_warm_s"]

        def s(d, w):
            return f"{(d or {}).get(w) or float('nan'):.3f}"

        print("sg.compile first call (eager traced run + compile), s, cold cache / warm cache:")
        for w in WORKLOADS:
            print(f"  {w:6} {s(cold, w)} / {s(warm, w)}   of which code generation + Numba: "
                  f"{s(own, w)} / {s(own_warm, w)}")


if __name__ == "__main__":
    main()
