"""``parameters_to_vector`` / ``vector_to_parameters``, as ``torch.nn.utils``."""

from __future__ import annotations

from collections.abc import Iterable

from ...tensor import Tensor

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def _check_same_device(param: Tensor, old_device):
    if old_device is not None and param.device != old_device:
        raise TypeError("Found two parameters on different devices, this is currently not "
                        "supported.")
    return param.device


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """All parameters flattened and concatenated into one vector (differentiable)."""
    from ... import functional as _F

    device = None
    vec = []
    for param in parameters:
        device = _check_same_device(param, device)
        vec.append(_F.reshape(param, (-1,)))
    return _F.cat(vec)


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Copy slices of ``vec`` into the parameters' data, in order."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected symgrad.Tensor, but got: {type(vec).__name__}")
    device = None
    pointer = 0
    for param in parameters:
        device = _check_same_device(param, device)
        n = param.numel()
        param.data = vec[pointer:pointer + n].reshape(param.shape).data
        pointer += n
