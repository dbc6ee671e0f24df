"""Elementwise ops: arithmetic and the unary math functions.

Each stanza gives the forward kernel, one backward formula per input written in tensor
ops, and the scalar SymPy meaning ``sympy(sp, *scalars)``. Unary math ops give a ``Scalar``
instead (symgrad/ops/scalar.py): forward and backward on one element, from which every
backend generates its kernels and this module the formula and the meaning. Broadcast
gradients are summed back to each input's shape by the engine, as PyTorch's engine does,
so formulas here stay as plain as the math.
"""

from __future__ import annotations

import inspect
import math

from .. import _tensor_layer as _tl
from .registry import OPS, register
from .scalar import Scalar, sympy_meaning, tensor_formula
from .spec import OpSpec

#: ``where``/``sign``... on tensors, for the backward formulas built from ``Scalar.grad``
_TENSOR_MATH = {f: (lambda t, _f=f: getattr(t, _f)() if hasattr(t, _f) else getattr(math, _f)(t))
                for f in ("exp", "log", "sin", "cos", "tanh", "sqrt", "log1p", "expm1", "erf",
                          "log2", "log10")}
_TENSOR_MATH["abs"] = abs
_TENSOR_MATH["sign"] = lambda t: t.sign()
_TENSOR_MATH["sigmoid"] = lambda t: t.sigmoid()


def _constant(expression: str, like):
    """A constant part of a tensor formula (``2 / sqrt(pi)``), computed by the backend of
    the gradient's device: a float on numeric devices (as the generated kernels fold it),
    exact on the symbolic device, so the rule audit proves erf's and gelu's rules."""
    value = _tl.backend_for(like._device.type).constant(expression)
    return value if isinstance(value, float) else _tl.Tensor._wrap(value, like._device)


_TENSOR_MATH["_constant"] = _constant


def _tensor_where(c, a, b):
    """``where`` in a tensor formula: one branch may be a Python number (``where(c, 0, g)``)."""
    if hasattr(a, "where"):
        return a.where(c, b)
    return b.where(c.logical_not(), a)


_TENSOR_MATH["where"] = _tensor_where


def _forward(name: str, kernel: str, inputs: tuple[str, ...], defaults: dict,
             unused: tuple[str, ...] = ()):
    """``forward(be, <inputs>, <params>=default)`` calling ``be.<kernel>``; the signature is
    explicit because graph readers take the op's parameters and defaults from it. Params in
    ``unused`` are recorded (and saved) but not the kernel's."""

    def forward(be, *args, **params):
        for p in unused:
            params.pop(p, None)
        return getattr(be, kernel)(*args, **params)

    P = inspect.Parameter
    forward.__signature__ = inspect.Signature(
        [P(n, P.POSITIONAL_OR_KEYWORD) for n in ("be",) + inputs]
        + [P(n, P.POSITIONAL_OR_KEYWORD, default=d) for n, d in defaults.items()])
    forward.__name__ = name
    if not defaults and not unused:
        forward.backend_kernel = kernel  # autograd's fast path calls be.<kernel> directly
    return forward


def elementwise(name: str, grad_fn: str | None, scalar: Scalar, *,
                inputs: tuple[str, ...] = ("self",), defaults: dict | None = None,
                grads: dict | None = None, sympy=None, forward=None, kernel: str = "",
                dtype_rule: str = "float", fused: bool = True,
                saved_params: tuple[str, ...] = (), **kw) -> OpSpec:
    """An elementwise op from its scalar math: each backend generates the kernel
    ``be.<name>`` from ``scalar.forward`` (and, with ``fused``, ``be.<name>_backward`` from
    its grads); the tensor-op backward formulas and the SymPy meaning are built here from the
    same expressions. ``grads``/``sympy`` given explicitly replace the built ones where the
    op's tensor-level rule has more than the scalar math (add's ``alpha``). ``saved_params``
    are op arguments torch saves that the scalar math does not read (gelu's
    ``approximate``, which picks the stanza)."""
    if grads is None:
        grads = {n: tensor_formula(name, scalar, _TENSOR_MATH, inputs, i, saved_params)
                 for i, n in enumerate(inputs) if scalar.grads and scalar.grads[i] is not None}
    if sympy is None and grad_fn is not None:
        sympy = sympy_meaning(name, scalar)
    kernel = kernel or name
    forward = forward or _forward(name, kernel, inputs, defaults or {}, saved_params)
    return register(OpSpec(name, grad_fn, inputs, forward, grads, sympy, dtype_rule=dtype_rule,
                           scalar=scalar, kernel=kernel, fused_backward=(name + "_backward")
                           if fused and grad_fn is not None else None, **kw))


def _unary(name, grad_fn, scalar: Scalar, dtype_rule="float", **kw):
    return elementwise(name, grad_fn, scalar, dtype_rule=dtype_rule, **kw)


def _binary(name, grad_fn, scalar: Scalar, dtype_rule="promote", **kw):
    return elementwise(name, grad_fn, scalar, inputs=("self", "other"), dtype_rule=dtype_rule,
                       **kw)


def scalar_kernels(arity: int | None = None) -> tuple[str, ...]:
    """Kernels backends generate from op stanzas (registry query), of ``arity`` inputs."""
    return tuple(s.kernel for s in OPS.values() if s.kernel is not None
                 and (arity is None or len(s.inputs) == arity))


def scalar_ops(arity: int = 1) -> tuple[str, ...]:
    """Ops whose forward kernel backends generate from the stanza (``scalar_kernels``)."""
    return tuple(n for n, s in OPS.items() if s.kernel == n and len(s.inputs) == arity)


def fused_from_stanza() -> tuple[str, ...]:
    """Ops whose fused backward ``be.<op>_backward(grad, needed, *saved)`` backends generate
    from the stanza's grads (the saved operands in ``OpSpec.saved`` order)."""
    return tuple(n for n, s in OPS.items() if s.scalar is not None and s.fused_backward)


def grad_masks(op: str) -> list[tuple[int, ...]]:
    """The subsets of an op's inputs a backend generates a fused backward for (every
    non-empty subset of the inputs with a grad): ``<op>_b<mask>``, e.g. ``mul_b11``."""
    grads = [i for i, t in enumerate(OPS[op].scalar.grads) if t is not None]
    return [tuple(i for k, i in enumerate(grads) if bits >> k & 1)
            for bits in range(1, 1 << len(grads))]


def grad_mask_name(op: str, mask: tuple[int, ...]) -> str:
    n = len(OPS[op].scalar.inputs)
    return f"{op}_b" + "".join("1" if i in mask else "0" for i in range(n))


def grad_mask_args(op: str, mask: tuple[int, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(values, params) the grads of ``mask`` read after ``g``, in the stanza's order."""
    scalar = OPS[op].scalar
    reads = set().union(*(scalar.reads(i) for i in mask))
    params = set().union(*(scalar.param_reads(i) for i in mask))
    return (tuple(v for v in scalar.inputs + ("y",) if v in reads),
            tuple(p for p in scalar.params if p in params))


def unary_fused_backward() -> tuple[str, ...]:
    """Unary ops whose whole backward is ``grad`` and one saved array through a scalar rule."""
    return tuple(n for n in scalar_ops(1) if OPS[n].scalar.operand is not None)


# -- arithmetic (alpha follows torch.add(a, b, alpha=1)) -----------------------------------
# The kernels are the stanzas' ``a + b`` and ``a - b``; alpha scales ``other`` first, and
# torch's maybe_multiply leaves the gradient unscaled at alpha == 1, so add's and sub's
# tensor-level formulas and meanings are written out.
_AB = ("a", "b")


def _scaled_other(kernel: str):
    """``be.<kernel>(self, alpha * other)``; at alpha 1 it is the stanza kernel alone, which
    autograd's fast path then calls directly (``kernel_params``)."""

    def forward(be, self, other, alpha=1):
        return getattr(be, kernel)(self, other if alpha == 1 else be.mul(other, alpha))

    forward.backend_kernel, forward.kernel_params = kernel, {"alpha": 1}
    return forward


elementwise(
    "add", "AddBackward0", Scalar("a + b", ("g", "g"), inputs=_AB), inputs=("self", "other"),
    forward=_scaled_other("add"),
    dtype_rule="promote", fused=False,
    grads={"self": lambda grad: grad,
           "other": lambda grad, alpha: grad if alpha == 1 else grad * alpha},
    sympy=lambda sp, x, y, alpha=1: x + alpha * y)
elementwise(
    "sub", "SubBackward0", Scalar("a - b", ("g", "-g"), inputs=_AB), inputs=("self", "other"),
    forward=_scaled_other("sub"),
    dtype_rule="promote", fused=False,
    grads={"self": lambda grad: grad,
           "other": lambda grad, alpha: -grad if alpha == 1 else grad * -alpha},
    sympy=lambda sp, x, y, alpha=1: x - alpha * y)
register(OpSpec(
    "rsub", "RsubBackward1", ("self",),
    lambda be, self, other, alpha=1: be.sub(other, self if alpha == 1 else be.mul(self, alpha)),
    {"self": lambda grad, alpha: -grad if alpha == 1 else grad * -alpha},
    lambda sp, x, other, alpha=1: other - alpha * x,
    doc="``scalar - tensor``: torch's rsub.Scalar, one tensor input."))
_binary("mul", "MulBackward0", Scalar("a * b", ("g * b", "g * a"), inputs=_AB))
_binary("div", "DivBackward0", Scalar("a / b", ("g / b", "-g * a / (b * b)"), inputs=_AB),
        dtype_rule="promote_float")
_unary("neg", "NegBackward0", Scalar("-x", "-g"), dtype_rule="same")
_unary("reciprocal", "ReciprocalBackward0", Scalar("1 / x", "-g * y * y"))
# atan2 and hypot as torch computes them: atan2's 1/(a^2 + b^2) is taken as 0 where the
# sum is 0 (grads 0 at the origin, not NaN); hypot reads its result
_ATAN2_R = "d = a * a + b * b; r = where(d == 0, 0.0, 1 / d); "
_binary("atan2", "Atan2Backward0", Scalar(
    "atan2(a, b)", (_ATAN2_R + "g * b * r", _ATAN2_R + "g * -a * r"),
    meaning="where(a * a + b * b == 0, 0, atan2(a, b))", inputs=_AB),
    dtype_rule="promote_float")
_binary("hypot", "HypotBackward0", Scalar("hypot(a, b)", ("g * a / y", "g * b / y"),
                                          meaning="sqrt(a * a + b * b)", inputs=_AB),
        dtype_rule="promote_float")

# -- powers: tensor**scalar, tensor**tensor, scalar**tensor (torch's three overloads) -------
# One kernel, ``pow`` (pow_tensor's stanza); ``x ** e`` has its own stanza for the fused
# backward only (e == 0 gives zeros, as torch's pow_backward).
register(OpSpec(
    "pow", "PowBackward0", ("self",),
    lambda be, self, exponent: be.pow(self, exponent),
    {"self": lambda grad, self, exponent:
        grad * 0 if exponent == 0 else grad * exponent * self ** (exponent - 1)},
    lambda sp, x, exponent: x ** exponent, dtype_rule="promote", kernel=None,
    scalar=Scalar("pow(x, exponent)",
                  "where(exponent == 0, g * 0, g * exponent * pow(x, exponent - 1))",
                  params=("exponent",)),
    fused_backward="pow_backward"))
elementwise(
    "pow_tensor", "PowBackward1", Scalar(
        "pow(a, b)", ("g * b * pow(a, b - 1)",
                      "where((a != 0) | (b < 0), g * (y * log(a)), 0 * g)"), inputs=_AB),
    inputs=("self", "exponent"), kernel="pow", dtype_rule="promote", fused=False,
    grads={"self": lambda grad, self, exponent: grad * exponent * self ** (exponent - 1),
           "exponent": lambda grad, self, exponent, result:
           grad * (result * self.log()).where((self != 0) | (exponent < 0), 0.0)},
    sympy=lambda sp, x, y: x ** y)
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
_SIGMOID = "e = exp(-abs(x)); where(x >= 0, 1 / (1 + e), e / (1 + e))"
_unary("sigmoid", "SigmoidBackward0", Scalar(_SIGMOID, "g * (y * (1 - y))",
                                             meaning="1 / (1 + exp(-x))"))
_unary("sqrt", "SqrtBackward0", Scalar("sqrt(x)", "g / (2 * y)"))
# Kinks follow PyTorch: relu'(0) = 0 and abs'(0) = sign(0) = 0; relu(NaN) is NaN.
_unary("relu", "ReluBackward0", Scalar("maximum(x, 0)", "g * (y > 0)",
                                       meaning="where(x > 0, x, 0)"), dtype_rule="same")
_unary("abs", "AbsBackward0", Scalar("abs(x)", "g * sign(x)"), dtype_rule="same")
_unary("sign", "SignBackward0", Scalar("sign(x)", "g * 0"), dtype_rule="same")
_unary("log1p", "Log1PBackward0", Scalar("log1p(x)", "g / (1 + x)"))
# torch's rules: grad / (self * ln 2) and grad / (self * ln 10), the constant as one double
_unary("log2", "Log2Backward0", Scalar("log2(x)", "g / (x * log(2))"))
_unary("log10", "Log10Backward0", Scalar("log10(x)", "g / (x * log(10))"))
_unary("expm1", "Expm1Backward0", Scalar("expm1(x)", "g * (y + 1)"))
# erf' = 2/sqrt(pi) exp(-x^2): ``pi`` is exact in the meaning, so the audit can prove it
_unary("erf", "ErfBackward0", Scalar("erf(x)", "2 / sqrt(pi) * exp(-(x * x)) * g"))
# silu as torch computes it (x / (1 + exp(-x)): -0 in the far negative tail, no overflow trap)
_unary("silu", "SiluBackward0", Scalar(
    "x / (1 + exp(-x))", "s = 1 / (1 + exp(-x)); g * (s * (1 + x * (1 - s)))"))
# softplus(x, beta, threshold): linear above threshold (torch's numerics); the meaning is
# the same piecewise function, so the verifier decides the branch at the recorded value
elementwise(
    "softplus", "SoftplusBackward0", Scalar(
        "where(x * beta > threshold, x, log1p(exp(x * beta)) / beta)",
        "z = exp(x * beta); where(x * beta > threshold, g, g * z / (z + 1))",
        params=("beta", "threshold")),
    defaults={"beta": 1, "threshold": 20})

# -- comparisons: bool results, no gradient --------------------------------------------------
for _name, _op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("eq", "=="),
                   ("ne", "!=")):
    _binary(_name, None, Scalar(f"a {_op} b", inputs=_AB), dtype_rule="bool_compare")
_binary("logical_or", None, Scalar("(a != 0) | (b != 0)", inputs=_AB), dtype_rule="bool")
_binary("logical_and", None, Scalar("(a != 0) & (b != 0)", inputs=_AB), dtype_rule="bool")
_unary("logical_not", None, Scalar("x == 0"), dtype_rule="bool")

# -- where(condition, self, other): a select; the condition gets no gradient ---------------
elementwise(
    "where", "WhereBackward0", Scalar(
        "where(c, a, b)", (None, "where(c, g, 0.0)", "where(c, 0.0, g)"), inputs=("c", "a", "b")),
    inputs=("condition", "self", "other"), nondifferentiable=("condition",),
    sympy=lambda sp, c, x, y: x if c else y, dtype_rule="where",
    formula_tex=lambda names, out, params, shapes: (
        rf"{out} = {names['self']} \text{{ where }} {names['condition']}"
        rf"\text{{, else }} {names['other']}",
        rf"\bar{{{names['self']}}} = \bar{{{out}}} \text{{ where }} {names['condition']}"
        rf"\text{{ (else 0)}},\quad \bar{{{names['other']}}} = \bar{{{out}}}"
        rf"\text{{ where not }} {names['condition']}\text{{ (else 0)}}"))

# -- addcmul: x + value * t1 * t2 in one pass (the ``a*b + a`` pattern without temporaries) --
elementwise(
    "addcmul", "AddcmulBackward0", Scalar(
        "x + value * (t1 * t2)", ("g", "g * (t2 * value)", "g * (t1 * value)"),
        inputs=("x", "t1", "t2"), params=("value",)),
    inputs=("self", "tensor1", "tensor2"), defaults={"value": 1}, dtype_rule="promote",
    fused=False)
