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
    """torch.sign on a float: 0 for ±0, NaN for NaN (``x - x``)."""
    return 1.0 if x > 0 else (-1.0 if x < 0 else x - x)


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


def backward_masks(op: str) -> list[tuple[int, ...]]:
    """The input subsets a fused backward loop exists for (every non-empty subset of the
    inputs with a grad): loop ``<op>_b<mask>``, e.g. ``mul_b11``, ``mul_b01``."""
    grads = [i for i, t in enumerate(OPS[op].scalar.grads) if t is not None]
    return [tuple(i for k, i in enumerate(grads) if bits >> k & 1)
            for bits in range(1, 1 << len(grads))]


def backward_loop_name(op: str, mask: tuple[int, ...]) -> str:
    n = len(OPS[op].scalar.inputs)
    return f"{op}_b" + "".join("1" if i in mask else "0" for i in range(n))


def backward_loop_args(op: str, mask: tuple[int, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(values, params) a backward loop reads after ``g``, in the stanza's order."""
    scalar = OPS[op].scalar
    reads = set().union(*(scalar.reads(i) for i in mask))
    params = set().union(*(scalar.param_reads(i) for i in mask))
    return (tuple(v for v in scalar.inputs + ("y",) if v in reads),
            tuple(p for p in scalar.params if p in params))


__all__ = ["LIBM", "PY_MATH", "backward_loop", "backward_loop_args", "backward_loop_name",
           "backward_masks", "forward_loop", "maximum", "minimum", "scalar_rule", "sign",
           "where"]
