"""Ops that only exist as in-place methods: ``zero_``, ``fill_``, ``copy_``, the in-place
comparisons (``gt_`` ...) and the random initialisers (``uniform_`` ...).

``Tensor.zero_/fill_/copy_`` run these out of place and write the result into the
tensor (see ``Tensor._inplace``), so they get PyTorch's grad_fn names. add_, sub_, mul_,
div_ and clamp_ reuse the out-of-place specs (AddBackward0, ..., ClampBackward1), as
PyTorch does. The gradient a constant fill passes back is zero, made without
multiplying (``grad * 0`` would turn an infinite gradient into NaN).
"""

from __future__ import annotations

from .. import _tensor_layer as _tl
from . import elementwise  # noqa: F401  (the comparisons the in-place twins are made from)
from .registry import OPS, register
from .spec import STRUCTURAL, OpSpec


def _zeros_like(grad):
    return _tl.zeros_like(grad)  # creation's, plugged in (ops never import the tensor layer)


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


# -- in-place comparisons: ``a.gt_(b)`` writes 0/1 in a's dtype ------------------------------
# Out of place a comparison gives a bool tensor outside the graph; in place on a tensor that
# requires grad, PyTorch records GtBackward0 (number) / GtBackward1 (tensor), whose gradients
# are zeros. One pair per registered comparison, so a new comparison gets its in-place twin.
def _comparison_meaning(name):
    def meaning(sp, x, other):
        rel = {"gt": sp.Gt, "ge": sp.Ge, "lt": sp.Lt, "le": sp.Le, "eq": sp.Eq, "ne": sp.Ne}[name]
        return sp.Piecewise((sp.Integer(1), rel(x, other)), (sp.Integer(0), True))

    return meaning


def _comparison_forward(kernel):
    def forward(be, self, other):
        return getattr(be, kernel)(self, other)

    return forward


for _name in [n for n, s in OPS.items() if s.dtype_rule == "bool_compare"]:
    _Cap = _name.capitalize()
    register(OpSpec(
        f"{_name}_", f"{_Cap}Backward0", ("self",), _comparison_forward(_name),
        {"self": lambda grad: _zeros_like(grad)}, _comparison_meaning(_name),
        dtype_rule="same", doc=f"``t.{_name}_(number)``: 1 where the comparison holds, else 0, "
                               "in t's dtype."))
    register(OpSpec(
        f"{_name}_tensor_", f"{_Cap}Backward1", ("self", "other"), _comparison_forward(_name),
        {"self": lambda grad: _zeros_like(grad), "other": lambda grad: _zeros_like(grad)},
        _comparison_meaning(_name), dtype_rule="same",
        doc=f"``t.{_name}_(tensor)``: 1 where the comparison holds, else 0, in t's dtype."))


# -- in-place random initialisers: uniform_, normal_, random_, bernoulli_ ... -----------------
# The numbers are drawn by the caller (symgrad's generator) and handed over as ``values``, so
# the forward is a copy: replaying it (the verifier) gives the recorded numbers, and its
# meaning is structural. The gradient is zero, as in PyTorch (UniformBackward0 ...).
def _random_forward(be, self, *inputs, values):
    return be.copy(values)


for _name, _grad_fn, _inputs, _call in (
        ("uniform_", "UniformBackward0", ("self",), "uniform_(from, to)"),
        ("normal_", "NormalBackward0", ("self",), "normal_(mean, std)"),
        ("random_from_to_", "RandomBackward0", ("self",), "random_(from, to)"),
        ("random_to_", "RandomBackward1", ("self",), "random_(to)"),
        ("random_", "RandomBackward2", ("self",), "random_()"),
        ("bernoulli_", "BernoulliBackward2", ("self",), "bernoulli_(number)"),
        ("bernoulli_tensor_", "BernoulliBackward1", ("self", "p"), "bernoulli_(tensor)"),
        ("exponential_", "ExponentialBackward0", ("self",), "exponential_(lambd)"),
        ("log_normal_", "LogNormalBackward0", ("self",), "log_normal_(mean, std)"),
        ("cauchy_", "CauchyBackward0", ("self",), "cauchy_(median, sigma)"),
        ("geometric_", "GeometricBackward0", ("self",), "geometric_(p)")):
    register(OpSpec(
        _name, _grad_fn, _inputs, _random_forward,
        {n: (lambda grad: _zeros_like(grad)) for n in _inputs}, STRUCTURAL, dtype_rule="same",
        doc=f"``t.{_call}``: t filled with numbers drawn by symgrad's generator (the "
            "``values`` parameter); zero gradient."))
