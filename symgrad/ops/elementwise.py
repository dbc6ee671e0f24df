"""Elementwise ops: arithmetic and the unary math functions.

Each stanza gives the forward kernel, one backward formula per input written in tensor
ops, and the scalar SymPy meaning ``sympy(sp, *scalars)``. Unary math ops give a ``Scalar``
instead (symgrad/ops/scalar.py): forward and backward on one element, from which every
backend generates its kernels and this module the formula and the meaning. Broadcast
gradients are summed back to each input's shape by the engine, as PyTorch's engine does,
so formulas here stay as plain as the math.
"""

from __future__ import annotations

from .registry import OPS, register
from .scalar import Scalar, sympy_meaning, tensor_formula
from .spec import OpSpec


def _binary(name, grad_fn, grads, sympy, dtype_rule="promote", **kw):
    kernel = name

    def forward(be, self, other):
        return getattr(be, kernel)(self, other)

    forward.__name__ = name
    return register(OpSpec(name, grad_fn, ("self", "other"), forward, grads, sympy,
                           dtype_rule=dtype_rule, **kw))


#: ``where``/``sign``... on tensors, for the backward formulas built from ``Scalar.grad``
_TENSOR_MATH = {f: (lambda t, _f=f: getattr(t, _f)())
                for f in ("exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "sign", "log1p",
                          "expm1", "erf")}
_TENSOR_MATH["where"] = lambda c, a, b: a.where(c, b)  # a is a tensor in every grad here


def _unary(name, grad_fn, scalar: Scalar, dtype_rule="float"):
    """A unary elementwise op from its scalar math: the backend kernel ``be.<name>`` is
    generated from ``scalar.forward`` by each backend, the backward formula and the SymPy
    meaning here from the same expressions."""
    kernel = name

    def forward(be, self):
        return getattr(be, kernel)(self)

    forward.__name__ = name
    return register(OpSpec(name, grad_fn, ("self",), forward,
                           {"self": tensor_formula(name, scalar, _TENSOR_MATH)},
                           sympy_meaning(name, scalar), dtype_rule=dtype_rule, scalar=scalar))


def scalar_ops(arity: int = 1) -> tuple[str, ...]:
    """Ops whose kernels backends generate from the stanza's ``Scalar`` (registry query)."""
    return tuple(n for n, s in OPS.items() if s.scalar is not None and len(s.inputs) == arity)


def unary_fused_backward() -> tuple[str, ...]:
    """Unary ops whose whole backward is ``grad`` and one saved array through a scalar rule;
    a backend with fused kernels offers ``<op>_backward(grad, needed, saved)`` for each."""
    return tuple(n for n in scalar_ops(1) if OPS[n].scalar.operand is not None)


# -- arithmetic (alpha follows torch.add(a, b, alpha=1)) -----------------------------------
register(OpSpec(
    "add", "AddBackward0", ("self", "other"),
    lambda be, self, other, alpha=1: be.add(self, other if alpha == 1 else be.mul(other, alpha)),
    {"self": lambda grad: grad, "other": lambda grad, alpha: grad if alpha == 1 else grad * alpha},
    lambda sp, x, y, alpha=1: x + alpha * y))
register(OpSpec(
    "sub", "SubBackward0", ("self", "other"),
    lambda be, self, other, alpha=1: be.sub(self, other if alpha == 1 else be.mul(other, alpha)),
    {"self": lambda grad: grad,
     "other": lambda grad, alpha: -grad if alpha == 1 else grad * -alpha},
    lambda sp, x, y, alpha=1: x - alpha * y))
register(OpSpec(
    "rsub", "RsubBackward1", ("self",),
    lambda be, self, other, alpha=1: be.sub(other, self if alpha == 1 else be.mul(self, alpha)),
    {"self": lambda grad, alpha: -grad if alpha == 1 else grad * -alpha},
    lambda sp, x, other, alpha=1: other - alpha * x,
    doc="``scalar - tensor``: torch's rsub.Scalar, one tensor input."))
_binary("mul", "MulBackward0",
        {"self": lambda grad, other: grad * other, "other": lambda grad, self: grad * self},
        lambda sp, x, y: x * y)
_binary("div", "DivBackward0",
        {"self": lambda grad, other: grad / other,
         "other": lambda grad, self, other: -grad * self / (other * other)},
        lambda sp, x, y: x / y, dtype_rule="promote_float")
_unary("neg", "NegBackward0", Scalar("-x", "-g"), dtype_rule="same")
_unary("reciprocal", "ReciprocalBackward0", Scalar("1 / x", "-g * y * y"))

# -- powers: tensor**scalar, tensor**tensor, scalar**tensor (torch's three overloads) -------
register(OpSpec(
    "pow", "PowBackward0", ("self",),
    lambda be, self, exponent: be.pow(self, exponent),
    {"self": lambda grad, self, exponent:
        grad * 0 if exponent == 0 else grad * exponent * self ** (exponent - 1)},
    lambda sp, x, exponent: x ** exponent, dtype_rule="promote"))
register(OpSpec(
    "pow_tensor", "PowBackward1", ("self", "exponent"),
    lambda be, self, exponent: be.pow(self, exponent),
    {"self": lambda grad, self, exponent:
        grad * exponent * self ** (exponent - 1),
     "exponent": lambda grad, self, exponent, result:
        grad * (result * self.log()).where((self != 0) | (exponent < 0), 0.0)},
    lambda sp, x, y: x ** y, dtype_rule="promote"))
register(OpSpec(
    "pow_scalar_base", "PowBackward2", ("exponent",),
    lambda be, exponent, self: be.pow(self, exponent),
    {"exponent": lambda grad, self, exponent, result:
        grad * (result * _log(self)) if self != 0 else grad * 0 * exponent},
    lambda sp, y, self: self ** y, dtype_rule="promote"))


def _log(x: float) -> float:
    import math

    return math.log(x)


# -- unary math ------------------------------------------------------------------------------
_unary("exp", "ExpBackward0", Scalar("exp(x)", "g * y"))
_unary("log", "LogBackward0", Scalar("log(x)", "g / x"))
_unary("sin", "SinBackward0", Scalar("sin(x)", "g * cos(x)"))
_unary("cos", "CosBackward0", Scalar("cos(x)", "g * -sin(x)"))
_unary("tanh", "TanhBackward0", Scalar("tanh(x)", "g * (1 - y * y)"))
# overflow-free in both tails: exp only ever sees -|x|
_unary("sigmoid", "SigmoidBackward0", Scalar(
    "e = exp(-abs(x)); where(x >= 0, 1 / (1 + e), e / (1 + e))", "g * (y * (1 - y))",
    meaning="1 / (1 + exp(-x))"))
_unary("sqrt", "SqrtBackward0", Scalar("sqrt(x)", "g / (2 * y)"))
# Kinks follow PyTorch: relu'(0) = 0 and abs'(0) = sign(0) = 0; relu(NaN) is NaN.
_unary("relu", "ReluBackward0", Scalar("maximum(x, 0)", "g * (y > 0)",
                                       meaning="where(x > 0, x, 0)"), dtype_rule="same")
_unary("abs", "AbsBackward0", Scalar("abs(x)", "g * sign(x)"), dtype_rule="same")
_unary("sign", "SignBackward0", Scalar("sign(x)", "g * 0"), dtype_rule="same")
_unary("log1p", "Log1PBackward0", Scalar("log1p(x)", "g / (1 + x)"))
_unary("expm1", "Expm1Backward0", Scalar("expm1(x)", "g * (y + 1)"))

# -- comparisons: bool results, no gradient --------------------------------------------------
for _name in ("gt", "ge", "lt", "le", "eq", "ne"):
    _binary(_name, None, {}, None, dtype_rule="bool_compare")
for _name in ("logical_or", "logical_and"):
    _binary(_name, None, {}, None, dtype_rule="bool")

# -- where(condition, self, other): selection, so structural -----------------------------
register(OpSpec(
    "where", "WhereBackward0", ("condition", "self", "other"),
    lambda be, condition, self, other: be.where(condition, self, other),
    {"self": lambda grad, condition: grad.where(condition, 0.0),
     "other": lambda grad, condition: grad.where(condition.logical_not(), 0.0)},
    lambda sp, c, x, y: x if c else y, nondifferentiable=("condition",), dtype_rule="where"))
register(OpSpec("logical_not", None, ("self",), lambda be, self: be.logical_not(self),
                dtype_rule="bool"))

# -- addcmul: x + value * t1 * t2 in one pass (the ``a*b + a`` pattern without temporaries) --
register(OpSpec(
    "addcmul", "AddcmulBackward0", ("self", "tensor1", "tensor2"),
    lambda be, self, tensor1, tensor2, value=1: be.addcmul(self, tensor1, tensor2, value),
    {"self": lambda grad: grad,
     "tensor1": lambda grad, tensor2, value: grad * (tensor2 * value),
     "tensor2": lambda grad, tensor1, value: grad * (tensor1 * value)},
    lambda sp, x, t1, t2, value=1: x + value * t1 * t2))

# -- fused backward kernels ------------------------------------------------------------------
# A backend offering ``<op>_backward(grad, needed, *saved)`` runs the op's whole backward
# in one pass when no graph is recorded (symgrad/backends/cpu); the formulas above stay the
# definition, used under create_graph=True, and tests prove both equal.
UNARY_FUSED_BACKWARD = unary_fused_backward()
for _name in UNARY_FUSED_BACKWARD + ("neg", "sign", "pow", "mul", "div", "where"):
    OPS[_name].fused_backward = _name + "_backward"
