"""``symgrad.nn.init``: in-place initializers with PyTorch's formulas.

Numbers come from symgrad's generator (``symgrad.manual_seed``), so they follow torch's
distributions, not torch's exact draws. Initializers write the tensor's data directly and
bump its version, outside any graph, as ``torch.no_grad()`` initializers do.
"""

from __future__ import annotations

import math

import numpy as np

from ..autograd.record import before_write
from ..tensor import Tensor

__all__ = ["calculate_gain", "uniform_", "normal_", "constant_", "zeros_", "ones_",
           "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "xavier_normal_"]


def _rng(generator):
    from ..creation import default_generator

    return generator if generator is not None else default_generator()


def _write(tensor: Tensor, values: np.ndarray) -> Tensor:
    from ..backends import backend_for

    be = backend_for(tensor.device.type)
    before_write(tensor)
    be.copy_(tensor._data, be.from_host(values.astype(tensor._data.dtype, copy=False)))
    tensor._storage.version += 1
    return tensor


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator=None) -> Tensor:
    """Fill with U(a, b), drawn in the tensor's own precision."""
    dt = np.float32 if tensor.dtype.name == "float32" else np.float64
    data = tensor._data
    direct = type(data) is np.ndarray and data.dtype == dt and data.flags.c_contiguous \
        and data.flags.writeable
    if direct:
        before_write(tensor)
    values = data if direct else np.empty(tuple(tensor.shape), dtype=dt)
    _rng(generator).random(out=values, dtype=dt)  # drawn in place: no float64 temporary
    values *= dt(b - a)
    values += dt(a)
    np.clip(values, dt(min(a, b)), dt(max(a, b)), out=values)  # rounding never leaves [a, b]
    if direct:
        tensor._storage.version += 1
        return tensor
    return _write(tensor, values)


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator=None) -> Tensor:
    return _write(tensor, _rng(generator).normal(mean, std, tuple(tensor.shape)))


def constant_(tensor: Tensor, val: float) -> Tensor:
    return _write(tensor, np.full(tuple(tensor.shape), val))


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    linear = ("linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "sigmoid")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    if tensor.ndim < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 "
                         "dimensions")
    receptive = 1
    for s in tensor.shape[2:]:
        receptive *= s
    return tensor.shape[1] * receptive, tensor.shape[0] * receptive


def _fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def kaiming_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu", generator=None) -> Tensor:
    """U(-bound, bound), bound = gain * sqrt(3 / fan); Linear uses a = sqrt(5): 1/sqrt(fan_in)."""
    fan = _fan(tensor, mode)
    if 0 in tuple(tensor.shape):
        return tensor
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in",
                    nonlinearity: str = "leaky_relu", generator=None) -> Tensor:
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return normal_(tensor, 0.0, std, generator)


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator=None) -> Tensor:
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), generator)
