"""Gradient clipping, as ``torch.nn.utils.clip_grad``: same arguments, return values, errors.

``foreach`` is accepted and ignored (symgrad has one code path; torch's foreach and loop
paths give the same values). Norms are computed in each gradient's dtype and combined as
torch does: the norm of the per-tensor norms, so float32 gradients give a float32 total.
"""

from __future__ import annotations

import functools
import math
import types
import warnings
from collections.abc import Iterable

import numpy as np

from ...autograd.grad_mode import no_grad
from ...tensor import Tensor

__all__ = ["clip_grad_norm", "clip_grad_norm_", "clip_grad_value_", "clip_grads_with_norm_",
           "get_total_norm"]

TensorOrTensors = Tensor | Iterable[Tensor]


def _no_grad(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with no_grad():
            return fn(*args, **kwargs)

    return wrapper


def _vector_norm(x: Tensor, p: float) -> Tensor:
    """``torch.linalg.vector_norm(x, p)`` of all elements (0-d result, x's dtype)."""
    from ... import functional as _F
    from ...creation import zeros

    if x.numel() == 0:
        return zeros((), dtype=x.dtype, device=x.device)
    a = _F.abs(_F.reshape(x, (-1,)))
    if p == math.inf:
        return _F.max(a)
    if p == -math.inf:
        return _F.min(a)
    if p == 0:
        return _F.sum(_F.to_dtype(_F.ne(a, 0), x.dtype))
    if p == 1:
        return _F.sum(a)
    if p == 2:
        return _F.sqrt(_F.sum(_F.mul(a, a)))
    return _F.pow(_F.sum(_F.pow(a, p)), 1.0 / p)


@_no_grad
def get_total_norm(tensors: TensorOrTensors, norm_type: float = 2.0,
                   error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """The ``norm_type``-norm of all ``tensors`` together, as one 0-d tensor."""
    from ... import functional as _F
    from ...tensor import tensor

    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    first_device = tensors[0].device
    norms = [_vector_norm(g, norm_type) for g in tensors]
    total_norm = _vector_norm(_F.stack([n.to(first_device) for n in norms]), norm_type)
    if error_if_nonfinite and not math.isfinite(total_norm.item()):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                           "`parameters` is non-finite, so it cannot be clipped. To disable "
                           "this error and scale the gradients by the non-finite norm anyway, "
                           "set `error_if_nonfinite=False`")
    return total_norm


@_no_grad
def clip_grads_with_norm_(parameters: TensorOrTensors, max_norm: float, total_norm: Tensor,
                          foreach: bool | None = None) -> None:
    """Scale every ``.grad`` by ``min(1, max_norm / (total_norm + 1e-6))`` in place."""
    from ... import functional as _F

    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    max_norm = float(max_norm)
    if not grads:
        return
    clip_coef = _F.div(max_norm, _F.add(total_norm, 1e-6))
    clip_coef_clamped = _F.clamp(clip_coef, max=1.0)
    with np.errstate(invalid="ignore"):  # inf * 0 is nan, silently, as in torch
        for g in grads:
            g.mul_(clip_coef_clamped.to(g.device))


@_no_grad
def clip_grad_norm_(parameters: TensorOrTensors, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Rescale gradients so their total norm is at most ``max_norm``; returns the norm
    before clipping (a 0-d tensor), as torch does."""
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    else:
        is_generator = isinstance(parameters, types.GeneratorType)
        parameters = list(parameters)
        if is_generator and not parameters:
            warnings.warn("`parameters` is an empty generator, no gradient clipping will occur.",
                          stacklevel=3)
    grads = [p.grad for p in parameters if p.grad is not None]
    total_norm = get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
    clip_grads_with_norm_(parameters, max_norm, total_norm, foreach)
    return total_norm


def clip_grad_norm(parameters: TensorOrTensors, max_norm: float, norm_type: float = 2.0,
                   error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Deprecated spelling of :func:`clip_grad_norm_` (torch's FutureWarning)."""
    warnings.warn("`torch.nn.utils.clip_grad_norm` is now deprecated in favor of "
                  "`torch.nn.utils.clip_grad_norm_`.", FutureWarning, stacklevel=2)
    return clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


@_no_grad
def clip_grad_value_(parameters: TensorOrTensors, clip_value: float,
                     foreach: bool | None = None) -> None:
    """Clamp every ``.grad`` into ``[-clip_value, clip_value]`` in place; returns None."""
    from ... import functional as _F

    if isinstance(parameters, Tensor):
        parameters = [parameters]
    clip_value = float(clip_value)
    for p in parameters:
        g = p.grad
        if g is not None:
            g.copy_(_F.clamp(g, min=-clip_value, max=clip_value))
