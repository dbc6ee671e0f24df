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

import hashlib
import importlib.util
import math
import os
import sys
import tempfile
import threading
import time
import types

__all__ = ["THREADING_LAYER", "twin"]


def _writable(path: str) -> bool:
    """Can files be created in ``path`` (made if missing)? Tried, not guessed from modes."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            return True
    except OSError:
        return False


def _cache_dir_fallback() -> None:
    """Numba caches next to this file; where that is read-only, use a user cache dir."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    here = os.path.dirname(os.path.abspath(__file__))
    if _writable(os.path.join(here, "__pycache__")):
        return
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for cand in (os.path.join(base, "symgrad", "numba"),
                 os.path.join(tempfile.gettempdir(), f"symgrad-numba-{os.getuid()}")):
        if _writable(cand):
            os.environ["NUMBA_CACHE_DIR"] = cand
            return


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
from ...ops.elementwise import scalar_ops, unary_fused_backward  # noqa: E402
from ...ops.scalar import TRANSCENDENTAL, source  # noqa: E402
from . import rules  # noqa: E402

if os.environ.get("NUMBA_CACHE_DIR"):
    numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"]
THREADING_LAYER = _threading()

# fastmath stays off: results must match the NumPy reference and torch bit-for-bit where
# the math allows (fastmath gains nothing on these memory-bound loops, PERF-BASELINES B2).
# error_model="numpy": 1/0 gives inf as in NumPy and torch, instead of raising.
_OPTS = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")
_scalar = njit(inline="always", **_OPTS)


def twin(fn):
    """(serial, parallel) dispatchers of one loop body; distinct names keep caches apart."""
    par = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_par",
                             fn.__defaults__, fn.__closure__)
    par.__qualname__ = fn.__qualname__ + "_par"
    par.__module__ = fn.__module__
    return njit(**_OPTS)(fn), njit(parallel=True, **_OPTS)(par)


# -- progress message for long first compiles ---------------------------------------------
class _CompileNotice(numba.core.event.Listener):
    """Says on stderr what is compiling when a first compile takes longer than ``delay``."""

    delay = float(os.environ.get("SYMGRAD_COMPILE_NOTICE_S", "1.0"))

    def __init__(self) -> None:
        self._local = threading.local()

    def on_start(self, event) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth:
            return
        disp = event.data.get("dispatcher")
        name = getattr(getattr(disp, "py_func", None), "__name__", "kernel")
        self._local.t0 = time.perf_counter()
        self._local.said = [False]
        said = self._local.said

        def say() -> None:
            said[0] = True
            print(f"symgrad: compiling Numba kernel {name!r} (first use only; cached on disk "
                  "afterwards)...", file=sys.stderr, flush=True)

        timer = threading.Timer(self.delay, say)
        timer.daemon = True
        timer.start()
        self._local.timer = timer

    def on_end(self, event) -> None:
        self._local.depth -= 1
        if self._local.depth:
            return
        self._local.timer.cancel()
        if self._local.said[0]:
            print(f"symgrad: compiled in {time.perf_counter() - self._local.t0:.1f} s",
                  file=sys.stderr, flush=True)


numba.core.event.register("numba:compile", _CompileNotice())


# -- libm note --------------------------------------------------------------------------------
# Numba's llvmlite here has no SVML, so sin/cos/exp/log/tanh in a Numba loop are scalar libm
# calls, ~5x slower per element than NumPy's SIMD ufuncs (measured: cos on 16k float32,
# 77 µs vs 16 µs). Kernels therefore exist only for memory-bound work (arithmetic, selects,
# copies, reductions), where one fused pass and all cores win; transcendentals stay NumPy.

# -- forward kernels (memory-bound ops above the parallel threshold) -------------------------
# Operands of length 1 stand for scalars: the loops are versioned on that outside the loop
# (an index like ``b[i * sb]`` inside it stops LLVM from vectorizing: 4.6x slower).
def add_f(a, b, out, sa, sb):
    if sa and sb:
        for i in prange(out.size):
            out[i] = a[i] + b[i]
    elif sa:
        b0 = b[0]
        for i in prange(out.size):
            out[i] = a[i] + b0
    else:
        a0 = a[0]
        for i in prange(out.size):
            out[i] = a0 + b[i]


def sub_f(a, b, out, sa, sb):
    if sa and sb:
        for i in prange(out.size):
            out[i] = a[i] - b[i]
    elif sa:
        b0 = b[0]
        for i in prange(out.size):
            out[i] = a[i] - b0
    else:
        a0 = a[0]
        for i in prange(out.size):
            out[i] = a0 - b[i]


def mul_f(a, b, out, sa, sb):
    if sa and sb:
        for i in prange(out.size):
            out[i] = a[i] * b[i]
    elif sa:
        b0 = b[0]
        for i in prange(out.size):
            out[i] = a[i] * b0
    else:
        a0 = a[0]
        for i in prange(out.size):
            out[i] = a0 * b[i]


def div_f(a, b, out, sa, sb):
    if sa and sb:
        for i in prange(out.size):
            out[i] = a[i] / b[i]
    elif sa:
        b0 = b[0]
        for i in prange(out.size):
            out[i] = a[i] / b0
    else:
        a0 = a[0]
        for i in prange(out.size):
            out[i] = a0 / b[i]


def addcmul_f(a, t1, t2, value, out):
    """out = a + value * t1 * t2 in one pass (the ``a*b + a`` pattern, torch.addcmul)."""
    for i in prange(out.size):
        out[i] = a[i] + value * (t1[i] * t2[i])


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


# -- fused backward kernels: the whole backward of an op in one pass ------------------------
# ``sg`` is 0 when the grad is an expanded scalar (the backward of sum or mean). The unary
# ones (``exp_b`` ...) are generated from the op stanzas (``_generated`` below).
def mul2_b(g, a, b, ga, gb, sg):
    """Both gradients of a*b in one pass: ga = g*b, gb = g*a."""
    if sg:
        for i in prange(ga.size):
            ga[i] = g[i] * b[i]
            gb[i] = g[i] * a[i]
    else:
        for i in prange(ga.size):
            ga[i] = g[0] * b[i]
            gb[i] = g[0] * a[i]


def div2_b(g, a, b, ga, gb, sg):
    """Both gradients of a/b in one pass: ga = g/b, gb = -g*a/(b*b)."""
    if sg:
        for i in prange(ga.size):
            ga[i] = g[i] / b[i]
            gb[i] = -g[i] * a[i] / (b[i] * b[i])
    else:
        for i in prange(ga.size):
            ga[i] = g[0] / b[i]
            gb[i] = -g[0] * a[i] / (b[i] * b[i])


def div_other_b(g, a, b, gb, sg):
    if sg:
        for i in prange(gb.size):
            gb[i] = -g[i] * a[i] / (b[i] * b[i])
    else:
        for i in prange(gb.size):
            gb[i] = -g[0] * a[i] / (b[i] * b[i])


def pow_b(g, x, e, out, sg):
    """d(x**e)/dx for a scalar exponent e (e != 0), typed like x."""
    em1 = e - 1
    if sg:
        for i in prange(out.size):
            out[i] = g[i] * e * x[i] ** em1
    else:
        for i in prange(out.size):
            out[i] = g[0] * e * x[i] ** em1


def where2_b(g, c, ga, gb, sg):
    """Both gradients of where(c, a, b): the grad goes left where c, else right."""
    for i in prange(ga.size):
        gi = g[i] if sg else g[0]
        ga[i] = gi if c[i] else 0
        gb[i] = 0 if c[i] else gi


def where1_b(g, c, out, left, sg):
    for i in prange(out.size):
        gi = g[i] if sg else g[0]
        out[i] = gi if c[i] == left else 0


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


# -- loops generated from the op stanzas (symgrad/ops/scalar.py) ----------------------------
def _generated_source() -> tuple[str, list[str]]:
    """Module text of the generated loops, and their names: ``<op>_f`` (forward) for the
    memory-bound unary ops, ``<op>_b`` (fused backward) for those whose rule needs no libm
    call. Each loop calls ``<op>_fwd_j`` / ``<op>_rule_j``, the jitted scalar expression."""
    lines = ['"""Generated by symgrad/backends/cpu/kernels.py from the op stanzas; do not edit."""',
             "from numba import prange", ""]
    names = []
    for op in scalar_ops(1):
        scalar = OPS[op].scalar
        if scalar.memory_bound:
            lines += [source(f"{op}_fwd", ("x",), scalar.forward),
                      f"def {op}_f(x, out):",
                      "    for i in prange(out.size):",
                      f"        out[i] = {op}_fwd_j(x[i])", ""]
            names.append(f"{op}_f")
    for op in unary_fused_backward():
        scalar = OPS[op].scalar
        if scalar.calls("grad") & TRANSCENDENTAL:
            continue  # NumPy's SIMD ufunc wins (see the libm note above)
        lines += [source(f"{op}_rule", ("g", scalar.operand), scalar.grad),
                  f"def {op}_b(g, v, out, sg):",
                  "    if sg:",
                  "        for i in prange(out.size):",
                  f"            out[i] = {op}_rule_j(g[i], v[i])",
                  "    else:",
                  "        for i in prange(out.size):",
                  f"            out[i] = {op}_rule_j(g[0], v[i])", ""]
        names.append(f"{op}_b")
    return "\n".join(lines), names


def _generated():
    """The generated loops as a module loaded from a real file: Numba's on-disk cache is
    keyed by the source file, so ``cache=True`` works as for the hand-written loops. The
    file is named by a hash of its text (a changed stanza makes a new file)."""
    text, names = _generated_source()
    digest = hashlib.sha1(text.encode()).hexdigest()[:16]
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(os.path.dirname(
        os.path.abspath(__file__)), "__pycache__")
    folder = os.path.join(base, "symgrad_generated")
    path = os.path.join(folder, f"elementwise_{digest}.py")
    if not os.path.exists(path):
        if not _writable(folder):
            folder = tempfile.mkdtemp(prefix="symgrad-generated-")
            path = os.path.join(folder, f"elementwise_{digest}.py")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)  # atomic: concurrent processes write the same text
    modname = f"symgrad.backends.cpu._elementwise_{digest}"
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    # the vocabulary as Numba compiles it: libm for the transcendentals, the Python helpers
    # of rules.py jitted (one definition for the size-1 path and the loops)
    for fname, fn in rules.PY_MATH.items():
        setattr(mod, fname, fn if fn.__module__ == "math" or fn is abs else _scalar(fn))
    for name in names:
        op, kind = name.rsplit("_", 1)
        inner = f"{op}_fwd" if kind == "f" else f"{op}_rule"
        setattr(mod, inner + "_j", _scalar(getattr(mod, inner)))
    return [getattr(mod, name) for name in names]


_BODIES = [add_f, sub_f, mul_f, div_f, addcmul_f, outer_f, add_scaled_f, mul2_b, div2_b,
           div_other_b, pow_b, where2_b, where1_b, sum_f, sum_rows_f, sum_last_f, softmax_rows,
           log_softmax_rows, logsumexp_rows, softmax_rows_b, log_softmax_rows_b, take_rows,
           scatter_add_rows, copy_f] + _generated()

#: name -> (serial dispatcher, parallel dispatcher); nothing compiles until first called
K: dict[str, tuple] = {f.__name__: twin(f) for f in _BODIES}
