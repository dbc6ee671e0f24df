"""Forward values are checked too: each node's recorded output against its meaning.

A wrong forward kernel (``log1p`` computing ``log``, ``expm1`` replaced by ``exp`` inside
``elu``) leaves every backward rule right, and a gradient that never reads the wrong
output agrees with the symbolic one; so each node's recorded output is compared with
its meaning evaluated numerically (float64, vectorised) at its recorded inputs:

* elementwise ops: the SymPy meaning, lambdified once per op form;
* structural ops: the op's forward (its meaning) on the NumPy backend, or the real part
  of the complex-step pass of the adjoint check (``adjoint.py``), which computes it anyway.

Where no output was recorded (nobody held the tensor), the engine's own kernel is run
again on the recorded inputs (symgrad graphs on the CPU), so the kernel is still judged.

The bound is the rounding of the output's dtype over the computation's terms: for an
elementwise meaning ``f`` the first-order running error ``sum_t |df/dt| |t|`` over its
subexpressions ``t`` (each rounded once), times a few steps; for a structural op the
output's magnitude times the number of elements it may sum (``rounding_bound``). Elements
where either side is nan or infinite are left to the non-finite verdict.
"""

from __future__ import annotations

import numpy as np

from ._common import rounding_bound, same_memory
from .adjoint import NP_EXTRA, meaning_outputs

__all__ = ["forward_check", "ForwardCheck"]


class ForwardCheck:
    __slots__ = ("ok", "err", "bound", "detail", "checked")

    def __init__(self, ok, err, bound, detail, checked) -> None:
        self.ok = ok
        self.err = err
        self.bound = bound
        self.detail = detail
        self.checked = checked


_TEMPLATES: dict = {}


def _elementwise_template(spec, params, n_in):
    """(meaning, running-error magnitude, operation count) for an elementwise op form."""
    import sympy

    from ._common import lambdify_numpy

    key = (spec.name, repr(sorted(params.items(), key=lambda kv: kv[0])), n_in)
    hit = _TEMPLATES.get(key)
    if hit is not None:
        return hit
    xs = list(sympy.symbols(f"x0:{n_in}", real=True))
    f = sympy.sympify(spec.sympy(sympy, *xs, **params))
    terms = [sympy.Abs(f)]
    dummy = sympy.Dummy("t", real=True)
    for t in set(sympy.preorder_traversal(f)):
        if t.is_Atom or not isinstance(t, sympy.Expr) or t == f:
            continue
        ft = f.xreplace({t: dummy})
        if ft == f:
            continue
        d = sympy.diff(ft, dummy).xreplace({dummy: t})
        terms.append(sympy.Abs(d * t))
    fn = lambdify_numpy(xs, f, NP_EXTRA)
    mag = lambdify_numpy(xs, sympy.Add(*terms), NP_EXTRA)
    # a meaning's special case on a set of measure zero (atan2's ``0 where x**2 + y**2 ==
    # 0``, its gradient's convention at the origin): signed zeros make the engine's value
    # there another (atan2(0, -0) = pi), so those elements are not compared
    eqs = [c for pw in f.atoms(sympy.Piecewise) for _, c in pw.args
           if isinstance(c, sympy.Eq)]
    special = lambdify_numpy(xs, sympy.Or(*eqs), NP_EXTRA) if eqs else None
    mag.special = special
    hit = _TEMPLATES[key] = (fn, mag, int(sympy.count_ops(f)))
    return hit


def in_node_dtype(g, in_vals):
    """``(params, in_vals)`` with Python-float parameters and scalar inputs rounded to a
    float32 node's dtype, as the engine's float32 kernel uses them: ``x.clamp(0.7, 0.9)``
    on float32 compares ``x`` with ``float32(0.7)``, so an element equal to float32(0.7)
    is on the bound, not below it."""
    dts = [np.asarray(x).dtype for x in in_vals if isinstance(x, np.ndarray)
           and x.dtype.kind == "f"]
    if not dts or max(dt.itemsize for dt in dts) != 4:
        return g.params, in_vals

    def rnd(v):
        return float(np.float32(v)) if isinstance(v, float) else v

    params = {k: rnd(v) for k, v in g.params.items()}
    in_vals = [rnd(x) if r[0] == "scalar" else x for x, r in zip(in_vals, g.inputs)]
    return params, in_vals


#: inputs beyond these magnitudes may overflow or underflow inside a float64 meaning
EXTREME_ABOVE, EXTREME_BELOW = 2.0 ** 250, 2.0 ** -250


def _extreme(args, shape) -> np.ndarray:
    """Elements where some float input is huge or tiny (not zero)."""
    out = np.zeros(shape, dtype=bool)
    for x in args:
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":
            a = np.abs(x)
            hit = np.isfinite(a) & ((a > EXTREME_ABOVE) | ((a < EXTREME_BELOW) & (a > 0)))
            if hit.any():
                out |= np.broadcast_to(hit, shape)
        elif isinstance(x, float) and np.isfinite(x) and x != 0 and not (
                EXTREME_BELOW <= abs(x) <= EXTREME_ABOVE):
            out[...] = True
    return out


def _float64(x):
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return x.astype(np.float64, copy=False)  # the meanings do not write their inputs
    return x


def _recorded_outputs(g, graph, in_vals):
    """The node's outputs as the engine made them: recorded when the walker found them,
    else the engine's kernel run again (symgrad graphs on the CPU); None if neither."""
    recorded = getattr(graph, "_recorded", None)
    outs = []
    missing = False
    for nr in range(len(g.out_shapes)):
        key = (g.index, nr)
        if recorded is not None and key in recorded:
            outs.append(np.asarray(graph._values[key]))
        else:
            outs.append(None)
            missing = True
    if not missing:
        return outs
    if graph.kind != "symgrad" or g.spec is None or getattr(
            getattr(graph.root_tensor, "device", None), "type", "cpu") != "cpu":
        return outs if any(o is not None for o in outs) else None
    from ..backends import backend_for

    try:
        with np.errstate(all="ignore"):
            again = meaning_outputs(g, backend_for("cpu"), list(in_vals))
    except Exception:  # noqa: BLE001  (nothing to compare: the recorded ones only)
        return outs if any(o is not None for o in outs) else None
    return [o if o is not None else (np.asarray(again[nr]) if nr < len(again) else None)
            for nr, o in enumerate(outs)]


def _mean_finite(a) -> float:
    """The mean of the finite elements of ``a`` (0 if none)."""
    m = float(a.mean())
    if np.isfinite(m):
        return m
    fin = np.isfinite(a)
    return float(a[fin].mean()) if fin.any() else 0.0


def _structural_magnitudes(g, args, refs) -> dict:
    """The magnitude of the terms of each output of a node evaluated by its forward: the
    forward on the inputs' absolute values (for sums, products, convolutions and moves:
    the sum of |terms| exactly), plus |output|, plus the inputs' mean magnitude (a value
    made by subtracting large ones, as log_softmax's ``x - max - log(sum)``)."""
    from ..backends.numpy_backend import NumpyBackend

    absargs = [np.abs(a) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a
               for a in args]
    scale = [_mean_finite(a) for a in absargs
             if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size]
    base = max(scale) if scale else 0.0
    try:
        with np.errstate(all="ignore"):
            absval = meaning_outputs(g, NumpyBackend(), absargs)
    except Exception:  # noqa: BLE001  (no such pass: |output| and the inputs' scale)
        absval = ()
    out = {}
    for nr, r in refs.items():
        m = np.abs(r.real) if r.dtype.kind == "c" else np.abs(r.astype(np.float64))
        m = np.where(np.isfinite(m), m, 0.0)
        if nr < len(absval) and isinstance(absval[nr], np.ndarray) and \
                absval[nr].dtype.kind in "fc" and np.shape(absval[nr]) == m.shape:
            a = np.abs(absval[nr])
            m = m + np.where(np.isfinite(a), a, 0.0)
        out[nr] = m + base
    return out


def forward_check(g, graph, in_vals, value=None) -> ForwardCheck | None:
    """Compare node ``g``'s outputs with its meaning at ``in_vals``; None when nothing
    can be compared (a custom Function, no recorded value, no float output).

    ``value``: the meaning's outputs when a caller computed them already (the real part
    of the adjoint check's complex-step pass)."""
    from ..ops.spec import STRUCTURAL

    if g.spec is None or g.custom is not None:
        return None
    float_outs = [nr for nr, dt in enumerate(g.out_dtypes) if np.dtype(dt).kind == "f"]
    if not float_outs:
        return None
    rec = _recorded_outputs(g, graph, in_vals)
    if rec is None:
        return None
    params, vals = in_node_dtype(g, in_vals)
    args = [_float64(x) for x in vals]
    elementwise = callable(g.spec.sympy)
    discrete = any(isinstance(x, np.ndarray) and x.dtype.kind not in "f" for x in args)
    magfn = None
    try:
        with np.errstate(all="ignore"):
            if elementwise and not discrete and len(float_outs) == 1:
                fn, magfn, nops = _elementwise_template(g.spec, params, len(args))
                refs = {float_outs[0]: np.asarray(fn(*args), dtype=np.float64)}
                steps = 4 + nops
            else:
                if value is None:
                    if not (elementwise or g.spec.sympy == STRUCTURAL):
                        return None
                    from ..backends.numpy_backend import NumpyBackend

                    value = meaning_outputs(g, NumpyBackend(), args)
                refs = {nr: np.asarray(v) for nr, v in enumerate(value)
                        if not isinstance(v, (tuple, list))}
                sizes = [int(np.size(x)) for x in args if isinstance(x, np.ndarray)]
                steps = 8 if elementwise else 4 + max(sizes + [1])
    except Exception:  # noqa: BLE001  (a meaning NumPy cannot evaluate here: not compared)
        return None
    mags: dict = {}

    def magnitudes() -> dict:
        """The terms' magnitudes, computed only where |output| alone is too tight."""
        if not mags:
            try:
                with np.errstate(all="ignore"):
                    if magfn is not None:
                        mags[float_outs[0]] = np.asarray(magfn(*args), dtype=np.float64)
                    else:
                        mags.update(_structural_magnitudes(g, args, refs))
            except Exception:  # noqa: BLE001  (|output| only)
                mags[-1] = None
        return mags

    worst = None
    checked = 0
    for nr in float_outs:
        r = refs.get(nr)
        if nr >= len(rec) or rec[nr] is None or r is None or r.dtype.kind not in "fc":
            continue
        e = np.asarray(rec[nr])
        if e.dtype.kind != "f":
            continue
        try:
            r = np.broadcast_to(np.asarray(r.real, dtype=np.float64), e.shape)
        except ValueError:
            return ForwardCheck(False, float("inf"), 0.0,
                                f"forward: output {nr} has shape {list(e.shape)}, its "
                                f"meaning {list(np.shape(r))}", 0)
        if same_memory(e, r) or np.array_equal(e, r):  # equal: within any bound
            checked += int(e.size)
            continue
        dt = e.dtype
        e64 = e.astype(np.float64)
        both = np.isfinite(e64) & np.isfinite(r)
        if magfn is not None:  # the meaning in float64 over/underflows there (atan2's
            both &= ~_extreme(args, e.shape)  # ``x**2 + y**2 == 0`` at 1e-200): not compared
            if magfn.special is not None:
                try:
                    both &= ~np.broadcast_to(np.asarray(magfn.special(*args), dtype=bool),
                                             e.shape)
                except Exception:  # noqa: BLE001
                    pass
        # a float32 (half) output that overflowed where the exact value exceeds its range
        big = float(np.finfo(dt).max)
        with np.errstate(invalid="ignore"):
            err = np.where(both, np.abs(e64 - r), 0.0)
            m = np.abs(r)  # first |output| (a lower bound of the terms' magnitude) ...
            for _ in range(2):
                allowed = rounding_bound(dt, np.where(both, m, 0.0), steps, finite=both)
                allowed = allowed + 2 * float(np.finfo(dt).smallest_subnormal)
                bad = both & (err > allowed)
                full = magnitudes().get(nr)
                if not bad.any() or full is None:
                    break
                m = np.broadcast_to(np.abs(full), e.shape)  # ... then the terms' own
        over = np.isinf(e64) & np.isfinite(r) & (np.abs(r) >= big * (1 - 4 * np.finfo(dt).eps))
        checked += int(both.sum() + over.sum())
        if bad.any():
            j = int(np.argmax(np.where(bad, err / allowed, -1.0)))
            idx = [int(t) for t in np.unravel_index(j, e.shape)] if e.shape else []
            what = "" if len(g.out_shapes) == 1 else f"output {nr} "
            cand = (float(err.reshape(-1)[j] / allowed.reshape(-1)[j]), float(err.reshape(-1)[j]),
                    float(allowed.reshape(-1)[j]),
                    f"forward: {what}{idx}: engine {float(e64.reshape(-1)[j]):.10g}, meaning "
                    f"{float(r.reshape(-1)[j]):.10g} at the recorded inputs "
                    f"({int(bad.sum())} of {bad.size} elements outside the bound)")
            if worst is None or cand[0] > worst[0]:
                worst = cand
    if worst is not None:
        return ForwardCheck(False, worst[1], worst[2], worst[3], checked)
    return ForwardCheck(True, 0.0, 0.0, "", checked)
