"""The kernel interface every backend implements.

Ops (symgrad/ops) are written once against this interface: they receive a backend and
call its kernels by name on backend-native arrays (NumPy arrays on the CPU, device
arrays on CUDA, object arrays of SymPy expressions in the verifier). A backend never
sees a Tensor and never records a graph; inputs reaching it are already checked.
"""

from __future__ import annotations

from typing import Any, Protocol

# Facts about ops that the kernels follow, defined with the ops (ops never import backends):
from ..ops.elementwise import fused_from_stanza, scalar_kernels  # noqa: F401
from ..ops.linalg import column_major  # noqa: F401

Array = Any

#: Kernels every backend provides. A test checks each backend against this list. The
#: elementwise ones are those of the ops' ``Scalar`` stanzas (each backend generates them).
ELEMENTWISE = scalar_kernels()
STRUCTURAL = ("sum", "mean", "amax", "amin", "argmax", "argmin", "matmul", "reshape",
              "transpose", "broadcast_to", "getitem", "setitem", "cast", "copy",
              "index_put", "concatenate", "stack", "full", "arange", "from_host", "to_host",
              # -- issue 21 tensor functions
              "cumsum", "cumprod", "sort")
KERNELS = ELEMENTWISE + STRUCTURAL
#: Kernels a backend MAY provide: an op's forward asks with ``getattr(be, name, None)`` and
#: runs its generic lowering where there is none or it returns None (declines).
#: ``convolution``: conv1d/conv2d in one call (numpy, cpu, cuda; backends/conv_numpy.py).
OPTIONAL = ("convolution",)
#: Kernels only the symbolic backend has, asked for the same way: ``as_constant`` gives values
#: a meaning treats as constants (no gradient flows through them); on numbers it would be
#: the identity, so numeric backends leave it out.
MEANING_ONLY = ("as_constant",)


class Backend(Protocol):
    """What ops may call. Shapes and axes are already validated by the caller."""

    name: str
    device_type: str

    def sum(self, x: Array, axis: tuple[int, ...] | None, keepdims: bool) -> Array: ...
    def matmul(self, a: Array, b: Array) -> Array: ...
    def reshape(self, x: Array, shape: tuple[int, ...]) -> Array: ...
    def transpose(self, x: Array, axes: tuple[int, ...]) -> Array: ...
    def broadcast_to(self, x: Array, shape: tuple[int, ...]) -> Array: ...
    def cast(self, x: Array, np_dtype) -> Array: ...


def view_strides(old: tuple, stride: tuple, shape: tuple) -> tuple | None:
    """PyTorch's computeStride: element strides of ``shape`` over the memory of a tensor of
    shape ``old`` and strides ``stride``, or None when a view is impossible (a copy is needed).

    Shared by the view/reshape dispatch (which node torch records) and the CUDA backend
    (which strides its views get)."""
    if not old:
        out, step = [], 1
        for size in reversed(shape):
            out.append(step)
            step *= size
        return tuple(reversed(out))
    new = [0] * len(shape)
    view_d = len(shape) - 1
    chunk_base_stride = stride[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old) - 1, -1, -1):
        tensor_numel *= old[d]
        if d == 0 or (old[d - 1] != 1 and stride[d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or shape[view_d] == 1):
                new[view_d] = view_numel * chunk_base_stride
                view_numel *= shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base_stride = stride[d - 1]
                tensor_numel = view_numel = 1
    return tuple(new) if view_d == -1 else None
