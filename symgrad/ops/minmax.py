"""max/min (whole tensor, along a dim, elementwise), argmax/argmin and clamp.

Kinks follow PyTorch: a whole-tensor max spreads the gradient evenly over ties, max along
a dim sends it to the index it returned (the first maximum), ``maximum`` halves it at
ties, and clamp passes it where ``min <= x <= max``.
"""

from __future__ import annotations

from .. import _tensor_layer as _tl
from ._ints import norm
from .elementwise import elementwise
from .registry import register
from .scalar import Scalar
from .spec import STRUCTURAL, OpSpec


def evenly_distribute_backward(grad, self, result):
    """PyTorch's rule for ``max()``/``min()``: every tied element gets an equal share."""
    mask = (self == result) | ((self != self) & (result != result))  # NaN ties NaN
    return mask * (grad / mask.sum())


def value_selecting_backward(grad, dim, indices, keepdim, self_sym_sizes):
    """Gradient of ``max(dim)``/``min(dim)``: scattered to the returned indices."""
    sizes = tuple(self_sym_sizes)
    if not sizes:
        return grad
    d = norm(dim, len(sizes))
    if not keepdim:
        grad = grad.unsqueeze(d)
        indices = indices.unsqueeze(d)
    positions = _tl.arange(sizes[d], device=grad.device).reshape(
        [sizes[d] if i == d else 1 for i in range(len(sizes))])
    return grad * (indices == positions)


def _axis(x, dim):
    return norm(dim, x.ndim)


def _reduce_dim(value_kernel, index_kernel):
    def forward(be, self, dim, keepdim):
        if self.ndim == 0:  # torch: max(0) of a scalar is the scalar and index 0
            flat = be.reshape(self, (1,))
            return be.copy(self), be.reshape(getattr(be, index_kernel)(flat, 0, False), ())
        ax = _axis(self, dim)
        return (getattr(be, value_kernel)(self, ax, keepdim),
                getattr(be, index_kernel)(self, ax, keepdim))

    return forward


for _name, _kernel, _arg in (("max", "amax", "argmax"), ("min", "amin", "argmin")):
    _Cap = _name.capitalize()
    register(OpSpec(
        _name, f"{_Cap}Backward1", ("self",),
        (lambda k: lambda be, self: getattr(be, k)(self, None, False))(_kernel),
        {"self": lambda grad, self, result: evenly_distribute_backward(grad, self, result)},
        STRUCTURAL, dtype_rule="same", doc=f"``{_name}()`` over all elements."))
    register(OpSpec(
        f"{_name}_dim", f"{_Cap}Backward0", ("self",), _reduce_dim(_kernel, _arg),
        {"self": lambda grad, dim, indices, keepdim, self_sym_sizes:
            value_selecting_backward(grad, dim, indices, keepdim, self_sym_sizes)},
        STRUCTURAL, dtype_rule="same", outputs=("result", "indices"),
        doc=f"``{_name}(dim)``: values and (non-differentiable) indices."))
    register(OpSpec(
        _arg, None, ("self",),
        (lambda k: lambda be, self, dim=None, keepdim=False, dtype=None:
            getattr(be, k)(self, None if dim is None else norm(dim, self.ndim), keepdim))(_arg),
        dtype_rule="param", doc="int64 indices, no gradient (dtype param is always int64)."))

# PyTorch's maximum: at ties each side gets half; a NaN side keeps the whole gradient.
_AB = ("a", "b")
elementwise("maximum", "MaximumBackward0", Scalar(
    "maximum(a, b)", ("g * (1 - (a < b) - 0.5 * (a == b))", "g * (1 - (a > b) - 0.5 * (a == b))"),
    inputs=_AB), inputs=("self", "other"), dtype_rule="promote")
elementwise("minimum", "MinimumBackward0", Scalar(
    "minimum(a, b)", ("g * (1 - (a > b) - 0.5 * (a == b))", "g * (1 - (a < b) - 0.5 * (a == b))"),
    inputs=_AB), inputs=("self", "other"), dtype_rule="promote")


def _clamp_forward(be, self, min=None, max=None):  # noqa: A002
    out = self
    if min is not None:
        out = be.maximum(out, min)
    if max is not None:
        out = be.minimum(out, max)
    return out


def _in_range(self, min, max):  # noqa: A002
    if min is None:
        return self <= max
    if max is None:
        return self >= min
    return (self >= min) & (self <= max)


def _sympy_clamp(sp, x, min=None, max=None):  # noqa: A002
    if min is not None:
        x = sp.Max(x, min)
    if max is not None:
        x = sp.Min(x, max)
    return x


register(OpSpec(
    "clamp", "ClampBackward1", ("self",), _clamp_forward,
    {"self": lambda grad, self, min, max: grad * _in_range(self, min, max)},
    _sympy_clamp, dtype_rule="same", doc="clamp with number bounds (either may be None)."))
register(OpSpec(
    "clamp_min", "ClampMinBackward0", ("self",),
    lambda be, self, min: be.maximum(self, min),
    {"self": lambda grad, self, min: grad * (self >= min)},
    lambda sp, x, min: sp.Max(x, min), dtype_rule="same"))
register(OpSpec(
    "clamp_max", "ClampMaxBackward0", ("self",),
    lambda be, self, max: be.minimum(self, max),
    {"self": lambda grad, self, max: grad * (self <= max)},
    lambda sp, x, max: sp.Min(x, max), dtype_rule="same"))


def _clamp_min_max_grads():
    def self_grad(grad, self, min, max):  # noqa: A002
        return grad * ((self >= min) & (self <= max))

    def min_grad(grad, self, min, max):  # noqa: A002
        return grad * ((self < min) & (min < max))

    def max_grad(grad, self, min, max):  # noqa: A002
        return grad * ((self > max) | (max < min))

    return {"self": self_grad, "min": min_grad, "max": max_grad}


register(OpSpec(
    "clamp_tensor", "ClampBackward0", ("self", "min", "max"),
    lambda be, self, min, max: be.minimum(be.maximum(self, min), max),  # noqa: A006
    _clamp_min_max_grads(), lambda sp, x, lo, hi: sp.Min(sp.Max(x, lo), hi),
    doc="clamp with tensor bounds."))


def _one_bound_grads(kind):
    """Formulas for clamp(min=t) / clamp(max=t): the missing bound is a None parameter, so
    ``_saved_max``/``_saved_min`` read None and the input slot has no edge, as in torch."""
    if kind == "min":
        return {"self": lambda grad, self, min, max: grad * (self >= min),
                "min": lambda grad, self, min, max: grad * (self < min)}
    return {"self": lambda grad, self, min, max: grad * (self <= max),
            "max": lambda grad, self, min, max: grad * (self > max)}


register(OpSpec(
    "clamp_tensor_min", "ClampBackward0", ("self", "min", "_max"),
    lambda be, self, min, _max, max=None: be.maximum(self, min),  # noqa: A006
    _one_bound_grads("min"), lambda sp, x, lo, _hi, max=None: sp.Max(x, lo),
    dtype_rule="same", nondifferentiable=("_max",), doc="clamp(min=tensor)."))
register(OpSpec(
    "clamp_tensor_max", "ClampBackward0", ("self", "_min", "max"),
    lambda be, self, _min, max, min=None: be.minimum(self, max),  # noqa: A006
    _one_bound_grads("max"), lambda sp, x, _lo, hi, min=None: sp.Min(x, hi),
    dtype_rule="same", nondifferentiable=("_min",), doc="clamp(max=tensor)."))
register(OpSpec(
    "clamp_min_tensor", "ClampMinBackward1", ("self", "min"),
    lambda be, self, min: be.maximum(self, min),  # noqa: A006
    {"self": lambda grad, self, min: grad * (self >= min),  # noqa: A006
     "min": lambda grad, self, min: grad * (self < min)},  # noqa: A006
    lambda sp, x, lo: sp.Max(x, lo), doc="``clamp_min(tensor)`` (torch's clamp_min.Tensor)."))
register(OpSpec(
    "clamp_max_tensor", "ClampMaxBackward1", ("self", "max"),
    lambda be, self, max: be.minimum(self, max),  # noqa: A006
    {"self": lambda grad, self, max: grad * (self <= max),  # noqa: A006
     "max": lambda grad, self, max: grad * (self > max)},  # noqa: A006
    lambda sp, x, hi: sp.Min(x, hi), doc="``clamp_max(tensor)`` (torch's clamp_max.Tensor)."))
