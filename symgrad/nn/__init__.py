"""``symgrad.nn``: Module, Parameter, layers and losses, as in ``torch.nn``."""

from __future__ import annotations

from . import functional, init, utils
from .modules import (
    ELU,
    GELU,
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    Flatten,
    Hardtanh,
    HuberLoss,
    Identity,
    KLDivLoss,
    L1Loss,
    LeakyReLU,
    Linear,
    LogSigmoid,
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
           "Sigmoid", "SiLU", "Softplus", "GELU", "LeakyReLU", "ELU", "LogSigmoid",
           "Hardtanh", "Softmax", "LogSoftmax", "MSELoss", "BCEWithLogitsLoss",
           "CrossEntropyLoss", "NLLLoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss",
           "KLDivLoss", "functional", "init", "utils"]

# -- convolution and pooling (issue 21)
from .conv import AdaptiveAvgPool2d, AvgPool2d, Conv1d, Conv2d, MaxPool2d  # noqa: E402

__all__ += ["Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d"]

# -- attention (issue 21)
from .multihead_attention import MultiheadAttention  # noqa: E402

__all__ += ["MultiheadAttention"]

# -- tensor functions and normalisation (issue 21) ---------------------------------------------
from .norm_layers import BatchNorm1d, BatchNorm2d, Dropout, Embedding, LayerNorm  # noqa: E402

__all__ += ["LayerNorm", "BatchNorm1d", "BatchNorm2d", "Dropout", "Embedding"]

# -- recurrent layers (issue 31)
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase  # noqa: E402

__all__ += ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]
