"""Activation checkpointing: keep less of the forward, recompute it during backward.

``checkpoint(fn, *args)`` runs ``fn`` so that the tensors its graph would save are not
kept; when the backward reaches that part of the graph, ``fn`` runs again to rebuild
them. Memory for a segment drops from its activations to its inputs, at the price of a
second forward. Both of PyTorch's flavours are here:

- ``use_reentrant=False`` (recommended): built on ``saved_tensors_hooks``; the graph is
  recorded as usual, but each saved tensor is replaced by its index and recomputed on
  first use. Works with ``autograd.grad``, ``inputs=`` and inputs that need no grad.
- ``use_reentrant=True`` (PyTorch's default when the flag is not given, with a warning):
  a custom ``Function`` runs ``fn`` under ``no_grad`` and, in its backward, reruns it and
  backpropagates through the recomputed graph. As in PyTorch, it does not support
  ``autograd.grad`` or ``backward(inputs=...)``, and at least one input must require grad.

The module is itself callable: ``symgrad.utils.checkpoint(fn, x)`` is
``symgrad.utils.checkpoint.checkpoint(fn, x)``. The random generator's state is saved
and restored around the recomputation (``preserve_rng_state=True``), so code that draws
random numbers (dropout) recomputes the same values.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

from ..autograd.custom_function import Function
from ..autograd.grad_mode import enable_grad
from ..autograd.graph import saved_tensors_hooks

__all__ = ["checkpoint", "checkpoint_sequential", "CheckpointFunction"]

_REENTRANT_WARNING = (
    "symgrad.utils.checkpoint: the use_reentrant parameter should be passed explicitly. "
    "use_reentrant=False is recommended, but if you need to preserve the current default "
    "behavior, you can pass use_reentrant=True. Refer to docs for more details on the "
    "differences between the two variants.")


def _Tensor():
    from ..tensor import Tensor

    return Tensor


def _get_rng_state():
    from .. import creation

    return creation.default_generator().bit_generator.state


class _rng_restored:  # noqa: N801
    """Run a block with the generator at ``state``; afterwards it continues as before."""

    def __init__(self, state) -> None:
        self.state = state

    def __enter__(self) -> None:
        from .. import creation

        if self.state is not None:
            self.gen = creation.default_generator()
            self.now = self.gen.bit_generator.state
            self.gen.bit_generator.state = self.state

    def __exit__(self, *exc) -> None:
        if self.state is not None:
            self.gen.bit_generator.state = self.now


def _detached(args) -> list:
    Tensor = _Tensor()
    out = []
    for a in args:
        if isinstance(a, Tensor):
            d = a.detach()
            d._requires_grad = a._requires_grad
            out.append(d)
        else:
            out.append(a)
    return out


class CheckpointFunction(Function):
    """The reentrant flavour: forward under no_grad, recompute and backprop in backward."""

    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        Tensor = _Tensor()
        ctx.run_function = run_function
        ctx.rng_state = _get_rng_state() if preserve_rng_state else None
        ctx.inputs = [None if isinstance(a, Tensor) else a for a in args]
        ctx.tensor_indices = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.save_for_backward(*(a for a in args if isinstance(a, Tensor)))
        return run_function(*args)

    @staticmethod
    def backward(ctx, *grads):
        from ..autograd import backward

        Tensor = _Tensor()
        inputs = list(ctx.inputs)
        for i, t in zip(ctx.tensor_indices, ctx.saved_tensors):
            inputs[i] = t
        inputs = _detached(inputs)
        with _rng_restored(ctx.rng_state), enable_grad():
            outputs = ctx.run_function(*inputs)
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads)
                 if isinstance(o, Tensor) and o._requires_grad and g is not None]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is "
                               "not necessary")
        backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None, None) + tuple(a._grad if isinstance(a, Tensor) else None for a in inputs)


class _Frame:
    """One non-reentrant checkpoint call: how many tensors were saved, and their rebuilds."""

    __slots__ = ("fn", "args", "kwargs", "rng_state", "count", "recomputed")

    def __init__(self, fn, args, kwargs, rng_state) -> None:
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.rng_state = rng_state
        self.count = 0
        self.recomputed: list | None = None

    def pack(self, tensor) -> int:
        index = self.count
        self.count += 1
        return index  # the tensor itself is not kept: that is the memory saving

    def unpack(self, index: int):
        if self.recomputed is None:
            store: list = []

            def keep(t):
                store.append(t)
                return len(store) - 1

            with _rng_restored(self.rng_state), enable_grad(), \
                    saved_tensors_hooks(keep, store.__getitem__):
                self.fn(*_detached(self.args), **self.kwargs)
            if len(store) != self.count:
                raise RuntimeError(
                    "symgrad.utils.checkpoint: a different number of tensors was saved during "
                    f"the original forward and the recomputation (saved {self.count}, "
                    f"recomputed {len(store)}). The checkpointed function must run the same "
                    "ops each time it is called.")
            self.recomputed = store
            self.args = self.kwargs = None  # the inputs are no longer needed
        return self.recomputed[index]


def checkpoint(function: Callable, *args, use_reentrant: bool | None = None,
               preserve_rng_state: bool = True, **kwargs) -> Any:
    """Run ``function(*args, **kwargs)`` without keeping its saved tensors; recompute later."""
    if use_reentrant is None:
        warnings.warn(_REENTRANT_WARNING, UserWarning, stacklevel=2)
        use_reentrant = True
    if use_reentrant:
        if kwargs:
            raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
        Tensor = _Tensor()
        if not any(isinstance(a, Tensor) and a._requires_grad for a in args):
            warnings.warn("None of the inputs have requires_grad=True. Gradients will be None",
                          UserWarning, stacklevel=2)
        return CheckpointFunction.apply(function, preserve_rng_state, *args)
    frame = _Frame(function, args, kwargs, _get_rng_state() if preserve_rng_state else None)
    with saved_tensors_hooks(frame.pack, frame.unpack):
        return function(*args, **kwargs)


def checkpoint_sequential(functions, segments: int, input, use_reentrant: bool | None = None,
                          **kwargs):
    """Split a sequence of modules/functions into ``segments`` checkpointed chunks."""
    functions = list(functions.children()) if hasattr(functions, "children") else list(functions)
    size = max(len(functions) // segments, 1)

    def run(start, end):
        def forward(x):
            for f in functions[start:end]:
                x = f(x)
            return x

        return forward

    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run(start, end + 1), input, use_reentrant=use_reentrant, **kwargs)
    return run(end + 1, len(functions))(input)


class _CallableModule(types.ModuleType):
    """Lets ``symgrad.utils.checkpoint(fn, x)`` work as well as ``...checkpoint.checkpoint``."""

    def __call__(self, function: Callable, *args, **kwargs):
        return checkpoint(function, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
