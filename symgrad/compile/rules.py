"""Compile rules: each op's forward and backward as NumPy code text.

Forward: a few ops get ``out=`` forms into preallocated buffers (BLAS matmuls, the
elementwise arithmetic); every other op calls its own stanza's forward on arrays (the
exact eager kernel, no Tensor), so the forward of any registered op compiles. Backward:
one rule per op below, written from the stanza's formula; unary elementwise ops read
theirs from ``OpSpec.scalar.grad`` directly; the several-output ops (split, unbind) have
``multi_backward_code``, which takes every output's gradient at once. An op on the
gradient path without a rule makes ``sg.compile`` fall back to eager, naming the op.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..ops._ints import norm, norms, s64
from .graph import OpCall, Value
from .runtime import MATH, scalar_names, view_grad_ok

__all__ = ["forward_code", "backward_code", "has_backward", "multi_backward_code",
           "formulas_rule", "rule_kind",
           "ufunc_forward", "BROADCASTING", "UFUNCS", "UNARY_UFUNCS", "MULTI_OUTPUT"]

#: op -> inputs whose gradient has the output's shape and is summed back to the input's
BROADCASTING = {"add": "all", "sub": "all", "mul": "all", "div": "all",
                "addmm": (0,), "copy_": (1,), "masked_fill": (0,), "masked_fill_tensor": (0,)}
#: the binary ops with a NumPy ufunc taking ``out=``
UFUNCS = {"add": "np.add", "sub": "np.subtract", "mul": "np.multiply", "div": "np.divide"}
#: unary stanza ops with a NumPy ufunc taking ``out=`` (others run their stanza forward)
UNARY_UFUNCS = {"tanh": "np.tanh", "exp": "np.exp", "log": "np.log", "neg": "np.negative",
                "sqrt": "np.sqrt", "abs": "np.abs", "sin": "np.sin", "cos": "np.cos"}


#: elements from which relu runs as fuse.LOOPS' loops (fuse.py: 5x faster than NumPy on
#: 64x256; below, NumPy's calls cost about what a loop's call does, and no Numba compile)
LOOP_MIN = 4096


def _same_dtype(call: OpCall) -> bool:
    dts = {v.dtype for v in call.tensor_inputs} | {call.outputs[0].dtype}
    return len(dts) == 1 and call.outputs[0].dtype.kind == "f"


def ufunc_forward(call: OpCall) -> bool:
    """Does forward_code write ``call`` as one NumPy ufunc into its output's buffer (so a
    column-major input gives a column-major output, without a copy)?"""
    name = call.spec.name
    if not (_same_dtype(call) and len(call.outputs) == 1):
        return False
    if name in UFUNCS:
        return call.params.get("alpha", 1) == 1 and len(call.inputs) == 2
    return name in UNARY_UFUNCS or name == "relu"


def gelu_saves(call: OpCall, ctx) -> bool:
    """Exact GELU where eager runs the CPU backend's float32 loops (from FUSED_MIN
    elements) and its gradient is wanted: the forward loop keeps what the backward needs
    (fuse.LOOPS' gelu_save / gelu_saved_b: eager's float32 operations, bit for bit)."""
    from ..backends.cpu.backend import FUSED_MIN

    out = call.outputs[0]
    x = call.inputs[0] if call.inputs else None
    return (getattr(ctx, "gelu_saved", None) is not None and isinstance(x, Value)
            and len(call.outputs) == 1 and out.requires_grad
            and call.params.get("approximate", "none") == "none"
            and set(call.params) <= {"approximate"}
            and x.dtype == np.float32 and out.dtype == np.float32
            and tuple(x.shape) == tuple(out.shape) and _numel(out.shape) >= FUSED_MIN)


def layer_norm_rows(call: OpCall, ctx) -> tuple | None:
    """(rows, row length) when ``native_layer_norm`` runs as the CPU backend's row kernels
    called straight from the generated code, forward and backward: where eager's backend
    runs those kernels (its ``layer_norm`` and ``native_layer_norm_backward`` take it),
    so the same kernels on the same arrays give eager's bits, without the op's forward,
    its node's backward and their checks around them (~45 µs a call in a GPT step's loop,
    caches cold: 11 calls, ~0.5 ms of its ~7). Else None."""
    from ..backends.cpu import backend as cpu

    if call.spec.name != "native_layer_norm" or getattr(
            type(ctx.backend), "layer_norm", None) is not cpu.CpuBackend.layer_norm:
        return None
    x, *params = call.inputs
    shape = tuple(call.params.get("normalized_shape", ()))
    if not isinstance(x, Value) or x.dtype not in (np.float32, np.float64) or len(
            call.outputs) != 3 or any(o.dtype != x.dtype for o in call.outputs) or not shape \
            or tuple(x.shape[len(x.shape) - len(shape):]) != shape or len(x.shape) < len(shape):
        return None
    m = _numel(shape)
    n = _numel(x.shape) // m if m else 0
    if not m or n * m < cpu.FUSED_MIN or tuple(call.outputs[0].shape) != tuple(x.shape):
        return None
    for p in params:
        if p is not None and not (isinstance(p, Value) and p.dtype == x.dtype
                                  and _numel(p.shape) == m):
            return None
    return n, m


def layer_norm_operands(call: OpCall, ctx, n: int, m: int) -> tuple[str, str, str]:
    """(the kernels' runner, their weight operand, the (row length, eps, one) constants in
    the dtype) for layer_norm_rows' code, forward and backward."""
    from ..backends.cpu import backend as cpu

    x, i = call.inputs[0], call.outputs[0].index
    dt = x.dtype.name
    k = f"lnk{i}"
    ctx.alloc(f"{k} = (np.{dt}({m}), np.{dt}({float(call.params['eps'])!r}), np.{dt}(1))")
    return ctx.bind(cpu._run, "krun"), _row_param(call, 1, ctx, m), k


def _row_param(call: OpCall, pos: int, ctx, m: int) -> str:
    """Layer norm's weight (pos 1) or bias (2) as the kernels read it (the backend's
    _row_param): flat and C-contiguous, or a dummy of one zero when absent."""
    p = call.inputs[pos]
    if isinstance(p, Value):
        return f"np.ascontiguousarray({p.name}).reshape({m})"
    name = f"lnz{call.outputs[0].index}"
    ctx.alloc(f"{name} = np.zeros(1, np.{call.inputs[0].dtype.name})")
    return name


def _layer_norm_forward(call: OpCall, ctx, n: int, m: int) -> list[str]:
    x, w, b = call.inputs
    y, mean, rstd = call.outputs
    run, weight, k = layer_norm_operands(call, ctx, n, m)
    bias = _row_param(call, 2, ctx, m)
    yb, mb, rb = ctx.buf(y), ctx.buf(mean), ctx.buf(rstd)
    for name, shape in ((yb, f"{n}, {m}"), (mb, f"{n}"), (rb, f"{n}")):
        ctx.alloc(f"{name}r = {name}.reshape({shape})")
    return [f"{run}('layer_norm_rows', {n * m}, np.ascontiguousarray({x.name}).reshape({n}, "
            f"{m}), {weight}, {bias}, {isinstance(w, Value)}, {isinstance(b, Value)}, *{k}, "
            f"{yb}r, {mb}r, {rb}r)",
            f"{y.name}, {mean.name}, {rstd.name} = {yb}, {mb}, {rb}"]


def forward_code(call: OpCall, ctx) -> list[str]:
    """Lines computing ``call``'s outputs into their names."""
    name = call.spec.name
    out = call.outputs[0]
    ins = [ctx.ref(x) for x in call.inputs]
    if _same_dtype(call) and len(call.outputs) == 1:
        p = call.params
        keep = ctx.tprod.get(out.index)
        if keep is not None:  # x @ W.t() formed as W @ x.T (codegen._transposed_products)
            b = ctx.buf(out)
            t = f"t{out.index}"
            ctx.alloc(f"{t} = {b}.T" if keep else
                      f"{t} = np.empty({out.shape[::-1]!r}, np.{out.dtype.name})")
            lines = [f"np.matmul({ins[-1]}.T, {ins[-2]}.T, out={t})"]
            relu = ctx.epilogue.get(out.index)
            if relu is not None:  # bias add and relu in one loop; the relu's code is this
                ctx.written.add(id(relu))
                k = ctx.loop_kernel("bias_relu_rows", out.dtype.name)
                return lines + [f"{k}({t}, {ins[0]}, {ctx.buf(relu.outputs[0])}.T)",
                                f"{out.name} = {b}"]
            if name == "addmm":
                src = b if keep else f"{t}.T"
                return lines + [f"{out.name} = np.add({src}, {ins[0]}, out={b})"]
            return lines + ([] if keep else [f"np.copyto({b}, {t}.T)"]) + [f"{out.name} = {b}"]
        if name == "addmm" and p.get("alpha", 1) == 1 and p.get("beta", 1) == 1:
            b = ctx.buf(out)
            return [f"np.matmul({ins[1]}, {ins[2]}, out={b})",
                    f"{out.name} = np.add({b}, {ins[0]}, out={b})"]
        if name == "mm":
            b = ctx.buf(out)
            return [f"{out.name} = np.matmul({ins[0]}, {ins[1]}, out={b})"]
        if name == "relu" and ufunc_forward(call) and _numel(out.shape) >= LOOP_MIN:
            b = ctx.buf(out)
            k = ctx.loop_kernel("relu_rows", out.dtype.name)
            return [f"{k}({ctx.rows(out, ins[0])}, {ctx.rows(out, b, True)})",
                    f"{out.name} = {b}"]
        if ufunc_forward(call):
            f = {**UFUNCS, **UNARY_UFUNCS, "relu": "np.maximum"}[name]
            args = ins[:2] if name in UFUNCS else [ins[0], "0"] if name == "relu" else ins[:1]
            return [f"{out.name} = {f}({', '.join(args)}, out={ctx.buf(out)})"]
    rows = layer_norm_rows(call, ctx)
    if rows is not None:
        return _layer_norm_forward(call, ctx, *rows)
    view = _view_code(call, ins[0] if ins else "")
    if view is not None:
        return [f"{out.name} = {view}"]
    pieces = _split_code(call, ins[0] if ins else "")
    if pieces is not None:
        return pieces
    if name == "gelu" and gelu_saves(call, ctx):
        # the loop also keeps the backward's (1 + erf) / 2 and exp(-(x * x) / 2)
        b, c, a = f"gl{out.index}", f"gc{out.index}", f"ga{out.index}"
        n = _numel(out.shape)
        ctx.alloc(f"{b} = np.empty({out.shape!r}, np.float32)")
        ctx.alloc(f"{c} = np.empty({n}, np.float32)")
        ctx.alloc(f"{a} = np.empty({n}, np.float32)")
        ctx.gelu_saved[out.index] = (c, a)
        k = ctx.loop_kernel("gelu_save", "float32")
        return [f"{k}(np.ascontiguousarray({ins[0]}).reshape(-1), {b}.reshape(-1), {c}, {a})",
                f"np.exp({a}, out={a})", f"{out.name} = {b}"]
    if name == "log_softmax" and _rows_ok(call):  # eager's operations, eager's bits
        dt, b = out.dtype.name, ctx.buf(out)
        e, sums, zero = f"le{out.index}", f"ls{out.index}", f"lz{out.index}"
        ctx.alloc(f"{e} = np.empty({out.shape!r}, np.{dt})")
        ctx.alloc(f"{sums} = np.empty(({out.shape[0]}, 1), np.{dt})")
        ctx.alloc(f"{zero} = np.{dt}(0)")
        shift, total = ctx.loop_kernel("log_softmax_shift", dt), ctx.loop_kernel(
            "log_softmax_sums", dt)
        return [f"{shift}({ins[0]}, {b})", f"np.exp({b}, out={e})",
                f"{total}({e}, {zero}, {sums})", f"np.log({sums}, out={sums})",
                f"{out.name} = np.subtract({b}, {sums}, out={b})"]
    if name == "nll_loss" and _nll_rows_ok(call):
        k = ctx.loop_kernel("nll_rows", out.dtype.name)
        p = call.params
        n = f"n{out.index}"
        ctx.alloc(f"{n} = np.empty(2, np.{out.dtype.name})")
        for j in range(len(call.outputs)):
            ctx.alloc(f"{n}_{j} = {n}[{j}:{j + 1}].reshape(())")
        return [f"{k}({ins[0]}, {ctx.ref(p['target'])}, {ctx.ref(p.get('ignore_index', -100))}, "
                f"{p.get('reduction', 1) == 1}, {n})",
                *(f"{v.name} = {n}_{j}" for j, v in enumerate(call.outputs))]
    if name == "embedding" and embedding_ok(call):
        # the rows as one checked copy into a buffer (fuse.LOOPS' embedding_rows)
        idx, m = call.params["indices"], call.inputs[0].shape[1]
        b = ctx.buf(out)
        ctx.alloc(f"{b}r = {b}.reshape({_numel(idx.shape)}, {m})")
        k = ctx.loop_kernel("embedding_rows", out.dtype.name)
        return [f"{k}({ins[0]}, {ctx.ref(idx)}.reshape(-1), {b}r)", f"{out.name} = {b}"]
    if name == "mse_loss" and _same_dtype(call) and call.params.get("reduction", 1) == 1:
        # eager: be.mean(be.mul(d, d)); np.mean is add.reduce / n, spelled without its
        # Python wrapper
        d = f"d{out.index}"
        ctx.alloc(f"{d} = np.empty({call.inputs[0].shape!r}, np.{out.dtype.name})")
        n = _numel(call.inputs[0].shape)
        return [f"np.subtract({ins[0]}, {ins[1]}, out={d})", f"np.multiply({d}, {d}, out={d})",
                f"{out.name} = np.asarray(np.add.reduce({d}, axis=None) / {n})"]
    # generic: the stanza's own forward on arrays, as eager's apply runs it
    fwd = ctx.bind(call.spec.forward, f"fwd_{name}")
    be = ctx.bind(ctx.backend, "be")
    kw = "".join(f", {k}={ctx.ref(v)}" for k, v in call.params.items())
    outs = ", ".join(v.name for v in call.outputs)
    lines = [f"{outs}{',' if len(call.outputs) > 1 else ''} = {fwd}({be}, {', '.join(ins)}{kw})"]
    for v in call.outputs:
        lines.append(f"{v.name} = as_out({v.name}, {ctx.dtype(v)})")
    return lines


_RESHAPES = frozenset({"view", "reshape_alias", "unsafe_view", "unsqueeze", "squeeze",
                       "squeeze_", "squeeze_all", "squeeze_dims", "alias"})


def _view_code(call: OpCall, x: str) -> str | None:
    """Views as NumPy views (eager's backend does the same on arrays), without a call."""
    name, out = call.spec.name, call.outputs[0]
    if not isinstance(call.inputs[0], Value) or out.dtype != call.inputs[0].dtype:
        return None
    if name == "t":
        return f"{x}.T"
    if name in _RESHAPES:
        return f"{x}.reshape({out.shape!r})"
    if name == "expand":
        return f"np.broadcast_to({x}, {out.shape!r})"
    if name in ("transpose", "permute"):  # the backend's x.transpose(axes), axes fixed
        axes = _axes(call)
        return None if axes is None else f"{x}.transpose({axes!r})"
    return None


def _axes(call: OpCall) -> tuple | None:
    """The NumPy axes of a traced transpose / permute (its dims on the traced rank)."""
    from ..ops._ints import norm
    from ..ops.movement import _swap

    n = len(call.inputs[0].shape)
    p = call.params
    try:
        if call.spec.name == "transpose":
            return _swap(n, norm(p["dim0"], n), norm(p["dim1"], n))
        return tuple(norm(d, n) for d in p["dims"])
    except (KeyError, TypeError, IndexError, ValueError):
        return None


def _split_code(call: OpCall, x: str) -> list[str] | None:
    """split / split_with_sizes as NumPy slices of the input (eager's pieces: the same
    basic-indexing views), without the op's call per step."""
    from ..ops._ints import norm
    from ..ops.split import piece_sizes

    name, src = call.spec.name, call.inputs[0]
    if name not in ("split", "split_with_sizes") or not isinstance(src, Value) or any(
            o.dtype != src.dtype for o in call.outputs):
        return None
    p = call.params
    try:
        d = norm(p["dim"], len(src.shape))
        sizes = (piece_sizes(src.shape[d], p["split_size"]) if name == "split"
                 else tuple(p["split_sizes"]))
    except (KeyError, TypeError, IndexError, ValueError):
        return None
    if len(sizes) != len(call.outputs):
        return None
    lines, start = [], 0
    for o, size in zip(call.outputs, sizes):
        key = ", ".join([":"] * d + [f"{start}:{start + size}"])
        lines.append(f"{o.name} = {x}[{key}]")
        start += size
    return lines


# -- backward rules: (call, ctx, g) -> {input position: expression} ------------------------
def _scaled(g: str, k) -> str:
    return g if k == 1 else f"({g} * {k!r})"


def _add(c, ctx, g):
    return {0: g, 1: _scaled(g, c.params.get("alpha", 1))}


def _sub(c, ctx, g):
    return {0: g, 1: f"-{g}" if c.params.get("alpha", 1) == 1 else
            _scaled(g, -c.params["alpha"])}


def _rsub(c, ctx, g):
    return {0: f"-{g}" if c.params.get("alpha", 1) == 1 else _scaled(g, -c.params["alpha"])}


def _mul(c, ctx, g):
    a, b = (ctx.ref(x) for x in c.inputs)
    return {0: f"({g} * {b})", 1: f"({g} * {a})"}


def _div(c, ctx, g):
    a, b = (ctx.ref(x) for x in c.inputs)
    return {0: f"({g} / {b})", 1: f"(-{g} * {a} / ({b} * {b}))"}


def _pow(c, ctx, g):
    e = c.params.get("exponent", c.inputs[1] if len(c.inputs) > 1 else None)
    x = ctx.ref(c.inputs[0])
    if e == 0:
        return {0: f"({g} * 0)"}
    return {0: f"({g} * {e!r} * {x} ** {e - 1!r})"}


def _mat_grads(ctx, g, mat1, mat2) -> tuple[str, str]:
    """d/d mat1 and d/d mat2 of ``mat1 @ mat2``, each laid out like its operand (torch's
    mm_mat1/2_backward): for ``W.t()`` the product is formed transposed, so W's gradient is
    one contiguous BLAS result."""
    a, b = ctx.ref(mat1), ctx.ref(mat2)
    g1 = f"np.matmul({b}, {g}.T).T" if ctx.transposed_view(mat1) else f"np.matmul({g}, {b}.T)"
    g2 = f"np.matmul({g}.T, {a}).T" if ctx.transposed_view(mat2) else f"np.matmul({a}.T, {g})"
    return g1, g2


def _mm(c, ctx, g):
    g1, g2 = _mat_grads(ctx, g, c.inputs[0], c.inputs[1])
    return {0: g1, 1: g2}


def _addmm(c, ctx, g):
    alpha, beta = c.params.get("alpha", 1), c.params.get("beta", 1)
    g1, g2 = _mat_grads(ctx, g, c.inputs[1], c.inputs[2])
    return {0: _scaled(g, beta), 1: _scaled(g1, alpha), 2: _scaled(g2, alpha)}


def _shape_of(c) -> tuple:
    return c.inputs[0].shape


def _sum(c, ctx, g):
    return {0: f"np.broadcast_to({g}, {_shape_of(c)!r})"}


def _keepdim(c, g):
    shape = _shape_of(c)
    if c.params.get("keepdim"):
        return g
    dims = norms(c.params["dim"], len(shape))
    kept = tuple(1 if i in dims else s for i, s in enumerate(shape))
    return f"{g}.reshape({kept!r})"


def _sum_dim(c, ctx, g):
    return {0: f"np.broadcast_to({_keepdim(c, g)}, {_shape_of(c)!r})"}


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _mean(c, ctx, g):
    return {0: f"(np.broadcast_to({g}, {_shape_of(c)!r}) / {_numel(_shape_of(c))})"}


def _mean_dim(c, ctx, g):
    shape = _shape_of(c)
    n = 1
    for d in norms(c.params["dim"], len(shape)):
        n *= shape[d] if shape else 1
    return {0: f"(np.broadcast_to({_keepdim(c, g)}, {shape!r}) / {n})"}


def _reshape(c, ctx, g):
    return {0: f"{g}.reshape({_shape_of(c)!r})"}


def _t(c, ctx, g):
    return {0: f"({g}).T" if not g.isidentifier() else f"{g}.T"}


def _transpose(c, ctx, g):
    n = len(_shape_of(c))
    d0, d1 = norm(c.params["dim0"], n), norm(c.params["dim1"], n)
    return {0: f"np.swapaxes({g}, {d0}, {d1})"}


def _permute(c, ctx, g):
    dims = norms(c.params["dims"], len(_shape_of(c)))
    inv = [0] * len(dims)
    for i, p in enumerate(dims):
        inv[p] = i
    return {0: f"np.transpose({g}, {tuple(inv)!r})"}


def _expand(c, ctx, g):
    return {0: f"sum_to({g}, {_shape_of(c)!r})"}


def _identity(c, ctx, g):
    return {0: g}


def _to_copy(c, ctx, g):
    return {0: f"{g}.astype({ctx.dtype(c.inputs[0])})"}


def _mse(c, ctx, g):
    x, t = (ctx.ref(v) for v in c.inputs)
    r = c.params.get("reduction", 1)
    scale = 2.0 / _numel(_shape_of(c)) if r == 1 else 2.0
    grad = f"(({x} - {t}) * ({g} * {scale!r}))"
    return {0: grad, 1: f"-{grad}"}


def _rows_small(x) -> bool:
    """A non-empty 2-D float array below the CPU backend's PARALLEL_MIN (from there eager
    runs its parallel kernels, which compile keeps)."""
    from ..backends.cpu import backend as cpu

    return isinstance(x, Value) and len(x.shape) == 2 and 0 < x.shape[0] * x.shape[1] < \
        cpu.PARALLEL_MIN and x.dtype in (np.float32, np.float64)


def _rows_ok(c) -> bool:
    """log_softmax over the last dim of a small 2-D array, rows of at most one pairwise
    block: fuse.LOOPS' row loops."""
    from .fuse import PAIRWISE_BLOCK

    x, out = c.inputs[0], c.outputs[0]
    return _rows_small(x) and out.dtype == x.dtype and norm(c.params["dim"], 2) == 1 and \
        x.shape[1] <= PAIRWISE_BLOCK


def _nll_rows_ok(c) -> bool:
    """nll_loss (mean or sum, no class weights) of a small 2-D input, int64 targets."""
    x, t = c.inputs[0], c.params.get("target")
    return _nll_ok(c) and _rows_small(x) and c.params.get("reduction", 1) in (1, 2) and \
        c.outputs[0].dtype == x.dtype and t.dtype == np.int64 and t.shape == x.shape[:1]


def _log_softmax(c, ctx, g):
    y = c.outputs[0].name
    if not c.outputs[0].shape:
        return {0: f"({g} * 0)"}
    if _rows_ok(c):  # one buffer per call site (two calls' gradients may meet in a sum)
        out = c.outputs[0]
        dt = out.dtype.name
        b, e, zero = f"gl{out.index}", f"lb{out.index}", f"lbz{out.index}"
        ctx.alloc(f"{b} = np.empty({out.shape!r}, np.{dt})")
        ctx.alloc(f"{e} = np.empty({out.shape!r}, np.{dt})")
        ctx.alloc(f"{zero} = np.{dt}(0)")
        k = ctx.loop_kernel("log_softmax_rows_b", dt)
        return {0: f"{k}({g}, np.exp({y}, out={e}), {zero}, {b})"}
    d = norm(c.params["dim"], len(c.outputs[0].shape))
    return {0: f"({g} - np.exp({y}) * {g}.sum(axis={d}, keepdims=True))"}


def _softmax(c, ctx, g):
    y = c.outputs[0].name
    if not c.outputs[0].shape:
        return {0: f"({g} * 0)"}
    d = norm(c.params["dim"], len(c.outputs[0].shape))
    return {0: f"(({g} - ({g} * {y}).sum(axis={d}, keepdims=True)) * {y})"}


def _nll(c, ctx, g):
    p = c.params
    shape = _shape_of(c)
    if _nll_rows_ok(c):
        x = c.inputs[0]
        b = f"gn{c.outputs[0].index}"
        ctx.alloc(f"{b} = np.empty({shape!r}, np.{x.dtype.name})")
        k = ctx.loop_kernel("nll_rows_b", x.dtype.name)
        return {0: f"{k}({g}[()], {ctx.ref(p['target'])}, {ctx.ref(p.get('ignore_index', -100))}, "
                   f"{p.get('reduction', 1) == 1}, {c.outputs[1].name}[()], {b})"}
    return {0: f"nll_grad({g}, {shape!r}, {ctx.dtype(c.inputs[0])}, {ctx.ref(p['target'])}, "
               f"{p.get('reduction', 1)}, {p.get('ignore_index', -100)}, "
               f"{c.outputs[1].name})"}


def embedding_ok(c) -> bool:
    """F.embedding's plain case (no padding row, no frequency scaling, dense) of a 2-D
    float32/float64 weight with int64 indices: its rows copied and its gradient scattered
    by fuse.LOOPS' embedding_rows / embedding_rows_b (eager's bounds check, copy and
    index-order scatter-add); anything else runs the op's forward and node backward."""
    p, w, out = c.params, c.inputs[0], c.outputs[0]
    idx = p.get("indices")
    try:
        plain = s64(p["padding_idx"]) < 0 and not p["scale_grad_by_freq"] and not p["sparse"]
    except (KeyError, TypeError, ValueError):
        return False
    return plain and isinstance(w, Value) and isinstance(idx, Value) and len(w.shape) == 2 \
        and w.dtype in (np.float32, np.float64) and out.dtype == w.dtype \
        and idx.dtype == np.int64 and p.get("weight_sym_argsize_0") == w.shape[0] \
        and tuple(out.shape) == tuple(idx.shape) + (w.shape[1],)


def _embedding(c, ctx, g):
    """EmbeddingBackward0 (plain case): zeros, then the gradient's rows added at the
    indices in index order, as the CPU backend's kernel (one buffer per call site: two
    calls' gradients may meet in a sum, as a tied weight's)."""
    w, idx = c.inputs[0], c.params["indices"]
    b = f"ge{c.outputs[0].index}"
    ctx.alloc(f"{b} = np.empty({tuple(w.shape)!r}, np.{w.dtype.name})")
    k = ctx.loop_kernel("embedding_rows_b", w.dtype.name)
    rows = f"np.ascontiguousarray({g}).reshape({_numel(idx.shape)}, {w.shape[1]})"
    return {0: f"{k}({rows}, {ctx.ref(idx)}.reshape(-1), {b})"}


def _nll_ok(c) -> bool:
    return len(_shape_of(c)) == 2 and c.params.get("weight") is None and \
        isinstance(c.params.get("target"), Value)


def _scalar_rule(c, ctx, g):
    """Any op with a ``Scalar`` stanza: its ``grads`` texts, on arrays (broadcast gradients
    are summed back by the caller)."""
    sc = c.spec.scalar
    args = ", ".join([ctx.ref(x) for x in c.inputs] + [c.outputs[0].name]
                     + [ctx.ref(c.params[p]) for p in sc.params])
    return {i: f"{ctx.scalar_grad(c.spec, i)}({g}, {args})"
            for i, text in enumerate(sc.grads) if text is not None}


def _relu(c, ctx, g):
    """The stanza's ``g * (y > 0)`` as fuse.LOOPS' relu_rows_b, into a buffer of this
    call site's, laid out like ``y``."""
    y = c.outputs[0]
    if not _same_dtype(c) or _numel(y.shape) < LOOP_MIN:
        return _scalar_rule(c, ctx, g)
    b = f"gr{y.index}"
    order = ", order='F'" if y.index in ctx.fortran else ""
    ctx.alloc(f"{b} = np.empty({y.shape!r}, np.{y.dtype.name}{order})")
    k = ctx.loop_kernel("relu_rows_b", y.dtype.name)
    loop = f"{k}({ctx.rows(y, g)}, {ctx.rows(y, y.name)}, {ctx.rows(y, b, True)})"
    return {0: f"{loop}.T" if y.index in ctx.fortran else f"{loop}.reshape({y.shape!r})"}


def _clamp(c, ctx, g):
    x = ctx.ref(c.inputs[0])
    lo, hi = c.params.get("min"), c.params.get("max")
    masks = ([f"({x} >= {ctx.ref(lo)})"] if lo is not None else []) + \
        ([f"({x} <= {ctx.ref(hi)})"] if hi is not None else [])
    return {0: f"({g} * ({' & '.join(masks)}))"}


def _cat(c, ctx, g):
    sizes = c.params["_sizes"]
    d = norm(c.params["dim"], len(c.outputs[0].shape))
    out, start = {}, 0
    for i, n in enumerate(sizes):
        if n is None:  # an empty 1-D input the legacy rule skipped: an empty gradient
            x = c.inputs[i]
            out[i] = f"np.zeros({x.shape!r}, {ctx.dtype(x)})"
            continue
        region = (slice(None),) * d + (slice(start, start + n),)
        out[i] = f"{g}[{ctx.ref(region)}]"
        start += n
    return out


def _stack(c, ctx, g):
    d = norm(c.params["dim"], len(c.outputs[0].shape))
    return {i: f"np.take({g}, {i}, axis={d})" for i in range(len(c.inputs))}


def _view_grad(c, ctx, g):
    x = c.inputs[0]
    fwd, be = ctx.bind(c.spec.forward, f"fwd_{c.spec.name}"), ctx.bind(ctx.backend, "be")
    return {0: f"view_grad({fwd}, {be}, {x.shape!r}, {ctx.dtype(x)}, {g}, "
               f"{ctx.bind(dict(c.params), 'kw')})"}


def _mv(c, ctx, g):
    a, v = (ctx.ref(x) for x in c.inputs)
    return {0: f"np.outer({g}, {v})", 1: f"np.matmul({a}.T, {g})"}


def _dot(c, ctx, g):
    a, b = (ctx.ref(x) for x in c.inputs)
    return {0: f"({g} * {b})", 1: f"({g} * {a})"}


def _bmm(c, ctx, g):
    a, b = (ctx.ref(x) for x in c.inputs)
    return {0: f"np.matmul({g}, np.swapaxes({b}, 1, 2))",
            1: f"np.matmul(np.swapaxes({a}, 1, 2), {g})"}


def _zeros(c, ctx, g):
    """A constant's gradient (zero_, fill_, the in-place comparisons): zeros, made without
    multiplying (``g * 0`` would turn an infinite gradient into NaN), as eager's formula."""
    return {i: f"np.zeros({x.shape!r}, {ctx.dtype(x)})" for i, x in enumerate(c.inputs)
            if isinstance(x, Value)}


def _fill_tensor(c, ctx, g):
    return {**_zeros(c, ctx, g), 1: f"np.asarray({g}.sum())"}


def _copy(c, ctx, g):
    """``t.copy_(src)`` (in place: a new value from src): src's gradient is the incoming one
    (summed back to src's shape by the caller), t's old values get zeros."""
    return {**_zeros(c, ctx, g), 1: g}


def _masked_fill(c, ctx, g):
    mask = ctx.ref(c.params["mask"])
    out = {0: f"np.where({mask}, 0, {g})"}
    if len(c.inputs) > 1:  # masked_fill_tensor: the 0-dim value gets the masked positions'
        out[1] = f"np.asarray(np.where({mask}, {g}, 0).sum())"
    return out


RULES: dict[str, Callable] = {
    "add": _add, "sub": _sub, "rsub": _rsub, "mul": _mul, "div": _div, "pow": _pow,
    "mm": _mm, "addmm": _addmm, "sum": _sum, "sum_dim": _sum_dim, "mean": _mean,
    "mean_dim": _mean_dim, "t": _t, "transpose": _transpose, "permute": _permute,
    "expand": _expand, "clone": _identity, "alias": _identity, "to_copy": _to_copy,
    "mse_loss": _mse, "log_softmax": _log_softmax, "softmax": _softmax, "nll_loss": _nll,
    "mv": _mv, "dot": _dot, "bmm": _bmm, "clamp": _clamp, "relu": _relu,
    "embedding": _embedding,
    "clamp_min": lambda c, ctx, g: {0: f"({g} * ({ctx.ref(c.inputs[0])} >= "
                                       f"{ctx.ref(c.params['min'])}))"},
    "clamp_max": lambda c, ctx, g: {0: f"({g} * ({ctx.ref(c.inputs[0])} <= "
                                       f"{ctx.ref(c.params['max'])}))"},
    "mul_scalar": lambda c, ctx, g: {0: _scaled(g, c.params.get("other", c.inputs[-1]))},
    "div_scalar": lambda c, ctx, g: {0: f"({g} / {c.params.get('other', c.inputs[-1])!r})"},
}
for _name in ("view", "reshape_alias", "unsafe_view", "unsqueeze", "squeeze", "squeeze_",
              "squeeze_all", "squeeze_dims"):
    RULES[_name] = _reshape
# the ops in-place methods record (zero_, fill_, copy_, masked_fill_, gt_ ...: the tracer
# records ``t.<op>_()`` as the op out of place, see trace.py)
RULES.update({"zero_": _zeros, "fill_": _zeros, "fill_tensor_": _fill_tensor, "copy_": _copy,
              "masked_fill": _masked_fill, "masked_fill_tensor": _masked_fill})
for _name in ("gt", "ge", "lt", "le", "eq", "ne"):
    RULES[f"{_name}_"] = RULES[f"{_name}_tensor_"] = _zeros


#: view ops whose gradient is ``view_grad`` (probed per call site by ``view_grad_ok``)
_VIEW_GRAD = frozenset({"slice", "select"})


# -- ops with several outputs (one node: split, split_with_sizes, unbind) -------------------
#: op -> how the pieces' gradients join into the input's: along the op's dim
MULTI_OUTPUT = {"split": "np.concatenate", "split_with_sizes": "np.concatenate",
                "unsafe_split": "np.concatenate", "unsafe_split_with_sizes": "np.concatenate",
                "unbind": "np.stack"}


def multi_backward_code(call: OpCall, ctx, grads: list) -> dict[int, str]:
    """The input's gradient of a several-output op from its outputs' gradients (``None``
    where an output got none): torch's split_backward / unbind_backward, a concatenate
    (stack for unbind) with zeros in the unused pieces' places."""
    x = call.inputs[0]
    d = norm(call.params.get("dim", 0), len(x.shape))
    parts = [g if g is not None else ctx.bind(np.zeros(v.shape, v.dtype), f"Z{v.index}")
             for g, v in zip(grads, call.outputs)]
    if MULTI_OUTPUT[call.spec.name] == "np.concatenate" and isinstance(x, Value) and \
            x.kind == "op" and all(v.dtype == x.dtype for v in call.outputs):
        # into a buffer of make(), each piece without its reshape's copy (runtime.cat_into);
        # an op's value only: a leaf's or an argument's gradient may become its .grad
        b = f"gcat{x.index}"
        ctx.alloc(f"{b} = np.empty({tuple(x.shape)!r}, np.{x.dtype.name})")
        items = []
        for part, v in zip(parts, call.outputs):
            inner = _peel_reshape(part)
            items.append(f"({inner if inner is not None else part}, {tuple(v.shape)!r})")
        return {0: f"cat_into({b}, {d}, ({', '.join(items)},))"}
    return {0: f"{MULTI_OUTPUT[call.spec.name]}(({', '.join(parts)},), axis={d})"}


def _peel_reshape(expr: str) -> str | None:
    """``A`` of an expression ``(A).reshape(shape)`` (in any number of outer parentheses),
    else None."""
    def closing(s: str, start: int) -> int:
        depth = 0
        for i in range(start, len(s)):
            depth += {"(": 1, ")": -1}.get(s[i], 0)
            if depth == 0:
                return i
        return -1

    while expr.startswith("(") and closing(expr, 0) == len(expr) - 1:
        expr = expr[1:-1]
    if not expr.startswith("("):
        return None
    end = closing(expr, 0)
    rest = expr[end + 1:]
    if end < 0 or not rest.startswith(".reshape(") or \
            closing(rest, len(".reshape")) != len(rest) - 1:
        return None
    return expr[1:end]


def formulas_rule(call: OpCall, backend=None) -> bool:
    """Is ``call``'s backward the engine's own (``formulas.op_backward``, called from the
    generated code): an op with registered formulas and no NumPy rule of its own here?"""
    return bool(call.spec.grads) and not _own_backward(call, backend)


def rule_kind(spec) -> str | None:
    """How the compiled step differentiates ``spec`` (for the registry completeness test):
    "rule" (written here), "scalar" (its stanza's grad texts), "formulas" (the engine's
    backward, called from the generated code), or None (no backward at all)."""
    if spec.name in RULES or spec.name in MULTI_OUTPUT or spec.name in _VIEW_GRAD or \
            spec.name.startswith(("cat", "stack")):
        return "rule"
    sc = spec.scalar
    if sc is not None and bool(sc.grads) and scalar_names(sc) <= set(MATH):
        return "scalar"
    return "formulas" if spec.grads else None


def has_backward(call: OpCall, backend=None) -> bool:
    return _own_backward(call, backend) or bool(call.spec.grads)


def _own_backward(call: OpCall, backend=None) -> bool:
    spec = call.spec
    if spec.name in MULTI_OUTPUT:
        return isinstance(call.inputs[0], Value)
    if spec.name == "nll_loss":
        return _nll_ok(call)
    if spec.name == "embedding":
        return embedding_ok(call)
    if spec.name in ("cat", "stack") or spec.name.startswith(("cat[", "stack[")):
        return all(isinstance(x, Value) for x in call.inputs)
    if spec.name in _VIEW_GRAD:
        return backend is not None and isinstance(call.inputs[0], Value) and view_grad_ok(
            spec.forward, backend, call.inputs[0].shape, dict(call.params))
    if spec.name in ("mul_scalar", "div_scalar"):
        return False  # their scalar operand's place varies; eager-only until needed
    if spec.name in RULES:
        return True
    sc = spec.scalar
    return (sc is not None and len(sc.inputs) == len(call.inputs) and bool(sc.grads)
            and set(call.params) == set(sc.params) and scalar_names(sc) <= set(MATH))


def backward_code(call: OpCall, ctx, g: str) -> dict[int, str]:
    """{input position: gradient expression} for the inputs of ``call``."""
    spec = call.spec
    rule = RULES.get(spec.name)
    if rule is None:
        if spec.name in _VIEW_GRAD:
            rule = _view_grad
        elif spec.name.startswith("cat"):
            rule = _cat
        elif spec.name.startswith("stack"):
            rule = _stack
        else:
            rule = _scalar_rule
    return rule(call, ctx, g)
