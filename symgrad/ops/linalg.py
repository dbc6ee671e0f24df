"""Matrix products. ``matmul`` dispatches to these exactly as PyTorch's does."""

from __future__ import annotations

from .registry import register
from .spec import STRUCTURAL, OpSpec

register(OpSpec(
    "mm", "MmBackward0", ("self", "mat2"), lambda be, self, mat2: be.matmul(self, mat2),
    {"self": lambda grad, mat2, self_sym_sizes, self_sym_strides: grad.mm(mat2.t()),
     "mat2": lambda grad, self, mat2_sym_sizes, mat2_sym_strides: self.t().mm(grad)},
    STRUCTURAL, dtype_rule="same_required"))
register(OpSpec(
    "mv", "MvBackward0", ("self", "vec"), lambda be, self, vec: be.matmul(self, vec),
    {"self": lambda grad, vec: grad.unsqueeze(1).mm(vec.unsqueeze(0)),
     "vec": lambda grad, self: self.t().mm(grad.unsqueeze(1)).squeeze(1)},
    STRUCTURAL, dtype_rule="same_required"))
register(OpSpec(
    "dot", "DotBackward0", ("self", "tensor"), lambda be, self, tensor: be.matmul(self, tensor),
    {"self": lambda grad, tensor: grad * tensor, "tensor": lambda grad, self: grad * self},
    STRUCTURAL, dtype_rule="same_required"))
register(OpSpec(
    "bmm", "BmmBackward0", ("self", "mat2"), lambda be, self, mat2: be.matmul(self, mat2),
    {"self": lambda grad, mat2: grad.bmm(mat2.transpose(1, 2)),
     "mat2": lambda grad, self: self.transpose(1, 2).bmm(grad)},
    STRUCTURAL, dtype_rule="same_required"))
