"""Elementwise fusion: chains of same-shape elementwise ops as one Numba loop."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["plan", "call_code"]


@dataclass
class Plan:
    skip: set = field(default_factory=set)
    first: dict = field(default_factory=dict)
    kernels: list = field(default_factory=list)
    kernel_text: list = field(default_factory=list)


def plan(program) -> Plan:
    return Plan()


def call_code(group, ctx) -> list[str]:
    raise NotImplementedError
