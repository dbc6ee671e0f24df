"""Program -> one Python module: ``make(K)`` returns ``run(A, L, E, H)`` on NumPy arrays.

``A`` holds fn's tensor arguments' arrays, ``L`` the leaves' arrays then the optimizer
state arrays (in ``Layout`` order), ``E`` the incoming ``.grad`` arrays the code reads
(None where a leaf has none), ``H`` the optimizer hyperparameters read each call (an
LR scheduler may change them). Buffers are allocated once in ``make``; gradients land in
persistent buffers the caller exposes as the leaves' ``.grad``. The module text depends
only on the traced program (shapes, dtypes, ops), so it is written to a file named by its
hash and Numba's ``cache=True`` finds its fused kernels again in the next process.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ops.scalar import source
from . import fuse
from .graph import (
    Backward,
    CustomCall,
    OpCall,
    Program,
    Step,
    Unsupported,
    Value,
    ZeroGrad,
    ancestors,
)
from .rules import (
    BROADCASTING,
    RULES,
    backward_code,
    formulas_rule,
    forward_code,
    has_backward,
    layer_norm_operands,
    layer_norm_rows,
    multi_backward_code,
    ufunc_forward,
)

__all__ = ["Generated", "Unsupported", "generate", "group_flag"]


@dataclass
class Layout:
    """Where each array of ``L`` and ``H`` comes from, for the caller to gather per call."""

    leaves: list = field(default_factory=list)  # leaf slots, L[0:len]
    #: (step index, param slot, state key) for each optimizer state array after the leaves
    state: list = field(default_factory=list)
    #: (step index, group index, keys) read from the optimizer's param groups into H
    hyper: list = field(default_factory=list)
    #: leaf slot -> grad buffer name (their ``.grad`` after the call) / None (``.grad = None``)
    final_grads: dict = field(default_factory=dict)
    #: leaf slots whose incoming ``.grad`` the code reads (entry state), passed in ``E``
    entry_grads: list = field(default_factory=list)
    #: structural flags of each optimizer step (change them and the code no longer fits)
    flags: list = field(default_factory=list)
    #: leaf slots an optimizer step writes in place (their versions are bumped per call)
    written: list = field(default_factory=list)
    #: (argument position, name) of each argument whose ``.grad`` fn changes: None where
    #: fn set it to None last, else its gradient array, returned after fn's results (a
    #: new array, or the old .grad's array added into in place); an incoming ``.grad`` the
    #: code reads is ``("arg", position)`` in ``entry_grads``
    arg_grads: list = field(default_factory=list)
    #: indices into ``state`` of Adam's step counts the group loops read as float32 arrays
    #: of one element (step.py checks them so)
    f32_steps: list = field(default_factory=list)


@dataclass
class Generated:
    """One signature's module: its text, the objects ``make(K)`` receives, where its
    arrays come from, its kernels (name, dtype, argument kinds) and the fusion plan (read
    by ``prove.py``)."""

    text: str
    constants: dict
    layout: Layout
    fused: list
    plan: Any = None


_HYPER = {"sgd": ("lr", "momentum", "weight_decay"),
          "adam": ("lr", "betas", "eps", "weight_decay")}


class _Ctx:
    """Names and constants while writing one module."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.constants: dict[str, Any] = {}
        #: lines of ``make`` allocating buffers and their flat views
        self.allocs: list[str] = []
        self.buffers: list[str] = []
        self.helpers: dict[str, str] = {}
        self.plan = None
        #: value index -> the OpCall that made it (set for each backward)
        self.producer: dict[int, OpCall] = {}
        #: matmul outputs formed transposed (``W @ x.T``, see ``_transposed_products``):
        #: value index -> True where the value stays column-major, False where it is
        #: copied back row-major; ``fortran``: every value laid out column-major
        self.tprod: dict[int, bool] = {}
        self.fortran: set[int] = set()
        #: column-major product -> the relu that is its only reader and the next op: the
        #: bias add and the relu run as one loop (fuse.LOOPS' bias_relu_rows)
        self.epilogue: dict[int, OpCall] = {}
        #: id of each op whose output an earlier op's code already wrote
        self.written: set[int] = set()
        #: exact GELU outputs whose forward kept (c, exp) buffers for the backward
        #: (rules.gelu_saves): value index -> their names
        self.gelu_saved: dict[int, tuple] = {}
        self._ids: dict[int, str] = {}
        self._arrays: dict[tuple, str] = {}
        #: how many optimizer update tables (``_update_table``) the module keeps
        self.tables = 0

    def ref(self, x) -> str:
        """Code for an operand: a value's name, a literal, or a bound constant (dtypes,
        slices: anything whose repr is not a Python literal)."""
        if isinstance(x, Value):
            return x.name
        if isinstance(x, float) and not np.isfinite(x):
            return f"float({str(x)!r})"
        try:
            if ast.literal_eval(repr(x)) == x:
                return repr(x)
        except (ValueError, SyntaxError, TypeError):
            pass
        return self.bind(x, "const")

    def dtype(self, v: Value) -> str:
        return f"np.{v.dtype.name}"

    def buf(self, v: Value, prefix: str = "b") -> str:
        name = f"{prefix}{v.index}"
        if name not in self.buffers:
            self.buffers.append(name)
            order = ", order='F'" if prefix == "b" and v.index in self.fortran else ""
            self.allocs.append(f"{name} = np.empty({v.shape!r}, np.{v.dtype.name}{order})")
        return name

    def alloc(self, line: str) -> None:
        """A line of ``make`` (buffer allocation, flat view), once."""
        if line not in self.allocs:
            self.allocs.append(line)

    def bind_array(self, a: np.ndarray, hint: str) -> str:
        """``bind`` for a constant array, one name per distinct shape, dtype and values."""
        key = (hint, a.shape, a.dtype.str, a.tobytes())
        if key not in self._arrays:
            self._arrays[key] = self.bind(a, hint)
        return self._arrays[key]

    def bind(self, obj, hint: str) -> str:
        """The name of ``make``'s local holding ``obj`` (op names like ``stack[3]`` made
        into identifiers)."""
        name = self._ids.get(id(obj))
        if name is None:
            name = "".join(ch if ch.isalnum() else "_" for ch in f"{hint}_{len(self._ids)}")
            self._ids[id(obj)] = name
            self.constants[name] = obj
        return name

    def update_kernel(self, name: str, dtype: str) -> str:
        """An optimizer loop of fuse.UPDATE_KERNELS (sgd_update, adam_update, sgd_group,
        adam_group), registered once per dtype."""
        codes = fuse.UPDATE_CODES[name]
        if name not in self.plan.helpers:
            self.plan.helpers[name] = fuse.loop_import(name)
        if (name, dtype, codes) not in self.plan.kernels:
            self.plan.kernels.append((name, dtype, codes))
        return name

    def loop_kernel(self, name: str, dtype: str) -> str:
        """One of fuse.LOOPS (single-op loops), registered once per dtype."""
        if name not in self.plan.helpers:
            self.plan.helpers[name] = fuse.loop_import(name)
        if (name, dtype, fuse.LOOP_CODES[name]) not in self.plan.kernels:
            self.plan.kernels.append((name, dtype, fuse.LOOP_CODES[name]))
        return name

    def rows(self, v: Value, x: str, buffer: bool = False) -> str:
        """``x`` (value ``v``'s array, or its buffer) as the 2-D array a fuse.LOOPS loop
        walks: ``.T`` of a column-major 2-D value (C-contiguous then), else ``(1, size)``."""
        if v.index in self.fortran:
            return f"{x}.T"
        if buffer:
            self.alloc(f"{x}r = {x}.reshape(1, -1)")
            return f"{x}r"
        return f"{x}.reshape(1, -1)"

    def transposed_view(self, x) -> bool:
        """Is ``x`` the ``t()`` of a 2-D tensor (``nn.Linear``'s ``W.t()``), or a 2-D value
        laid out column-major (``fortran``)? Its gradient is then formed transposed too."""
        if isinstance(x, Value) and x.index in self.fortran:
            return True
        call = self.producer.get(x.index) if isinstance(x, Value) else None
        return isinstance(call, OpCall) and call.spec.name == "t" and len(x.shape) == 2

    def scalar_grad(self, spec, i: int) -> str:
        """A NumPy helper computing the stanza's ``Scalar.grads[i]`` on arrays."""
        sc = spec.scalar
        name = f"grad_{spec.name}_{i}".replace("[", "_").replace("]", "")
        if name not in self.helpers:
            self.helpers[name] = source(name, ("g",) + sc.inputs + ("y",) + sc.params,
                                        sc.grads[i])
        return name


_G = "GRAD__"  # placeholder a rule's expressions use for the incoming gradient


def _multi_backward(call, need: set, grads: dict, values: dict, ctx: _Ctx,
                    lines: list) -> None:
    """A several-output op (split, chunk, unbind): its input's gradient joins the outputs'
    gradients (zeros for outputs that got none), as the eager node does."""
    got = [grads.get(v.index) if v.index in need else None for v in call.outputs]
    x = call.inputs[0]
    if all(g is None for g in got) or not isinstance(x, Value) or x.index not in need:
        return
    if not has_backward(call, ctx.backend):
        raise Unsupported(f"no compile rule for the backward of {call.spec.name}")
    if formulas_rule(call, ctx.backend):
        _formulas_backward(call, need, grads, values, ctx, lines)
        return
    got = [g if g is None or g.isidentifier() else f"({g})" for g in got]
    expr = multi_backward_code(call, ctx, got)[0]
    values[x.index] = x
    if x.index in grads:
        lines.append(f"g{x.index} = {grads[x.index]} + {expr}")
        grads[x.index] = f"g{x.index}"
    else:
        grads[x.index] = expr


def _backward(ops: list, root: Value, ctx: _Ctx, lines: list, grad_state: dict,
              layout: Layout) -> None:
    """Reverse-mode code over the ops before this backward. A gradient used once stays an
    expression inlined into its use (so ``W.t()``'s double transpose cancels and a weight
    gradient is one BLAS call writing into its buffer); others get a variable."""
    need = ancestors(ops, root)
    ctx.producer = {v.index: c for c in ops for v in c.outputs}
    grads: dict[int, str] = {root.index: ctx.bind(np.ones(root.shape, root.dtype), "ONE")}
    values: dict[int, Value] = {root.index: root}
    member = {id(c): grp for grp in ctx.plan.first.values() for c in grp.calls}
    done: set = set()
    for call in reversed(ops):
        if isinstance(call, CustomCall):
            _custom_backward(call, need, grads, values, ctx, lines)
            continue
        if call.spec.variadic_outputs:
            _multi_backward(call, need, grads, values, ctx, lines)
            continue
        out = call.outputs[0]
        group = member.get(id(call))
        if group is not None:
            if id(group) not in done:
                done.add(id(group))
                _fused_backward(group, need, grads, values, ctx, lines)
            continue
        if out.index not in need or out.index not in grads:
            continue
        if out.index in ctx.gelu_saved:
            _gelu_backward(call, need, grads, values, ctx, lines)
            continue
        if not has_backward(call, ctx.backend):
            raise Unsupported(f"no compile rule for the backward of {call.spec.name}")
        if formulas_rule(call, ctx.backend):
            rows = layer_norm_rows(call, ctx)
            if rows is not None and not any(o.index in grads for o in call.outputs[1:]):
                _layer_norm_backward(call, need, grads, values, ctx, lines, *rows)
            else:
                _formulas_backward(call, need, grads, values, ctx, lines)
            continue
        if call.spec.name != "to_copy" and any(
                x.dtype != out.dtype for x in call.tensor_inputs if x.index in need):
            raise Unsupported(f"mixed dtypes on the gradient path ({call.spec.name}): eager "
                              "casts there; no compile rule for it yet")
        exprs = backward_code(call, ctx, _G)
        g = grads[out.index]
        if sum(e.count(_G) for e in exprs.values()) > 1 and not g.isidentifier():
            lines.append(f"g{out.index} = {g}")
            g = f"g{out.index}"
        g = g if g.isidentifier() else f"({g})"
        bcast = BROADCASTING.get(call.spec.name, "all" if call.spec.scalar is not None
                                 and call.spec.name not in RULES else ())
        for pos, x in enumerate(call.inputs):
            if not isinstance(x, Value) or x.index not in need:
                continue
            values[x.index] = x
            expr = simplify(exprs[pos].replace(_G, g))
            if (bcast == "all" or pos in bcast) and x.shape != out.shape:
                expr = _sum_to_code(expr, out.shape, x.shape, ctx, x.dtype)
            if x.index in grads:
                lines.append(f"g{x.index} = {grads[x.index]} + {expr}")
                grads[x.index] = f"g{x.index}"
            else:
                grads[x.index] = expr
    for idx in sorted(need):
        v = values.get(idx)
        if v is None or v.kind == "op" or idx not in grads:
            continue
        if v.kind == "arg":
            _accumulate_arg(v, grads[idx], ctx, lines, grad_state, layout)
        else:
            _accumulate(v, grads[idx], ctx, lines, grad_state, layout)


def _gelu_backward(call: OpCall, need: set, grads: dict, values: dict, ctx: _Ctx,
                   lines: list) -> None:
    """Exact GELU's backward from what its forward kept (rules.gelu_saves): one pass,
    eager's float32 operations (fuse.LOOPS' gelu_saved_b)."""
    x, out = call.inputs[0], call.outputs[0]
    if x.index not in need:
        return
    c, ex = ctx.gelu_saved[out.index]
    b = ctx.buf(x, "gg")
    k = ctx.loop_kernel("gelu_saved_b", "float32")
    lines.append(f"{k}(np.ascontiguousarray({grads[out.index]}).reshape(-1), "
                 f"np.ascontiguousarray({x.name}).reshape(-1), {c}, {ex}, {b}.reshape(-1))")
    values[x.index] = x
    if x.index in grads:
        lines.append(f"g{x.index} = {grads[x.index]} + {b}")
        grads[x.index] = f"g{x.index}"
    else:
        grads[x.index] = b


def _layer_norm_backward(call: OpCall, need: set, grads: dict, values: dict, ctx: _Ctx,
                         lines: list, n: int, m: int) -> None:
    """native_layer_norm's backward as the CPU backend's row kernel straight from the
    generated code (rules.layer_norm_rows): the call, arguments and conversions of its
    ``native_layer_norm_backward``, into buffers of ``make``."""
    x, w, b = call.inputs
    y, mean, rstd = call.outputs
    dt, i = x.dtype.name, y.index
    run, weight, k = layer_norm_operands(call, ctx, n, m)
    wanted = [isinstance(v, Value) and v.index in need for v in (x, w, b)]
    dx = ctx.buf(x, f"lndx{i}_") if wanted[0] else f"lndx{i}"
    if wanted[0]:
        ctx.alloc(f"{dx}r = {dx}.reshape({n}, {m})")
    else:
        ctx.alloc(f"{dx}r = np.empty((1, 1), np.{dt})")
    gw, gb, tmp = f"lngw{i}", f"lngb{i}", f"lnt{i}"
    for name in (gw, gb):  # float64 sums, as the backend's
        ctx.alloc(f"{name} = np.zeros({m})")
    ctx.alloc(f"{tmp} = np.empty(2, np.{dt})")
    need_wb = wanted[1] or wanted[2]
    if need_wb:
        lines += [f"{gw}.fill(0)", f"{gb}.fill(0)"]
    g = grads[y.index]
    lines.append(f"{run}('layer_norm_rows_b', 0, np.ascontiguousarray({g}).reshape({n}, {m}), "
                 f"np.ascontiguousarray({x.name}).reshape({n}, {m}), "
                 f"np.ascontiguousarray({mean.name}).reshape({n}), "
                 f"np.ascontiguousarray({rstd.name}).reshape({n}), {weight}, "
                 f"{isinstance(w, Value)}, {k}[0], {wanted[0]}, {dx}r, {need_wb}, {gw}, {gb}, "
                 f"{tmp})")
    shape = tuple(call.params["normalized_shape"])
    exprs = {0: dx}
    for pos, acc in ((1, gw), (2, gb)):
        if wanted[pos]:  # rounded to the dtype as the backend's astype
            c = f"{acc}c"
            ctx.alloc(f"{c} = np.empty({shape!r}, np.{dt})")
            lines.append(f"np.copyto({c}, {acc}.reshape({shape!r}), casting='same_kind')")
            exprs[pos] = c
    for pos, v in enumerate((x, w, b)):
        if not wanted[pos]:
            continue
        values[v.index] = v
        if v.index in grads:
            lines.append(f"g{v.index} = {grads[v.index]} + {exprs[pos]}")
            grads[v.index] = f"g{v.index}"
        else:
            grads[v.index] = exprs[pos]


def _formulas_backward(call: OpCall, need: set, grads: dict, values: dict, ctx: _Ctx,
                       lines: list) -> None:
    """An op without a NumPy rule: the eager node's backward on the arrays (the backend's
    one-pass kernel or the op's registered formulas, then the engine's fit to the inputs'
    shapes and dtypes; formulas.op_backward), called once for all its inputs."""
    from ..device import device as _device
    from .formulas import op_backward

    fn = ctx.bind(op_backward(call, ctx.backend, _device("cpu")), f"bwd_{call.spec.name}")
    env = {v.index: v.name for v in _values_in([call.inputs, call.params, call.outputs], [])}
    got = [grads.get(v.index) if v.index in need else None for v in call.outputs]
    r = f"r{call.outputs[0].index}"
    lines.append(f"{r} = {fn}({{{', '.join(f'{k}: {n}' for k, n in env.items())}}}, "
                 f"[{', '.join('None' if g is None else g for g in got)}])")
    for pos, x in enumerate(call.inputs):
        if not isinstance(x, Value) or x.index not in need:
            continue
        values[x.index] = x
        expr = f"{r}[{pos}]"
        if x.index in grads:
            lines.append(f"g{x.index} = {grads[x.index]} + {expr}")
            grads[x.index] = f"g{x.index}"
        else:
            grads[x.index] = expr


def _fused_backward(group, need: set, grads: dict, values: dict, ctx: _Ctx,
                    lines: list) -> None:
    """The backward of a fused forward run as one generated loop (fuse.backward_kernel)."""
    if group.design is not None:  # forward and backward generated together (fwdbwd.py)
        return fuse.fwdbwd.backward_code(group, grads, values, ctx, lines, fuse.launch,
                                         _matmul_into)
    seeds = [c.outputs[0] for c in group.calls if c.outputs[0].index in grads]
    if not seeds or not any(x.index in need for x in group.inputs):
        return
    name = f"{group.name}_b{len(ctx.plan.kernels)}"
    text, outputs = fuse.backward_kernel(group, seeds, need, ctx.plan.helpers, name)
    ctx.plan.backward_kernels.append((name, group, seeds, outputs))
    ctx.plan.kernel_text += text
    ctx.plan.kernels.append((name, group.calls[0].outputs[0].dtype.name, "a" * (
        len(group.inputs) + len(group.calls) + len(seeds) + len(outputs))))
    args = [f"{v.name}.reshape(-1)" for v in group.inputs]
    args += [f"{ctx.buf(c.outputs[0])}f" for c in group.calls]
    args += [f"flat({grads[v.index]})" for v in seeds]
    results = []
    for x in outputs:
        b = ctx.buf(x, f"gb{len(ctx.plan.backward_kernels)}_")  # one per loop: a value may get
        # gradients from two runs
        ctx.alloc(f"{b}f = {b}.reshape(-1)")
        args.append(f"{b}f")
        results.append((x, b))
    lines += fuse.launch(group.calls, f"{name}({', '.join(args)})")
    for x, b in results:
        values[x.index] = x
        if x.index in grads:
            lines.append(f"g{x.index} = {grads[x.index]} + {b}")
            grads[x.index] = f"g{x.index}"
        else:
            grads[x.index] = b


def _custom_backward(call: CustomCall, need: set, grads: dict, values: dict, ctx: _Ctx,
                     lines: list) -> None:
    """A custom Function's backward: the ops its ``backward`` ran in the traced call,
    replayed on the incoming gradients and the traced forward values (so a wrong backward
    is reproduced, as eager runs it), then summed back to each input's shape as the
    engine's ``_fit_to_inputs`` does."""
    if not any(o.index in grads for o in call.outputs) or not any(
            x.index in need for x in call.tensor_inputs):
        return
    name = call.cls.__name__
    if call.backward_ops is None:
        raise Unsupported(f"custom Function {name}: its backward did not run in the traced "
                          "call")
    for out, v, from_grad in call.incoming(lambda o: o.index in grads):
        lines.append(f"{v.name} = {grads[out.index]}" if from_grad else
                     f"{v.name} = np.zeros({v.shape!r}, np.{v.dtype.name})")
    for op in call.backward_ops:
        lines += forward_code(op, ctx)
    for j, g in zip(call.positions, call.grad_outputs):
        x = call.inputs[j]
        if g is None or x.index not in need:
            continue
        if g.dtype != x.dtype:
            raise Unsupported(f"custom Function {name}'s backward returns a {g.dtype} gradient "
                              f"for a {x.dtype} input (eager casts; no compile rule yet)")
        values[x.index] = x
        expr = g.name if g.shape == x.shape else _sum_to_code(g.name, g.shape, x.shape)
        if x.index in grads:
            lines.append(f"g{x.index} = {grads[x.index]} + {expr}")
            grads[x.index] = f"g{x.index}"
        else:
            grads[x.index] = expr


def _closing(s: str, start: int) -> int:
    """Index of the parenthesis closing the one at ``start``."""
    depth = 0
    for i in range(start, len(s)):
        depth += {"(": 1, ")": -1}.get(s[i], 0)
        if depth == 0:
            return i
    return -1


def simplify(expr: str) -> str:
    """``(X.T).T`` -> ``X`` (2-D transposes cancel), repeatedly."""
    while expr.startswith("(") and expr.endswith(").T") and _closing(expr, 0) == len(expr) - 3:
        inner = expr[1:-3]
        if not inner.endswith(".T"):
            break
        expr = inner[:-2]
    return expr


#: rows from which a 2-D gradient summed over its rows (a bias gradient) is a BLAS
#: product with a vector of ones: 64x256 float32 takes 1.7 µs there, 3.3 µs in NumPy's
#: add.reduce (7.7 µs for a column-major gradient)
SUM_ROWS_GEMV_MIN = 8


def _sum_to_code(expr: str, shape: tuple, to: tuple, ctx=None, dtype=None) -> str:
    """A broadcast gradient of ``shape`` summed back to ``to`` (axes known statically)."""
    if ctx is not None and len(shape) == 2 and to == shape[1:] and \
            shape[0] >= SUM_ROWS_GEMV_MIN and dtype in (np.float32, np.float64):
        ones = ctx.bind_array(np.ones(shape[0], dtype), "ONES")
        return f"np.matmul({ones}, {expr})"
    lead = len(shape) - len(to)
    kept = tuple(i + lead for i, s in enumerate(to) if s == 1 and shape[i + lead] != 1)
    if not kept:
        return f"np.add.reduce({expr}, axis={tuple(range(lead))!r})"
    axes = tuple(range(lead)) + kept
    return f"np.add.reduce({expr}, axis={axes!r}, keepdims=True).reshape({to!r})"


def _matmul_into(expr: str, out: str) -> str | None:
    """``np.matmul(a, b)`` / ``np.add.reduce(...)`` writing into ``out``, if ``expr`` is
    exactly such a call; embedding's backward loop (rules._embedding, its buffer the last
    argument) writing into ``out`` instead of its buffer."""
    for head in ("np.matmul(", "np.add.reduce("):
        if expr.startswith(head) and _closing(expr, len(head) - 1) == len(expr) - 1:
            return f"{expr[:-1]}, out={out})"
    head = "embedding_rows_b("
    if expr.startswith(head) and _closing(expr, len(head) - 1) == len(expr) - 1:
        rest, _, last = expr[:-1].rpartition(", ")
        if last.isidentifier():
            return f"{rest}, {out})"
    return None


def _accumulate(v: Value, g: str, ctx: _Ctx, lines: list, grad_state: dict,
                layout: Layout) -> None:
    """AccumulateGrad: ``.grad = g`` when none, else ``.grad + g``; into the leaf's buffer."""
    buf = ctx.buf(v, "G")
    state = grad_state.get(v.slot, "entry")
    if state == "none":
        lines.append(_matmul_into(g, buf) or f"np.copyto({buf}, {g})")
    elif state == "buf":
        lines.append(f"np.add({buf}, {g}, out={buf})")
    else:  # entry: whatever .grad the leaf had when the step was called
        if v.slot not in layout.entry_grads:
            layout.entry_grads.append(v.slot)
        e = f"E[{layout.entry_grads.index(v.slot)}]"
        lines.append(f"if {e} is None:")
        lines.append(f"    np.copyto({buf}, {g})")
        lines.append("else:")
        lines.append(f"    np.add({e}, {g}, out={buf})")
    grad_state[v.slot] = "buf"


def _accumulate_arg(v: Value, g: str, ctx: _Ctx, lines: list, grad_state: dict,
                    layout: Layout) -> None:
    """AccumulateGrad of an argument that requires grad, as eager's: its ``.grad`` is a new
    array when it had none (so a ``.grad`` kept from an earlier call is not overwritten),
    else the old ``.grad``'s array added to in place (the same tensor, as eager's
    ``old += g``). The caller sets ``.grad`` from ``layout.arg_grads``."""
    key = ("arg", v.slot)
    name = f"GA{v.slot}"
    state = grad_state.get(key, "entry")
    if state == "buf":
        lines.append(f"np.add({name}, {g}, out={name})")
    elif state == "none":  # ``x.grad = None`` earlier in fn
        lines += [f"{name} = np.empty({v.shape!r}, {ctx.dtype(v)})", f"np.copyto({name}, {g})"]
    else:
        layout.entry_grads.append(key)
        e = f"E[{len(layout.entry_grads) - 1}]"
        lines += [f"if {e} is None:", f"    {name} = np.empty({v.shape!r}, {ctx.dtype(v)})",
                  f"    np.copyto({name}, {g})", "else:", f"    {name} = {e}",
                  f"    np.add({name}, {g}, out={name})"]
    grad_state[key] = "buf"


def _grad_of(slot: int, v: Value, ctx: _Ctx, grad_state: dict, layout: Layout) -> str | None:
    state = grad_state.get(slot, "entry")
    if state == "none":
        return None
    if state == "buf":
        return ctx.buf(v, "G")
    raise Unsupported("optimizer.step() on gradients from before the call (no zero_grad/"
                      "backward inside fn)")


def _step(k: int, event: Step, opt, leaves: dict, ctx: _Ctx, lines: list, grad_state: dict,
          layout: Layout) -> None:
    """The optimizer update: per param group and dtype, one call of a loop over its
    parameters (fuse.UPDATE_KERNELS' sgd_group / adam_group) that runs the per-parameter
    update loop on each (the eager update's operations in its order and dtype, so the
    results are eager's). Adam takes the per-parameter path where its bias corrections
    could not be computed in the loop as eager computes them (a step count that is not a
    float32 scalar, betas that are not Python numbers)."""
    decoupled = bool(event.kind == "adam" and opt.param_groups[0].get("decoupled_weight_decay"))
    for gi, (group, slots) in enumerate(zip(opt.param_groups, event.groups)):
        h = len(layout.hyper)
        layout.hyper.append((k, gi, _HYPER[event.kind]))
        wd = group["weight_decay"] != 0
        if event.kind == "sgd":
            mom = group["momentum"] != 0
            layout.flags.append((k, gi, ("momentum", "weight_decay"), (mom, wd)))
            lines.append(f"lr, momentum, wd = H[{h}]")
        else:
            float_betas = group_flag(group, "float_betas")
            layout.flags.append((k, gi, ("weight_decay", "decoupled_weight_decay",
                                         "float_betas"), (wd, decoupled, float_betas)))
            lines.append(f"lr, (beta1, beta2), eps, wd = H[{h}]")
        by_dtype: dict[str, list] = {}  # dtype -> the group loop's rows
        single: list = []  # Adam's parameters updated one call each
        for p_t, slot in zip(group["params"], slots):
            v = leaves[slot]
            g = _grad_of(slot, v, ctx, grad_state, layout)
            if g is None:
                continue
            if slot not in layout.written:
                layout.written.append(slot)
            if event.kind == "sgd":
                buf = _state_ref(layout, k, slot, "momentum_buffer") if mom else v.name
                by_dtype.setdefault(v.dtype.name, []).append((v.name, _flat(ctx, g), buf))
                continue
            s, m, sq = (_state_ref(layout, k, slot, key)
                        for key in ("step", "exp_avg", "exp_avg_sq"))
            refs = (m, sq, s)
            if float_betas and _f32_step(opt, p_t):
                layout.f32_steps.append(layout.state.index((k, slot, "step")))
                by_dtype.setdefault(v.dtype.name, []).append((v.name, _flat(ctx, g), *refs))
            else:
                single.append((v, _flat(ctx, g), *refs))
        dtypes = list(dict.fromkeys([d for d in by_dtype] + [v.dtype.name
                                                             for v, *_ in single]))
        for d in dtypes:  # the group's scalars, converted once per dtype
            dt = f"np.{d}"
            if event.kind == "sgd":
                lines.append(f"nlr_{d}, mom_{d}, wd_{d} = {dt}(-lr), {dt}(momentum), {dt}(wd)")
            else:
                lines.append(f"c1_{d}, b2_{d}, c2_{d}, eps_{d}, wd_{d}, dec_{d} = "
                             f"{dt}(1 - beta1), {dt}(beta2), {dt}(1 - beta2), {dt}(eps), "
                             f"{dt}(wd), {dt}(1 - lr * wd)")
        mode = 0 if not wd else (2 if decoupled else 1)
        if event.kind == "adam" and by_dtype:
            lines.append("lr_f, beta1_f, beta2_f = float(lr), float(beta1), float(beta2)")
        for d, rows in by_dtype.items():
            kernel = ctx.update_kernel(f"{event.kind}_group", d)
            table = _update_table(ctx, rows, event.kind == "adam", lines)
            if event.kind == "sgd":
                lines.append(f"{kernel}({table}, nlr_{d}, mom_{d}, wd_{d}, {wd}, {mom})")
            else:
                lines.append(f"{kernel}({table}, c1_{d}, b2_{d}, c2_{d}, lr_f, beta1_f, "
                             f"beta2_f, 0.5, eps_{d}, wd_{d}, {mode}, dec_{d})")
        for v, g, m, sq, s in single:
            p, dt, d = v.name, f"np.{v.dtype.name}", v.dtype.name
            kernel = ctx.update_kernel(f"{event.kind}_update", d)
            lines += [f"np.add({s}, 1, out={s})", "t = float(" + s + ")",
                      f"{kernel}({p}.reshape(-1), {g}, {m}.reshape(-1), "
                      f"{sq}.reshape(-1), c1_{d}, b2_{d}, c2_{d}, "
                      f"{dt}(-(lr / (1 - beta1 ** t))), {dt}((1 - beta2 ** t) ** 0.5), "
                      f"eps_{d}, wd_{d}, {mode}, dec_{d})"]


def group_flag(group: dict, name: str) -> bool:
    """A structural flag of a param group (``Layout.flags``; step.py checks them per call):
    ``float_betas``: Adam's betas are Python numbers (adam_group computes the bias
    corrections from them as Python does)."""
    if name == "float_betas":
        return all(type(b) in (float, int) for b in group["betas"])
    return bool(group.get(name)) if name == "decoupled_weight_decay" else group[name] != 0


def _f32_step(opt, p) -> bool:
    """Is ``p``'s Adam step count a float32 array of one element (what adam_group reads)?"""
    st = opt.state.get(p)
    s = st.get("step") if st else None
    a = getattr(s, "_data", None)
    return isinstance(a, np.ndarray) and a.dtype == np.float32 and a.size == 1


def _update_table(ctx: _Ctx, rows: list, steps: bool, lines: list) -> str:
    """Code for a group loop's table of addresses (runtime.update_table), made again only
    when the step gets a new list of leaf and state arrays ``L`` (step.py passes the same
    list while they are the same arrays); the table keeps ``L``, so its arrays, alive."""
    ctx.helpers["update_table"] = "from symgrad.compile.runtime import update_table\n"
    name = f"U{ctx.tables}"
    ctx.tables += 1
    ctx.alloc(f"{name} = [None]")
    arrays = ", ".join("(" + ", ".join(r) + ")" for r in rows)
    lines += [f"u = {name}[0]",
              "if u is None or u[0] is not L:",
              f"    u = {name}[0] = (L, update_table(({arrays},), {steps}))"]
    return "u[1]"


def _flat(ctx: _Ctx, buf: str) -> str:
    ctx.alloc(f"{buf}f = {buf}.reshape(-1)")
    return f"{buf}f"


def _state_ref(layout: Layout, k: int, slot: int, key: str) -> str:
    entry = (k, slot, key)
    if entry not in layout.state:
        layout.state.append(entry)
    return f"S{layout.state.index(entry)}"


#: ``m * k * n`` of a float ``x @ W.t()`` from which it is formed as ``(W @ x.T).T``:
#: OpenBLAS's sgemm (NumPy's, one thread, this 2-vCPU AMD EPYC) writes the column-major
#: product faster: 280 instead of 337 µs for 64x784 @ 784x256, 91 instead of 111 µs for
#: 64x256 @ 256x256; for 64x128 @ 128x256 no gain once copied back row-major, and slower
#: for batch-1 products (docs/compile.md, "The 784-256-256-10 step")
TPROD_MIN = 1 << 22
#: inner dimension ``k`` from which such a product is formed transposed even where it must
#: be copied back row-major (the bias add reading it column-major): the copy costs ~m*n,
#: the gain grows with m*k*n. The GPT's 256x64 @ 64x256 (MLP up-projection, GELU after
#: it) spent 212 + 170 µs on product + transposing add, under load (a plain row-major
#: product + bias add: see the commit)
TPROD_COPY_K = 512


def _values_in(obj, out: list) -> list:
    """Every Value in a nested structure of lists, tuples, dicts and Values."""
    if isinstance(obj, Value):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _values_in(x, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _values_in(x, out)
    return out


def _transposed_products(program: Program, groups) -> tuple[dict, set, dict]:
    """Which ``x @ W.t()`` (``mm``/``addmm`` whose second operand is the ``t()`` of a 2-D
    tensor) are formed as ``W @ x.T`` into a column-major buffer (TPROD_MIN), and which
    values stay column-major: the product, when every op reading it (and, transitively,
    every elementwise op it feeds, whose output is then column-major too) is an unfused
    NumPy ufunc of forward_code or the first operand of another such product; otherwise
    the product is copied back row-major while the bias is added (``False``). And the
    epilogues: a column-major ``addmm`` whose only reader is a relu right after it."""
    producer: dict[int, OpCall] = {}
    uses: dict[int, list] = {}  # value index -> [(reading OpCall or None, input position)]
    fused = set(groups.skip) | set(groups.first)

    def used(v, call, pos):
        uses.setdefault(v.index, []).append((call, pos))

    for e in program.events:
        if isinstance(e, OpCall):
            for pos, x in enumerate(e.inputs):
                if isinstance(x, Value):
                    used(x, None if id(e) in fused else e, pos)
            for x in _values_in(e.params, []):
                used(x, None, -1)
            for o in e.outputs:
                producer[o.index] = e
        elif isinstance(e, CustomCall):
            for op in e.backward_ops or []:
                for x in _values_in([op.inputs, op.params], []):
                    used(x, None, -1)
            for x in _values_in([e.inputs, e.sources, e.outputs], []):
                used(x, None, -1)
        elif isinstance(e, Backward):
            used(e.root, None, -1)
    for x in _values_in(program.result, []):
        used(x, None, -1)

    def product(call) -> bool:
        if call.spec.name not in ("mm", "addmm") or id(call) in fused:
            return False
        p = call.params
        a, b = call.inputs[-2:]
        out = call.outputs[0]
        if call.spec.name == "addmm" and (p.get("alpha", 1) != 1 or p.get("beta", 1) != 1):
            return False
        if len(call.outputs) != 1 or out.dtype.kind != "f" or len(out.shape) != 2 or not all(
                isinstance(x, Value) and x.dtype == out.dtype for x in call.inputs):
            return False
        w = producer.get(b.index)
        if not (isinstance(w, OpCall) and w.spec.name == "t" and len(b.shape) == 2):
            return False
        m, k = a.shape
        return m > 1 and m * k * b.shape[1] >= TPROD_MIN

    tprod: dict[int, bool] = {}
    fortran: set[int] = set()
    epilogue: dict[int, OpCall] = {}
    events = program.events
    for i, call in enumerate(events):
        if not isinstance(call, OpCall) or not product(call):
            continue
        out = call.outputs[0]
        members, todo, ok = [], [out], True
        while todo and ok:
            v = todo.pop()
            members.append(v.index)
            for c, pos in uses.get(v.index, []):
                if c is not None and c.spec.name in ("mm", "addmm") and \
                        pos == len(c.inputs) - 2:
                    continue  # the first operand of a product: BLAS takes it transposed
                if c is None or not ufunc_forward(c):
                    ok = False
                    break
                if c.outputs[0].shape == out.shape and c.outputs[0].index not in members:
                    todo.append(c.outputs[0])
        if not ok and call.inputs[-2].shape[1] < TPROD_COPY_K:
            continue  # the copy back row-major (a transposing bias add) costs more than
            # the column-major product saves: formed as written
        tprod[out.index] = ok
        if ok:
            fortran.update(members)
            readers = uses.get(out.index, [])
            nxt = events[i + 1] if i + 1 < len(events) else None
            bias = call.inputs[0]
            if call.spec.name == "addmm" and isinstance(nxt, OpCall) and len(readers) == 1 \
                    and readers[0][0] is nxt and nxt.spec.name == "relu" and \
                    nxt.outputs[0].shape == out.shape and bias.shape == out.shape[1:]:
                epilogue[out.index] = nxt
    return tprod, fortran, epilogue


def generate(program: Program, backend) -> Generated:
    """Write the module text for ``program`` (raises Unsupported with the reason)."""
    ctx = _Ctx(backend)
    layout = Layout()
    leaves = {v.slot: v for v in program.values if v.kind == "leaf"}
    layout.leaves = sorted(leaves)
    body: list[str] = []
    ops_so_far: list[OpCall] = []
    grad_state: dict[int, str] = {}
    for v in program.values:  # tensors creation functions made inside fn: constants
        if v.kind == "const":
            ctx.alloc(f"{v.name} = {ctx.bind(program.consts[v.slot], f'C{v.slot}')}")
    groups = ctx.plan = fuse.plan(program)
    ctx.tprod, ctx.fortran, ctx.epilogue = _transposed_products(program, groups)
    for k, event in enumerate(program.events):
        if isinstance(event, OpCall):
            ops_so_far.append(event)
            if id(event) in groups.skip:
                continue
            if id(event) in ctx.written:
                body += [f"{v.name} = {ctx.buf(v)}" for v in event.outputs]
                continue
            group = groups.first.get(id(event))
            if group is not None:
                body += fuse.call_code(group, ctx)
            else:
                body += forward_code(event, ctx)
        elif isinstance(event, CustomCall):  # its forward's ops came just before it
            ops_so_far.append(event)
            body += [f"{o.name} = {src.name}" for o, src in zip(event.outputs, event.sources)]
        elif isinstance(event, Backward):
            _backward(ops_so_far, event.root, ctx, body, grad_state, layout)
        elif isinstance(event, ZeroGrad):  # slots: leaf slots, ("arg", position)
            for slot in event.leaves:
                grad_state[slot] = "none"
        elif isinstance(event, Step):
            opt = event.opt()
            if opt is None:
                raise Unsupported("the optimizer is gone")
            _step(k, event, opt, leaves, ctx, body, grad_state, layout)
    for slot, state in grad_state.items():
        if type(slot) is tuple:  # an argument's: None (``x.grad = None``) or its array
            layout.arg_grads.append((slot[1], f"GA{slot[1]}" if state == "buf" else None))
            continue
        layout.final_grads[slot] = ctx.buf(leaves[slot], "G") if state == "buf" else None
    outs = _result_names(program.result) + [n for _, n in layout.arg_grads if n]
    body.append(f"return ({''.join(n + ', ' for n in outs)})")
    text = _module_text(program, ctx, layout, body, groups)
    return Generated(text, ctx.constants, layout, groups.kernels, groups)


def _result_names(result) -> list[str]:
    kind, x = result
    if kind == "value":
        return [x.name]
    if kind in ("tuple", "list"):
        return [n for y in x for n in _result_names(y)]
    return []


def _module_text(program: Program, ctx: _Ctx, layout: Layout, body: list, groups) -> str:
    args = [v for kind, v in program.args if kind == "tensor"]
    leaf_names = [next(v.name for v in program.values if v.kind == "leaf" and v.slot == s)
                  for s in layout.leaves]
    lines = ['"""Generated by symgrad.compile from one traced step; do not edit."""',
             "import numpy as np", "",
             "from symgrad.compile.runtime import (MATH, as_out, cat_into, flat, nll_grad,",
             "                                     sum_to, view_grad)", "",
             *(f"{n} = MATH[{n!r}]" for n in sorted(MATH_NAMES)), ""]
    lines += fuse.module_text(groups)
    if groups.kernels:
        lines += ["#: each kernel, its dtype and argument kinds: compiled (or loaded from disk)"
                  " at load",
                  "KERNELS = [" + ", ".join(f"({k}, {d!r}, {c!r})" for k, d, c in groups.kernels)
                  + "]", ""]
    for text in ctx.helpers.values():
        lines += [text]
    lines += ["", "def make(K):"]
    lines += [f"    {name} = K[{name!r}]" for name in ctx.constants]
    lines += [f"    {alloc}" for alloc in ctx.allocs]
    lines += ["", "    def run(A, L, E, H):"]
    if args:
        lines.append(f"        {', '.join(v.name for v in args)}, = A")
    names = leaf_names + [f"S{i}" for i in range(len(layout.state))]
    if names:
        lines.append(f"        {', '.join(names)}, = L")
    lines += [f"        {line}" for line in body]
    grads = sorted({n for n in layout.final_grads.values() if n})
    lines += ["", f"    return run, {{{', '.join(f'{n!r}: {n}' for n in grads)}}}", ""]
    return "\n".join(lines)


MATH_NAMES = ("exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "sign", "where", "maximum",
              "log1p", "expm1", "erf", "pi", "minimum", "pow", "atan2", "hypot")
