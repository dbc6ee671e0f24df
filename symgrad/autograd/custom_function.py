"""``symgrad.autograd.Function``: user-defined ops with their own backward (PyTorch's API).

A subclass writes ``forward(ctx, *args)`` and ``backward(ctx, *grad_outputs)`` as
staticmethods and is called through ``Cls.apply(*args)``. As in PyTorch the ctx *is*
the grad_fn: a node of the class ``<Cls>Backward`` made once per Function subclass, so
``y.grad_fn`` prints ``<symgrad.autograd.function.ExpBackward object at 0x...>``, and the
tensor shows ``grad_fn=<ExpBackward>``.

An optional ``sympy`` staticmethod gives the forward's exact meaning for the verifier:
it is called with one SymPy expression per tensor argument (an element of it) and the
non-tensor arguments unchanged, and returns the output's expression for that element
(a tuple of them when forward returns several tensors). Example::

    class Exp(Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y

        @staticmethod
        def sympy(x):
            import sympy
            return sympy.exp(x)
"""

from __future__ import annotations

import weakref
from typing import Any

from .anomaly_mode import _anomaly
from .grad_mode import _state, no_grad
from .node import FREED_MESSAGE, Node, SavedTensor
from .record import _recording

__all__ = ["Function", "FunctionCtx", "BackwardCFunction", "once_differentiable"]

_MODULE = "symgrad.autograd.function"


def _Tensor():
    from ..tensor import Tensor

    return Tensor


class FunctionCtx:
    """What ``forward`` and ``backward`` receive as ``ctx`` (the node itself, as in PyTorch).

    Non-tensor state can be stored as attributes (``ctx.k = 3``). Store tensors with
    ``save_for_backward`` instead: they are version checked and freed with the graph,
    and a saved output does not form a reference cycle.
    """

    def save_for_backward(self, *tensors) -> None:
        """Keep ``tensors`` (or None) for ``backward``; read them back as ``saved_tensors``."""
        Tensor = _Tensor()
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError("save_for_backward can only save variables, but argument "
                                f"{tensors.index(t)} is of type {type(t).__name__}")
        self.to_save = tensors

    def save_for_forward(self, *tensors) -> None:
        self.saved_for_forward = tensors

    def mark_dirty(self, *tensors) -> None:
        """Declare inputs that ``forward`` modified in place (they are returned as outputs)."""
        self.dirty_tensors = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        """Declare outputs that get no gradient (indices, masks); they do not require grad."""
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        """With False, ``backward`` sees None (not zeros) for outputs that got no gradient."""
        self.materialize_grads = bool(value)


class BackwardCFunction(Node, FunctionCtx):
    """The grad_fn (and ctx) of one ``Function.apply`` call."""

    _forward_cls: Any = None

    def __init__(self) -> None:
        Node.__init__(self)
        self.to_save = ()
        self.dirty_tensors = ()
        self.non_differentiable = ()
        self.materialize_grads = True
        self.needs_input_grad: tuple[bool, ...] = ()
        self._saved = None  # SavedTensor per ctx.save_for_backward entry, after forward
        self._freed = False
        self._tensor_positions: tuple[int, ...] = ()  # edge i <- forward argument j
        # per forward argument: a weakref to a tensor (the tensor itself under
        # symgrad.record()), or the non-tensor value; the verifier reads these
        self._input_refs: tuple = ()
        self._input_meta: tuple = ()  # per edge: (shape, dtype), used to check gradients
        # per forward output: (shape, dtype) as OpNode has it, or None for a non-tensor
        self._out_meta: tuple = ()
        self._out_device = None

    def __repr__(self) -> str:
        return f"<{_MODULE}.{type(self).__name__} object at {hex(id(self))}>"

    def _num_outputs(self) -> int:
        return len(self._out_meta)

    @property
    def saved_tensors(self) -> tuple:
        """The tensors given to ``save_for_backward``, version checked."""
        if self._freed:
            raise RuntimeError(FREED_MESSAGE)
        if self._saved is None:  # still inside forward
            return tuple(self.to_save)
        return tuple(None if s is None else s.unpack(self) for s in self._saved)

    saved_variables = saved_tensors

    def _release(self) -> None:
        if not self._freed:
            self._saved = None
            self.to_save = ()
            self._freed = True

    def apply(self, grad_outputs: list, needed: tuple[bool, ...]) -> list:
        from ..creation import zeros

        cls = self._forward_cls
        grads = list(grad_outputs)
        if self.materialize_grads:
            for i, g in enumerate(grads):
                if g is None and self._out_meta[i] is not None:
                    shape, dtype = self._out_meta[i]
                    grads[i] = zeros(shape, dtype=dtype, device=self._out_device)
        mode = _state.enabled
        try:
            result = cls.backward(self, *grads)
        finally:
            _state.enabled = mode  # a backward may not leave the engine's grad mode changed
        return self._check_grads(result)

    def _check_grads(self, result) -> list:
        Tensor = _Tensor()
        name = type(self).__name__
        if not isinstance(result, tuple):
            result = (result,)
        n_args = len(self._input_refs)
        if len(result) > n_args and all(r is None for r in result[n_args:]):
            result = result[:n_args]
        if len(result) != n_args:
            raise RuntimeError(f"function {name} returned an incorrect number of gradients "
                               f"(expected {n_args}, got {len(result)})")
        positions = set(self._tensor_positions)
        for j, g in enumerate(result):
            if g is not None and j not in positions:
                raise RuntimeError(f"function {name} returned a gradient different than None at "
                                   f"position {j + 1}, but the corresponding forward input was "
                                   "not a Variable")
        outs = []
        for i, j in enumerate(self._tensor_positions):
            g = result[j]
            if g is not None:
                if not isinstance(g, Tensor):
                    raise TypeError(f"function {name} returned a gradient of type "
                                    f"{type(g).__name__} at position {j + 1}; expected a Tensor "
                                    "or None")
                shape = self._input_meta[i][0]
                if tuple(g.shape) != tuple(shape) and not _expandable(shape, g.shape):
                    raise RuntimeError(f"Function {name} returned an invalid gradient at index "
                                       f"{i} - got {list(g.shape)} but expected shape "
                                       f"compatible with {list(shape)}")
            outs.append(g)
        return outs


def _expandable(shape, grad_shape) -> bool:
    """True if ``shape`` broadcasts to ``grad_shape`` (the engine then sums the gradient)."""
    if len(shape) > len(grad_shape):
        return False
    for s, g in zip(reversed(shape), reversed(grad_shape)):
        if s != g and s != 1:
            return False
    return True


class FunctionMeta(type):
    """Makes ``<Name>Backward``, the node class of each Function subclass."""

    def __init__(cls, name, bases, attrs) -> None:
        backward_cls = type(f"{name}Backward", (BackwardCFunction,),
                            {"_forward_cls": cls, "__module__": _MODULE})
        cls._backward_cls = backward_cls
        super().__init__(name, bases, attrs)


class Function(metaclass=FunctionMeta):
    """Base class of user-defined differentiable ops; call them as ``Cls.apply(*args)``.

    ``forward(ctx, *args)`` runs with grad mode off; ``backward(ctx, *grads)`` returns one
    gradient (or None) per forward argument. ``setup_context(ctx, inputs, output)`` may be
    used instead of a ``ctx`` argument to forward, as in PyTorch 2.
    """

    def __init__(self, *args, **kwargs) -> None:
        import warnings

        warnings.warn(f"{type(self)} should not be instantiated. Methods on autograd functions "
                      "are all static, so you should invoke them on the class itself. "
                      "Instantiating an autograd function will raise an error in a future "
                      "version.", DeprecationWarning, stacklevel=2)

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom "
                                  "autograd.Function.")

    @staticmethod
    def setup_context(ctx, inputs, output):
        raise NotImplementedError("setup_context is not implemented.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement either the backward or vjp method for "
                                  "your custom autograd.Function to use it with backward mode "
                                  "AD.")

    vjp = backward

    #: Optional: the forward's SymPy meaning, elementwise (see the module docstring).
    sympy = None

    @classmethod
    def apply(cls, *args, **kwargs):
        from . import function as _fn

        if _fn._profiler is not None:
            return _fn._profiler._record_call(cls.__name__, "function", args, _apply,
                                              cls, args, kwargs)
        return _apply(cls, args, kwargs)


def _apply(cls, args, kwargs):
    from .function import edge_of

    Tensor = _Tensor()
    grad_on = _state.enabled
    positions = tuple(j for j, a in enumerate(args) if isinstance(a, Tensor))
    needs = tuple(isinstance(a, Tensor) and a._requires_grad and grad_on for a in args)
    ctx = cls._backward_cls()
    ctx.needs_input_grad = needs
    custom_setup = cls.setup_context is not Function.setup_context
    with no_grad():
        if custom_setup:
            output = cls.forward(*args, **kwargs)
            cls.setup_context(ctx, args, output)
        else:
            output = cls.forward(ctx, *args, **kwargs)
    is_tuple = isinstance(output, tuple)
    outputs = output if is_tuple else (output,)
    if not any(needs):
        return output  # nothing to record; dirty inputs were still changed in place
    ctx.next_functions = tuple(edge_of(args[j]) if args[j]._requires_grad else (None, 0)
                               for j in positions)
    ctx._tensor_positions = positions
    strong = bool(_recording)  # symgrad.record(): keep the inputs for the verifier
    ctx._input_refs = tuple((a if strong else weakref.ref(a)) if isinstance(a, Tensor) else a
                            for a in args)
    ctx._input_meta = tuple((args[j]._data.shape, args[j].dtype) for j in positions)
    if _anomaly.enabled:
        from .anomaly_mode import forward_stack

        ctx.metadata["traceback_"] = forward_stack()
    dirty = {id(t) for t in ctx.dirty_tensors}
    non_diff = {id(t) for t in ctx.non_differentiable}
    input_ids = {id(args[j]) for j in positions}
    wrapped = []
    out_meta = []
    for k, o in enumerate(outputs):
        if not isinstance(o, Tensor):
            wrapped.append(o)
            out_meta.append(None)
            continue
        if id(o) in dirty:
            if o._requires_grad and o._grad_fn is None:
                raise RuntimeError("a leaf Variable that requires grad has been used in an "
                                   "in-place operation.")
            o._bump()
        elif id(o) in input_ids:  # an input returned unchanged: a new tensor object, as torch
            o = Tensor._alias(o)
        out_meta.append((o._data.shape, o.dtype))
        ctx._out_device = o._device
        if id(outputs[k]) not in non_diff and o.dtype.is_floating_point:
            o._grad_fn = ctx
            o._output_nr = k
            o._requires_grad = True
        wrapped.append(o)
    ctx._out_meta = tuple(out_meta)
    saved = []
    out_index = {id(o): k for k, o in enumerate(outputs) if isinstance(o, Tensor)}
    for t in ctx.to_save:
        if t is None:
            saved.append(None)
        elif id(t) in out_index and wrapped[out_index[id(t)]]._grad_fn is ctx:
            saved.append(SavedTensor(wrapped[out_index[id(t)]], is_output=True,
                                     output_nr=out_index[id(t)]))
        else:
            saved.append(SavedTensor(t, is_output=False))
    ctx._saved = tuple(saved)
    ctx.to_save = ()
    return tuple(wrapped) if is_tuple else wrapped[0]


def once_differentiable(fn):
    """Decorator for ``backward``: run it without recording a graph (no double backward)."""
    import functools

    @functools.wraps(fn)
    def wrapper(ctx, *args):
        with no_grad():
            return fn(ctx, *args)

    return wrapper
