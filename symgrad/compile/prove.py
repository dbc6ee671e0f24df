"""Prove each generated fused backward loop against SymPy's derivative, on scalars.

A fused backward kernel is the chain rule written out per element. Its loop body, as
loaded from the generated module, is executed here with SymPy expressions in place of the
array elements: the group's inputs become symbols, its stored values their SymPy meaning
(``OpSpec.sympy``), the incoming gradients symbols ``g_j``. What the body writes for input
``x`` must equal ``d/dx sum_j g_j * value_j``: checked with ``simplify`` (exact), or where
SymPy cannot settle it (piecewise kinks), at random points away from the kinks.

``at_generation`` runs this when a module is first generated (``CompiledStep`` does not use
a module whose proof fails) and records the outcome next to the module file in the disk
cache, so another process loading the same module reads the record and never imports
SymPy. SymPy is imported here only, and only when a proof actually runs.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import re
import sys
import textwrap
import types
from typing import Any

__all__ = ["prove_plan", "prove_group", "prove_runs", "prove_each", "prove_each_run",
           "at_generation", "ProofFailed"]


class ProofFailed(Exception):
    """A generated fused backward loop is not its ops' derivative (the message says which)."""


class _Lanes:
    """``a[k]`` / ``a[k * s]`` reading one symbolic value; ``a[k] = e`` recording ``e``."""

    def __init__(self, value=None) -> None:
        self.value = value
        self.written = None

    def __getitem__(self, _):
        return self.value

    def __setitem__(self, _, e) -> None:
        self.written = e

    @property
    def size(self) -> int:
        return 2


class _Comparisons(ast.NodeTransformer):
    """``a > b`` -> ``_cmp('>', a, b)``: a 0/1 Piecewise SymPy can multiply."""

    def visit_Compare(self, node):  # noqa: N802
        self.generic_visit(node)
        op = {ast.Gt: ">", ast.GtE: ">=", ast.Lt: "<", ast.LtE: "<=", ast.Eq: "==",
              ast.NotEq: "!="}[type(node.ops[0])]
        return ast.Call(ast.Name("_cmp", ast.Load()),
                        [ast.Constant(op), node.left, node.comparators[0]], [])


def _vocabulary(sp) -> dict:
    def cmp(op, a, b):
        rel = {">": sp.Gt, ">=": sp.Ge, "<": sp.Lt, "<=": sp.Le, "==": sp.Eq,
               "!=": sp.Ne}[op](a, b)
        return sp.Piecewise((1, rel), (0, True))

    def where(c, a, b):
        cond = c.args[0][1] if isinstance(c, sp.Piecewise) else c
        return sp.Piecewise((a, cond), (b, True))

    return {"_cmp": cmp, "where": where, "exp": sp.exp, "log": sp.log, "sin": sp.sin,
            "cos": sp.cos, "tanh": sp.tanh, "sqrt": sp.sqrt, "abs": sp.Abs, "sign": sp.sign,
            "maximum": sp.Max, "log1p": lambda x: sp.log(1 + x),
            "expm1": lambda x: sp.exp(x) - 1, "erf": sp.erf, "pi": sp.pi}


def _run(text: str, namespace: dict) -> None:
    tree = _Comparisons().visit(ast.parse(text))
    ast.fix_missing_locations(tree)
    exec(compile(tree, "<fused backward>", "exec"), namespace)  # noqa: S102


def _scalar_fn(vocab: dict, text: str, module) -> object:
    """A scalar helper of the generated module (``sb_tanh``) evaluated on SymPy values."""
    src = textwrap.dedent(inspect.getsource(getattr(module, text).py_func))
    src = "\n".join(line for line in src.splitlines() if not line.startswith("@"))
    ns = dict(vocab)
    ns.update({f"m_{k}": v for k, v in vocab.items()})
    _run(src, ns)
    return ns[text]


class _Np:
    """``np.float32(c)`` in a kernel -> the exact rational of ``c`` (as ``exact`` below)."""

    def __init__(self, sp) -> None:
        self._sp = sp

    def __getattr__(self, _name):
        return lambda c: _exact(self._sp, c)


def _exact(sp, c):
    return sp.Rational(repr(float(c)))


def prove_kernel(module, name: str, group, seeds: list, outputs: list) -> str:
    """"proved", "checked at N points" or raises AssertionError with the difference."""
    import sympy as sp

    vocab = _vocabulary(sp)
    const = _Np(sp)
    sym = {v.index: sp.Symbol(f"x{v.index}", real=True) for v in group.inputs}
    meaning = dict(sym)
    detached = []
    for c in group.calls:
        y = c.outputs[0]
        if not y.requires_grad:  # made under no_grad (or from constants): a constant to
            detached.append(sp.Symbol(f"c{y.index}", real=True))  # the backward, as in eager
            meaning[y.index] = detached[-1]
            continue
        args = [meaning[x.index] if hasattr(x, "index") else _exact(sp, x) for x in c.inputs]
        params = {k: (_exact(sp, v) if isinstance(v, (int, float)) and not isinstance(v, bool)
                      else v) for k, v in c.params.items()}
        meaning[c.outputs[0].index] = c.spec.sympy(sp, *args, **params)
    gs = {v.index: sp.Symbol(f"g{v.index}", real=True) for v in seeds}
    target_f = sum(gs[i] * meaning[i] for i in gs)
    src = inspect.getsource(getattr(module, name).py_func)
    # the loop of a serial (range) or parallel (prange) kernel
    body = re.split(r"for k in p?range\(", src, maxsplit=1)[1].split("\n", 1)[1]
    ns: dict = {"np": const, "k": 0}
    for line in src.splitlines():
        if line.strip().startswith("s") and " = 1 if " in line:
            ns[line.split("=")[0].strip()] = 1
    for v in group.inputs:
        ns[f"i{v.index}"] = _Lanes(sym[v.index])
    for c in group.calls:
        ns[f"o{c.outputs[0].index}"] = _Lanes(meaning[c.outputs[0].index])
    for i, g in gs.items():
        ns[f"e{i}"] = _Lanes(g)
    out = {x.index: _Lanes() for x in outputs}
    ns.update({f"r{i}": lane for i, lane in out.items()})
    for helper in {n for n in ast.walk(ast.parse(textwrap.dedent(body)))
                   if isinstance(n, ast.Name) and n.id.startswith("sb_")}:
        ns[helper.id] = _scalar_fn(vocab, helper.id, module)
    _run(textwrap.dedent(body), ns)
    how = "proved"
    for i, lane in out.items():
        want = sp.diff(target_f, sym[i])
        got = sp.sympify(lane.written)
        if _is_zero(sp, got - want):
            continue
        how = _numeric(sp, got, want, list(sym.values()) + detached + list(gs.values()),
                       name, f"gradient of x{i}")
    return how


def _is_zero(sp, d) -> bool:
    """Is ``d`` identically zero? Cheap forms first; a Piecewise (a kink) is settled piece by
    piece, and one nested deeper or a large difference is left to ``_numeric``: ``simplify``
    of a whole Piecewise also simplifies its conditions (35 s on a sin..relu chain)."""
    d = sp.piecewise_fold(d)
    if d == 0:
        return True
    if isinstance(d, sp.Piecewise):
        return all(_is_zero(sp, e) for e, _ in d.args)
    ops = sp.count_ops(d)
    if ops > _EXPAND_MAX_OPS:  # expand alone ran ~1 s on such a piece of a ten-op chain and
        return False           # never settled it: the points decide at once
    if sp.expand(d) == 0:
        return True
    if d.has(sp.Piecewise) or ops > _SIMPLIFY_MAX_OPS:
        return False
    return sp.simplify(d) == 0


#: above this many operations ``simplify`` is not tried (``_numeric`` decides): on a
#: ten-op sin/tanh/exp/sigmoid/relu chain it ran for 16 s per gradient and did not settle
_SIMPLIFY_MAX_OPS = 25
#: above this many operations not even ``expand`` is tried: on the ten-op chain's
#: pieces (124 and 208 operations) it took 0.3-1.2 s each and settled none
_EXPAND_MAX_OPS = 100


def _lambdify(sp, symbols: list, exprs: tuple):
    """``sp.lambdify`` with ``math``, without its docstring: printing the expressions into
    it took a third of the lambdify (SymPy >= 1.13 takes ``docstring_limit``)."""
    try:
        return sp.lambdify(symbols, exprs, "math", docstring_limit=0)
    except TypeError:  # SymPy 1.12: no docstring_limit
        return sp.lambdify(symbols, exprs, "math")


def _numeric(sp, got, want, symbols: list, name: str, what: str, points: int = 16) -> str:
    """Where ``simplify`` leaves a residue (kinks): compare at random points off zero."""
    import random

    rng = random.Random(0)
    # one lambdify for the difference and the scale (each costs a code print + compile)
    f = _lambdify(sp, symbols, (got - want, sp.Abs(want) + 1))
    for _ in range(points):
        vals = [rng.choice((-1, 1)) * rng.uniform(0.1, 2.0) for _ in symbols]
        diff, scale = f(*vals)
        if not abs(diff) <= 1e-9 * scale:
            raise AssertionError(f"{name}: {what} differs from SymPy's derivative "
                                 f"at {vals}: {diff}")
    return f"checked at {points} points"


def prove_plan(module, plan) -> dict:
    """{kernel name: how its backward was established} for every fused backward kernel,
    and {group name: how} for each run fused forward+backward (prove_group below)."""
    out = {name: prove_kernel(module, name, group, seeds, outputs)
           for name, group, seeds, outputs in plan.backward_kernels}
    out.update({group.name: prove_group(module, group)
                for group in plan.fused_groups})  # fwdbwd.py's runs
    return out


def _prove_all(module, plan) -> dict:
    """prove_plan, with any failure (a wrong loop, or one SymPy could not establish) as a
    ProofFailed naming the loop."""
    jobs = [(name, lambda k=k: prove_kernel(module, *k))
            for k in plan.backward_kernels for name in (k[0],)]
    jobs += [(group.name, lambda g=group: prove_group(module, g))
             for group in plan.fused_groups]  # fwdbwd.py's runs
    out = {}
    for name, prove in jobs:
        try:
            out[name] = prove()
        except AssertionError as exc:
            raise ProofFailed(str(exc)) from None
        except Exception as exc:  # the prover could not run on it: not proved, not used
            raise ProofFailed(f"{name}: could not be proved ({type(exc).__name__}: {exc})") \
                from None
    return out


_VERSION: list = []


def _version() -> str:
    """symgrad's version and this prover's own hash: a record from another one is redone."""
    if not _VERSION:
        with open(__file__, "rb") as fh:
            digest = hashlib.sha1(fh.read()).hexdigest()[:12]
        _VERSION.append(f"{getattr(sys.modules.get('symgrad'), '__version__', '')}+{digest}")
    return _VERSION[0]


def record_path(module: types.ModuleType) -> str:
    """The proof record of a generated module: next to its file, same hash in the name."""
    return os.path.splitext(module.__file__)[0] + ".proof.json"


def at_generation(module: types.ModuleType, plan: Any) -> dict:
    """{loop name: how it was established} for the fused backward loops (and the runs whose
    forward and backward fwdbwd.py generated together) of a generated module, proved now or
    read from the record a previous proof left in the disk cache; raises ProofFailed (also
    when the record says a proof failed)."""
    if not plan.backward_kernels and not plan.fused_groups:
        return {}
    return _recorded(record_path(module), lambda: _prove_all(module, plan))


def cuda_at_generation(runs) -> dict:
    """``at_generation`` for a CUDA step's fused runs (cuda_step._Fused): a CUDA step has no
    module file, so the record is named by a hash of the runs' derivations."""
    if not runs:
        return {}
    from .loader import cache_dir

    text = json.dumps([(r.name, r.code) for r in runs], sort_keys=True)
    digest = hashlib.sha1(text.encode()).hexdigest()[:20]

    def prove_all() -> dict:
        try:
            return prove_runs(runs)
        except AssertionError as exc:
            raise ProofFailed(str(exc)) from None

    return _recorded(os.path.join(cache_dir(), f"cuda_{digest}.proof.json"), prove_all)


def _record_problem(version: str):
    """The check a proof record must pass before it is believed (see ``_recorded``)."""

    def problem(data) -> str | None:
        if not isinstance(data, dict):
            return "not an object"
        if data.get("symgrad") != version:
            return "stale"  # left by another symgrad or prover: proved again, silently
        if data.get("ok") is True:
            proofs = data.get("proofs")
            if not isinstance(proofs, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in proofs.items()):
                return "no 'proofs' mapping"
        elif data.get("ok") is False:
            if not isinstance(data.get("failure"), str):
                return "no 'failure' text"
        else:
            return "no 'ok' flag"
        return None

    return problem


def _recorded(path: str, prove_all) -> dict:
    """``prove_all()``'s outcome, read from the record at ``path`` when one from this
    symgrad and prover exists (sealed when written: a damaged, foreign or malformed record
    is deleted with a warning, never believed), else proved now and recorded; raises
    ProofFailed."""
    from .._codefiles import read_record, write_record

    version = _version()
    data = read_record(path, "proof record", _record_problem(version))
    if data is None:
        try:
            data = {"ok": True, "proofs": prove_all()}
        except ProofFailed as exc:
            data = {"ok": False, "failure": str(exc)}
        data["symgrad"] = version
        write_record(path, data)  # a read-only cache: the proof just runs again next time
    if not data["ok"]:
        raise ProofFailed(data["failure"])
    return data["proofs"]


# -- runs whose forward and backward fwdbwd.py generated together --------------------
# Prove a forward+backward fused run (fwdbwd.py) against SymPy, as prove.py does the plain
# fused backward loops.
#
# The run's stages are executed on SymPy values in order: each loop's body as loaded from the
# generated module (every array element a SymPy expression), each NumPy ufunc as its SymPy
# function. The run's inputs are symbols; what the stages leave in the exported buffers must
# equal the ops' ``OpSpec.sympy`` meaning, and the gradient written for input ``x`` (by the
# backward loop from symbols ``g_j``, or by the forward loop where the incoming gradient is a
# known constant ``c``) must equal ``d/dx sum_j g_j * value_j`` (``c * value``).
def _python(fn):
    """The Python function a kernel was compiled from: numba's ``py_func`` (``@njit`` and
    ``@cuda.jit`` dispatchers); numba's CUDA simulator keeps it as ``fn``."""
    py = getattr(fn, "py_func", None)
    return py if py is not None else fn.fn


def _body(fn) -> str:
    src = inspect.getsource(_python(fn))
    body = src.split("    for k in ", 1)[1].split("\n", 1)[1]
    return textwrap.dedent(body)


def _settled(sp, got, want, symbols: list, name: str, what: str) -> str:
    if _is_zero(sp, sp.sympify(got) - want):
        return "proved"
    return _numeric(sp, got, want, symbols, name, what)


#: fwdbwd's ``binop`` stages: their one op on SymPy values
_BINOPS = {"add": lambda a, b: a + b, "subtract": lambda a, b: a - b,
           "multiply": lambda a, b: a * b, "divide": lambda a, b: a / b}


def prove_group(module, group, code: dict | None = None) -> str:
    """"proved", "checked at N points" or AssertionError naming what differs. ``code`` is
    the derivation ``module``'s kernels were made from: the design's own (the CPU loops) by
    default, or its CUDA form (cuda_fused.derive, one loop, kernels under ``@cuda.jit``)."""
    import sympy as sp

    d = group.design
    code = d.code if code is None else code
    vocab = _vocabulary(sp)
    base = {"np": _Np(sp), "k": 0, "_cmp": vocab["_cmp"]}
    base.update({f"m_{k}": v for k, v in vocab.items()})
    sym = {j: sp.Symbol(f"x{v.index}", real=True) for j, v in enumerate(group.inputs)}
    meaning = {v.index: sym[j] for j, v in enumerate(group.inputs)}
    for c in group.calls:
        args = [meaning[x.index] if hasattr(x, "index") else _exact(sp, x) for x in c.inputs]
        params = {k: (_exact(sp, v) if isinstance(v, (int, float)) and not isinstance(v, bool)
                      else v) for k, v in c.params.items()}
        meaning[c.outputs[0].index] = c.spec.sympy(sp, *args, **params)
    env = {f"in{j}": s for j, s in sym.items()}
    for st in code["stages"]:
        if st[0] == "ufunc":
            env[st[3]] = getattr(sp, st[1])(env[st[2]])
            continue
        if st[0] == "binop":  # a shared one-op loop (fwdbwd.binop_loops) on buffers, constants
            a, b = (env[x] if isinstance(x, str) else _exact(sp, x) for x in st[2:4])
            env[st[4]] = _BINOPS[st[1]](a, b)
            continue
        lanes = {n: _Lanes(env.get(n)) for n in st[2]}
        ns = dict(base)
        ns.update(lanes)
        _run(_body(getattr(module, group.name + st[1])), ns)
        env.update({n: lane.written for n, lane in lanes.items() if lane.written is not None})
    outs = [c.outputs[0] for c in group.calls]
    gs = {p: sp.Symbol(f"g{outs[p].index}", real=True) for p in d.seeds}
    symbols = list(sym.values()) + list(gs.values())
    how = set()
    for p in d.export:
        got = env[f"ex{p}"] if f"ex{p}" in env else None
        how.add(_settled(sp, got, meaning[outs[p].index], symbols, group.name,
                         f"value v{outs[p].index}"))
    if d.wrt:
        if d.const is not None:
            (s,) = d.seeds
            target = _exact(sp, d.const) * meaning[outs[s].index]
        else:
            target = sum(gs[p] * meaning[outs[p].index] for p in d.seeds)
            b = code["backward"]
            lanes = {n: _Lanes(gs[int(n[1:])] if n.startswith("e") else env.get(n))
                     for n in b["params"]}
            ns = dict(base)
            ns.update(lanes)
            ns.update({f"s{p}": 1 for p in d.seeds})
            _run(_body(getattr(module, group.name + "_b")), ns)
            env.update({n: lane.written for n, lane in lanes.items() if n.startswith("r")})
        for j in d.wrt:
            how.add(_settled(sp, env[f"r{j}"], sp.diff(target, sym[j]), symbols, group.name,
                             f"gradient of x{group.inputs[j].index}"))
    return "proved" if how <= {"proved"} else sorted(how - {"proved"})[0]


def prove_runs(runs) -> dict:
    """{run name: how} for fused runs given as objects with ``name``, ``module``, ``group``
    and ``code`` (a CUDA step's runs, cuda_step._Fused: the kernels as loaded, proved on
    the derivation they were made from); AssertionError naming what differs."""
    return {r.name: prove_group(r.module, r.group, r.code) for r in runs}


# -- one row per fused kernel, for ``CompiledStep.verify``'s report ----------------------
def _ops(group) -> str:
    """The ops a fused kernel stands for, in order (``sub -> pow``)."""
    return " -> ".join(getattr(c.spec, "name", "?") for c in getattr(group, "calls", ()))


def kernel_source(module, name: str) -> str:
    """The source of kernel ``name`` of a generated module (and of its stage loops,
    ``name_0``, ``name_b``), as loaded: what the proof ran on SymPy values."""
    parts = []
    for attr in sorted(vars(module)):
        if attr != name and not attr.startswith(name + "_"):
            continue
        fn = getattr(module, attr)
        py = getattr(fn, "py_func", None) or getattr(fn, "fn", None)
        if py is None:
            continue
        try:
            parts.append(textwrap.dedent(inspect.getsource(py)).rstrip())
        except (OSError, TypeError):
            continue
    return "\n\n".join(parts)


def derivation(module, name: str, group) -> str:
    """What a fused kernel is derived from, for a report: its ops and its loop source."""
    src = kernel_source(module, name)
    head = f"fuses {_ops(group)}" if getattr(group, "calls", None) else ""
    return "\n".join(x for x in (head, src) if x)


def _row(kind: str, name: str, prove_one, deriv) -> dict:
    """Prove one kernel: a row with ``status`` ok | wrong | not proved, and the detail."""
    try:
        how = prove_one()
    except AssertionError as exc:
        status, detail, how = "wrong", str(exc), None
    except Exception as exc:  # noqa: BLE001 - the prover could not run on it: not proved
        status, detail, how = ("not proved", f"{name}: could not be proved "
                               f"({type(exc).__name__}: {exc})", None)
    else:
        if isinstance(how, dict):  # prove_runs([run]) gives {name: how}
            how = how.get(name, "proved") if how else "proved"
        status, detail = "ok", str(how)
    try:
        text = deriv()
    except Exception as exc:  # noqa: BLE001 - a report row is still useful without it
        text = f"(derivation unavailable: {type(exc).__name__}: {exc})"
    return {"kind": kind, "name": name, "status": status, "how": how, "detail": detail,
            "derivation": text}


def prove_each(module, plan) -> list[dict]:
    """``prove_plan`` kernel by kernel, a failure kept as a row instead of raised: one dict
    per fused kernel (kind, name, status, how, detail, derivation)."""
    rows = [_row("fused backward loop", k[0], lambda k=k: prove_kernel(module, *k),
                 lambda k=k: derivation(module, k[0], k[1]))
            for k in plan.backward_kernels]
    rows += [_row("fused forward+backward run", g.name, lambda g=g: prove_group(module, g),
                  lambda g=g: derivation(module, g.name, g))
             for g in plan.fused_groups]
    return rows


def prove_each_run(runs) -> list[dict]:
    """``prove_runs`` run by run (a CUDA step's fused kernels), failures as rows."""
    this = sys.modules[__name__]  # looked up at call time: prove_runs may be replaced

    def deriv(r):
        src = kernel_source(r.module, r.name)
        return "\n".join(x for x in (f"fuses {_ops(r.group)}", src or repr(r.code)) if x)

    return [_row("fused CUDA kernel", r.name, lambda r=r: this.prove_runs([r]),
                 lambda r=r: deriv(r)) for r in runs]
