"""Every op, defined once. Importing this package fills ``OPS``."""

from . import (  # noqa: F401
               activation,  # gelu, leaky_relu, elu, logsigmoid, hardtanh
               device,  # to_cuda / to_cpu (ToCopyBackward0)
               elementwise,
               gather,  # gather, scatter, index_select, index_add (issue 21)
               indexing,
               inplace,  # noqa: F401  (zero_, fill_, copy_)
               linalg,
               loss,  # smooth_l1 / huber / bce, xlogy, aten Scalar overloads
               minmax,
               movement,
               nn,
               norm,  # layer_norm, batch_norm, embedding (issue 21)
               reduce,
               reorder,  # sort, topk, tril, triu, roll, repeat (issue 21)
               scan,  # cumsum, cumprod, flip (issue 21)
               shape,  # (registration)
               softmax,
               split,  # split, split_with_sizes, unbind: one node, several views (issue 21)
               stats,  # var, std, linalg_vector_norm (issue 21)
)
from .registry import OPS, check_complete, register
from .spec import STRUCTURAL, OpSpec

__all__ = ["OPS", "OpSpec", "STRUCTURAL", "check_complete", "register"]

# -- convolution and pooling (issue 21)
# -- and torch's fused CPU attention node (attention)
from . import attention, conv, pool  # noqa: E402,F401
