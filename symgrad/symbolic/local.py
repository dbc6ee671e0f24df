"""Local mode: each node's backward against the symbolic Jacobian of its own op.

For every node, a seeded random cotangent ``v`` is pushed through the node's own numeric
backward (``node.apply``) and compared with ``J^T v``, where ``J`` comes from the op's
SymPy meaning at the node's recorded inputs:

* elementwise ops: SymPy differentiates the scalar meaning once; the derivative is
  evaluated over whole arrays (NumPy, float64), so nothing is sampled;
* structural ops (moves, sums, products): replayed on the SymPy backend with symbols in
  place of the checked elements. Large inputs are sampled (seeded, reported); an op
  that is linear in the checked input is replayed with the other elements of that input
  zero (exact for linear ops, and cheap), otherwise with their recorded values.
"""

from __future__ import annotations

import time

import mpmath
import numpy as np

from ..backends.numpy_backend import NUMPY_MATH
from ..backends.sympy_backend import SympyBackend, obj
from . import _engine as E
from ._common import (  # noqa: F401  (BOUND_FACTOR re-exported: defined here before)
    BOUND_FACTOR,
    TimeoutExpired,
    _sum_to,
    all_finite,
    exact_zero,
    lambdify_numpy,
    random_uniform,
    rounding_bound,
)
from .forward import in_node_dtype as _in_node_dtype

__all__ = ["check_node", "NodeCheck"]

#: Structural inputs up to this many elements are checked in full (no sampling).
DENSE_LIMIT = 512


class NodeCheck:
    __slots__ = ("status", "max_abs_err", "max_rel_err", "sampled", "checked", "formula",
                 "detail", "worst", "unknown", "engine_nonfinite", "bound", "glue", "forward")

    def __init__(self, status="ok", formula="") -> None:
        self.status = status
        self.max_abs_err = 0.0
        self.max_rel_err = 0.0
        self.sampled = False
        self.checked = 0
        self.formula = formula
        self.detail = ""
        self.worst = None
        self.unknown = None  # (input, index, engine, symbolic, count) not evaluable
        #: non-empty when the node's backward gave nan/inf from finite inputs and cotangent
        self.engine_nonfinite = ""
        self.bound = None  # the error allowed at the worst element
        self.glue = None  # a GlueFault: the engine's reduction after this node is wrong
        self.forward = None  # a forward.ForwardCheck: the recorded output against the meaning


_TEMPLATES: dict = {}


def _lambdas(spec, params, n_in, positions, fixed=()):
    """SymPy derivatives of an elementwise meaning, lambdified for NumPy (cached).

    ``fixed``: (position, value) pairs of discrete inputs (a where() condition) that the
    meaning branches on in Python; they are passed as constants.
    """
    import sympy

    key = (spec.name, repr(sorted(params.items(), key=lambda kv: kv[0])), n_in, positions,
           fixed)
    hit = _TEMPLATES.get(key)
    if hit is not None:
        return hit
    xs = list(sympy.symbols(f"x0:{n_in}", real=True))
    args = list(xs)
    for pos, val in fixed:
        args[pos] = val
    f = sympy.sympify(spec.sympy(sympy, *args, **params))
    derivs = []
    for k in positions:
        d = sympy.diff(f, xs[k])
        if d.has(sympy.Pow):  # x**y*y/x -> y*x**(y - 1): no 0/0 at x = 0
            d = sympy.powsimp(d)
        fn = lambdify_numpy(xs, d, _NP_EXTRA)
        # d2: the bound's output-rounding term |y| |f''/f'| (see rounding_bound)
        d2 = sympy.diff(d, xs[k])
        fn.second = lambdify_numpy(xs, d2, _NP_EXTRA) if d2 != 0 else None
        if d.has(sympy.Heaviside):  # ties: elements where the two one-sided forms differ
            f0 = lambdify_numpy(xs, d, _NP_H0)
            f1 = lambdify_numpy(xs, d, _NP_H1)
            fn.ties = lambda *a, f0=f0, f1=f1: np.asarray(f0(*a)) != np.asarray(f1(*a))
        derivs.append(fn)
    formula = _formula(spec, f, xs, positions)
    _TEMPLATES[key] = (derivs, formula)
    return derivs, formula


def _decided_derivative(spec, params, in_vals, idx, positions, k):
    """d meaning / d input k at one element, branches decided as PyTorch decides them."""
    import sympy

    values = {}
    args = []
    for i, x in enumerate(in_vals):
        if isinstance(x, np.ndarray):
            v = np.broadcast_to(x, idx[1]).item(idx[0]) if x.ndim else x.item()
        else:
            v = x
        if i in positions:
            s = sympy.Symbol(f"x{i}", real=True)
            values[s] = mpmath.mpf(float(v))
            args.append(s)
        elif isinstance(v, (float, np.floating)) and not np.isfinite(v):
            # an opaque symbol: SymPy folds x*nan to nan, whose derivative would be 0
            s = sympy.Symbol(f"c{i}", real=True)
            values[s] = mpmath.mpf(float(v))
            args.append(s)
        else:
            args.append(v)
    ev = E.Evaluator(values)
    eng = E.DecidingEngine(sympy, ev, spec.name in E.SPLIT_TIES)
    f = sympy.sympify(spec.sympy(eng, *args, **params))
    return float(ev(sympy.diff(f, args[k])))


#: at most this many elements per input are re-evaluated with mpmath (non-finite in NumPy)
MPMATH_RETRY_LIMIT = 4096


#: inputs beyond these magnitudes may overflow or underflow inside a float64 derivative
#: with a finite, wrong result (hypot's ``b / sqrt(a**2 + b**2)`` at 1e200 is b/inf = 0)
EXTREME_ABOVE, EXTREME_BELOW = 2.0 ** 250, 2.0 ** -250


def _extreme_inputs(in_vals, shape) -> np.ndarray:
    """Elements where some float input is huge or tiny (not zero): re-evaluated exactly."""
    out = np.zeros(shape, dtype=bool)
    for x in in_vals:
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":
            a = np.abs(x.astype(np.float64))
            hit = np.isfinite(a) & ((a > EXTREME_ABOVE) | ((a < EXTREME_BELOW) & (a > 0)))
            if hit.any():
                out |= np.broadcast_to(hit, shape)
    return out


def _fix_nonfinite(g, params, in_vals, k, dv, positions, where=None):
    """Re-evaluate with mpmath the elements where float64 NumPy gave nan/inf, or whose
    inputs are extreme.

    NumPy overflows where the derivative itself is finite (sigmoid's
    ``exp(-x)/(1 + exp(-x))**2`` at x = -800 is inf/inf = nan; hypot's ``b/sqrt(a**2 + b**2)``
    at 1e200 is b/inf = 0); mpmath's exponent range is unbounded, so only a derivative that
    is really infinite or undefined there stays so.
    """
    bad = ~np.isfinite(dv) | _extreme_inputs(in_vals, dv.shape)
    if where is not None:
        bad &= np.broadcast_to(where, dv.shape)
    if not bad.any():
        return dv
    flat = np.flatnonzero(bad)
    if flat.size > MPMATH_RETRY_LIMIT:
        return dv
    dv = np.array(dv, dtype=np.float64)
    for f in flat:
        idx = np.unravel_index(f, dv.shape)
        try:
            with mpmath.workdps(30):
                dv[idx] = _decided_derivative(g.spec, params, in_vals, (idx, dv.shape),
                                              positions, k)
        except (ValueError, TypeError, ZeroDivisionError, OverflowError):
            pass  # stays non-finite: reported as "could not evaluate"
    return dv


def _fix_ties(g, params, in_vals, args, k, d, dv, positions):
    """Recompute the derivative at tied elements (Max/Min with equal arguments)."""
    ties = getattr(d, "ties", None)
    if ties is None:
        return dv
    mask = np.broadcast_to(ties(*args), dv.shape)
    if not mask.any():
        return dv
    dv = np.array(dv, dtype=np.float64)
    for flat in np.flatnonzero(mask):
        idx = np.unravel_index(flat, dv.shape)
        dv[idx] = _decided_derivative(g.spec, params, in_vals, (idx, dv.shape), positions, k)
    return dv


def _fix_on_params(g, params, in_vals, args, k, dv, positions):
    """Recompute, with the branches decided as PyTorch decides them, the derivative at
    elements that equal a number parameter (a clamp bound): SymPy folds
    ``Min(Max(x, c), c)`` (bounds equal once rounded to float32) to the constant ``c``,
    whose derivative 0 is not PyTorch's clamp'(c) = 1."""
    pv = [float(v) for v in params.values() if isinstance(v, (float, int, np.floating))
          and not isinstance(v, bool) and np.isfinite(float(v))]
    if not pv or len(set(pv)) == len(pv):  # only a degenerate pair of equal bounds folds
        return dv
    x = np.broadcast_to(np.asarray(args[k], dtype=np.float64), dv.shape)
    mask = np.isin(x, pv)
    if not mask.any() or int(mask.sum()) > MPMATH_RETRY_LIMIT:
        return dv
    dv = np.array(dv, dtype=np.float64)
    for flat in np.flatnonzero(mask):
        idx = np.unravel_index(flat, dv.shape)
        dv[idx] = _decided_derivative(g.spec, params, in_vals, (idx, dv.shape), positions, k)
    return dv


def _heaviside(at_zero):
    return lambda x, h0=None: np.where(np.asarray(x) > 0, 1.0,
                                       np.where(np.asarray(x) < 0, 0.0, at_zero))


# NumPy has no erf ufunc (lambdify would pick math.erf, which takes one float)
_NP_EXTRA = {"DiracDelta": lambda x, *k: np.zeros_like(np.asarray(x, dtype=float)),
             "Heaviside": _heaviside(0.5), "sign": np.sign, "erf": NUMPY_MATH["erf"]}
_NP_H0 = {**_NP_EXTRA, "Heaviside": _heaviside(0.0)}
_NP_H1 = {**_NP_EXTRA, "Heaviside": _heaviside(1.0)}


def _formula(spec, f, xs, positions):
    import sympy

    names = [n for n in spec.inputs]
    sub = {x: sympy.Symbol(names[i] if i < len(names) else f"x{i}", real=True)
           for i, x in enumerate(xs)}
    parts = [f"result = {sympy.sstr(f.xreplace(sub))}"]
    for k in positions:
        d = sympy.diff(f, xs[k]).xreplace(sub)
        parts.append(f"d/d{names[k] if k < len(names) else k} = {sympy.sstr(d)}")
    return "; ".join(parts)


def _elementwise_jtv(g, in_vals, v, graph=None):
    positions = tuple(i for i, r in enumerate(g.inputs)
                      if r[0] != "scalar" and g.needs[i] and np.asarray(in_vals[i]).dtype.kind
                      == "f")
    discrete = [i for i, r in enumerate(g.inputs)
                if r[0] != "scalar" and np.asarray(in_vals[i]).dtype.kind in "biu"]
    params, in_vals = _in_node_dtype(g, in_vals)
    args = [np.asarray(x, dtype=np.float64) if isinstance(x, np.ndarray) and x.dtype.kind == "f"
            else x for x in in_vals]
    if discrete:  # one template per value of the discrete inputs, applied where it holds
        dis = [np.broadcast_to(np.asarray(in_vals[i]), v.shape) for i in discrete]
        combos = np.unique(np.stack([d.reshape(-1) for d in dis], axis=1), axis=0)
        if len(combos) > 16:
            raise ValueError("too many discrete input values for an elementwise template")
        total = {k: np.zeros(v.shape) for k in positions}
        formula = ""
        for combo in combos:
            mask = np.all(np.stack([d == c for d, c in zip(dis, combo)]), axis=0)
            fixed = tuple((i, c.item()) for i, c in zip(discrete, combo))
            derivs, formula = _lambdas(g.spec, params, len(in_vals), positions, fixed)
            with np.errstate(all="ignore"):
                for k, d in zip(positions, derivs):
                    dv = np.broadcast_to(np.asarray(d(*args), dtype=np.float64), v.shape)
                    dv = _fix_nonfinite(g, params, in_vals, k, dv, positions, mask)
                    total[k] = np.where(mask, dv, total[k])
        return {k: (_sum_to(v * total[k], np.shape(in_vals[k])), None,
                    (_sum_to(np.abs(v * total[k]), np.shape(in_vals[k])),
                     4 + v.size // max(int(np.prod(np.shape(in_vals[k]))), 1), None))
                for k in positions}, formula
    derivs, formula = _lambdas(g.spec, params, len(in_vals), positions)
    res = {}
    y = _recorded_output(g, graph, v.shape)
    with np.errstate(all="ignore"):
        for k, d in zip(positions, derivs):
            dv = np.broadcast_to(np.asarray(d(*args), dtype=np.float64), v.shape)
            dv = _fix_ties(g, params, in_vals, args, k, d, dv, positions)
            dv = _fix_on_params(g, params, in_vals, args, k, dv, positions)
            dv = _fix_nonfinite(g, params, in_vals, k, dv, positions)
            shape = np.shape(in_vals[k])
            mag = _sum_to(np.abs(v * dv), shape)
            terms = v.size // max(int(np.prod(shape)), 1)
            dterm = np.zeros(shape)
            if y is not None and getattr(d, "second", None) is not None:
                try:
                    d2 = np.broadcast_to(np.asarray(d.second(*args), dtype=np.float64),
                                         v.shape)
                except Exception:  # noqa: BLE001  (no second derivative: no output term)
                    d2 = np.zeros(v.shape)
                ratio = np.where((dv != 0) & np.isfinite(dv), np.abs(d2 / dv), 0.0)
                ratio = np.where(np.isfinite(ratio), ratio, 0.0)
                dterm = _sum_to(np.abs(v) * np.abs(y) * ratio, shape)
            res[k] = (_sum_to(v * dv, shape), None, (mag, 4 + terms, dterm))
    return res, formula


def _recorded_output(g, graph, shape):
    """The node's recorded output (float64), broadcast to ``shape``; None if unknown."""
    try:
        y = np.asarray(graph.value_of(("node", g.index, 0)), dtype=np.float64)
        return np.broadcast_to(y, shape)
    except Exception:  # noqa: BLE001  (no value: the bound has no output term)
        return None


def _structural_jtv(g, graph, in_vals, v_list, engine, engine_name, rng, sample, notes,
                    deadline=None):
    """{input k: (values at sampled flat indices, flat indices or None for all)}."""
    res = {}
    for k, r in enumerate(g.inputs):
        if r[0] == "scalar" or not g.needs[k]:
            continue
        x = np.asarray(in_vals[k])
        if x.dtype.kind != "f":
            continue
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutExpired  # a node with thousands of inputs (stack, cat)
        n = x.size
        if n <= max(DENSE_LIMIT, sample or 0):
            idx = np.arange(n)
            sampled = False
        else:
            idx = np.sort(rng.choice(n, size=sample or 32, replace=False))
            sampled = True
        syms = [E.make_symbol(engine_name, f"_x{i}") for i in range(len(idx))]
        out = None
        values = {s: mpmath.mpf(float(x.reshape(-1)[i])) for s, i in zip(syms, idx)}
        if sampled:  # cheap replay, exact when the op is linear in input k
            probe = obj(np.zeros(x.shape, dtype=np.float64))
            pf = probe.reshape(-1)
            for s, i in zip(syms, idx):
                pf[i] = s
            arrays = [probe if j == k else in_vals[j] for j in range(len(in_vals))]
            try:
                out = g.forward_numeric(SympyBackend(engine, linear_probe=True), arrays)
            except Exception:  # Nonlinear, or a decision that needs values: replay densely
                out = None
        if out is None:
            full = obj(x.astype(np.float64)).copy()
            ff = full.reshape(-1)
            for s, i in zip(syms, idx):
                ff[i] = s
            arrays = [full if j == k else (obj(np.asarray(in_vals[j], dtype=np.float64))
                                            if isinstance(in_vals[j], np.ndarray)
                                            and in_vals[j].dtype.kind == "f" else in_vals[j])
                      for j in range(len(in_vals))]
            ev = E.Evaluator(values)
            be = SympyBackend(engine, valuation=ev)
            be.ties_first = "indices" in g.spec.outputs  # max(dim): the argmax element
            out = g.forward_numeric(be, arrays)
        ev = E.Evaluator(values)
        acc = {s: 0.0 for s in syms}
        mag = {s: 0.0 for s in syms}
        cnt = {s: 0 for s in syms}
        symset = set(syms)
        for nr, o in enumerate(out[:len(v_list)]):
            o = obj(o)
            vo = v_list[nr]
            if vo is None:
                continue
            vflat = np.broadcast_to(vo, o.shape).reshape(-1)
            for j, e in enumerate(o.reshape(-1)):
                if j % 4096 == 4095 and deadline is not None and time.perf_counter() > deadline:
                    raise TimeoutExpired
                if E.is_atom(e) and not E.is_symbol(e):
                    continue
                if vflat[j] == 0:
                    continue
                for s, p in E.partials(e, engine_name).items():
                    if s in symset:
                        # a number, or an expression (a bare symbol too: d(a*b)/da = b)
                        number = E.is_atom(p) and not E.is_symbol(p)
                        pv = float(p) if number else float(ev(p))
                        acc[s] += float(vflat[j]) * pv
                        mag[s] += abs(float(vflat[j])) * (abs(pv) if number
                                                          else float(E.abs_value(ev, p)))
                        cnt[s] += 1
        vals = np.array([float(acc[s]) for s in syms], dtype=np.float64)
        mags = np.array([float(mag[s]) for s in syms], dtype=np.float64)
        terms = 4 + np.array([cnt[s] for s in syms], dtype=np.float64)
        res[k] = (vals, idx if sampled else None, (mags, terms, None))
        if sampled:
            notes.append(f"input '{g.input_names[k]}': {len(idx)} of {n} elements sampled")
    return res


def _engine_nonfinite(g, in_vals, engine_res) -> str:
    """Where the node's backward made nan/inf out of finite recorded inputs and a finite
    cotangent ("" if nowhere): that is where a non-finite gradient arises."""
    for x in in_vals:
        a = np.asarray(x)
        if a.dtype.kind == "f" and not all_finite(a):
            return ""
    for k, e in enumerate(engine_res):
        if e is None:
            continue
        a = np.asarray(e)
        if a.dtype.kind == "f" and not all_finite(a):
            i = np.unravel_index(int(np.argmax(~np.isfinite(a))), a.shape)
            name = g.input_names[k] if k < len(g.input_names) else str(k)
            return (f"the backward gives {float(a[i]):g} for '{name}'"
                    f"{list(int(j) for j in i)} from finite inputs and cotangent")
    return ""


def check_node(g, graph, engine, engine_name, rng, sample, tol_for, deadline=None):
    """Run the local check of one node; returns a :class:`NodeCheck`."""
    from ..ops.spec import STRUCTURAL

    if deadline is not None and time.perf_counter() > deadline:
        raise TimeoutExpired
    chk = NodeCheck()
    if not any(g.needs):
        chk.status = "skipped"
        chk.detail = "no input needs a gradient"
        return chk
    if g.spec is None and g.custom is None:
        chk.status = "unsupported"
        chk.detail = f"{g.name}: no SymPy meaning known for this node"
        return chk
    in_vals = graph.node_inputs(g)
    vs = []
    for shape, dt in zip(g.out_shapes, g.out_dtypes):
        # uniform in [-1, 1): both signs, a density (what the identities need), and a
        # third of the cost of normal draws on model-sized outputs
        v = random_uniform(rng, shape)[0]  # (large ones an outer product: _common.py)
        vs.append(v.astype(dt if np.dtype(dt).kind == "f" else np.float64, copy=False))
    g.glue = None
    try:
        engine_res = g.backward(graph, g, vs)
    except Exception as exc:  # a broken backward is a finding, not a crash
        chk.status = "error"
        chk.detail = f"backward raised {type(exc).__name__}: {exc}"
        return chk
    v64 = [np.asarray(v, dtype=np.float64) for v in vs]
    chk.engine_nonfinite = _engine_nonfinite(g, in_vals, engine_res)
    notes: list[str] = []
    if g.custom is not None:
        from .custom import custom_local

        sym, chk.formula, note = custom_local(g, graph, in_vals, v64, engine, engine_name, rng,
                                              sample)
        if sym is None:  # a declared surrogate gradient (straight-through estimator)
            chk.status, chk.detail = "skipped", note
            return chk
        if note:
            notes.append(note)
    elif callable(g.spec.sympy):
        sym, chk.formula = _elementwise_jtv(g, in_vals, v64[0], graph)
    elif g.spec.sympy == STRUCTURAL and (fast := _adjoint(g, in_vals, v64, engine_res, rng,
                                                           tol_for)) is not None:
        return _finish_adjoint(chk, g, graph, in_vals, fast)
    elif g.spec.sympy == STRUCTURAL:
        # at the exact replay's precision: exp(x_i)/sum exp(x_j) at |x| ~ 4e15 loses all
        # its digits in 53-bit arithmetic (relative error |x| eps)
        with mpmath.workdps(E.DPS):
            sym = _structural_jtv(g, graph, in_vals, v64, engine, engine_name, rng, sample,
                                  notes, deadline)
        chk.formula = f"{g.spec.name}: structural (forward replayed on the SymPy backend)"
    else:
        chk.status = "unsupported"
        chk.detail = f"op {g.spec.name!r} has no SymPy meaning"
        return chk
    bad = False
    worst_ratio = -1.0
    for k, item in sym.items():
        vals, idx = item[0], item[1]
        terms = item[2] if len(item) > 2 else None
        e = engine_res[k] if k < len(engine_res) else None
        if e is None:
            e = np.zeros(np.shape(in_vals[k]))
        e = np.asarray(e, dtype=np.float64)
        if e.shape != np.shape(in_vals[k]):
            try:
                e = np.broadcast_to(e, np.shape(in_vals[k]))
            except ValueError:
                chk.status = "mismatch"
                chk.detail = (f"gradient of '{g.input_names[k]}' has shape {e.shape}, "
                              f"expected {np.shape(in_vals[k])}")
                return chk
        ef = e.reshape(-1)
        sf = np.asarray(vals, dtype=np.float64).reshape(-1)
        if idx is not None:
            ef = ef[idx]
            chk.sampled = True
        dtype = np.asarray(in_vals[k]).dtype
        rtol, atol = tol_for(dtype)
        fd_ref = g.custom is not None and getattr(g.custom, "sympy", None) is None and \
            getattr(g, "trace", {}).get("status") != "ok"
        if fd_ref:  # finite differences: looser
            rtol, atol = max(rtol, 1e-5), max(atol, 1e-8)
        # Compared where the symbolic value is finite (an engine nan/inf there is a
        # mismatch). Where it is not, equal non-finite values agree (log'(0) = inf on both
        # sides) and any other pair is "could not evaluate": the checker has no number.
        sfin = np.isfinite(sf)
        with np.errstate(invalid="ignore"):
            same = (ef == sf) | (np.isnan(ef) & np.isnan(sf))
            err = np.where(sfin, np.where(ef == sf, 0.0, np.abs(ef - sf)), 0.0)
        err = np.where(np.isnan(err), np.inf, err)
        scale = np.abs(np.where(sfin, sf, 0.0)) + (np.mean(np.abs(sf[sfin])) if sfin.any()
                                                     else 0.0)
        if getattr(tol_for, "user", False) or fd_ref or terms is None:
            allowed = atol + rtol * scale
        else:
            mag, n, dterm = terms
            mag = np.where(np.isfinite(mag), mag, 0.0).reshape(-1)
            if idx is not None and mag.size != sf.size:
                mag = mag[idx]
            dterm = None if dterm is None else np.asarray(dterm, dtype=np.float64).reshape(-1)
            if dterm is not None and idx is not None and dterm.size != sf.size:
                dterm = dterm[idx]
            n = np.broadcast_to(np.asarray(n, dtype=np.float64).reshape(-1)
                                if np.ndim(n) else n, sf.shape)
            allowed = rounding_bound(dtype, mag, n, dterm, sfin)
        ok = ~sfin | (err <= allowed)
        if sfin.any():
            ratio = np.where(sfin, err / np.where(allowed > 0, allowed, np.inf), -1.0)
            w = int(np.argmax(ratio))
            if float(ratio[w]) > worst_ratio:
                worst_ratio = float(ratio[w])
                chk.bound = float(allowed[w])
        unknown = ~sfin & ~same
        chk.checked += int(sfin.sum())
        if sfin.any():
            chk.max_abs_err = max(chk.max_abs_err, float(np.max(err[sfin])))
            rel = err[sfin] / np.where(np.abs(sf[sfin]) > 0, np.abs(sf[sfin]), 1.0)
            rel = np.where(exact_zero(sf[sfin], np.broadcast_to(allowed, sf.shape)[sfin]),
                           0.0, rel)
            chk.max_rel_err = max(chk.max_rel_err, float(np.max(rel)))
        if not ok.all():
            bad = True
            w = int(np.argmax(np.where(ok, -1.0, err)))
            pos = int(idx[w]) if idx is not None else w
            chk.worst = (g.input_names[k], np.unravel_index(pos, np.shape(in_vals[k])),
                         float(ef[w]), float(sf[w]))
        elif unknown.any() and chk.unknown is None:
            w = int(np.argmax(unknown))
            pos = int(idx[w]) if idx is not None else w
            chk.unknown = (g.input_names[k], np.unravel_index(pos, np.shape(in_vals[k])),
                           float(ef[w]), float(sf[w]), int(unknown.sum()))
    chk.status = "mismatch" if bad else ("could not evaluate" if chk.unknown else "ok")
    if notes:
        chk.detail = "; ".join(notes)
    if bad and chk.worst is not None:
        name, where, ev_, sv = chk.worst
        chk.detail = (f"d/d{name}{list(int(i) for i in where)}: engine {ev_:.8g}, symbolic "
                      f"{sv:.8g}" + (f"; {chk.detail}" if chk.detail else ""))
    elif chk.unknown is not None:
        name, where, ev_, sv, n = chk.unknown
        chk.detail = (f"the symbolic derivative is {sv:g} at d/d{name}"
                      f"{list(int(i) for i in where)} (engine {ev_:.8g}; {n} element(s)): "
                      "it could not be evaluated at the recorded inputs, even with mpmath, "
                      "so there is nothing to compare" + (f"; {chk.detail}" if chk.detail
                                                          else ""))
    if not bad and chk.engine_nonfinite:
        chk.detail = chk.engine_nonfinite + (f"; {chk.detail}" if chk.detail else "")
    _forward_into(chk, g, graph, in_vals)
    _glue_into(chk, g, in_vals, bad)
    return chk


def _glue_into(chk, g, in_vals, bad) -> None:
    fault = _glue_fit(g, in_vals)
    if fault is not None:  # the engine's step after this node's rule (glue.py)
        chk.glue = fault
        chk.status = "mismatch"
        if not bad:
            chk.bound = fault.bound
            chk.max_abs_err = max(chk.max_abs_err, fault.err or 0.0)
        chk.detail = f"{fault.what}: {fault.detail}" + (f"; {chk.detail}" if chk.detail
                                                         else "")


def _forward_into(chk, g, graph, in_vals, value=None) -> None:
    """The forward check (forward.py) folded into the node's verdict: a recorded output
    outside its bound makes the node a mismatch whose detail starts with ``forward:``."""
    from .forward import forward_check

    try:
        fc = forward_check(g, graph, in_vals, value)
    except Exception:  # noqa: BLE001  (no verdict on the forward: the backward's stands)
        return
    if fc is None:
        return
    chk.forward = fc
    if not fc.ok:
        was_bad = chk.status == "mismatch"
        chk.status = "mismatch"
        if not was_bad:
            chk.bound = fc.bound
            chk.max_abs_err = max(chk.max_abs_err, fc.err)
        chk.detail = fc.detail + (f"; {chk.detail}" if chk.detail else "")


def _adjoint(g, in_vals, v64, engine_res, rng, tol_for):
    """The adjoint-identity check of a float64 structural node (adjoint.py); None where
    it cannot run (the element-by-element SymPy check runs instead)."""
    from .adjoint import Fallback, adjoint_check

    try:
        return adjoint_check(g, in_vals, v64, engine_res, rng, tol_for)
    except Fallback:
        return None


def _finish_adjoint(chk, g, graph, in_vals, fast):
    res, value = fast
    chk.formula = (f"{g.spec.name}: structural; adjoint identity <u, J v> = <J^T u, v> at the "
                   "recorded inputs (random u, v; J v by a complex-step forward of the "
                   "meaning in float64)")
    if all(r[2] == 0.0 for r in res.values()):  # adjoint.PERMUTATIONS: exact, no bound
        chk.formula = (f"{g.spec.name}: structural, a permutation of the elements; adjoint "
                       "identity exactly: J^T u = J^-1 u (the meaning maps the engine's "
                       "J^T u back onto the random u bit for bit)")
    bad = False
    worst_ratio = -1.0
    for k, (s_e, s_m, allowed, n) in res.items():
        err = abs(s_e - s_m)
        chk.checked += int(n)
        chk.max_abs_err = max(chk.max_abs_err, err)
        chk.max_rel_err = max(chk.max_rel_err, err / abs(s_m) if s_m else (0.0 if not err
                                                                            else np.inf))
        ratio = err / allowed if allowed else (0.0 if not err else np.inf)
        if ratio > worst_ratio:
            worst_ratio = ratio
            chk.bound = allowed
        if not err <= allowed and not bad:
            bad = True
            name = ", ".join(g.input_names[j] for j in k) if isinstance(k, tuple) \
                else g.input_names[k]
            chk.detail = (f"d/d{name}: engine <J^T u, v> = {s_e:.15g}, meaning "
                          f"<u, J v> = {s_m:.15g} (adjoint identity over all {n} elements, "
                          f"random u, v; bound {allowed:.3g})")
    chk.status = "mismatch" if bad else "ok"
    if not bad and chk.engine_nonfinite:
        chk.detail = chk.engine_nonfinite
    _forward_into(chk, g, graph, in_vals, value)
    _glue_into(chk, g, in_vals, bad)
    return chk


def _glue_fit(g, in_vals):
    """The engine's broadcast reduction / cast of this node's raw gradients (recorded by
    graph.node_backward) against the exact float64 sum; a GlueFault or None."""
    from .glue import GlueFault, check_fit

    glue, g.glue = g.glue, None
    if glue is None:
        return None
    raw, fitted = glue
    if isinstance(fitted, Exception):
        return GlueFault(f"broadcast reduction after {g.name}",
                         f"raised {type(fitted).__name__}: {fitted}", g.node)
    shapes, dtypes = [], []
    for i, r in enumerate(g.inputs):
        if r[0] == "scalar" or i >= len(g.needs) or not g.needs[i] or i >= len(in_vals):
            shapes.append(None)
            dtypes.append(None)
            continue
        a = np.asarray(in_vals[i])
        shapes.append(a.shape)
        dtypes.append(a.dtype if a.dtype.kind == "f" else None)
    return check_fit(g, raw, fitted, shapes, dtypes)
