"""The table of every op, and the completeness check a test runs over it."""

from __future__ import annotations

from .spec import STRUCTURAL, OpSpec

OPS: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in OPS:
        raise ValueError(f"op {spec.name!r} registered twice")
    OPS[spec.name] = spec
    return spec


def check_complete(spec: OpSpec) -> list[str]:
    """Facets an op is missing; empty when the op is fully defined."""
    problems = []
    if not callable(spec.forward):
        problems.append("forward")
    if spec.differentiable:
        missing = [n for n in spec.inputs
                   if n not in spec.grads and n not in spec.nondifferentiable]
        if missing:
            problems.append(f"backward formula for {missing}")
        if spec.sympy is None:
            problems.append("sympy meaning")
        elif spec.sympy is not STRUCTURAL and not callable(spec.sympy):
            problems.append("sympy meaning must be callable or STRUCTURAL")
    return problems
