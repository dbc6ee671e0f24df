"""One op with graph recording, symgrad against torch (issue 22: at most 1.5x torch).

Each library runs in its own process, the processes alternate over several rounds, and each
figure is the best of 9 x 20000 calls timed with ``time.process_time`` (CPU time of this
process: on a shared machine wall-clock time also counts the time other jobs held the
core). torch runs with one thread.

    .venv/bin/python benchmarks/bench_per_op.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

CASES = ("a + b", "a * b", "tanh(a)", "a + b (no_grad)")


def worker(lib_name: str) -> dict:
    if lib_name == "torch":
        import torch as lib

        lib.set_num_threads(1)
    else:
        import symgrad as lib
    a = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = lib.tensor([4.0, 5.0, 6.0])
    calls = {"a + b": lambda: a + b, "a * b": lambda: a * b, "tanh(a)": lambda: lib.tanh(a)}
    out = {}
    for name, fn in calls.items():
        out[name] = _best(fn)
    with lib.no_grad():
        out["a + b (no_grad)"] = _best(calls["a + b"])
    return out


def _best(fn, number: int = 20000, repeat: int = 9) -> float:
    for _ in range(1000):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        for _ in range(number):
            fn()
        best = min(best, (time.process_time() - t) / number)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worker")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return
    runs: dict[str, list[dict]] = {"symgrad": [], "torch": []}
    for _ in range(args.rounds):
        for lib in runs:
            res = subprocess.run([sys.executable, __file__, "--worker", lib], check=True,
                                 capture_output=True, text=True)
            runs[lib].append(json.loads(res.stdout))
    print(f"{'µs per call (best of rounds)':32} {'symgrad':>8} {'torch':>8} {'ratio':>6}  "
          "ratio per round")
    for case in CASES:
        s = min(r[case] for r in runs["symgrad"])
        t = min(r[case] for r in runs["torch"])
        per_round = " ".join(f"{x[case] / y[case]:.2f}"
                             for x, y in zip(runs["symgrad"], runs["torch"]))
        target = "" if "no_grad" in case else "  (target <= 1.5)"
        print(f"{case:32} {s:8.2f} {t:8.2f} {s / t:6.2f}  {per_round}{target}")


if __name__ == "__main__":
    main()
