"""``symgrad.nn``: Module, Parameter, layers and losses, as in ``torch.nn``."""

from __future__ import annotations

from . import functional, init, utils
from .modules import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    Flatten,
    HuberLoss,
    Identity,
    KLDivLoss,
    L1Loss,
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
    SiLU,
    SmoothL1Loss,
    Softmax,
    Softplus,
    Tanh,
)
from .parameter import Parameter

__all__ = ["Module", "Parameter", "Linear", "Sequential", "ModuleList", "ModuleDict",
           "ParameterList", "ParameterDict", "Identity", "Flatten", "ReLU", "Tanh",
           "Sigmoid", "SiLU", "Softplus", "Softmax", "LogSoftmax", "MSELoss", "BCEWithLogitsLoss",
           "CrossEntropyLoss", "NLLLoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss",
           "KLDivLoss", "functional", "init", "utils"]

# -- tensor functions and normalisation (issue 21) ---------------------------------------------
from .norm_layers import BatchNorm1d, BatchNorm2d, Dropout, Embedding, LayerNorm  # noqa: E402

__all__ += ["LayerNorm", "BatchNorm1d", "BatchNorm2d", "Dropout", "Embedding"]
