"""The scalar-math vocabulary on one Python float, and the scalar backward rules built from
the op stanzas with it.

Shared by the size-1 path (plain Python) and the Numba loops, which jit these same helpers
(``kernels.py``), so one element and a loop compute one formula. No Numba here, so tiny
graphs never import it.
"""

from __future__ import annotations

import math

from ...ops import OPS
from ...ops.elementwise import unary_fused_backward
from ...ops.scalar import VARIABLES, build


def sign(x):
    """torch.sign on a float: 0 for ±0, NaN for NaN (``x - x``)."""
    return 1.0 if x > 0 else (-1.0 if x < 0 else x - x)


def where(c, a, b):
    return a if c else b


def maximum(a, b):
    """NaN-propagating, as torch.maximum."""
    return a if (a > b or a != a) else b


#: The vocabulary (symgrad/ops/scalar.py) on Python floats; Numba compiles the same calls.
PY_MATH = {"exp": math.exp, "log": math.log, "sin": math.sin, "cos": math.cos,
           "tanh": math.tanh, "sqrt": math.sqrt, "abs": abs, "sign": sign, "where": where,
           "maximum": maximum, "log1p": math.log1p, "expm1": math.expm1, "erf": math.erf}


def scalar_backward(op: str):
    """``rule(g, saved)``: the op's ``Scalar.grad`` on one element."""
    scalar = OPS[op].scalar
    return build(f"{op}_rule", ("g", scalar.operand), scalar.grad, PY_MATH)


#: op name -> scalar backward rule, for every op with a fused unary backward
SCALAR_BACKWARD = {op: scalar_backward(op) for op in unary_fused_backward()}

__all__ = ["PY_MATH", "SCALAR_BACKWARD", "VARIABLES", "maximum", "scalar_backward", "sign",
           "where"]
