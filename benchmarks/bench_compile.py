"""sg.compile against torch eager, torch.compile and symgrad eager: whole training steps.

    .venv/bin/python benchmarks/bench_compile.py [--quick] [--json] [--no-torch-compile]
    .venv/bin/python benchmarks/bench_compile.py --cold 5 --only chain_xg   # first call only
    .venv/bin/python benchmarks/bench_compile.py --only gpt --variants torch_compile,sg_compile \
        --rounds 9   # the two compilers, paired round by round

Workloads (float32, one thread everywhere: OMP/OPENBLAS/MKL/NUMBA threads = 1 are set
before any import in every worker):

* ``small``: MLP 16-128-128-16 (ReLU), batch 1, MSE, SGD(momentum=0.9): zero_grad,
  forward, backward, step
* ``big``: MLP 784-256-256-10 (ReLU), batch 64, cross_entropy, SGD(momentum=0.9)
* ``chain``: a ten-op elementwise chain on 1000 elements, forward + backward
  (``w.grad = None``; ``chain(x * w).sum().backward()``)
* ``gelu``: MLP 128-256-256-10 with GELU written from elementary ops (tanh form), batch 64,
  cross_entropy, Adam
* ``chain_xg``: ``chain`` with input gradients (``x.requires_grad``; ``x.grad = None`` and
  ``w.grad = None`` in the step): goal sg.compile <= 0.2x torch eager
* ``lenet``: LeNet-5 (conv 6x5x5, relu, max-pool, conv 16x5x5, relu, max-pool, 256-120-84-10),
  batch 64 of 1x28x28, cross_entropy, SGD(momentum=0.9): goal <= 0.8x torch eager
* ``gpt``: a 2-layer nanoGPT-shaped model (n_embd 64, 4 heads, 32 tokens, vocab 65, batch 8,
  tied embedding, causal scaled_dot_product_attention, GELU MLP), AdamW: goal <= 0.8x torch
  eager (and sg eager <= 1.5x torch eager)

``sg_compile_bg`` is ``sg.compile(fn, background=True)`` (its own cold cache): its first call
returns after the traced eager run, the code compiles in a thread; timed after ``wait()``.

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
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "NUMBA_NUM_THREADS")
VARIANTS = ("torch_eager", "torch_compile", "sg_eager", "sg_compile", "sg_compile_bg")
WORKLOADS = ("small", "big", "chain", "gelu", "chain_xg", "lenet", "gpt")
#: issue 33's goals: sg.compile / torch eager at most this
GOALS = {"chain_xg": 0.2, "lenet": 0.8, "gpt": 0.8}
#: the eager step's goal (most users never compile)
EAGER_GOALS = {"gpt": 1.5}


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


def _gpt(lib, vocab=65, block=32, n_embd=64, n_head=4, n_layer=2):
    """nanoGPT's model for ``lib`` (tests/_nanogpt.py, the one definition; it imports
    neither library, so a torch worker stays torch alone)."""
    sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "tests"))
    from _nanogpt import gpt

    return gpt(lib, vocab=vocab, block_size=block, n_layer=n_layer, n_head=n_head,
               n_embd=n_embd)


def _build(lib, F, optim, workload: str):
    """(step fn, its args) for ``workload`` in library ``lib`` (torch or symgrad)."""
    lib.manual_seed(0)
    if workload == "chain_xg":
        w = lib.randn(1000, requires_grad=True)
        x = lib.randn(1000, requires_grad=True)

        def chain_xg_step(x):
            w.grad = None
            x.grad = None
            loss = _chain(x * w).sum()
            loss.backward()
            return loss

        return chain_xg_step, (x,)
    if workload in ("lenet", "gpt"):
        nn = lib.nn
        if workload == "lenet":
            model = nn.Sequential(
                nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
                nn.Flatten(), nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                nn.Linear(84, 10))
            opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            x, y = lib.randn(64, 1, 28, 28), lib.randint(0, 10, (64,))

            def forward(a, b):
                return F.cross_entropy(model(a), b)
        else:
            model = _gpt(lib)
            opt = optim.AdamW(model.parameters(), lr=1e-3)
            x, y = lib.randint(0, 65, (8, 32)), lib.randint(0, 65, (8, 32))
            forward = model

        def model_step(a, b):
            opt.zero_grad()
            loss = forward(a, b)
            loss.backward()
            opt.step()
            return loss

        return model_step, (x, y)
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


_NUMBER = {"small": 400, "big": 40, "chain": 400, "gelu": 60, "chain_xg": 400, "lenet": 20,
           "gpt": 20}


def worker(variant: str, quick: bool, only: tuple = WORKLOADS) -> dict:
    """Time every workload with one variant (this process imports one library)."""
    if variant.startswith("torch"):
        import torch

        torch.set_num_threads(1)
        lib, F, optim = torch, torch.nn.functional, torch.optim
    else:
        import symgrad as sg

        lib, F, optim = sg, sg.nn.functional, sg.optim
    out = {}
    for workload in only:
        fn, args = _build(lib, F, optim, workload)
        if variant == "sg_compile_bg":  # compiled in a thread; eager calls meanwhile
            fn = lib.compile(fn, background=True)
        elif variant.endswith("compile"):
            fn = lib.compile(fn)
        try:
            t0 = time.perf_counter()
            fn(*args)
            first = time.perf_counter() - t0
            if variant == "sg_compile_bg":
                fn.wait()  # timed below: the compiled code
                out_ready = time.perf_counter() - t0
            fn(*args)  # sg.compile: the first run of the generated code
            number = _NUMBER[workload] // (8 if quick else 1)
            ms = _best(fn, args, max(number, 3), 3 if quick else 7) * 1e3
            out[workload] = {"ms": ms, "first_s": first}
            if variant == "sg_compile_bg":
                out[workload]["ready_s"] = out_ready
            if variant.startswith("sg_compile"):  # its own part: code generation + Numba (or cache)
                out[workload]["compile_s"] = fn.stats["compile_s"]
                if fn.stats["fallbacks"]:  # ran eagerly: say why
                    out[workload]["fallback"] = fn.stats["fallbacks"][0][:160]
        except Exception as exc:  # torch.compile needs a working C toolchain
            out[workload] = {"unavailable": f"{type(exc).__name__}: {str(exc)[:120]}"}
    return out


def run_worker(variant: str, quick: bool, cache: str, timeout: float,
               only: tuple = WORKLOADS) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "SYMGRAD_COMPILE_CACHE": cache,
           **{v: "1" for v in THREAD_VARS}}
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant,
           "--only", ",".join(only)] + (["--quick"] if quick else [])
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {w: {"unavailable": f"timed out after {timeout:.0f} s"} for w in only}
    if res.returncode:
        reason = (res.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return {w: {"unavailable": reason} for w in only}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _merge(best: dict, new: dict) -> None:
    """Keep the best ms per workload, and the first call of the first round (the coldest)."""
    for w, r in new.items():
        old = best.get(w)
        if old is None:
            best[w] = r
        elif "ms" in r and ("ms" not in old or r["ms"] < old["ms"]):
            best[w] = {**r, "first_s": old.get("first_s", r["first_s"])}
            if "ready_s" in old:
                best[w]["ready_s"] = old["ready_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=VARIANTS)
    ap.add_argument("--quick", action="store_true", help="one round, fewer repeats")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-torch-compile", action="store_true",
                    help="skip torch.compile (its first call takes tens of seconds)")
    ap.add_argument("--only", default=",".join(WORKLOADS),
                    help="comma-separated workloads (default: all)")
    ap.add_argument("--rounds", type=int, default=3, metavar="N",
                    help="rounds of the variants (default 3; --quick: 1); with two or more, "
                         "sg.compile and torch.compile are also compared round by round")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated variants (default: all)")
    ap.add_argument("--cold", type=int, metavar="N", default=0,
                    help="only sg.compile's cold first call: N fresh processes, each with an "
                         "empty compile cache (the CPU backend's own kernels cached)")
    args = ap.parse_args()
    only = tuple(w for w in args.only.split(",") if w)
    bad = set(only) - set(WORKLOADS)
    if bad:
        ap.error(f"unknown workloads {sorted(bad)} (known: {', '.join(WORKLOADS)})")
    if args.worker:
        for v in THREAD_VARS:
            os.environ[v] = "1"
        print(json.dumps(worker(args.worker, args.quick, only)))
        return
    if args.cold:
        _cold(args.cold, only, args.json)
        return
    chosen = [v for v in args.variants.split(",") if v]
    bad = set(chosen) - set(VARIANTS)
    if bad:
        ap.error(f"unknown variants {sorted(bad)} (known: {', '.join(VARIANTS)})")
    variants = [v for v in VARIANTS if v in chosen
                and not (args.no_torch_compile and v == "torch_compile")]
    rounds = 1 if args.quick else max(args.rounds, 1)
    results: dict[str, dict] = {v: {} for v in variants}
    per_round: dict[str, dict] = {v: {} for v in variants}  # variant -> workload -> [ms]
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as cache:
        cold = cold_own = None
        for r in range(rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for v in order:
                # the background variant gets its own cache: its first round is cold too
                res = run_worker(v, args.quick, cache + "-bg" if v == "sg_compile_bg" else cache,
                                 900, only)
                if v == "sg_compile" and cold is None:
                    cold = {w: x.get("first_s") for w, x in res.items()}
                    cold_own = {w: x.get("compile_s") for w, x in res.items()}
                _merge(results[v], res)
                for w, x in res.items():
                    per_round[v].setdefault(w, []).append(x.get("ms"))
        warm = (run_worker("sg_compile", True, cache, 900, only) if "sg_compile" in variants
                else {})
        shutil.rmtree(cache + "-bg", ignore_errors=True)
    bg_cold = {w: (x.get("first_s"), x.get("ready_s")) for w, x in
               results.get("sg_compile_bg", {}).items()}
    summary = {"results": results, "per_round_ms": per_round,
               "sg_compile_first_call_cold_s": cold,
               "sg_compile_bg_first_and_ready_s": bg_cold,
               "sg_compile_first_call_warm_s": {w: x.get("first_s") for w, x in warm.items()},
               "sg_compile_own_cold_s": cold_own,
               "sg_compile_own_warm_s": {w: x.get("compile_s") for w, x in warm.items()}}
    if args.json:
        print(json.dumps(summary))
        return
    _print(summary, variants, only)


def _cold(n: int, only: tuple, as_json: bool) -> None:
    """sg.compile's first call with an empty compile cache, ``n`` times (one process and
    one fresh cache each, one workload per process: nothing compiled for one workload is
    in memory for the next); printed per run, with the median and the worst."""
    runs: dict[str, list] = {w: [] for w in only}
    for _ in range(n):
        for w in only:
            with tempfile.TemporaryDirectory(prefix="bench-compile-cold-") as cache:
                res = run_worker("sg_compile", True, os.path.join(cache, "cc"), 900, (w,))
            runs[w].append(res[w].get("first_s") or float("nan"))
            if "fallback" in res[w] or "unavailable" in res[w]:
                print(f"{w}: {res[w].get('fallback') or res[w].get('unavailable')}",
                      file=sys.stderr)
    if as_json:
        print(json.dumps({"sg_compile_first_call_cold_s": runs}))
        return
    print(f"sg.compile first call, empty compile cache, s ({n} processes each; goal <= 2 s):")
    for w, xs in runs.items():
        srt = sorted(xs)
        print(f"  {w:8} median {srt[len(srt) // 2]:.3f}  worst {srt[-1]:.3f}   "
              + " ".join(f"{x:.3f}" for x in xs))


def _print(summary: dict, variants: list, only: tuple = WORKLOADS) -> None:
    res = summary["results"]
    print("ms per step (1 thread, best of the rounds); ratio = variant / torch eager; "
          "first call in s (first round)")
    print(f"{'workload':8} " + " ".join(f"{v:>24}" for v in variants) + "   goal")
    for w in only:
        base = res.get("torch_eager", {}).get(w, {}).get("ms")
        cells = []
        for v in variants:
            r = res[v].get(w, {})
            if "ms" not in r:
                cells.append(f"{'unavailable':>24}")
                continue
            ratio = f"{r['ms'] / base:.2f}x" if base else "-"
            cells.append(f"{r['ms']:9.3f} ({ratio:>6}) {r['first_s']:5.1f}s")
        goal = ""
        if w in GOALS:
            got = res.get("sg_compile", {}).get(w, {}).get("ms")
            met = "?" if not (got and base) else ("met" if got / base <= GOALS[w] else "MISSED")
            goal = f"   sg.compile <= {GOALS[w]}x: {met}"
            tc = res.get("torch_compile", {}).get(w, {}).get("ms")
            if tc and got:
                goal += f"; < torch.compile: {'met' if got < tc else 'MISSED'}"
        if w in EAGER_GOALS:
            got = res.get("sg_eager", {}).get(w, {}).get("ms")
            met = "?" if not (got and base) else ("met" if got / base <= EAGER_GOALS[w]
                                                  else "MISSED")
            goal += f"; sg eager <= {EAGER_GOALS[w]}x: {met}"
        print(f"{w:8} " + " ".join(cells) + goal)
    for v in variants:
        for w in only:
            reason = res[v].get(w, {}).get("unavailable")
            if reason:
                print(f"{v} {w}: unavailable (skipped): {reason}")
            fallback = res[v].get(w, {}).get("fallback")
            if fallback:
                print(f"{v} {w}: ran eagerly: {fallback}")
    _print_paired(summary.get("per_round_ms") or {}, only)
    cold, warm = summary["sg_compile_first_call_cold_s"], summary["sg_compile_first_call_warm_s"]
    if cold:
        own, own_warm = summary["sg_compile_own_cold_s"], summary["sg_compile_own_warm_s"]

        def s(d, w):
            return f"{(d or {}).get(w) or float('nan'):.3f}"

        print("sg.compile first call (eager traced run + compile), s, cold cache / warm cache:")
        for w in only:
            print(f"  {w:6} {s(cold, w)} / {s(warm, w)}   of which code generation + Numba: "
                  f"{s(own, w)} / {s(own_warm, w)}")
    bg = summary.get("sg_compile_bg_first_and_ready_s") or {}
    if bg:
        print("sg.compile(background=True), cold cache (best round): first result / compiled "
              "code ready, s:")
        for w in only:
            first, ready = bg.get(w, (None, None))
            print(f"  {w:6} {first or float('nan'):.3f} / {ready or float('nan'):.3f}")


def _print_paired(per_round: dict, only: tuple) -> None:
    """sg.compile against torch.compile round by round: the two ran in neighbouring
    processes of one round, so a round's ratio sees the machine's load of that moment; on
    a shared machine the median of the ratios says more than two best times measured
    minutes apart."""
    sg, tc = per_round.get("sg_compile", {}), per_round.get("torch_compile", {})
    lines = []
    for w in only:
        pairs = [(a, b) for a, b in zip(sg.get(w, []), tc.get(w, [])) if a and b]
        if len(pairs) < 2:
            continue
        ratios = sorted(a / b for a, b in pairs)
        n = len(ratios)
        median = (ratios[(n - 1) // 2] + ratios[n // 2]) / 2
        wins = sum(r < 1 for r in ratios)
        lines.append(f"  {w:8} median {median:.3f}  sg.compile faster in {wins} of {n} rounds"
                     "   " + " ".join(f"{a / b:.3f}" for a, b in pairs))
    if lines:
        print("sg.compile / torch.compile per round (ms ratio, same round; < 1: sg.compile "
              "faster):")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
