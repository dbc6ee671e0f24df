"""The scalar-math vocabulary on one Python float, and the scalar backward rules built from
the op stanzas with it.

Shared by the size-1 path (plain Python) and the Numba loops, which jit these same helpers
(``kernels.py``), so one element and a loop compute one formula. No Numba here, so tiny
graphs never import it.
"""

from __future__ import annotations

import math

from ...ops import OPS
from ...ops.scalar import TRANSCENDENTAL, build


def sign(x):
    """torch.sign on a float: 0 for ±0 and for NaN (torch 2.13 computes (0 < x) - (x < 0))."""
    return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)


def where(c, a, b):
    return a if c else b


def maximum(a, b):
    """NaN-propagating, as torch.maximum."""
    return a if (a > b or a != a) else b


def minimum(a, b):
    """NaN-propagating, as torch.minimum."""
    return a if (a < b or a != a) else b


#: The vocabulary (symgrad/ops/scalar.py) on Python floats; Numba compiles the same calls.
PY_MATH = {"exp": math.exp, "log": math.log, "sin": math.sin, "cos": math.cos,
           "tanh": math.tanh, "sqrt": math.sqrt, "abs": abs, "sign": sign, "where": where,
           "maximum": maximum, "minimum": minimum, "log1p": math.log1p, "expm1": math.expm1,
           "log2": math.log2, "log10": math.log10,
           "erf": math.erf, "atan2": math.atan2, "hypot": math.hypot, "pow": math.pow,
           "pi": math.pi}

#: Vocabulary a Numba loop calls through libm: slower per element than NumPy's SIMD ufuncs
#: (no SVML in this llvmlite), so such expressions stay NumPy. ``pow`` is the exception: a
#: fused ``g * e * x**(e-1)`` pass beats three NumPy passes.
LIBM = TRANSCENDENTAL - {"pow"}
#: dtype rules under which a kernel's output has its (same-dtype float) inputs' dtype
_SAME_DTYPE = ("float", "same", "promote", "promote_float")


def forward_loop(kernel: str) -> bool:
    """Does the CPU backend have a Numba loop for this stanza kernel's forward?"""
    spec = next(s for s in OPS.values() if s.kernel == kernel)
    scalar = spec.scalar
    if spec.dtype_rule not in _SAME_DTYPE or scalar.calls() & TRANSCENDENTAL:
        return False
    return len(scalar.inputs) > 1 or scalar.memory_bound


def backward_loop(op: str) -> bool:
    """Does the CPU backend have a Numba loop for this op's fused backward?"""
    return not (OPS[op].scalar.calls("grad") & LIBM)


def scalar_rule(op: str, index: int):
    """``rule(g, <reads>, <params>)``: grad ``index`` of the op's stanza on one element."""
    scalar = OPS[op].scalar
    return build(f"{op}_rule_{index}", ("g",) + scalar.reads(index) + scalar.param_reads(index),
                 scalar.grads[index], PY_MATH)


__all__ = ["LIBM", "PY_MATH", "backward_loop", "forward_loop", "maximum", "minimum",
           "scalar_rule", "sign", "where"]
