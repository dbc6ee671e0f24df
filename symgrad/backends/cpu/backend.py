"""CpuBackend: the NumPy reference backend with its hot kernels replaced by Numba ones.

Every kernel this class does not override is the reference one (inheritance), so ops
added to ``NumpyBackend`` work here at once. Overrides pick an implementation by size,
as measured (``benchmarks/bench_core.py``, PARALLEL_MIN below):

* size 1 (scalar graphs): Python ``math`` on the one value (a Numba call costs ~0.6 µs
  on a 0-d array, NumPy ~0.8 µs for two ufuncs);
* small and medium: NumPy ufuncs for single forward ops (they are SIMD and as fast as a
  serial loop), serial Numba kernels for the fused backward rules (one pass, one
  allocation instead of two or three ufuncs and their temporaries);
* from ``PARALLEL_MIN`` elements: ``parallel=True`` Numba kernels on all cores.

Numba is imported on the first kernel call, not with symgrad. Every array is checked in
Python (type, dtype, shape, C-contiguity) before it reaches a kernel; anything a kernel
does not cover (broadcasting, mixed dtypes, integers) goes to the reference code.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from ..numpy_backend import NumpyBackend

__all__ = ["CpuBackend", "PARALLEL_MIN", "load_kernels", "threading_layer"]

_R = NumpyBackend
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: element count from which kernels run in parallel (override: SYMGRAD_PARALLEL_MIN).
#: Measured on 2 cores: a parallel launch costs ~10-20 µs, so below ~2**17 float32
#: elements one thread finishes first (benchmarks/bench_core.py --threshold).
PARALLEL_MIN = int(os.environ.get("SYMGRAD_PARALLEL_MIN", str(1 << 17)))

_K = None
_kernel_lock = threading.Lock()
#: the workqueue threading layer is not thread-safe: one parallel launch at a time
_parallel_lock = threading.Lock()


def _reset_locks_in_child() -> None:
    """A fork while another thread held a lock would leave the child's copy locked."""
    global _parallel_lock, _kernel_lock
    _parallel_lock = threading.Lock()
    _kernel_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_locks_in_child)


def load_kernels() -> dict:
    """The kernel table (importing Numba on first use)."""
    global _K
    if _K is None:
        with _kernel_lock:
            if _K is None:
                from . import kernels as mod

                _K = mod.K
    return _K


def threading_layer() -> str:
    """The Numba threading layer symgrad selected (see kernels._threading)."""
    load_kernels()
    from . import kernels as mod

    return mod.THREADING_LAYER


def _run(name: str, n: int, *args):
    """Run kernel ``name`` serially, or in parallel (under the launch lock) for large n."""
    serial, parallel = (_K or load_kernels())[name]
    if n >= PARALLEL_MIN:
        with _parallel_lock:
            return parallel(*args)
    return serial(*args)


def _flat(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1)


def _same(*arrays) -> bool:
    """All ndarrays of one float dtype, one shape, C-contiguous: a kernel may take them."""
    a0 = arrays[0]
    if type(a0) is not np.ndarray or a0.dtype not in _FLOATS or not a0.flags.c_contiguous:
        return False
    shape, dt = a0.shape, a0.dtype
    for a in arrays[1:]:
        if type(a) is not np.ndarray or a.shape != shape or a.dtype != dt \
                or not a.flags.c_contiguous:
            return False
    return True


def _grad(grad, like: np.ndarray):
    """``grad`` as a kernel takes it against the checked array ``like``: (flat, stride).

    The gradient of a sum or mean arrives as an expanded scalar (all strides 0): it goes
    in as one element with stride 0. Other layouts are copied contiguous. None if the
    shape or dtype differ (broadcasting: the formula runs instead).
    """
    if type(grad) is not np.ndarray or grad.shape != like.shape or grad.dtype != like.dtype:
        return None
    if grad.flags.c_contiguous:
        return grad.reshape(-1), 1
    if not any(grad.strides):
        return grad.flat[:1], 0
    return np.ascontiguousarray(grad).reshape(-1), 1


def _empty(like: np.ndarray) -> np.ndarray:
    return np.empty(like.shape, like.dtype)


def _new(like: np.ndarray, value) -> np.ndarray:
    """A size-1 result with ``like``'s shape and dtype holding ``value``."""
    if like.ndim == 0:
        return np.array(value, dtype=like.dtype)
    return np.full(like.shape, value, dtype=like.dtype)


def _scalar_value(x, dt):
    """A Python number as a length-1 array of dtype ``dt`` (NumPy 2 promotion: the array wins)."""
    return np.full(1, x, dtype=dt)


def _unary(name: str, ref):
    body = name + "_f"

    def kernel(x):
        if x.size >= PARALLEL_MIN and _same(x):
            out = np.empty_like(x)
            _run(body, x.size, _flat(x), _flat(out))
            return out
        return ref(x)

    kernel.__name__ = name
    kernel.__doc__ = f"{name}: NumPy below PARALLEL_MIN elements, a parallel Numba loop above."
    return staticmethod(kernel)


def _binary(name: str, ref):
    body = name + "_f"

    def kernel(a, b):
        big = a if type(a) is np.ndarray else b
        if type(big) is np.ndarray and big.size >= PARALLEL_MIN:
            if type(a) is np.ndarray and type(b) is np.ndarray:
                if _same(a, b):
                    out = np.empty_like(a)
                    _run(body, a.size, _flat(a), _flat(b), _flat(out), 1, 1)
                    return out
            elif _same(big) and isinstance(a if big is b else b, (int, float)) \
                    and not isinstance(a if big is b else b, bool):
                s = _scalar_value(a if big is b else b, big.dtype)
                out = np.empty_like(big)
                if big is a:
                    _run(body, a.size, _flat(a), s, _flat(out), 1, 0)
                else:
                    _run(body, b.size, s, _flat(b), _flat(out), 0, 1)
                return out
        return ref(a, b)

    kernel.__name__ = name
    return staticmethod(kernel)


def _unary_backward(op: str):
    """The fused backward of a unary op: ``(grad, needed, saved) -> (grad_input,)``."""
    body = op + "_b"
    scalar_rule = None

    def kernel(grad, needed, saved):
        nonlocal scalar_rule
        g = _grad(grad, saved) if _same(saved) else None
        if g is None:
            return None  # broadcast or mixed dtypes: the tensor-op formula runs
        if grad.size == 1:
            if scalar_rule is None:
                scalar_rule = _scalar_rules()[op]
            try:
                value = scalar_rule(grad.item(), saved.item())
            except (ArithmeticError, ValueError):  # math raises where NumPy gives inf/nan
                return None
            return (_new(grad, value),)
        out = _empty(saved)
        _run(body, out.size, g[0], _flat(saved), _flat(out), g[1])
        return (out,)

    kernel.__name__ = op + "_backward"
    kernel.__doc__ = f"Fused backward of {op}: one pass over grad and the saved operand."
    return staticmethod(kernel)


def _scalar_rules() -> dict:
    from .kernels import SCALAR_BACKWARD

    return SCALAR_BACKWARD


class CpuBackend(NumpyBackend):
    """Numba-compiled CPU kernels; the NumPy reference for everything not overridden."""

    name = "cpu"
    device_type = "cpu"

    # -- forward elementwise -----------------------------------------------------------------
    neg = _unary("neg", _R.neg)
    exp = _unary("exp", _R.exp)
    log = _unary("log", _R.log)
    sin = _unary("sin", _R.sin)
    cos = _unary("cos", _R.cos)
    tanh = _unary("tanh", _R.tanh)
    sigmoid = _unary("sigmoid", _R.sigmoid)
    relu = _unary("relu", _R.relu)
    sqrt = _unary("sqrt", _R.sqrt)
    abs = _unary("abs", _R.abs)
    add = _binary("add", _R.add)
    sub = _binary("sub", _R.sub)
    mul = _binary("mul", _R.mul)
    div = _binary("div", _R.div)

    @staticmethod
    def addcmul(x, t1, t2, value=1):
        """``x + value * t1 * t2`` in one pass (no temporaries) when shapes agree."""
        if _same(x, t1, t2) and isinstance(value, (int, float)) and not isinstance(value, bool):
            out = np.empty_like(x)
            _run("addcmul_f", x.size, _flat(x), _flat(t1), _flat(t2),
                 x.dtype.type(value), _flat(out))
            return out
        return NumpyBackend.addcmul(x, t1, t2, value)

    # -- fused backward rules (OpSpec.fused_backward names them) -----------------------------
    exp_backward = _unary_backward("exp")
    log_backward = _unary_backward("log")
    sin_backward = _unary_backward("sin")
    cos_backward = _unary_backward("cos")
    tanh_backward = _unary_backward("tanh")
    sigmoid_backward = _unary_backward("sigmoid")
    sqrt_backward = _unary_backward("sqrt")
    relu_backward = _unary_backward("relu")
    abs_backward = _unary_backward("abs")
    reciprocal_backward = _unary_backward("reciprocal")

    @staticmethod
    def neg_backward(grad, needed):
        return (np.asarray(np.negative(grad)),)

    @staticmethod
    def sign_backward(grad, needed):
        return (np.asarray(np.multiply(grad, 0)),)

    @staticmethod
    def pow_backward(grad, needed, exponent, self):
        """d(x**e): ``grad * e * x**(e-1)``, or ``grad * 0`` for e == 0, in one pass."""
        g = _grad(grad, self) if _same(self) else None
        if g is None or not isinstance(exponent, (int, float)) or isinstance(exponent, bool):
            return None
        if exponent == 0:
            return (np.asarray(np.multiply(grad, 0)),)
        if grad.size == 1:
            with np.errstate(all="ignore"):
                x = self.dtype.type(self.item())
                return (_new(grad, grad.item() * exponent * np.power(x, exponent - 1)),)
        out = _empty(self)
        _run("pow_b", out.size, g[0], _flat(self), self.dtype.type(exponent), _flat(out), g[1])
        return (out,)

    @staticmethod
    def mul_backward(grad, needed, other, self):
        """``grad*other`` and ``grad*self``; one pass for both when shapes agree."""
        need_a, need_b = needed[0], needed[1]
        g = _grad(grad, self) if need_a and need_b and _same(self, other) else None
        if g is not None:
            if grad.size == 1:
                gv = grad.item()
                return _new(self, gv * other.item()), _new(self, gv * self.item())
            ga, gb = _empty(self), _empty(self)
            _run("mul2_b", ga.size, g[0], _flat(self), _flat(other), _flat(ga), _flat(gb), g[1])
            return ga, gb
        if need_b and not need_a:
            return None, np.asarray(_Self.mul(grad, self))
        if need_a and not need_b:
            return np.asarray(_Self.mul(grad, other)), None
        return None

    @staticmethod
    def div_backward(grad, needed, other, self):
        """``grad/other`` and ``-grad*self/other**2``; one pass for both when shapes agree."""
        need_a, need_b = needed[0], needed[1]
        if need_b:
            g = _grad(grad, self) if _same(self, other) else None
            if g is None:
                return None
        if need_a and need_b:
            if grad.size == 1:
                gv, a, b = grad.item(), self.item(), other.item()
                with np.errstate(all="ignore"):
                    return (_new(self, np.divide(gv, b)),
                            _new(self, np.divide(-gv * a, b * b)))
            ga, gb = _empty(self), _empty(self)
            _run("div2_b", ga.size, g[0], _flat(self), _flat(other), _flat(ga), _flat(gb), g[1])
            return ga, gb
        if need_b:
            gb = _empty(self)
            _run("div_other_b", gb.size, g[0], _flat(self), _flat(other), _flat(gb), g[1])
            return None, gb
        if need_a:
            return np.asarray(_Self.div(grad, other)), None
        return None

    @staticmethod
    def where_backward(grad, needed, condition):
        """Route the grad left where the condition holds, right elsewhere, in one pass."""
        c = condition
        if type(c) is not np.ndarray or c.dtype != np.bool_ or c.shape != grad.shape \
                or not c.flags.c_contiguous or type(grad) is not np.ndarray \
                or grad.dtype not in _FLOATS:
            return None
        g = _grad(grad, grad)
        need_a, need_b = needed[1], needed[2]
        if need_a and need_b:
            ga, gb = _empty(grad), _empty(grad)
            _run("where2_b", ga.size, g[0], _flat(c), _flat(ga), _flat(gb), g[1])
            return None, ga, gb
        if need_a or need_b:
            out = _empty(grad)
            _run("where1_b", out.size, g[0], _flat(c), _flat(out), bool(need_a), g[1])
            return (None, out, None) if need_a else (None, None, out)
        return None

    # -- reductions --------------------------------------------------------------------------
    @staticmethod
    def sum(x, axis=None, keepdims=False, dtype=None):
        """Large float sums in parallel with a float64 accumulator; the rest as NumPy does."""
        if type(x) is np.ndarray and x.size >= PARALLEL_MIN and x.dtype in _FLOATS \
                and (dtype is None or np.dtype(getattr(dtype, "np", dtype)) == x.dtype) \
                and x.flags.c_contiguous:
            if axis is None or tuple(sorted(a % x.ndim for a in axis)) == tuple(range(x.ndim)):
                total = _run("sum_f", x.size, _flat(x))
                out = np.array(total, dtype=x.dtype)
                return out.reshape((1,) * x.ndim) if keepdims else out
            if x.ndim == 2 and tuple(a % 2 for a in axis) == (1,):
                out = np.empty(x.shape[0], dtype=x.dtype)
                _run("sum_last_f", x.size, x, out)
                return out.reshape(-1, 1) if keepdims else out
        return NumpyBackend.sum(x, axis, keepdims, dtype)

    @staticmethod
    def copy(x):
        if type(x) is np.ndarray and x.size >= PARALLEL_MIN and x.flags.c_contiguous \
                and x.dtype in _FLOATS:
            out = np.empty_like(x)
            _run("copy_f", x.size, _flat(x), _flat(out))
            return out
        return NumpyBackend.copy(x)


_Self = CpuBackend

