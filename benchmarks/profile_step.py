"""Time each statement of a sg.compile'd bench_compile step (median over many calls).

    .venv/bin/python benchmarks/profile_step.py [small|big|chain|gelu] [--calls N]

One thread (set before any import). The generated module's ``run`` is rewritten with a
timer after every top-level statement, loaded next to a temp file (Numba's disk cache
off), and called on the step's own arrays; printed: the median µs of each statement, the
sum over the lines with a product (``ones @ g`` bias sums not counted) and over the rest
(docs/compile.md, "The 784-256-256-10 step"). The timers add about 0.2 µs a statement.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import types

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_v] = "1"

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_compile  # noqa: E402

import symgrad as sg  # noqa: E402

_SKIP = ("return", "if ", "else", "lr, ", "nlr_", "c1_")


def instrument(text: str) -> tuple[str, list[str]]:
    """The module text with ``_t = _T(k, _t)`` after each top-level statement of ``run``."""
    out, labels, inside = [], [], False
    for line in text.split("\n"):
        if line.startswith("    def run("):
            inside = True
            out += [line, "        _t = _pc()"]
            continue
        if line.startswith("    return run"):
            inside = False
        body = line.startswith("        ") and not line.startswith("         ")
        if inside and body and not line.strip().startswith(_SKIP) and \
                not line.rstrip().endswith(("= A", "= L")):
            out += [line, f"        _t = _T({len(labels)}, _t)"]
            labels.append(line.strip())
            continue
        out.append(line)
    return "\n".join(out).replace("cache=True", "cache=False"), labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", nargs="?", default="big", choices=bench_compile.WORKLOADS)
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args()
    fn, step_args = bench_compile._build(sg, sg.nn.functional, sg.optim, args.workload)
    step = sg.compile(fn)
    step(*step_args)
    step(*step_args)
    entry = step._entries()[-1]
    src, labels = instrument(entry.generated.text)
    times: list[list[int]] = [[] for _ in labels]

    def _T(k, t0):  # noqa: N802
        times[k].append(time.perf_counter_ns() - t0)
        return time.perf_counter_ns()

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    mod = types.ModuleType("profiled_step")
    mod.__dict__.update(_pc=time.perf_counter_ns, _T=_T)
    exec(compile(src, f.name, "exec"), mod.__dict__)  # noqa: S102
    run, _ = mod.make(entry.generated.constants)
    leaves, entry_grads, hyper = entry._gather()
    arrays = [a._data for a in step_args if isinstance(a, sg.Tensor)]
    for _ in range(args.calls // 2):  # warm up, then measure
        run(arrays, leaves, entry_grads, hyper)
    for t in times:
        t.clear()
    for _ in range(args.calls):
        run(arrays, leaves, entry_grads, hyper)
    os.unlink(f.name)
    total = blas = 0.0
    for label, t in zip(labels, times):
        med = float(np.median(t)) / 1e3
        total += med
        blas += med if "np.matmul(" in label and "(ONES_" not in label else 0.0
        print(f"{med:8.1f}  {label[:100]}")
    print(f"sum {total:.1f} µs: lines with a product {blas:.1f} (a relu mask on the same line "
          f"included; bias sums excluded), the rest {total - blas:.1f}")


if __name__ == "__main__":
    main()
