"""Ops that only exist as in-place methods: ``zero_``, ``fill_``, ``copy_``.

``Tensor.zero_/fill_/copy_`` run these out of place and write the result into the
tensor (see ``Tensor._inplace``), so they get PyTorch's grad_fn names. add_, sub_, mul_,
div_ and clamp_ reuse the out-of-place specs (AddBackward0, ..., ClampBackward1), as
PyTorch does. The gradient a constant fill passes back is zero, made without
multiplying (``grad * 0`` would turn an infinite gradient into NaN).
"""

from __future__ import annotations

from .registry import register
from .spec import OpSpec


def _zeros_like(grad):
    from ..creation import zeros_like  # lazily: ops stay free of the tensor layer at import

    return zeros_like(grad)


register(OpSpec(
    "zero_", "ZeroBackward0", ("self",),
    lambda be, self: be.full(self.shape, 0, self.dtype),
    {"self": lambda grad: _zeros_like(grad)},
    lambda sp, x: sp.Integer(0), dtype_rule="same",
    doc="``t.zero_()``: every element becomes 0."))
register(OpSpec(
    "fill_", "FillBackward2", ("self",),
    lambda be, self, value: be.full(self.shape, value, self.dtype),
    {"self": lambda grad: _zeros_like(grad)},
    lambda sp, x, value: sp.sympify(value), dtype_rule="same",
    doc="``t.fill_(number)``."))
register(OpSpec(
    "fill_tensor_", "FillBackward3", ("self", "value"),
    lambda be, self, value: be.copy(be.broadcast_to(be.cast(value, self.dtype), self.shape)),
    {"self": lambda grad: _zeros_like(grad), "value": lambda grad: grad.sum()},
    lambda sp, x, value: value, dtype_rule="same",
    doc="``t.fill_(zero_dim_tensor)``: the value's gradient is the sum of the incoming one."))
register(OpSpec(
    "copy_", "CopyBackwards", ("self", "src"),
    lambda be, self, src: be.copy(be.broadcast_to(be.cast(src, self.dtype), self.shape)),
    {"self": lambda grad: _zeros_like(grad), "src": lambda grad: grad},
    lambda sp, x, src: src, dtype_rule="same",
    doc="``t.copy_(src)``: src is broadcast and cast to t; PyTorch names the node "
        "torch::autograd::CopyBackwards. The engine sums the gradient back to src's shape "
        "and casts it to src's dtype."))
