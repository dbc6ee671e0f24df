"""Copies between devices: ``Tensor.to("cuda")`` / ``.cpu()``, recorded as PyTorch does.

PyTorch records a device move as ``ToCopyBackward0`` (no saved operands) whose backward
moves the gradient back. symgrad has two devices, so the direction is in the spec: the
backward of a move to cuda moves the gradient to the cpu, and the other way round. The
forward here is the op's meaning (a copy), which the verifier replays; the move itself is
done by ``functional.to_device`` with the two backends' ``to_host``/``from_host``.
"""

from __future__ import annotations

from .registry import register
from .spec import STRUCTURAL, OpSpec

register(OpSpec(
    "to_cuda", "ToCopyBackward0", ("self",), lambda be, self: be.copy(self),
    {"self": lambda grad: grad.to("cpu")}, STRUCTURAL, dtype_rule="same",
    doc="A copy to the GPU; its gradient goes back to the host."))
register(OpSpec(
    "to_cpu", "ToCopyBackward0", ("self",), lambda be, self: be.copy(self),
    {"self": lambda grad: grad.to("cuda")}, STRUCTURAL, dtype_rule="same",
    doc="A copy to the host; its gradient goes back to the GPU."))
