"""Core engine figures: symgrad (Numba CPU backend) against NumPy and torch, same run.

    .venv/bin/python benchmarks/bench_core.py [--quick] [--json] [--thresholds]

Each library runs in its own process (thread pools interfere: PERF-BASELINES.md); torch
uses 2 threads. Figures (targets from issue 4, against the same-run torch/NumPy/copy):

* per-op forward with a graph, ``a + b`` on (3,) float32, a requires grad: <= 1.5x torch
* 10-op scalar chain, forward + backward, per op: <= 0.5x torch
* ``a*b + a`` on 1e7 float32 as one fused op (``addcmul``), GB/s = 3*N*4/t, against a
  2-thread copy in the same process (2*N*4/t): >= 85% of the copy
* matmul 1024^3 float32 GFLOP/s: >= 0.95x NumPy
* process start to the first finished backward, warm Numba cache: <= 1.0 s

Each timing is the best of several repeats; a repeat during which other processes used
more than 0.25 of a core is retried a few times, and the busiest share seen is printed
(``other_cpu``), because the test machine is shared. ``--thresholds`` measures the size
tiers of the CPU backend (FUSED_MIN, PARALLEL_MIN in symgrad/backends/cpu/backend.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
N_BIG = 10_000_000


# -- timing ----------------------------------------------------------------------------------
def _busy_jiffies() -> int:
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    vals = [int(v) for v in parts]
    return sum(vals) - vals[3] - vals[4]  # minus idle and iowait


class Timer:
    """Best-of-repeats timing that notices (and retries) windows with other CPU load."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.other_cpu = 0.0
        self.hz = os.sysconf("SC_CLK_TCK")

    def best(self, fn, number: int, repeat: int = 7, tries: int = 3) -> float:
        if self.quick:
            number, repeat = max(1, number // 4), 3
        fn()
        best = float("inf")
        worst_other = 0.0
        for _ in range(repeat):
            for attempt in range(tries):
                j0, c0, t0 = _busy_jiffies(), time.process_time(), time.perf_counter()
                for _ in range(number):
                    fn()
                t1 = time.perf_counter()
                wall = t1 - t0
                other = ((_busy_jiffies() - j0) / self.hz - (time.process_time() - c0)) / wall
                if other <= 0.25 or attempt == tries - 1:
                    break
            worst_other = max(worst_other, other)
            best = min(best, wall / number)
        self.other_cpu = max(self.other_cpu, worst_other)
        return best


# -- workers (one library per process) -------------------------------------------------------
def _chain(lib, x):
    y = x * 1.1
    y = y.sin()
    y = y + 0.3
    y = y.tanh()
    y = y * y
    y = y.exp()
    y = y - 0.2
    y = y.sigmoid()
    y = y * 0.7
    return y.relu()


def worker_symgrad(t: Timer) -> dict:
    import numpy as np

    import symgrad as sg

    r = {}
    a = sg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = sg.tensor([4.0, 5.0, 6.0])
    r["op_graph_us"] = t.best(lambda: a + b, 20000) * 1e6
    r["op_graph_mul_us"] = t.best(lambda: a * b, 20000) * 1e6
    r["op_graph_tanh_us"] = t.best(lambda: sg.tanh(a), 20000) * 1e6
    with sg.no_grad():
        r["op_nograd_us"] = t.best(lambda: a + b, 20000) * 1e6
    x = sg.tensor(0.5, requires_grad=True)

    def chain_bwd():
        _chain(sg, x).backward()

    r["chain_fwd_bwd_us_per_op"] = t.best(chain_bwd, 2000) * 1e6 / 10
    r["chain_fwd_us_per_op"] = t.best(lambda: _chain(sg, x), 2000) * 1e6 / 10
    x.grad = None

    rng = np.random.default_rng(0)
    A = sg.tensor(rng.standard_normal(N_BIG, dtype=np.float32))
    B = sg.tensor(rng.standard_normal(N_BIG, dtype=np.float32))
    nbytes = N_BIG * 4
    holder = [None]

    def fused():
        holder[0] = None
        holder[0] = sg.addcmul(A, A, B)

    def unfused():
        holder[0] = None
        holder[0] = A * B + A

    def copy():
        holder[0] = None
        holder[0] = A.clone()

    r["fused_gbs"] = 3 * nbytes / t.best(fused, 10) / 1e9
    r["unfused_gbs"] = 3 * nbytes / t.best(unfused, 10) / 1e9
    r["copy_2thr_gbs"] = 2 * nbytes / t.best(copy, 10) / 1e9
    holder[0] = A = B = None

    M = sg.tensor(rng.standard_normal((1024, 1024), dtype=np.float32))
    N = sg.tensor(rng.standard_normal((1024, 1024), dtype=np.float32))
    r["matmul_gflops"] = 2 * 1024**3 / t.best(lambda: M @ N, 10) / 1e9
    return r


def worker_torch(t: Timer) -> dict:
    import torch

    torch.set_num_threads(2)
    r = {}
    a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = torch.tensor([4.0, 5.0, 6.0])
    r["op_graph_us"] = t.best(lambda: a + b, 20000) * 1e6
    r["op_graph_mul_us"] = t.best(lambda: a * b, 20000) * 1e6
    r["op_graph_tanh_us"] = t.best(lambda: torch.tanh(a), 20000) * 1e6
    with torch.no_grad():
        r["op_nograd_us"] = t.best(lambda: a + b, 20000) * 1e6
    x = torch.tensor(0.5, requires_grad=True)

    def chain_bwd():
        _chain(torch, x).backward()

    r["chain_fwd_bwd_us_per_op"] = t.best(chain_bwd, 2000) * 1e6 / 10
    r["chain_fwd_us_per_op"] = t.best(lambda: _chain(torch, x), 2000) * 1e6 / 10
    g = torch.Generator().manual_seed(0)
    A = torch.randn(N_BIG, generator=g)
    B = torch.randn(N_BIG, generator=g)
    C = torch.empty(N_BIG)
    nbytes = N_BIG * 4
    r["fused_gbs"] = 3 * nbytes / t.best(lambda: torch.addcmul(A, A, B, out=C), 10) / 1e9
    r["unfused_gbs"] = 3 * nbytes / t.best(lambda: A * B + A, 10) / 1e9
    r["copy_2thr_gbs"] = 2 * nbytes / t.best(lambda: C.copy_(A), 10) / 1e9
    M = torch.randn(1024, 1024, generator=g)
    N = torch.randn(1024, 1024, generator=g)
    r["matmul_gflops"] = 2 * 1024**3 / t.best(lambda: M @ N, 10) / 1e9
    return r


def worker_numpy(t: Timer) -> dict:
    import numpy as np

    r = {}
    a = np.array([1.0, 2.0, 3.0], np.float32)
    b = np.array([4.0, 5.0, 6.0], np.float32)
    r["op_nograd_us"] = t.best(lambda: a + b, 20000) * 1e6
    rng = np.random.default_rng(0)
    A = rng.standard_normal(N_BIG, dtype=np.float32)
    B = rng.standard_normal(N_BIG, dtype=np.float32)
    C = np.empty_like(A)
    nbytes = N_BIG * 4

    def two_pass():
        np.multiply(A, B, out=C)
        np.add(C, A, out=C)

    r["fused_gbs"] = 3 * nbytes / t.best(two_pass, 10) / 1e9  # NumPy cannot fuse: 2 passes
    r["unfused_gbs"] = 3 * nbytes / t.best(lambda: A * B + A, 10) / 1e9
    r["copy_1thr_gbs"] = 2 * nbytes / t.best(lambda: np.copyto(C, A), 10) / 1e9
    M = rng.standard_normal((1024, 1024), dtype=np.float32)
    N = rng.standard_normal((1024, 1024), dtype=np.float32)
    r["matmul_gflops"] = 2 * 1024**3 / t.best(lambda: M @ N, 10) / 1e9
    return r


def worker_thresholds(t: Timer) -> dict:
    """Crossover sizes of the CPU backend's tiers (float32)."""
    import numpy as np

    from symgrad.backends.cpu import backend as B

    be = B.CpuBackend()
    B.load_kernels()
    out = {"fused": [], "parallel": []}
    saved = B.FUSED_MIN, B.PARALLEL_MIN
    for k in range(4, 24, 2):
        n = 1 << k
        g = np.random.rand(n).astype(np.float32)
        v = np.random.rand(n).astype(np.float32)
        reps = max(3, 200_000 // n)
        B.PARALLEL_MIN = 1 << 40
        B.FUSED_MIN = 1 << 40
        t_np = t.best(lambda g=g, v=v: be.tanh_backward(g, (True,), v), reps, repeat=5)
        B.FUSED_MIN = 1
        t_serial = t.best(lambda g=g, v=v: be.tanh_backward(g, (True,), v), reps, repeat=5)
        t_mul_np = t.best(lambda g=g, v=v: be.mul(g, v), reps, repeat=5)
        B.PARALLEL_MIN = 1
        t_par = t.best(lambda g=g, v=v: be.tanh_backward(g, (True,), v), reps, repeat=5)
        t_mul_par = t.best(lambda g=g, v=v: be.mul(g, v), reps, repeat=5)
        out["fused"].append((n, t_np * 1e6, t_serial * 1e6, t_par * 1e6))
        out["parallel"].append((n, t_mul_np * 1e6, t_mul_par * 1e6))
    B.FUSED_MIN, B.PARALLEL_MIN = saved
    return out


WORKERS = {"symgrad": worker_symgrad, "torch": worker_torch, "numpy": worker_numpy,
           "thresholds": worker_thresholds}

_STARTUP = {
    "symgrad": """
import symgrad as sg
x = sg.randn({n}, {n}, requires_grad=True)
w = sg.randn({n}, {n}, requires_grad=True)
((x @ w).tanh() * x).sum().backward()
""",
    "torch": """
import torch
x = torch.randn({n}, {n}, requires_grad=True)
w = torch.randn({n}, {n}, requires_grad=True)
((x @ w).tanh() * x).sum().backward()
""",
}


def startup(lib: str, n: int, runs: int) -> float:
    """Seconds from spawning a fresh interpreter to its first finished backward (best run;
    a first unmeasured run warms the Numba cache)."""
    code = _STARTUP[lib].format(n=n) + "\nimport time, sys\nprint(time.time())\n"
    env = {**os.environ, "PYTHONPATH": ROOT}
    times = []
    for i in range(runs + 1):
        t0 = time.time()
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, check=True)
        if i:
            times.append(float(res.stdout.split()[-1]) - t0)
    return min(times)


def run_worker(name: str, quick: bool) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name] + (["--quick"] if quick
                                                                         else [])
    env = {**os.environ, "PYTHONPATH": ROOT}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        raise RuntimeError(f"{name} worker failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=sorted(WORKERS))
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--thresholds", action="store_true", help="measure the size tiers")
    args = ap.parse_args()
    if args.worker:
        t = Timer(args.quick)
        result = WORKERS[args.worker](t)
        result["other_cpu"] = round(t.other_cpu, 2)
        print(json.dumps(result))
        return
    if args.thresholds:
        r = run_worker("thresholds", args.quick)
        print("tanh backward, µs: n | NumPy formula | Numba serial | Numba parallel")
        for n, a, b, c in r["fused"]:
            print(f"  {n:>9} | {a:9.2f} | {b:9.2f} | {c:9.2f}")
        print("mul forward, µs: n | NumPy | Numba parallel")
        for n, a, b in r["parallel"]:
            print(f"  {n:>9} | {a:9.2f} | {b:9.2f}")
        print(f"other_cpu {r['other_cpu']}")
        return
    res = {lib: run_worker(lib, args.quick) for lib in ("numpy", "torch", "symgrad")}
    runs = 1 if args.quick else 3
    res["startup_s"] = {"symgrad_tiny": startup("symgrad", 4, runs),
                        "symgrad_256": startup("symgrad", 256, runs),
                        "torch_256": startup("torch", 256, runs)}
    if args.json:
        print(json.dumps(res))
        return
    s, tch, npy, st = res["symgrad"], res["torch"], res["numpy"], res["startup_s"]
    rows = [
        ("per-op fwd with graph, a+b (3,), µs", s["op_graph_us"], tch["op_graph_us"],
         s["op_graph_us"] / tch["op_graph_us"], "<= 1.5x torch"),
        ("per-op fwd with graph, a*b (3,), µs", s["op_graph_mul_us"], tch["op_graph_mul_us"],
         s["op_graph_mul_us"] / tch["op_graph_mul_us"], "<= 1.5x torch"),
        ("per-op fwd with graph, tanh(a) (3,), µs", s["op_graph_tanh_us"],
         tch["op_graph_tanh_us"], s["op_graph_tanh_us"] / tch["op_graph_tanh_us"],
         "<= 1.5x torch"),
        ("per-op fwd no_grad, a+b (3,), µs", s["op_nograd_us"], tch["op_nograd_us"],
         s["op_nograd_us"] / tch["op_nograd_us"], f"(numpy {npy['op_nograd_us']:.2f})"),
        ("10-op scalar chain fwd+bwd, µs/op", s["chain_fwd_bwd_us_per_op"],
         tch["chain_fwd_bwd_us_per_op"],
         s["chain_fwd_bwd_us_per_op"] / tch["chain_fwd_bwd_us_per_op"], "<= 0.5x torch"),
        ("10-op scalar chain fwd only, µs/op", s["chain_fwd_us_per_op"],
         tch["chain_fwd_us_per_op"], s["chain_fwd_us_per_op"] / tch["chain_fwd_us_per_op"], ""),
        ("a*b+a fused (addcmul) 1e7 f32, GB/s", s["fused_gbs"], tch["fused_gbs"],
         s["fused_gbs"] / s["copy_2thr_gbs"], ">= 0.85x own 2-thr copy"),
        ("a*b+a unfused expression, GB/s", s["unfused_gbs"], tch["unfused_gbs"],
         s["unfused_gbs"] / tch["unfused_gbs"], f"(numpy {npy['unfused_gbs']:.1f})"),
        ("2-thread copy, GB/s", s["copy_2thr_gbs"], tch["copy_2thr_gbs"],
         s["copy_2thr_gbs"] / tch["copy_2thr_gbs"], f"(numpy 1-thr {npy['copy_1thr_gbs']:.1f})"),
        ("matmul 1024^3 f32, GFLOP/s", s["matmul_gflops"], tch["matmul_gflops"],
         s["matmul_gflops"] / npy["matmul_gflops"],
         f">= 0.95x numpy ({npy['matmul_gflops']:.0f})"),
        ("start to 1st backward, 256x256, s", st["symgrad_256"], st["torch_256"],
         st["symgrad_256"] / st["torch_256"], "<= 1.0 s"),
        ("start to 1st backward, 4x4, s", st["symgrad_tiny"], float("nan"), float("nan"), ""),
    ]
    print(f"{'figure':44} {'symgrad':>9} {'torch':>9} {'ratio':>7}  target")
    for name, a, b, ratio, target in rows:
        print(f"{name:44} {a:9.2f} {b:9.2f} {ratio:7.2f}  {target}")
    print("other_cpu (cores used by other processes while timing, max): "
          f"symgrad {s['other_cpu']}, torch {tch['other_cpu']}, numpy {npy['other_cpu']}")
    print("ratio: symgrad/torch, except a*b+a fused (symgrad/its own copy) and matmul "
          "(symgrad/numpy)")


if __name__ == "__main__":
    main()
