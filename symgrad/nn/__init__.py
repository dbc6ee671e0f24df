"""``symgrad.nn``: Module, Parameter, layers and losses, as in ``torch.nn``."""

from __future__ import annotations

from . import functional, init
from .modules import (
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    Flatten,
    Identity,
    Linear,
    LogSoftmax,
    Module,
    MSELoss,
    NLLLoss,
    ReLU,
    Sequential,
    Sigmoid,
    Softmax,
    Tanh,
)
from .parameter import Parameter

__all__ = ["Module", "Parameter", "Linear", "Sequential", "Identity", "Flatten", "ReLU", "Tanh",
           "Sigmoid", "Softmax", "LogSoftmax", "MSELoss", "BCEWithLogitsLoss",
           "CrossEntropyLoss", "NLLLoss", "functional", "init"]
