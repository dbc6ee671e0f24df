"""Elementwise fusion: a run of same-shape elementwise ops becomes one Numba loop.

The loop body is written from the ops' own definitions: the unary ops' ``Scalar.forward``
text (symgrad/ops/scalar.py), with the vocabulary bound to ``math`` and to the CPU
backend's jitted helpers (``sign``, ``where``, ``maximum``, as its generated kernels bind
them), and ``+ - * /`` for the arithmetic. One pass reads each input element once and
writes every value of the run into its buffer (the backward reads them).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from ..ops.scalar import source
from . import fwdbwd
from .graph import CustomCall, OpCall, Program, Value
from .runtime import scalar_names

__all__ = ["plan", "call_code", "cache_stats", "warm"]

_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
#: the scalar functions the generated module binds for Numba (PRELUDE)
VOCABULARY = frozenset({"exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "sign", "where",
                        "maximum", "log1p", "expm1", "erf", "pi"})
#: the scalar vocabulary under the names the generated module binds for Numba
_RENAME = {f: f"m_{f}" for f in VOCABULARY}

PRELUDE = [
    "import math",
    "",
    "from numba import njit, prange",
    "",
    "import symgrad.backends.cpu.kernels  # noqa: F401  (picks the threading layer first)",
    "from symgrad.backends.cpu import backend as _cpu_backend",
    "from symgrad.backends.cpu.rules import maximum as _maximum",
    "from symgrad.backends.cpu.rules import sign as _sign",
    "from symgrad.backends.cpu.rules import where as _where",
    "",
    "_J = dict(cache=True, nogil=True, fastmath=False, error_model='numpy')",
    "m_sign = njit(inline='always', **_J)(_sign)",
    "m_where = njit(inline='always', **_J)(_where)",
    "m_maximum = njit(inline='always', **_J)(_maximum)",
    "m_abs = abs",
    *(f"m_{f} = math.{f}" for f in ("exp", "log", "sin", "cos", "tanh", "sqrt", "log1p",
                                    "expm1", "erf", "pi")),
    "",
]


@dataclass
class Group:
    index: int
    calls: list
    #: values the run reads from outside it
    inputs: list = field(default_factory=list)
    #: (kernel name, calls) in order; name None: one SIMD_FORWARD op as a NumPy ufunc
    segments: list = field(default_factory=list)
    #: fwdbwd.Design when its forward and backward are generated together (else None)
    design: object = None

    @property
    def name(self) -> str:
        return f"fused_{self.index}"


@dataclass
class Plan:
    skip: set = field(default_factory=set)
    first: dict = field(default_factory=dict)
    kernels: list = field(default_factory=list)
    kernel_text: list = field(default_factory=list)
    helpers: dict = field(default_factory=dict)
    #: (name, group, seeds, outputs) of each fused backward loop, for prove.py
    backward_kernels: list = field(default_factory=list)
    #: groups whose forward and backward fwdbwd.py generated together (prove.prove_group)
    fused_groups: list = field(default_factory=list)


def fwdbwd_enabled() -> bool:
    """Forward+backward fusion (fwdbwd.py) is on unless ``SYMGRAD_COMPILE_FWDBWD=0`` (kept
    to compare with the plain fused path)."""
    return os.environ.get("SYMGRAD_COMPILE_FWDBWD", "1") != "0"


def _fusible(call: OpCall) -> bool:
    out = call.outputs[0]
    if len(call.outputs) != 1 or out.dtype.kind != "f":
        return False
    for x in call.inputs:
        if isinstance(x, Value):
            if x.shape != out.shape or x.dtype != out.dtype:
                return False
        elif type(x) not in (int, float):
            return False
    spec = call.spec
    if spec.name in _ARITH:
        return call.params.get("alpha", 1) == 1 and set(call.params) <= {"alpha"}
    if spec.name == "pow":
        return set(call.params) == {"exponent"} and type(call.params["exponent"]) in (
            int, float) and isinstance(call.inputs[0], Value)
    s = spec.scalar
    return (s is not None and len(spec.inputs) == 1 and not s.params and not call.params
            and isinstance(call.inputs[0], Value) and isinstance(s.grad, str)
            and scalar_names(s) <= VOCABULARY)


#: transcendental unary ops whose forward runs as NumPy's SIMD ufunc (30x faster per element
#: than a libm call in a Numba loop here); the run's fused backward still covers them
SIMD_FORWARD = {"tanh": "np.tanh", "exp": "np.exp", "log": "np.log", "sqrt": "np.sqrt",
                "sin": "np.sin", "cos": "np.cos"}


def plan(program: Program) -> Plan:
    """Runs of at least two consecutive fusible ops of one shape, each as one group."""
    runs: list[list[OpCall]] = []
    current: list[OpCall] = []
    for event in program.events:
        if isinstance(event, OpCall) and _fusible(event) and (
                not current or event.outputs[0].shape == current[0].outputs[0].shape):
            current.append(event)
            continue
        runs.append(current)
        current = [event] if isinstance(event, OpCall) and _fusible(event) else []
    runs.append(current)
    out = Plan()
    # fwdbwd's seed analysis follows OpCalls only; a custom Function's backward (ops the
    # user wrote) also carries gradients, so a program with one keeps the plain path
    facts = fwdbwd.analyze(program) if fwdbwd_enabled() and not any(
        isinstance(e, CustomCall) for e in program.events) else None
    for calls in runs:
        if len(calls) < 2:
            continue
        group = Group(len(out.first), calls)
        made: set = set()
        for c in calls:
            for x in c.inputs:
                if isinstance(x, Value) and x.index not in made and x not in group.inputs:
                    group.inputs.append(x)
            made.add(c.outputs[0].index)
        out.first[id(calls[0])] = group
        out.skip.update(id(c) for c in calls[1:])
        d = fwdbwd.design(group, facts) if facts is not None else None
        if d is not None:
            d.code = fwdbwd.derived(fwdbwd.describe(group, d, parallel(calls)))
            group.design = d
            text, kernels = fwdbwd.module_kernels(group, d.code)
            out.kernel_text += text
            out.kernels += kernels
            out.fused_groups.append(group)
            continue
        for k, seg in enumerate(_segments(calls)):
            if seg[0].spec.name in SIMD_FORWARD:
                group.segments.append((None, seg))
                continue
            name = f"{group.name}_{k}"
            text, n_args = _kernel(name, seg, out.helpers)
            out.kernel_text += text
            out.kernels.append((name, calls[0].outputs[0].dtype.name, "a" * n_args))
            group.segments.append((name, seg))
    return out


def _segments(calls: list) -> list[list]:
    """Split a run at the SIMD_FORWARD ops (each its own segment)."""
    segs: list[list] = []
    for c in calls:
        if c.spec.name in SIMD_FORWARD:
            segs.append([c])
        elif segs and segs[-1][0].spec.name not in SIMD_FORWARD:
            segs[-1].append(c)
        else:
            segs.append([c])
    return segs


def module_text(p: Plan) -> list[str]:
    """The kernels' part of the module: vocabulary, scalar helpers, loops."""
    if not p.kernels:
        return []
    return PRELUDE + list(p.helpers.values()) + p.kernel_text


def _power(x: str, e: float, dt: str) -> str:
    """``x ** e``: small integer powers as products (libm's powf is 50x slower here)."""
    if e == int(e) and 0 <= e <= 4:
        return " * ".join([x] * int(e)) if e else f"np.{dt}(1.0)"
    return f"{x} ** np.{dt}({float(e)!r})"


def _segment_inputs(calls: list) -> list:
    made = {c.outputs[0].index for c in calls}
    inputs: list = []
    for c in calls:
        for x in c.inputs:
            if isinstance(x, Value) and x.index not in made and x not in inputs:
                inputs.append(x)
    return inputs


def parallel(calls: list) -> bool:
    """Runs of at least the CPU backend's PARALLEL_MIN elements use every core (``prange``,
    launched under the backend's lock: the workqueue threading layer is not thread-safe)."""
    from ..backends.cpu import backend

    n = 1
    for s in calls[0].outputs[0].shape:
        n *= s
    return n >= backend.PARALLEL_MIN


def _head(name: str, params: list, calls: list, size: str) -> list[str]:
    par = parallel(calls)
    return ["@njit(parallel=True, **_J)" if par else "@njit(**_J)",
            f"def {name}({', '.join(params)}):",
            f"    for k in {'prange' if par else 'range'}({size}.size):"]


def launch(calls: list, call: str) -> list[str]:
    """The line calling a kernel of ``calls``' run (under the lock when parallel)."""
    if parallel(calls):
        return ["with _cpu_backend._parallel_lock:", f"    {call}"]
    return [call]


def _kernel(name: str, calls: list, helpers: dict) -> tuple[list[str], int]:
    inputs = _segment_inputs(calls)
    dt = calls[0].outputs[0].dtype.name
    outs = [c.outputs[0] for c in calls]
    params = [f"i{v.index}" for v in inputs] + [f"o{v.index}" for v in outs]
    lines = _head(name, params, calls, f"o{outs[0].index}")
    lines += [f"        t{v.index} = i{v.index}[k]" for v in inputs]
    for c in calls:
        args = [f"t{x.index}" if isinstance(x, Value) else f"np.{dt}({float(x)!r})"
                for x in c.inputs]
        op = _ARITH.get(c.spec.name)
        if op is not None:
            expr = f"{args[0]} {op} {args[1]}"
        elif c.spec.name == "pow":
            expr = _power(args[0], c.params["exponent"], dt)
        else:
            fname = f"s_{c.spec.name}"
            if fname not in helpers:
                helpers[fname] = "@njit(inline='always', **_J)\n" + source(
                    fname, ("x",), c.spec.scalar.forward, rename=_RENAME)
            expr = f"{fname}({args[0]})"
        v = c.outputs[0]
        lines += [f"        t{v.index} = {expr}", f"        o{v.index}[k] = t{v.index}"]
    return lines + ["", ""], len(params)


def call_code(group: Group, ctx) -> list[str]:
    """Lines running the forward of ``group``: its kernels and SIMD ufuncs, in order, each
    value into its own buffer (the fused backward reads them)."""
    if group.design is not None:
        return fwdbwd.call_code(group, ctx, launch)
    lines = []
    made: set = set()
    for name, calls in group.segments:
        outs = [c.outputs[0] for c in calls]
        for v in outs:
            ctx.alloc(f"{ctx.buf(v)}f = {ctx.buf(v)}.reshape(-1)")
        if name is None:
            (c,) = calls
            x = c.inputs[0]
            lines.append(f"{SIMD_FORWARD[c.spec.name]}({x.name}, out={ctx.buf(outs[0])})")
        else:
            ins = [f"{ctx.buf(v)}f" if v.index in made else f"{v.name}.reshape(-1)"
                   for v in _segment_inputs(calls)]
            flats = [f"{ctx.buf(v)}f" for v in outs]
            lines += launch(calls, f"{name}({', '.join(ins + flats)})")
        made.update(v.index for v in outs)
        lines += [f"{v.name} = {ctx.buf(v)}" for v in outs]
    return lines


def warm(module) -> None:
    """Compile (or load from Numba's disk cache) every fused kernel of ``module`` now, for
    the 1-D C-contiguous arrays ``call_code`` passes, so the first compiled call pays it."""
    from numba import types

    for disp, dtype, codes in getattr(module, "KERNELS", ()):
        scalar = getattr(types, dtype)
        kinds = {"a": types.Array(scalar, 1, "C"), "s": scalar, "b": types.boolean,
                 "i": types.int64, "A": types.Array(scalar, 2, "C"),
                 "I": types.Array(types.int64, 1, "C"), "d": types.float64,
                 "J": types.Array(types.int64, 2, "C")}
        disp.compile(tuple(kinds[c] for c in codes))


def cache_stats() -> dict:
    """Fused kernels of the loaded step modules: how many, compiled here, loaded from disk."""
    kernels = compiled = loaded = 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith("symgrad_step_"):
            continue
        for disp, _, _ in getattr(mod, "KERNELS", ()):
            kernels += 1
            compiled += sum(disp.stats.cache_misses.values())
            loaded += sum(disp.stats.cache_hits.values())
    return {"kernels": kernels, "compiled": compiled, "loaded": loaded}


# -- optimizer updates: eager's operations per element, in its order and dtype -----------
UPDATE_KERNELS = {"sgd": """@njit(**_J)
def sgd_update(p, g, buf, neg_lr, momentum, wd, use_wd, use_momentum):
    for k in range(p.size):
        d = g[k]
        if use_wd:
            d = d + p[k] * wd
        if use_momentum:
            d = buf[k] * momentum + d
            buf[k] = d
        p[k] = p[k] + d * neg_lr
""", "adam": """@njit(**_J)
def adam_update(p, g, m, v, c1, b2, c2, neg_step, bc2_sqrt, eps, wd, mode, decay):
    for k in range(p.size):
        gk = g[k]
        pk = p[k]
        if mode == 1:
            gk = gk + pk * wd
        elif mode == 2:
            pk = pk * decay
        mk = m[k] + (gk - m[k]) * c1
        m[k] = mk
        vk = v[k] * b2
        vk = vk + (gk * c2) * gk
        v[k] = vk
        p[k] = pk + (mk * neg_step) / (np.sqrt(vk) / bc2_sqrt + eps)
"""}
# One call per (param group, dtype) instead of one per parameter: each row of ``T`` holds
# one parameter's arrays' data addresses, then its size (runtime.update_table; the step
# module keeps the arrays alive, and step.py checks them C-contiguous, of their dtype),
# and the loop calls the update above on them: the same per-element code. Adam's step
# count (a float32 0-d array, as eager keeps it) is incremented here, and the bias
# corrections computed from it in float64 as Python computes them: ``**`` is libm's pow in
# CPython and here (the exponent 0.5 comes in as ``half``: a literal 0.5 lets LLVM turn
# pow into sqrt, not always the same bits), then rounded to the dtype as ``np.float32(x)``
# rounds. The GPT step (28 parameters) spent ~240 µs calling the per-parameter loops.
UPDATE_KERNELS["sgd_group"] = """@njit(**_J)
def sgd_group(T, neg_lr, momentum, wd, use_wd, use_momentum):
    for i in range(T.shape[0]):
        n = T[i, 3]
        sgd_update(carray(_at(T[i, 0], neg_lr), n), carray(_at(T[i, 1], neg_lr), n),
                   carray(_at(T[i, 2], neg_lr), n), neg_lr, momentum, wd, use_wd,
                   use_momentum)
"""
UPDATE_KERNELS["adam_group"] = """@njit(**_J)
def adam_group(T, c1, b2, c2, lr, beta1, beta2, half, eps, wd, mode, decay):
    for i in range(T.shape[0]):
        n = T[i, 5]
        s = carray(_at(T[i, 4], np.float32(0)), 1)
        s[0] = s[0] + np.float32(1)
        t = np.float64(s[0])
        adam_update(carray(_at(T[i, 0], eps), n), carray(_at(T[i, 1], eps), n),
                    carray(_at(T[i, 2], eps), n), carray(_at(T[i, 3], eps), n), c1, b2, c2,
                    _as(-(lr / (1 - beta1 ** t)), eps), _as((1 - beta2 ** t) ** half, eps),
                    eps, wd, mode, decay)
"""
#: argument kinds for compiling them ahead (a: 1-D array, s: scalar, b: bool, i: int64,
#: d: float64, J: 2-D int64 array)
UPDATE_CODES = {"sgd_update": "aaasssbb", "adam_update": "aaaasssssssis",
                "sgd_group": "Jsssbb", "adam_group": "Jsssddddssis"}
#: what the group loops use besides njit: an address as a pointer to elements of a
#: scalar's type, and a float64 rounded to a scalar's type (as ``np.float32(x)`` rounds)
_UPDATE_PRELUDE = """
from numba import carray
from numba.core import types as _types
from numba.extending import intrinsic


@intrinsic
def _at(typingctx, addr, like):
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return _types.CPointer(like)(addr, like), codegen


@intrinsic
def _as(typingctx, x, like):
    def codegen(context, builder, signature, args):
        return context.cast(builder, args[0], signature.args[0], signature.return_type)
    return like(x, like), codegen

"""


# -- loops of single ops: cross_entropy's rows (log_softmax over the last dim of a 2-D
# array, nll_loss), relu ---------------------------------------------------------------
#: NumPy reduces 10-element rows at ~0.1 µs a row (64x10: max 7.5 µs, sum 4.4 µs), so
#: eager's log_softmax forward (max, sub, exp, sum, log, sub) and nll_loss (eight array
#: ops) took 50 µs of the 784-256-256-10 step. log_softmax here is eager's operations with
#: eager's bits: the row max and the subtraction in one loop, NumPy's exp and log (SIMD,
#: and the very functions eager calls), the row sums in NumPy's own pairwise order
#: (ROW_HELPERS). Bit for bit matters beyond tidiness: Adam divides each gradient by its
#: own size, so a rounding difference in a gradient that should be zero (a key bias's,
#: which softmax cancels) moves the parameter by a whole learning rate, and the compiled
#: step's self-check then (rightly) sees it differ from eager's.
LOOPS = {"log_softmax_sums": """@njit(**_J)
def log_softmax_sums(e, zero, s):
    n, c = e.shape
    for i in range(n):
        s[i, 0] = _row_sum_pw(e, i, c, zero)
    return s
""", "log_softmax_rows_b": """@njit(**_J)
def log_softmax_rows_b(g, e, zero, out):
    n, c = out.shape
    for i in range(n):
        s = _row_sum_pw(g, i, c, zero)
        for j in range(c):
            out[i, j] = g[i, j] - e[i, j] * s
    return out
""", "nll_rows": """@njit(**_J)
def nll_rows(y, t, ignore_index, mean, out):
    n, c = y.shape
    total = 0.0
    tw = 0.0
    for i in range(n):
        k = t[i]
        if k != ignore_index:
            if k < 0:
                k += c
            if k < 0 or k >= c:
                raise IndexError("nll_loss: a target is out of bounds")
            total -= y[i, k]
            tw += 1.0
    out[1] = tw
    out[0] = total / tw if mean else total
""", "nll_rows_b": """@njit(**_J)
def nll_rows_b(g, t, ignore_index, mean, tw, out):
    n, c = out.shape
    out[:, :] = 0
    if mean:
        g = g / tw
    for i in range(n):
        k = t[i]
        if k != ignore_index:
            if k < 0:
                k += c
            if k < 0 or k >= c:
                raise IndexError("nll_loss: a target is out of bounds")
            out[i, k] = -g
    return out
"""}
# the row max in four interleaved partial maxima (one running max waits a compare's latency
# per element: 26 µs on 256x65, this 9): the attention kernels' _max4, exact in any order.
# It skips NaN, where eager's max gives NaN: the row's exp, sum and log then give NaN all
# the same, and the output is that NaN minus ... NaN everywhere, as eager's; an infinite max
# gives NaN rows as eager's.
LOOPS["log_softmax_shift"] = """@njit(**_J)
def log_softmax_shift(x, out):
    n, c = x.shape
    for i in range(n):
        mx = _max4(x, i, c)
        for j in range(c):
            out[i, j] = x[i, j] - mx
    return out
"""
#: the longest row ROW_HELPERS sums (NumPy's pairwise block, PW_BLOCKSIZE): longer rows
#: keep eager's NumPy calls in the generated code
PAIRWISE_BLOCK = 128
# NumPy's pairwise summation of one row (numpy/_core/src/umath/loops_utils.h.src), for a
# row of at most PAIRWISE_BLOCK elements, in the row's dtype (``zero`` is 0 in it): under
# eight elements one running sum from zero; else eight interleaved partial sums from the
# first eight elements, combined as NumPy combines them, then the remaining elements one
# by one, added to zero (the reduction's start: a sum of -0.0 is 0.0). np.add.reduce(x,
# axis=-1)'s bits (tests/test_compile.py checks every row length). And the embedding loops'
# bounds check of their indices (eager's IndexError).
ROW_HELPERS = """@njit(inline='always', **_J)
def _rows_in_range(idx, n):
    for k in range(idx.size):
        if idx[k] < 0 or idx[k] >= n:
            raise IndexError("index out of range in self")


@njit(inline='always', **_J)
def _row_sum_pw(x, i, c, zero):
    if c < 8:
        res = zero
        for j in range(c):
            res += x[i, j]
        return res
    r0, r1, r2, r3 = x[i, 0], x[i, 1], x[i, 2], x[i, 3]
    r4, r5, r6, r7 = x[i, 4], x[i, 5], x[i, 6], x[i, 7]
    j = 8
    end = c - c % 8
    while j < end:
        r0 += x[i, j]
        r1 += x[i, j + 1]
        r2 += x[i, j + 2]
        r3 += x[i, j + 3]
        r4 += x[i, j + 4]
        r5 += x[i, j + 5]
        r6 += x[i, j + 6]
        r7 += x[i, j + 7]
        j += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while j < c:
        res += x[i, j]
        j += 1
    return zero + res
"""
# relu alone (no run of elementwise ops to fuse): NumPy's maximum(x, 0) and g * (y > 0)
# take 7 and 6 µs on 64x256 float32, these loops 1.4 and 2 (the same values: -0.0 and 0
# give 0, NaN stays NaN, and the mask multiplies as eager's does)
LOOPS["relu_rows"] = """@njit(**_J)
def relu_rows(x, out):
    n, m = out.shape
    for i in range(n):
        for j in range(m):
            v = x[i, j]
            out[i, j] = 0 if v <= 0 else v
    return out
"""
LOOPS["relu_rows_b"] = """@njit(**_J)
def relu_rows_b(g, y, out):
    n, m = out.shape
    for i in range(n):
        for j in range(m):
            out[i, j] = g[i, j] * (1 if y[i, j] > 0 else 0)
    return out
"""
# nn.Linear + relu with the product column-major (codegen._transposed_products): the bias
# add (NumPy: 4.6 µs on a column-major 64x256) and the relu in one pass over its columns
LOOPS["bias_relu_rows"] = """@njit(**_J)
def bias_relu_rows(h, b, out):
    n, m = h.shape
    for i in range(n):
        bi = b[i]
        for j in range(m):
            v = h[i, j] + bi
            h[i, j] = v
            out[i, j] = 0 if v <= 0 else v
    return out
"""
# exact GELU (float32, from FUSED_MIN elements: where eager runs the CPU backend's loops):
# the forward also keeps what the backward needs, so the backward is one cheap pass instead
# of eager's three (erf again, NumPy's exp, the combination). Same float32 operations in the
# same order as the backend's gelu_f32 / gelu_b_prep_f32 / gelu_b_f32 (bit for bit; the
# forward is the backend's own erf_f32_rows in its GELU_SAVE mode): c is the backward's
# (1 + erf) / 2, a becomes exp(-(x * x) / 2) by NumPy's exp in place.
# FMA contraction only where the backend allows it (the forward: erf's polynomials; the
# backward's c + x * (...) must not contract).
LOOPS["gelu_save"] = """@njit(**_JC)
def gelu_save(x, out, c, a):
    n = x.size
    for g in range((n + _ERF_GROUP - 1) // _ERF_GROUP):
        lo = np.uint64(g * _ERF_GROUP)
        hi = np.uint64(min(g * _ERF_GROUP + _ERF_GROUP, n))
        _erf_f32_rows(x, _GELU_H, lo, hi, _GELU_SAVE, out, c, a)
"""
LOOPS["gelu_saved_b"] = """@njit(**_J)
def gelu_saved_b(g, x, c, ex, out):
    for i in range(x.size):
        out[i] = g[i] * (c[i] + x[i] * (_GELU_PDF * ex[i]))
"""

# embedding (no padding row, no frequency scaling): eager's forward is NumPy's take of the
# rows after its bounds check (two reductions), its backward the CPU backend's zeros +
# scatter_add_rows; called through the op's stanza and node they cost 74 and 72 µs on the
# GPT's 256 rows of 64 under load. Here one check-then-copy pass, and zeros + the serial
# scatter-add in index order (repeated rows add up in eager's order, the same float adds:
# bit for bit). An index out of range raises eager's IndexError before anything is written
# (the forward's check; the backward checks again so that no index can write outside its
# buffer, whatever reaches it).
LOOPS["embedding_rows"] = """@njit(**_J)
def embedding_rows(w, idx, out):
    n, m = w.shape
    _rows_in_range(idx, n)
    for k in range(idx.size):
        r = idx[k]
        for j in range(m):
            out[k, j] = w[r, j]
    return out
"""
LOOPS["embedding_rows_b"] = """@njit(**_J)
def embedding_rows_b(g, idx, out):
    n, m = out.shape
    _rows_in_range(idx, n)
    for r in range(n):
        for j in range(m):
            out[r, j] = 0
    for k in range(idx.size):
        r = idx[k]
        for j in range(m):
            out[r, j] += g[k, j]
    return out
"""


def _gelu_prelude(kernels) -> list[str]:
    """The backend's erf and GELU constants for the GELU loops, and its row max; the hash
    of their source (``erf_f32_rows`` and every helper it inlines, ``_max4``) names the
    module (Numba's cache of the loops does not see a change in a callee)."""
    import hashlib
    import inspect

    text = "".join(inspect.getsource(f.py_func)
                   for f in (kernels.erf_f32_rows, kernels._erf_put, kernels.erf_small,
                             kernels.erf_mid, kernels.erf_tail, kernels.erf_full,
                             kernels.erf_near))
    text += inspect.getsource(kernels._max4.py_func)  # log_softmax_shift's row max
    text += f"{kernels.ERF_GROUP} {kernels._NEAR} {kernels.GELU_SAVE}"
    digest = hashlib.sha1(text.encode()).hexdigest()
    return [f"# backend callees: {digest[:16]}",
            "from symgrad.backends.cpu.kernels import erf_f32_rows as _erf_f32_rows",
            "from symgrad.backends.cpu.kernels import ERF_GROUP as _ERF_GROUP",
            "from symgrad.backends.cpu.kernels import GELU_SAVE as _GELU_SAVE",
            "from symgrad.backends.cpu.kernels import _F32_GELU_PDF as _GELU_PDF",
            "from symgrad.backends.cpu.kernels import _F32_HALF_SQRT2 as _GELU_H",
            "from symgrad.backends.cpu.kernels import _max4",
            "_JC = dict(_J, fastmath={'contract'})", ""]


_LOOPS_MODULE = None


def loops():
    """LOOPS and the optimizer updates (UPDATE_KERNELS) as one module every generated step
    imports them from. Their text is fixed by this file, not by a step, so the module
    lives where the CPU backend keeps its own generated loops (next to its kernels, or its
    private ``NUMBA_CACHE_DIR``), not in the compile cache: Numba compiles each loop once
    per installation and dtype, and a first compile with an empty compile cache loads them
    (LeNet's first call spent 3 of its 3.4 s compiling these seven loops again)."""
    global _LOOPS_MODULE
    if _LOOPS_MODULE is None:
        from .._codefiles import import_text
        from ..backends.cpu import kernels

        base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
            os.path.dirname(os.path.abspath(kernels.__file__)), "__pycache__")
        text = "\n".join(['"""fuse.LOOPS: single-op loops the generated steps share."""',
                          "import numpy as np", "", *PRELUDE, *_gelu_prelude(kernels),
                          ROW_HELPERS,
                          *LOOPS.values(), _UPDATE_PRELUDE,
                          *UPDATE_KERNELS.values()])
        _LOOPS_MODULE = import_text(text, os.path.join(base, "symgrad_generated"),
                                    "symgrad_loops")
    return _LOOPS_MODULE


def loop_import(name: str) -> str:
    """The generated module's line binding LOOPS' ``name`` from the shared module."""
    return (f"from symgrad.compile.fuse import loops as _loops  # noqa: E402\n"
            f"{name} = _loops().{name}\n")


#: their argument kinds (A: 2-D array, I: 1-D int64 array, a: 1-D array)
LOOP_CODES = {"log_softmax_sums": "AsA", "log_softmax_rows_b": "AAsA", "nll_rows": "AIiba",
              "nll_rows_b": "sIibsA", "relu_rows": "AA", "relu_rows_b": "AAA",
              "bias_relu_rows": "AaA", "gelu_save": "aaaa", "gelu_saved_b": "aaaaa",
              "log_softmax_shift": "AA",
              "embedding_rows": "AIA", "embedding_rows_b": "AIA"}


# -- fused backward --------------------------------------------------------------------------
_LOCAL = {"add": ("{g}", "{g}"), "sub": ("{g}", "-{g}"), "mul": ("{g} * {b}", "{g} * {a}"),
          "div": ("{g} / {b}", "-{g} * {a} / ({b} * {b})")}


def backward_kernel(group: Group, seeds: list, need: set, helpers: dict, name: str):
    """Kernel text for the backward of ``group`` and its parameter order.

    ``seeds``: the group's values with a gradient from outside (later ops), ``need``: value
    indices that want a gradient. Per element it walks the group's ops in reverse with the
    stanzas' ``Scalar.grad`` (and the arithmetic's partials), summing into locals, and
    writes the gradients of the group's inputs. Returns (lines, outputs) where outputs are
    the group inputs whose gradient it writes."""
    dt = group.calls[0].outputs[0].dtype.name
    outputs = [x for x in group.inputs if x.index in need]
    made = [c.outputs[0] for c in group.calls]
    params = ([f"i{v.index}" for v in group.inputs] + [f"o{v.index}" for v in made]
              + [f"e{v.index}" for v in seeds] + [f"r{v.index}" for v in outputs])
    head = _head(name, params, group.calls, f"o{made[0].index}")
    lines = head[:2] + [f"    s{v.index} = 1 if e{v.index}.size > 1 else 0" for v in seeds]
    lines.append(head[2])
    body = [f"t{v.index} = i{v.index}[k]" for v in group.inputs]
    body += [f"t{v.index} = o{v.index}[k]" for v in made]
    acc = set()
    for v in seeds:
        body.append(f"a{v.index} = e{v.index}[k * s{v.index}]")
        acc.add(v.index)
    for c in reversed(group.calls):
        y = c.outputs[0]
        if y.index not in acc:
            continue
        g = f"a{y.index}"
        ops = [f"t{x.index}" if isinstance(x, Value) else f"np.{dt}({float(x)!r})"
               for x in c.inputs]
        for pos, x in enumerate(c.inputs):
            if not isinstance(x, Value) or x.index not in need:
                continue
            if c.spec.name in _LOCAL:
                expr = _LOCAL[c.spec.name][pos].format(g=g, a=ops[0],
                                                        b=ops[1] if len(ops) > 1 else "")
            elif c.spec.name == "pow":  # the stanza's rule: 0 for exponent 0
                e = c.params["exponent"]
                expr = (f"{g} * np.{dt}(0.0)" if e == 0 else
                        f"{g} * np.{dt}({float(e)!r}) * ({_power(ops[0], e - 1, dt)})")
            else:
                fname = f"sb_{c.spec.name}"
                if fname not in helpers:
                    helpers[fname] = "@njit(inline='always', **_J)\n" + source(
                        fname, ("g", "x", "y"), c.spec.scalar.grad, rename=_RENAME)
                expr = f"{fname}({g}, {ops[0]}, t{y.index})"
            a = f"a{x.index}"
            body.append(f"{a} = {a} + ({expr})" if x.index in acc else f"{a} = {expr}")
            acc.add(x.index)
    for x in outputs:
        body.append(f"r{x.index}[k] = a{x.index}" if x.index in acc else f"r{x.index}[k] = 0")
    lines += [f"        {b}" for b in body]
    return lines + ["", ""], outputs
