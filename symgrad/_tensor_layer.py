"""The tensor layer as the layers below it see it: the one point where it plugs itself in.

Imports go downward only (tests/test_layers.py, lazy imports included): ops, autograd and
the op functions (functional.py, indexing.py) sit below tensor.py and creation.py, yet an
op's backward formula makes zeros, the engine wraps gradients in Tensors and a saved
scalar prints as a tensor. So tensor.py, creation.py, indexing.py and autograd/function.py
fill the names below when they are imported (``provide``), and the lower modules read
them here at call time (``_tl.zeros(...)``), never importing the higher module.

``TensorBase`` is the class every Tensor derives from, so the op functions can recognise
a tensor (``isinstance(x, TensorBase)``, as torch code tests ``torch._C.TensorBase``)
without importing the class that binds them as methods.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TensorBase", "provide", "type_name", "wrap_dim", "TORCH_NAMES", "CPP_NAMES",
           "LEGACY_NAMES"]


class TensorBase:
    """The base of :class:`symgrad.Tensor` (no state, no methods of its own)."""

    __slots__ = ()


# -- provided by the layers above (None until they are imported) -----------------------------
#: symgrad.tensor: the Tensor class, the ``tensor()`` factory, NumPy dtype -> symgrad dtype
Tensor: Any = None
tensor: Any = None
DT_OF: dict = {}
#: symgrad.backends, through tensor.py: the backend for a device type
backend_for: Any = None
#: symgrad.creation
zeros: Any = None
zeros_like: Any = None
ones: Any = None
ones_like: Any = None
arange: Any = None
#: symgrad.indexing: ``x[index]`` in differentiable ops
getitem: Any = None
#: symgrad.autograd.function: run an op's spec on tensors, recording its node
apply: Any = None

_PROVIDED = frozenset(("Tensor", "tensor", "DT_OF", "backend_for", "zeros", "zeros_like",
                       "ones", "ones_like", "arange", "getitem", "apply"))


def provide(**names: Any) -> None:
    """Called once by each higher module at its import: ``provide(zeros=zeros, ...)``."""
    unknown = set(names) - _PROVIDED
    if unknown:
        raise TypeError(f"_tensor_layer.provide: unknown names {sorted(unknown)}")
    globals().update(names)


# -- small helpers of the tensor layer that the lower modules share ---------------------------
#: PyTorch's scalar type names, for its error messages.
TORCH_NAMES = {"float32": "Float", "float64": "Double", "int64": "Long", "bool": "Bool",
               "float16": "Half", "bfloat16": "BFloat16", "int32": "Int", "int16": "Short",
               "int8": "Char", "uint8": "Byte"}
#: The C++ names some of its messages use instead (clamp_'s cast error).
CPP_NAMES = {"float32": "float", "float64": "double", "int64": "long int", "bool": "bool",
             "float16": "c10::Half", "bfloat16": "c10::BFloat16", "int32": "int",
             "int16": "short int", "int8": "signed char", "uint8": "unsigned char"}

#: torch's legacy tensor type names (``t.type()``: ``torch.HalfTensor``)
LEGACY_NAMES = {k: v + "Tensor" for k, v in TORCH_NAMES.items()}


def type_name(x: Any) -> str:
    """A value's type as torch's argument errors name it: ``str``, ``numpy.ndarray``."""
    t = type(x)
    mod = t.__module__ or ""
    if mod == "builtins" or mod.startswith("symgrad"):
        return t.__name__
    return f"{mod.split('.')[0]}.{t.__name__}"


def wrap_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return dim % n
