"""``Parameter``: a leaf Tensor that a Module registers as trainable."""

from __future__ import annotations

from ..tensor import Tensor

__all__ = ["Parameter"]


class Parameter(Tensor):
    """A Tensor subclass, so ``isinstance(p, symgrad.Tensor)`` holds; shares ``data``'s storage.

    Ops on a Parameter give plain Tensors, as in PyTorch.
    """

    __slots__ = ()

    def __new__(cls, data: Tensor | None = None, requires_grad: bool = True) -> Parameter:
        if data is None:
            from ..creation import empty

            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter(): argument 'data' must be Tensor, not "
                            f"{type(data).__name__}")
        p = cls._wrap(data._data, data._device, data._storage)
        p.name = data.name
        if requires_grad:
            p.requires_grad_(True)
        return p

    def __init__(self, data: Tensor | None = None, requires_grad: bool = True) -> None:
        pass

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    __str__ = __repr__

    def __reduce_ex__(self, protocol):
        return (_rebuild_parameter, (self.detach().cpu()._data.copy(), self._requires_grad))

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        out = Parameter(self.detach().clone(), self._requires_grad)
        memo[id(self)] = out
        return out


def _rebuild_parameter(data, requires_grad: bool) -> Parameter:
    from ..tensor import tensor

    return Parameter(tensor(data), requires_grad)
