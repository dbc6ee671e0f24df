"""``symgrad.autograd.Variable``: PyTorch's deprecated alias, kept so old code runs.

Variables and tensors merged in PyTorch 0.4; ``Variable(t, requires_grad=True)`` still
returns a plain tensor (a new tensor over ``t``'s storage, detached from any graph), and
``isinstance(t, Variable)`` is true for every tensor.
"""

from __future__ import annotations

import warnings

__all__ = ["Variable", "VariableMeta"]


class VariableMeta(type):
    """Makes ``isinstance(tensor, Variable)`` true, as in PyTorch."""

    def __instancecheck__(cls, other) -> bool:
        from ..tensor import Tensor

        return isinstance(other, Tensor)


class Variable(metaclass=VariableMeta):
    """``Variable(data=None, requires_grad=False, volatile=False, _grad_fn=None, name=None)``
    returns a Tensor: ``data`` detached, with ``requires_grad`` set; ``name`` becomes the
    tensor's ``name`` (the symbol the verifier uses)."""

    def __new__(cls, data=None, requires_grad: bool = False, volatile: bool = False,
                _grad_fn=None, name: str | None = None):
        from ..tensor import Tensor, tensor

        if data is None:
            data = tensor([])
        elif not isinstance(data, Tensor):
            raise TypeError(f"Variable data has to be a tensor, but got {type(data).__name__}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"argument 5 must be str or None, not {type(name).__name__}")
        if volatile:
            warnings.warn("volatile was removed and now has no effect. Use "
                          "`with symgrad.no_grad():` instead.", UserWarning, stacklevel=2)
        requires_grad = bool(requires_grad)
        if requires_grad and not data.dtype.is_floating_point:
            raise RuntimeError(
                "Only Tensors of floating point and complex dtype can require gradients")
        result = data.detach()
        if requires_grad:
            result.requires_grad_(True)
        if name is not None:
            result.name = name
        return result
