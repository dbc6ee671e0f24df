"""Every op, defined once. Importing this package fills ``OPS``."""

from . import (  # noqa: F401
               activation,  # gelu, leaky_relu, elu, logsigmoid, hardtanh
               device,  # to_cuda / to_cpu (ToCopyBackward0)
               elementwise,
               indexing,
               inplace,  # noqa: F401  (zero_, fill_, copy_)
               linalg,
               loss,  # smooth_l1 / huber / bce, xlogy, aten Scalar overloads
               minmax,
               movement,
               nn,
               reduce,
               shape,  # (registration)
               softmax,
)
from .registry import OPS, check_complete, register
from .spec import STRUCTURAL, OpSpec

__all__ = ["OPS", "OpSpec", "STRUCTURAL", "check_complete", "register"]

# -- convolution and pooling (issue 21)
from . import conv, pool  # noqa: E402,F401
