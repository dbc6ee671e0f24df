"""The four dtypes symgrad supports and PyTorch's type-promotion rules.

We follow PyTorch (not NumPy) where the two differ, because users port torch code:
an int tensor times a Python float gives the default float dtype (float32), and a
dimensioned tensor keeps its dtype against a 0-dim tensor of the same category.
"""

from __future__ import annotations

import numpy as np

__all__ = ["dtype", "float32", "float64", "int64", "bool_", "promote", "as_dtype",
           "set_default_dtype", "get_default_dtype"]


class dtype:
    """A symgrad dtype: a name, its NumPy twin and its promotion category."""

    __slots__ = ("name", "np", "category", "itemsize", "is_floating_point")

    def __init__(self, name: str, np_dtype: type, category: int) -> None:
        self.name = name
        self.np = np.dtype(np_dtype)
        self.category = category  # 0 bool, 1 integer, 2 floating
        self.itemsize = self.np.itemsize
        self.is_floating_point = category == 2

    def __repr__(self) -> str:
        return f"symgrad.{self.name}"

    def __reduce__(self):
        return (as_dtype, (self.name,))


float32 = dtype("float32", np.float32, 2)
float64 = dtype("float64", np.float64, 2)
int64 = dtype("int64", np.int64, 1)
bool_ = dtype("bool", np.bool_, 0)

_BY_NAME = {"float32": float32, "float64": float64, "int64": int64, "bool": bool_,
            "float": float32, "double": float64, "long": int64}
_BY_NP = {np.dtype(np.float32): float32, np.dtype(np.float64): float64,
          np.dtype(np.int64): int64, np.dtype(np.bool_): bool_}
_DEFAULT_FLOAT = float32


def from_numpy_dtype(np_dtype) -> dtype:
    try:
        return _BY_NP[np.dtype(np_dtype)]
    except KeyError:
        kind = np.dtype(np_dtype).kind
        if kind == "f":
            return float64 if np.dtype(np_dtype).itemsize > 4 else float32
        if kind in "iu":
            return int64
        if kind == "b":
            return bool_
        raise TypeError(f"can't convert np.ndarray of type {np.dtype(np_dtype)}. The only "
                        "supported types are: float64, float32, int64 and bool.") from None


def as_dtype(d) -> dtype:
    """Accept a symgrad dtype, a torch dtype, a NumPy dtype or a name."""
    if isinstance(d, dtype):
        return d
    if isinstance(d, str):
        try:
            return _BY_NAME[d.replace("torch.", "").replace("symgrad.", "")]
        except KeyError:
            raise TypeError(f"unsupported dtype {d!r}") from None
    if d is bool:
        return bool_
    if d is int:
        return int64
    if d is float:
        return float64
    mod = type(d).__module__
    if mod.startswith("torch"):
        return as_dtype(str(d))
    return from_numpy_dtype(d)


def scalar_category(x) -> int:
    if isinstance(x, (bool, np.bool_)):
        return 0
    if isinstance(x, (int, np.integer)):
        return 1
    return 2


def promote(tensor_dtypes: list[tuple[dtype, bool]], scalars: list = ()) -> dtype:
    """Result dtype of an op over tensors ``(dtype, is_zero_dim)`` and Python scalars.

    PyTorch's rule: the highest category wins; within it, dimensioned tensors decide,
    then zero-dim tensors, then scalars (float scalars give the default float dtype).
    """
    cats = [d.category for d, _ in tensor_dtypes] + [scalar_category(s) for s in scalars]
    top = max(cats)
    for want_zero_dim in (False, True):
        best = None
        for d, zero_dim in tensor_dtypes:
            if zero_dim == want_zero_dim and d.category == top:
                if best is None or d.itemsize > best.itemsize:
                    best = d
        if best is not None:
            return best
    return {0: bool_, 1: int64, 2: _DEFAULT_FLOAT}[top]


def default_float() -> dtype:
    return _DEFAULT_FLOAT


def get_default_dtype() -> dtype:
    """The dtype Python floats and the float creation functions get (``float32`` at start)."""
    return _DEFAULT_FLOAT


def set_default_dtype(d, /) -> None:
    """Make ``d`` (float32 or float64) the default float dtype, as ``torch.set_default_dtype``.

    It decides what ``tensor(1.5)``, ``zeros(2)``, ``rand(2)``, ``Tensor([1])`` and an int
    tensor times a Python float give. Only floating dtypes are accepted, with torch's error;
    torch's float16/bfloat16 have no symgrad dtype and are refused by name.
    """
    global _DEFAULT_FLOAT
    if not isinstance(d, dtype):
        if type(d).__module__.startswith("torch") and str(d).startswith("torch."):
            name = str(d)[len("torch."):]
            if name in ("float32", "float64"):
                d = _BY_NAME[name]
            elif name in ("float16", "half", "bfloat16"):
                raise TypeError(f"symgrad has no {name} dtype: only float32 and float64 can be "
                                "the default type")
            else:
                raise TypeError("only floating-point types are supported as the default type")
        else:
            raise TypeError("invalid dtype object: only floating-point types are supported as "
                            "the default type")
    if not d.is_floating_point:
        raise TypeError("only floating-point types are supported as the default type")
    _DEFAULT_FLOAT = d
