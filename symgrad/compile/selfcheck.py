"""The generated code replays the traced call before it is trusted.

The first call ran ``fn`` eagerly from some state (parameters, ``.grad``, optimizer
state) to another. Here a fresh instance of the generated module runs from copies of the
first state (taken by the tracer as it met each tensor; optimizer state that eager created
during the call starts as zeros, which the update formulas treat as eager's first step
does) and must arrive at the second: parameters, gradients, optimizer state and the
returned values. A disagreement or an exception means a compile bug or a side effect the
tracer did not see; the signature then runs eagerly, with a warning.
"""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor
from .trace import _copy

__all__ = ["self_check"]


def _host(a):
    """A device array read back to the host (the self-check runs once per trace)."""
    if a is None or isinstance(a, np.ndarray):
        return a
    from ..backends import backend_for

    return np.asarray(backend_for("cuda").to_host(a))


def _close(got: np.ndarray, want: np.ndarray, terms: int, scale: float) -> bool:
    if got.shape != want.shape:
        return False
    if want.dtype.kind != "f":
        return bool(np.array_equal(got, want))
    bound = 8 * terms * np.finfo(want.dtype).eps * scale
    finite = np.isfinite(want)
    same_special = np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(
        got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    return same_special and bool(np.all(np.abs(got[finite] - want[finite]) <= bound))


def _magnitude(*arrays) -> float:
    m = 0.0
    for a in arrays:
        if a is not None and a.size and a.dtype.kind == "f":
            f = np.abs(a[np.isfinite(a)])
            if f.size:
                m = max(m, float(f.max()))
    return m or 1.0


def self_check(entry, args: tuple, result, after: dict | None = None) -> str | None:
    """None if the generated code reproduces the traced call, else what differed. ``after``:
    the parameters, their .grad and optimizer state as the traced call left them (copies
    taken then, by ``after_state``), for a check made later than that call."""
    program, layout = entry.program, entry.layout
    before = program.before
    leaves = [_copy(before[("leaf", v.slot)]) for v in entry._leaf_values]
    state = []
    for k, slot, key in layout.state:
        old = before.get((k, slot, key))
        if old is None:  # made by eager's first step: zeros are its starting point
            like = before[("leaf", slot)]
            if key == "step":
                old = np.zeros((), np.float32)
            elif isinstance(like, np.ndarray):
                old = np.zeros_like(like)
            else:
                from ..backends import backend_for

                old = backend_for("cuda").full(like.shape, 0, like.dtype)
        state.append(_copy(old))
    grads = [before[("argrad", s[1]) if type(s) is tuple else ("grad", s)]
             for s in layout.entry_grads]
    _, _, hyper, _ = entry._gather()
    run, buffers = entry.module.make(entry.generated.constants)
    tensors = [a._data for a in args if isinstance(a, Tensor)]
    try:
        outs = run(tensors, leaves + state, [None if g is None else _copy(g) for g in grads],
                   hyper)
    except Exception as exc:  # a compile bug: say so, and stay eager
        return f"the generated code failed on the traced call: {type(exc).__name__}: {exc}"
    terms = len(program.events) + max((max(v.shape, default=1) for v in program.values),
                                      default=1)
    checks = []
    for v, got in zip(entry._leaf_values, leaves):
        want = after[("leaf", v.slot)] if after is not None else entry._leaf(v.slot)._data
        checks.append((f"parameter {v.slot}", got, want, before[("leaf", v.slot)]))
    for (k, slot, key), got in zip(layout.state, state):
        if after is not None:
            want = after[("state", k, slot, key)]
        else:
            opt = entry._opts[k]()
            want = opt.state[entry._leaf(slot)][key]._data
        checks.append((f"optimizer state {key} of parameter {slot}", got, want, None))
    for slot, name in layout.final_grads.items():
        if after is not None:
            g = after[("grad", slot)]
        else:
            g = entry._leaf(slot)._grad
            g = None if g is None else g._data
        if (name is None) != (g is None):
            return f"parameter {slot}'s .grad is set in one and not the other"
        if name is not None:
            checks.append((f"gradient of parameter {slot}", buffers[name], g, None))
    n = entry._n_results
    got_grads = iter(outs[n:])
    for i, name in layout.arg_grads:
        g = args[i]._grad
        if (name is None) != (g is None):
            return f"argument {i}'s .grad is set in one and not the other"
        if name is not None:
            checks.append((f"gradient of argument {i}", next(got_grads), g._data, None))
    outs = outs[:n]
    for i, (got, want) in enumerate(zip(outs, _flat(result))):
        if isinstance(want, Tensor):
            checks.append((f"returned value {i}", got, want._data, None))
    for what, got, want, extra in checks:
        got, want, extra = _host(got), _host(want), _host(extra)
        if not _close(np.asarray(got), want, terms, _magnitude(want, extra)):
            return f"{what} differs from eager's on the traced call"
    return None


def _flat(x) -> list:
    if isinstance(x, (tuple, list)):
        return [y for item in x for y in _flat(item)]
    return [x] if isinstance(x, Tensor) else []


def after_state(program) -> dict:
    """Copies of what ``self_check`` compares with (each leaf's array and .grad, the
    optimizers' state tensors of the leaves), taken right after the traced call."""
    from .graph import Step

    after: dict = {}
    leaves = [ref() for ref in program.leaves]
    for slot, t in enumerate(leaves):
        if t is not None:
            after[("leaf", slot)] = _copy(t._data)
            after[("grad", slot)] = None if t._grad is None else _copy(t._grad._data)
    for k, e in enumerate(program.events):
        opt = e.opt() if isinstance(e, Step) else None
        if opt is None:
            continue
        for slot, t in enumerate(leaves):
            for key, v in (opt.state.get(t) or {}).items() if t is not None else ():
                if isinstance(v, Tensor):
                    after[("state", k, slot, key)] = _copy(v._data)
    return after
