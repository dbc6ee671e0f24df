"""conv2d forward + backward, symgrad (Numba CPU backend) against torch CPU, same run.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_conv.py [--quick] [--json]

LeNet's two convolutions on a batch of 64: 6x1x5x5 on 64x1x28x28 images and 16x6x5x5 on
64x6x12x12, float32, with a bias; one step is ``conv2d`` then ``backward`` of a fixed
output gradient (input, weight and bias gradients). Target (issue 21): <= 1.5x torch.
Each library runs in its own process with the thread pools fixed to 2 threads
(``SYMGRAD_BENCH_THREADS`` changes it), as bench_core.py, whose Timer retries windows with
other CPU load; best of repeats.

The "numpy only" column is the same algorithm in plain NumPy, with no autograd and no
Numba: im2col as one copy from an ``as_strided`` view, one batched matmul (+ bias), and for
the backward ``W^T @ grad`` with a per-tap col2im, the columns gathered again and
``cols @ grad^T`` summed over the batch, the bias a sum. It is the floor of that algorithm
in NumPy alone; symgrad's cpu backend can beat it (Numba im2col/col2im loops instead of a
strided copy and a per-tap loop, pooled buffers instead of fresh pages).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
THREADS = os.environ.get("SYMGRAD_BENCH_THREADS", "2")
#: (name, input shape, weight shape)
CASES = [("conv1 6x1x5x5 on 64x1x28x28", (64, 1, 28, 28), (6, 1, 5, 5)),
         ("conv2 16x6x5x5 on 64x6x12x12", (64, 6, 12, 12), (16, 6, 5, 5))]


def _inputs(shape, wshape):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal(wshape, dtype=np.float32) * 0.1
    b = rng.standard_normal(wshape[0], dtype=np.float32)
    out = (shape[0], wshape[0], shape[2] - wshape[2] + 1, shape[3] - wshape[3] + 1)
    g = rng.standard_normal(out, dtype=np.float32)
    return x, w, b, g


def worker(lib_name: str, quick: bool) -> dict:
    sys.path.insert(0, HERE)
    from bench_core import Timer

    t = Timer(quick)
    if lib_name == "numpy":
        out = {name: _time_numpy(t, *_inputs(shape, wshape)) for name, shape, wshape in CASES}
        out["other_cpu"] = round(t.other_cpu, 2)
        return out
    if lib_name == "torch":
        import torch

        torch.set_num_threads(int(THREADS))
        lib, conv = torch, torch.nn.functional.conv2d
        make = torch.from_numpy
    else:
        import symgrad as sg

        lib, conv = sg, sg.nn.functional.conv2d
        make = sg.from_numpy
    out = {name: _time_case(t, lib, conv, [make(a) for a in _inputs(shape, wshape)])
           for name, shape, wshape in CASES}
    out["other_cpu"] = round(t.other_cpu, 2)
    return out


def _time_case(t, lib, conv, arrays) -> dict:
    x, w, b, g = arrays
    for p in (x, w, b):
        p.requires_grad_(True)

    def step():
        x.grad = w.grad = b.grad = None
        conv(x, w, b).backward(g)

    def forward():
        with lib.no_grad():
            conv(x, w, b)

    return {"fwd_bwd_ms": t.best(step, 20) * 1e3, "fwd_ms": t.best(forward, 20) * 1e3}


def _time_numpy(t, x, w, b, g) -> dict:
    """The fast path's algorithm in NumPy alone, nothing around it (a valid conv)."""
    import numpy as np
    from numpy.lib.stride_tricks import as_strided

    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = h - kh + 1, wd - kw + 1
    rows, p = c * kh * kw, oh * ow
    st = x.strides
    view = as_strided(x, (n, c, kh, kw, oh, ow), st + st[2:])
    w2 = w.reshape(o, rows)

    def columns():
        cols = np.empty((n, c, kh, kw, oh, ow), x.dtype)
        np.copyto(cols, view)
        return cols.reshape(n, rows, p)

    def forward():
        out = np.matmul(w2, columns())
        out += b.reshape(o, 1)
        return out.reshape(n, o, oh, ow)

    def step():
        forward()
        g3 = g.reshape(n, o, p)
        dcols = np.matmul(w2.T, g3).reshape(n, c, kh, kw, oh, ow)
        gx = np.zeros_like(x)
        for i in range(kh):
            for j in range(kw):
                gx[:, :, i:i + oh, j:j + ow] += dcols[:, :, i, j]
        gw = np.matmul(columns(), g3.transpose(0, 2, 1)).sum(0).T.reshape(w.shape)
        return gx, gw, g3.sum((0, 2))

    return {"fwd_bwd_ms": t.best(step, 20) * 1e3, "fwd_ms": t.best(forward, 20) * 1e3}


def run_worker(name: str, quick: bool) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name] + (
        ["--quick"] if quick else [])
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": THREADS,
           "OPENBLAS_NUM_THREADS": THREADS, "MKL_NUM_THREADS": THREADS,
           "NUMBA_NUM_THREADS": THREADS}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        raise RuntimeError(f"{name} worker failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=("symgrad", "torch", "numpy"))
    ap.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.quick)))
        return
    res = {lib: run_worker(lib, args.quick) for lib in ("torch", "symgrad", "numpy")}
    if args.json:
        print(json.dumps(res))
        return
    s, tch, flo = res["symgrad"], res["torch"], res["numpy"]
    title = f"conv2d, float32, {THREADS} threads"
    print(f"{title:44} {'symgrad':>9} {'torch':>9} {'ratio':>7} {'numpy only':>12}  target")
    for name, _, _ in CASES:
        for key, label in (("fwd_bwd_ms", "fwd+bwd, ms"), ("fwd_ms", "fwd no_grad, ms")):
            a, b, f = s[name][key], tch[name][key], flo[name][key]
            target = "<= 1.5x torch" if key == "fwd_bwd_ms" else ""
            print(f"{name + ' ' + label:44} {a:9.3f} {b:9.3f} {a / b:7.2f} {f:12.3f}  {target}")
    print(f"other_cpu (cores used by other processes while timing, max): symgrad "
          f"{s['other_cpu']}, torch {tch['other_cpu']}, numpy {flo['other_cpu']}")


if __name__ == "__main__":
    main()
