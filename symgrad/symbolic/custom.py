"""Custom ``autograd.Function`` nodes in the verifier.

A Function with a ``sympy`` staticmethod is checked through that meaning, elementwise
(one expression per tensor argument, non-tensor arguments unchanged, as
``symgrad.autograd.custom_function`` documents). Without one, its own ``forward`` is
traced on symbolic tensors (``symgrad.symbolic.trace``): that is its exact meaning, used
by exact mode's replay and by the local check (the symbolic Jacobian at the recorded
inputs, sampled on large inputs). A forward that cannot be traced (a value taken out of a
tensor into Python control flow, an unsupported call) is checked by central finite
differences of its forward, with a note naming the line that stopped the trace. A Function
that declares ``surrogate_gradient = True`` (a straight-through estimator: its backward is
not the forward's derivative on purpose) is not compared with the forward's derivative.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..backends.sympy_backend import obj
from .graph import (  # noqa: F401  (defined in graph.py, which builds the nodes)
    _rebuild_custom,
    custom_backward,
    fill_custom,
    is_custom,
)

__all__ = ["fill_custom", "custom_meaning", "custom_local", "is_custom", "replayable",
           "trace_state", "TRACE_LIMIT"]

#: Largest number of tensor-input elements of a custom Function whose forward the local
#: check traces on symbols (above it: finite differences, noted).
TRACE_LIMIT = 20_000
#: Local check of a traced Function: every element up to this many per input, else a
#: seeded sample of ``sample`` (default ``TRACE_SAMPLE``) elements.
TRACE_ALL = 256
TRACE_SAMPLE = 64
#: Rounding steps assumed for a traced forward's backward (plus the terms summed).
TRACE_STEPS = 16


def _sympy_of(cls):
    """The Function's ``sympy`` meaning, if it has one (a torch Function usually has none)."""
    return getattr(cls, "sympy", None)


def _positions(g):
    return tuple(j for j, r in enumerate(g.inputs) if r[0] != "scalar")


def trace_state(g, graph) -> dict:
    """Trace ``g``'s forward once at its recorded inputs (cached on ``g.trace``).

    ``{"status": "ok" | "failed" | "surrogate", "note": str, ...}``; when ok also the
    symbols per differentiable argument, their values, the evaluator and the outputs."""
    st = getattr(g, "trace", None)
    if st is not None:
        return st
    import mpmath

    from ..backends.sympy_backend import SympyBackend
    from . import _engine as E
    from .trace import TraceError, surrogate_of, trace_forward

    cls = g.custom
    sur = surrogate_of(cls)
    st = {"status": "failed", "note": ""}
    pos = _positions(g)
    if sur:
        st = {"status": "surrogate",
              "note": f"{cls.__name__} declares a {sur} (surrogate_gradient): its backward "
                      "is not compared with the forward's derivative"}
    else:
        in_vals = graph.node_inputs(g)
        size = sum(int(np.size(in_vals[j])) for j in pos)
        if size > TRACE_LIMIT:
            st["note"] = (f"{cls.__name__}.forward was not traced ({size} input elements > "
                          f"TRACE_LIMIT {TRACE_LIMIT}); checked by central finite "
                          "differences")
        else:
            engine, name = E.pick_engine("auto")
            values, args, syms = {}, [], {}
            for j, v in enumerate(in_vals):
                a = np.asarray(v) if j in pos else None
                if a is not None and a.dtype.kind == "f" and g.needs[j]:
                    arr = np.empty(a.shape, dtype=object)
                    for i, idx in enumerate(np.ndindex(*a.shape)):
                        s = E.make_symbol(name, f"_x{j}_{i}")
                        arr[idx] = s
                        values[s] = mpmath.mpf(float(a[idx]))
                    args.append(arr)
                    syms[j] = arr
                else:
                    args.append(a if a is not None else v)
            ev = E.Evaluator(values)
            decided: list = []
            try:
                outs = trace_forward(cls, args, SympyBackend(engine, valuation=ev), pos,
                                     decided)
            except TraceError as exc:
                st["note"] = exc.note() + "; checked by central finite differences"
            else:
                touts = [o for o in outs if o is not None]
                want = [tuple(s) for s, d in zip(g.out_shapes, g.out_dtypes)]
                if [tuple(o.shape) for o in touts] != want[:len(touts)]:
                    st["note"] = (f"{cls.__name__}.forward traced on symbols gives shapes "
                                  f"{[tuple(o.shape) for o in touts]}, recorded {want}; "
                                  "checked by central finite differences")
                else:
                    note = ""
                    if decided:
                        note = (f"{cls.__name__}.forward traced on symbols; decided at the "
                                f"recorded values, as branches are: {', '.join(decided)}; "
                                "the arithmetic is symbolic")
                    st = {"status": "ok", "note": note, "syms": syms, "ev": ev,
                          "outs": touts, "engine_name": name, "decided": tuple(decided)}
    g.trace = st
    if st["note"]:
        g.note = st["note"]
    return st


def replayable(g, graph) -> bool:
    """Whether exact mode can replay custom node ``g`` (a ``sympy`` meaning or a trace)."""
    if _sympy_of(g.custom) is not None:
        return True
    return trace_state(g, graph)["status"] == "ok"


def custom_meaning(g, engine, arrays, be=None):
    """The outputs of a custom Function on object arrays: through its ``sympy``, else its
    forward traced on symbolic tensors (on ``be``, whose valuation decides branches)."""
    cls = g.custom
    if _sympy_of(cls) is None:
        from ..backends.sympy_backend import SympyBackend
        from .trace import TraceError, surrogate_of, trace_forward

        if surrogate_of(cls):
            raise NotImplementedError(f"{g.name}: declares a surrogate gradient")
        if be is not None and getattr(be, "valuation", None) is not None:
            # an input no gradient flows through is a constant: its recorded numbers
            # (``.item()`` of it is a number, as in the forward that ran)
            arrays = [be.as_constant(a) if j in _positions(g) and not g.needs[j]
                      and isinstance(a, np.ndarray) and a.dtype == object else a
                      for j, a in enumerate(arrays)]
        try:
            outs = trace_forward(cls, arrays, be if be is not None else SympyBackend(engine),
                                 _positions(g))
        except TraceError as exc:
            raise NotImplementedError(f"{g.name}: {exc.note()}") from exc
        return tuple(o for o in outs if o is not None)
    pos = set(_positions(g))
    tensors = [obj(a) for j, a in enumerate(arrays) if j in pos]
    shape = np.broadcast_shapes(*[t.shape for t in tensors]) if tensors else ()
    tensors = [np.broadcast_to(t, shape) for t in tensors]
    n_out = max(1, len(g.out_shapes))
    outs = [np.empty(shape, dtype=object) for _ in range(n_out)]
    to_engine = getattr(engine, "sympify", None) if engine.__name__ == "symengine" else None
    for idx in np.ndindex(*shape):
        it = iter(t[idx] for t in tensors)
        args = [next(it) if j in pos else a for j, a in enumerate(arrays)]
        r = _sympy_of(cls)(*args)
        rs = r if isinstance(r, tuple) else (r,)
        for k in range(n_out):
            outs[k][idx] = to_engine(rs[k]) if to_engine is not None else rs[k]
    return tuple(outs)


_TEMPLATES: dict = {}


def custom_local(g, graph, in_vals, v64, engine, engine_name, rng, sample):
    """{arg: (J^T v values, None)}, formula, note — symbolic if possible, else by FD."""
    cls = g.custom
    pos = _positions(g)
    diff_pos = [j for j in pos if g.needs[j] and np.asarray(in_vals[j]).dtype.kind == "f"]
    if _sympy_of(cls) is not None:
        import sympy

        from ._common import lambdify_numpy

        xs = sympy.symbols(f"x0:{len(in_vals)}", real=True)
        args = [xs[j] if j in pos else in_vals[j] for j in range(len(in_vals))]
        r = _sympy_of(cls)(*args)
        rs = list(r) if isinstance(r, tuple) else [r]
        res = {}
        numargs = [np.asarray(in_vals[j], dtype=np.float64) if j in pos else 0.0
                   for j in range(len(in_vals))]
        shape = np.broadcast_shapes(*[np.shape(in_vals[j]) for j in pos])
        formula = f"{cls.__name__}.sympy: result = {sympy.sstr(rs[0])}"
        for j in diff_pos:
            total = np.zeros(shape)
            mag = np.zeros(shape)
            for k, f in enumerate(rs):
                if k >= len(v64) or v64[k] is None:
                    continue
                # full-precision numbers in the generated code (not 15 digits)
                d = lambdify_numpy(xs, sympy.diff(sympy.sympify(f), xs[j]),
                                   {"DiracDelta": lambda x: 0 * x})
                with np.errstate(all="ignore"):
                    term = v64[k] * np.broadcast_to(
                        np.asarray(d(*numargs), dtype=np.float64), shape)
                    total = total + term
                    mag = mag + np.abs(term)
            from ._common import _sum_to

            xs_shape = np.shape(in_vals[j])
            terms = 4 * len(rs) + int(np.prod(shape)) // max(int(np.prod(xs_shape)), 1)
            res[j] = (_sum_to(total, xs_shape), None, (_sum_to(mag, xs_shape), terms, None))
        return res, formula, None
    st = trace_state(g, graph)
    if st["status"] == "surrogate":
        return None, f"{cls.__name__}: declared surrogate gradient", st["note"]
    if st["status"] == "ok":
        return _traced_local(g, st, in_vals, v64, diff_pos, rng, sample)
    # no SymPy meaning: central differences of <v, forward(x)> at sampled elements
    from ..backends.numpy_backend import NumpyBackend

    be = NumpyBackend()
    res = {}
    base = [np.asarray(a, dtype=np.float64) if j in pos else a for j, a in enumerate(in_vals)]
    for j in diff_pos:
        x = base[j]
        n = x.size
        k = min(n, sample or 16)
        idx = np.arange(n) if k == n else np.sort(rng.choice(n, size=k, replace=False))
        vals = np.empty(len(idx))
        for m, i in enumerate(idx):
            x0 = float(x.reshape(-1)[i])
            h = 1e-6 * max(1.0, abs(x0))
            fs = []
            for sgn in (1.0, -1.0):
                xp = x.copy()
                xp.reshape(-1)[i] = x0 + sgn * h
                args = [xp if jj == j else base[jj] for jj in range(len(base))]
                outs = g.forward_numeric(be, args)
                fs.append(sum(float(np.sum(np.asarray(o, dtype=np.float64) * v))
                              for o, v in zip(outs, v64) if v is not None))
            vals[m] = (fs[0] - fs[1]) / (2 * h)
        res[j] = (vals, None if k == n else idx)
    note = st["note"] or (f"{cls.__name__}: no sympy staticmethod, checked by central finite "
                          "differences")
    return res, f"{cls.__name__}: finite differences (no SymPy meaning)", note


def _traced_local(g, st, in_vals, v64, diff_pos, rng, sample):
    """J^T v of a traced forward at the recorded inputs: SymPy's derivatives evaluated in
    high precision (every element of a small input, a seeded sample of a large one)."""
    from . import _engine as E

    name, ev, outs = st["engine_name"], st["ev"], st["outs"]
    where: dict = defaultdict(list)  # symbol -> output elements holding it
    for k, o in enumerate(outs):
        if k >= len(v64) or v64[k] is None:
            continue
        for idx, e in np.ndenumerate(o):
            for s in E.free_symbols(e):
                where[s].append((k, idx))
    res = {}
    zero = []
    for j in diff_pos:
        X = st["syms"].get(j)
        if X is None:
            continue
        flat = X.reshape(-1)
        n = flat.size
        m_ = n if n <= TRACE_ALL else min(n, sample or TRACE_SAMPLE)
        idx = None if m_ == n else np.sort(rng.choice(n, size=m_, replace=False))
        items = range(n) if idx is None else idx
        vals, mag, steps = np.empty(m_), np.empty(m_), np.empty(m_)
        any_term = False
        for m, i in enumerate(items):
            s = flat[int(i)]
            tot = mag_ = 0.0
            terms = where.get(s, ())
            for k, oi in terms:
                d = E.diff(outs[k][oi], s, name)
                try:
                    dv = float(ev(d))
                except Exception:  # noqa: BLE001 - no number: compared as non-finite
                    dv = float("nan")
                if dv != 0.0:
                    any_term = True
                t = float(np.broadcast_to(v64[k], outs[k].shape)[oi]) * dv
                tot += t
                mag_ += abs(t)
            vals[m], mag[m], steps[m] = tot, mag_, TRACE_STEPS + len(terms)
        if not any_term:
            zero.append(g.input_names[j] if j < len(g.input_names) else f"arg{j}")
        res[j] = (vals, idx, (mag, steps, None))
    cls = g.custom
    first = next((o.reshape(-1)[0] for o in outs if o.size), None)
    formula = f"{cls.__name__}.forward traced on symbols"
    if first is not None:
        text = str(first)
        formula += f": result[0] = {text if len(text) <= 160 else text[:157] + '...'}"
    note = None
    if zero:
        note = (f"the forward's derivative w.r.t. {', '.join(repr(z) for z in zero)} is 0 at "
                "these inputs (piecewise constant): if the backward is a straight-through "
                "estimator on purpose, declare `surrogate_gradient = True` on the Function")
    return res, formula, note


# -- the Inspector's formula ------------------------------------------------------------------
#: Largest number of tensor-input elements whose forward the Inspector traces for a
#: custom Function node's formula; LaTeX longer than FORMULA_CHARS is left out.
FORMULA_LIMIT = 512
FORMULA_CHARS = 3000
FORMULA_ELEMENTS = 3


def _node_args(node, name_of):
    """``(cls, values, positions, needs, names)`` of a custom Function node (symgrad or
    torch), per forward argument: an array (known values), ``("shape", s)`` (a tensor whose
    value the node does not keep) or the non-tensor value; None when unknown."""
    from .graph import deref
    from .trace import forward_arg_names

    cls = getattr(type(node), "_forward_cls", None)
    if cls is None:
        return None
    edges = list(node.next_functions)
    names: list = []
    if hasattr(node, "_tensor_positions"):  # symgrad
        positions = tuple(node._tensor_positions)
        vals = []
        for j, r in enumerate(getattr(node, "_input_refs", ())):
            v = deref(r)
            if j in positions:
                if v is None or not hasattr(v, "_data"):
                    return None
                names.append(name_of(v))
                v = np.asarray(v.detach().numpy())
            else:
                names.append(None)
            vals.append(v)
        needs = tuple(j in positions and edges[positions.index(j)][0] is not None
                      for j in range(len(vals)))
    else:  # torch: the capture's arguments, else the edges when every argument is a tensor
        from .torch_graph import _captured

        needs = tuple(bool(b) for b in node.needs_input_grad)
        cap = _captured(node)
        if cap is not None and len(cap[1]) == len(needs):
            positions = tuple(j for j, s in enumerate(cap[1]) if s[0] == "tensor")
            vals = []
            for s in cap[1]:
                if s[0] == "tensor":
                    vals.append(np.asarray(s[1]))
                    names.append(name_of(s[2]))
                else:
                    vals.append(s[1] if s[0] == "value" else None)
                    names.append(None)
        elif len(edges) == len(needs):
            positions = tuple(range(len(needs)))
            vals = []
            for nxt, nr in edges:
                if nxt is None:
                    return None
                if type(nxt).__name__ == "AccumulateGrad":
                    vals.append(np.asarray(nxt.variable.detach().cpu().numpy()))
                    names.append(name_of(nxt.variable))
                else:
                    meta = list(getattr(nxt, "_input_metadata", ()) or ())
                    if nr >= len(meta):
                        return None
                    vals.append(("shape", tuple(int(s) for s in meta[nr].shape)))
                    names.append(None)
        else:
            return None
    params = forward_arg_names(cls, len(vals))
    names = [n or p for n, p in zip(names, params)]
    return cls, vals, positions, needs, names


def _letters(n: int) -> str:
    return "".join(chr(65 + int(c)) for c in str(n))


def traced_latex(node, name_of, out_name: str, latex_name) -> tuple:
    """``(formula, derivative)`` LaTeX of a custom Function node (symgrad or torch) without
    a ``sympy`` method: its forward traced on symbols named after its inputs (``x_{0,1}``),
    branches decided at the recorded values; ``(None, None)`` where it cannot be traced.
    ``name_of(tensor)``: the display name of an input tensor, or None."""
    import mpmath
    import sympy

    from ..backends.sympy_backend import SympyBackend
    from . import _engine as E
    from .trace import surrogate_of, trace_forward

    got = _node_args(node, name_of)
    if got is None:
        return None, None
    cls, vals, pos, needs, names = got
    if _sympy_of(cls) is not None:
        return None, None
    size = sum(int(np.prod(v[1] if isinstance(v, tuple) else np.shape(v))) for j, v in
               enumerate(vals) if j in pos)
    if size > FORMULA_LIMIT:
        return None, None
    subs: dict = {}
    values: dict = {}
    args, syms = [], {}
    for j, v in enumerate(vals):
        if j not in pos:
            args.append(v)
            continue
        shape = v[1] if isinstance(v, tuple) else np.shape(v)
        if not isinstance(v, tuple) and (np.asarray(v).dtype.kind != "f" or not needs[j]):
            args.append(np.asarray(v))  # integers, booleans, constants: their numbers
            continue
        base = latex_name(names[j])
        arr = np.empty(shape, dtype=object)
        for i, idx in enumerate(np.ndindex(*shape)):
            ph = f"XSYMQ{_letters(j)}Z{_letters(i)}Q"
            s = sympy.Symbol(ph, real=True)
            arr[idx] = s
            subs[ph] = base if not shape else "{" + base + "}_{" + ",".join(
                str(k) for k in idx) + "}"
            if not isinstance(v, tuple):
                values[s] = mpmath.mpf(float(np.asarray(v)[idx]))
        args.append(arr)
        syms[j] = arr
    be = SympyBackend(sympy, valuation=E.Evaluator(values) if values else None)
    try:
        outs = trace_forward(cls, args, be, pos)
    except Exception:  # noqa: BLE001 - no formula is better than an error (TraceError too)
        return None, None
    outs = [o for o in outs if o is not None]
    if not outs:
        return None, None

    def tex(e) -> str:
        out = sympy.latex(sympy.sympify(e))
        for ph in sorted(subs, key=len, reverse=True):
            out = out.replace(ph, subs[ph])
        return out

    out_tex = latex_name(out_name)
    lines, first = [], None
    for k, o in enumerate(outs):
        name = out_tex if k == 0 else f"{out_tex}^{{({k})}}"
        for n, (idx, e) in enumerate(np.ndenumerate(o)):
            if n == FORMULA_ELEMENTS:
                lines.append(r"\ldots")
                break
            lhs = name if not o.shape else "{" + name + "}_{" + ",".join(
                str(i) for i in idx) + "}"
            lines.append(f"{lhs} = {tex(e)}")
            if first is None:
                first = (lhs, e)
    formula = r",\quad ".join(lines)
    if surrogate_of(cls):
        formula += r"\quad\text{(declared surrogate gradient)}"
    if len(formula) > FORMULA_CHARS:
        formula = lines[0] if len(lines[0]) <= FORMULA_CHARS else None
    parts = []
    if first is not None:
        lhs, e = first
        free = getattr(sympy.sympify(e), "free_symbols", set())
        for j, arr in syms.items():
            if not needs[j]:
                continue
            s = next((s for s in arr.reshape(-1) if s in free), None)
            if s is None:
                continue
            d = sympy.diff(sympy.sympify(e), s)
            parts.append(rf"\frac{{\partial {lhs}}}{{\partial {subs[s.name]}}} = {tex(d)}")
    derivative = r",\quad ".join(parts) or None
    if derivative is not None and len(derivative) > FORMULA_CHARS:
        derivative = None
    return formula, derivative
