"""The traced program: values, op calls and the step's events, in the order fn ran them.

A training step is not one dataflow graph: ``opt.step()`` changes parameters that later
ops may read, and ``loss.backward()`` writes ``.grad``. So the trace is a list of events
(op call, backward, zero_grad, optimizer step) replayed in order by the generated code.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Value", "OpCall", "CustomCall", "Backward", "ZeroGrad", "Step", "Program"]


class Unsupported(Exception):
    """The program uses something the code generator has no rule for (the message says)."""


@dataclass(eq=False)
class Value:
    """One array of the program: an argument, a leaf read from outside fn, or an op output."""

    index: int
    shape: tuple
    dtype: np.dtype
    requires_grad: bool
    #: "arg" (fn's positional tensor ``slot``), "leaf" (``Program.leaves[slot]``), "op",
    #: "const" (``Program.consts[slot]``: made inside fn by a deterministic creation function)
    kind: str
    slot: int = -1

    @property
    def name(self) -> str:
        return f"v{self.index}"


@dataclass(eq=False)
class OpCall:
    """One ``apply(spec, inputs, params)`` as fn ran it (tensors replaced by Values)."""

    spec: Any
    inputs: list
    params: dict
    outputs: list

    @property
    def tensor_inputs(self) -> list:
        return [x for x in self.inputs if isinstance(x, Value)]

    def incoming(self, has_grad) -> list:
        """``(out, v, from_grad)`` per output that the traced backward took a gradient
        value ``v`` for: the output's gradient (``from_grad``) or zeros. ``has_grad(out)``
        says whether a gradient reaches ``out`` now; if that differs from the traced call,
        Unsupported (the replayed backward would see other inputs than eager's did)."""
        pairs = []
        for out, gi in zip(self.outputs, self.grad_inputs):
            reached = has_grad(out)
            if gi is None or (gi[1] == "grad") != reached:
                if gi is None and not reached:
                    continue
                raise Unsupported(f"custom Function {self.cls.__name__}: gradients reach its "
                                  "outputs differently than in the traced call")
            pairs.append((out, gi[0], gi[1] == "grad"))
        return pairs


@dataclass(eq=False)
class CustomCall:
    """One ``Function.apply`` (a custom autograd Function) as fn ran it.

    Its forward's ops are ordinary OpCalls recorded just before this event (they ran
    under no_grad, so none of them is on the gradient path); ``outputs[k]`` is the
    Function's output ``k``, the same array as ``sources[k]`` (an inner op's output or an
    input returned as it is). The ops the user's ``backward`` ran when ``loss.backward()``
    reached this node are ``backward_ops``: on ``grad_inputs`` (one per output: a Value
    standing for the incoming gradient, or None where backward saw None) and the forward's
    values (``ctx.saved_tensors`` and tensors kept on ctx are the traced values), giving
    ``grad_outputs`` (one per tensor argument, in ``positions`` order: a Value or None).
    Non-tensor ctx attributes are constants of the trace."""

    cls: Any
    inputs: list
    outputs: list
    sources: list
    forward: list
    #: forward argument position of each tensor argument (the node's edges)
    positions: tuple = ()
    #: per output: (Value, "grad" | "zeros") or None; None before backward reached it
    grad_inputs: list | None = None
    backward_ops: list | None = None
    grad_outputs: list | None = None

    @property
    def tensor_inputs(self) -> list:
        return [x for x in self.inputs if isinstance(x, Value)]

    def incoming(self, has_grad) -> list:
        """``(out, v, from_grad)`` per output that the traced backward took a gradient
        value ``v`` for: the output's gradient (``from_grad``) or zeros. ``has_grad(out)``
        says whether a gradient reaches ``out`` now; if that differs from the traced call,
        Unsupported (the replayed backward would see other inputs than eager's did)."""
        pairs = []
        for out, gi in zip(self.outputs, self.grad_inputs):
            reached = has_grad(out)
            if gi is None or (gi[1] == "grad") != reached:
                if gi is None and not reached:
                    continue
                raise Unsupported(f"custom Function {self.cls.__name__}: gradients reach its "
                                  "outputs differently than in the traced call")
            pairs.append((out, gi[0], gi[1] == "grad"))
        return pairs


@dataclass(eq=False)
class Backward:
    """``root.backward()``: gradients of the leaves reached from ``root``."""

    root: Value


@dataclass(eq=False)
class ZeroGrad:
    """``zero_grad(set_to_none=True)`` over these leaf slots."""

    leaves: list


@dataclass(eq=False)
class Step:
    """``optimizer.step()``: ``kind`` is "sgd" or "adam"; ``opt`` is held weakly."""

    kind: str
    opt: weakref.ref
    #: per param group: the leaf slots of its params, in the group's order
    groups: list


@dataclass(eq=False)
class Program:
    events: list = field(default_factory=list)
    values: list = field(default_factory=list)
    #: weak references to the tensors read from outside fn (parameters, buffers)
    leaves: list = field(default_factory=list)
    #: the arrays of the "const" values (creation functions inside fn), in slot order
    consts: list = field(default_factory=list)
    #: fn's positional arguments: ("tensor", Value) or ("const", python value)
    args: list = field(default_factory=list)
    #: fn's result: a nested structure of Values / python constants ("tuple", [...]) etc.
    result: Any = None
    #: copies of the leaves, their .grad and the optimizer state as they were before fn
    #: changed them (("leaf", slot), ("grad", slot), (step event, slot, key)); used once by
    #: the self-check after generation, then dropped
    before: dict = field(default_factory=dict)
    #: guards.Constants: the Python values the trace read (module attributes, globals)
    constants: Any = None
    #: the device type of every tensor fn read ("cpu" or "cuda"; None: none read)
    device: Any = None

    def new_value(self, shape, dtype, requires_grad: bool, kind: str, slot: int = -1) -> Value:
        v = Value(len(self.values), tuple(shape), np.dtype(dtype), bool(requires_grad), kind,
                  slot)
        self.values.append(v)
        return v

    def ops(self) -> list:
        return [e for e in self.events if isinstance(e, OpCall)]

    def customs(self) -> list:
        return [e for e in self.events if isinstance(e, CustomCall)]


def ancestors(ops: list, root: Value) -> set:
    """Values that gradient reaches from ``root`` (those requiring grad that it depends on)."""
    producer = {v.index: c for c in ops for v in c.outputs}
    need, todo = set(), [root]
    while todo:
        v = todo.pop()
        if v.index in need or not v.requires_grad:
            continue
        need.add(v.index)
        call = producer.get(v.index)
        if call is not None:
            todo.extend(call.tensor_inputs)
    return need
