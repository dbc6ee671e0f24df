"""Drawing big graphs (issue 30, scope 4): graph JSON + layout + static HTML per size.

For each graph: ``graph_json`` (the frozen payload: saved operands, previews, per-node
formulas) and ``mimebundle`` (layout, static SVG/HTML, text outline: what ``sg.graph(y)``
and ``%%symgrad`` display), timed separately, best of a few runs, on the whole graph
(``max_nodes`` raised past the default cut of ``MAX_NODES``), in CPU seconds of this
process (``time.process_time``: one core's work, whatever else the machine runs). Graphs:

- ``chain N``: ``y = (y * 1.001).tanh()`` repeated N/2 times (N op nodes, plus one ``None``
  node per constant operand);
- ``fan N``: ``stack([(x * w_i).tanh() for i < N/2]).sum()``, one layer N/2 wide;
- ``fold N``: ``(x * w_0).tanh() + (x * w_1).tanh() + ...``, a deep add chain whose
  branches share the leaf ``x`` (long edges to one leaf).

``us/node`` is the total per payload node; ``ratio`` compares it with the smallest graph of
the same family (1.0 = linear cost). Goal: a 2,000-node chain under 2 s, cost linear or
n log n. The last line times the first draw in a fresh process (SymPy import and formula
derivations included), as a user meets it. Timings, not tests: the tests pin the operation
counts (tests/test_graph_draw_scaling.py).

``--ts`` also times the labextension's own work on the same payloads, in Node
(``benchmarks/bench_graph_layout_ts.mjs``: chain finding, the scene from the shipped
layout, and its fast layout for views the shipped one does not cover).

Run: ``.venv/bin/python benchmarks/bench_graph_draw.py [--quick] [--ts]``
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import symgrad as sg

G = importlib.import_module("symgrad.jupyter.graph")


def chain(n_ops: int):
    x = sg.randn(3, requires_grad=True)
    y = x
    for _ in range(n_ops // 2):
        y = (y * 1.001).tanh()
    return y


def fan(n_ops: int):
    x = sg.randn(3, requires_grad=True)
    ws = [sg.randn(3, requires_grad=True) for _ in range(n_ops // 2)]
    return sg.stack([(x * w).tanh() for w in ws]).sum()


def fold(n_ops: int):
    x = sg.randn(3, requires_grad=True)
    ws = [sg.randn(3, requires_grad=True) for _ in range(n_ops // 3)]
    total = (x * ws[0]).tanh()
    for w in ws[1:]:
        total = total + (x * w).tanh()
    return total.sum()


def draw(root) -> tuple[int, float, float, int]:
    """Payload nodes, seconds for the JSON, seconds for the bundle, HTML bytes."""
    t0 = time.process_time()
    payload = G.graph_json(root, max_nodes=10**9)
    t1 = time.process_time()
    bundle = G.mimebundle(payload)
    t2 = time.process_time()
    return len(payload["nodes"]), t1 - t0, t2 - t1, len(bundle["text/html"])


def best(root, repeats: int) -> tuple[int, float, float, int]:
    runs = [draw(root) for _ in range(repeats)]
    n, _, _, size = runs[0]
    return n, min(r[1] for r in runs), min(r[2] for r in runs), size


def cold() -> None:
    """One 2,000-node chain drawn as ``sg.graph(y)._repr_html_()`` in this fresh process."""
    y = chain(2000)
    t0 = time.process_time()
    html = sg.graph(y)._repr_html_()
    print(f"{time.process_time() - t0:.3f} {len(html)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one run each")
    ap.add_argument("--ts", action="store_true", help="also time the labextension in Node")
    ap.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cold:
        cold()
        return
    sizes = [500, 2000] if args.quick else [500, 2000, 10000]
    families = {"chain": (chain, sizes), "fan": (fan, sizes[:-1] if args.quick else sizes),
                "fold": (fold, sizes)}
    chain(10)  # warm the op kernels; the first draw below warms SymPy and the formula cache
    G.mimebundle(G.graph_json(chain(20)))
    print(f"{'graph':<12}{'nodes':>7}{'json s':>9}{'bundle s':>10}{'total s':>9}"
          f"{'us/node':>9}{'ratio':>7}{'html KB':>9}")
    payloads: list[tuple[str, dict]] = []
    for name, (build, ns) in families.items():
        base = None
        for n in ns:
            root = build(n)
            nodes, tj, tb, size = best(root, 1 if args.quick or n > 2000 else 3)
            per = (tj + tb) / nodes * 1e6
            base = base or per
            print(f"{name + ' ' + str(n):<12}{nodes:>7}{tj:>9.3f}{tb:>10.3f}{tj + tb:>9.3f}"
                  f"{per:>9.1f}{per / base:>7.2f}{size / 1024:>9.0f}")
            if args.ts:
                payloads.append((f"{name}-{n}.json", G.with_layout(
                    G.graph_json(root, max_nodes=10**9))))
            del root
    out = subprocess.run([sys.executable, __file__, "--cold"], capture_output=True,
                         text=True, check=True).stdout.split()
    print(f"first draw of a 2,000-node chain in a fresh process (sg.graph(y)._repr_html_(), "
          f"SymPy import included): {float(out[0]):.2f} s, {int(out[1]) // 1024} KB "
          f"(goal < 2 s)")
    if args.ts:
        ts(payloads)


def ts(payloads: list[tuple[str, dict]]) -> None:
    node = shutil.which("node")
    script = Path(__file__).with_name("bench_graph_layout_ts.mjs")
    if node is None:
        print("--ts: node is not installed")
        return
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for fname, payload in payloads:
            files.append(str(Path(tmp) / fname))
            Path(files[-1]).write_text(json.dumps(payload))
        print("\nlabextension in Node (best of 3, ms):", flush=True)
        subprocess.run([node, str(script), *files], check=False)


if __name__ == "__main__":
    main()
