"""Prove a forward+backward fused run (fwdbwd.py) against SymPy, as prove.py does the plain
fused backward loops.

The run's stages are executed on SymPy values in order: each loop's body as loaded from the
generated module (every array element a SymPy expression), each NumPy ufunc as its SymPy
function. The run's inputs are symbols; what the stages leave in the exported buffers must
equal the ops' ``OpSpec.sympy`` meaning, and the gradient written for input ``x`` (by the
backward loop from symbols ``g_j``, or by the forward loop where the incoming gradient is a
known constant ``c``) must equal ``d/dx sum_j g_j * value_j`` (``c * value``).
"""

from __future__ import annotations

import inspect
import textwrap

from .prove import _exact, _Lanes, _Np, _numeric, _run, _vocabulary

__all__ = ["prove_group"]


def _body(fn) -> str:
    src = inspect.getsource(fn.py_func)
    body = src.split("    for k in ", 1)[1].split("\n", 1)[1]
    return textwrap.dedent(body)


def _settled(sp, got, want, symbols: list, name: str, what: str) -> str:
    if sp.simplify(sp.piecewise_fold(sp.sympify(got) - want)) == 0:
        return "proved"
    return _numeric(sp, got, want, symbols, name, what)


def prove_group(module, group) -> str:
    """"proved", "checked at N points" or AssertionError naming what differs."""
    import sympy as sp

    d = group.design
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
    for st in d.code["stages"]:
        if st[0] == "ufunc":
            env[st[3]] = getattr(sp, st[1])(env[st[2]])
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
            b = d.code["backward"]
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
