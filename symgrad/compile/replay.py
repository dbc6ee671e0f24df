"""Rebuild a traced forward as an eager graph on copies, for ``CompiledStep.verify``.

The verifier reads a recorded autograd graph; the compiled step keeps no graph (that is
its point). So the program's ops up to its first ``backward`` are applied again with the
registered ops, on copies of the current parameters and of the traced call's arguments,
under ``record()``: a graph with every value, and no side effect on the model.

The replay is always on the CPU (NumPy copies; a CUDA step's device arrays are read
back), where the verifier works; the generated code (``check_generated``) runs on copies
on its own device, a CUDA step's plan on device copies.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from ..autograd.function import apply
from ..autograd.grad_mode import no_grad
from ..autograd.record import record
from ..tensor import Tensor
from .graph import Backward, CustomCall, OpCall, Program, Value
from .trace import _copy

__all__ = ["replay", "check_generated", "Disagreement"]


def _host(a) -> np.ndarray:
    """A NumPy copy of a NumPy or CUDA backend array (the caller's array is not touched)."""
    if isinstance(a, np.ndarray):
        return a.copy()
    from ..backends import backend_for

    return np.array(backend_for("cuda").to_host(a))


def replay(program: Program, example: list) -> tuple[Tensor, dict]:
    """(root tensor of the first backward, {"leafN" / "argN": copy}) rebuilt from
    ``program`` on the CPU, on host copies of the parameters (leaf slot N) and of
    ``example`` (the traced call's arguments, NumPy or device arrays; argument N). The
    keys are slots: ``CompiledStep.verify`` names the copies as every view names the
    tensors they stand for (``symgrad._naming``)."""
    tensors: dict[int, Tensor] = {}
    names: dict[str, Tensor] = {}
    for kind, v in program.args:
        if kind == "tensor":
            tensors[v.index] = Tensor._wrap(_host(example[v.slot]))
            tensors[v.index].requires_grad_(v.requires_grad)
            names[f"arg{v.slot}"] = tensors[v.index]
    for v in program.values:
        if v.kind == "leaf":
            t = program.leaves[v.slot]()
            if t is None:
                raise RuntimeError("a parameter of the compiled step was freed")
            copy = Tensor._wrap(_host(t._data))
            copy.requires_grad_(v.requires_grad)
            tensors[v.index] = copy
            names[f"leaf{v.slot}"] = copy

        elif v.kind == "const":
            tensors[v.index] = Tensor._wrap(_host(program.consts[v.slot]))

    def get(x):
        return tensors[x.index] if isinstance(x, Value) else x

    inner = {id(c) for e in program.events if isinstance(e, CustomCall) for c in e.forward}
    with record():
        for event in program.events:
            if isinstance(event, Backward):
                return tensors[event.root.index], names
            if isinstance(event, CustomCall):  # applied again: its node is the Function's
                out = event.cls.apply(*[get(x) for x in event.inputs])
                for v, t in zip(event.outputs, out if isinstance(out, tuple) else (out,)):
                    tensors[v.index] = t
            elif isinstance(event, OpCall) and id(event) not in inner:
                # an op whose outputs did not require grad when traced ran under no_grad
                # (or on constants): no graph through it here either
                with nullcontext() if any(v.requires_grad for v in event.outputs) \
                        else no_grad():
                    out = apply(event.spec, [get(x) for x in event.inputs],
                                {k: get(x) for k, x in event.params.items()})
                for v, t in zip(event.outputs, out if isinstance(out, tuple) else (out,)):
                    tensors[v.index] = t
    raise RuntimeError("the compiled step has no backward() to verify")


def check_generated(program: Program, example: list, make, constants: dict, layout,
                    arrays: list, hyper: list) -> list[str]:
    """Run a fresh instance of the generated code on copies of everything (on its device:
    a CUDA plan on device copies) and compare its gradients with the eager engine's on the
    replayed graph (CPU); returns the disagreements (empty: they agree within float
    rounding). Only for programs with one backward."""
    if sum(isinstance(e, Backward) for e in program.events) != 1:
        return []
    root, names = replay(program, example)
    root.backward()
    run, buffers = make(constants)
    tensors = [_copy(example[v.slot]) for kind, v in program.args if kind == "tensor"]
    outs = run(tensors, [_copy(a) for a in arrays], [None] * len(layout.entry_grads), hyper)
    terms = len(program.events) + max((max(v.shape, default=1) for v in program.values),
                                      default=1)
    problems = []
    got_grads = iter(outs[len(outs) - sum(1 for _, n in layout.arg_grads if n):])
    pairs = [(f"leaf{slot}", name and buffers[name]) for slot, name in
             layout.final_grads.items()]
    pairs += [(f"arg{i}", next(got_grads)) for i, n in layout.arg_grads if n]
    for key, got in pairs:
        leaf = names.get(key)
        if got is None or leaf is None or leaf.grad is None:
            continue
        slot = key
        want, got = leaf.grad._data, _host(got)
        bound = 4 * terms * np.finfo(want.dtype).eps * max(float(np.abs(want).max()), 1e-30)
        err = float(np.abs(got - want).max())
        if not err <= bound:
            buffer = dict((f"leaf{s}", n) for s, n in layout.final_grads.items()).get(key)
            problems.append(Disagreement(
                f"gradient of {slot}: generated code differs from eager by {err:.3g} "
                f"(bound {bound:.3g})", key=key, err=err, bound=bound, buffer=buffer))
    return problems


class Disagreement(str):
    """One gradient where the generated code and eager disagree: the text, with the slot
    key (``leaf0``, ``arg1``), the error and its bound, and the generated buffer (None for
    an argument's gradient, which ``run`` returns)."""

    key: str
    err: float
    bound: float
    buffer: str | None

    def __new__(cls, text: str, *, key: str, err: float, bound: float,
                buffer: str | None) -> Disagreement:
        self = super().__new__(cls, text)
        self.key, self.err, self.bound, self.buffer = key, err, bound, buffer
        return self
