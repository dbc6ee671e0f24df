"""Graph objects: Node (a grad_fn), AccumulateGrad, and saved tensors.

Ownership runs one way only, as in PyTorch, so no reference cycles exist: a tensor owns
its grad_fn, a node owns its ``next_functions`` and what it saved, a leaf only weakly
knows its AccumulateGrad, and a saved *output* is stored without its grad_fn (it gets the
node back on unpacking). Dropping the last user reference frees the graph at once.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any

import numpy as np

from .. import _tensor_layer as _tl
from ..backends import _BACKENDS, _DEVICE_DEFAULT
from ..backends import backend_for as _backend_for
from ..backends import upcast_halves as _upcast_halves
from ..dtypes import HALF_NP as _HALF_NP
from ..ops._ints import norm as _norm
from ..ops.movement import _swap
from .grad_mode import _state as _grad_state

__all__ = ["Node", "OpNode", "AccumulateGrad", "SavedTensor", "node_class_for"]

_sequence = itertools.count()


class _ModuleCalls(threading.local):
    """The nn.Module calls running in this thread: ``top`` is the innermost one as
    ``(weakref to the module, the enclosing call's entry or None)``, or None outside any.

    ``Module.__call__`` pushes and pops it; every node made meanwhile keeps the entry it
    read (``Node._module_call``: one attribute read per node, no strings). The graph view
    turns entries into paths (``h.0.attn``) only when asked. The module is held weakly, so
    a graph never keeps a model alive and no cycle runs through a module.
    """

    top: tuple | None = None


_module_calls = _ModuleCalls()

FREED_MESSAGE = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward.")


class Node:
    """Base of every grad_fn: edges to the next nodes, hooks, metadata."""

    __slots__ = ("next_functions", "_sequence_nr", "_metadata", "_pre_hooks", "_hooks",
                 "_tensor_hooks", "_retained", "_module_call", "__weakref__")

    def __init__(self) -> None:
        self.next_functions: tuple[tuple[Node | None, int], ...] = ()
        self._sequence_nr = next(_sequence)
        self._module_call = _module_calls.top  # the nn.Module call that made it (see above)
        self._metadata = None
        self._pre_hooks = None
        self._hooks = None
        self._tensor_hooks = None  # {output_nr: [fn]}: Tensor.register_hook on outputs
        self._retained = None  # {output_nr: weakref(tensor)}: retain_grad()

    def name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return f"<{type(self).__name__} object at {hex(id(self))}>"

    @property
    def metadata(self) -> dict:
        if self._metadata is None:
            self._metadata = {}
        return self._metadata

    def register_hook(self, fn):
        """``fn(grad_inputs, grad_outputs)`` after this node ran; may return new grad_inputs."""
        if self._hooks is None:
            self._hooks = _HookDict()
        return _add_hook(self._hooks, fn)

    def register_prehook(self, fn):
        """``fn(grad_outputs)`` before this node runs; may return new grad_outputs."""
        if self._pre_hooks is None:
            self._pre_hooks = _HookDict()
        return _add_hook(self._pre_hooks, fn)

    def _num_outputs(self) -> int:
        return 1

    def _release(self) -> None:
        """Free saved tensors after a backward without retain_graph."""

    def apply(self, grad_outputs: list, needed: tuple[bool, ...]) -> list:
        raise NotImplementedError

    def __call__(self, *grad_outputs):
        needed = tuple(nf[0] is not None for nf in self.next_functions)
        return tuple(self.apply(list(grad_outputs), needed))


class RemovableHandle:
    __slots__ = ("_hooks_ref", "id")
    _ids = itertools.count()

    def __init__(self, hooks: dict) -> None:
        self._hooks_ref = weakref.ref(hooks)
        self.id = next(self._ids)

    def remove(self) -> None:
        hooks = self._hooks_ref()
        if hooks is not None:
            hooks.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class _HookDict(dict):
    """A dict that can be weakly referenced, so handles do not keep nodes alive."""

    __slots__ = ("__weakref__",)


def _add_hook(hooks: dict, fn) -> RemovableHandle:
    handle = RemovableHandle(hooks)
    hooks[handle.id] = fn
    return handle


#: The active ``saved_tensors_hooks`` (pack, unpack) pairs, innermost last; see graph.py.
#: Checked once per saved tensor, so the hooks cost nothing while none is active.
_saved_tensors_hooks: list = []

def _tensor_type():
    """symgrad.Tensor, which tensor.py plugs in (autograd never imports the tensor layer)."""
    return _tl.Tensor


_TYPE_NAMES = _tl.LEGACY_NAMES


class SavedTensor:
    """A tensor a node saved, with the storage version it had when saved.

    A saved input is the very object the user passed (read as it is at backward time, so
    ``x.data = ...`` is seen, as in PyTorch). A saved output is kept as its array and
    storage only (owning the output with its grad_fn would be a cycle); unpacking it gives
    a new tensor whose grad_fn is the node, as PyTorch does, and the fused backward kernels
    read ``data`` directly, so saving an output creates no tensor. Under
    ``saved_tensors_hooks``, or after ``register_hooks`` on ``grad_fn._raw_saved_<name>``,
    only what ``pack`` returned is kept, ``unpack`` gives the tensor back (reattached to
    the graph where the saved tensor was: a new tensor object, as in PyTorch), and no
    version check is made.
    """

    __slots__ = ("_tensor", "data", "storage", "device", "version", "output_nr", "_packed",
                 "_unpack", "_edge", "_state")

    def __init__(self, tensor, is_output: bool, output_nr: int = 0) -> None:
        storage = tensor._storage
        self.version = storage.version
        self.output_nr = output_nr if is_output else -1
        self._edge = self._state = None
        if _saved_tensors_hooks:
            if is_output:
                tensor = _tensor_type()._alias(tensor)
            else:
                self._edge = _grad_edge(tensor)
            pack, self._unpack = _saved_tensors_hooks[-1]
            self._packed = pack(tensor)
            self._tensor = self.data = self.storage = self.device = None
        elif is_output:
            self._unpack = self._tensor = None
            self.data = tensor._data
            self.storage = storage
            self.device = tensor._device
        else:
            self._unpack = self.data = self.storage = self.device = None
            self._tensor = tensor

    @classmethod
    def _placeholder(cls, state: str | None) -> SavedTensor:
        """What ``_raw_saved_<name>`` gives for a freed (``"freed"``) or unsaved
        (``"none"``) operand: registering hooks on it raises torch's error."""
        st = cls.__new__(cls)
        st._tensor = st.data = st.storage = st.device = st._packed = st._unpack = None
        st._edge = None
        st.version, st.output_nr, st._state = 0, -1, state
        return st

    def __repr__(self) -> str:
        return f"<symgrad.autograd.SavedTensor object at {hex(id(self))}>"

    def register_hooks(self, pack_hook, unpack_hook) -> None:
        """PyTorch's per-tensor saved-tensor hooks: ``pack_hook`` runs now, on the saved
        value, and only its result is kept; ``unpack_hook`` runs whenever the value is
        needed (by backward or by ``grad_fn._saved_<name>``). One pair per tensor."""
        if not callable(pack_hook) or not callable(unpack_hook):
            raise TypeError(
                "register_hooks(): incompatible function arguments. The following argument "
                "types are supported:\n    1. (self: symgrad.autograd.SavedTensor, arg0: "
                "collections.abc.Callable, arg1: collections.abc.Callable) -> None\n\n"
                f"Invoked with: {self!r}, {pack_hook!r}, {unpack_hook!r}")
        if self._unpack is not None:
            raise RuntimeError("Calling register_hooks on a saved tensor whose hooks have "
                               "already been set. Hint: only one pair of hooks is allowed at "
                               "a time.")
        if self._state == "freed":
            raise RuntimeError(
                "Calling register_hooks on a saved tensor after it has been freed. Saved "
                "intermediate values of the graph are freed when you call .backward() or "
                "autograd.grad(). Specify retain_graph=True if you need to backward through "
                "the graph a second time or if you need to access saved variables after "
                "calling backward.")
        if self._state == "none":
            raise RuntimeError("Calling register_hooks on a saved tensor with value None is "
                               "forbidden")
        T = _tensor_type()
        if self.output_nr >= 0:  # pack sees a plain tensor over the data, as in PyTorch
            value = T._wrap(self.data, self.device, self.storage)
        else:
            value = T._wrap(self._tensor._data, self._tensor._device, self._tensor._storage)
            self._edge = _grad_edge(self._tensor)
        self._packed = pack_hook(value)
        self._unpack = unpack_hook
        self._tensor = self.data = self.storage = None

    def _free(self) -> None:
        self._state = "freed"
        self._tensor = self.data = self.storage = self._packed = self._unpack = None
        self._edge = None

    @property
    def tensor(self):
        """The saved tensor (for an output, a grad_fn-free alias made on first use);
        None under saved-tensor hooks."""
        t = self._tensor
        if t is None and self.data is not None:
            t = self._tensor = _tensor_type()._wrap(self.data, self.device, self.storage)
        return t

    def unpack(self, node: Node):
        T = _tensor_type()
        if self._unpack is not None:
            t = self._unpack(self._packed)
            if not isinstance(t, T):
                raise TypeError("Output of saved tensor unpack_hook expected to be a Tensor "
                                f"but got result of type {type(t).__name__}")
            if self.output_nr >= 0:
                return T._alias(t, grad_fn=node, output_nr=self.output_nr)
            return _reattach(t, self._edge)
        if self._state is not None:
            raise RuntimeError(FREED_MESSAGE)
        if self.output_nr >= 0:
            if self.storage.version != self.version:
                raise RuntimeError(self._version_message(node))
            return T._alias_of(self.data, self.device, self.storage, node, self.output_nr)
        t = self._tensor
        if t._storage.version != self.version:
            raise RuntimeError(self._version_message(node))
        return t

    def array(self):
        """The saved array for a fused kernel when unchanged since saving, else None (the
        caller unpacks, which raises the version error or runs the unpack hook)."""
        if self.output_nr < 0:
            t = self._tensor  # None under saved-tensor hooks
            return t._data if t is not None and t._storage.version == self.version else None
        if self.data is not None:  # None under saved-tensor hooks
            return self.data if self.storage.version == self.version else None
        return None

    def _version_message(self, node: Node) -> str:
        from .anomaly_mode import _anomaly

        t = self.tensor
        shape = ", ".join(str(s) for s in t.shape)
        desc = f"[symgrad.{_TYPE_NAMES.get(t.dtype.name, t.dtype.name)} [{shape}]]"
        if self.output_nr >= 0:
            where = f", which is output {self.output_nr} of {_short(node.name())},"
        elif t._grad_fn is not None:  # PyTorch names the tensor's grad_fn as of now
            where = f", which is output {t._output_nr} of {_short(t._grad_fn.name())},"
        else:
            where = ""
        if _anomaly.enabled:
            hint = ("Hint: the backtrace further above shows the operation that failed to "
                    "compute its gradient. The variable in question was changed in there or "
                    "anywhere later. Good luck!")
        else:
            hint = ("Hint: enable anomaly detection to find the operation that failed to "
                    "compute its gradient, with symgrad.autograd.set_detect_anomaly(True).")
        return ("one of the variables needed for gradient computation has been modified by "
                f"an inplace operation: {desc}{where} is at version {t._storage.version}; "
                f"expected version {self.version} instead. It was saved for {node.name()}. "
                + hint)


def _accumulator_of(t) -> AccumulateGrad:
    """The leaf's AccumulateGrad (made if none lives), as the recording code gets it."""
    ref = t._accumulator
    acc = ref() if ref is not None else None
    if acc is None:
        # AccumulateGrad(t) written out (no __init__ call): with the graph that used it
        # dropped, a leaf's accumulator is made again, every step and in every one-op graph
        acc = _new_object(AccumulateGrad)
        acc.next_functions = ()
        acc._sequence_nr = 1 << 62
        acc._metadata = acc._pre_hooks = acc._hooks = acc._tensor_hooks = acc._retained = None
        acc._module_call = None
        acc.variable = t
        t._accumulator = _weakref(acc)
    return acc


_new_object = object.__new__
_weakref = weakref.ref


def _grad_edge(t):
    """Where gradient flowing into ``t`` goes: (grad_fn, output_nr), (AccumulateGrad, 0)
    for a leaf that requires grad, or None."""
    if t._grad_fn is not None:
        return (t._grad_fn, t._output_nr)
    if t._requires_grad:
        return (_accumulator_of(t), 0)
    return None


def _reattach(t, edge):
    """What an unpack hook returned, as a new tensor on the saved input's place in the graph
    (PyTorch does this so a pack that detaches still gives correct double backward)."""
    if edge is None:
        return t.detach() if t.requires_grad else t
    T = _tensor_type()
    fn, output_nr = edge
    if type(fn) is AccumulateGrad:
        a = T._alias(t)
        a._requires_grad = True
        a._accumulator = weakref.ref(fn)
        return a
    return T._alias(t, grad_fn=fn, output_nr=output_nr)


def _short(name: str) -> str:
    """``ExpBackward0`` -> ``Exp``: how PyTorch names the producing op in this message."""
    import re

    return re.sub(r"Backward\d*$", "", name)


class OpNode(Node):
    """The grad_fn of a registered op; one subclass per grad_fn name (AddBackward0 ...)."""

    #: _kept: set under symgrad.record() only (autograd.record.keep)
    __slots__ = ("_saved", "_input_refs", "_input_meta", "_out_meta", "_freed", "_params",
                 "_kept")
    _spec: Any = None
    #: ``rule(be, grad_array, saved) -> array``: the backward on arrays of a structural
    #: op (_ARRAY_RULES), or None
    _array_rule: Any = None

    def _num_outputs(self) -> int:
        return len(self._out_meta)

    def __getattr__(self, attr: str):
        if attr.startswith("_saved_"):
            name = attr[7:]
            if name in type(self)._spec.saved:
                return self._unpack_saved(name, for_user=True)
        elif attr.startswith("_raw_saved_"):
            name = attr[11:]
            if name in self._raw_names():
                return self._raw_saved(name)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{attr}'")

    def __dir__(self):
        spec = type(self)._spec
        return (list(super().__dir__()) + [f"_saved_{n}" for n in spec.saved]
                + [f"_raw_saved_{n}" for n in self._raw_names()])

    def _raw_names(self) -> list[str]:
        """The saved operands that are tensors in PyTorch (inputs and outputs; a Python
        number where torch saves a wrapped 0-dim tensor counts; sizes and scalars don't)."""
        spec = type(self)._spec
        names = []
        for n in spec.saved:
            if spec.saved_kind(n)[0] in ("input", "output"):
                v = self._saved.get(n)
                if v is None or v is _FREED or type(v) in (SavedTensor, _WrappedScalar):
                    names.append(n)
        return names

    def _raw_saved(self, name: str) -> SavedTensor:
        """``grad_fn._raw_saved_<name>``: the SavedTensor itself, for ``register_hooks``."""
        value = self._saved.get(name)
        if type(value) is SavedTensor:
            return value
        if value is _FREED:
            return SavedTensor._placeholder("freed")
        if type(value) is _WrappedScalar:
            if value.raw is None:
                raw = value.raw = SavedTensor._placeholder(None)
                raw._tensor = _tl.tensor(value.value, dtype=value.dtype)
            return value.raw
        return SavedTensor._placeholder("none")

    def _unpack_saved(self, name: str, for_user: bool = False):
        value = self._saved.get(name)
        if value is _FREED:
            raise RuntimeError(FREED_MESSAGE)
        if type(value) is SavedTensor:
            return value.unpack(self)
        if type(value) is _WrappedScalar:
            raw = value.raw
            if raw is not None and raw._unpack is not None:  # hooks via _raw_saved_<name>
                t = raw.unpack(self)
                return t if for_user else t.item()
            if for_user:
                return _tl.tensor(value.value, dtype=value.dtype)
            return value.value
        return value

    def _release(self) -> None:
        """Drop saved tensors, the wrapped numbers of ``x * 2`` among them (torch saves those
        as 0-dim tensors and frees them too); numbers such as alpha stay readable, as in
        torch."""
        saved = self._saved
        for k, v in saved.items():
            kind = type(v)
            if kind is SavedTensor or kind is _WrappedScalar:
                if kind is SavedTensor:
                    v._free()  # a SavedTensor the user holds (_raw_saved_*) knows it is freed
                elif v.raw is not None:
                    v.raw._free()
                saved[k] = _FREED
                self._freed = True

    def apply(self, grad_outputs: list, needed: tuple[bool, ...]) -> list:
        spec = type(self)._spec
        grad = grad_outputs[0]
        if grad is None:  # only another output received a gradient: zeros, on its device
            present = [g for g in grad_outputs if g is not None]
            if not present:
                return [None] * len(spec.inputs)
            shape, dtype = self._out_meta[0]
            grad = _tl.zeros(shape, dtype=dtype, device=present[0].device)
        rule = self._array_rule
        if rule is not None and not _grad_state.enabled and spec.grads.pristine \
                and type(grad._data) is np.ndarray and _fn_module._profiler is None:
            return self._apply_array_rule(rule, grad, needed)
        if (spec.fused_backward is not None and not _grad_state.enabled
                and spec.grads.pristine):
            fused = self._apply_fused(spec, grad, needed)
            if fused is not None:
                return fused
        cache: dict[str, Any] = {}
        results = []
        for i, input_name in enumerate(spec.inputs):
            if not needed[i] or input_name not in spec.grads:
                results.append(None)
                continue
            kwargs = {}
            for p in spec.formula_params[input_name]:
                if p not in cache:
                    cache[p] = self._unpack_saved(p)
                kwargs[p] = cache[p]
            results.append(spec.grads[input_name](grad, **kwargs))
        return results

    def _apply_array_rule(self, rule, grad, needed):
        """A structural op's backward (a view's inverse) as the one backend call its
        formula makes, on the gradient's array: no Tensor op, no dispatch (no graph is
        recorded). The result keeps the gradient's storage when it views it, as the
        formula's view op would, so the engine's aliasing rule sees the shared buffer."""
        if not needed[0]:
            return [None]
        g = grad._data
        try:  # _backend_for, inlined
            be = _BACKENDS[_DEVICE_DEFAULT[grad._device.type]]
        except KeyError:
            be = _backend_for(grad._device.type)
        o = rule(be, g, self._saved)
        if type(o) is not np.ndarray:
            o = np.asarray(o)
        base = o.base
        shares = o is g or (base is not None and (base is g or base is g.base))
        return [type(grad)._wrap(o, grad._device, grad._storage if shares else None)]

    def _apply_fused(self, spec, grad, needed):
        """The backend's one-pass backward kernel, when it has one (no graph is recorded)."""
        try:  # _backend_for, inlined
            be = _BACKENDS[_DEVICE_DEFAULT[grad._device.type]]
        except KeyError:
            be = _backend_for(grad._device.type)
        kernel = getattr(be, spec.fused_backward, None)
        if kernel is None:
            return None
        saved = self._saved
        args = []
        for p in spec.saved:  # _fused_arg, inlined: this runs for every node
            value = saved.get(p)
            kind = type(value)
            if kind is SavedTensor:
                a = value.array()
                args.append(a if a is not None else self._fused_arg(p))
            elif kind is _WrappedScalar:
                args.append(value.value if value.raw is None else self._unpack_saved(p))
            elif value is _FREED:
                raise RuntimeError(FREED_MESSAGE)
            else:
                args.append(value)
        half = grad._data.dtype
        if half in _HALF_NP:  # computed in float32 and rounded once, as torch's kernels
            outs = kernel(*_upcast_halves([grad._data], be), needed, *_upcast_halves(args, be))
            if outs is not None:  # rounded in the kernel's layout (astype keeps it), as
                # torch's half kernels lay out their results as their float32 ones
                outs = tuple([o if o is None or o.dtype != np.float32 else
                              o.astype(half) if type(o) is np.ndarray else be.cast(o, half)
                              for o in outs])
        else:
            outs = kernel(grad._data, needed, *args)
        if outs is None:
            return None
        # a kernel may pass the incoming gradient through (addmm's bias): it keeps its
        # storage, so the engine's aliasing rule sees the buffer is shared
        wrap, device, g_data = type(grad)._wrap, grad._device, grad._data
        if len(outs) == 1:
            o = outs[0]
            return [None if o is None else wrap(o, device, grad._storage if o is g_data
                                                else None)]
        return [None if o is None else wrap(o, device, grad._storage if o is g_data else None)
                for o in outs]

    def _fused_arg(self, name: str):
        """A saved operand as the kernel takes it: the array of a tensor, or the number."""
        value = self._saved.get(name)
        if type(value) is SavedTensor:
            a = value.array()
            return a if a is not None else value.unpack(self)._data  # version error or hook
        if value is _FREED:
            raise RuntimeError(FREED_MESSAGE)
        if type(value) is _WrappedScalar:
            return self._unpack_saved(name)
        return value


class MultiOutputOpNode(OpNode):
    """The grad_fn of an op with ``variadic_outputs`` (split, unbind): every output is an
    edge into this one node (``output_nr`` k), and the formulas see all their gradients."""

    __slots__ = ()

    def apply(self, grad_outputs: list, needed: tuple[bool, ...]) -> list:
        spec = type(self)._spec
        if all(g is None for g in grad_outputs):
            return [None] * len(spec.inputs)
        grads = list(grad_outputs)  # None where an output got no gradient (the rule fills)
        results = []
        for i, input_name in enumerate(spec.inputs):
            if not needed[i] or input_name not in spec.grads:
                results.append(None)
                continue
            kwargs = {p: self._unpack_saved(p) for p in spec.formula_params[input_name]}
            results.append(spec.grads[input_name](grads, **kwargs))
        return results


_FREED = object()  # marks a saved tensor released by backward


class _WrappedScalar:
    """A Python number saved where PyTorch saves a wrapped 0-dim tensor (``a * 2``)."""

    __slots__ = ("value", "dtype", "raw")

    def __init__(self, value, dtype) -> None:
        self.value = value
        self.dtype = dtype
        self.raw = None  # the SavedTensor made by _raw_saved_<name>, for register_hooks


_NODE_CLASSES: dict[str, type] = {}

#: autograd/function.py (set by it: it imports this module): its ``_profiler`` is the
#: profiler or compile tracer, under which a view's backward runs as its formula's ops
_fn_module: Any = type("_NoProfiler", (), {"_profiler": None})


def _reshape_rule(be, g, saved):
    return be.reshape(g, saved["self_sym_sizes"])


def _transpose_rule(be, g, saved):
    n = g.ndim
    return be.transpose(g, _swap(n, _norm(saved["dim0"], n), _norm(saved["dim1"], n)))


#: Backwards of one-input structural ops written on arrays: exactly the backend call their
#: formula's op makes (``grad.reshape(self_sym_sizes)`` is a ``be.reshape`` to those
#: sizes; ``grad.t()`` reverses the axes; ``grad.transpose(d0, d1)`` swaps two), used while
#: no graph is recorded and the formulas are the registered ones. A training step runs
#: dozens of these nodes (attention's head split, Linear's weight transpose).
_ARRAY_RULES = {
    **{name: _reshape_rule for name in ("view", "reshape_alias", "unsafe_view", "squeeze_all",
                                        "squeeze_dims")},
    "t": lambda be, g, saved: be.transpose(g, tuple(range(g.ndim))[::-1]),
    "transpose": _transpose_rule,
}


def _array_rule_of(spec):
    rule = _ARRAY_RULES.get(spec.name)
    return None if rule is None else staticmethod(rule)  # read through the node: unbound


def node_class_for(spec) -> type:
    """The Node subclass named after ``spec.grad_fn`` (one per op spec)."""
    cls = _NODE_CLASSES.get(spec.name)
    if cls is None:
        base = MultiOutputOpNode if spec.variadic_outputs else OpNode
        cls = type(spec.grad_fn, (base,), {"__slots__": (), "_spec": spec,
                                           "_array_rule": _array_rule_of(spec),
                                           "__module__": "symgrad.autograd.graph_nodes"})
        _NODE_CLASSES[spec.name] = cls
    return cls


class AccumulateGrad(Node):
    """Adds the incoming gradient into a leaf's ``.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable) -> None:
        # Node.__init__ written out: a leaf's accumulator is made again whenever the last
        # graph using the leaf was dropped, which in a training loop is every step
        self.next_functions = ()
        self._sequence_nr = 1 << 62  # runs as soon as it is ready, as in PyTorch
        self._metadata = self._pre_hooks = self._hooks = None
        self._tensor_hooks = self._retained = self._module_call = None
        self.variable = variable

    def apply(self, grad_outputs, needed):
        raise RuntimeError("AccumulateGrad is applied by the engine")
