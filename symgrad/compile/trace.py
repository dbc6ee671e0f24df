"""Run fn once eagerly and record what it did, through the profiler's hook in ``apply``.

``symgrad.autograd.function._profiler`` is the one zero-cost hook of the op path: every
op, in-place method, custom Function and backward node calls it when it is set. The
tracer plugs in there (no core file changes), and for the few calls that bypass ``apply``
(``backward``, ``zero_grad``, ``opt.step``, reading a value into Python, hooks) it wraps
the methods for the duration of the run only. Nothing is ever raised into fn: an
untraceable thing only records its reason, fn's eager run finishes untouched, and the
caller falls back to eager for this signature.

An in-place method (``h.relu_()``, ``h.add_(b)``) on a tensor fn computed, that is no view
and has none, is recorded as its out-of-place op: a new Value, to which the tensor is
rebound (later reads of the same tensor object see the new value, earlier ones kept the
old one, as the array's contents were in eager). See :meth:`Tracer._inplace`.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import numpy as np

from ..autograd import function as _fn
from ..autograd.anomaly_mode import _anomaly
from ..functional import _INITIALISERS
from ..nn import init as _init
from ..nn.modules import Module
from ..optim.adam import Adam
from ..optim.optimizer import Optimizer
from ..optim.sgd import SGD
from ..tensor import Tensor
from .graph import Backward, CustomCall, OpCall, Program, Step, ZeroGrad
from .guards import Constants

__all__ = ["Tracer", "trace"]

#: Tensor methods that hand a value to Python (so fn may branch on it) or register hooks.
_VALUE_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__",
                "__array__", "__repr__", "__format__", "register_hook", "retain_grad")

#: Types of module attributes whose reads are guarded (a tuple's items are checked later).
_GUARDABLE = frozenset((int, float, bool, str, type(None), tuple))

#: In-place random initialisers (``uniform_`` ...): the numbers drawn are a constant of the
#: traced call, not an op of the step.
_RANDOM_INPLACE = frozenset(f.__name__ for f in _INITIALISERS)

#: Scalar types a param or input may hold and be baked into the generated code.
_CONSTANTS = (int, float, bool, str, type(None), slice, type(Ellipsis))


def _constant(x: Any) -> bool:
    if isinstance(x, _CONSTANTS):
        return True
    if isinstance(x, (tuple, list)):
        return all(_constant(y) for y in x)
    return type(x).__module__ == "symgrad.dtypes"  # a dtype param (to_copy)


class _Patches:
    """Replace attributes of classes for the duration of a trace, then put them back."""

    def __init__(self) -> None:
        self._saved: list = []

    def put(self, owner, name: str, value) -> None:
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, value)

    def undo(self) -> None:
        for owner, name, old in reversed(self._saved):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
        self._saved.clear()


_MISSING = object()


def _optimizer_classes() -> list:
    out, todo = [], [Optimizer]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo.extend(cls.__subclasses__())
    return out


class Tracer:
    """The profiler stand-in that records ops into a :class:`Program`."""

    def __init__(self, args: tuple) -> None:
        self.program = Program()
        self.reason: str | None = None
        self._values: dict[int, Any] = {}  # id(tensor) -> Value
        #: id -> weak reference of each bound tensor: its entry (and its _values entry)
        #: goes when it dies, so an id is never reused under a stale value, and the traced
        #: call keeps no tensor alive that eager would have freed (eager's in-place checks
        #: read whether a view's base is still alive)
        self._refs: dict[int, weakref.ref] = {}
        #: custom Functions' ctx objects (their ids key _customs)
        self._keep: list = []
        self._leaf_slots: dict[int, int] = {}
        #: id -> weakref of every tensor made during the run (not a WeakSet: its membership
        #: test compares with ==, which is an op on tensors)
        self._born: dict[int, weakref.ref] = {}
        self._quiet = 0  # > 0 inside backward / optimizer calls: their ops are not fn's
        #: where ops go while a custom Function's backward runs (None: program.events)
        self._sink: list | None = None
        #: id(ctx) -> (CustomCall, Value of each ctx.save_for_backward entry)
        self._customs: dict[int, tuple] = {}
        #: per custom Function forward running: (ids of its tensor arguments, ids of those
        #: it changed in place while they required grad: they must be ctx.mark_dirty'd)
        self._forwards: list[tuple[set, set]] = []
        #: the modules whose forward ran in fn (the globals their forward reads are guarded)
        self.modules: dict[int, Module] = {}
        #: id(module) -> (module, names of its scalar instance attributes fn read)
        self.reads: dict[int, tuple] = {}
        for i, a in enumerate(args):
            if isinstance(a, Tensor):
                if a._grad_fn is not None:
                    self.fail(f"argument {i} is not a leaf (it has a graph from outside fn)")
                elif a._requires_grad and id(a) in self._values:
                    self.fail(f"argument {i} requires grad and is passed twice")
                elif a._requires_grad and a._backward_hooks:
                    self.fail(f"a hook on argument {i}")
                grad = a._requires_grad
                v = self.program.new_value(a._data.shape, a._data.dtype, grad, "arg", i)
                if grad:  # its .grad before fn, for the self-check of the generated code
                    self.program.before[("argrad", i)] = None if a._grad is None else \
                        _copy(a._grad._data)
                self._bind(a, v)
                self.device(a)
                self.program.args.append(("tensor", v))
            elif _constant(a):
                self.program.args.append(("const", a))
            else:
                self.fail(f"argument {i} of type {type(a).__name__} (tensors and Python "
                          "scalars only)")

    # -- bookkeeping ---------------------------------------------------------------------
    def fail(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def device(self, t) -> None:
        """Every tensor fn reads from outside is on one device (the program's)."""
        kind = t._device.type
        if self.program.device is None:
            self.program.device = kind
        elif kind != self.program.device:
            self.fail(f"tensors on several devices ({self.program.device} and {kind})")
        if kind not in ("cpu", "cuda"):
            self.fail(f"{kind} tensors (compiled: cpu, cuda)")

    def _bind(self, t, v) -> None:
        key = id(t)
        self._values[key] = v
        if key not in self._refs:
            self._refs[key] = weakref.ref(t, _forget(weakref.ref(self), key))

    def leaf(self, t) -> Any:
        """The Value of a tensor fn read from outside (a parameter, a buffer)."""
        v = self._values.get(id(t))
        if v is not None:
            return v
        born = self._born.get(id(t))
        if born is not None and born() is t:
            self.fail("a tensor made inside fn outside the traced ops (a creation function, "
                      ".grad, .detach(), optimizer state)")
        elif t._grad_fn is not None:
            self.fail("a tensor with a graph computed outside fn")
        self.device(t)
        slot = len(self.program.leaves)
        self.program.leaves.append(weakref.ref(t))
        # the values before fn touched them, for the self-check of the generated code
        self.program.before[("leaf", slot)] = _copy(t._data)
        self.program.before[("grad", slot)] = None if t._grad is None else _copy(t._grad._data)
        v = self.program.new_value(t._data.shape, t._data.dtype, t._requires_grad, "leaf", slot)
        self._leaf_slots[id(t)] = slot
        self._bind(t, v)
        return v

    def constant(self, t) -> None:
        """A tensor a deterministic creation function made inside fn: a constant Value
        (its array, copied, is baked into the generated code)."""
        self.device(t)
        v = self.program.new_value(t._data.shape, t._data.dtype, False, "const",
                                   len(self.program.consts))
        self.program.consts.append(_copy(t._data))
        self._bind(t, v)

    def _slot(self, t) -> int:
        """The leaf slot of a tensor whose .grad or optimizer state fn changes (an argument
        that requires grad is not a parameter: its .grad is accumulated only)."""
        v = self.leaf(t)
        if v.kind != "leaf":
            self.fail(f"argument {v.slot} of fn is zeroed or updated inside fn (compiled: its "
                      ".grad is accumulated by backward only)")
            return -1
        return v.slot

    def _operand(self, x) -> Any:
        if isinstance(x, Tensor):
            return self.leaf(x)
        if not _constant(x):
            self.fail(f"an op argument of type {type(x).__name__}")
        return x

    # -- the profiler protocol (symgrad.autograd.function._profiler) ----------------------
    def _record_op(self, spec, inputs, params):
        out = self._run_quiet(_fn.apply, spec, inputs, params)
        if self._quiet:
            return out
        if _anomaly.enabled:
            self.fail("anomaly mode is on")
        call = OpCall(spec, [self._operand(x) for x in inputs],
                      {k: self._operand(v) for k, v in (params or {}).items()}, [])
        for t in (out if isinstance(out, tuple) else (out,)):
            v = self.program.new_value(t._data.shape, t._data.dtype, t._requires_grad, "op")
            self._bind(t, v)
            call.outputs.append(v)
        (self.program.events if self._sink is None else self._sink).append(call)
        return out

    def _record_call(self, name, kind, inputs, fn, *args, quiet=False, sequence_nr=-1):
        if kind == "function" and not self._quiet and self._sink is None:
            return self._custom_forward(fn, *args)
        if not self._quiet:
            if kind == "function":
                self.fail(f"custom autograd Function {name} called inside another custom "
                          "Function's backward")
            else:
                return self._inplace(name.removeprefix("symgrad::"), inputs, fn, args)
        return self._run_quiet(fn, *args)

    # -- in-place ops ---------------------------------------------------------------------
    def _inplace(self, method: str, inputs, fn, args: tuple):
        """``target.<method>(...)``: eager runs it (its errors are eager's), then the op it
        stands for runs out of place on a copy of the old values, bound to the target's old
        Value, through the tracer: its OpCalls are recorded as fn's and the target is
        rebound to their result. Where that rewrite could differ from eager (a view, state
        outside fn, another dtype, other values) the signature falls back instead."""
        target = inputs[0] if inputs else None
        reason = self._inplace_refusal(method, target, fn, args)
        if reason is not None:
            self.fail(f"in-place op {method} {reason}")
            return self._run_quiet(fn, *args)
        old = self._values[id(target)]
        requires_grad = target._requires_grad
        before = _copy(target._data)
        out = self._run_quiet(fn, *args)  # eager's in-place op, on the real tensor
        if self.reason is not None:
            return out
        stand_in = Tensor._wrap(before, target._device)
        stand_in._requires_grad = requires_grad
        self._bind(stand_in, old)
        try:
            result = args[2](stand_in)  # the out-of-place op: recorded by _record_op
        except Exception as exc:  # eager did it in place; the rewrite cannot
            self.fail(f"in-place op {method}: its out-of-place form failed "
                      f"({type(exc).__name__}: {exc})")
            return out
        new = self._values.get(id(result)) if isinstance(result, Tensor) else None
        if new is None:
            self.fail(f"in-place op {method}: its out-of-place form gave no traced tensor")
            return out
        if new.shape != old.shape or new.dtype != old.dtype:
            self.fail(f"in-place op {method}: the out-of-place result is {new.dtype} "
                      f"{list(new.shape)}, eager casts it into {old.dtype} {list(old.shape)}")
            return out
        if not _same(result._data, target._data):
            self.fail(f"in-place op {method}: its out-of-place op gives other values than "
                      "the in-place kernel")
            return out
        if new.requires_grad != bool(target._requires_grad):
            forward = self._forwards[-1] if self._forwards else None
            if forward is not None and id(target) in forward[0] and not new.requires_grad:
                forward[1].add(id(target))  # a custom Function's input: ctx.mark_dirty?
            else:
                self.fail(f"in-place op {method} under no_grad (or not differentiable) on a "
                          "tensor that requires grad: it keeps its old grad_fn")
                return out
        self._bind(target, new)
        return out

    def _inplace_refusal(self, method: str, target, fn, args: tuple) -> str | None:
        """Why ``target.<method>(...)`` cannot be recorded as its out-of-place op (None: it
        can)."""
        if (getattr(fn, "__func__", None) is not Tensor.__dict__.get("_inplace_impl")
                or len(args) != 7 or not callable(args[2]) or not isinstance(target, Tensor)):
            return "(no compile rule for this in-place call)"
        if method in _RANDOM_INPLACE:
            return "draws random numbers (in-place random initialisers are not compiled)"
        if self._sink is not None:
            return "inside a custom Function's backward (it may change the engine's gradient)"
        v = self._values.get(id(target))
        if v is None:
            born = self._born.get(id(target))
            if born is not None and born() is target:
                return ("on a tensor made inside fn outside the traced ops (a creation "
                        "function, .grad, .detach(), .data)")
            return ("on a tensor from outside fn (a parameter, buffer or other state: a side "
                    "effect outside the trace)")
        if v.kind == "arg":
            return f"on argument {v.slot} of fn (a side effect outside the trace)"
        if v.kind == "leaf":
            return ("on a parameter or a tensor read from outside fn (a side effect outside "
                    "the trace)")
        if v.kind == "const":
            return "on a tensor a creation function made inside fn (a constant of the trace)"
        if self._aliased(target):
            return ("on a view or on a tensor that has views (they would see the change; "
                    "the out-of-place rewrite would not)")
        return None

    def _aliased(self, target) -> bool:
        """Does another live tensor of this run share ``target``'s memory? Traced tensors
        and every tensor made during the run (``.detach()``, ``.data``, aliases). One that
        died cannot see the change; one a backward node saved is version checked by eager
        (the traced call raises eager's error)."""
        storage, data = target._storage, target._data
        seen = {id(target)}
        refs = list(self._refs.values()) + list(self._born.values())
        for t in (r() for r in refs):
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            if t._storage is storage or _overlap(t._data, data):
                return True
        return False

    # -- custom autograd Functions --------------------------------------------------------
    def _custom_forward(self, fn, cls, args: tuple, kwargs: dict):
        """``cls.apply(*args)``: its forward's ops are recorded as fn's own (they run under
        no_grad, as in eager), then one CustomCall stands for the Function; its backward is
        recorded when ``loss.backward()`` reaches the node (``custom_backward``)."""
        name = cls.__name__
        if kwargs:
            self.fail(f"custom Function {name} called with keyword arguments")
            return self._run_quiet(fn, cls, args, kwargs)
        operands = [self._operand(a) for a in args]
        start = len(self.program.events)
        changed: set = set()
        self._forwards.append(({id(a) for a in args if isinstance(a, Tensor)}, changed))
        try:
            out = fn(cls, args, kwargs)
        finally:
            self._forwards.pop()
        inner = self.program.events[start:]
        if any(not isinstance(e, OpCall) for e in inner):
            self.fail(f"custom Function {name}'s forward calls backward, zero_grad or an "
                      "optimizer")
            return out
        outs = out if isinstance(out, tuple) else (out,)
        if any(not isinstance(o, Tensor) for o in outs):
            self.fail(f"custom Function {name} returns a non-tensor")
            return out
        ctx = next((o._grad_fn for o in outs if isinstance(o._grad_fn, _fn.BackwardCFunction)
                    and o._grad_fn._forward_cls is cls), None)
        if ctx is None:  # nothing required grad: only the forward's ops matter
            if changed:
                self.fail(f"custom Function {name} changes an input in place")
            return out
        reason = self._dirty_refusal(ctx, args, operands, outs, changed)
        if reason is not None:
            self.fail(f"custom Function {name} {reason}")
            return out
        sources = []
        for o in outs:
            src = self._values.get(id(o))
            if src is None:  # an input returned as it is: a new tensor over its array
                src = next((self._values[id(a)] for a in args
                            if isinstance(a, Tensor) and a._data is o._data), None)
            if src is None:
                self.fail(f"custom Function {name} returns a tensor not computed by traced "
                          "ops")
                return out
            sources.append(src)
        values = []
        for o in outs:
            v = self.program.new_value(o._data.shape, o._data.dtype, o._requires_grad, "op")
            self._bind(o, v)
            values.append(v)
        saved = []
        for s in ctx._saved or ():
            if s is None:
                saved.append(None)
            elif s._unpack is not None:
                self.fail(f"saved-tensor hooks on custom Function {name}")
                return out
            elif s.output_nr >= 0:
                saved.append(values[s.output_nr])
            else:
                saved.append(self._operand(s._tensor))
        call = CustomCall(cls, operands, values, sources, inner, ctx._tensor_positions)
        self._customs[id(ctx)] = (call, saved)
        self._keep.append(ctx)
        self.program.events.append(call)
        return out

    def _dirty_refusal(self, ctx, args, operands, outs, changed: set) -> str | None:
        """``ctx.mark_dirty``: compiled where each dirty tensor is an input fn computed (no
        view, none alive) that the Function returns; its in-place ops in the forward were
        recorded out of place (``_inplace``), so the output is a new Value over the last."""
        dirty = {id(t) for t in ctx.dirty_tensors}
        if changed - dirty:
            return ("changes an input that requires grad in place without ctx.mark_dirty "
                    "(eager keeps its old grad_fn)")
        values = {id(a): v for a, v in zip(args, operands) if isinstance(a, Tensor)}
        for t in ctx.dirty_tensors:
            v = values.get(id(t))
            if v is None:
                return "marks a tensor dirty that is not one of its inputs"
            if not any(o is t for o in outs):
                return "marks an input dirty that it does not return"
            if v.kind != "op":
                return ("marks dirty an argument of fn or a tensor from outside fn (a side "
                        "effect outside the trace)")
            if self._aliased(t):
                return "marks dirty a view or a tensor that has views"
        return None

    def saved_tensors(self, fget, node) -> tuple:
        """``ctx.saved_tensors`` in a traced backward: a saved output unpacks as a new
        tensor, which is the traced value it was saved from."""
        tensors = fget(node)
        rec = self._customs.get(id(node))
        if rec is not None and self._sink is not None:
            for t, v in zip(tensors, rec[1]):
                if t is not None and v is not None:
                    self._bind(t, v)
        return tensors

    def custom_backward(self, original, node, grads, needed):
        """The engine running a traced custom Function's backward: its ops are recorded
        into the CustomCall (the generated backward replays them)."""
        rec = self._customs.get(id(node))
        if rec is None or self._sink is not None or not self._quiet:
            return original(node, grads, needed)
        call = rec[0]
        name = call.cls.__name__
        if call.backward_ops is not None:
            self.fail(f"backward through custom Function {name} twice (retain_graph)")
            return original(node, grads, needed)
        grads = list(grads)
        grad_inputs: list = []
        for k, g in enumerate(grads):
            how = "grad"
            if g is None:
                meta = node._out_meta[k]
                if not node.materialize_grads or meta is None:
                    grad_inputs.append(None)
                    continue
                g = grads[k] = Tensor._wrap(np.zeros(meta[0], meta[1].np))  # as eager does
                how = "zeros"
            v = self.program.new_value(g._data.shape, g._data.dtype, False, "op")
            self._bind(g, v)
            grad_inputs.append((v, how))
        sink: list = []
        quiet, profiler = self._quiet, _fn._profiler
        self._quiet, self._sink, _fn._profiler = 0, sink, self
        try:
            outs = original(node, grads, needed)
        finally:
            self._quiet, self._sink, _fn._profiler = quiet, None, profiler
        grad_outputs = []
        for g in outs:
            v = None if g is None else self._values.get(id(g))
            if g is not None and v is None:
                self.fail(f"custom Function {name}'s backward returns a tensor not computed "
                          "by traced ops")
            grad_outputs.append(v)
        call.grad_inputs, call.backward_ops, call.grad_outputs = grad_inputs, sink, grad_outputs
        return outs

    def _record_node(self, node, fn, *args):
        if not self._quiet:
            self.fail("autograd.grad / autograd.backward called directly")
        return self._run_quiet(fn, *args)

    def _run_quiet(self, fn, *args):
        _fn._profiler = None
        try:
            return fn(*args)
        finally:
            _fn._profiler = self

    # -- calls that bypass apply ----------------------------------------------------------
    def _quietly(self, fn, *args, **kwargs):
        self._quiet += 1
        try:
            return self._run_quiet(fn, *args, **kwargs) if not kwargs else \
                self._run_quiet(lambda: fn(*args, **kwargs))
        finally:
            self._quiet -= 1

    def backward(self, original, t, gradient=None, retain_graph=None, create_graph=False,
                 inputs=None):
        if not self._quiet:
            if gradient is not None or create_graph or inputs is not None:
                self.fail("backward(gradient=/create_graph=/inputs=)")
            v = self._values.get(id(t))
            if v is None or v.kind != "op":
                self.fail("backward() on a tensor not computed inside fn")
            else:
                self._check_hooks(t)
                self.program.events.append(Backward(v))
        try:
            return self._quietly(original, t, gradient, retain_graph, create_graph, inputs)
        except Exception as exc:  # fn may catch it; the trace holds a backward eager did not
            self.fail(f"backward() raised {type(exc).__name__}")
            raise

    def _check_hooks(self, root) -> None:
        """Hooks on the graph below ``root`` (registered before fn ran) run Python code."""
        seen, todo = set(), [root._grad_fn]
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node._pre_hooks or node._hooks or node._tensor_hooks:
                self.fail(f"hooks on {node.name()}")
            var = getattr(node, "variable", None)
            if var is not None and var._backward_hooks:
                self.fail("a hook on a parameter")
            todo.extend(fn for fn, _ in node.next_functions)

    def set_grad(self, fset, t, value) -> None:
        """``p.grad = None`` is a zero_grad of one leaf; any other assignment is untraced."""
        if not self._quiet:
            v = self._values.get(id(t))
            if value is None and v is not None and v.kind == "arg":
                if v.requires_grad:  # an argument's .grad = None: arg_grads says so
                    self.program.events.append(ZeroGrad([("arg", v.slot)]))
            elif value is None:
                self.program.events.append(ZeroGrad([self._slot(t)]))
            else:
                self.fail("assigning a tensor to .grad")
        fset(t, value)

    def set_data(self, fset, t, value) -> None:
        if not self._quiet:
            self.fail("assigning .data")
        fset(t, value)

    def zero_grad(self, original, owner, set_to_none=True):
        if not self._quiet:
            if not set_to_none:
                self.fail("zero_grad(set_to_none=False)")
            params = ([p for g in owner.param_groups for p in g["params"]]
                      if isinstance(owner, Optimizer) else list(owner.parameters()))
            self.program.events.append(ZeroGrad([self._slot(p) for p in params]))
        return self._quietly(original, owner, set_to_none)

    def step(self, original, opt, closure=None):
        if not self._quiet:
            reason = _unsupported_optimizer(opt, closure)
            if reason:
                self.fail(reason)
            else:
                kind = "adam" if isinstance(opt, Adam) else "sgd"
                groups = [[self._slot(p) for p in g["params"]] for g in opt.param_groups]
                k = len(self.program.events)
                self.program.events.append(Step(kind, weakref.ref(opt), groups))
                for g, slots in zip(opt.param_groups, groups):
                    for p, slot in zip(g["params"], slots):
                        for key, value in opt.state.get(p, {}).items():
                            if isinstance(value, Tensor):
                                self.program.before[(k, slot, key)] = _copy(value._data)
        return self._quietly(original, opt, closure)

    def install(self, patches: _Patches) -> None:
        tracer = self
        orig_backward = Tensor.backward
        patches.put(Tensor, "backward", lambda t, *a, **k: tracer.backward(orig_backward, t,
                                                                           *a, **k))
        for name in _VALUE_READS:
            patches.put(Tensor, name, _value_read(tracer, name, getattr(Tensor, name)))
        grad_prop, data_prop = Tensor.__dict__["grad"], Tensor.__dict__["data"]
        patches.put(Tensor, "grad", property(grad_prop.fget, lambda t, value: tracer.set_grad(
            grad_prop.fset, t, value)))
        patches.put(Tensor, "data", property(data_prop.fget, lambda t, value: tracer.set_data(
            data_prop.fset, t, value)))
        orig_wrap = Tensor.__dict__["_wrap"].__func__

        def _wrap(cls, *a, **k):
            t = orig_wrap(cls, *a, **k)
            tracer._born[id(t)] = weakref.ref(t)
            return t

        patches.put(Tensor, "_wrap", classmethod(_wrap))
        custom = _fn.BackwardCFunction
        orig_apply = custom.apply
        patches.put(custom, "apply", lambda node, grads, needed: tracer.custom_backward(
            orig_apply, node, grads, needed))
        saved_fget = custom.__dict__["saved_tensors"].fget
        saved = property(lambda node: tracer.saved_tensors(saved_fget, node))
        patches.put(custom, "saved_tensors", saved)
        patches.put(custom, "saved_variables", saved)
        for cls in (Optimizer, Module):
            orig_zero = cls.__dict__["zero_grad"]
            patches.put(cls, "zero_grad", _zero_wrapper(tracer, orig_zero))
        for cls in _optimizer_classes():
            if "step" in cls.__dict__:
                patches.put(cls, "step", _step_wrapper(tracer, cls.__dict__["step"]))
        orig_hooks = Module._call_with_hooks

        def _call_with_hooks(module, args, kwargs):
            if not tracer._quiet:
                tracer.fail(f"hooks on module {type(module).__name__}")
            return orig_hooks(module, args, kwargs)

        patches.put(Module, "_call_with_hooks", _call_with_hooks)
        orig_call = Module.__call__

        def _call(module, *args, **kwargs):
            if not tracer._quiet:
                tracer.modules[id(module)] = module
            return orig_call(module, *args, **kwargs)

        patches.put(Module, "__call__", _call)
        get_attribute = object.__getattribute__

        def _getattribute(module, name):
            value = get_attribute(module, name)
            if (not tracer._quiet and type(value) in _GUARDABLE and not name.startswith("__")
                    and name in get_attribute(module, "__dict__")):
                tracer.reads.setdefault(id(module), (module, set()))[1].add(name)
            return value

        patches.put(Module, "__getattribute__", _getattribute)
        # writes into a tensor's array that do not pass apply: x[i] = v, nn.init
        orig_setitem = Tensor.__setitem__

        def _setitem(t, index, value):
            if not tracer._quiet:
                tracer.fail("x[index] = value (in-place indexing)")
            return orig_setitem(t, index, value)

        patches.put(Tensor, "__setitem__", _setitem)
        # deterministic creation functions (arange, zeros, full ...): their tensor is a
        # constant of the trace (its arguments are shapes and Python values, fixed by the
        # signature and guards), e.g. the positions of a GPT or attention's causal mask
        from .. import _tensor_layer, creation

        # the package's own attributes too (sg.arange): it is loaded, being our parent, so
        # it is read from sys.modules rather than imported from below
        _sg = sys.modules[__name__.split(".")[0]]
        for name in _CREATORS:
            orig = getattr(creation, name)
            wrapper = _creator(tracer, orig)
            for owner in (creation, _sg, _tensor_layer):
                if owner.__dict__.get(name) is orig:
                    patches.put(owner, name, wrapper)
        # changes of a tensor's place in the graph that do not pass apply either
        orig_detach_ = Tensor.detach_

        def _detach_(t):
            if not tracer._quiet and (t._requires_grad or t._grad_fn is not None):
                tracer.fail("detach_() inside fn (changes a tensor's graph in place)")
            return orig_detach_(t)

        patches.put(Tensor, "detach_", _detach_)
        orig_requires_grad_ = Tensor.requires_grad_

        def _requires_grad_(t, requires_grad=True):
            if not tracer._quiet and bool(requires_grad) != t._requires_grad:
                tracer.fail("requires_grad_() inside fn changes a tensor's requires_grad")
            return orig_requires_grad_(t, requires_grad)

        patches.put(Tensor, "requires_grad_", _requires_grad_)
        orig_write = _init._write

        def _write(tensor, values):
            if not tracer._quiet:
                tracer.fail("an nn.init initializer inside fn (writes in place)")
            return orig_write(tensor, values)

        patches.put(_init, "_write", _write)


def _forget(tracer_ref, key: int):
    """The callback of a bound tensor's weak reference: drop its id's entries (the tracer
    is held weakly: no reference cycle keeps it or its Values alive)."""
    def forget(_ref) -> None:
        tracer = tracer_ref()
        if tracer is not None:
            tracer._values.pop(key, None)
            tracer._refs.pop(key, None)

    return forget


def _value_read(tracer, name, original):
    def read(t, *a, **k):
        if not tracer._quiet:
            tracer.fail(f"Tensor.{name}() inside fn (reads a value into Python, or "
                        "registers a hook)")
        return original(t, *a, **k)

    return read


def _zero_wrapper(tracer, original):
    return lambda owner, set_to_none=True: tracer.zero_grad(original, owner, set_to_none)


def _step_wrapper(tracer, original):
    return lambda opt, closure=None: tracer.step(original, opt, closure)


def _copy(a):
    """A copy of a tensor's array on its own device (NumPy or the CUDA backend's)."""
    if isinstance(a, np.ndarray):
        return a.copy()
    from ..backends import backend_for

    return backend_for("cuda").copy(a)


def _same(a, b) -> bool:
    """Bit for bit the same values (NaN where NaN), on the host."""
    a, b = _host(a), _host(b)
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def _host(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    from ..backends import backend_for

    return np.asarray(backend_for("cuda").to_host(a))


def _overlap(a, b) -> bool:
    """May arrays ``a`` and ``b`` share memory? (A CUDA array: the same device block.)"""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and \
            bool(np.may_share_memory(a, b))
    block = getattr(a, "block", None)
    return block is None or block is getattr(b, "block", None)


def _unsupported_optimizer(opt, closure) -> str | None:
    if closure is not None:
        return "optimizer.step(closure)"
    name = type(opt).__name__
    if type(opt) not in (SGD, Adam) and type(opt).__name__ != "AdamW":
        return f"optimizer {name} (compiled: SGD, Adam, AdamW)"
    for g in opt.param_groups:
        if g.get("maximize") or g.get("amsgrad") or g.get("differentiable"):
            return f"{name} with maximize/amsgrad/differentiable"
        if isinstance(opt, SGD) and (g["nesterov"] or g["dampening"] != 0):
            return "SGD with nesterov or dampening"
        for p in g["params"]:
            if p._device.type not in ("cpu", "cuda"):
                return f"{p._device.type} tensors (compiled: cpu, cuda)"
    return None


def _structure(x, tracer: Tracer):
    """fn's result with each tensor replaced by its Value."""
    if isinstance(x, Tensor):
        v = tracer._values.get(id(x))
        if v is None:
            tracer.fail("fn returned a tensor made outside the traced ops")
        return ("value", v)
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, [_structure(y, tracer) for y in x])
    if _constant(x):
        return ("const", x)
    tracer.fail(f"fn returned a {type(x).__name__}")
    return ("const", None)


#: creation functions whose result depends only on their (Python) arguments
_CREATORS = ("arange", "zeros", "ones", "full", "eye", "linspace", "zeros_like", "ones_like",
             "full_like")


def _creator(tracer: Tracer, orig):
    def made(*args, **kwargs):
        t = orig(*args, **kwargs)
        if not tracer._quiet and tracer._sink is None and isinstance(t, Tensor) and \
                not t._requires_grad and id(t) not in tracer._values:
            tracer.constant(t)
        return t
    return made


def trace(fn, args: tuple) -> tuple[Any, Program | None, str | None]:
    """Run ``fn(*args)`` eagerly while recording it: (result, program, reason it failed)."""
    if _fn._profiler is not None:
        return fn(*args), None, "the profiler is active"
    tracer = Tracer(args)
    if _anomaly.enabled:
        tracer.fail("anomaly mode is on")
    patches = _Patches()
    tracer.install(patches)
    _fn._profiler = tracer
    try:
        result = fn(*args)
    finally:
        _fn._profiler = None
        patches.undo()
    tracer.program.result = _structure(result, tracer)
    tracer.program.constants = Constants(fn, tracer.modules.values(), tracer.reads.values())
    tracer.modules.clear()
    tracer.reads.clear()
    tracer._keep.clear()
    tracer._refs.clear()
    return result, (None if tracer.reason else tracer.program), tracer.reason
