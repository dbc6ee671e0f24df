"""CpuBackend: the NumPy reference backend with its hot kernels replaced by Numba ones.

Every kernel this class does not override is the reference one (inheritance), so ops
added to ``NumpyBackend`` work here at once. Overrides choose an implementation by size,
from measurements on the 2-core test machine (``benchmarks/bench_core.py --thresholds``):

* 1 element (scalar graphs): plain Python on the one value (``rules.py``); a Numba call
  on a 0-d array costs ~0.6 µs, two NumPy ufuncs ~0.8 µs.
* below ``FUSED_MIN`` (256) elements: NumPy expressions of the backward formulas. Serial
  Numba already wins by ~1 µs a node from 16 elements (one call instead of two or three
  ufuncs), but importing Numba and loading cached kernels costs ~0.5 s of start-up, which
  graphs of tutorial size (scalars, small vectors) never pay.
* from ``FUSED_MIN``: serial Numba kernels doing a whole backward rule in one pass.
* from ``PARALLEL_MIN`` (2M): ``parallel=True`` Numba kernels on all cores; a workqueue
  launch costs 110-150 µs here, so smaller arrays finish first on one core.

Outputs from 128 KiB come from a buffer pool (no fresh pages to fault in), matmuls go to
NumPy's BLAS except k=1 products (an outer-product kernel), and nn.Linear's and MSE's
backward rules run as one call each (``addmm_backward``, ``mse_loss_backward``).

Transcendentals (sin, cos, exp, log, tanh) stay NumPy at every size: this llvmlite has no
SVML, so Numba calls scalar libm, ~5x slower per element than NumPy's SIMD loops.

Numba is imported on the first kernel call, not with symgrad. Every array is checked in
Python (type, dtype, shape, C-contiguity) before it reaches a kernel; anything a kernel
does not cover (broadcasting, mixed dtypes, integers) goes to NumPy or to the formulas.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from functools import lru_cache
from math import prod

import numpy as np

from ...dtypes import HALF_NP as _HALF_NP
from ...ops import OPS
from ...ops._ints import s64 as s64_of
from ...ops.elementwise import grad_mask_args, grad_mask_name, grad_masks
from ...ops.scalar import define
from .. import conv_numpy as _conv
from ..attention_numpy import _factor as _attn_factor
from ..attention_numpy import _grad_into as _attn_grad
from ..attention_numpy import _heads as _attn_heads
from ..attention_numpy import flash_attention as _flash_attention
from ..attention_numpy import flash_attention_backward as _flash_attention_backward
from ..attention_numpy import packed_grads as _packed_grads
from ..base import column_major, fused_from_stanza, scalar_kernels
from ..numpy_backend import NUMPY_MATH, NumpyBackend, numpy_rule, saved_layout
from . import rules

__all__ = ["CpuBackend", "PARALLEL_MIN", "FUSED_MIN", "empty_pool", "load_kernels",
           "threading_layer"]

_R = NumpyBackend
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: elements from which fused backward rules run as one Numba pass (SYMGRAD_FUSED_MIN)
FUSED_MIN = int(os.environ.get("SYMGRAD_FUSED_MIN", "256"))
#: elements from which kernels run on all cores (SYMGRAD_PARALLEL_MIN). A workqueue launch
#: costs 110-150 µs on these 2-vCPU VMs (waking a sleeping thread; measured with
#: ``bench_core.py --thresholds``), and one core streams ~20 GB/s, two ~34 GB/s
#: (PERF-BASELINES B2): serial Numba wins up to ~1M float32 elements, parallel from ~4M.
PARALLEL_MIN = int(os.environ.get("SYMGRAD_PARALLEL_MIN", str(1 << 21)))
#: bytes from which outputs come from the buffer pool instead of fresh pages (_alloc):
#: glibc's malloc serves blocks from 128 KiB with fresh mmap pages (a fault per 4 KiB)
#: unless ``_tune_malloc`` below raised that threshold (to 32 MiB)
POOL_MIN = 1 << 17

#: glibc malloc settings made at import (SYMGRAD_MALLOPT=0: none): blocks below 32 MiB come
#: from the heap, and up to 64 MiB of free heap top stays mapped. glibc's own adaptive
#: thresholds trim the heap top back to the system at 2x the largest block freed so far:
#: an eager GPT step (blocks of 64-256 KiB) grew and trimmed 900 KiB of heap every step,
#: 220 page faults and ~1 ms of system time, none with these values (the ones glibc's
#: adaptive thresholds reach themselves once a 32 MiB block was freed).
MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD = 32 << 20, 64 << 20


def _tune_malloc() -> bool:
    """Set glibc's mmap and trim thresholds (``MALLOC_*``); False where not glibc or
    turned off. Setting them also ends glibc's adaptive adjustment of both."""
    if os.environ.get("SYMGRAD_MALLOPT", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        version = libc.gnu_get_libc_version  # glibc only (musl has no adaptive thresholds)
    except (OSError, AttributeError):
        return False
    del version
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    ok = mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD) == 1
    return mallopt(m_trim_threshold, MALLOC_TRIM_THRESHOLD) == 1 and ok


MALLOC_TUNED = _tune_malloc()

_K = None
_kernel_lock = threading.Lock()
#: the workqueue threading layer is not thread-safe: one parallel launch at a time
_parallel_lock = threading.Lock()


def _reset_locks_in_child() -> None:
    """A fork while another thread held a lock would leave the child's copy locked."""
    global _parallel_lock, _kernel_lock, _pool_lock
    _parallel_lock = threading.Lock()
    _kernel_lock = threading.Lock()
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_locks_in_child)


def load_kernels() -> dict:
    """The kernel table: name -> (serial, parallel) dispatchers; imports Numba once."""
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


# -- the forward's probabilities, kept for the backward of the same node --------------------
#: id(logsumexp) -> (weakrefs to the logsumexp and to the forward's query, key, value and
#: mask, (is_causal, scale), the probabilities): the forward normalises its scores in place
#: into exactly the probabilities the backward needs, so keeping them (while the logsumexp,
#: which the node saves, lives) spares the backward a batched q k^T, a pass and an exp over
#: all scores (~90 of ~300 µs in the GPT's attention backward). Only small ones: torch's
#: flash kernel keeps O(L) memory, and so does this past KEEP_PROBS_MAX.
_KEPT: dict = {}
#: the largest probabilities kept, in bytes (a 2-layer GPT's 8x4x32x32 float32: 128 KiB)
KEEP_PROBS_MAX = 1 << 21


def _keep_probs(p: np.ndarray, lse: np.ndarray, arrays: tuple, how: tuple) -> None:
    """Keep ``p`` for the backward of the node whose forward made ``lse`` from ``arrays``
    (query, key, value, mask or None) as ``how`` says (is_causal, scale)."""
    if p.nbytes > KEEP_PROBS_MAX:
        return
    key = id(lse)

    def drop(ref, key=key):  # the logsumexp is gone: so is this node
        entry = _KEPT.get(key)
        if entry is not None and entry[0] is ref:
            del _KEPT[key]

    _KEPT[key] = (weakref.ref(lse, drop),
                  tuple(None if a is None else weakref.ref(a) for a in arrays), how, p)


def _kept_probs(lse, arrays: tuple, how: tuple) -> np.ndarray | None:
    """The probabilities ``_keep_probs`` kept for exactly this forward (the same logsumexp,
    query, key, value and mask objects, causal flag and scale), else None (recompute)."""
    entry = _KEPT.get(id(lse))
    if entry is None or entry[0]() is not lse or entry[2] != how:
        return None
    for ref, a in zip(entry[1], arrays):
        if (None if ref is None else ref()) is not a:
            return None
    return entry[3]


def _attn_shapes(qkv, attn_mask):
    """(dtype, mask as a (B, H, L, S) view or a dummy) when the attention kernels
    apply: float32/float64 ndarrays, q (B, H, L, E), k (B, Hk, S, E), v (B, Hk, S, Ev) with
    Hk dividing H, nothing empty, an additive mask of the dtype broadcastable to the
    scores; else None."""
    q, k, v = qkv
    dt = q.dtype
    if dt not in _FLOATS or any(type(x) is not np.ndarray or x.dtype != dt or x.ndim != 4
                                for x in qkv):
        return None
    b, h, n, e = q.shape
    hk, s = k.shape[1], k.shape[2]
    if q.size == 0 or k.size == 0 or v.size == 0 or k.shape[0] != b or v.shape[:3] != \
            k.shape[:3] or k.shape[3] != e or h % hk:
        return None
    if attn_mask is None:
        mask = np.empty((1, 1, 1, 1), dt)
    else:
        if type(attn_mask) is not np.ndarray or attn_mask.dtype != dt or attn_mask.ndim > 4:
            return None
        try:
            mask = np.broadcast_to(attn_mask, (b, h, n, s))
        except ValueError:
            return None
    return dt, mask


# -- buffer pool: large outputs reuse freed buffers instead of page-faulting fresh ones ------
_pool: list = []
_pool_lock = threading.Lock()
#: at most this many pooled buffers and bytes (free ones are dropped, least recent first)
POOL_KEEP, POOL_BYTES = 8, 1 << 28


def _free(i: int) -> bool:
    """Nothing but the pool references buffer ``i`` (the pool's ref + getrefcount's arg).

    Every array handed out is a view of the pooled byte buffer, and NumPy points every
    view of a view straight at the buffer, so any live array using it holds a reference.
    """
    return sys.getrefcount(_pool[i]) == 2


def _alloc(shape, dtype) -> np.ndarray:
    """An uninitialised array; large ones reuse a pooled buffer nothing references any more.

    A fresh 40 MB array costs ~10,000 page faults on first touch (PERF-BASELINES B2: that,
    not arithmetic, limits torch's ``a*b+a``), so large outputs recycle memory.
    """
    dtype = np.dtype(dtype)
    n = 1
    for s in shape:
        n *= s
    nbytes = n * dtype.itemsize
    if nbytes < POOL_MIN:
        return np.empty(shape, dtype)
    with _pool_lock:
        for i in range(len(_pool)):
            if _pool[i].nbytes == nbytes and _free(i):
                raw = _pool.pop(i)
                _pool.append(raw)  # most recently used last
                return raw.view(dtype).reshape(shape)
        raw = np.empty(nbytes, np.uint8)
        _pool.append(raw)
        total = sum(b.nbytes for b in _pool)
        i = 0
        while (len(_pool) > POOL_KEEP or total > POOL_BYTES) and i < len(_pool) - 1:
            if _free(i):
                total -= _pool.pop(i).nbytes
            else:
                i += 1
    return raw.view(dtype).reshape(shape)


def empty_pool() -> None:
    """Give the pooled buffers that no tensor uses back to the system (torch's empty_cache)."""
    with _pool_lock:
        for i in reversed(range(len(_pool))):
            if _free(i):
                del _pool[i]


def _empty(like: np.ndarray) -> np.ndarray:
    return _alloc(like.shape, like.dtype)


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


def _dim(dim: int, ndim: int) -> int:
    """A saved dim (torch shows negative ones as unsigned 64-bit) as an index."""
    dim = int(dim)
    if dim >= 1 << 63:
        dim -= 1 << 64
    return dim % ndim


_ALL = slice(None)


def _row_index(x, index):
    """(checked, wrapped int64 rows, x as (n, m)) when ``index`` picks rows of dim 0 of a
    C-contiguous float array with one 1-D integer array; else None (NumPy handles it and
    raises NumPy's errors). Out-of-range rows also give None, so no kernel reads outside."""
    if type(index) is tuple:
        if not index or any(type(i) is not slice or i != _ALL for i in index[1:]):
            return None
        index = index[0]
    if type(index) is not np.ndarray or index.ndim != 1 or index.dtype.kind not in "iu" \
            or type(x) is not np.ndarray or x.ndim == 0 or x.dtype not in _FLOATS \
            or not x.flags.c_contiguous or index.size == 0:
        return None
    n = x.shape[0]
    lo, hi = int(index.min()), int(index.max())
    if lo < -n or hi >= n:
        return None
    idx = index.astype(np.int64, copy=lo < 0)
    if lo < 0:
        idx[idx < 0] += n
    return np.ascontiguousarray(idx), x.reshape(n, -1)


def _new(like: np.ndarray, value) -> np.ndarray:
    """A size-1 result with ``like``'s shape and dtype holding ``value``."""
    if like.ndim == 0:
        return np.array(value, dtype=like.dtype)
    return np.full(like.shape, value, dtype=like.dtype)


def _arr(x) -> np.ndarray:
    return x if type(x) is np.ndarray else np.asarray(x)


# -- forward ---------------------------------------------------------------------------------
def _unary(name: str, ref):
    body = name + "_f"

    def kernel(x):
        if x.size >= PARALLEL_MIN and _same(x):
            out = _empty(x)
            _run(body, x.size, _flat(x), _flat(out))
            return out
        return ref(x)

    kernel.__name__ = name
    kernel.__doc__ = f"{name}: NumPy below PARALLEL_MIN elements, a parallel Numba loop above."
    return staticmethod(kernel)


def _binary(name: str, ref):
    body = name + "_f"

    def kernel(a, b):
        # below PARALLEL_MIN elements (of a, or of b when a is a number) straight to NumPy
        if type(a) is np.ndarray:
            if a.size < PARALLEL_MIN:
                return ref(a, b)
        elif type(b) is not np.ndarray or b.size < PARALLEL_MIN:
            return ref(a, b)
        ta, tb = type(a) is np.ndarray, type(b) is np.ndarray
        big = a if ta else b
        if ta and tb:
            if _same(a, b):
                out = _empty(a)
                _run(body, a.size, _flat(a), _flat(b), _flat(out), 1, 1)
                return out
        else:
            s = b if ta else a
            if _same(big) and type(s) in (int, float):
                s = np.full(1, s, dtype=big.dtype)  # NumPy 2: the array's dtype wins
                out = _empty(big)
                if ta:
                    _run(body, a.size, _flat(a), s, _flat(out), 1, 0)
                else:
                    _run(body, b.size, s, _flat(b), _flat(out), 0, 1)
                return out
        return ref(a, b)

    kernel.__name__ = name
    return staticmethod(kernel)


def _nary(name: str, ref, threshold=lambda: FUSED_MIN):
    """Same-shape float inputs with number params (addcmul, leaky_relu): one pass from
    ``threshold()`` elements, no temporaries; anything else goes to the reference. Three
    inputs win from FUSED_MIN (temporaries saved); one input only from PARALLEL_MIN (NumPy's
    single ufunc pass is as fast on one core)."""
    body = name + "_f"
    scalar = next(s for s in OPS.values() if s.kernel == name).scalar
    n_in, names = len(scalar.inputs), scalar.params

    def kernel(*args, **kw):
        xs = args[:n_in]
        params = args[n_in:] + tuple(kw[p] for p in names[len(args) - n_in:] if p in kw)
        x = xs[0]
        if type(x) is np.ndarray and x.size >= threshold() and len(params) == len(names) \
                and _same(*xs) and all(type(p) in (int, float) for p in params):
            out = _empty(x)
            _run(body, x.size, *(_flat(a) for a in xs), *(x.dtype.type(p) for p in params),
                 _flat(out))
            return out
        return ref(*args, **kw)

    kernel.__name__ = name
    return staticmethod(kernel)


#: Where a NumPy ufunc on one float raises no warning (so needs no np.errstate context,
#: ~1 µs, three times the ufunc on a 0-d array): per function of the scalar vocabulary.
_QUIET_DOMAIN = {"exp": lambda v: v < 88.0, "log": lambda v: v > 0, "sqrt": lambda v: v >= 0}


def _lone_call(scalar) -> str | None:
    """``f`` when the forward is exactly ``f(x)``."""
    calls = scalar.calls()
    if len(calls) == 1:
        (f,) = calls
        if scalar.forward.replace(" ", "") == f"{f}(x)":
            return f
    return None


def _one_value_fast(op: str, ref):
    """A lone ufunc call: straight to NumPy for one in-domain float, else the reference."""
    f = _lone_call(OPS[op].scalar)
    ufunc, in_domain = NUMPY_MATH[f], _QUIET_DOMAIN[f]

    def kernel(x):
        if x.size == 1 and x.dtype in _FLOATS and in_domain(x.item()):
            return ufunc(x)
        return ref(x)

    kernel.__name__ = op
    kernel.__doc__ = f"{op}: one in-domain float straight to NumPy, else the reference."
    return staticmethod(kernel)


# -- fused backward --------------------------------------------------------------------------
def _broadcast_shape(a: tuple, b: tuple):
    try:
        return np.broadcast_shapes(a, b)
    except ValueError:
        return None


def _stanza_backward(op: str):
    """The fused backward of an op from its stanza's grads:
    ``(grad, needed, *saved) -> one array or None per input``.

    One element: the Python rules of ``rules.py``. Same-shape C-contiguous float operands
    from FUSED_MIN elements: one Numba pass for the needed grads (``<op>_b<mask>``). Else
    (small, broadcasting, mixed dtypes) the same rules on NumPy arrays; the engine sums a
    broadcast gradient back to its input's shape, as after the tensor-op formulas."""
    layout = saved_layout(op)
    n_inputs = len(OPS[op].inputs)
    reads = sorted({k for _, r, _ in layout for k in r})
    params = sorted({k for _, _, p in layout for k in p})
    one = {i: rules.scalar_rule(op, i) for i, _, _ in layout}
    # inputs that get no gradient are masks (where's condition): bool arrays only
    spec = OPS[op]
    masks = {spec.saved.index(n) for n, t in zip(spec.inputs, spec.scalar.grads)
             if t is None and n in spec.saved}
    loops = {}
    if rules.backward_loop(op):
        name_of = {**dict(zip(spec.scalar.inputs, spec.inputs)), "y": "result"}
        for mask in grad_masks(op):
            values, ps = grad_mask_args(op, mask)
            loops[mask] = (grad_mask_name(op, mask),
                           [spec.saved.index(name_of[v]) for v in values],
                           [spec.saved.index(p) for p in ps])

    def loop(grad, needed, *saved):
        """Same-shape operands from FUSED_MIN elements: the Numba pass for the needed
        grads, or None (no loop for this rule, or a non-contiguous operand)."""
        mask = tuple(i for i, _, _ in layout if needed[i])
        if mask not in loops or not all(saved[k].flags.c_contiguous for k in reads):
            return None
        name, values, ps = loops[mask]
        g, sg = _grad(grad, grad)
        outs = [_empty(grad) for _ in mask]
        dt = grad.dtype
        _run(name, grad.size, g, *(_flat(saved[k]) for k in values),
             *(dt.type(saved[k]) for k in ps), *(_flat(o) for o in outs), sg)
        out = [None] * n_inputs
        for i, o in zip(mask, outs):
            out[i] = o
        return tuple(out)

    # The checks and the one-element path run for every node of a scalar graph: generated
    # per op with its operands unrolled (a generic loop over them cost ~15% of a 10-op chain)
    args = [f"s{k}" for k in range(len(spec.saved))]
    lines = [f"def {op}_backward(grad, needed, {', '.join(args)}):",
             "    if type(grad) is not _nd or grad.dtype not in _FLOATS:",
             "        return None"]
    for k in params:
        lines += [f"    if type(s{k}) not in _NUMBERS:", "        return None"]
    lines.append("    same = True")
    for k in reads:
        want = "_BOOL" if k in masks else "grad.dtype"
        lines += [f"    if type(s{k}) is not _nd:",
                  "        same = False  # a Python number (``x * 2.5``)",
                  f"    elif s{k}.dtype != {want}:",
                  "        return None  # mixed dtypes: the formulas, with their promotions",
                  f"    elif s{k}.shape != grad.shape:",
                  f"        if _broadcast_shape(s{k}.shape, grad.shape) != grad.shape:",
                  "            return None  # broadcast the other way: the formulas",
                  "        same = False"]
    lines += ["    if same and grad.size == 1:", "        gv = grad.item()"]
    lines += [f"        v{k} = s{k}.item()" for k in reads]
    lines.append("        try:")
    for i, r, p in layout:
        call = ", ".join(["gv"] + [f"v{k}" for k in r] + [f"s{k}" for k in p])
        lines.append(f"            o{i} = _new(grad, _rule{i}({call})) if needed[{i}] else None")
    lines += ["        except (ArithmeticError, ValueError):  # math raises where NumPy gives "
              "inf/nan", "            return None"]
    has = {i for i, _, _ in layout}
    lines.append("        return (" + "".join(f"o{i}, " if i in has else "None, "
                                            for i in range(n_inputs)) + ")")
    lines += ["    if same and grad.size >= _mod.FUSED_MIN:",
              f"        out = _loop(grad, needed, {', '.join(args)})",
              "        if out is not None:",
              "            return out"]
    # small, broadcasting, or no loop: the NumPy rules, unrolled too
    for i, r, p in layout:
        call = ", ".join(["grad"] + [f"s{k}" for k in r] + [f"s{k}" for k in p])
        lines += [f"    o{i} = _np{i}({call}) if needed[{i}] else None",
                  f"    if o{i} is not None:",
                  f"        if type(o{i}) is not _nd:",
                  f"            o{i} = _np.asarray(o{i})",
                  f"        if o{i}.dtype != grad.dtype:  # bool factors widen in NumPy",
                  f"            o{i} = o{i}.astype(grad.dtype)"]
    lines.append("    return (" + "".join(f"o{i}, " if i in has else "None, "
                                        for i in range(n_inputs)) + ")")
    namespace = {"_nd": np.ndarray, "_np": np, "_mod": sys.modules[__name__],
                 **{f"_np{i}": numpy_rule(op, i) for i in has},
                 "_FLOATS": _FLOATS, "_NUMBERS": (int, float, bool),
                 "_BOOL": np.dtype(np.bool_), "_broadcast_shape": _broadcast_shape,
                 "_new": _new, "_loop": loop, **{f"_rule{i}": f for i, f in one.items()}}
    kernel = define("\n".join(lines) + "\n", f"<symgrad cpu {op}_backward>",
                    namespace)[op + "_backward"]
    kernel.__doc__ = f"Fused backward of {op}: its stanza's grads in one pass (generated)."
    return staticmethod(kernel)


def _same_float_arrays(grad, y) -> bool:
    """Both plain float NumPy arrays of one shape and dtype: what the row kernels take."""
    return (type(y) is np.ndarray and y.dtype in _FLOATS and type(grad) is np.ndarray
            and grad.shape == y.shape and grad.dtype == y.dtype)



def _layer_norm_rows(x, params, normalized_shape):
    """(rows, row length, x as a C-contiguous (rows, m) array) when the layer-norm loops
    take ``x`` and ``params`` (arrays of x's float dtype or None), else None."""
    if type(x) is not np.ndarray or x.dtype not in _FLOATS or x.size < FUSED_MIN:
        return None
    for p in params:
        if p is not None and (type(p) is not np.ndarray or p.dtype != x.dtype):
            return None
    k = len(normalized_shape)
    if k == 0 or x.ndim < k or tuple(x.shape[x.ndim - k:]) != tuple(normalized_shape):
        return None
    m = 1
    for s in normalized_shape:
        m *= s
    if m == 0:
        return None
    n = x.size // m
    return n, m, np.ascontiguousarray(x).reshape(n, m)


def _row_param(p, m: int, dt) -> np.ndarray:
    """A weight or bias as the loops read it: flat, C-contiguous (a dummy when absent)."""
    if p is None:
        return np.zeros(1, dt)
    if p.size != m:
        raise ValueError(f"layer norm parameter of {p.size} elements for rows of {m}")
    return np.ascontiguousarray(p).reshape(m)


#: a 2-D float array summed over its rows (a bias gradient: the engine's ``_sum_to``) from
#: this many rows is a BLAS product with a vector of ones, as sg.compile's generated code
#: sums it (compile/codegen.py's SUM_ROWS_GEMV_MIN): 256x256 float32 in 9 µs instead of
#: NumPy's 27 µs, and eager's bias gradients are the compiled step's
SUM_ROWS_GEMV_MIN = 8
_ones_cache: dict = {}


def _ones(n: int, dtype) -> np.ndarray:
    """A read-only vector of ``n`` ones of ``dtype`` (made once per length and dtype)."""
    key = (n, dtype)
    v = _ones_cache.get(key)
    if v is None:
        if len(_ones_cache) > 64:
            _ones_cache.clear()
        v = _ones_cache[key] = np.ones(n, dtype)
        v.flags.writeable = False
    return v


class CpuBackend(NumpyBackend):
    """Numba-compiled CPU kernels; the NumPy reference for everything not overridden."""

    name = "cpu"
    device_type = "cpu"

    # -- forward elementwise (memory-bound ones; see the module docstring) --------------------
    # The unary math ops are set below the class from their stanzas: memory-bound ones (neg,
    # abs, relu, sign) get a parallel Numba loop above PARALLEL_MIN, and a lone libm call
    # (exp, log, sqrt) skips the reference's np.errstate context for one in-domain value.

    @staticmethod
    def add_scaled_(dst, src, alpha):
        """``dst += alpha * src`` in place, in one pass with no temporary (SGD's step)."""
        if dst.size >= FUSED_MIN and _same(dst, src) and type(alpha) in (int, float):
            _run("add_scaled_f", dst.size, _flat(dst), _flat(src), dst.dtype.type(alpha))
            return
        NumpyBackend.add_scaled_(dst, src, alpha)

    @staticmethod
    def matmul(a, b):
        """BLAS through NumPy; a large 2-D result goes into a pooled buffer (no page faults:
        a weight gradient is freed by ``zero_grad`` and made again by the next backward)."""
        if type(a) is np.ndarray and type(b) is np.ndarray and a.ndim == 2 and b.ndim == 2 \
                and a.dtype is b.dtype and a.dtype in _FLOATS and a.shape[1] == b.shape[0]:
            n, m = a.shape[0], b.shape[1]
            if a.shape[1] == 1 and n * m >= FUSED_MIN:
                # an outer product (a batch-1 weight gradient): one multiply per element,
                # exactly what gemm computes, without OpenBLAS waking its threads for a
                # k=1 product (128x128: gemm ~20 µs, NumPy broadcasting ~7, this ~2)
                out = _alloc((n, m), a.dtype)
                _run("outer_f", n * m, np.ascontiguousarray(a).reshape(-1),
                     np.ascontiguousarray(b).reshape(-1), out.reshape(-1))
                return out
            if n * m * a.itemsize >= POOL_MIN:
                return np.matmul(a, b, out=_alloc((n, m), a.dtype))
        return np.matmul(a, b)

    # -- fused backward rules (OpSpec.fused_backward names them; the unary ones of
    # base.UNARY_FUSED_BACKWARD are set below the class) ------------------------------------

    @staticmethod
    def softmax_backward(grad, needed, dim, result):
        """``(g - sum(g*y, dim)) * y``; one pass per row over the last dim when large."""
        y = result
        if not _same_float_arrays(grad, y):
            return None  # the formulas handle it
        if y.ndim == 0:  # the row is the element: 0, or NaN where y is (as torch)
            return (_arr((grad - grad * y) * y),)
        d = _dim(dim, y.ndim)
        if y.size >= FUSED_MIN and d == y.ndim - 1 and y.flags.c_contiguous:
            g = np.ascontiguousarray(grad).reshape(-1, y.shape[-1])
            out = _empty(y)
            _run("softmax_rows_b", y.size, g, y.reshape(g.shape), out.reshape(g.shape))
            return (out,)
        return (_arr((grad - (grad * y).sum(d, keepdims=True)) * y),)

    # -- fused backward of the nn ops: BLAS and ufuncs straight on the arrays --------------
    @staticmethod
    def addmm_backward(grad, needed, alpha, beta, mat1, mat1_sym_sizes, mat1_sym_strides,
                       mat2, mat2_sym_sizes, mat2_sym_strides):
        """nn.Linear's backward: the three formulas of ``addmm`` as NumPy calls (mm's
        layout rule included), instead of five or six tensor ops."""
        if type(grad) is not np.ndarray or grad.ndim != 2 or grad.dtype not in _FLOATS \
                or type(alpha) not in (int, float) or type(beta) not in (int, float):
            return None
        for m in (mat1, mat2):
            if m is not None and (type(m) is not np.ndarray or m.dtype != grad.dtype):
                return None
        mm = CpuBackend.matmul
        g_self = g_mat1 = g_mat2 = None
        if needed[0]:
            g_self = grad if beta == 1 else np.multiply(grad, beta)
        if needed[1]:
            if column_major(mat1_sym_sizes, mat1_sym_strides):
                g_mat1 = mm(mat2, grad.T).T
            else:
                g_mat1 = mm(grad, mat2.T)
            if alpha != 1:
                g_mat1 = np.multiply(g_mat1, alpha)
        if needed[2]:
            if column_major(mat2_sym_sizes, mat2_sym_strides):
                g_mat2 = mm(grad.T, mat1).T
            else:
                g_mat2 = mm(mat1.T, grad)
            if alpha != 1:
                g_mat2 = np.multiply(g_mat2, alpha)
        return (g_self, g_mat1, g_mat2)

    @staticmethod
    def mse_loss_backward(grad, needed, reduction, self, target):
        """``(self - target) * (grad * scale)`` once, for both inputs (target's negated)."""
        if type(grad) is not np.ndarray or grad.dtype not in _FLOATS:
            return None
        for x in (self, target):
            if type(x) is not np.ndarray or x.dtype != grad.dtype:
                return None
        scale = 2.0 / self.size if reduction == 1 else 2.0  # 1: torch's Reduction::Mean
        d = np.multiply(np.subtract(self, target), np.multiply(grad, scale))
        return (d if needed[0] else None, np.negative(d) if needed[1] else None)

    @staticmethod
    def log_softmax_backward(grad, needed, dim, result):
        """``g - exp(y) * sum(g, dim)`` (NumPy: the exp is SIMD there)."""
        y = result
        if not _same_float_arrays(grad, y):
            return None  # the formulas handle it
        if y.ndim == 0:
            return (_arr(grad - np.exp(y) * grad),)
        d = _dim(dim, y.ndim)
        return (_arr(grad - np.exp(y) * grad.sum(d, keepdims=True)),)

    # -- max pooling forward: one Numba pass over the windows ---------------------------------
    @staticmethod
    def max_pool_windows(x, plane, n_out):
        """(values, in-plane indices) of each window's first maximum, shaped (planes,
        n_out), from the per-tap offsets ``plane`` (n_out, taps) of one plane's windows (the
        same in every plane); or None to decline (the generic gather and argmax)."""
        if type(x) is not np.ndarray or x.dtype not in _FLOATS or x.ndim < 2 \
                or x.size < FUSED_MIN or type(plane) is not np.ndarray or plane.ndim != 2:
            return None
        hw = x.shape[-1] * x.shape[-2]
        planes = x.size // hw if hw else 0
        if planes == 0 or n_out != plane.shape[0] or plane.shape[1] == 0 \
                or plane.dtype != np.int64 or int(plane.min()) < 0 or int(plane.max()) >= hw:
            return None
        values = _alloc((planes, n_out), x.dtype)
        idx = np.empty((planes, n_out), np.int64)
        _run("max_pool_taps", plane.size, np.ascontiguousarray(x).reshape(planes, hw),
             np.ascontiguousarray(plane), values, idx)
        return values, idx

    @staticmethod
    def max_pool2d_with_indices_backward(grad, needed, ceil_mode, dilation, kernel_size,
                                         padding, result1, self, stride):
        """MaxPool2DWithIndicesBackward0: each output's gradient added at the index the
        forward picked, in the formula's order (one pass a plane), or None to decline."""
        x, idx = self, result1
        if not needed[0] or type(grad) is not np.ndarray or grad.dtype not in _FLOATS \
                or type(x) is not np.ndarray or x.dtype != grad.dtype or x.ndim < 2 \
                or type(idx) is not np.ndarray or idx.dtype != np.int64 \
                or idx.shape != grad.shape or grad.size < FUSED_MIN:
            return None
        hw = x.shape[-1] * x.shape[-2]
        planes = x.size // hw if hw else 0
        if planes == 0 or grad.size % planes or int(idx.min()) < 0 or int(idx.max()) >= hw:
            return None
        dx = _alloc(x.shape, x.dtype)
        _run("max_pool_scatter", grad.size, np.ascontiguousarray(grad).reshape(planes, -1),
             np.ascontiguousarray(idx).reshape(planes, -1), dx.reshape(planes, hw))
        return (dx,)

    # -- softmax forward along the last dim: two Numba passes around NumPy's SIMD exp ----------
    @staticmethod
    def softmax_last(x, dim, safe):
        """softmax (``safe``: all -inf rows give zeros) of a float array along its last dim,
        or None to decline (other dims, small or odd arrays: the generic ops)."""
        if type(x) is not np.ndarray or x.dtype not in _FLOATS or x.size < FUSED_MIN \
                or x.ndim == 0 or _dim(dim, x.ndim) != x.ndim - 1 or x.shape[-1] == 0:
            return None
        m = x.shape[-1]
        n = x.size // m
        out = _alloc(x.shape, x.dtype)
        o2 = out.reshape(n, m)
        dead = np.empty(n, np.bool_)
        _run("softmax_shift_rows", x.size, np.ascontiguousarray(x).reshape(n, m), o2, dead)
        with np.errstate(all="ignore"):
            np.exp(o2, out=o2)
        _run("softmax_norm_rows", x.size, o2, dead, bool(safe), np.empty(n, x.dtype))
        return out

    @staticmethod
    def embedding_backward(grad, needed, indices, padding_idx, scale_grad_by_freq, sparse,
                           weight_sym_argsize_0):
        """EmbeddingBackward0 without padding or frequency scaling: the rows of ``grad``
        added into zeros at ``indices`` in one serial pass (the formula's index_add, same
        order), or None to decline. ``indices`` is the op's parameter (a tensor)."""
        indices = getattr(indices, "_data", indices)
        if not needed[0] or scale_grad_by_freq or s64_of(padding_idx) >= 0 \
                or type(grad) is not np.ndarray or grad.dtype not in _FLOATS \
                or type(indices) is not np.ndarray or grad.ndim == 0 \
                or grad.shape[:-1] != indices.shape:
            return None
        out = np.zeros((int(weight_sym_argsize_0), grad.shape[-1]), grad.dtype)
        rows = _row_index(out, indices.reshape(-1))
        if rows is None:
            return None
        idx, out2 = rows
        _run("scatter_add_rows", 0, np.ascontiguousarray(grad).reshape(idx.size, -1), idx,
             out2)
        return (out,)

    # -- layer norm: one pass per row forward and backward (kernels.layer_norm_rows*) ----------
    @staticmethod
    def layer_norm(input, weight, bias, normalized_shape, eps):  # noqa: A002
        """native_layer_norm's forward in one Numba pass: (y, mean, rstd) with the statistics
        shaped as the op's (size-1 normalized dims), or None to decline (the generic ops)."""
        rows = _layer_norm_rows(input, (weight, bias), normalized_shape)
        if rows is None:
            return None
        n, m, x = rows
        dt = input.dtype
        y = _alloc(input.shape, dt)
        k = len(normalized_shape)
        stats = input.shape[:input.ndim - k] + (1,) * k
        mean, rstd = np.empty(stats, dt), np.empty(stats, dt)
        w, b = _row_param(weight, m, dt), _row_param(bias, m, dt)
        _run("layer_norm_rows", input.size, x, w, b, weight is not None, bias is not None,
             dt.type(m), dt.type(eps), dt.type(1), y.reshape(n, m), mean.reshape(n),
             rstd.reshape(n))
        return y, mean, rstd

    # -- the fused attention node: BLAS matmuls on contiguous operands around one Numba pass
    # per softmax (kernels.attn_*); attention_numpy.py where the kernels do not apply
    @staticmethod
    def flash_attention(query, key, value, attn_mask, is_causal, scale):
        """The fused node's forward, (output, logsumexp), or None to decline."""
        a = _attn_shapes((query, key, value), attn_mask)
        if a is None:
            return _flash_attention(query, key, value, attn_mask, is_causal, scale)
        dt, mask = a
        b, h, n, _ = query.shape
        k, v = _attn_heads(key, h), _attn_heads(value, h)
        s = np.matmul(query, np.ascontiguousarray(k.swapaxes(-1, -2)))
        rows = s.reshape(-1, s.shape[-1])
        m, lse = np.empty((b, h, n), dt), np.empty((b, h, n), dt)
        _run("attn_shift", s.size, rows, mask, attn_mask is not None, h, n, bool(is_causal),
             _attn_factor(scale, query), dt.type(-np.inf), m.reshape(-1))
        np.exp(s, out=s)
        _run("attn_norm", s.size, rows, m.reshape(-1), lse.reshape(-1))
        out = np.empty_like(query, shape=query.shape[:3] + value.shape[3:])
        np.matmul(s, v, out=out)  # torch's output is in the query's memory order
        _keep_probs(s, lse, (query, key, value, attn_mask), (bool(is_causal), scale))
        return out, lse

    @staticmethod
    def flash_attention_backward(grad, needed, attn_mask, dropout_p, is_causal, key,
                                 logsumexp, output, query, scale, value, *, packed=False):
        """ScaledDotProductFlashAttentionForCpuBackward0, (dq, dk, dv) with None where not
        needed, or None (decline) for what neither path covers. ``packed`` (sg.compile's
        step): all three in one (B, L, 3, H, E) array where they fit it (packed_grads)."""
        attn_mask = getattr(attn_mask, "_data", attn_mask)  # the node keeps the Tensor
        if type(attn_mask) is np.ndarray and attn_mask.dtype in _HALF_NP and \
                query.dtype == np.float32:  # a half node's operands come upcast, not its mask
            attn_mask = attn_mask.astype(np.float32)  # exact
        a = None if dropout_p else _attn_shapes((query, key, value), attn_mask)
        if a is not None:
            lead = query.shape[:3]
            for x, shape in ((grad, lead + value.shape[3:]), (output, lead + value.shape[3:]),
                             (logsumexp, lead)):
                if type(x) is not np.ndarray or x.dtype != a[0] or x.shape != shape:
                    a = None
        if a is None:
            return _flash_attention_backward(grad, needed, attn_mask, dropout_p, is_causal,
                                             key, logsumexp, output, query, scale, value)
        mask = a[1]
        h = query.shape[1]
        k, v = _attn_heads(key, h), _attn_heads(value, h)
        factor = _attn_factor(scale, query)
        p = _kept_probs(logsumexp, (query, key, value, attn_mask), (bool(is_causal), scale))
        if p is None:  # from the saved logsumexp: exp(q k^T * scale + mask - lse)
            p = np.matmul(query, np.ascontiguousarray(k.swapaxes(-1, -2)))
            _run("attn_logits", p.size, p.reshape(-1, p.shape[-1]), mask, attn_mask is not None,
                 h, query.shape[2], bool(is_causal), factor, p.dtype.type(-np.inf),
                 np.ascontiguousarray(logsumexp).reshape(-1))
            np.exp(p, out=p)
        rows = p.reshape(-1, p.shape[-1])
        dq = dk = dv = None
        room = (None,) * 3
        if packed and all(needed[:3]):
            room = _packed_grads(query, key, value) or room
        if needed[2]:
            dv = _attn_grad(p.swapaxes(-1, -2), grad, value.shape[1], room[2])
        if needed[0] or needed[1]:
            ds = np.matmul(grad, np.ascontiguousarray(v.swapaxes(-1, -2)))
            go = grad * output
            _run("attn_dscores", ds.size, ds.reshape(rows.shape), rows,
                 go.reshape(-1, go.shape[-1]), factor)
            if needed[0]:
                dq = _attn_grad(ds, k, h, room[0])
            if needed[1]:
                dk = _attn_grad(ds.swapaxes(-1, -2), query, key.shape[1], room[1])
        return dq, dk, dv  # in torch's layout, (B, L, H, E) memory (attention_numpy._laid)

    @staticmethod
    def native_layer_norm_backward(grad, needed, bias, input, normalized_shape,  # noqa: A002
                                   result1, result2, weight):
        """NativeLayerNormBackward0's three formulas in one serial pass over the rows, with
        the saved statistics (result1 = mean, result2 = rstd), or None to decline."""
        rows = _layer_norm_rows(input, (grad, weight), normalized_shape)
        if rows is None or grad.shape != input.shape:
            return None
        n, m, x = rows
        dt = input.dtype
        for s in (result1, result2):
            if type(s) is not np.ndarray or s.dtype != dt or s.size != n:
                return None
        need_wb = bool(needed[1] or needed[2])
        dx = _alloc(input.shape, dt) if needed[0] else np.empty((1, 1), dt)
        gw, gb = np.zeros(m), np.zeros(m)
        _run("layer_norm_rows_b", 0, np.ascontiguousarray(grad).reshape(n, m), x,
             np.ascontiguousarray(result1).reshape(n), np.ascontiguousarray(result2).reshape(n),
             _row_param(weight, m, dt), weight is not None, dt.type(m), bool(needed[0]),
             dx.reshape(n, m) if needed[0] else dx, need_wb, gw, gb,
             np.empty(2, dt))
        shape = tuple(normalized_shape)
        return (dx if needed[0] else None,
                gw.astype(dt).reshape(shape) if needed[1] else None,
                gb.astype(dt).reshape(shape) if needed[2] else None)

    # -- convolution (backends/conv_numpy.py) with Numba im2col / col2im and pooled buffers --
    @staticmethod
    def convolution(input, weight, bias, stride, padding, dilation, groups):  # noqa: A002
        """conv1d/conv2d forward in one call, or None to decline (the generic lowering)."""
        if not _conv.accepts(input, weight, bias):
            return None
        geo = _conv.geometry(input.shape, weight.shape, stride, padding, dilation, groups)
        if geo is None:
            return None
        if _blocked(geo):
            if _wide(geo) and bool(np.isfinite(input).all()):  # (*)
                return _conv.forward_wide(input, weight, bias, geo, _im2col_wide,
                                          _wide_out, _alloc)
            return _conv.forward_blocked(input, weight, bias, geo, _im2col, _alloc)
        return _conv.forward(input, weight, bias, geo, _im2col, _alloc)
        # (*) the wide product also multiplies the input's values beside the outputs: an
        # infinity there could raise NumPy's invalid-value warning for no output

    @staticmethod
    def convolution_backward(grad, needed, bias_sym_sizes_opt, dilation, groups, input,  # noqa: A002
                             output_padding, padding, stride, transposed, weight):
        """ConvolutionBackward0's three formulas on arrays (no graph recorded), or None."""
        if transposed or not _conv.accepts(grad, input, weight):
            return None
        geo = _conv.geometry(input.shape, weight.shape, stride, padding, dilation, groups)
        if geo is None:
            return None
        if _blocked(geo):
            if _wide(geo, True) and (not needed[0] or bool(np.isfinite(weight).all())):
                return _conv.backward_wide(grad, needed, input, weight, geo, _im2col_wide,
                                           _col2im_wide, _wide_in, _alloc)
            return _conv.backward_blocked(grad, needed, input, weight, geo, _im2col,
                                          _col2im_into, _alloc)
        return _conv.backward(grad, needed, input, weight, geo, _im2col, _col2im, _alloc)

    # -- gather / scatter-add along the first dim (integer-array indexing and its backward) ---
    @staticmethod
    def getitem(x, index):
        """``x[idx]`` for one int64 index array on dim 0 of a large float array: all cores."""
        rows = _row_index(x, index)
        if rows is not None and x.size >= PARALLEL_MIN:
            idx, x2 = rows
            out = _alloc((idx.size,) + x.shape[1:], x.dtype)
            _run("take_rows", PARALLEL_MIN, x2, idx, out.reshape(idx.size, -1))
            return out
        return NumpyBackend.getitem(x, index)

    @staticmethod
    def index_put(x, index, values, accumulate=False):
        """``x[idx] += values`` with repeated rows adding up (the backward of ``x[idx]``):
        one serial pass instead of NumPy's ``add.at``."""
        rows = _row_index(x, index) if accumulate and x.size >= FUSED_MIN else None
        if rows is not None:
            idx, x2 = rows
            if type(values) is np.ndarray and values.dtype == x.dtype \
                    and values.shape == (idx.size,) + x.shape[1:]:
                v = np.ascontiguousarray(values).reshape(idx.size, -1)
                _run("scatter_add_rows", 0, v, idx, x2)  # serial: repeats add in order
                return x
        return NumpyBackend.index_put(x, index, values, accumulate)

    # -- reductions and copies ---------------------------------------------------------------
    @staticmethod
    def sum(x, axis=None, keepdims=False, dtype=None):
        """Large float sums on all cores with a float64 accumulator; the rest as NumPy."""
        if type(x) is np.ndarray and x.size >= PARALLEL_MIN and x.dtype in _FLOATS \
                and (dtype is None or np.dtype(getattr(dtype, "np", dtype)) == x.dtype) \
                and x.flags.c_contiguous:
            if isinstance(axis, int):
                axis = (axis,)
            if axis is None or tuple(sorted(a % x.ndim for a in axis)) == tuple(range(x.ndim)):
                total = _run("sum_f", x.size, _flat(x))
                out = np.array(total, dtype=x.dtype)
                return out.reshape((1,) * x.ndim) if keepdims else out
            if x.ndim == 2 and tuple(a % 2 for a in axis) == (1,):
                out = np.empty(x.shape[0], dtype=x.dtype)
                _run("sum_last_f", x.size, x, out)
                return out.reshape(-1, 1) if keepdims else out
        if type(x) is np.ndarray and x.ndim == 2 and x.shape[0] >= SUM_ROWS_GEMV_MIN \
                and x.dtype in _FLOATS and not keepdims and dtype is None \
                and axis in ((0,), 0, (-2,), -2):
            return np.matmul(_ones(x.shape[0], x.dtype), x)
        return NumpyBackend.sum(x, axis, keepdims, dtype)

    @staticmethod
    def copy(x):
        if type(x) is np.ndarray and x.size >= PARALLEL_MIN and x.flags.c_contiguous \
                and x.dtype in _FLOATS:
            out = _empty(x)
            _run("copy_f", x.size, _flat(x), _flat(out))
            return out
        return NumpyBackend.copy(x)


#: Stanza kernels that are their NumPy reference when their first input has fewer than
#: PARALLEL_MIN elements (``_unary``, ``_binary``): a hot caller may call the reference
#: itself and save a Python call (backends.small_kernel; autograd's straight line does).
SMALL_KERNELS: dict = {}

# the elementwise kernels from the op stanzas: memory-bound ones get Numba loops (parallel
# above PARALLEL_MIN; three-input ones from FUSED_MIN, saving temporaries), a lone libm call
# (exp, log, sqrt) skips the reference's np.errstate context for one in-domain value
for _kernel in scalar_kernels():
    _ref, _arity = getattr(_R, _kernel), len(next(
        s for s in OPS.values() if s.kernel == _kernel).inputs)
    if rules.forward_loop(_kernel):
        if _arity == 1 and OPS[_kernel].scalar.params:
            _method = _nary(_kernel, _ref, threshold=lambda: PARALLEL_MIN)
        else:
            _method = (_unary if _arity == 1 else _binary if _arity == 2 else _nary)(
                _kernel, _ref)
            if _arity <= 2:
                SMALL_KERNELS[_kernel] = _ref
        setattr(CpuBackend, _kernel, _method)
    elif _arity == 1 and _lone_call(OPS[_kernel].scalar) in _QUIET_DOMAIN:
        setattr(CpuBackend, _kernel, _one_value_fast(_kernel, _ref))


# -- convolution: Numba im2col / col2im for conv_numpy's forward and backward ----------------
def _planes(geo):
    """conv1d/conv2d geometry as 2-D planes: (H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw);
    a conv1d is a conv2d of height 1. None for other ranks (NumPy's gather runs)."""
    if len(geo.spatial) == 2:
        return geo.spatial + geo.kernel + geo.out + geo.stride[:1] + geo.stride[1:] \
            + geo.padding[:1] + geo.padding[1:] + geo.dilation[:1] + geo.dilation[1:]
    if len(geo.spatial) == 1:
        return (1,) + geo.spatial + (1,) + geo.kernel + (1,) + geo.out + (1, geo.stride[0], 0,
                                                                          geo.padding[0], 1,
                                                                          geo.dilation[0])
    return None


def _im2col(x, geo, cols) -> None:
    """conv_numpy's gather as one Numba pass (no padded copy of the input)."""
    p = _planes(geo)
    if p is None:
        _conv.gather(x, geo, cols)
        return
    planes = geo.n * geo.c
    _run("conv_im2col", cols.size, np.ascontiguousarray(x).reshape(planes, p[0], p[1]),
         cols.reshape((planes,) + p[2:6]), *p[6:])


def _col2im(cols, geo):
    """conv_numpy's scatter as one Numba pass into a pooled buffer."""
    p = _planes(geo)
    if p is None:
        return _conv.scatter(cols, geo)
    dx = _alloc((geo.n, geo.c) + geo.spatial, cols.dtype)
    _col2im_into(cols, geo, dx)
    return dx


def _col2im_into(cols, geo, dx) -> None:
    """col2im of a conv1d/conv2d (``_planes`` not None) into ``dx`` (N, C, spatial...),
    C-contiguous, of the columns' dtype (the blocked backward's rows of its input
    gradient); every element overwritten."""
    p = _planes(geo)
    planes = geo.n * geo.c
    _run("conv_col2im", cols.size, cols.reshape((planes,) + p[2:6]),
         dx.reshape(planes, p[0], p[1]), *p[6:])


#: column elements (the whole batch's) below which a conv1d/conv2d runs blocked over images
#: (conv_numpy.forward_blocked): cache-resident columns, serial loops. Larger ones keep the
#: whole-batch passes, whose loops run on all cores from PARALLEL_MIN. A constant, not
#: PARALLEL_MIN itself: which summation order runs depends on the shapes alone.
CONV_BLOCKED_MAX = 1 << 21


def _blocked(geo) -> bool:
    return len(geo.spatial) <= 2 and geo.n * geo.c * prod(geo.kernel) * geo.positions \
        < CONV_BLOCKED_MAX


def _wide(geo, backward: bool = False) -> bool:
    """Stride 1, no padding: the wide columns apply (conv_numpy.forward_wide). The backward
    first spreads the gradient into the wide layout, a copy of OW-element rows as slow as
    the gather it saves where the rows are long: only below WIDE_BACKWARD_OW (measured on
    LeNet: its conv2, OW 8, gains; its conv1, OW 24, loses)."""
    return _WIDE_ON and all(s == 1 for s in geo.stride) and not any(geo.padding) \
        and (not backward or geo.out[-1] < WIDE_BACKWARD_OW)


_WIDE_ON = True
#: the backward runs on wide columns below this output width
WIDE_BACKWARD_OW = 16


@lru_cache(maxsize=64)
def _wide_args(geo):
    """(H*W, W, OW, dh, dw) of a conv1d/conv2d, the wide columns' bounds checked."""
    p = _planes(geo)
    h, w, kh, kw, oh, ow = p[:6]
    dh, dw = p[10:12]
    pw = _conv.wide_positions(geo)
    if (kh - 1) * dh * w + (kw - 1) * dw + pw != h * w or pw != (oh - 1) * w + ow:
        raise AssertionError("wide columns out of bounds")  # stride 1, no padding: never
    return h * w, w, ow, dh, dw


def _im2col_wide(x, geo, cols, clean) -> None:
    """x (m, C, spatial...) into the wide cols (m, groups, rows, P)."""
    hw, w, ow, dh, dw = _wide_args(geo)
    planes = geo.n * geo.c
    k = _planes(geo)[2:4]
    _run("conv_im2col_wide", cols.size, x.reshape(planes, hw),
         cols.reshape((planes,) + k + (cols.shape[-1],)), w, ow, dh, dw, clean)


def _col2im_wide(cols, geo, dx) -> None:
    """The wide cols (m, groups, rows, P) added back into dx (m, C, spatial...)."""
    hw, w, ow, dh, dw = _wide_args(geo)
    planes = geo.n * geo.c
    k = _planes(geo)[2:4]
    _run("conv_col2im_wide", cols.size, cols.reshape((planes,) + k + (cols.shape[-1],)),
         dx.reshape(planes, hw), w, dh, dw)


def _wide_out(res, b, out) -> None:
    """The wide product's outputs (m, O, P) into out (m, O, OH, OW) (+ the bias)."""
    has_b = b is not None
    _run("conv_wide_out", out.size, res, b if has_b else res[0, 0, :1], has_b, out)


def _wide_in(g, wide) -> None:
    """A block's gradient (m, O, OH, OW) into the wide layout (m, O, P)."""
    _run("conv_wide_in", wide.size, g, wide)


def _built_on_first_call(name: str, make):
    """A class attribute that builds the real kernel on its first call and puts it in its
    place (generating every op's fused backward at import cost ~50 ms of ``import symgrad``;
    the engine looks kernels up per node, so later calls go straight to the built one)."""

    def first_call(*args):
        kernel = make()
        setattr(CpuBackend, name, kernel)
        return kernel.__func__(*args)

    first_call.__name__ = name
    first_call.__doc__ = f"{name}: generated from the op's stanza on first use."
    return staticmethod(first_call)


for _op in fused_from_stanza():  # the fused backward rules OpSpec.fused_backward names
    setattr(CpuBackend, _op + "_backward", _built_on_first_call(
        _op + "_backward", lambda _op=_op: _stanza_backward(_op)))

_Self = CpuBackend


# -- exact GELU in float32: erf without libm calls (kernels.erf_f32_rows), SIMD exp from NumPy
_F32 = np.dtype(np.float32)
_gelu_reference = CpuBackend.gelu
_gelu_backward_stanza = _stanza_backward("gelu").__func__


def _gelu_loop_ok(*arrays) -> bool:
    """float32, one shape, C-contiguous, from FUSED_MIN elements: the loops take them."""
    return arrays[0].dtype == _F32 and arrays[0].size >= FUSED_MIN and _same(*arrays) \
        if type(arrays[0]) is np.ndarray else False


def _gelu(x, **params):
    """gelu's forward: the float32 loop (same float32 roundings as the stanza's NumPy
    expression, erf rounded once from float64), else the reference."""
    if not params and _gelu_loop_ok(x):
        out = _empty(x)
        _run("gelu_f32", x.size, _flat(x), _flat(out))
        return out
    return _gelu_reference(x, **params)


def _gelu_backward(grad, needed, approximate, x):
    """GeluBackward0 on float32 arrays in two loops and NumPy's exp, else the stanza's
    fused backward (approximate is "none": gelu_tanh is its own op)."""
    if needed[0] and _gelu_loop_ok(x, grad):
        e, a, out = _empty(x), _empty(x), _empty(x)
        fx, fa = _flat(x), _flat(a)
        _run("gelu_b_prep_f32", x.size, fx, _flat(e), fa)
        np.exp(fa, out=fa)
        _run("gelu_b_f32", x.size, _flat(grad), fx, _flat(e), fa, _flat(out))
        return (out,)
    return _gelu_backward_stanza(grad, needed, approximate, x)


CpuBackend.gelu = staticmethod(_gelu)
CpuBackend.gelu_backward = staticmethod(_gelu_backward)
