"""CUDA backend benchmark: run on a machine with an NVIDIA GPU (and numba-cuda[cu12|cu13]).

Prints, measured in the same run on the same GPU:
  * elementwise (``a + b``, ``a.exp()``, float32, 2**26 elements) in GB/s against the
    device's copy bandwidth (a device-to-device copy of the same bytes); target: within 1.3x
    of the copy time;
  * fp32 matmul 4096^3 in TFLOP/s against cuBLAS through PyTorch with TF32 off (target:
    at least 25% of it) and CuPy when installed;
  * an MLP train step ([784, 256, 256, 10], batch 64: forward, MSE, backward, SGD) in
    ms/step against torch on the same GPU.

Without a GPU it says so and exits 0 (the simulator is far too slow to time anything).
Usage: ``python benchmarks/bench_cuda.py [--quick]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time


def _no_gpu(reason: str) -> None:
    print(f"bench_cuda: skipped: {reason}")
    sys.exit(0)


def _gpu_timer(fn, repeat: int, warmup: int = 2) -> float:
    """Median seconds per call, timed with CUDA events around each call."""
    from numba import cuda

    for _ in range(warmup):
        fn()
    cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = cuda.event(), cuda.event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop) / 1000.0)
    return statistics.median(times)


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def main(quick: bool = False) -> None:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        _no_gpu("NUMBA_ENABLE_CUDASIM=1 is set: the simulator cannot be timed")
    import numpy as np

    import symgrad as sg

    if not sg.cuda.is_available():
        _no_gpu("no CUDA GPU found by numba.cuda (this machine has none, or numba-cuda lacks "
                "its toolkit: pip install 'numba-cuda[cu12]')")
    from symgrad.backends import backend_for
    from symgrad.backends.cuda import kernels

    torch = _torch_cuda()
    print(f"device: {sg.cuda.get_device_name()}")
    print(f"torch on this GPU: {'yes, ' + torch.__version__ if torch else 'not available'}")
    sg.zeros(1, device="cuda")  # loads and registers the backend
    be = backend_for("cuda")
    repeat = 5 if quick else 20

    # -- elementwise vs copy bandwidth ----------------------------------------------------
    n = 2**24 if quick else 2**26
    a = sg.rand(n, device="cuda")
    b = sg.rand(n, device="cuda")
    t_copy = _gpu_timer(lambda: be.copy(a._data), repeat)
    t_add = _gpu_timer(lambda: be.add(a._data, b._data), repeat)
    t_exp = _gpu_timer(lambda: be.exp(a._data), repeat)
    gb = n * 4 / 1e9
    print(f"\nelementwise, float32, {n} elements")
    print(f"  device copy   {2 * gb / t_copy:8.1f} GB/s  ({t_copy * 1e3:.3f} ms)")
    print(f"  a + b         {3 * gb / t_add:8.1f} GB/s  ({t_add * 1e3:.3f} ms, "
          f"{t_add / (1.5 * t_copy):.2f}x the copy time for its bytes)")
    print(f"  a.exp()       {2 * gb / t_exp:8.1f} GB/s  ({t_exp * 1e3:.3f} ms, "
          f"{t_exp / t_copy:.2f}x the copy time)")

    # -- matmul ---------------------------------------------------------------------------
    m = 2048 if quick else 4096
    x = sg.randn(m, m, device="cuda")
    y = sg.randn(m, m, device="cuda")
    t_mm = _gpu_timer(lambda: be.matmul(x._data, y._data), 3 if quick else 10, warmup=1)
    flops = 2 * m**3
    print(f"\nmatmul fp32 {m}^3 (tiles {kernels.MM_BM}x{kernels.MM_BN}x{kernels.MM_BK}, "
          f"{kernels.MM_TM}x{kernels.MM_TN} per thread)")
    print(f"  symgrad       {flops / t_mm / 1e12:8.2f} TFLOP/s  ({t_mm * 1e3:.2f} ms)")
    check = (x[:64] @ y[:, :64]).cpu().numpy()
    ref = x[:64].cpu().numpy().astype(np.float64) @ y[:, :64].cpu().numpy().astype(np.float64)
    print(f"  max rel error vs float64 on a 64x64 corner: "
          f"{np.abs(check - ref).max() / np.abs(ref).max():.2e}")
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        tx = torch.randn(m, m, device="cuda")
        ty = torch.randn(m, m, device="cuda")
        for _ in range(2):
            tx @ ty
        torch.cuda.synchronize()
        times = []
        for _ in range(3 if quick else 10):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            tx @ ty
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1000.0)
        t_torch = statistics.median(times)
        print(f"  torch (cuBLAS, TF32 off) {flops / t_torch / 1e12:8.2f} TFLOP/s  "
              f"-> symgrad at {t_torch / t_mm:.0%} of cuBLAS")
    try:
        import cupy

        cx, cy = cupy.random.randn(m, m, dtype=cupy.float32), cupy.random.randn(
            m, m, dtype=cupy.float32)
        t_cp = _gpu_timer(lambda: cx @ cy, 3 if quick else 10)
        print(f"  cupy          {flops / t_cp / 1e12:8.2f} TFLOP/s")
    except ImportError:
        print("  cupy          not installed")

    # -- MLP train step ---------------------------------------------------------------------
    sizes, batch = [784, 256, 256, 10], 64
    layers = []
    for i, (p, q) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(sg.nn.Linear(p, q))
        if i < len(sizes) - 2:
            layers.append(sg.nn.ReLU())
    model = sg.nn.Sequential(*layers).to("cuda")
    opt = sg.optim.SGD(model.parameters(), lr=0.01)
    data, target = sg.randn(batch, sizes[0], device="cuda"), sg.randn(batch, sizes[-1],
                                                                       device="cuda")

    def step():
        opt.zero_grad()
        loss = sg.nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()

    def wall(fn, k):
        from numba import cuda

        for _ in range(3):
            fn()
        cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        cuda.synchronize()
        return (time.perf_counter() - t0) / k

    t_step = wall(step, 20 if quick else 100)
    print(f"\nMLP train step {sizes} batch {batch} (forward, MSE, backward, SGD)")
    print(f"  symgrad       {t_step * 1e3:8.3f} ms/step")
    if torch is not None:
        tl = []
        for i, (p, q) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            tl.append(torch.nn.Linear(p, q))
            if i < len(sizes) - 2:
                tl.append(torch.nn.ReLU())
        tmodel = torch.nn.Sequential(*tl).cuda()
        topt = torch.optim.SGD(tmodel.parameters(), lr=0.01)
        td, tt = torch.randn(batch, sizes[0], device="cuda"), torch.randn(batch, sizes[-1],
                                                                          device="cuda")

        def tstep():
            topt.zero_grad()
            torch.nn.functional.mse_loss(tmodel(td), tt).backward()
            topt.step()

        for _ in range(3):
            tstep()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        k = 20 if quick else 100
        for _ in range(k):
            tstep()
        torch.cuda.synchronize()
        t_t = (time.perf_counter() - t0) / k
        print(f"  torch         {t_t * 1e3:8.3f} ms/step  -> symgrad/torch = {t_step / t_t:.2f}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
