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

__all__ = ["prove_plan", "at_generation", "ProofFailed"]


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
        if sp.simplify(sp.piecewise_fold(got - want)) == 0:
            continue
        how = _numeric(sp, got, want, list(sym.values()) + detached + list(gs.values()),
                       name, f"gradient of x{i}")
    return how


def _numeric(sp, got, want, symbols: list, name: str, what: str, points: int = 16) -> str:
    """Where ``simplify`` leaves a residue (kinks): compare at random points off zero."""
    import random

    rng = random.Random(0)
    f = sp.lambdify(symbols, got - want, "math")
    scale = sp.lambdify(symbols, sp.Abs(want) + 1, "math")
    for _ in range(points):
        vals = [rng.choice((-1, 1)) * rng.uniform(0.1, 2.0) for _ in symbols]
        if not abs(f(*vals)) <= 1e-9 * scale(*vals):
            raise AssertionError(f"{name}: {what} differs from SymPy's derivative "
                                 f"at {vals}: {f(*vals)}")
    return f"checked at {points} points"


def prove_plan(module, plan) -> dict:
    """{kernel name: how its backward was established} for every fused backward kernel,
    and {group name: how} for each run fused forward+backward (prove_fused.py)."""
    from .prove_fused import prove_group

    out = {name: prove_kernel(module, name, group, seeds, outputs)
           for name, group, seeds, outputs in plan.backward_kernels}
    out.update({group.name: prove_group(module, group)
                for group in plan.fused_groups})  # fwdbwd.py's runs
    return out


def _prove_all(module, plan) -> dict:
    """prove_plan, with any failure (a wrong loop, or one SymPy could not establish) as a
    ProofFailed naming the loop."""
    from .prove_fused import prove_group

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
    path = record_path(module)
    version = _version()
    try:
        with open(path) as fh:
            data = json.load(fh)
        if not isinstance(data, dict) or "ok" not in data or data.get("symgrad") != version:
            data = None  # unreadable, or left by another symgrad or prover
    except (OSError, ValueError):
        data = None
    if data is None:
        try:
            data = {"ok": True, "proofs": _prove_all(module, plan)}
        except ProofFailed as exc:
            data = {"ok": False, "failure": str(exc)}
        data["symgrad"] = version
        try:  # atomic, as the module file itself: concurrent processes write the same
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as fh:
                json.dump(data, fh)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only cache: the proof just runs again next time
    if not data["ok"]:
        raise ProofFailed(data["failure"])
    return data["proofs"]
