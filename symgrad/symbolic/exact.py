"""Exact mode: the graph replayed symbolically and differentiated in reverse order.

Every node is replayed on the SymPy backend with its inputs' symbols. Each output
element that is not already a symbol or a number gets a fresh intermediate symbol
defined by its expression (so the DAG is shared, never expanded: common
subexpressions are eliminated by construction). The gradient of sum(gradient * root)
then follows by the chain rule over these definitions, with every local partial
derivative taken by SymPy (or symengine) from the op's own SymPy meaning, and
evaluated with mpmath at ``DPS`` digits. Nothing here reads the engine's backward.
"""

from __future__ import annotations

import time
from collections import defaultdict

import mpmath
import numpy as np

from ..backends.sympy_backend import SympyBackend, obj
from . import _engine as E
from ._common import TimeoutExpired  # re-exported: defined in _common.py
from .fused import CLOSED_FORMS, closed_form

__all__ = ["SymbolicGraph", "TimeoutExpired"]


def elementwise(spec_sympy, engine, arrays, params):
    """Apply a scalar SymPy meaning elementwise with broadcasting."""
    fn = np.frompyfunc(lambda *xs: spec_sympy(engine, *xs, **params), len(arrays), 1)
    return obj(fn(*[a if not isinstance(a, np.ndarray) else obj(a) for a in arrays]))


class SymbolicGraph:
    """The symbolic replay of a :class:`Graph`, with values of every symbol."""

    def __init__(self, graph, engine, engine_name: str, deadline: float | None = None,
                 progress=None) -> None:
        self.graph = graph
        self.sp = engine
        self.engine_name = engine_name
        self.deadline = deadline
        self.progress = progress
        self.values: dict = {}
        self.defs: list = []  # (symbol, expression) in creation order
        self.def_index: dict = {}
        self.node_out: dict = {}  # (j, nr) -> object array of atoms
        self.sym_map: dict = {}  # symbol name -> SymPy real symbol (for display)
        self.tex_map: dict = {}  # SymPy symbol -> LaTeX
        self._partials: dict = {}
        self.opaque: dict = {}  # non-finite Python scalar -> its opaque symbol
        self._add_cache: dict = {}
        self.magnitude: dict = {}
        self.steps: dict = {}
        self._n = 0
        self.ev = E.Evaluator(self.values)
        #: symbol -> mpf of the value the engine recorded for it: branches (clamp, relu,
        #: abs, max ties, argmax) are decided there, not at the high-precision value
        self.recorded: dict = {}
        self.dv = E.DecisionEvaluator(self.recorded, self.values)
        self.be = SympyBackend(engine, valuation=self.dv, lazy=True)  # no cycle via self
        self.dps = E.DPS
        #: softmax / log_softmax / logsumexp with closed-form partials (fused.py)
        self.closed_forms = True

    # -- construction --------------------------------------------------------------------
    def _valuation(self, e):
        return self.ev(e)

    def check_time(self) -> None:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise TimeoutExpired

    def _leaf_adjoints(self, adj, wanted) -> dict:
        """{leaf index: object array of its adjoints (0 where none arrived)} for each leaf
        ``wanted(leaf)`` accepts, after a reverse sweep filled ``adj``."""
        out = {}
        for leaf in self.graph.leaves:
            if wanted(leaf):
                arr = np.empty(leaf.shape, dtype=object)
                for idx, s in np.ndenumerate(leaf.symbols):
                    arr[idx] = adj.get(s, mpmath.mpf(0))
                out[leaf.index] = arr
        return out

    def _reverse_sweep(self, adj) -> None:
        """Push adjoints from the last definition back to the leaves, in place, checking the
        deadline every 256 definitions so a timeout (and Ctrl-C) is honoured."""
        for k in range(len(self.defs) - 1, -1, -1):
            self.check_time()  # cheap next to a definition's partials
            a = adj.pop(self.defs[k][0], None)
            if not a:
                continue
            for f, p in self.partials_of(k).items():
                adj[f] += a * self.ev(p)

    def make_leaf_symbols(self) -> None:
        import sympy

        from .graph import element_names

        for leaf in self.graph.leaves:
            if not leaf.is_float:
                leaf.symbols = obj(leaf.value.astype(object) if leaf.value.dtype.kind != "b"
                                   else leaf.value)
                continue
            names, texes = element_names(leaf)
            syms = np.empty(len(names), dtype=object)
            flat = leaf.value.reshape(-1)
            for i, (n, t) in enumerate(zip(names, texes)):
                s = E.make_symbol(self.engine_name, n)
                syms[i] = s
                self.values[s] = mpmath.mpf(float(flat[i]))
                ss = sympy.Symbol(n, real=True)
                self.sym_map[n] = ss
                self.tex_map[ss] = t
            leaf.symbols = syms.reshape(leaf.shape)

    def _atomize(self, e, recorded=None):
        if E.is_atom(e):
            if isinstance(e, (np.floating, np.integer)):
                return e.item()
            return e
        s = E.make_symbol(self.engine_name, f"_v{self._n}")
        self._n += 1
        self.def_index[s] = len(self.defs)
        self.defs.append((s, e))
        self.values[s] = self.ev(e)
        if recorded is not None:
            self.recorded[s] = mpmath.mpf(recorded)
        return s

    def _recorded_outputs(self, g) -> list:
        """The engine's recorded value of each output of ``g`` (None where unknown)."""
        out = []
        for nr in range(len(g.out_shapes)):
            try:
                v = np.asarray(self.graph.value_of(("node", g.index, nr)))
            except Exception:  # no value: decisions fall back to the exact value
                v = None
            if v is not None and (v.dtype.kind not in "fiub"
                                  or v.shape != tuple(g.out_shapes[nr])):
                v = None
            out.append(v)
        return out

    def input_arrays(self, g) -> list:
        arrays = []
        for r in g.inputs:
            if r[0] == "leaf":
                arrays.append(self.graph.leaves[r[1]].symbols)
            elif r[0] == "node":
                arrays.append(self.node_out[(r[1], r[2])])
            else:
                arrays.append(self._scalar(r[1]))
        return arrays

    def _scalar(self, v):
        """A Python scalar input as the replay uses it: itself, or for nan/inf an opaque
        symbol holding that value (SymPy folds ``x*nan`` to ``nan``, whose derivative is
        0; the symbol keeps d(x*c)/dx = c, which evaluates to nan as the engine's)."""
        if not isinstance(v, (float, np.floating)) or np.isfinite(v):
            return v
        s = self.opaque.get(float(v) if v == v else "nan")
        if s is None:
            s = E.make_symbol(self.engine_name, f"_c{len(self.opaque)}")
            self.values[s] = mpmath.mpf(float(v))
            self.opaque[float(v) if v == v else "nan"] = s
        return s

    def replay_node(self, g) -> None:
        from ..ops.spec import STRUCTURAL

        arrays = self.input_arrays(g)
        dt = np.dtype(g.out_dtypes[0]) if g.out_dtypes else np.dtype(np.float64)
        self.dv.round = np.float32 if dt.kind == "f" and dt.itemsize <= 4 else None
        if g.custom is not None:
            from .custom import custom_meaning

            outs = custom_meaning(g, self.sp, arrays, be=self.be)
        elif g.spec is None:
            raise NotImplementedError(f"{g.name}: no SymPy meaning known for this node")
        elif callable(g.spec.sympy):
            deciding = E.DecidingEngine(self.sp, self.dv,
                                        g.spec.name in E.SPLIT_TIES)
            outs = (elementwise(g.spec.sympy, deciding, arrays, g.params),)
        elif g.spec.name in CLOSED_FORMS and self.closed_forms and \
                (fused := closed_form(self, g, arrays)) is not None:
            self.dv.round = None
            self.node_out[(g.index, 0)] = fused
            return
        elif g.spec.sympy == STRUCTURAL:
            self.be.ties_first = "indices" in g.spec.outputs  # value-selecting reductions
            outs = g.forward_numeric(self.be, arrays)
        else:
            raise NotImplementedError(f"{g.name}: op {g.spec.name!r} has no SymPy meaning")
        self.dv.round = None
        recorded = self._recorded_outputs(g)
        for nr, o in enumerate(outs):
            o = obj(o)
            out = np.empty(o.shape, dtype=object)
            rec = recorded[nr] if nr < len(recorded) else None
            if rec is not None and rec.shape != o.shape:
                rec = None
            const_ok = rec is not None and rec.dtype.kind == "f"
            for n, (idx, e) in enumerate(np.ndenumerate(o)):
                if n % 16 == 15:  # a fused op's element can cost milliseconds
                    self.check_time()
                if const_ok and E.is_atom(e) and not E.is_symbol(e):
                    # a value computed from Python scalars only (tanh of a clamp bound):
                    # no gradient flows through it, and the engine's backward reads the
                    # value it recorded, so the replay does too (like a constant input);
                    # the exact constant differs by rounding and would flip ties
                    r = float(rec[idx])
                    if np.isfinite(r):
                        out[idx] = r
                        continue
                out[idx] = self._atomize(e, None if rec is None else float(rec[idx]))
            self.node_out[(g.index, nr)] = out

    def build(self) -> None:
        self.make_leaf_symbols()
        for g in self.graph.nodes:
            self.check_time()
            self.replay_node(g)
            if self.progress is not None:
                self.progress.update(1)

    def root_array(self):
        r = self.graph.root
        if r[0] == "leaf":
            return self.graph.leaves[r[1]].symbols
        return self.node_out[(r[1], r[2])]

    def partials_of(self, k: int) -> dict:
        p = self._partials.get(k)
        if p is None:
            p = self._partials[k] = E.partials(self.defs[k][1], self.engine_name)
        return p

    # -- the gradient ----------------------------------------------------------------------
    def gradient(self, gradient: np.ndarray) -> dict:
        """Numeric adjoints (mpmath) of every leaf element: {leaf index: object array}.

        Also fills ``self.magnitude`` and ``self.steps`` ({leaf index: float array}): the
        sum over paths of |cotangent| x |partials| (the magnitude of the terms that make
        each adjoint, partials' sums taken term by term, see ``_engine.abs_value``) and
        the rounding steps on the longest path (two per multiply-add, plus one per
        contribution summed at every fan-in): what the rounding bound scales with."""
        with mpmath.workdps(self.dps):
            adj: dict = defaultdict(lambda: mpmath.mpf(0))
            mag: dict = defaultdict(lambda: mpmath.mpf(0))
            steps: dict = defaultdict(int)
            count: dict = defaultdict(int)
            root = self.root_array()
            gflat = np.broadcast_to(np.asarray(gradient, dtype=np.float64), root.shape)
            for idx, a in np.ndenumerate(root):
                if E.is_symbol(a):
                    adj[a] += mpmath.mpf(float(gflat[idx]))
                    mag[a] += abs(mpmath.mpf(float(gflat[idx])))
                    count[a] += 1
            for k in range(len(self.defs) - 1, -1, -1):
                self.check_time()
                s = self.defs[k][0]
                a = adj.pop(s, None)
                m = mag.pop(s, None)
                n = steps.pop(s, 0) + count.pop(s, 0)
                if not m:
                    continue
                for f, p in self.partials_of(k).items():
                    pv = self.ev(p)
                    adj[f] += a * pv
                    mag[f] += m * (abs(pv) if E.is_atom(p) or not self._has_add(p)
                                   else E.abs_value(self.ev, p))
                    steps[f] = max(steps[f], n + 2)
                    count[f] += 1
            wanted = lambda leaf: leaf.requires_grad and leaf.is_float  # noqa: E731
            out = self._leaf_adjoints(adj, wanted)
            self.magnitude = {i: np.array([float(v) for v in arr.reshape(-1)]).reshape(
                arr.shape) for i, arr in self._leaf_adjoints(mag, wanted).items()}
            self.steps = {}
            for leaf in self.graph.leaves:
                if wanted(leaf):
                    st = np.empty(leaf.shape, dtype=np.float64)
                    for idx, s in np.ndenumerate(leaf.symbols):
                        st[idx] = steps.get(s, 0) + count.get(s, 0)
                    self.steps[leaf.index] = st
            return out

    def output_rounding(self, gradient: np.ndarray, forward: bool = True) -> dict:
        """The bound's ``D`` term per leaf ({leaf index: float array}): a backward that
        reads its op's recorded output ``y`` (sigmoid, tanh, exp) computes the partial
        ``p`` from a ``y`` rounded by ``eps |y|``, which moves it by ``|y| |dp/dy|`` =
        ``|y| |p'/p|`` (``p'`` = d p / d x) per unit of eps; carried to the leaves by the
        absolute partials. Taken for definitions of one symbol (elementwise ops); run only
        when a leaf is outside the bound without it. ``forward``: the partial's input also
        carries its forward error (``_forward_error``); verify takes it for float64 graphs
        only, as a float32 graph that needs it is re-run in float64 and reported
        ``imprecise`` (the user is told precision was lost rather than given a wide bound).
        """
        with mpmath.workdps(self.dps):
            fwd = self._forward_error() if forward else {}
            adj: dict = defaultdict(lambda: mpmath.mpf(0))
            dm: dict = defaultdict(lambda: mpmath.mpf(0))
            root = self.root_array()
            gflat = np.broadcast_to(np.asarray(gradient, dtype=np.float64), root.shape)
            for idx, a in np.ndenumerate(root):
                if E.is_symbol(a):
                    adj[a] += mpmath.mpf(float(gflat[idx]))
            for k in range(len(self.defs) - 1, -1, -1):
                self.check_time()
                s, expr = self.defs[k]
                a = adj.pop(s, None)
                d = dm.pop(s, mpmath.mpf(0))
                if not a and not d:
                    continue
                parts = self.partials_of(k)
                for f, p in parts.items():
                    pv = self.ev(p)
                    adj[f] += a * pv
                    dm[f] += d * abs(pv)
                    if len(parts) == 1 and a and pv != 0 and not E.is_atom(p):
                        try:
                            p2 = self.ev(E.diff(p, f, self.engine_name))
                            y = self.values.get(s, mpmath.mpf(0))
                            # y rounded by eps |y|, and the input f computed with the
                            # forward error fwd[f]: the partial moves by |p2| per unit
                            extra = abs(a) * abs(p2) * (abs(y / pv) + fwd.get(f, 0))
                            if mpmath.isfinite(extra):
                                dm[f] += extra
                        except (ValueError, TypeError, ZeroDivisionError):
                            pass
                    if fwd and a and len(parts) > 1:
                        extra = self._read_error(p, fwd)
                        if extra:
                            dm[f] += abs(a) * extra
            wanted = lambda leaf: leaf.requires_grad and leaf.is_float  # noqa: E731
            return {i: np.array([float(v) for v in arr.reshape(-1)]).reshape(arr.shape)
                    for i, arr in self._leaf_adjoints(dm, wanted).items()}

    def _read_error(self, p, fwd):
        """How far a partial ``p`` of a definition of several symbols moves when the
        intermediates it reads carry their forward errors: ``sum_g |dp/dg| fwd[g]``
        (``d(c t)/dt = c`` is the recorded ``c``, off by ``fwd[c]``)."""
        if E.is_symbol(p):
            return fwd.get(p, 0)
        if E.is_atom(p):
            return 0
        total = mpmath.mpf(0)
        for g in E.free_symbols(p):
            fg = fwd.get(g)
            if not fg:
                continue
            try:
                v = abs(self.ev(E.diff(p, g, self.engine_name))) * fg
            except (ValueError, TypeError, ZeroDivisionError):
                continue
            if mpmath.isfinite(v):
                total += v
        return total

    def _forward_error(self) -> dict:
        """First-order forward error of each intermediate, in units of eps: its own
        rounding |y| plus its inputs' errors carried by |partial|, and for a sum the
        rounding of its terms (sum of |term|: ``x - logsumexp(x)`` near 0 is off by
        eps (|x| + |logsumexp|), not eps |y|). Leaves are exact (the replay is evaluated
        at the recorded leaf values). A backward evaluates its partial at a recorded
        input that is off by this much (issue 18: exp(40 exp(u) - 40) in float64 is off
        by ~3600 eps, so its partial is too)."""
        fwd: dict = {}
        for k, (s, expr) in enumerate(self.defs):
            self.check_time()
            parts = self.partials_of(k)
            tot = abs(self.values.get(s, mpmath.mpf(0)))
            for f, p in parts.items():
                ff = fwd.get(f)
                if not ff:
                    continue
                try:
                    tot += abs(self.ev(p)) * ff
                except (ValueError, TypeError, ZeroDivisionError):
                    continue
            if type(expr).__name__ == "Add":  # the rounding of a sum's terms
                for t in expr.args:
                    try:
                        tot += abs(self.ev(t))
                    except (ValueError, TypeError, ZeroDivisionError):
                        continue
            fwd[s] = tot if mpmath.isfinite(tot) else mpmath.mpf(0)
        return fwd

    def _has_add(self, p) -> bool:
        key = id(p)
        hit = self._add_cache.get(key)
        if hit is None:
            hit = self._add_cache[key] = (p, _has_add(p))
        return hit[1]

    def symbolic_adjoints(self, gradient: np.ndarray, want) -> dict:
        """Adjoint expressions of the symbols in ``want`` (in terms of intermediates)."""
        contrib: dict = defaultdict(list)
        root = self.root_array()
        gflat = np.broadcast_to(np.asarray(gradient, dtype=np.float64), root.shape)
        for idx, a in np.ndenumerate(root):
            if E.is_symbol(a):
                contrib[a].append(_num(self.sp, float(gflat[idx])))
        for k in range(len(self.defs) - 1, -1, -1):
            s, _ = self.defs[k]
            terms = contrib.pop(s, None)
            if not terms:
                continue
            a = terms[0] if len(terms) == 1 else self.sp.Add(*terms)
            for f, p in self.partials_of(k).items():
                contrib[f].append(a * p)
        return {s: (self.sp.Add(*contrib[s]) if len(contrib.get(s, ())) > 1
                    else (contrib[s][0] if contrib.get(s) else 0)) for s in want}

    def expand_intermediates(self, expr, limit: int = 4000):
        """Substitute intermediate definitions so ``expr`` is in leaf symbols only."""
        need = {s for s in E.free_symbols(expr) if s in self.def_index}
        if not need:
            return expr
        full: dict = {}
        todo = sorted(need, key=lambda s: self.def_index[s])
        stack = list(todo)
        closure = set()
        while stack:
            s = stack.pop()
            if s in closure:
                continue
            closure.add(s)
            for f in E.free_symbols(self.defs[self.def_index[s]][1]):
                if f in self.def_index and f not in closure:
                    stack.append(f)
        if len(closure) > limit:
            raise ValueError("symbolic gradient too large to expand")
        for s in sorted(closure, key=lambda s: self.def_index[s]):
            e = self.defs[self.def_index[s]][1]
            sub = {f: full[f] for f in E.free_symbols(e) if f in full}
            full[s] = e.xreplace(sub) if sub else e
        return expr.xreplace({s: full[s] for s in need})

    def hvp(self, gradient: np.ndarray, us: dict) -> dict:
        """Hessian-vector products: reverse mode over the forward + adjoint definitions."""
        sp = self.sp
        contrib: dict = defaultdict(list)
        root = self.root_array()
        gflat = np.broadcast_to(np.asarray(gradient, dtype=np.float64), root.shape)
        for idx, a in np.ndenumerate(root):
            if E.is_symbol(a):
                contrib[a].append(_num(sp, float(gflat[idx])))
        n_forward = len(self.defs)
        with mpmath.workdps(self.dps):
            for k in range(n_forward - 1, -1, -1):
                self.check_time()
                s, _ = self.defs[k]
                terms = contrib.pop(s, None)
                if not terms:
                    continue
                alpha = self._atomize(terms[0] if len(terms) == 1 else sp.Add(*terms))
                for f, p in self.partials_of(k).items():
                    contrib[f].append(alpha * p if not (E.is_atom(p) and p == 1) else alpha)
            # the second root: sum over leaves of u . (first-order adjoint)
            seeds: dict = defaultdict(lambda: mpmath.mpf(0))
            for leaf in self.graph.leaves:
                if leaf.index not in us:
                    continue
                u = us[leaf.index]
                for idx, s in np.ndenumerate(leaf.symbols):
                    for t in contrib.get(s, ()):
                        for f, p in E.partials(t, self.engine_name).items():
                            seeds[f] += mpmath.mpf(float(u[idx])) * self.ev(p)
            adj = seeds
            self._reverse_sweep(adj)
            return self._leaf_adjoints(adj, lambda leaf: leaf.index in us)


def _num(sp, x: float):
    if float(x).is_integer():
        return sp.Integer(int(x))
    return sp.Float(x) if hasattr(sp, "Float") else sp.RealDouble(x)


def _has_add(e) -> bool:
    """Whether a sum (a possible cancellation) occurs anywhere in ``e``."""
    if type(e).__name__ == "Add":
        return True
    return any(_has_add(a) for a in getattr(e, "args", ()))
