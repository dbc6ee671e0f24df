"""numba.cuda kernels: elementwise (n-ary, fused backward), reductions, scans and sorts along
a dim, matmul, gather/scatter, fill, arange and random numbers.

Every kernel reads its operands from flat 1-D device buffers through an element offset and
per-dim element strides (a view is just different offset/strides), so transposes,
broadcasts and slices need no copy; contiguous operands take a flat path without the
index arithmetic. Kernels are generated per operand layout (flat / strided / scalar) and
cached; numba compiles each on its first launch per argument types.

Launch geometry is chosen per kernel family (block size, grid-stride caps, matmul tiles).
Under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), where each GPU thread is a Python
thread, the same kernels run with tiny blocks and tiles so tests stay fast; and the scalar
math maps to NumPy's (which returns inf/nan where Python's ``math`` would raise, as the
GPU does). Everything else is the same code.
"""

from __future__ import annotations

import math

import numpy as np
from numba import config, cuda

from ...ops import OPS
from ...ops.elementwise import (
    fused_from_stanza,
    grad_mask_args,
    grad_mask_name,
    grad_masks,
    scalar_kernels,
)
from ...ops.scalar import build, define

__all__ = ["SIM", "stats", "elementwise", "reduce_rows", "arg_reduce_rows", "matmul",
           "gather", "scatter", "arange", "random", "error_flag", "softmax_rows_backward",
           "scan_rows", "sort_rows", "SORT_MAX", "conv_im2col", "conv_col2im"]

SIM = bool(config.ENABLE_CUDASIM)

if SIM:
    EW_TPB, EW_MAX_BLOCKS = 16, 2
    RED_TPB, RED_MAX_BLOCKS, RED_SPLIT_MIN = 8, 4, 32
    MM_BM, MM_BN, MM_BK, MM_TM, MM_TN = 8, 8, 4, 4, 4
else:  # pragma: no cover - needs a GPU
    EW_TPB, EW_MAX_BLOCKS = 256, 8192
    RED_TPB, RED_MAX_BLOCKS, RED_SPLIT_MIN = 256, 4096, 4096
    MM_BM, MM_BN, MM_BK, MM_TM, MM_TN = 128, 128, 8, 8, 8

#: kernel launches and host<->device transfers since import (tests read and reset these).
stats = {"launches": 0, "h2d": 0, "d2h": 0}


def launch(kernel, grid, block, *args) -> None:
    """Every launch goes through here (one place to count and to choose the stream)."""
    stats["launches"] += 1
    kernel[grid, block](*args)


def _device(fn):
    """A device function; under the simulator a plain Python function (much faster)."""
    return fn if SIM else cuda.jit(device=True)(fn)


def _jit(fn):
    return cuda.jit(fn)


# -- scalar math ----------------------------------------------------------------------------
if SIM:
    _exp, _log, _sin, _cos, _tanh, _sqrt, _pow = (np.exp, np.log, np.sin, np.cos, np.tanh,
                                                  np.sqrt, np.power)
else:  # pragma: no cover
    _exp, _log, _sin, _cos, _tanh, _sqrt, _pow = (math.exp, math.log, math.sin, math.cos,
                                                  math.tanh, math.sqrt, math.pow)
# libm on the GPU; under the simulator NumPy's ufuncs (``math.erf`` there: NumPy has none)
_log1p, _expm1, _erf, _atan2, _hypot, _log2, _log10 = (
    (np.log1p, np.expm1, math.erf, np.arctan2, np.hypot, np.log2, np.log10) if SIM
    else (math.log1p, math.expm1, math.erf, math.atan2, math.hypot, math.log2, math.log10))


@_device
def _off(i, shape, strides):
    """Element offset of the i-th element (row-major over ``shape``) of a strided view."""
    o = 0
    for d in range(len(shape) - 1, -1, -1):
        s = shape[d]
        q = i // s
        o += (i - q * s) * strides[d]
        i = q
    return o


def _f_identity(x):
    return x


def _f_to_bool(x):
    return x != 0


def _f_zero(x):
    return x * 0


# -- the scalar vocabulary's own helpers (symgrad/ops/scalar.py), as device functions ---------
def _v_sign(x):
    """torch.sign: 0 for +-0 and for NaN (torch 2.13 computes (0 < x) - (x < 0))."""
    if x > 0:
        return x * 0 + 1
    if x < 0:
        return x * 0 - 1
    if x == x:
        return x - x
    return 0.0


def _v_where(c, a, b):
    return a if c else b


def _v_maximum(a, b):
    return a if (a > b or a != a) else b  # NaN-propagating, as torch.maximum


def _v_minimum(a, b):
    return a if (a < b or a != a) else b


def _v_ipow(a, b):
    """``pow`` on integers (by squaring; a negative exponent is refused before launch)."""
    r = a * 0 + 1
    base = a
    e = b
    while e > 0:
        if e & 1:
            r *= base
        base *= base
        e >>= 1
    return r


# -- fused backward of losses (not elementwise stanzas: their own rules) ----------------------
def _b_mse(s, t, g, c):
    return (s - t) * (g * c)


def _b_mse_neg(s, t, g, c):
    return -((s - t) * (g * c))


def _b_mse2(s, t, g, c):
    d = (s - t) * (g * c)
    return d, -d




#: name -> device function; ``elementwise`` builds kernels around these.
FUNCS = {name[3:] if name.startswith("_f_") else "b_" + name[3:]: _device(fn)
         for name, fn in list(globals().items())
         if name.startswith(("_f_", "_b_")) and callable(fn)}

#: The scalar-math vocabulary (symgrad/ops/scalar.py) as device functions; ``INT_MATH`` is
#: the same for integer operands (``pow`` by squaring: libm's pow is a float function).
CUDA_MATH = {"exp": _exp, "log": _log, "sin": _sin, "cos": _cos, "tanh": _tanh,
             "sqrt": _sqrt, "abs": abs, "sign": _device(_v_sign), "where": _device(_v_where),
             "maximum": _device(_v_maximum), "minimum": _device(_v_minimum), "log1p": _log1p,
             "log2": _log2, "log10": _log10,
             "expm1": _expm1, "erf": _erf, "atan2": _atan2, "hypot": _hypot, "pow": _pow,
             "pi": math.pi}
INT_MATH = {**CUDA_MATH, "pow": _device(_v_ipow)}


def _stanza_of(kernel: str):
    return next(s for s in OPS.values() if s.kernel == kernel)


# The elementwise kernels from the op stanzas: ``FUNCS[kernel]`` (and ``FUNCS[kernel +
# "@int"]`` where the stanza calls pow), and per fused op and subset of needed inputs
# ``FUNCS["b_" + grad_mask_name(op, mask)]`` returning the mask's grads.
for _kernel in scalar_kernels():
    _sc = _stanza_of(_kernel).scalar
    _params = _sc.inputs + _sc.params
    FUNCS[_kernel] = _device(build(f"_f_{_kernel}", _params, _sc.forward, CUDA_MATH))
    if "pow" in _sc.calls():
        FUNCS[_kernel + "@int"] = _device(build(f"_fi_{_kernel}", _params, _sc.forward,
                                                INT_MATH))


def _backward_functions(op: str) -> None:
    sc = OPS[op].scalar
    rules = {i: _device(build(f"_r_{op}_{i}", ("g",) + sc.reads(i) + sc.param_reads(i),
                              text, CUDA_MATH))
             for i, text in enumerate(sc.grads) if text is not None}
    for mask in grad_masks(op):
        values, params = grad_mask_args(op, mask)
        name = "b_" + grad_mask_name(op, mask)
        calls = ", ".join(f"_r{i}(g{''.join(', ' + v for v in sc.reads(i) + sc.param_reads(i))})"
                          for i in mask)
        src = (f"def _{name}({', '.join(('g',) + values + params)}):\n"
               f"    return {calls}\n")  # one grad: a value; several: a tuple
        fn = define(src, f"<symgrad cuda {name}>", {f"_r{i}": rules[i] for i in mask})
        FUNCS[name] = _device(fn["_" + name])


for _op in fused_from_stanza():
    _backward_functions(_op)


# -- elementwise ----------------------------------------------------------------------------
_EW_CACHE: dict = {}
CONST = "const"  # operands[k][0] is CONST marks a scalar operand (compared by identity)


def _build_elementwise(fn_name: str, kinds: tuple, out_kind: str, nout: int):
    params = ["n", "shape"]
    for j in range(nout):
        params += [f"out{j}", f"oo{j}", f"os{j}"]
    for k in range(len(kinds)):
        params += [f"a{k}", f"o{k}", f"s{k}"]
    lines = [f"def kernel({', '.join(params)}):",
             "    i = cuda.grid(1)",
             "    step = cuda.gridsize(1)",
             "    while i < n:"]
    for k, kind in enumerate(kinds):
        if kind == "c":
            lines.append(f"        x{k} = a{k}")
        elif kind == "f":
            lines.append(f"        x{k} = a{k}[o{k} + i]")
        else:
            lines.append(f"        x{k} = a{k}[o{k} + _off(i, shape, s{k})]")
    call = f"fn({', '.join(f'x{k}' for k in range(len(kinds)))})"
    lines.append(f"        {', '.join(f'r{j}' for j in range(nout))} = {call}")
    for j in range(nout):
        idx = f"oo{j} + i" if out_kind == "f" else f"oo{j} + _off(i, shape, os{j})"
        lines.append(f"        out{j}[{idx}] = r{j}")
    lines.append("        i += step")
    ns = {"cuda": cuda, "fn": FUNCS[fn_name], "_off": _off}
    exec("\n".join(lines), ns)  # noqa: S102 - generated from the fixed template above
    kernel = ns["kernel"]
    kernel.__name__ = f"ew_{fn_name}_{''.join(kinds)}_{out_kind}{nout}"
    return _jit(kernel)


def _ew_kernel(fn_name, kinds, out_kind, nout):
    key = (fn_name, kinds, out_kind, nout)
    k = _EW_CACHE.get(key)
    if k is None:
        k = _EW_CACHE[key] = _build_elementwise(fn_name, kinds, out_kind, nout)
    return k


def _contig(shape) -> tuple:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def _grid(n: int, tpb: int, cap: int) -> int:
    return max(1, min(-(-n // tpb), cap))


def elementwise(fn_name: str, n: int, shape: tuple, outs: list, operands: list) -> None:
    """Run ``outs[j][i] = fn(operands...)[j]`` over ``n`` elements of ``shape``.

    ``outs``: (buffer, offset, strides or None for flat); ``operands``: the same, or
    ``(CONST, value)`` for a scalar. Strided operands are indexed by ``shape``.
    """
    if n == 0:
        return
    kinds = []
    args = [n, shape]
    out_kind = "s" if any(o[2] is not None for o in outs) else "f"
    for buf, off, strides in outs:
        if strides is None and out_kind == "s":
            strides = _contig(shape)
        args += [buf, off, strides if strides is not None else shape]
    for op in operands:
        if op[0] is CONST:
            kinds.append("c")
            args += [op[1], 0, shape]
        else:
            buf, off, strides = op
            kinds.append("f" if strides is None else "s")
            args += [buf, off, strides if strides is not None else shape]
    kernel = _ew_kernel(fn_name, tuple(kinds), out_kind, len(outs))
    launch(kernel, _grid(n, EW_TPB, EW_MAX_BLOCKS), EW_TPB, *args)


# -- reductions: one block per output row, shared-memory tree ------------------------------
_RED_CACHE: dict = {}


def _numba_type(np_dtype):
    if SIM:
        return np.dtype(np_dtype)
    from numba import from_dtype  # pragma: no cover

    return from_dtype(np.dtype(np_dtype))  # pragma: no cover


def _init_value(op: str, dt: np.dtype):
    if op in ("sum", "mean"):
        return dt.type(0)
    if dt.kind == "f":
        return dt.type(-np.inf if op == "max" else np.inf)
    if dt.kind == "b":
        return dt.type(op == "min")
    info = np.iinfo(dt)
    return dt.type(info.min if op == "max" else info.max)


def _combine(op):
    if op in ("sum", "mean"):
        return FUNCS["add"]
    return CUDA_MATH["maximum" if op == "max" else "minimum"]


def _build_reduce(op: str, acc_dtype: np.dtype, mean: bool):
    TPB = RED_TPB
    ACC = _numba_type(acc_dtype)
    INIT = _init_value(op, acc_dtype)
    comb = _combine(op)

    def kernel(out, rows, K, chunk, nsplit, a, ao, kshape, kstr, rshape, rstr, div):
        sm = cuda.shared.array(TPB, ACC)
        t = cuda.threadIdx.x
        split = cuda.blockIdx.y
        start = split * chunk
        stop = min(K, start + chunk)
        row = cuda.blockIdx.x
        while row < rows:
            base = ao + _off(row, kshape, kstr)
            acc = INIT
            k = start + t
            while k < stop:
                acc = comb(acc, a[base + _off(k, rshape, rstr)])
                k += TPB
            sm[t] = acc
            cuda.syncthreads()
            s = TPB // 2
            while s > 0:
                if t < s:
                    sm[t] = comb(sm[t], sm[t + s])
                cuda.syncthreads()
                s //= 2
            if t == 0:
                if mean:
                    out[row * nsplit + split] = sm[0] / div
                else:
                    out[row * nsplit + split] = sm[0]
            cuda.syncthreads()
            row += cuda.gridDim.x

    kernel.__name__ = f"reduce_{op}_{np.dtype(acc_dtype).name}{'_mean' if mean else ''}"
    return _jit(kernel)


def _red_kernel(op, acc_dtype, mean):
    key = (op, np.dtype(acc_dtype), mean)
    k = _RED_CACHE.get(key)
    if k is None:
        k = _RED_CACHE[key] = _build_reduce(op, np.dtype(acc_dtype), mean)
    return k


def reduce_rows(op: str, out, a, ao: int, kshape: tuple, kstr: tuple, rshape: tuple,
                rstr: tuple, rows: int, K: int, alloc) -> None:
    """``out[row] = op over k of a[ao + off(row, kept) + off(k, reduced)]``.

    ``op``: sum | mean | max | min; ``out`` is a flat buffer of ``rows`` elements whose
    dtype is the accumulator's. Long rows with few of them are split over several blocks
    (partials in a temporary from ``alloc``), then reduced by a second launch.
    """
    if rows == 0:
        return
    acc_dtype = out.dtype
    nsplit = 1
    if K >= RED_SPLIT_MIN and rows < RED_MAX_BLOCKS:
        nsplit = max(1, min(-(-K // (RED_TPB * 4)), RED_MAX_BLOCKS // rows, 1024))
        if SIM:
            nsplit = min(nsplit, 2) if K >= RED_SPLIT_MIN else 1
            nsplit = max(nsplit, 2)
    mean = op == "mean"
    if nsplit == 1:
        kernel = _red_kernel(op, acc_dtype, mean)
        launch(kernel, (min(rows, RED_MAX_BLOCKS), 1), RED_TPB, out, rows, K, K, 1, a, ao,
               kshape, kstr, rshape, rstr, acc_dtype.type(K))
        return
    chunk = -(-K // nsplit)
    part = alloc(rows * nsplit, acc_dtype)
    first = _red_kernel("sum" if mean else op, acc_dtype, False)
    launch(first, (min(rows, RED_MAX_BLOCKS), nsplit), RED_TPB, part.data, rows, K, chunk,
           nsplit, a, ao, kshape, kstr, rshape, rstr, acc_dtype.type(1))
    second = _red_kernel("sum" if mean else op, acc_dtype, mean)
    launch(second, (min(rows, RED_MAX_BLOCKS), 1), RED_TPB, out, rows, nsplit, nsplit, 1,
           part.data, 0, (rows,), (nsplit,), (nsplit,), (1,), acc_dtype.type(K))


_ARG_CACHE: dict = {}


def _build_arg_reduce(op: str, dt: np.dtype):
    TPB = RED_TPB
    V = _numba_type(dt)
    I64 = _numba_type(np.int64)
    INIT = _init_value(op, dt)
    is_max = op == "argmax"

    def better(v, i, w, j):
        """Is (w, j) preferred over (v, i)? NaN wins (first NaN), then value, then index."""
        if w != w:
            return v == v or j < i
        if v != v:
            return False
        if is_max:
            return w > v or (w == v and j < i)
        return w < v or (w == v and j < i)

    better_d = _device(better)

    def kernel(out, rows, K, a, ao, kshape, kstr, rshape, rstr):
        vals = cuda.shared.array(TPB, V)
        idxs = cuda.shared.array(TPB, I64)
        t = cuda.threadIdx.x
        row = cuda.blockIdx.x
        while row < rows:
            base = ao + _off(row, kshape, kstr)
            best = INIT
            bi = K
            k = t
            while k < K:
                w = a[base + _off(k, rshape, rstr)]
                if bi == K or better_d(best, bi, w, k):
                    best = w
                    bi = k
                k += TPB
            vals[t] = best
            idxs[t] = bi
            cuda.syncthreads()
            s = TPB // 2
            while s > 0:
                if t < s:
                    j = idxs[t + s]
                    if j != K and (idxs[t] == K or better_d(vals[t], idxs[t], vals[t + s], j)):
                        vals[t] = vals[t + s]
                        idxs[t] = j
                cuda.syncthreads()
                s //= 2
            if t == 0:
                out[row] = idxs[0] if idxs[0] != K else 0
            cuda.syncthreads()
            row += cuda.gridDim.x

    kernel.__name__ = f"{op}_{dt.name}"
    return _jit(kernel)


def arg_reduce_rows(op: str, out, a, ao, kshape, kstr, rshape, rstr, rows, K) -> None:
    """``out[row]`` = index (along the reduced dims, row-major) of the max/min; first wins."""
    if rows == 0:
        return
    dt = np.dtype(a.dtype)
    key = (op, dt)
    kernel = _ARG_CACHE.get(key)
    if kernel is None:
        kernel = _ARG_CACHE[key] = _build_arg_reduce(op, dt)
    launch(kernel, min(rows, RED_MAX_BLOCKS), RED_TPB, out, rows, K, a, ao, kshape, kstr,
           rshape, rstr)


# -- softmax / log_softmax backward: one block per row, sum then write -------------------
_SMB_CACHE: dict = {}


def _build_softmax_rows_backward(dt: np.dtype, log: bool):
    TPB = RED_TPB
    T = _numba_type(dt)
    ZERO = dt.type(0)

    def kernel(out, okst, orr, g, go, gkst, gr, y, yo, ykst, yr, kshape, rows, K):
        sm = cuda.shared.array(TPB, T)
        t = cuda.threadIdx.x
        row = cuda.blockIdx.x
        while row < rows:
            gb = go + _off(row, kshape, gkst)
            yb = yo + _off(row, kshape, ykst)
            ob = _off(row, kshape, okst)
            acc = ZERO
            k = t
            while k < K:  # the same strided pass and tree as reduce_rows' "sum"
                if log:
                    acc = acc + g[gb + k * gr]
                else:
                    acc = acc + g[gb + k * gr] * y[yb + k * yr]
                k += TPB
            sm[t] = acc
            cuda.syncthreads()
            s = TPB // 2
            while s > 0:
                if t < s:
                    sm[t] = sm[t] + sm[t + s]
                cuda.syncthreads()
                s //= 2
            total = sm[0]
            cuda.syncthreads()  # every thread has read the sum before the next row's pass
            k = t
            while k < K:
                gv = g[gb + k * gr]
                yv = y[yb + k * yr]
                if log:
                    out[ob + k * orr] = gv - _exp(yv) * total
                else:
                    out[ob + k * orr] = (gv - total) * yv
                k += TPB
            row += cuda.gridDim.x

    kernel.__name__ = f"{'log_' if log else ''}softmax_rows_backward_{dt.name}"
    return _jit(kernel)


def softmax_rows_backward(log: bool, out, okst, orr, g, go, gkst, gr, y, yo, ykst, yr,
                          kshape, rows, K) -> None:
    """Per row (one block each) of a softmax over one dim: ``s = sum(g * y)`` then
    ``out = (g - s) * y``; with ``log``: ``s = sum(g)`` then ``out = g - exp(y) * s``.

    ``kshape``: the kept dims (rows = their product); ``*kst``: each operand's strides over
    them; ``gr``/``yr``/``orr``: the strides along the softmax dim of length ``K``.
    """
    if rows == 0 or K == 0:
        return
    dt = np.dtype(out.dtype)
    key = (dt, log)
    kernel = _SMB_CACHE.get(key)
    if kernel is None:
        kernel = _SMB_CACHE[key] = _build_softmax_rows_backward(dt, log)
    launch(kernel, min(rows, RED_MAX_BLOCKS), RED_TPB, out, okst, orr, g, go, gkst, gr, y,
           yo, ykst, yr, kshape, rows, K)


# -- scans (cumsum / cumprod) and sorts along one dim ------------------------------------------
#: Rows up to this long are sorted by one block each in shared memory; longer ones by the
#: same network in global memory, one launch per stage (both on the device).
SORT_MAX = 1024
SORT_TPB = 8 if SIM else 512  # at most SORT_MAX // 2: one thread per compared pair
SCAN_TPB = EW_TPB

_SCAN_CACHE: dict = {}
_SORT_CACHE: dict = {}


def _build_scan(dt: np.dtype, prod: bool):
    def kernel(out, okst, orr, a, ao, akst, ar, kshape, rows, K):
        row = cuda.grid(1)
        while row < rows:
            ab = ao + _off(row, kshape, akst)
            ob = _off(row, kshape, okst)
            acc = a[ab]
            out[ob] = acc
            for k in range(1, K):  # in order, as NumPy's accumulate: the same rounding
                if prod:
                    acc = acc * a[ab + k * ar]
                else:
                    acc = acc + a[ab + k * ar]
                out[ob + k * orr] = acc
            row += cuda.gridsize(1)

    kernel.__name__ = f"{'cumprod' if prod else 'cumsum'}_rows_{dt.name}"
    return _jit(kernel)


def scan_rows(prod: bool, out, okst, orr, a, ao, akst, ar, kshape, rows, K) -> None:
    """``out`` = the running sum (or product) of ``a`` along one dim of length ``K``, one
    thread per row; ``*kst``: each operand's strides over the ``kshape`` kept dims (``rows``
    = their product), ``ar``/``orr``: the strides along the scanned dim."""
    if rows == 0 or K == 0:
        return
    dt = np.dtype(out.dtype)
    key = (dt, prod)
    kernel = _SCAN_CACHE.get(key)
    if kernel is None:
        kernel = _SCAN_CACHE[key] = _build_scan(dt, prod)
    launch(kernel, _grid(rows, SCAN_TPB, EW_MAX_BLOCKS), SCAN_TPB, out, okst, orr, a, ao, akst,
           ar, kshape, rows, K)


def _sort_order(descending: bool):
    """The device function ``first(v, i, w, j, K)``: does value v at position i come before
    w at j? Positions >= K are padding (last); NaN is the largest value; equal values keep
    their positions' order, so the order is total and the sort stable."""

    def first(v, i, w, j, K):
        if i >= K:
            return False
        if j >= K:
            return True
        vn = v != v
        wn = w != w
        if vn or wn:
            if vn and wn:
                return i < j
            return vn if descending else wn
        if v == w:
            return i < j
        if descending:
            return v > w
        return v < w

    return _device(first)


def _build_sort(dt: np.dtype, descending: bool):
    V = _numba_type(dt)
    I64 = _numba_type(np.int64)
    N = SORT_MAX
    first_d = _sort_order(descending)

    def kernel(vals, idxs, okst, orr, a, ao, akst, ar, kshape, rows, K, P):
        keys = cuda.shared.array(N, V)
        pos = cuda.shared.array(N, I64)
        t = cuda.threadIdx.x
        nt = cuda.blockDim.x
        row = cuda.blockIdx.x
        while row < rows:
            ab = ao + _off(row, kshape, akst)
            e = t
            while e < P:
                if e < K:
                    keys[e] = a[ab + e * ar]
                pos[e] = e
                e += nt
            cuda.syncthreads()
            # bitonic network over P = 2^m slots, on (value, position) pairs: a total order,
            # so the result is the stable sort whatever the network's pairing
            k = 2
            while k <= P:
                j = k // 2
                while j > 0:
                    e = t
                    while e < P:
                        q = e ^ j
                        if q > e:
                            if (e & k) == 0:
                                swap = first_d(keys[q], pos[q], keys[e], pos[e], K)
                            else:
                                swap = first_d(keys[e], pos[e], keys[q], pos[q], K)
                            if swap:
                                kv = keys[e]
                                keys[e] = keys[q]
                                keys[q] = kv
                                kp = pos[e]
                                pos[e] = pos[q]
                                pos[q] = kp
                        e += nt
                    cuda.syncthreads()
                    j //= 2
                k *= 2
            ob = _off(row, kshape, okst)
            e = t
            while e < K:
                vals[ob + e * orr] = keys[e]
                idxs[ob + e * orr] = pos[e]
                e += nt
            cuda.syncthreads()  # every thread has written before the next row is loaded
            row += cuda.gridDim.x

    kernel.__name__ = f"sort_rows_{dt.name}{'_desc' if descending else ''}"
    return _jit(kernel)


def _build_sort_steps(dt: np.dtype, descending: bool):
    """Rows longer than SORT_MAX: the same bitonic network on (value, position) pairs in a
    padded global scratch (rows x P), one launch per stage (load, each (k, j), store)."""
    first_d = _sort_order(descending)

    def load(keys, pos, a, ao, akst, ar, kshape, rows, K, P):
        i = cuda.grid(1)
        while i < rows * P:
            row = i // P
            e = i - row * P
            if e < K:
                keys[i] = a[ao + _off(row, kshape, akst) + e * ar]
            pos[i] = e
            i += cuda.gridsize(1)

    def step(keys, pos, rows, K, P, k, j):
        i = cuda.grid(1)
        half = P // 2
        while i < rows * half:
            row = i // half
            h = i - row * half
            e = (h // j) * 2 * j + (h - (h // j) * j)  # the pair's lower slot: bit j clear
            q = e + j
            b = row * P
            if (e & k) == 0:
                swap = first_d(keys[b + q], pos[b + q], keys[b + e], pos[b + e], K)
            else:
                swap = first_d(keys[b + e], pos[b + e], keys[b + q], pos[b + q], K)
            if swap:
                kv = keys[b + e]
                keys[b + e] = keys[b + q]
                keys[b + q] = kv
                kp = pos[b + e]
                pos[b + e] = pos[b + q]
                pos[b + q] = kp
            i += cuda.gridsize(1)

    def store(vals, idxs, okst, orr, keys, pos, kshape, rows, K, P):
        i = cuda.grid(1)
        while i < rows * K:
            row = i // K
            e = i - row * K
            o = _off(row, kshape, okst) + e * orr
            vals[o] = keys[row * P + e]
            idxs[o] = pos[row * P + e]
            i += cuda.gridsize(1)

    tag = f"{dt.name}{'_desc' if descending else ''}"
    load.__name__, step.__name__, store.__name__ = (f"sort_load_{tag}", f"sort_step_{tag}",
                                                    f"sort_store_{tag}")
    return _jit(load), _jit(step), _jit(store)


def sort_rows(descending: bool, vals, idxs, okst, orr, a, ao, akst, ar, kshape, rows,
              K, alloc) -> None:
    """Stable sort of each row of ``a`` along one dim of length ``K`` (NaN largest, ties in
    their original order in both directions, as NumPy's stable argsort and torch's
    ``stable=True``): values into ``vals``, int64 positions into ``idxs``. Rows up to
    ``SORT_MAX`` take one block each, a bitonic network in shared memory; longer rows the
    same network in a padded scratch from ``alloc`` (one launch per stage). Strides as
    :func:`scan_rows`."""
    if rows == 0 or K == 0:
        return
    dt = np.dtype(a.dtype)
    P = 1
    while P < K:
        P *= 2
    if K <= SORT_MAX:
        key = (dt, bool(descending))
        kernel = _SORT_CACHE.get(key)
        if kernel is None:
            kernel = _SORT_CACHE[key] = _build_sort(dt, bool(descending))
        launch(kernel, min(rows, RED_MAX_BLOCKS), max(1, min(P // 2, SORT_TPB)), vals, idxs,
               okst, orr, a, ao, akst, ar, kshape, rows, K, P)
        return
    key = ("steps", dt, bool(descending))
    kernels = _SORT_CACHE.get(key)
    if kernels is None:
        kernels = _SORT_CACHE[key] = _build_sort_steps(dt, bool(descending))
    load, step, store = kernels
    keys, pos = alloc(rows * P, dt), alloc(rows * P, np.dtype(np.int64))
    launch(load, _grid(rows * P, EW_TPB, EW_MAX_BLOCKS), EW_TPB, keys.data, pos.data, a, ao,
           akst, ar, kshape, rows, K, P)
    k = 2
    while k <= P:
        j = k // 2
        while j > 0:
            launch(step, _grid(rows * (P // 2), EW_TPB, EW_MAX_BLOCKS), EW_TPB, keys.data,
                   pos.data, rows, K, P, k, j)
            j //= 2
        k *= 2
    launch(store, _grid(rows * K, EW_TPB, EW_MAX_BLOCKS), EW_TPB, vals, idxs, okst, orr,
           keys.data, pos.data, kshape, rows, K, P)


# -- matmul: shared-memory tiles, a register block per thread, batched over grid z ----------
_MM_CACHE: dict = {}


def _build_matmul(dt: np.dtype):
    BM, BN, BK, TM, TN = MM_BM, MM_BN, MM_BK, MM_TM, MM_TN
    NTX, NTY = BN // TN, BM // TM
    NT = NTX * NTY
    T = _numba_type(dt)
    ZERO = dt.type(0)

    def kernel(out, a, ao, asm, ask, b, bo, bsk, bsn, M, N, K, bshape, abst, bbst, z0):
        As = cuda.shared.array((BK, BM), T)
        Bs = cuda.shared.array((BK, BN), T)
        acc = cuda.local.array((TM, TN), T)
        af = cuda.local.array(TM, T)
        bf = cuda.local.array(TN, T)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * NTX + tx
        z = cuda.blockIdx.z + z0
        abase = ao + _off(z, bshape, abst)
        bbase = bo + _off(z, bshape, bbst)
        row0 = cuda.blockIdx.y * BM
        col0 = cuda.blockIdx.x * BN
        for m in range(TM):
            for n in range(TN):
                acc[m, n] = ZERO
        for k0 in range(0, K, BK):
            i = tid
            while i < BM * BK:
                r = i // BK
                c = i - r * BK
                gr = row0 + r
                gc = k0 + c
                if gr < M and gc < K:
                    As[c, r] = a[abase + gr * asm + gc * ask]
                else:
                    As[c, r] = ZERO
                i += NT
            i = tid
            while i < BK * BN:
                r = i // BN
                c = i - r * BN
                gr = k0 + r
                gc = col0 + c
                if gr < K and gc < N:
                    Bs[r, c] = b[bbase + gr * bsk + gc * bsn]
                else:
                    Bs[r, c] = ZERO
                i += NT
            cuda.syncthreads()
            for kk in range(BK):
                for m in range(TM):
                    af[m] = As[kk, ty + m * NTY]
                for n in range(TN):
                    bf[n] = Bs[kk, tx + n * NTX]
                for m in range(TM):
                    for n in range(TN):
                        acc[m, n] += af[m] * bf[n]
            cuda.syncthreads()
        obase = z * M * N
        for m in range(TM):
            r = row0 + ty + m * NTY
            if r < M:
                for n in range(TN):
                    c = col0 + tx + n * NTX
                    if c < N:
                        out[obase + r * N + c] = acc[m, n]

    kernel.__name__ = f"matmul_{dt.name}"
    return _jit(kernel)


def matmul(out, a, ao, asm, ask, b, bo, bsk, bsn, M, N, K, bshape, abst, bbst, nbatch):
    """``out[z, M, N] = a[z] @ b[z]`` for every batch index z (row-major over ``bshape``)."""
    if M == 0 or N == 0 or nbatch == 0:
        return
    dt = np.dtype(out.dtype)
    kernel = _MM_CACHE.get(dt)
    if kernel is None:
        kernel = _MM_CACHE[dt] = _build_matmul(dt)
    gx, gy = -(-N // MM_BN), -(-M // MM_BM)
    block = (MM_BN // MM_TN, MM_BM // MM_TM)
    for z0 in range(0, nbatch, 65535):
        gz = min(65535, nbatch - z0)
        launch(kernel, (gx, gy, gz), block, out, a, ao, asm, ask, b, bo, bsk, bsn, M, N, K,
               bshape, abst, bbst, z0)


# -- gather / scatter (advanced indexing) ----------------------------------------------------
_GS_CACHE: dict = {}


def _build_index_kernel(nidx: int, mode: str):
    """mode: gather | put | add (atomic scatter-add)."""
    params = ["n", "oshape", "dst", "do", "ds", "src", "so", "ss", "err"]
    for k in range(nidx):
        params += [f"ix{k}", f"io{k}", f"is{k}", f"dim{k}", f"st{k}"]
    lines = [f"def kernel({', '.join(params)}):",
             "    i = cuda.grid(1)",
             "    step = cuda.gridsize(1)",
             "    while i < n:",
             # the indexed operand's offset from the non-indexed dims of the result
             "        p = " + ("so + _off(i, oshape, ss)" if mode == "gather"
                               else "do + _off(i, oshape, ds)")]
    for k in range(nidx):
        lines += [f"        j = ix{k}[io{k} + _off(i, oshape, is{k})]",
                  "        if j < 0:",
                  f"            j += dim{k}",
                  f"        if j < 0 or j >= dim{k}:",
                  "            err[0] = 1",
                  "            j = 0",
                  f"        p += j * st{k}"]
    if mode == "gather":
        lines.append("        dst[do + i] = src[p]")
    elif mode == "put":
        lines.append("        dst[p] = src[so + _off(i, oshape, ss)]")
    else:
        lines.append("        cuda.atomic.add(dst, p, src[so + _off(i, oshape, ss)])")
    lines.append("        i += step")
    ns = {"cuda": cuda, "_off": _off}
    exec("\n".join(lines), ns)  # noqa: S102 - generated from the fixed template above
    kernel = ns["kernel"]
    kernel.__name__ = f"{mode}_{nidx}"
    return _jit(kernel)


def _index_kernel(nidx, mode):
    key = (nidx, mode)
    k = _GS_CACHE.get(key)
    if k is None:
        k = _GS_CACHE[key] = _build_index_kernel(nidx, mode)
    return k


def gather(n, oshape, dst, do, src, so, ss, indices, err) -> None:
    """``dst[do + i] = src[so + off(i, ss) + sum_k index_k(i) * stride_k]``.

    ``indices``: (buffer, offset, strides over ``oshape``, dim size, src stride) each.
    Out-of-range indices read element 0 and raise the error flag (checked at sync).
    """
    if n == 0:
        return
    args = [n, oshape, dst, do, oshape, src, so, ss, err]
    for buf, off, strides, size, stride in indices:
        args += [buf, off, strides, size, stride]
    launch(_index_kernel(len(indices), "gather"), _grid(n, EW_TPB, EW_MAX_BLOCKS), EW_TPB,
           *args)


def scatter(n, oshape, dst, do, ds, src, so, ss, indices, err, accumulate: bool) -> None:
    """``dst[p(i)] = src[i]`` (or ``+=`` atomically) for the positions the indices name."""
    if n == 0:
        return
    args = [n, oshape, dst, do, ds, src, so, ss, err]
    for buf, off, strides, size, stride in indices:
        args += [buf, off, strides, size, stride]
    mode = "add" if accumulate else "put"
    launch(_index_kernel(len(indices), mode), _grid(n, EW_TPB, EW_MAX_BLOCKS), EW_TPB, *args)


# -- convolution: im2col / col2im of 2-D planes (a conv1d is a conv2d of height 1) ----------
_CONV_CACHE: dict = {}


def _build_conv(dt: np.dtype, adjoint: bool):
    """im2col: one thread per column element ``(plane, kh, kw, oh, ow)`` reads its input
    element (0 in the padding) from a strided ``(N, C, H, W)`` view. col2im (its adjoint):
    one thread per input element sums the column elements that read it, taps in order, so
    no atomics and the sum order does not depend on the launch."""
    ZERO = dt.type(0)

    def im2col(out, x, xo, C, sn, sc, sh_, sw_, n, H, W, KH, KW, OH, OW, sh, sw, ph, pw,
               dh, dw):
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < n:
            ow = i % OW
            t = i // OW
            oh = t % OH
            t = t // OH
            kw = t % KW
            t = t // KW
            kh = t % KH
            pl = t // KH
            ih = oh * sh + kh * dh - ph
            iw = ow * sw + kw * dw - pw
            if ih >= 0 and ih < H and iw >= 0 and iw < W:
                out[i] = x[xo + (pl // C) * sn + (pl % C) * sc + ih * sh_ + iw * sw_]
            else:
                out[i] = ZERO
            i += step

    def col2im(dx, cols, n, H, W, KH, KW, OH, OW, sh, sw, ph, pw, dh, dw):
        i = cuda.grid(1)
        step = cuda.gridsize(1)
        while i < n:
            iw = i % W
            t = i // W
            ih = t % H
            pl = t // H
            acc = ZERO
            for kh in range(KH):
                th = ih + ph - kh * dh
                if th >= 0 and th % sh == 0 and th // sh < OH:
                    oh = th // sh
                    for kw in range(KW):
                        tw = iw + pw - kw * dw
                        if tw >= 0 and tw % sw == 0 and tw // sw < OW:
                            acc += cols[(((pl * KH + kh) * KW + kw) * OH + oh) * OW + tw // sw]
            dx[i] = acc
            i += step

    kernel = col2im if adjoint else im2col
    kernel.__name__ = f"conv_{kernel.__name__}_{dt.name}"
    return _jit(kernel)


def _conv_kernel(dt, adjoint: bool):
    key = (np.dtype(dt), adjoint)
    k = _CONV_CACHE.get(key)
    if k is None:
        k = _CONV_CACHE[key] = _build_conv(key[0], adjoint)
    return k


def conv_im2col(out, x, xo, xstrides, C, planes: tuple, geo: tuple) -> None:
    """``out`` (N*C, KH, KW, OH, OW) contiguous from the (N, C, H, W) view ``x`` at element
    offset ``xo`` with element strides ``xstrides``; ``planes`` (H, W, KH, KW, OH, OW),
    ``geo`` (sh, sw, ph, pw, dh, dw)."""
    n = out.size
    if n == 0:
        return
    launch(_conv_kernel(out.dtype, False), _grid(n, EW_TPB, EW_MAX_BLOCKS), EW_TPB, out, x,
           xo, C, *xstrides, n, *planes, *geo)


def conv_col2im(dx, cols, planes: tuple, geo: tuple) -> None:
    """``dx`` (N*C, H, W) contiguous: the adjoint of conv_im2col applied to ``cols``."""
    n = dx.size
    if n == 0:
        return
    launch(_conv_kernel(dx.dtype, True), _grid(n, EW_TPB, EW_MAX_BLOCKS), EW_TPB, dx, cols,
           n, *planes, *geo)


# -- creation: arange, random ------------------------------------------------------------
def _arange_kernel(out, n, start, step):
    i = cuda.grid(1)
    s = cuda.gridsize(1)
    while i < n:
        out[i] = start + i * step
        i += s


_ARANGE = None


def arange(out, n, start, step) -> None:
    global _ARANGE
    if n == 0:
        return
    if _ARANGE is None:
        _ARANGE = _jit(_arange_kernel)
    launch(_ARANGE, _grid(n, EW_TPB, EW_MAX_BLOCKS), EW_TPB, out, n, start, step)


MASK32 = 0xFFFFFFFF


@_device
def _mul32(x, c):
    """(x * c) mod 2**32 for 32-bit x, c without overflowing int64 (exact in Python too)."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & 0xFFFFFFFF


@_device
def _hash32(x):
    """A 32-bit integer mixer (lowbias32): counter -> well-spread bits."""
    x = x & 0xFFFFFFFF
    x ^= x >> 16
    x = _mul32(x, 0x7FEB352D)
    x ^= x >> 15
    x = _mul32(x, 0x846CA68B)
    x ^= x >> 16
    return x


def _random_kernel(out, n, s0, s1, offset, normal, wide):
    """Counter-based generator: element i draws from hash(seed, offset + i); no state."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < n:
        c = offset + i
        h1 = _hash32((c & 0xFFFFFFFF) ^ _hash32(s0 ^ _hash32((c >> 32) ^ s1)))
        h2 = _hash32(h1 ^ 0x9E3779B9)
        if normal:
            u1 = (h1 + 1.0) / 4294967296.0
            u2 = h2 / 4294967296.0
            out[i] = _sqrt(-2.0 * _log(u1)) * _cos(6.283185307179586 * u2)
        elif wide:
            out[i] = ((h1 >> 5) * 67108864.0 + (h2 >> 6)) / 9007199254740992.0
        else:
            out[i] = (h1 >> 8) / 16777216.0
        i += step


_RANDOM = None


def random(out, n, seed: int, offset: int, normal: bool) -> None:
    """Uniform [0, 1) or standard normal numbers into a flat float buffer."""
    global _RANDOM
    if n == 0:
        return
    if _RANDOM is None:
        _RANDOM = _jit(_random_kernel)
    wide = np.dtype(out.dtype).itemsize == 8
    launch(_RANDOM, _grid(n, EW_TPB, EW_MAX_BLOCKS), EW_TPB, out, n, seed & MASK32,
           (seed >> 32) & MASK32, offset, normal, wide)


_ERR = None


def error_flag():
    """A one-element device int32 array that indexing kernels set on an out-of-range index."""
    global _ERR
    if _ERR is None:
        err = cuda.device_array(1, np.int32)
        elementwise("identity", 1, (1,), [(err, 0, None)], [(CONST, np.int32(0))])
        _ERR = err
    return _ERR
