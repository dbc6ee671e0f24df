"""``symgrad.autograd``: backward, grad, grad modes and graph objects (PyTorch's API)."""

from __future__ import annotations

import numpy as np

from . import functional, graph, profiler
from .anomaly_mode import (
    detect_anomaly,
    is_anomaly_check_nan_enabled,
    is_anomaly_enabled,
    set_detect_anomaly,
)
from .custom_function import Function, FunctionCtx, once_differentiable
from .engine import run_backward
from .grad_mode import (
    enable_grad,
    inference_mode,
    is_grad_enabled,
    is_inference_mode_enabled,
    no_grad,
    set_grad_enabled,
)
from .gradcheck import gradcheck, gradgradcheck
from .node import AccumulateGrad, Node, SavedTensor
from .variable import Variable

__all__ = ["backward", "grad", "no_grad", "enable_grad", "set_grad_enabled", "inference_mode",
           "is_grad_enabled", "is_inference_mode_enabled", "Node", "AccumulateGrad",
           "Function", "FunctionCtx", "once_differentiable", "graph", "profiler",
           "detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
           "is_anomaly_check_nan_enabled", "gradcheck", "gradgradcheck", "functional",
           "Variable", "SavedTensor"]


_Tensor = None


def _tensor_type():
    global _Tensor
    if _Tensor is None:  # tensor.py imports this package: resolved on first use
        from ..tensor import Tensor

        _Tensor = Tensor
    return _Tensor


def _as_list(x):
    if x is None:
        return None
    if isinstance(x, _Tensor or _tensor_type()):
        return [x]
    return list(x)


def _make_grads(outputs, grad_outputs, create_graph):
    grads = []
    for i, out in enumerate(outputs):
        g = grad_outputs[i] if grad_outputs is not None and i < len(grad_outputs) else None
        if g is None:
            data = out._data
            if data.size != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if data.dtype.kind != "f":
                raise RuntimeError("grad can be implicitly created only for real scalar "
                                   f"outputs but got {out.dtype!r}")
            if out._device.type == "cpu":  # the common case, without the factory's checks
                g = type(out)._wrap(np.ones(data.shape, data.dtype), out._device)
            else:
                from ..creation import ones_like

                g = ones_like(out)
        else:
            if tuple(g.shape) != tuple(out.shape):
                raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of "
                                   f"{g.shape!r} and output[{i}] has a shape of {out.shape!r}.")
            if g.dtype is not out.dtype:
                g = g.to(out.dtype)
        grads.append(g)
    return grads


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None) -> None:
    """Accumulate gradients of ``tensors`` into the leaves' ``.grad``."""
    outputs = _as_list(tensors)
    grads = _make_grads(outputs, _as_list(grad_tensors), create_graph)
    if retain_graph is None:
        retain_graph = create_graph
    inputs = _as_list(inputs)
    if inputs is not None and len(inputs) == 0:
        raise RuntimeError("'inputs' argument to backward() cannot be empty.")
    run_backward(outputs, grads, retain_graph=retain_graph, create_graph=create_graph,
                 inputs=inputs, accumulate=True)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool | None = None,
         materialize_grads: bool = False) -> tuple:
    """Return the gradients of ``outputs`` with respect to ``inputs`` (no ``.grad`` touched)."""
    outs = _as_list(outputs)
    ins = _as_list(inputs)
    grads = _make_grads(outs, _as_list(grad_outputs), create_graph)
    if retain_graph is None:
        retain_graph = create_graph
    if allow_unused is None:
        allow_unused = materialize_grads
    result = run_backward(outs, grads, retain_graph=retain_graph, create_graph=create_graph,
                          inputs=ins, accumulate=False, allow_unused=allow_unused)
    if materialize_grads:
        from ..creation import zeros_like

        result = tuple(zeros_like(x) if r is None else r for r, x in zip(result, ins))
    return result
