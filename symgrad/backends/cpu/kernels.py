"""Numba kernels of the CPU backend, compiled lazily and cached on disk.

This module is imported on the first kernel call (importing Numba costs ~0.3 s), never by
``import symgrad``. Every kernel works on flat, C-contiguous, same-length 1-D arrays; the
Python side (``backend.py``) checks shapes, dtypes and contiguity before calling, so a
kernel can never index out of bounds. Each loop body is written once with ``prange``; the
serial twin runs it as a plain ``range`` (small arrays), the parallel twin splits it over
the threads (large arrays). The unary elementwise loops are generated from the op stanzas'
scalar expressions (``_generated``), calling the helpers of ``rules.py`` jitted, so the
size-1 path in Python and the kernels share one formula.

Threading layer: ``workqueue`` (see ``_threading``); it ships with Numba on every platform
and survives ``fork``. It is not thread-safe, so parallel launches are serialised by one
lock in ``backend.py`` (they use every core anyway); serial kernels run with ``nogil``
from any number of Python threads at once.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import types

from ..._codefiles import (
    guard_numba_cache,
    import_text,
    private_dir,
    process_dir,
    seal_numba_dir,
    warn_once,
    writable,
)

__all__ = ["THREADING_LAYER", "twin"]


def _cache_dir_fallback() -> None:
    """Numba caches next to this file; where that is read-only, in a private user cache dir
    (0700, this user's: symgrad/_codefiles.py's ``private_dir``), else in this process's
    own temporary dir: never a shared, predictable path. The files in a directory chosen
    here are sealed and checked before Numba unpickles them (``SYMGRAD_NUMBA_SEALED``
    tells child processes, which inherit ``NUMBA_CACHE_DIR``, to do the same)."""
    chosen = os.environ.get("NUMBA_CACHE_DIR")
    if chosen:
        if os.environ.get("SYMGRAD_NUMBA_SEALED") == chosen:
            seal_numba_dir(chosen)
        return
    here = os.path.dirname(os.path.abspath(__file__))
    if writable(os.path.join(here, "__pycache__")):
        return
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    cand = os.path.join(base, "symgrad", "numba")
    why = private_dir(cand)
    if why is not None:
        warn_once(("no cache", cand), f"symgrad: no disk cache for compiled kernels "
                  f"({cand}: {why}); they are kept for this process only")
        cand = process_dir("numba")
    seal_numba_dir(cand)
    os.environ["NUMBA_CACHE_DIR"] = os.environ["SYMGRAD_NUMBA_SEALED"] = cand


def _threading() -> str:
    """Pick the threading layer before Numba launches its first parallel region.

    ``tbb`` (thread- and fork-safe) needs the separate tbb package, ``omp`` (GNU OpenMP)
    aborts a forked child that runs a parallel kernel, and ``workqueue`` is fork-safe and
    always present: we choose it and add a lock for thread safety. A user's explicit
    ``NUMBA_THREADING_LAYER`` wins.
    """
    chosen = os.environ.get("NUMBA_THREADING_LAYER", "").strip() or "workqueue"
    numba.config.THREADING_LAYER = chosen
    return chosen


_cache_dir_fallback()
import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

from ...ops import OPS  # noqa: E402
from ...ops.elementwise import (  # noqa: E402
    fused_from_stanza,
    grad_mask_args,
    grad_mask_name,
    grad_masks,
    scalar_kernels,
)
from ...ops.scalar import source  # noqa: E402
from . import rules  # noqa: E402

if os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
guard_numba_cache()  # before the first cached kernel loads
THREADING_LAYER = _threading()

# fastmath stays off: results must match the NumPy reference and torch bit-for-bit where
# the math allows (fastmath gains nothing on these memory-bound loops, PERF-BASELINES B2).
# error_model="numpy": 1/0 gives inf as in NumPy and torch, instead of raising.
_OPTS = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")
_scalar = njit(inline="always", **_OPTS)


def twin(fn, opts=None):
    """(serial, parallel) dispatchers of one loop body; distinct names keep caches apart."""
    opts = opts or _OPTS
    par = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_par",
                             fn.__defaults__, fn.__closure__)
    par.__qualname__ = fn.__qualname__ + "_par"
    par.__module__ = fn.__module__
    return njit(**opts)(fn), njit(parallel=True, **opts)(par)


# -- progress line for long first compiles --------------------------------------------------
class _CompileNotice(numba.core.event.Listener):
    """One progress line (tqdm, on stderr) while Numba compiles kernels on first use, once
    a compile takes longer than ``delay``: it counts the kernels of the burst and names the
    one compiling, and closes when no compile followed for ``idle`` seconds. (A line per
    kernel was a screenful of red stderr in a notebook's first cells.)"""

    delay = float(os.environ.get("SYMGRAD_COMPILE_NOTICE_S", "1.0"))
    idle = 0.5
    desc = "symgrad: compiling Numba kernels (first use only; cached on disk afterwards)"

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._bar = None  # the burst's progress line, once shown
        self._closer: threading.Timer | None = None
        self._active = 0  # top-level compiles running now (any thread)

    def on_start(self, event) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth:
            return
        disp = event.data.get("dispatcher")
        name = getattr(getattr(disp, "py_func", None), "__name__", "kernel")
        self._local.timer = None
        with self._lock:
            self._active += 1
            if self._closer is not None:
                self._closer.cancel()
                self._closer = None
            if self._bar is not None:  # the burst goes on: the same line
                self._bar.set_postfix_str(name)
                return
        timer = threading.Timer(self.delay, self._open, (name,))
        timer.daemon = True
        timer.start()
        self._local.timer = timer

    def _open(self, name: str) -> None:
        with self._lock:
            if self._bar is None and self._active:  # still compiling
                self._bar = _progress_line(self.desc)
                self._bar.set_postfix_str(name)

    def on_end(self, event) -> None:
        self._local.depth -= 1
        if self._local.depth:
            return
        if self._local.timer is not None:
            self._local.timer.cancel()
        with self._lock:
            self._active -= 1
            if self._bar is None:
                return
            self._bar.update(1)
            closer = self._closer = threading.Timer(self.idle, self.close)
            closer.daemon = True
            closer.start()

    def close(self) -> None:
        """End the burst's line (after ``idle`` seconds without a compile)."""
        with self._lock:
            bar, self._bar = self._bar, None
            if self._closer is not None:
                self._closer.cancel()
                self._closer = None
        if bar is not None:
            bar.close()


def _progress_line(desc: str):
    from tqdm import tqdm

    return tqdm(desc=desc, unit=" kernel", file=sys.stderr, mininterval=0.2, leave=True,
                bar_format="{desc}: {n_fmt} done [{elapsed}]{postfix}")


_NOTICE = _CompileNotice()
numba.core.event.register("numba:compile", _NOTICE)


# -- libm note --------------------------------------------------------------------------------
# Numba's llvmlite here has no SVML, so sin/cos/exp/log/tanh in a Numba loop are scalar libm
# calls, ~5x slower per element than NumPy's SIMD ufuncs (measured: cos on 16k float32,
# 77 µs vs 16 µs). Kernels therefore exist only for memory-bound work (arithmetic, selects,
# copies, reductions), where one fused pass and all cores win; transcendentals stay NumPy.

# -- forward kernels: the elementwise ones are generated from the op stanzas (below) -------
def outer_f(a, b, out):
    """out[i, j] = a[i] * b[j] over flat arrays (a matmul with inner size 1)."""
    m = b.size
    for i in prange(a.size):
        ai = a[i]
        for j in range(m):
            out[i * m + j] = ai * b[j]


def add_scaled_f(dst, src, alpha):
    """dst += alpha * src in place, one pass (torch's ``add_(other, alpha=)``: SGD's step)."""
    for i in prange(dst.size):
        dst[i] += alpha * src[i]


# -- reductions ------------------------------------------------------------------------------
def sum_f(x):
    """Total of a flat array, accumulated in float64 (more accurate than float32 pairwise)."""
    acc = 0.0
    for i in prange(x.size):
        acc += x[i]
    return acc


def sum_rows_f(x, out):
    """Column sums of a C-contiguous (n, m) array: the broadcast-gradient reduction of a bias."""
    n, m = x.shape
    acc = np.zeros(m, dtype=np.float64)
    for i in range(n):
        for j in range(m):
            acc[j] += x[i, j]
    for j in range(m):
        out[j] = acc[j]


def sum_last_f(x, out):
    """Row sums of a C-contiguous (n, m) array (sum over the last dim)."""
    n, m = x.shape
    for i in prange(n):
        acc = 0.0
        for j in range(m):
            acc += x[i, j]
        out[i] = acc


# -- softmax / log_softmax / logsumexp over the last dim of a C-contiguous (n, m) array ----------
def softmax_rows(x, out):
    n, m = x.shape
    for i in prange(n):
        mx = -np.inf
        for j in range(m):
            if x[i, j] > mx or x[i, j] != x[i, j]:
                mx = x[i, j]
        if mx == -np.inf:
            mx = 0.0
        s = 0.0
        for j in range(m):
            e = math.exp(x[i, j] - mx)
            out[i, j] = e
            s += e
        for j in range(m):
            out[i, j] = out[i, j] / s


def softmax_shift_rows(x, out, dead):
    """Softmax, part 1, per row of a C-contiguous (n, m) array: out = x - max(x) (NumPy's
    SIMD exp then runs in place); dead[i] marks a row that is all -inf (safe softmax)."""
    n, m = x.shape
    for i in prange(n):
        mx = x[i, 0]
        for j in range(1, m):
            if x[i, j] > mx or x[i, j] != x[i, j]:
                mx = x[i, j]
        dead[i] = mx == -np.inf
        for j in range(m):
            out[i, j] = x[i, j] - mx


def softmax_norm_rows(e, dead, safe, s):
    """Softmax, part 2: e /= sum(e) per row (the sum rounded to e's dtype, as the op
    divides by it); a dead row of a safe softmax becomes zeros."""
    n, m = e.shape
    for i in prange(n):
        if safe and dead[i]:
            for j in range(m):
                e[i, j] = 0
            continue
        acc = 0.0
        for j in range(m):
            acc += e[i, j]
        s[i] = acc
        t = s[i]
        for j in range(m):
            e[i, j] = e[i, j] / t


def log_softmax_rows(x, out):
    n, m = x.shape
    for i in prange(n):
        mx = -np.inf
        for j in range(m):
            if x[i, j] > mx or x[i, j] != x[i, j]:
                mx = x[i, j]
        if mx == -np.inf:
            mx = 0.0
        s = 0.0
        for j in range(m):
            s += math.exp(x[i, j] - mx)
        lse = mx + math.log(s)
        for j in range(m):
            out[i, j] = x[i, j] - lse


def logsumexp_rows(x, out):
    n, m = x.shape
    for i in prange(n):
        mx = -np.inf
        for j in range(m):
            if x[i, j] > mx or x[i, j] != x[i, j]:
                mx = x[i, j]
        if mx == -np.inf or mx == np.inf:
            out[i] = mx
            continue
        s = 0.0
        for j in range(m):
            s += math.exp(x[i, j] - mx)
        out[i] = mx + math.log(s)


def softmax_rows_b(g, y, out):
    """grad of softmax: y * (g - sum(g*y)) per row."""
    n, m = g.shape
    for i in prange(n):
        s = 0.0
        for j in range(m):
            s += g[i, j] * y[i, j]
        for j in range(m):
            out[i, j] = y[i, j] * (g[i, j] - s)


def log_softmax_rows_b(g, y, out):
    """grad of log_softmax: g - exp(y) * sum(g) per row."""
    n, m = g.shape
    for i in prange(n):
        s = 0.0
        for j in range(m):
            s += g[i, j]
        for j in range(m):
            out[i, j] = g[i, j] - math.exp(y[i, j]) * s


# -- gather / scatter-add along dim 0 (integer-array indexing of the first dim) ------------------
def take_rows(x, idx, out):
    """out[k] = x[idx[k]] for a C-contiguous (n, m) x; idx already checked and wrapped."""
    m = x.shape[1]
    for k in prange(idx.size):
        r = idx[k]
        for j in range(m):
            out[k, j] = x[r, j]


def scatter_add_rows(g, idx, out):
    """out[idx[k]] += g[k] (serial: repeated indices must add up exactly once each)."""
    m = g.shape[1]
    for k in range(idx.size):
        r = idx[k]
        for j in range(m):
            out[r, j] += g[k, j]


def copy_f(x, out):
    for i in prange(x.size):
        out[i] = x[i]


# -- convolution: im2col / col2im of 2-D planes (conv1d runs as a conv2d of height 1) -----------
# Indices stay provably in range without Numba's negative-index wraparound: a row is copied
# by the plain loop only when all of it lies inside the input, else element by element with
# explicit bounds (an index that *may* be negative costs 5x here: no vectorised copy).
def conv_im2col(x, out, sh, sw, ph, pw, dh, dw):
    """out[p, kh, kw, oh, ow] = x[p, oh*sh + kh*dh - ph, ow*sw + kw*dw - pw], 0 outside;
    x (planes, H, W), out (planes, KH, KW, OH, OW), planes = N * C."""
    planes, h_, w_ = x.shape
    _, kh_, kw_, oh_, ow_ = out.shape
    for pl in prange(planes):
        for kh in range(kh_):
            for kw in range(kw_):
                off = kw * dw - pw
                for oh in range(oh_):
                    ih = oh * sh + kh * dh - ph
                    if ih < 0 or ih >= h_:
                        for ow in range(ow_):
                            out[pl, kh, kw, oh, ow] = 0
                        continue
                    if off >= 0 and (ow_ - 1) * sw + off < w_:  # the whole row inside
                        if sw == 1:
                            for ow in range(ow_):
                                out[pl, kh, kw, oh, ow] = x[pl, ih, ow + off]
                        else:
                            for ow in range(ow_):
                                out[pl, kh, kw, oh, ow] = x[pl, ih, ow * sw + off]
                    else:
                        for ow in range(ow_):
                            iw = ow * sw + off
                            if iw >= 0 and iw < w_:
                                out[pl, kh, kw, oh, ow] = x[pl, ih, iw]
                            else:
                                out[pl, kh, kw, oh, ow] = 0


def conv_col2im(cols, dx, sh, sw, ph, pw, dh, dw):
    """The adjoint of conv_im2col: dx = 0, then dx[p, ih, iw] += cols[p, kh, kw, oh, ow].
    Each plane is one thread's (no two threads add into one element); within a plane the
    taps add in a fixed order, so results do not depend on the thread count."""
    planes, h_, w_ = dx.shape
    _, kh_, kw_, oh_, ow_ = cols.shape
    for pl in prange(planes):
        for i in range(h_):
            for j in range(w_):
                dx[pl, i, j] = 0
        for kh in range(kh_):
            for kw in range(kw_):
                off = kw * dw - pw
                for oh in range(oh_):
                    ih = oh * sh + kh * dh - ph
                    if ih < 0 or ih >= h_:
                        continue
                    if off >= 0 and (ow_ - 1) * sw + off < w_:
                        if sw == 1:
                            for ow in range(ow_):
                                dx[pl, ih, ow + off] += cols[pl, kh, kw, oh, ow]
                        else:
                            for ow in range(ow_):
                                dx[pl, ih, ow * sw + off] += cols[pl, kh, kw, oh, ow]
                    else:
                        for ow in range(ow_):
                            iw = ow * sw + off
                            if iw >= 0 and iw < w_:
                                dx[pl, ih, iw] += cols[pl, kh, kw, oh, ow]


# Stride 1 without padding: the "wide" columns run over the positions q = oh * W + ow of the
# input's full width (q < (OH - 1) * W + OW; the columns with ow >= OW are not outputs), so
# each tap's columns are ONE contiguous run of the input plane: long copies and adds that
# vectorise, instead of rows of OW elements (8 in LeNet's conv2).
def conv_im2col_wide(x, out, w_, ow_, dh, dw, clean):
    """out[p, kh, kw, q] = x[p, kh*dh*W + kw*dw + q] for q < P; with ``clean`` the columns
    q % W >= OW (not outputs) are zeroed. x (planes, H*W), out (planes, KH, KW, P), P =
    (OH-1)*W + OW, (KH-1)*dh*W + (KW-1)*dw + P == H*W checked by the caller."""
    planes = x.shape[0]
    _, kh_, kw_, pp = out.shape
    for pl in prange(planes):
        for kh in range(kh_):
            for kw in range(kw_):
                base = kh * dh * w_ + kw * dw
                if base < 0:  # never (dh, dw >= 1): tells LLVM the indices are not negative
                    continue
                for q in range(pp):
                    out[pl, kh, kw, q] = x[pl, base + q]
                if clean:
                    for r in range(ow_, pp, w_):
                        for q in range(r, r + w_ - ow_):
                            out[pl, kh, kw, q] = 0


def conv_col2im_wide(cols, dx, w_, dh, dw):
    """The adjoint of conv_im2col_wide (without ``clean``): dx = 0, then dx[p, kh*dh*W +
    kw*dw + q] += cols[p, kh, kw, q], taps in conv_col2im's order, a plane per thread."""
    planes, hw = dx.shape
    _, kh_, kw_, pp = cols.shape
    for pl in prange(planes):
        for i in range(hw):
            dx[pl, i] = 0
        for kh in range(kh_):
            for kw in range(kw_):
                base = kh * dh * w_ + kw * dw
                if base < 0:  # never (as above)
                    continue
                for q in range(pp):
                    dx[pl, base + q] += cols[pl, kh, kw, q]


def conv_wide_out(res, b, has_b, out):
    """out[n, o, oh, ow] = res[n, o, oh*W + ow] (+ b[o]): the outputs out of the wide
    product (m, O, P); W = (P - OW) / (OH - 1) is passed as out's row pitch ``w_``."""
    m, o_, oh_, ow_ = out.shape
    w_ = (res.shape[2] - ow_) // (oh_ - 1) if oh_ > 1 else ow_
    for n in prange(m):
        for o in range(o_):
            for oh in range(oh_):
                r = oh * w_
                if r < 0:  # never: tells LLVM the indices are not negative
                    continue
                if has_b:
                    for ow in range(ow_):
                        out[n, o, oh, ow] = res[n, o, r + ow] + b[o]
                else:
                    for ow in range(ow_):
                        out[n, o, oh, ow] = res[n, o, r + ow]


def conv_wide_in(g, wide):
    """wide[n, o, oh*W + ow] = g[n, o, oh, ow], and 0 at the columns that are no outputs
    (ow >= OW): the gradient in the wide products' layout."""
    m, o_, oh_, ow_ = g.shape
    pp = wide.shape[2]
    w_ = (pp - ow_) // (oh_ - 1) if oh_ > 1 else ow_
    for n in prange(m):
        for o in range(o_):
            for oh in range(oh_):
                r = oh * w_
                if r < 0:  # never
                    continue
                for ow in range(ow_):
                    wide[n, o, r + ow] = g[n, o, oh, ow]
                for q in range(r + ow_, min(r + w_, pp)):
                    wide[n, o, q] = 0


_WIDE = [conv_im2col_wide, conv_col2im_wide, conv_wide_out, conv_wide_in]


# -- max pooling: each window's first maximum (NaN first, as argmax) ----------------------------
def max_pool_taps(x, plane, out, idx):
    """x (planes, hw); plane (n_out, taps): the in-plane offsets of each window's taps, the
    same for every plane (a few KiB, read from cache), checked in [0, hw); out/idx (planes,
    n_out): each window's value and in-plane index of its first maximum (a NaN wins at
    once: NumPy's argmax)."""
    planes = x.shape[0]
    n_out = out.shape[1]
    k = plane.shape[1]
    for p in prange(planes):
        for o in range(n_out):
            best = plane[o, 0]
            v = x[p, best]
            for t in range(1, k):
                if v != v:
                    break
                off = plane[o, t]
                u = x[p, off]
                if u > v or u != u:
                    v = u
                    best = off
            out[p, o] = v
            idx[p, o] = best


def max_pool_scatter(g, idx, dx):
    """max pooling's backward: dx = 0, then dx[p, idx[p, o]] += g[p, o] in output order (a
    plane per thread; indices checked in [0, hw))."""
    planes, n_out = g.shape
    hw = dx.shape[1]
    for p in prange(planes):
        for i in range(hw):
            dx[p, i] = 0
        for o in range(n_out):
            dx[p, idx[p, o]] += g[p, o]


# -- layer norm over the last dim of a C-contiguous (n, m) array --------------------------------
# The op's elementwise steps in the array's dtype (x - mean, (x - mean) * rstd, * w, + b,
# 1 / sqrt(var + eps)), its means summed in float64 and rounded once (NumPy sums float32 in
# float32): a store into the float32 output casts, and the stored value is read back.
# The row sums are float64 reductions compiled with ``reassoc`` alone (so they vectorise: a
# strict sum is one add after another); the float32 steps around them keep their order.
# Rows are indexed ``x[i, j]``, never sliced as ``x[i]``: a row view in a Numba loop costs a
# reference count up and down (atomics) per row, 25% of the backward on 256 rows of 64.
# The backward recomputes (x - mean) * rstd and g * w where it needs them (the same float32
# operations, so the same values) instead of keeping them in row buffers.
_REASSOC = dict(_OPTS, fastmath={"reassoc"})


@njit(**_REASSOC)
def _row_sum(x, i):
    acc = 0.0
    for j in range(x.shape[1]):
        acc += x[i, j]
    return acc


@njit(**_REASSOC)
def _row_dev(x, i, mu, y):
    """y[i] = x[i] - mu; returns the float64 sum of the squares (each rounded to the dtype)."""
    acc = 0.0
    for j in range(x.shape[1]):
        d = x[i, j] - mu
        y[i, j] = d
        acc += d * d
    return acc


@njit(**_REASSOC)
def _row_b(x, g, i, w, has_w, mu, r):
    """sum(g * w) and sum(g * w * xhat) of row i (g alone without a weight), xhat =
    (x - mean) * rstd."""
    a1 = 0.0
    a2 = 0.0
    for j in range(x.shape[1]):
        h = (x[i, j] - mu) * r
        gj = g[i, j] * w[j] if has_w else g[i, j]
        a1 += gj
        a2 += gj * h
    return a1, a2


def layer_norm_rows(x, w, b, has_w, has_b, nf, eps, one, y, mean, rstd):
    """y = (x - mean) * rstd [* w] [+ b] per row; mean, rstd = 1 / sqrt(var + eps) out."""
    n, m = x.shape
    for i in prange(n):
        mean[i] = _row_sum(x, i)
        mu = mean[i] / nf
        mean[i] = mu
        rstd[i] = _row_dev(x, i, mu, y)
        v = rstd[i] / nf + eps
        rstd[i] = one / np.sqrt(v)
        r = rstd[i]
        if has_w and has_b:
            for j in range(m):
                y[i, j] = y[i, j] * r * w[j] + b[j]
        else:
            for j in range(m):
                t = y[i, j] * r
                if has_w:
                    t = t * w[j]
                if has_b:
                    t = t + b[j]
                y[i, j] = t


def layer_norm_rows_b(g, x, mean, rstd, w, has_w, nf, need_dx, dx, need_wb, gw, gb, tmp):
    """NativeLayerNormBackward0 per row: dx = rstd * ((g*w - mean(g*w)) - xhat *
    mean(g*w * xhat)), xhat = (x - mean) * rstd; gw += g * xhat and gb += g over the rows
    (float64 sums; serial: rows add into one gw). ``tmp`` (2 elements of the dtype) rounds
    the row sums to it."""
    n, m = x.shape
    for i in range(n):
        r = rstd[i]
        mu = mean[i]
        if need_wb:
            for j in range(m):
                gw[j] += g[i, j] * ((x[i, j] - mu) * r)
                gb[j] += g[i, j]
        if need_dx:
            a1, a2 = _row_b(x, g, i, w, has_w, mu, r)
            tmp[0] = a1
            tmp[1] = a2
            mg = tmp[0] / nf
            mgx = tmp[1] / nf
            if has_w:
                for j in range(m):
                    dx[i, j] = r * ((g[i, j] * w[j] - mg) - ((x[i, j] - mu) * r) * mgx)
            else:
                for j in range(m):
                    dx[i, j] = r * ((g[i, j] - mg) - ((x[i, j] - mu) * r) * mgx)


# -- exact GELU on float32 (erf without libm) ---------------------------------------------------
# The stanza's float32 arithmetic (x / 2 * (1 + erf(x * sqrt(2)/2)), erf rounded to float32)
# with erf from straight-line polynomials in float64: the loops vectorise (glibc's erf through
# Numba is a scalar call costing ~30 ns an element: a GPT step spent most of its time there).
# Rounded to float32 the result is the C library's erf rounded to float32, for every float32
# argument: each polynomial is within 2.1e-14 (relative) of erf, and where that leaves the
# float32 rounding in doubt (the float64 value within 2^-43 of a float32 rounding boundary:
# ``erf_near``, about 1 argument in 260,000) the C library's erf decides. Checked on all
# 4.3e9 float32 arguments, with and without FMA contraction, by benchmarks/erf_exhaustive.py
# (which also refits the polynomials); the earlier two-polynomial erf (1e-13 from erf, no
# fallback) rounded 8 of them the other way.
# The loops take their arguments in groups of ``ERF_GROUP``: a group within |t| < 1 or
# |t| < 2 evaluates that range's polynomial only (degree 9 or 14 in t * t), another one the
# |t| < 2 polynomial and the tail's (degree 17) and selects lane by lane (a vectorised select
# pays for both sides; SIMD gathers from a table, the other way to one piecewise polynomial,
# are slower still here). GELU's arguments are mostly small: on 65,536 float32 (one thread,
# loaded 2-vCPU Cascade Lake) gelu_f32 went from 146 to 69 µs for x ~ N(0, 0.16^2) (the GPT
# benchmark's) and from 144 to 126 µs for N(0, 1); for N(0, 9) most groups need both
# polynomials and it takes about its old time (152 against 149 µs). Groups of 128 did
# better on N(0, 1) (1.2x) but worse on N(0, 9) (0.93x): the choice costs per group.
# The kernels that evaluate it may contract its polynomials into FMAs (``_CONTRACT``); they do
# no other float32 multiply-add, so the stanza's float32 roundings stay as they are.
def erf_small(t):
    """erf(t) for |t| < 1 in float64: t * a(t * t), relative error below 2.1e-14 (a Chebyshev
    interpolant of erf(t) / t in t * t; even and odd coefficients in two Horner chains)."""
    u = t * t
    v = u * u
    ae = 1.128379167095494 + v * (0.11283791658548713 + v * (
        0.0052239671935439 + v * (0.00012046261269779797 + v * 1.5306373163641084e-06)))
    ao = -0.37612638902808615 + v * (-0.026866169050599326 + v * (
        -0.0008547933736519633 + v * (-1.4795031400662045e-05 + v * -1.0469110332151208e-07)))
    return t * (ae + u * ao)


def erf_mid(t):
    """erf(t) for |t| < 2 in float64: t * a(t * t) as ``erf_small``, degree 14, relative
    error below 1.9e-14."""
    u = t * t
    v = u * u
    ae = 1.1283791670955023 + v * (0.11283791668815009 + v * (0.005223977009212117 + v * (
        0.00012055110432033607 + v * (1.6444360511654216e-06 + v * (1.4421430322661158e-08 + v * (
            7.059651976010553e-11 + v * 7.31037517137807e-14))))))
    ao = -0.37612638903069434 + v * (-0.026866170486638145 + v * (-0.0008548312553260771 + v * (
        -1.4923292814259704e-05 + v * (-1.626901353669879e-07 + v * (
            -1.116838519729602e-09 + v * -3.16496812027159e-12)))))
    return t * (ae + u * ao)


def erf_tail(t):
    """erf(t) for 2 <= |t| in float64: a polynomial of degree 17 in |t| mapped from [2, 3.92]
    to [-1, 1] (absolute error below 1.5e-14), then +-1 (erf rounds to 1 in float32 from
    3.9192059); NaN stays NaN."""
    z = abs(t)
    s = (z - 2.96) * (1.0 / 0.96)
    w = s * s
    be = 0.999971617683007 + w * (-0.0004821417122178923 + w * (-0.00107554407743936 + w * (
        -0.0006680883902602325 + w * (-9.993903799129584e-05 + w * (1.3740460136149053e-05 + w * (
            1.7910877380897525e-06 + w * (-3.297786282662862e-07 + w * 1.1469269245600942e-08)))))))
    bo = 0.00016967261752535144 + w * (0.0008612458269226446 + w * (0.0009843892510206576 + w * (
        0.00032640770163826807 + w * (4.618381650868686e-06 + w * (-7.801649007166618e-06 + w * (
            2.40079679198231e-07 + w * (8.942518046353007e-08 + w * -8.94993952819769e-09)))))))
    b = be + s * bo
    b = 1.0 if z >= 3.92 else b
    return -b if t < 0.0 else b


erf_small = _scalar(erf_small)
erf_mid = _scalar(erf_mid)
erf_tail = _scalar(erf_tail)


@_scalar
def erf_full(t):
    """erf(t) in float64 within 1.9e-14 (relative) for any t: ``erf_mid`` or ``erf_tail``,
    selected lane by lane in a vectorised loop (both are evaluated)."""
    return erf_mid(t) if abs(t) < 2.0 else erf_tail(t)


#: p's float32 rounding is in doubt when p lies within _NEAR float64 ulps (2^-43 of p, well
#: above the polynomials' error) of a rounding boundary: bits 0-28, the ones float32 drops,
#: within _NEAR of 2^28 (halfway). Only for a float32-normal result: see ``erf_f32_rows``.
_NEAR = 1 << 10


@_scalar
def erf_near(p):
    """Whether float32(p) may differ from float32(erf) for a p within 2.1e-14 of erf (the
    C library's erf then decides)."""
    b = np.float64(p).view(np.int64)
    return ((b + (_NEAR - (1 << 28))) & ((1 << 29) - 1)) < 2 * _NEAR


#: elements per group of ``erf_f32_rows``: the unit of the choice of polynomial and of the
#: C library fallback
ERF_GROUP = 256


#: what ``erf_f32_rows`` writes for each e = float32(erf(t)) (its ``mode``): e; GELU's
#: forward x / 2 * (1 + e); GELU's backward prep e and -(x * x) / 2; the compiled steps'
#: gelu_save x / 2 * (1 + e), (1 + e) / 2 and -(x * x) / 2 (the stanza's float32 operations)
ERF_ONLY, GELU_F, GELU_PREP, GELU_SAVE = 0, 1, 2, 3


@_scalar
def _erf_put(mode, x, i, e, o1, o2, o3):
    """Write element i of ``erf_f32_rows``'s outputs (``mode`` is a constant where it is
    inlined: one branch is left)."""
    if mode == ERF_ONLY:
        o1[i] = e
    elif mode == GELU_F:
        o1[i] = x[i] / _F32_TWO * (_F32_ONE + e)
    elif mode == GELU_PREP:
        o1[i] = e
        o2[i] = -(x[i] * x[i]) / _F32_TWO
    else:
        xi = x[i]
        o1[i] = xi / _F32_TWO * (_F32_ONE + e)
        o2[i] = (_F32_ONE + e) / _F32_TWO
        o3[i] = -(xi * xi) / _F32_TWO


@_scalar
def erf_f32_rows(x, s, lo, hi, mode, o1, o2, o3):
    """e = float32(erf(float32(x[i] * s))), the C library's erf rounded to float32, for
    lo <= i < hi (uint64 indices: no wraparound checks), written as ``mode`` says (the
    GELU loops' own float32 work in the same loop: no second pass over the group). The
    cheapest polynomial covering the group's arguments (|t| < 1, < 2, any) in one
    vectorised loop that also flags a result near a float32 rounding boundary; if one is
    (or an argument is float32-subnormal, whose erf rounds on the coarser subnormal grid),
    the group is written again from the C library's erf (rare: about 1 group in 1,000), so
    the outputs must not alias x."""
    top = np.uint32(0)  # the largest |t|, and the smallest nonzero one, by their bits
    low = np.uint32(0xFFFFFFFF)
    for i in range(lo, hi):
        b = np.uint32(np.float32(x[i] * s).view(np.uint32) << np.uint32(1))
        top = max(top, b)
        low = min(low, np.uint32(b - np.uint32(1)))
    near = low < np.uint32(0x00FFFFFF)  # 0 < |t| < 2^-126
    if top < np.uint32(0x7F000000):  # |t| < 1
        for i in range(lo, hi):
            p = erf_small(np.float64(x[i] * s))
            near |= erf_near(p)
            _erf_put(mode, x, i, np.float32(p), o1, o2, o3)
    elif top < np.uint32(0x80000000):  # |t| < 2
        for i in range(lo, hi):
            p = erf_mid(np.float64(x[i] * s))
            near |= erf_near(p)
            _erf_put(mode, x, i, np.float32(p), o1, o2, o3)
    else:
        for i in range(lo, hi):
            p = erf_full(np.float64(x[i] * s))
            near |= erf_near(p)
            _erf_put(mode, x, i, np.float32(p), o1, o2, o3)
    if near:
        for i in range(lo, hi):
            _erf_put(mode, x, i, np.float32(math.erf(np.float64(x[i] * s))), o1, o2, o3)


_F32_HALF_SQRT2 = np.float32(math.sqrt(2) / 2)
#: the stanza's pdf factor 2/sqrt(pi) * (sqrt(2)/2) / 2, folded as NumPy folds it
_F32_GELU_PDF = np.float32(2 / math.sqrt(math.pi) * (math.sqrt(2) / 2) / 2)
_F32_ONE, _F32_TWO = np.float32(1), np.float32(2)


def gelu_f32(x, out):
    """out = x / 2 * (1 + erf(x * sqrt(2)/2)) in float32 arithmetic (flat float32 arrays),
    by ``erf_f32_rows``, group by group."""
    n = x.size
    for g in prange((n + ERF_GROUP - 1) // ERF_GROUP):
        lo = np.uint64(g * ERF_GROUP)
        hi = np.uint64(min(g * ERF_GROUP + ERF_GROUP, n))
        erf_f32_rows(x, _F32_HALF_SQRT2, lo, hi, GELU_F, out, out, out)


def gelu_b_prep_f32(x, e, a):
    """GELU's backward, part 1: e = erf(x * sqrt(2)/2) (float32), a = -(x * x) / 2 (NumPy's
    SIMD exp then makes the pdf's exponential in place)."""
    n = x.size
    for g in prange((n + ERF_GROUP - 1) // ERF_GROUP):
        lo = np.uint64(g * ERF_GROUP)
        hi = np.uint64(min(g * ERF_GROUP + ERF_GROUP, n))
        erf_f32_rows(x, _F32_HALF_SQRT2, lo, hi, GELU_PREP, e, a, a)


def gelu_b_f32(g, x, e, ex, out):
    """GELU's backward, part 2, in the stanza's float32 arithmetic (no contraction):
    out = g * ((1 + e) / 2 + x * (pdf factor * ex)), ex = exp(-(x * x) / 2)."""
    for i in prange(x.size):
        xi = x[i]
        c = (_F32_ONE + e[i]) / _F32_TWO
        out[i] = g[i] * (c + xi * (_F32_GELU_PDF * ex[i]))


# -- attention: the fused CPU node's softmax (scaled_dot_product_flash_attention_for_cpu) --------
# backend.py runs the matmuls in batched BLAS on contiguous operands (a per-(batch, head) Numba
# kernel doing them as loops measured 3-5x slower at T = 32, D = 16: LLVM leaves 16- to
# 32-long inner loops scalar) and the exponentials in NumPy (SIMD: libm's scalar exp costs
# ~7 ns an element here, 5x NumPy's); these kernels do the rest of
# each softmax in one pass over the C-contiguous scores, viewed as (rows, S), rows = (b, h, i)
# in order. Scores as the op: s * scale [+ mask] (mask: a (B, H, L, S) view, stride 0 where
# broadcast), -inf at columns j > i when causal. ninf is -inf in the dtype, so the
# arithmetic stays in it (as the NumPy path's).
@_scalar
def _sum4(r, t, n):
    """sum(r[t, :n]) in r's dtype, in four interleaved partial sums (a fixed order: the same
    at any thread count, without fastmath; one running sum costs an add's latency per
    element)."""
    if n < 8:
        a = r[t, 0]
        for j in range(1, n):
            a += r[t, j]
        return a
    a0, a1, a2, a3 = r[t, 0], r[t, 1], r[t, 2], r[t, 3]
    j = 4
    while j + 3 < n:
        a0 += r[t, j]
        a1 += r[t, j + 1]
        a2 += r[t, j + 2]
        a3 += r[t, j + 3]
        j += 4
    while j < n:
        a0 += r[t, j]
        j += 1
    return (a0 + a1) + (a2 + a3)


@_scalar
def _max4(r, t, n):
    """max(r[t, :n]) in four interleaved partial maxima; NaN is skipped (exact in any order:
    the caller looks for NaN itself)."""
    a0 = a1 = a2 = a3 = r[t, 0]
    j = 1
    while j + 3 < n:
        x0, x1, x2, x3 = r[t, j], r[t, j + 1], r[t, j + 2], r[t, j + 3]
        a1 = x0 if x0 > a1 else a1
        a2 = x1 if x1 > a2 else a2
        a3 = x2 if x2 > a3 else a3
        a0 = x3 if x3 > a0 else a0
        j += 4
    while j < n:
        a0 = r[t, j] if r[t, j] > a0 else a0
        j += 1
    a0 = a1 if a1 > a0 else a0
    a2 = a3 if a3 > a2 else a2
    return a2 if a2 > a0 else a0


def attn_shift(s, mask, has_mask, nh, nl, causal, factor, ninf, m):
    """Forward, part 1: s <- scores - rowmax, m <- rowmax; a row with no finite score and
    no NaN gets m = 0 (its exponentials are then all 0: attn_norm's dead row). Without a
    mask and with factor > 0 the max is taken on the raw q k^T: max(x * factor) equals
    max(x) * factor exactly (rounding is monotonic), and one pass then writes the row."""
    ns = s.shape[1]
    raw = not has_mask and factor > 0
    for bh in prange(s.shape[0] // nl):
        b = bh // nh
        h = bh % nh
        for i in range(nl):
            t = bh * nl + i
            jn = min(i + 1, ns) if causal else ns
            if raw:
                mx = _max4(s, t, jn) * factor
            else:
                for j in range(jn):
                    x = s[t, j] * factor
                    if has_mask:
                        x = x + mask[b, h, i, j]
                    s[t, j] = x
                mx = _max4(s, t, jn)
            if mx == ninf or mx != mx:
                mx = ninf
                for j in range(jn):
                    if s[t, j] != s[t, j]:
                        mx = s[t, j]  # NaN: the whole row becomes NaN, as NumPy's max
                if mx == ninf:
                    m[t] = 0
                    mx = m[t]  # 0 in the dtype
            for j in range(ns):
                x = s[t, j] * factor - mx if raw else s[t, j] - mx
                s[t, j] = ninf if j >= jn else x
            m[t] = mx


def attn_norm(e, m, lse):
    """Forward, part 3 (e = exp(part 1)): e <- e / rowsum, lse <- log(rowsum) + m; a dead
    row (sum 0) stays zeros with a logsumexp of 0 (torch)."""
    n, ns = e.shape
    for t in prange(n):
        tot = _sum4(e, t, ns)
        if tot == 0:
            lse[t] = 0
            continue
        for j in range(ns):
            e[t, j] = e[t, j] / tot
        lse[t] = math.log(tot) + m[t]


def attn_logits(s, mask, has_mask, nh, nl, causal, factor, ninf, lse):
    """Backward, part 1 (exp in NumPy then gives the probabilities from the saved
    logsumexp): s <- scores - lse (fully masked rows: -inf - 0)."""
    ns = s.shape[1]
    for bh in prange(s.shape[0] // nl):
        b = bh // nh
        h = bh % nh
        for i in range(nl):
            t = bh * nl + i
            m = lse[t]
            for j in range(ns):
                x = s[t, j] * factor
                if has_mask:
                    x = x + mask[b, h, i, j]
                s[t, j] = ninf if causal and j > i else x - m


def attn_dscores(dp, p, go, factor):
    """dp <- (dp - rowsum(g * o)) * p * factor: the scores' gradient times the scale, with
    dp = dO v^T (rows, S), p the probabilities, go = dO * O (rows, Ev)."""
    n, ns = dp.shape
    for t in prange(n):
        rs = _sum4(go, t, go.shape[1])
        for j in range(ns):
            dp[t, j] = (dp[t, j] - rs) * p[t, j] * factor


# -- loops generated from the op stanzas (symgrad/ops/scalar.py) ----------------------------
# Operands of length 1 stand for scalars in binary forwards: the loops are versioned on that
# outside the loop (an index like ``b[i * sb]`` inside it stops LLVM from vectorizing: 4.6x
# slower). ``sg`` is 0 when the grad of a backward is an expanded scalar (the backward of sum
# or mean).
def _forward_loop(kernel: str) -> list[str]:
    spec = next(s for s in OPS.values() if s.kernel == kernel)
    scalar = spec.scalar
    xs, params = scalar.inputs, scalar.params
    lines = [source(f"{kernel}_fwd", xs + params, scalar.forward)]
    call = f"{kernel}_fwd_j"
    if len(xs) == 2 and not params:
        a, b = xs
        lines += [f"def {kernel}_f({a}, {b}, out, sa, sb):",
                  "    if sa and sb:",
                  "        for i in prange(out.size):",
                  f"            out[i] = {call}({a}[i], {b}[i])",
                  "    elif sa:",
                  f"        b0 = {b}[0]",
                  "        for i in prange(out.size):",
                  f"            out[i] = {call}({a}[i], b0)",
                  "    else:",
                  f"        a0 = {a}[0]",
                  "        for i in prange(out.size):",
                  f"            out[i] = {call}(a0, {b}[i])", ""]
    else:
        args = ", ".join(f"{x}[i]" for x in xs) + "".join(f", {p}" for p in params)
        lines += [f"def {kernel}_f({', '.join(xs + params)}, out):",
                  "    for i in prange(out.size):",
                  f"        out[i] = {call}({args})", ""]
    return lines


def _backward_loop(op: str) -> list[str]:
    scalar = OPS[op].scalar
    lines = []
    for i, text in enumerate(scalar.grads):
        if text is not None:
            lines.append(source(f"{op}_rule_{i}", ("g",) + scalar.reads(i)
                                + scalar.param_reads(i), text))
    for mask in grad_masks(op):
        values, params = grad_mask_args(op, mask)
        outs = tuple(f"o{i}" for i in mask)
        lines.append(f"def {grad_mask_name(op, mask)}"
                     f"({', '.join(('g',) + values + params + outs)}, sg):")
        for gi, guard in (("g[i]", "if sg:"), ("g[0]", "else:")):
            lines += [f"    {guard}", f"        for i in prange(o{mask[0]}.size):"]
            for i in mask:
                args = ", ".join((gi,) + tuple(f"{v}[i]" for v in scalar.reads(i))
                                 + scalar.param_reads(i))
                lines.append(f"            o{i}[i] = {op}_rule_{i}_j({args})")
        lines.append("")
    return lines


def _generated_source() -> tuple[str, list[str], list[str]]:
    """Module text of the generated loops, their names, and the jitted scalar helpers they
    call: ``<kernel>_f`` (forward) and ``<op>_b<mask>`` (fused backward), each calling
    ``<kernel>_fwd_j`` / ``<op>_rule_<i>_j``, the jitted scalar expression."""
    lines = ['"""Generated by symgrad/backends/cpu/kernels.py from the op stanzas; do not edit."""',
             "from numba import prange", ""]
    names, helpers = [], []
    for kernel in scalar_kernels():
        if rules.forward_loop(kernel):
            lines += _forward_loop(kernel)
            names.append(f"{kernel}_f")
            helpers.append(f"{kernel}_fwd")
    for op in fused_from_stanza():
        if rules.backward_loop(op):
            lines += _backward_loop(op)
            names += [grad_mask_name(op, m) for m in grad_masks(op)]
            helpers += [f"{op}_rule_{i}" for i, t in enumerate(OPS[op].scalar.grads)
                        if t is not None]
    return "\n".join(lines), names, helpers


def _generated():
    """The generated loops as a module loaded from a real file: Numba's on-disk cache is
    keyed by the source file, so ``cache=True`` works as for the hand-written loops. The
    file is named by a hash of its text (a changed stanza makes a new file)."""
    text, names, helpers = _generated_source()
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "__pycache__")
    mod = import_text(text, os.path.join(base, "symgrad_generated"), "elementwise")
    # the vocabulary as Numba compiles it: libm for the transcendentals, the Python helpers
    # of rules.py jitted (one definition for the size-1 path and the loops)
    for fname, fn in rules.PY_MATH.items():
        if callable(fn):
            fn = fn if fn.__module__ == "math" or fn is abs else _scalar(fn)
        setattr(mod, fname, fn)
    for helper in helpers:
        setattr(mod, helper + "_j", _scalar(getattr(mod, helper)))
    return [getattr(mod, name) for name in names]


_BODIES = [outer_f, add_scaled_f, sum_f, sum_rows_f, sum_last_f, softmax_rows,
           log_softmax_rows, logsumexp_rows, softmax_rows_b, log_softmax_rows_b, take_rows,
           scatter_add_rows, copy_f, conv_im2col, conv_col2im, *_WIDE, gelu_b_f32, layer_norm_rows,
           layer_norm_rows_b, softmax_shift_rows, softmax_norm_rows,
           max_pool_taps, max_pool_scatter, attn_shift, attn_norm,
           attn_logits, attn_dscores] + _generated()

#: name -> (serial dispatcher, parallel dispatcher); nothing compiles until first called
K: dict[str, tuple] = {f.__name__: twin(f) for f in _BODIES}
#: loops whose only float multiply-adds are erf's polynomials: FMA contraction allowed
_CONTRACT = dict(_OPTS, fastmath={"contract"})
K.update({f.__name__: twin(f, _CONTRACT) for f in (gelu_f32, gelu_b_prep_f32)})
