"""symgrad's dtypes and PyTorch's type-promotion rules.

We follow PyTorch (not NumPy) where the two differ, because users port torch code:
an int tensor times a Python float gives the default float dtype (float32), and a
dimensioned tensor keeps its dtype against a 0-dim tensor of the same category.

The half-precision dtypes are stored as NumPy's ``float16`` and ml_dtypes' ``bfloat16``
(a maintained NumPy extension dtype, also used by JAX); their arithmetic is computed in
float32 and rounded once, as torch's CPU kernels do (``dtype.compute``). ml_dtypes is
imported when bfloat16 is first asked for (``symgrad.bfloat16``, a bfloat16 array, a
checkpoint): registering its dtypes costs 30-50 ms, a noticeable part of ``import symgrad``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["dtype", "float32", "float64", "float16", "int64", "int32", "int16",
           "int8", "uint8", "bool_", "promote", "promote_types", "as_dtype",
           "set_default_dtype", "get_default_dtype", "HALF_NP"]


class dtype:
    """A symgrad dtype: a name, its NumPy twin and its promotion category."""

    __slots__ = ("name", "np", "category", "itemsize", "is_floating_point", "is_signed",
                 "compute")

    def __init__(self, name: str, np_dtype, category: int) -> None:
        self.name = name
        self.np = np.dtype(np_dtype)
        self.category = category  # 0 bool, 1 integer, 2 floating
        self.itemsize = self.np.itemsize
        self.is_floating_point = category == 2
        self.is_signed = category == 2 or (category == 1 and self.np.kind == "i")
        #: the NumPy dtype its arithmetic runs in (float32 for the half-precision dtypes,
        #: as torch's CPU kernels; None: its own)
        self.compute = np.dtype(np.float32) if category == 2 and self.itemsize == 2 else None

    def __repr__(self) -> str:
        return f"symgrad.{self.name}"

    def __reduce__(self):
        return (as_dtype, (self.name,))


float32 = dtype("float32", np.float32, 2)
float64 = dtype("float64", np.float64, 2)
float16 = dtype("float16", np.float16, 2)
int64 = dtype("int64", np.int64, 1)
int32 = dtype("int32", np.int32, 1)
int16 = dtype("int16", np.int16, 1)
int8 = dtype("int8", np.int8, 1)
uint8 = dtype("uint8", np.uint8, 1)
bool_ = dtype("bool", np.bool_, 0)

#: NumPy dtypes of the half-precision dtypes (computed in float32); bfloat16's joins it
#: when ml_dtypes is loaded (the set is shared by the modules that import it)
HALF_NP = {float16.np}

_BY_NAME = {d.name: d for d in (float32, float64, float16, int64, int32, int16, int8, uint8,
                                bool_)}
_BY_NAME.update({"float": float32, "double": float64, "long": int64, "half": float16,
                 "int": int32, "short": int16})
#: NumPy dtype -> symgrad dtype: the one table (tensor.py's and apply's DT_OF is this dict)
_BY_NP = {d.np: d for d in _BY_NAME.values()}
_DEFAULT_FLOAT = float32
_BFLOAT16: dtype | None = None


def _bfloat16() -> dtype:
    """symgrad.bfloat16, made (and ml_dtypes imported) on first use."""
    global _BFLOAT16
    if _BFLOAT16 is None:
        import ml_dtypes

        d = dtype("bfloat16", ml_dtypes.bfloat16, 2)
        _BY_NAME["bfloat16"] = d
        _BY_NP[d.np] = d
        HALF_NP.add(d.np)
        _BFLOAT16 = d
    return _BFLOAT16


def __getattr__(name: str):
    if name == "bfloat16":
        return _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_bfloat16_np(np_dtype) -> bool:
    """Whether ``np_dtype`` is ml_dtypes' bfloat16 (without importing ml_dtypes)."""
    return getattr(np_dtype, "name", None) == "bfloat16"


def from_numpy_dtype(np_dtype) -> dtype:
    try:
        return _BY_NP[np.dtype(np_dtype)]
    except KeyError:
        if is_bfloat16_np(np.dtype(np_dtype)):
            return _bfloat16()
        kind = np.dtype(np_dtype).kind
        if kind == "f":
            return float64 if np.dtype(np_dtype).itemsize > 4 else float32
        if kind in "iu":
            return int64
        if kind == "b":
            return bool_
        raise TypeError(f"can't convert np.ndarray of type {np.dtype(np_dtype)}. The only "
                        "supported types are: float64, float32, float16, bfloat16, int64, "
                        "int32, int16, int8, uint8 and bool.") from None


def as_dtype(d) -> dtype:
    """Accept a symgrad dtype, a torch dtype, a NumPy dtype or a name."""
    if isinstance(d, dtype):
        return d
    if isinstance(d, str):
        name = d.replace("torch.", "").replace("symgrad.", "")
        if name == "bfloat16":
            return _bfloat16()
        try:
            return _BY_NAME[name]
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


def via_float32(a: np.ndarray, np_dtype) -> np.ndarray:
    """``a`` as ``np_dtype``; into float16/bfloat16 through float32 as torch converts
    (``c10::Half(double)`` takes a float: a float64 or int64 value is rounded twice)."""
    if np_dtype in HALF_NP and a.dtype != np.float32 and a.dtype not in HALF_NP:
        a = a.astype(np.float32)
    return a.astype(np_dtype, order="C", copy=False)


def check_device(d: dtype, device_type: str) -> None:
    """Refuse a half-precision dtype on the CUDA backend, whose kernels are generated for
    float32/float64 (and integers) only; it names the way out."""
    if d.compute is not None and device_type == "cuda":
        raise TypeError(f"symgrad's CUDA backend does not support {d.name} tensors: keep "
                        f"{d.name} tensors on the CPU, or cast them with .float() before "
                        ".cuda()")


def scalar_category(x) -> int:
    if isinstance(x, (bool, np.bool_)):
        return 0
    if isinstance(x, (int, np.integer)):
        return 1
    return 2


def promote_types(a: dtype, b: dtype) -> dtype:
    """torch.promote_types: the higher category wins; within one, the wider dtype, with
    torch's two special cases (float16 with bfloat16 is float32, uint8 with int8 int16)."""
    if type(a) is not dtype or type(b) is not dtype:
        a, b = as_dtype(a), as_dtype(b)
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == 2:
        if a.itemsize == b.itemsize == 2:
            return float32
        return a if a.itemsize > b.itemsize else b
    if a.category == 1 and a.is_signed != b.is_signed:
        signed, unsigned = (a, b) if a.is_signed else (b, a)
        return int16 if signed.itemsize <= unsigned.itemsize else signed
    return a if a.itemsize > b.itemsize else b


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
                best = d if best is None else promote_types(best, d)
        if best is not None:
            return best
    return {0: bool_, 1: int64, 2: _DEFAULT_FLOAT}[top]


def default_float() -> dtype:
    return _DEFAULT_FLOAT


def get_default_dtype() -> dtype:
    """The dtype Python floats and the float creation functions get (``float32`` at start)."""
    return _DEFAULT_FLOAT


def set_default_dtype(d, /) -> None:
    """Make ``d`` (a floating dtype) the default float dtype, as ``torch.set_default_dtype``.

    It decides what ``tensor(1.5)``, ``zeros(2)``, ``rand(2)``, ``Tensor([1])`` and an int
    tensor times a Python float give. Only floating dtypes are accepted, with torch's error;
    float16/bfloat16 are accepted, as torch accepts them.
    """
    global _DEFAULT_FLOAT
    if not isinstance(d, dtype):
        if type(d).__module__.startswith("torch") and str(d).startswith("torch."):
            name = str(d)[len("torch."):]
            if name in ("float32", "float64", "float16", "bfloat16"):
                d = as_dtype(name)
            else:
                raise TypeError("only floating-point types are supported as the default type")
        else:
            raise TypeError("invalid dtype object: only floating-point types are supported as "
                            "the default type")
    if not d.is_floating_point:
        raise TypeError("only floating-point types are supported as the default type")
    _DEFAULT_FLOAT = d
