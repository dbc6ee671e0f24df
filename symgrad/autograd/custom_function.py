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

# Defined in symgrad/autograd/function.py (as torch.autograd.function defines them), where
# they share apply's profiler hook and edges without an import cycle; kept importable here.
from .function import BackwardCFunction, Function, FunctionCtx, once_differentiable

__all__ = ["Function", "FunctionCtx", "BackwardCFunction", "once_differentiable"]
