"""``symgrad.autograd``: backward, grad, grad modes and graph objects (PyTorch's API)."""

from __future__ import annotations

from . import functional, graph, profiler
from .anomaly_mode import (
    detect_anomaly,
    is_anomaly_check_nan_enabled,
    is_anomaly_enabled,
    set_detect_anomaly,
)
from .custom_function import Function, FunctionCtx, once_differentiable
from .engine import backward, grad, run_backward  # noqa: F401  (run_backward: public as before)
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
