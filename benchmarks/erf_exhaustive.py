"""Check the GELU loops' erf against the C library's on every float32, and refit it.

    .venv/bin/python benchmarks/erf_exhaustive.py [--lo 0] [--hi inf] [--step 1] [--neg]
    .venv/bin/python benchmarks/erf_exhaustive.py --fit

Check: for every float32 t in (lo, hi] (every ``step``-th bit pattern; ``--neg``: -t too),
``kernels.erf_f32_rows`` (what gelu_f32, gelu_b_prep_f32 and the compiled steps' gelu_save
run) rounded to float32 against the C library's erf (Numba's ``math.erf``) rounded to
float32, compiled with FMA contraction (as the kernels are) and without, in three layouts:
sorted (each group of ``ERF_GROUP`` takes its cheapest polynomial), and with one argument
of 1.5 or of 3.0 in every group (groups then take the |t| < 2 polynomial or the full
selection, so each polynomial is checked on its whole range). Prints every mismatch, then
the largest error of each polynomial against the C library's float64 erf on its range,
relative to the result, beside the margin ``erf_near`` leaves (2^-43 relative at least),
and how many of its results ``erf_near`` hands to the C library. All 4.3e9 float32 (both
signs) take about 20 minutes on one core.

Fit (``--fit``): the coefficients of the three polynomials, Chebyshev interpolants in
mpmath (40 digits) at the degrees kernels.py uses, printed with their error on a fine grid.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHUNK = 1 << 22
ONE = np.float32(1)


def _loops(fastmath):
    """(fill, compare, errors) compiled with ``fastmath`` (the flag the kernels inherit)."""
    from symgrad.backends.cpu import kernels

    rows, group, only = kernels.erf_f32_rows, kernels.ERF_GROUP, kernels.ERF_ONLY
    polys = (kernels.erf_small, kernels.erf_mid, kernels.erf_full)

    @njit(fastmath=fastmath, error_model="numpy")
    def fill(t, out):
        for g in range((t.size + group - 1) // group):
            lo = np.uint64(g * group)
            rows(t, ONE, lo, np.uint64(min(g * group + group, t.size)), only, out, out, out)

    @njit(error_model="numpy")
    def compare(t, out, bad):
        n = 0
        for i in range(t.size):
            want = math.erf(np.float64(t[i]))
            if out[i] != np.float32(want) and not (math.isnan(out[i]) and math.isnan(want)):
                if n < bad.size:
                    bad[n] = i
                n += 1
        return n

    small, mid, full = polys
    near = kernels.erf_near

    @njit(fastmath=fastmath, error_model="numpy")
    def errors(t, worst, flagged):
        for i in range(t.size):
            x = np.float64(t[i])
            want = math.erf(x)
            z = abs(x)
            if want == 0.0 or not z < 3.92:  # from 3.92 erf_tail is +-1 (as float32 erf)
                continue
            for k in range(3):
                if (k == 0 and z < 1.0) or (k == 1 and z < 2.0) or k == 2:
                    p = small(x) if k == 0 else (mid(x) if k == 1 else full(x))
                    worst[k] = max(worst[k], abs(p - want) / abs(want))
                    flagged[k] += near(p)

    return fill, compare, errors


def check(args) -> int:
    lo, hi = np.array([args.lo, args.hi], np.float32).view(np.int32)
    t0 = time.time()
    total = mismatches = 0
    worst = np.zeros(3)
    flagged = np.zeros(3, np.int64)
    from symgrad.backends.cpu import kernels
    group = kernels.ERF_GROUP
    for name, fm in (("contract", {"contract"}), ("plain", False)):
        fill, compare, errors = _loops(fm)
        for layout in ("sorted", "1.5", "3.0"):
            for sign in ((1, -1) if args.neg else (1,)):
                bad = np.zeros(64, np.int64)
                for start in range(int(lo) + 1, int(hi) + 1, CHUNK * args.step):
                    stop = min(start + CHUNK * args.step, int(hi) + 1)
                    bits = np.arange(start, stop, args.step, dtype=np.int32)
                    t = bits.view(np.float32) * np.float32(sign)
                    if layout != "sorted":
                        # a sentinel in each group's first slot: the group takes the
                        # polynomials that cover it; the other slots hold the arguments
                        t = np.insert(t, np.arange(0, t.size, group - 1),
                                      np.float32(layout))
                    out = np.empty(t.size, np.float32)
                    fill(t, out)
                    n = compare(t, out, bad)
                    total += bits.size
                    mismatches += n
                    for i in bad[:min(n, bad.size)]:
                        print(f"{name} {layout}: t={float(t[i])!r} ours={out[i]!r} "
                              f"libm={np.float32(math.erf(float(t[i])))!r}", flush=True)
                    if name == "contract" and layout == "sorted":
                        errors(t, worst, flagged)
                print(f"{name} {layout} sign {sign:+d}: done ({time.time() - t0:.0f} s)",
                      flush=True)
    print(f"checked {total} float32 values, {mismatches} mismatches")
    labels = ("erf_small (|t| < 1)", "erf_mid (|t| < 2)", "erf_full (|t| < 3.92)")
    for k, label in enumerate(labels):
        print(f"{label}: largest error {worst[k]:.3g} of the C library's erf "
              f"(erf_near's margin: {kernels._NEAR * 2.0**-53:.3g}); {flagged[k]} results "
              f"near a float32 rounding boundary")
    return 1 if mismatches else 0


def fit() -> None:
    """Chebyshev interpolants of erf(t)/t in t*t on |t| < 1 (degree 9) and < 2 (14), and of
    erf on [2, 3.92] in (|t| - 2.96) / 0.96 (degree 17), as monomial coefficients."""
    import mpmath as mp

    mp.mp.dps = 40

    def interpolant(f, n):
        xs = [mp.cos(mp.pi * (k + mp.mpf(1) / 2) / (n + 1)) for k in range(n + 1)]
        ys = [f(x) for x in xs]
        cheb = [2 * sum(ys[k] * mp.cos(j * mp.pi * (k + mp.mpf(1) / 2) / (n + 1))
                        for k in range(n + 1)) / (n + 1) for j in range(n + 1)]
        cheb[0] /= 2
        T = [[mp.mpf(1)], [mp.mpf(0), mp.mpf(1)]]
        for j in range(2, n + 1):
            a = [mp.mpf(0)] + [2 * v for v in T[j - 1]]
            T.append([a[i] - (T[j - 2][i] if i < len(T[j - 2]) else 0) for i in range(len(a))])
        mono = [mp.mpf(0)] * (n + 1)
        for j in range(n + 1):
            for i, v in enumerate(T[j]):
                mono[i] += cheb[j] * v
        return mono

    def small(top, n):  # erf(t)/t in v = 2 t^2 / top^2 - 1, then in u = t^2
        U = mp.mpf(top) ** 2
        mono = interpolant(lambda v: mp.erf(mp.sqrt(U * (v + 1) / 2)) / mp.sqrt(U * (v + 1) / 2)
                           if v > -1 else 2 / mp.sqrt(mp.pi), n)
        a = 2 / U
        return [float(sum(c * mp.binomial(i, k) * a ** k * (-1) ** (i - k)
                          for i, c in enumerate(mono) if i >= k)) for k in range(n + 1)]

    def horner(cs, x):
        r = cs[-1]
        for c in cs[-2::-1]:
            r = r * x + c
        return r

    for top, n in ((1.0, 9), (2.0, 14)):
        cs = small(top, n)
        err = max(abs(t * horner(cs, t * t) - mp.erf(t)) / mp.erf(t)
                  for t in np.linspace(1e-4, top, 4001)[:-1])
        print(f"|t| < {top}: error {float(err):.3g}\n  {cs}")
    tail = [float(c) for c in interpolant(lambda s: mp.erf(mp.mpf("2.96") + mp.mpf("0.96") * s),
                                          17)]
    err = max(abs(horner(tail, (z - 2.96) * (1.0 / 0.96)) - mp.erf(z))
              for z in np.linspace(2, 3.92, 4001))
    print(f"[2, 3.92]: error {float(err):.3g}\n  {tail}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lo", type=float, default=0.0)
    ap.add_argument("--hi", type=float, default=math.inf)
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--neg", action="store_true")
    ap.add_argument("--fit", action="store_true")
    args = ap.parse_args()
    if args.fit:
        fit()
        return 0
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
