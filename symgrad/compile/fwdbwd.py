"""A fused elementwise run's forward and backward written together, with SymPy ``cse``.

The plain fused path (fuse.py) stores every value of a run in the forward and walks the run
backwards per element in a second loop that reads them all again. Here the forward loop
computes, per element, the run's values that are used outside it *and* the partial
derivative of each value that receives a gradient from outside (a "seed") with respect to
each run input that needs one: ``P[s][x] = d value_s / d x``, built by the chain rule from
the op stanzas' ``Scalar.grad`` texts (with ``g = 1``), so the backward is one loop doing
``grad_x = sum_s g_s * P[s][x]``. Value and partials are one expression list for
``sympy.cse``, which shares their subexpressions (``exp(x)`` of a sigmoid computed once).
When the run's only seed feeds a whole-tensor ``sum``/``mean`` that is the loss, its
incoming gradient is a known constant (1, 1/n): the forward loop writes the input's
gradient itself and no backward loop runs.

Transcendental unary ops (``fuse.SIMD_FORWARD``) still run as NumPy's SIMD ufuncs between
loops (a libm call per element in a Numba loop is 30x slower here); so does a derivative's
``cos(u)`` where ``u`` is already in a buffer. The design depends only on the run's
structure, so it is kept in the compile cache dir as JSON keyed by that structure (the op
stanzas' texts included): a second process gets it without importing SymPy.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np

from ..ops.scalar import _parse
from .graph import Backward, OpCall, Program, Unsupported, Value, ancestors

__all__ = ["Design", "analyze", "design", "call_code", "backward_code"]

VERSION = 1
#: ufunc-run forward ops and functions (the same set as fuse.SIMD_FORWARD)
SIMD = ("tanh", "exp", "log", "sqrt", "sin", "cos")
#: comparison / boolean operators of the stanza language, as opaque SymPy functions
_CMP = {ast.Gt: "_gt", ast.GtE: "_ge", ast.Lt: "_lt", ast.LtE: "_le", ast.Eq: "_eq",
        ast.NotEq: "_ne"}
_INFIX = {"_gt": ">", "_ge": ">=", "_lt": "<", "_le": "<=", "_eq": "==", "_ne": "!=",
          "_and": "&", "_or": "|"}


@dataclass
class Design:
    """A run's fused forward+backward: what ``analyze`` decided and ``derive`` wrote."""

    export: list  # positions (in group.calls) of values used outside the run
    seeds: list  # positions of values that get a gradient from outside
    wrt: list  # indices (in group.inputs) of inputs that need a gradient
    const: float | None  # the seeds' known incoming gradient, or None
    code: dict | None = None  # derive()'s result: stages, kernels, backward


# -- analysis: which values leave the run, which get gradients ---------------------------------
def _result_indices(result, out: set) -> set:
    kind, x = result
    if kind == "value":
        out.add(x.index)
    elif kind in ("tuple", "list"):
        for y in x:
            _result_indices(y, out)
    return out


def analyze(program: Program) -> dict:
    """The program facts ``design`` needs, computed once per program."""
    position, consumers, backwards, ops = {}, {}, [], []
    for pos, event in enumerate(program.events):
        if isinstance(event, OpCall):
            position[id(event)] = pos
            ops.append(event)
            for x in event.tensor_inputs:
                consumers.setdefault(x.index, []).append(event)
        elif isinstance(event, Backward):
            backwards.append((pos, event.root, list(ops)))
    return {"position": position, "consumers": consumers, "backwards": backwards,
            "results": _result_indices(program.result, set()), "needs": {}}


def design(group, facts: dict) -> Design | None:
    """The fused forward+backward of ``group``, or None where the plain path is used (the
    run takes part in two backwards; more partials than values to store; an op in it ran
    under no_grad)."""
    calls = group.calls
    if any(not c.outputs[0].requires_grad and any(x.requires_grad for x in c.tensor_inputs)
           for c in calls):
        # an op that ran under no_grad: its value is a constant to the gradient, which the
        # derivation (differentiating through the run's meaning) does not know
        return None
    last = facts["position"][id(calls[-1])]
    mine = {id(c) for c in calls}
    outs = [c.outputs[0] for c in calls]
    roots = {r.index for _, r, _ in facts["backwards"]}
    involved = []
    for k, (pos, root, ops) in enumerate(facts["backwards"]):
        if pos < last:
            continue
        need = facts["needs"].get(k)
        if need is None:
            need = facts["needs"][k] = ancestors(ops, root)
        if any(v.index in need for v in outs):
            involved.append((root, ops, need))
    if len(involved) > 1:
        return None
    export = [p for p, v in enumerate(outs) if v.index in facts["results"] or v.index in roots
              or any(id(c) not in mine for c in facts["consumers"].get(v.index, ()))]
    if not involved:
        return Design(export, [], [], None)
    root, ops, need = involved[0]
    in_ops = {id(c) for c in ops}
    seeds = []
    for p, v in enumerate(outs):
        if v.index not in need:
            continue
        users = [c for c in facts["consumers"].get(v.index, ())
                 if id(c) not in mine and id(c) in in_ops
                 and any(o.index in need for o in c.outputs)]
        if v is root or users:
            seeds.append((p, users))
    wrt = [j for j, x in enumerate(group.inputs) if x.index in need] if seeds else []
    const = None
    if len(seeds) == 1 and outs[seeds[0][0]] is not root:
        (p, users), = seeds
        c = users[0]
        if (len(users) == 1 and c.spec.name in ("sum", "mean") and c.outputs[0] is root
                and c.outputs[0].dtype == outs[p].dtype and len(c.tensor_inputs) == 1):
            dt = outs[p].dtype
            const = 1.0 if c.spec.name == "sum" else float(
                np.asarray(1, dt) / np.asarray(max(int(np.prod(outs[p].shape)), 1), dt))
    if const is None and len(seeds) * len(wrt) > len(calls):
        return None  # storing every value is less memory than the partials
    return Design(export, [p for p, _ in seeds], wrt, const)


# -- the run as data: what derive() reads (and the cache key) ----------------------------------
def describe(group, d: Design, parallel: bool, simd: bool = True) -> dict:
    """The run as JSON-able data; ``simd=False`` keeps the transcendental ops inside the
    loop (one loop for forward and partials: the CUDA form, cuda_fused.py)."""
    made = {c.outputs[0].index: p for p, c in enumerate(group.calls)}
    inputs = {x.index: j for j, x in enumerate(group.inputs)}
    ops = []
    for c in group.calls:
        args = [["o", made[x.index]] if isinstance(x, Value) and x.index in made else
                ["i", inputs[x.index]] if isinstance(x, Value) else ["c", float(x)]
                for x in c.inputs]
        if c.spec.name == "pow":
            ops.append(["pow", None, None, float(c.params["exponent"]), args])
        else:
            s = c.spec.scalar
            ops.append([c.spec.name, s.forward, list(s.grads), list(s.inputs), args])
    return {"version": VERSION, "dtype": group.calls[0].outputs[0].dtype.name,
            "parallel": parallel, "inputs": len(group.inputs), "ops": ops,
            "export": d.export, "seeds": d.seeds, "wrt": d.wrt, "const": d.const,
            "simd": simd}


_SELF = None


def _cache_path(desc: dict) -> str:
    from .loader import cache_dir

    global _SELF
    if _SELF is None:  # the deriving code is part of the key: an edit here re-derives
        with open(__file__, "rb") as fh:
            _SELF = hashlib.sha1(fh.read()).hexdigest()
    key = hashlib.sha1((_SELF + json.dumps(desc, sort_keys=True)).encode()).hexdigest()[:20]
    return os.path.join(cache_dir(), f"fwdbwd_{key}.json")


def _code_problem(code) -> str | None:
    """The shape a derivation record must have before code generation uses it."""
    if not isinstance(code, dict) or not isinstance(code.get("stages"), list) or \
            not isinstance(code.get("kernels"), list) or "backward" not in code:
        return "not a derivation (stages, kernels, backward)"
    b = code["backward"]
    if b is not None and not (isinstance(b, dict) and isinstance(b.get("text"), str)
                              and isinstance(b.get("params"), list)):
        return "a backward without text and params"
    return None


def derived(desc: dict) -> dict:
    """``derive(desc)``, from the disk cache when this structure was derived before (the
    record is sealed when written: a damaged, foreign or malformed one is deleted with a
    warning and derived again, since its texts become generated code)."""
    from .._codefiles import read_record, write_record

    path = _cache_path(desc)
    code = read_record(path, "derivation record", _code_problem)
    if code is None:
        code = derive(desc)
        write_record(path, code)
    return code


# -- derivation with SymPy (generation time only) ----------------------------------------------
class _Opaque(ast.NodeTransformer):
    """``a > b`` -> ``_gt(a, b)``, ``a & b`` -> ``_and(a, b)``: SymPy cannot multiply a
    relational; kept opaque, they print back as written."""

    def visit_Compare(self, node):  # noqa: N802
        self.generic_visit(node)
        return ast.Call(ast.Name(_CMP[type(node.ops[0])], ast.Load()),
                        [node.left, node.comparators[0]], [])

    def visit_BinOp(self, node):  # noqa: N802
        self.generic_visit(node)
        if isinstance(node.op, (ast.BitAnd, ast.BitOr)):
            name = "_and" if isinstance(node.op, ast.BitAnd) else "_or"
            return ast.Call(ast.Name(name, ast.Load()), [node.left, node.right], [])
        return node


def _evaluate(sp, text: str, variables: dict, funcs: dict):
    """A stanza text on SymPy values, every vocabulary function opaque (SymPy keeps the
    stanza's numerically careful forms: no ``log1p(x) -> log(1 + x)``)."""
    lets, result = _parse(text, tuple(variables))
    env = dict(funcs)
    env.update(variables)
    for name, expr in list(lets) + [(None, result)]:
        tree = ast.fix_missing_locations(_Opaque().visit(ast.parse(expr, mode="eval")))
        value = eval(compile(tree, "<stanza>", "eval"), {"__builtins__": {}}, env)  # noqa: S307
        if name is None:
            return sp.sympify(value)
        env[name] = value


def derive(desc: dict) -> dict:
    """Stages (loops and ufuncs), kernel texts and the backward loop for a described run."""
    import sympy as sp

    funcs: dict = {}

    def fn(name):
        if name not in funcs:
            funcs[name] = sp.Function(name)
        return funcs[name]

    vocab = {f: fn(f) for f in ("exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "sign",
                                "where", "maximum", "minimum", "log1p", "expm1", "erf",
                                "atan2", "hypot", "pow", *_INFIX)}
    vocab["pi"] = sp.Symbol("pi")
    one = sp.Integer(1)
    export, seeds, wrt = set(desc["export"]), desc["seeds"], desc["wrt"]
    stages: list = []
    pending: list = []
    stored: set = set()
    val, sym, dval = {}, {}, {}
    n_tmp = [0]

    def tmp(prefix):
        n_tmp[0] += 1
        return f"{prefix}{n_tmp[0] - 1}"

    def mul(a, b):
        return b if a == one else a if b == one else a * b

    with sp.evaluate(False):
        for j in range(desc["inputs"]):
            sym[("i", j)] = sp.Symbol(f"in{j}")
        for p, (name, fwd, grads, names, args) in enumerate(desc["ops"]):
            A = [sym.get(tuple(a)) if a[0] != "c" else sp.Float(a[1]) for a in args]
            D = [{a[1]: one} if a[0] == "i" else dval.get(a[1], {}) if a[0] == "o" else {}
                 for a in args]
            if name == "pow":
                e = names  # describe() puts pow's exponent in the names slot
                e = sp.Integer(int(e)) if e == int(e) else sp.Float(e)
            if name in SIMD and desc["simd"]:
                a = A[0]
                if not isinstance(a, sp.Symbol):  # materialize the argument in a loop
                    q = args[0][1]
                    into = f"ex{q}" if q in export and f"ex{q}" not in stored else tmp("u")
                    pending.append((into, a))
                    stored.add(into)
                    sym[("o", q)] = a = sp.Symbol(into)
                    stages.append(["loop", pending])
                    pending = []
                out = f"ex{p}" if p in export else tmp("t")
                stored.add(out)
                stages.append(["ufunc", name, a.name, out])
                A[0] = a
                y = sp.Symbol(out)
                val[p] = y
                sym[("o", p)] = y
            elif name == "pow":
                y = sp.Pow(A[0], e)
                val[p] = sym[("o", p)] = y
            else:
                y = _evaluate(sp, fwd, dict(zip(names, A)), vocab)
                val[p] = sym[("o", p)] = y
            if name == "pow":
                e1 = sp.Integer(int(e) - 1) if e.is_Integer else sp.Float(float(e) - 1)
                partials = [sp.Integer(0) if e == 0 else mul(e, sp.Pow(A[0], e1))]
            else:
                partials = [None if g is None or not D[k] else _evaluate(
                    sp, g, {"g": one, **dict(zip(names, A)), "y": y}, vocab)
                    for k, g in enumerate(grads)]
            total: dict = {}
            for k, dk in enumerate(D):
                if partials[k] is None:
                    continue
                for j, e_j in dk.items():
                    term = mul(partials[k], e_j)
                    total[j] = total[j] + term if j in total else term
            dval[p] = total
        finals = [(f"ex{p}", val[p]) for p in sorted(export) if f"ex{p}" not in stored]
        const = desc["const"]
        for j in wrt:
            if const is not None:
                g = dval[seeds[0]].get(j, sp.Integer(0))
                finals.append((f"r{j}", g if const == 1.0 else mul(sp.Float(const), g)))
            else:
                finals += [(f"p{s}_{j}", dval[s].get(j, sp.Integer(0))) for s in seeds]
        # a derivative's cos(u) with u already in a buffer: a ufunc too, not a libm call
        hoist = {}
        for _, e in finals if desc["simd"] else ():
            for f in sp.preorder_traversal(e):
                if (getattr(f.func, "__name__", None) in SIMD and len(f.args) == 1
                        and isinstance(f.args[0], sp.Symbol) and f not in hoist):
                    out = tmp("t")
                    hoist[f] = sp.Symbol(out)
                    stages.append(["ufunc", f.func.__name__, f.args[0].name, out])
        if hoist:
            finals = [(n, e.xreplace(hoist)) for n, e in finals]
        finals = pending + finals
        if finals:
            stages.append(["loop", finals])
        out_stages, kernels = [], []
        for st in stages:
            if st[0] == "ufunc":
                out_stages.append(st)
                continue
            # serial runs only: a parallel run's loops stay prange loops
            calls = _as_ufuncs(sp, st[1]) if desc["simd"] and not desc["parallel"] else None
            if calls is not None:
                out_stages += calls
                continue
            k = len(kernels)
            text, params = _loop_text(sp, f"@@_{k}", st[1], desc)
            kernels.append([f"_{k}", text, len(params)])
            out_stages.append(["loop", f"_{k}", params])
    backward = None
    if const is None and wrt:
        backward = _backward_text(seeds, wrt, desc)
    return {"stages": out_stages, "kernels": kernels, "backward": backward}


#: arithmetic a loop of one store may be as calls of shared loops (``binop`` stages)
BINOPS = ("add", "subtract", "multiply", "divide")
#: at most this many such calls replace one loop
MAX_BINOPS = 2


def _as_ufuncs(sp, stores: list) -> list | None:
    """A loop storing one value that is at most ``MAX_BINOPS`` arithmetic ops, each on the
    running value and a buffer or constant (``(t + 0.3) ** 2``, ``in0 * in1``), as
    ``["binop", op, a, b, out]`` stages (``a``/``b``: a buffer name or a float; ``out``
    names the running value), run by loops every step shares (``binop_loops``: the same
    IEEE roundings as the run's own loop), so a step's first call does not Numba-compile a
    loop per such value (a quarter of a second each). None: keep the loop."""
    if len(stores) != 1:
        return None
    out, expr = stores[0]

    def atom(e):
        if isinstance(e, sp.Symbol):
            return e.name if _order(e.name)[0] < 9 else None
        if isinstance(e, sp.Number) and e.is_finite:
            return float(e)
        if isinstance(e, sp.Mul) and len(e.args) == 2 and e.args[0] == -1 and \
                isinstance(e.args[1], sp.Number) and e.args[1].is_finite:
            return -float(e.args[1])
        return None

    def steps(e) -> list | None:
        """ufunc calls leaving ``e`` in ``out``; None if it is not such a chain."""
        if isinstance(e, sp.Pow) and e.exp == 2:
            e = sp.Mul(e.base, e.base, evaluate=False)
        if not isinstance(e, (sp.Add, sp.Mul)) or len(e.args) != 2:
            return None
        x, y = e.args
        if isinstance(e, sp.Mul) and x == y and atom(x) is None:  # a square of a chain
            inner = steps(x)
            return None if inner is None else inner + [["multiply", out, out, out]]
        fn = "add" if isinstance(e, sp.Add) else "multiply"
        if isinstance(e, sp.Add) and isinstance(y, sp.Mul) and len(y.args) == 2 and \
                y.args[0] == -1 and isinstance(atom(y.args[1]), str):
            fn, y = "subtract", y.args[1]
        elif isinstance(e, sp.Mul) and isinstance(y, sp.Pow) and y.exp == -1 and \
                atom(y.base) is not None:
            fn, y = "divide", y.base
        a, b = atom(x), atom(y)
        if a is not None and b is not None:
            return None if not (isinstance(a, str) or isinstance(b, str)) else \
                [[fn, a, b, out]]
        if b is not None:  # x a chain, then (running value) op y
            inner = steps(x)
            return None if inner is None else inner + [[fn, out, b, out]]
        if a is not None and fn in ("add", "multiply"):  # commutative: y's chain, then op x
            inner = steps(y)
            return None if inner is None else inner + [[fn, out, a, out]]
        return None

    calls = steps(expr)
    if calls is None or len(calls) > MAX_BINOPS:
        return None
    return [["binop", *c] for c in calls]


def _head(name: str, params: list, parallel: bool) -> list[str]:
    return ["@njit(parallel=True, **_J)" if parallel else "@njit(**_J)",
            f"def {name}({', '.join(params)}):",
            f"    for k in {'prange' if parallel else 'range'}({params[0]}.size):"]


def _loop_text(sp, name: str, stores: list, desc: dict) -> tuple[str, list]:
    with sp.evaluate(False):
        temps, reduced = sp.cse([e for _, e in stores], symbols=sp.numbered_symbols("w"),
                                optimizations=None)
    reads = sorted({s.name for _, e in stores for s in e.free_symbols if _order(s.name)[0] < 9},
                   key=_order)
    params = reads + [n for n, _ in stores if n not in reads]
    dt = desc["dtype"]
    body = [f"x_{r} = {r}[k]" for r in reads]
    with sp.evaluate(False):
        body += [f"{t} = {_print(e, dt)}" for t, e in temps]
        body += [f"{n}[k] = {_print(e, dt)}" for (n, _), e in zip(stores, reduced)]
    lines = _head(name, params, desc["parallel"]) + [f"        {b}" for b in body]
    return "\n".join(lines) + "\n", params


def _order(name: str) -> tuple:
    head = name.rstrip("0123456789_")
    return ("in", "ex", "u", "t").index(head) if head in ("in", "ex", "u", "t") else 9, name


def _backward_text(seeds: list, wrt: list, desc: dict) -> dict:
    """``r_j = sum_s g_s * P[s][j]`` per element (a gradient of one element, the backward
    of a sum, is read at every index)."""
    params = [f"r{j}" for j in wrt] + [f"e{s}" for s in seeds] + [
        f"p{s}_{j}" for j in wrt for s in seeds]
    head = _head("@@_b", params, desc["parallel"])
    lines = head[:2] + [f"    s{s} = 1 if e{s}.size > 1 else 0" for s in seeds] + head[2:]
    for j in wrt:
        terms = " + ".join(f"e{s}[k * s{s}] * p{s}_{j}[k]" for s in seeds)
        lines.append(f"        r{j}[k] = {terms}")
    return {"text": "\n".join(lines) + "\n", "params": params}


# -- printing SymPy back as Numba loop code ----------------------------------------------------
def _print(e, dt: str) -> str:
    """``e`` as Python for a Numba loop: constants as ``np.<dtype>(c)`` (no float64
    promotion), ``x ** n`` for small integer n as products, ``a * b ** -1`` as ``a / b``,
    the vocabulary as the module's ``m_*`` names."""
    import sympy as sp

    def p(e) -> str:
        if isinstance(e, sp.Symbol):
            n = e.name
            return n if n.startswith("w") else "m_pi" if n == "pi" else f"x_{n}"
        if isinstance(e, sp.Number):
            return f"np.{dt}({float(e)!r})"
        if e in (sp.true, sp.false):
            return str(bool(e))
        if isinstance(e, sp.Add):
            out = p(e.args[0])
            for a in e.args[1:]:
                c, rest = a.as_coeff_Mul() if isinstance(a, sp.Mul) else (None, a)
                if c == -1:
                    out = f"({out} - {p(rest)})"
                else:
                    out = f"({out} + {p(a)})"
            return out
        if isinstance(e, sp.Mul):
            num, den, neg = [], [], False
            for a in e.args:
                if a == -1:
                    neg = not neg
                elif a == 1:
                    continue
                elif isinstance(a, sp.Pow) and a.exp.is_Integer and a.exp < 0:
                    den.append(a.base if a.exp == -1 else sp.Pow(a.base, -a.exp))
                else:
                    num.append(a)
            text = " * ".join(p(a) for a in num) if num else f"np.{dt}(1.0)"
            for a in den:
                text = f"({text}) / {p(a)}"
            return f"(-({text}))" if neg else f"({text})"
        if isinstance(e, sp.Pow):
            b, x = e.args
            if x.is_Integer and 0 <= x <= 4:
                return f"({' * '.join([p(b)] * int(x))})" if x else f"np.{dt}(1.0)"
            if x.is_Integer and -4 <= x < 0:
                return f"(np.{dt}(1.0) / ({' * '.join([p(b)] * int(-x))}))"
            return f"({p(b)} ** {p(x)})"
        if isinstance(e, sp.core.function.AppliedUndef):
            name = e.func.__name__
            args = [p(a) for a in e.args]
            if name in _INFIX:
                return f"({args[0]} {_INFIX[name]} {args[1]})"
            return f"m_{name}({', '.join(args)})"
        raise NotImplementedError(f"cannot print {type(e).__name__} {e}")

    return p(e)


# -- code in the generated module --------------------------------------------------------------
def module_kernels(group, code: dict) -> tuple[list[str], list]:
    """Kernel texts (named after the group) and KERNELS entries of a designed group."""
    dt = group.calls[0].outputs[0].dtype.name
    text, kernels = [], []
    for suffix, body, n in code["kernels"]:
        text += [body.replace("@@", group.name), ""]
        kernels.append((group.name + suffix, dt, "a" * n))
    if code["backward"]:
        b = code["backward"]
        text += [b["text"].replace("@@", group.name), ""]
        kernels.append((group.name + "_b", dt, "a" * len(b["params"])))
    return text, kernels


def _buffer(group, name: str, ctx) -> str:
    """The flat array a stage parameter names, allocated once in ``make``."""
    dt = group.calls[0].outputs[0].dtype.name
    if name.startswith("in"):
        return f"{group.inputs[int(name[2:])].name}.reshape(-1)"
    if name.startswith("ex"):
        b = ctx.buf(group.calls[int(name[2:])].outputs[0])
        ctx.alloc(f"{b}f = {b}.reshape(-1)")
        return f"{b}f"
    if name.startswith("r"):
        x = group.inputs[int(name[1:])]
        b = ctx.buf(x, f"{group.name}_r")
        ctx.alloc(f"{b}f = {b}.reshape(-1)")
        return f"{b}f"
    size = int(np.prod(group.calls[0].outputs[0].shape))
    b = f"{group.name}_{name}"
    ctx.alloc(f"{b} = np.empty({size}, np.{dt})")
    return b


_BINOP_SIGN = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/"}
_BINOPS_MODULE = None


def _binop_text(fn: str, kinds: str) -> str:
    a, b = ("a" if kinds[0] == "s" else "a[k]"), ("b" if kinds[1] == "s" else "b[k]")
    return (f"@njit(**_J)\ndef bo_{fn}_{kinds}(a, b, out):\n    for k in range(out.size):\n"
            f"        out[k] = {a} {_BINOP_SIGN[fn]} {b}\n")


def binop_loops():
    """The loops ``binop`` stages call (``out[k] = a[k] * b``...: one op, a scalar operand
    an argument, so one text per op and operand kinds) as one module every generated step
    shares, kept where fuse.loops() keeps its own: Numba compiles each once per
    installation and dtype, not on a step's first call. A Numba loop call costs a third of
    a NumPy ufunc call with ``out=`` at the sizes a serial run has."""
    global _BINOPS_MODULE
    if _BINOPS_MODULE is None:
        from .._codefiles import import_text
        from ..backends.cpu import kernels

        base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
            os.path.dirname(os.path.abspath(kernels.__file__)), "__pycache__")
        texts = [_binop_text(fn, kinds) for fn in BINOPS for kinds in ("aa", "as", "sa")]
        text = "\n".join(['"""fwdbwd.binop_loops: one-op loops the generated steps share."""',
                          "import numpy as np", "", "from numba import njit", "",
                          "import symgrad.backends.cpu.kernels  # noqa: F401", "",
                          "_J = dict(cache=True, nogil=True, fastmath=False, "
                          "error_model='numpy')", "", *texts])
        _BINOPS_MODULE = import_text(text, os.path.join(base, "symgrad_generated"),
                                     "symgrad_binops")
    return _BINOPS_MODULE


def _binop_kernel(ctx, fn: str, kinds: str, dt: str) -> str:
    """The shared loop for ``fn`` on operands of ``kinds`` (a: array, s: scalar), imported
    by the generated module and compiled (or loaded) with its kernels."""
    name = f"bo_{fn}_{kinds}"
    if name not in ctx.plan.helpers:
        ctx.plan.helpers[name] = (f"from symgrad.compile.fwdbwd import binop_loops as "
                                  f"_binops  # noqa: E402\n{name} = _binops().{name}\n")
    if (name, dt, kinds + "a") not in ctx.plan.kernels:
        ctx.plan.kernels.append((name, dt, kinds + "a"))
    return name


def _stage_name(name) -> str:
    """A buffer name of a derivation's stage, checked (the record becomes code)."""
    if not (isinstance(name, str) and _order(name)[0] < 9 and
            name.rstrip("0123456789") in ("in", "ex", "u", "t") and name[-1:].isdigit()):
        raise Unsupported(f"a fused run's stage names {name!r} (a compile bug)")
    return name


def call_code(group, ctx, launch) -> list[str]:
    """The forward of a designed group: its loops and ufuncs in order."""
    lines = []
    dt = group.calls[0].outputs[0].dtype.name
    for st in group.design.code["stages"]:
        if st[0] == "ufunc":
            lines.append(f"np.{st[1]}({_buffer(group, st[2], ctx)}, "
                         f"out={_buffer(group, st[3], ctx)})")
        elif st[0] == "binop":  # one of the shared loops (binop_loops), constants bound once
            _, fn, a, b, out = st
            if fn not in BINOPS:
                raise Unsupported(f"fused run {group.name}: unknown binop {fn!r} (a compile "
                                  "bug)")
            ab, kinds = [], ""
            for x in (a, b):
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    c = f"{group.name}_c{len(ctx.allocs)}"
                    ctx.alloc(f"{c} = np.{dt}({float(x)!r})")
                    ab.append(c)
                    kinds += "s"
                else:
                    ab.append(_buffer(group, _stage_name(x), ctx))
                    kinds += "a"
            name = _binop_kernel(ctx, fn, kinds, dt)
            lines += launch(group.calls, f"{name}({ab[0]}, {ab[1]}, "
                                         f"{_buffer(group, _stage_name(out), ctx)})")
        else:
            args = ", ".join(_buffer(group, n, ctx) for n in st[2])
            lines += launch(group.calls, f"{group.name}{st[1]}({args})")
    for p in group.design.export:
        v = group.calls[p].outputs[0]
        lines.append(f"{v.name} = {ctx.buf(v)}")
    return lines


def backward_code(group, grads: dict, values: dict, ctx, lines: list, launch,
                  matmul_into) -> None:
    """The backward of a designed group: ``g * P`` in one loop, or nothing when the
    forward already wrote the gradients."""
    d = group.design
    seeds = [p for p, c in enumerate(group.calls) if c.outputs[0].index in grads]
    if seeds != d.seeds:
        raise Unsupported(f"fused run {group.name}: gradients reach {seeds}, planned "
                          f"{d.seeds} (a compile bug)")
    if not d.wrt:
        return
    b = d.code["backward"]
    if b is not None:
        args = []
        for n in b["params"]:
            if not n.startswith("e"):
                args.append(_buffer(group, n, ctx))
                continue
            v = group.calls[int(n[1:])].outputs[0]
            g = grads[v.index]
            buf = ctx.buf(v, f"{group.name}_e")  # a matmul's gradient: into a buffer of make
            into = matmul_into(g, buf) if g.startswith("np.matmul(") else None
            if into is not None:
                lines.append(into)
                ctx.alloc(f"{buf}f = {buf}.reshape(-1)")
                args.append(f"{buf}f")
            else:
                args.append(f"flat({g})")
        lines += launch(group.calls, f"{group.name}_b({', '.join(args)})")
    for j in d.wrt:
        x = group.inputs[j]
        buf = ctx.buf(x, f"{group.name}_r")
        values[x.index] = x
        if x.index in grads:
            lines.append(f"g{x.index} = {grads[x.index]} + {buf}")
            grads[x.index] = f"g{x.index}"
        else:
            grads[x.index] = buf
