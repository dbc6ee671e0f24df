"""How far the verifier can be trusted (issue 18): false alarms and mutation score.

1. False-alarm rate: random *correct* graphs from the property test's generator
   (tests/test_verify_false_alarms.py, ``random_graph``), half float64 and half float32,
   each verified in local, exact and auto mode. A false alarm is a report that blames a
   rule or the engine's glue (status ``mismatch`` or a ``first_bad_node``); ``imprecise``
   (float32 rounding, ok stays true) and non-finite are counted beside it, not as alarms.
2. Mutation score: every planted single-op bug of tests/test_verify_mutation.py and every
   glue mutant of tests/test_verify_glue.py, in float32 and float64, in local and exact
   mode: the share that is flagged (not ok) *and* named (the mutated node is
   ``first_bad_node`` and the only node blamed; a glue mutant's step is named).

Run: ``.venv/bin/python benchmarks/bench_verify_trust.py [--graphs 2000]`` (prints tables;
not a timed test).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

import numpy as np

import symgrad as sg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))

import test_verify_false_alarms as props  # noqa: E402  (the property test's generator)
import test_verify_glue as glue  # noqa: E402
import test_verify_mutation as mut  # noqa: E402

from symgrad.autograd import engine  # noqa: E402
from symgrad.ops import OPS  # noqa: E402

MODES = ("local", "exact", "auto")
DTYPES = {"float64": sg.float64, "float32": sg.float32}


def false_alarms(n_graphs: int) -> None:
    per = n_graphs // len(DTYPES)
    stats = collections.defaultdict(collections.Counter)
    examples = []
    t0 = time.perf_counter()
    for dt_name, dt in DTYPES.items():
        for k in range(per):
            seed = 100_000 + k
            root = props.random_graph(seed, dt)
            for mode in MODES:
                rep = sg.verify(root, mode=mode, timeout=60)
                c = stats[(mode, dt_name)]
                c["graphs"] += 1
                if props.false_alarm(rep):
                    c["false alarm"] += 1
                    if len(examples) < 3:
                        examples.append(f"seed {seed} {dt_name} {mode}:\n{rep.summary()}")
                elif not rep.precise:
                    c["imprecise"] += 1
                elif rep.status != "ok":
                    c[rep.status] += 1
                if rep.timed_out:
                    c["timed out"] += 1
    secs = time.perf_counter() - t0
    print(f"1. false alarms on {per * len(DTYPES)} random correct graphs "
          f"({per} per dtype; {secs:.0f} s)")
    print(f"   {'mode':6} {'dtype':8} {'graphs':>6} {'false alarms':>13} {'rate':>7} "
          f"{'imprecise':>10} {'other not-ok':>13}")
    for (mode, dt_name), c in sorted(stats.items()):
        other = sum(v for k, v in c.items() if k not in ("graphs", "false alarm", "imprecise",
                                                         "timed out"))
        print(f"   {mode:6} {dt_name:8} {c['graphs']:6d} {c['false alarm']:13d} "
              f"{c['false alarm'] / max(c['graphs'], 1):7.2%} {c['imprecise']:10d} "
              f"{other:13d}")
    for e in examples:
        print(e)


def _single_op_cases(dt):
    """(label, patch, builder, check) for the single-op mutants in dtype ``dt``."""
    original_t = mut._t

    def t_in(shape, seed, requires_grad=True, dtype=None, scale=1.0):
        return original_t(shape, seed, requires_grad, dt, scale)

    out = []
    for case, (op, input_name, wrong, build) in sorted(mut.CASES.items()):
        def patch(op=op, input_name=input_name, wrong=wrong):
            old = OPS[op].grads[input_name]
            OPS[op].grads[input_name] = wrong
            return lambda: OPS[op].grads.__setitem__(input_name, old)

        def run(mode, build=build):
            mut._t = t_in
            try:
                root, target_name = build()
            finally:
                mut._t = original_t
            target = mut._find(root, target_name)
            rep = sg.verify(root, mode=mode)
            bad = [r.node for r in rep.nodes if r.status in ("mismatch", "error")]
            return (not rep.ok), (rep.first_bad_node is target and bad == [target])

        out.append((f"op: {case}", patch, run))
    return out


def _glue_cases(dt):
    out = []
    families = (
        ("reduction", "_sum_to", glue.REDUCTION, glue._broadcast,
         lambda rep: any(r.status == "mismatch" and r.detail.startswith(
             "broadcast reduction into") and r.node is rep.first_bad_node
             for r in rep.nodes)),
        ("accumulation", "_sum_grads", glue.ACCUMULATION, glue._fan_out,
         lambda rep: "accumulation of the" in str(rep) and rep.first_bad_node is not None),
        ("AccumulateGrad", "_accumulate_into", glue.ACCUMULATE_GRAD, glue._both,
         lambda rep: "AccumulateGrad into" in str(rep)
         and type(rep.first_bad_node).__name__ == "AccumulateGrad"),
        ("backward loop", "_run_plain",
         {"inline overwrite": glue._inline_overwrite_run_plain()}, glue._fan_out,
         lambda rep: any("accumulation in the backward loop" in n for n in rep.notes)
         and rep.first_bad_node is not None),
    )
    for family, attr, mutants, build, named in families:
        for name, fn in sorted(mutants.items()):
            def patch(attr=attr, fn=fn):
                old = getattr(engine, attr)
                setattr(engine, attr, fn)
                return lambda: setattr(engine, attr, old)

            def run(mode, build=build, named=named):
                rep = sg.verify(build(dt), mode=mode)
                return (not rep.ok), (not rep.ok and named(rep))

            out.append((f"glue: {family} {name}", patch, run))
    return out


def mutation_score() -> None:
    t0 = time.perf_counter()
    rows = collections.defaultdict(lambda: [0, 0, 0])
    missed = []
    for dt_name, dt in DTYPES.items():
        for label, patch, run in _single_op_cases(dt) + _glue_cases(dt):
            kind = label.split(":")[0]
            for mode in ("local", "exact"):
                undo = patch()
                try:
                    flagged, named = run(mode)
                except Exception as exc:  # noqa: BLE001  (a crash counts as missed)
                    flagged = named = False
                    label = f"{label} ({type(exc).__name__}: {exc})"
                finally:
                    undo()
                r = rows[(kind, mode, dt_name)]
                r[0] += 1
                r[1] += flagged
                r[2] += named
                if not named:
                    missed.append(f"{label} [{mode}, {dt_name}]")
    secs = time.perf_counter() - t0
    print(f"\n2. mutation score ({secs:.0f} s): flagged = not ok, named = the mutated node "
          "or glue step blamed")
    print(f"   {'mutants':8} {'mode':6} {'dtype':8} {'planted':>7} {'flagged':>8} "
          f"{'named':>6} {'score':>7}")
    total = [0, 0, 0]
    for (kind, mode, dt_name), r in sorted(rows.items()):
        print(f"   {kind:8} {mode:6} {dt_name:8} {r[0]:7d} {r[1]:8d} {r[2]:6d} "
              f"{r[2] / max(r[0], 1):7.1%}")
        total = [a + b for a, b in zip(total, r)]
    print(f"   {'all':8} {'':6} {'':8} {total[0]:7d} {total[1]:8d} {total[2]:6d} "
          f"{total[2] / max(total[0], 1):7.1%}")
    for m in missed:
        print(f"   missed: {m}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", type=int, default=2000,
                    help="random correct graphs, split evenly over float64 and float32")
    ap.add_argument("--skip-false-alarms", action="store_true")
    args = ap.parse_args()
    np.seterr(all="ignore")
    if not args.skip_false_alarms:
        false_alarms(args.graphs)
    mutation_score()


if __name__ == "__main__":
    main()
