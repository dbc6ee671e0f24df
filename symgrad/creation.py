"""Creation functions (torch names and keywords) and symgrad's own random generator.

Random numbers come from a NumPy ``Generator`` seeded by ``manual_seed``: the same seed
gives the same numbers in symgrad every time, but not torch's numbers (documented).
"""

from __future__ import annotations

import math
import operator

import numpy as np

from . import _tensor_layer as _tl
from . import device as _device_mod
from . import dtypes as _dt
from ._random import _generator, default_generator, manual_seed  # noqa: F401  (kept here)
from .device import as_device, resolve
from .tensor import (
    _INT64_MAX,
    _INT64_MIN,
    Tensor,
    _check_device_arg,
    _check_dtype_arg,
    _check_requires_grad_arg,
    _factory_grad,
    _type_name,
    tensor,
)

__all__ = ["zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like",
           "empty_like", "eye", "arange", "linspace", "rand", "randn", "randint",
           "from_numpy", "manual_seed", "tensor", "set_default_device", "get_default_device"]


def set_default_device(device) -> None:
    """Where creation functions (zeros, rand, tensor, Tensor(...) ...) put tensors given no
    ``device=``, as ``torch.set_default_device``; None resets to cpu.

    "cuda" is refused at once where no GPU (or simulator) is available, with the same error
    as ``zeros(2, device="cuda")``; torch accepts it and fails at the first creation.
    """
    if device is None:
        _device_mod._DEFAULT = _device_mod.CPU
        return
    if not isinstance(device, (str, int, _device_mod.device)) or isinstance(device, bool):
        raise TypeError(f"device() received an invalid combination of arguments - got "
                        f"({_type_name(device)}), but expected one of:\n"
                        " * (symgrad.device device)\n * (str type, int index = -1)\n")
    dev = as_device(device)
    if dev.type == "cuda":
        from .cuda import _require_cuda

        dev = _require_cuda(dev)
    _device_mod._DEFAULT = dev


def get_default_device():
    """The device set by :func:`set_default_device` (``device(type='cpu')`` by default)."""
    return _device_mod.default_device()


def _int_arg(v) -> int | None:
    """An int argument as torch reads one (ints, NumPy ints, one-element int tensors;
    never a bool or a float), else None."""
    if isinstance(v, (bool, np.bool_)):
        return None
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, Tensor):
        return int(v.item()) if v.dtype is _dt.int64 and v.numel() == 1 else None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _size(size, fn: str = "zeros") -> tuple[int, ...]:
    """``zeros(2, 3)``, ``zeros((2, 3))``, ``zeros([2, 3])`` -> ``(2, 3)``, with torch's
    errors for anything that is not a tuple of ints."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        items, lone = tuple(size[0]), False
    else:
        items, lone = tuple(size), len(size) == 1
    out = []
    for pos, s in enumerate(items, 1):
        v = _int_arg(s)
        if v is None:
            if lone:
                raise TypeError(f"{fn}(): argument 'size' (position 1) must be tuple of ints, "
                                f"not {_type_name(s)}")
            raise TypeError(f"{fn}(): argument 'size' failed to unpack the object at pos {pos} "
                            f"with error \"type must be tuple of ints,but got {_type_name(s)}\"")
        out.append(v)
    for v in out:
        if v < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {v}: {out}")
    return tuple(out)


def _check_kwargs(fn: str, dtype, device, requires_grad) -> _dt.dtype | None:
    d = _check_dtype_arg(fn, dtype)
    _check_device_arg(fn, device)
    _check_requires_grad_arg(fn, requires_grad)
    return d


def _number_arg(fn: str, name: str, pos: int, v):
    """A Number argument (bool, int, float, a NumPy number, a one-element tensor) as a
    Python number, with torch's error for anything else; symgrad has no complex dtype."""
    if isinstance(v, Tensor) and v.numel() == 1 and v.ndim == 0:
        v = v.item()
    if isinstance(v, np.generic) and isinstance(v, (np.bool_, np.integer, np.floating)):
        v = v.item()
    if isinstance(v, (complex, np.complexfloating)):
        raise TypeError(f"{fn}(): symgrad has no complex dtype (argument '{name}' is "
                        f"{v!r}); use a real number")
    if not isinstance(v, (bool, int, float)):
        raise TypeError(f"{fn}(): argument '{name}' (position {pos}) must be Number, not "
                        f"{_type_name(v)}")
    return v


def _fits(fn: str, v, d: _dt.dtype) -> None:
    """torch's overflow errors for a fill value that ``d`` cannot hold."""
    if isinstance(v, bool) or d is _dt.bool_:
        return
    if isinstance(v, int) and not _INT64_MIN <= v < 2**64:
        raise OverflowError("int too big to convert")
    if d is _dt.int64 and (v > _INT64_MAX or isinstance(v, float) and not math.isfinite(v)):
        raise RuntimeError("value cannot be converted to type int64_t without overflow")


def _finish(arr: np.ndarray, device, requires_grad: bool) -> Tensor:
    dev = resolve(device)
    t = Tensor._wrap(arr if arr.flags.c_contiguous else arr.copy(), as_device("cpu"))
    if dev.type != "cpu":
        t = t.to(dev)
    return _factory_grad(t, requires_grad)


def _on_device(device) -> bool:
    return resolve(device).type != "cpu"


def _device_made(kernel: str, shape, d: _dt.dtype, device, requires_grad: bool, *args):
    """A tensor made by a kernel on the device (fill or random numbers): no host copy."""
    from .backends import backend_for
    from .cuda import _require_cuda

    dev = _require_cuda(resolve(device))
    _dt.check_device(d, dev.type)
    t = Tensor._wrap(getattr(backend_for(dev.type), kernel)(shape, *args), dev)
    return _factory_grad(t, requires_grad)


def _dtype(dtype, default=None) -> _dt.dtype:
    if dtype is None:
        return default or _dt.default_float()
    return _check_dtype_arg("symgrad", dtype)


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    d = _check_kwargs("full", dtype, device, requires_grad)
    shape = _size((size,), "full")
    fill_value = _number_arg("full", "fill_value", 2, fill_value)
    if d is None:
        d = _dt.promote([], [fill_value]) if not isinstance(fill_value, float) else None
    d = _dtype(d)
    _fits("full", fill_value, d)
    if _on_device(device):
        return _device_made("full", shape, d, device, requires_grad, fill_value, d.np)
    with np.errstate(invalid="ignore", over="ignore"):
        return _finish(np.full(shape, fill_value, dtype=d.np), device, requires_grad)


def zeros(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    d = _dtype(_check_kwargs("zeros", dtype, device, requires_grad))
    shape = _size(size, "zeros")
    if _on_device(device):
        return _device_made("full", shape, d, device, requires_grad, 0, d.np)
    return _finish(np.zeros(shape, dtype=d.np), device, requires_grad)


def ones(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    d = _dtype(_check_kwargs("ones", dtype, device, requires_grad))
    shape = _size(size, "ones")
    if _on_device(device):
        return _device_made("full", shape, d, device, requires_grad, 1, d.np)
    return _finish(np.ones(shape, dtype=d.np), device, requires_grad)


def empty(*size, dtype=None, device=None, requires_grad=False) -> Tensor:
    d = _dtype(_check_kwargs("empty", dtype, device, requires_grad))
    return _finish(np.empty(_size(size, "empty"), dtype=d.np), device, requires_grad)


def _like(fn, t, dtype, device, requires_grad, *args):
    return fn(*args, tuple(t.shape), dtype=dtype or t.dtype, device=device or t.device,
              requires_grad=requires_grad) if args else \
        fn(tuple(t.shape), dtype=dtype or t.dtype, device=device or t.device,
           requires_grad=requires_grad)


def _input_arg(fn: str, input) -> Tensor:
    if not isinstance(input, Tensor):
        raise TypeError(f"{fn}(): argument 'input' (position 1) must be Tensor, not "
                        f"{_type_name(input)}")
    return input


def zeros_like(input, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    _input_arg("zeros_like", input)
    return zeros(tuple(input.shape), dtype=dtype or input.dtype, device=device or input.device,
                 requires_grad=requires_grad)


def ones_like(input, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    _input_arg("ones_like", input)
    return ones(tuple(input.shape), dtype=dtype or input.dtype, device=device or input.device,
                requires_grad=requires_grad)


def empty_like(input, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    _input_arg("empty_like", input)
    return empty(tuple(input.shape), dtype=dtype or input.dtype, device=device or input.device,
                 requires_grad=requires_grad)


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False) -> Tensor:
    _input_arg("full_like", input)
    _number_arg("full_like", "fill_value", 2, fill_value)
    return full(tuple(input.shape), fill_value, dtype=dtype or input.dtype,
                device=device or input.device, requires_grad=requires_grad)


def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad=False):
    d = _dtype(_check_kwargs("eye", dtype, device, requires_grad))
    for name, pos, v in (("n", 1, n), ("m", 2, m)):
        if v is None and name == "m":
            continue
        iv = _int_arg(v)
        if iv is None:
            raise TypeError(f"eye(): argument '{name}' (position {pos}) must be int, not "
                            f"{_type_name(v)}")
        if iv < 0:
            raise RuntimeError(f"{name} must be greater or equal to 0, got {iv}")
    n = _int_arg(n)
    m = n if m is None else _int_arg(m)
    return _finish(np.eye(n, m, dtype=d.np), device, requires_grad)


def _range_num(v) -> str:
    """A number as torch's C++ messages print it: ``0``, ``0.5``, ``inf``, ``nan``."""
    return str(v) if isinstance(v, int) else f"{v:g}"


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False):
    d = _check_kwargs("arange", dtype, device, requires_grad)
    if end is None:
        start = _number_arg("arange", "end", 1, start)
        start, end = 0, start
    else:
        start = _number_arg("arange", "start", 1, start)
        end = _number_arg("arange", "end", 2, end)
    step = _number_arg("arange", "step", 3, step)
    for v in (start, end, step):
        if isinstance(v, int) and not _INT64_MIN <= v < 2**64:
            raise OverflowError("int too big to convert")
    if step == 0 or step != step:
        raise RuntimeError("step must be nonzero")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"unsupported range: {_range_num(start)} -> {_range_num(end)}")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")
    if d is None:
        is_int = all(isinstance(v, int) for v in (start, end, step))
        d = _dt.int64 if is_int else _dt.default_float()
    if d is _dt.int64 and any(isinstance(v, int) and v > _INT64_MAX for v in (start, end, step)):
        raise RuntimeError("value cannot be converted to type int64_t without overflow")
    if math.isfinite(step) and math.ceil((end - start) / step) > _INT64_MAX:
        raise RuntimeError("invalid size, possible overflow?")
    if _on_device(device):
        from .backends import backend_for
        from .cuda import _require_cuda

        dev = _require_cuda(resolve(device))
        t = Tensor._wrap(backend_for(dev.type).arange(start, end, step, d.np), dev)
        return _factory_grad(t, requires_grad)
    return _finish(np.arange(start, end, step).astype(d.np), device, requires_grad)


def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad=False):
    d = _dtype(_check_kwargs("linspace", dtype, device, requires_grad))
    start = _number_arg("linspace", "start", 1, start)
    end = _number_arg("linspace", "end", 2, end)
    n = _int_arg(steps)
    if n is None:
        raise TypeError(f"linspace(): argument 'steps' (position 3) must be int, not "
                        f"{_type_name(steps)}")
    if n < 0:
        raise RuntimeError("number of steps must be non-negative")
    with np.errstate(invalid="ignore"):
        return _finish(np.linspace(start, end, n).astype(d.np), device, requires_grad)


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    d = _dtype(_check_kwargs("rand", dtype, device, requires_grad))
    shape = _size(size, "rand")
    g = _generator(generator)
    if _on_device(device):  # made on the device; the seed is one draw of the host generator
        return _device_made("random", shape, d, device, requires_grad, d.np, False,
                            int(g.integers(0, 2**63)))
    return _finish(g.random(shape).astype(d.np), device, requires_grad)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False) -> Tensor:
    d = _dtype(_check_kwargs("randn", dtype, device, requires_grad))
    shape = _size(size, "randn")
    g = _generator(generator)
    if _on_device(device):
        return _device_made("random", shape, d, device, requires_grad, d.np, True,
                            int(g.integers(0, 2**63)))
    return _finish(g.standard_normal(shape).astype(d.np), device, requires_grad)


def randint(low, high=None, size=(), *, generator=None, dtype=None, device=None,
            requires_grad=False) -> Tensor:
    """``randint(high, size)`` or ``randint(low, high, size)``, as torch."""
    d = _dtype(_check_kwargs("randint", dtype, device, requires_grad), _dt.int64)
    if isinstance(high, (tuple, list)) and size == ():  # randint(high, size)
        high, size = None, high
    if high is None:
        low, high = 0, low
        names = (("high", 1, high),)
    else:
        names = (("low", 1, low), ("high", 2, high))
    for name, pos, v in names:
        if _int_arg(v) is None:
            raise TypeError(f"randint(): argument '{name}' (position {pos}) must be int, not "
                            f"{_type_name(v)}")
    low, high = _int_arg(low), _int_arg(high)
    if not isinstance(size, (tuple, list)):
        raise TypeError(f"randint(): argument 'size' must be tuple of ints, not "
                        f"{_type_name(size)}")
    shape = _size((size,), "randint")
    if low >= high:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got "
                           f"from={low} >= to={high}")
    g = _generator(generator)
    return _finish(g.integers(low, high, size=shape).astype(d.np), device, requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with ``array`` (as torch.from_numpy)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(array).__name__})")
    if array.dtype not in _dt._BY_NP and not _dt.is_bfloat16_np(array.dtype):
        # numpy's float16/int32/..., ml_dtypes' bfloat16
        raise TypeError(f"can't convert np.ndarray of type numpy.{array.dtype.type.__name__}. "
                        "The only supported types are: float64, float32, float16, bfloat16, "
                        "int64, int32, int16, int8, uint8 and bool.")
    _dt.from_numpy_dtype(array.dtype)  # registers bfloat16 on first sight
    return Tensor._wrap(array)


# ops' backward formulas and the engine make zeros and ranges through these (they sit below)
_tl.provide(zeros=zeros, zeros_like=zeros_like, ones=ones, ones_like=ones_like, arange=arange)

