"""``symgrad.nn``: Module, Parameter, layers and losses, as in ``torch.nn``."""

from __future__ import annotations

from . import functional, init, utils
from .modules import (
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    Flatten,
    Identity,
    Linear,
    LogSoftmax,
    Module,
    ModuleDict,
    ModuleList,
    MSELoss,
    NLLLoss,
    ParameterDict,
    ParameterList,
    ReLU,
    Sequential,
    Sigmoid,
    Softmax,
    Tanh,
)
from .parameter import Parameter

__all__ = ["Module", "Parameter", "Linear", "Sequential", "ModuleList", "ModuleDict",
           "ParameterList", "ParameterDict", "Identity", "Flatten", "ReLU", "Tanh",
           "Sigmoid", "Softmax", "LogSoftmax", "MSELoss", "BCEWithLogitsLoss",
           "CrossEntropyLoss", "NLLLoss", "functional", "init", "utils"]
