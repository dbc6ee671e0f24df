"""A traced step on 'cuda' tensors: the program run on device arrays, no Tensor per op.

The CPU path writes NumPy text (codegen.py); here the same ``Layout`` and ``make(K) ->
(run, grad buffers)`` interface is filled by a plan of prepared calls that ``run``
executes in order on the CUDA backend's arrays (everything stays on the device):

- each op's forward is the op's own ``spec.forward(cuda_backend, *arrays, **params)``
  (the kernels eager runs), with eager's dtype casts decided at generation;
- the backward walks the traced ops in reverse as the engine does: an op with a
  ``fused_backward`` kernel on the backend calls it with the saved operands as arrays
  (eager's no-graph path, so the same kernels and results); other ops run their tensor
  formulas on tensors wrapping the device arrays (under no_grad); gradients are summed
  back over broadcast dims and cast as the engine's ``_fit_to_inputs`` does, and land in
  persistent ``.grad`` buffers on the device;
- SGD and Adam updates are eager's backend calls on the arrays, in its order (Adam's
  ``step`` count stays where eager keeps it, on the host);
- an elementwise run fwdbwd.py designs is cuda_fused.py's kernels: values and partials
  in one kernel in place of the run's ops, ``g * P`` in the backward (or nothing, when
  the forward wrote the gradient of a loss-sum seed).

Custom autograd Functions: the ops their backward ran in the traced call, replayed on
the device (as codegen does on the CPU). Everything the tracer accepts and the backend
runs is reproduced; a CustomCall the CPU path refuses is refused here too.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..autograd import function as _fn
from ..autograd.grad_mode import no_grad
from ..backends import backend_for
from ..device import device as _device
from ..tensor import Tensor
from .codegen import _HYPER, Generated, Layout, Unsupported
from .formulas import op_backward as _op_backward
from .graph import Backward, CustomCall, OpCall, Program, Step, Value, ZeroGrad, ancestors

__all__ = ["generate_cuda"]


class _Module:
    """Stands for a generated module: ``make(K)``, a readable listing, and the fused runs
    (``_Fused``: each one's kernels module, group and derivation) that ``step.verify()``
    proves against SymPy."""

    def __init__(self, build, text: str, runs: list) -> None:
        self._build = build
        self.text = text
        self.runs = runs

    def make(self, constants):
        return self._build()


def _forward(call: OpCall, be):
    """One op's forward on arrays, with the casts eager's apply makes (decided now)."""
    spec, params = call.spec, dict(call.params)
    outs = call.outputs
    ins = call.inputs
    tensors = [x for x in ins if isinstance(x, Value)]
    casts: dict[int, Any] = {}
    if tensors and (len({x.dtype for x in tensors}) > 1 or len(tensors) < len(ins)):
        fakes = [Tensor._wrap(np.zeros((1,) * len(x.shape), x.dtype)) if isinstance(x, Value)
                 else x for x in ins]
        _, arrays = _fn._promote_and_cast(spec, fakes, params, backend_for("cpu"), Tensor)
        for j, (x, a) in enumerate(zip(ins, arrays)):
            if isinstance(x, Value) and a.dtype != x.dtype:
                casts[j] = a.dtype
    n_out = len(spec.outputs)
    out_dtypes = [o.dtype for o in outs]

    tensor_params = [(k, v.index) for k, v in params.items() if isinstance(v, Value)]

    def run(env):
        arrays = [env[x.index] if isinstance(x, Value) else x for x in ins]
        for k, i in tensor_params:  # a tensor passed as a parameter (nll_loss's target)
            params[k] = env[i]
        for j, dt in casts.items():
            arrays[j] = be.cast(arrays[j], dt)
        out = spec.forward(be, *arrays, **params)
        if n_out == 1 and not spec.variadic_outputs:
            out = _fn.as_array(out)
            if out.dtype != out_dtypes[0] and spec.dtype_rule != "bool_compare":
                out = be.cast(out, out_dtypes[0])
            env[outs[0].index] = out
            return
        for k, (o, v) in enumerate(zip(out, outs)):
            o = _fn.as_array(o)
            if k == 0 and o.dtype != v.dtype and spec.dtype_rule != "bool_compare":
                o = be.cast(o, v.dtype)
            env[v.index] = o
    return run


class _Fused:
    """A run fwdbwd.py designed (forward values + partials together) as cuda_fused.py's
    kernels: its forward replaces the run's ops, its backward (``g * P``, or nothing when
    the forward already wrote the gradients) replaces theirs."""

    def __init__(self, group, be) -> None:
        from . import cuda_fused

        self.group, self.be, self.cf = group, be, cuda_fused
        self.code = cuda_fused.derive(group, group.design)
        self.name = group.name
        self.module = cuda_fused.load(self.name, self.code)
        out = group.calls[0].outputs[0]
        self.shape, self.dtype, self.n = out.shape, out.dtype, int(np.prod(out.shape))
        names = {p for st in self.code["stages"] for p in st[2]}
        if self.code["backward"]:
            names |= set(self.code["backward"]["params"])
        # not the run's inputs (in<j>) nor the seeds' incoming gradients (e<p>)
        self.own = sorted(n for n in names if not re.fullmatch(r"in\d+|e\d+", n))

    def buffers(self) -> dict:
        """The run's own device buffers (exports, partials, results), made once per make."""
        return {n: self.be.empty(self.shape, self.dtype) for n in self.own}

    def _flat(self, a):
        return self.cf.flat(a if a.is_contiguous else self.be.copy(a))

    def forward(self, env, bufs: dict) -> None:
        args = {n: self.cf.flat(a) for n, a in bufs.items()}
        for j, x in enumerate(self.group.inputs):
            args[f"in{j}"] = self._flat(env[x.index])
        self.cf.forward(self.module, self.name, self.code, args)
        for p in self.group.design.export:
            env[self.group.calls[p].outputs[0].index] = bufs[f"ex{p}"]
        env[("fused", self.name)] = args, bufs

    def backward(self, env, grads: dict) -> list:
        """(input value, gradient) pairs of the run's inputs that need one."""
        d, (args, bufs) = self.group.design, env[("fused", self.name)]
        if self.code["backward"] is not None:
            for p in d.seeds:
                g = grads[self.group.calls[p].outputs[0].index]
                if tuple(g.shape) != tuple(self.shape):
                    g = self.be.broadcast_to(g, self.shape)
                args[f"e{p}"] = self._flat(g)
            self.cf.backward(self.module, self.name, self.code, args)
        return [(self.group.inputs[j], bufs[f"r{j}"]) for j in d.wrt]


class _Custom:
    """A custom Function's backward: the ops its ``backward`` ran in the traced call,
    replayed on the incoming gradients and the traced forward values (a wrong backward is
    reproduced, as eager runs it), summed back to each input's shape as the engine's
    ``_fit_to_inputs`` does (codegen._custom_backward's CUDA form)."""

    def __init__(self, call: CustomCall, need: set, be) -> None:
        name = self.name = f"custom {call.cls.__name__}"
        if call.backward_ops is None:
            raise Unsupported(f"custom Function {call.cls.__name__}: its backward did not "
                              "run in the traced call")
        self.call, self.be = call, be
        self.ops = [_forward(op, be) for op in call.backward_ops]
        self.results = []
        for j, g in zip(call.positions, call.grad_outputs):
            x = call.inputs[j]
            if g is None or not isinstance(x, Value) or x.index not in need:
                continue
            if g.dtype != x.dtype:
                raise Unsupported(f"{name}'s backward returns a {g.dtype} gradient for a "
                                  f"{x.dtype} input (eager casts; no compile rule yet)")
            self.results.append((x, g))

    def backward(self, env, grads: dict) -> list:
        call, be = self.call, self.be
        if not any(o.index in grads for o in call.outputs):
            return []
        for out, v, from_grad in call.incoming(lambda o: o.index in grads):
            env[v.index] = grads[out.index] if from_grad else be.full(v.shape, 0, v.dtype)
        for run in self.ops:
            run(env)
        out = []
        for x, g in self.results:
            a = env[g.index]
            if tuple(a.shape) != tuple(x.shape):
                with no_grad():
                    a = Tensor._wrap(a, _device("cuda")).sum_to_size(x.shape)._data
            out.append((x, a))
        return out


class _Builder:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.be = backend_for("cuda")
        self.dev = _device("cuda")
        self.layout = Layout()
        self.leaves = {v.slot: v for v in program.values if v.kind == "leaf"}
        self.layout.leaves = sorted(self.leaves)
        self.plan: list = []  # functions(env, ctx)
        self.text: list[str] = []
        self.grad_state: dict[int, str] = {}

    def state_index(self, k: int, slot: int, key: str) -> int:
        entry = (k, slot, key)
        if entry not in self.layout.state:
            self.layout.state.append(entry)
        return len(self.layout.leaves) + self.layout.state.index(entry)

    def build(self) -> Generated:
        from . import fuse

        groups = fuse.plan(self.program)
        self.fused: dict = {}  # id(call) -> _Fused, for every call of a designed run
        self.fused_bufs: dict = {}
        for group in groups.fused_groups:
            f = _Fused(group, self.be)
            for c in group.calls:
                self.fused[id(c)] = f
        ops: list = []
        for k, event in enumerate(self.program.events):
            if isinstance(event, OpCall):
                ops.append(event)
                f = self.fused.get(id(event))
                if f is not None:
                    if event is f.group.calls[0]:
                        self.plan.append(lambda env, ctx, f=f: f.forward(env, ctx["F"][f.name]))
                        self.text.append(f"fused kernels {f.name} ("
                                         f"{', '.join(c.spec.name for c in f.group.calls)}) -> "
                                         + ", ".join(f.group.calls[p].outputs[0].name
                                                     for p in f.group.design.export))
                    continue
                fwd = _forward(event, self.be)
                self.plan.append(lambda env, ctx, f=fwd: f(env))
                self.text.append(f"forward {event.spec.name} -> "
                                 f"{', '.join(o.name for o in event.outputs)}")
            elif isinstance(event, CustomCall):  # its forward's ops came just before it
                ops.append(event)
                pairs = [(o.index, src.index) for o, src in zip(event.outputs, event.sources)]

                def alias(env, ctx, pairs=pairs):
                    for o, src in pairs:
                        env[o] = env[src]
                self.plan.append(alias)
                self.text.append(f"custom Function {event.cls.__name__} -> "
                                 f"{', '.join(o.name for o in event.outputs)}")
            elif isinstance(event, Backward):
                self.backward(list(ops), event.root)
            elif isinstance(event, ZeroGrad):
                for slot in event.leaves:
                    self.grad_state[slot] = "none"
            elif isinstance(event, Step):
                opt = event.opt()
                if opt is None:
                    raise Unsupported("the optimizer is gone")
                self.step(k, event, opt)
        for slot, state in self.grad_state.items():
            self.layout.final_grads[slot] = f"G{slot}" if state == "buf" else None
        result = _result_values(self.program.result)
        return self.finish(result)

    def backward(self, ops: list, root: Value) -> None:
        be = self.be
        need = ancestors(ops, root)
        steps = []
        seen: set = set()
        for call in reversed(ops):
            if not any(o.index in need for o in call.outputs):
                continue
            if isinstance(call, CustomCall):
                steps.append((_Custom(call, need, be), None))
                continue
            f = self.fused.get(id(call))
            if f is not None:
                if f.name not in seen:
                    seen.add(f.name)
                    steps.append((f, None))
                continue
            if call.spec.grad_fn is None:
                continue
            if not call.spec.grads:
                raise Unsupported(f"no backward for {call.spec.name}")
            steps.append((call, _op_backward(call, be, self.dev)))
        leaf_steps = []
        for idx in sorted(need):
            v = self.program.values[idx]
            if v.kind == "arg":
                raise Unsupported("an argument that requires grad in a CUDA step (input "
                                  "gradients are compiled on the CPU)")
            if v.kind != "leaf":
                continue
            state = self.grad_state.get(v.slot, "entry")
            if state == "entry" and v.slot not in self.layout.entry_grads:
                self.layout.entry_grads.append(v.slot)
            e = self.layout.entry_grads.index(v.slot) if state == "entry" else -1
            leaf_steps.append((v, state, e))
            self.grad_state[v.slot] = "buf"
        shape, dtype = root.shape, root.dtype

        def run(env, ctx):
            grads = {root.index: ctx["ONE"].setdefault(root.index,
                                                       be.full(shape, 1, dtype))}
            for call, back in steps:
                if back is None:  # a fused run
                    for x, g in call.backward(env, grads):
                        old = grads.get(x.index)
                        grads[x.index] = g if old is None else be.add(old, g)
                    continue
                gs = [grads.get(o.index) for o in call.outputs]
                if all(g is None for g in gs):
                    continue
                for x, g in zip(call.inputs, back(env, gs)):
                    if g is None or x.index not in need:
                        continue
                    old = grads.get(x.index)
                    grads[x.index] = g if old is None else be.add(old, g)
            for v, state, e in leaf_steps:
                g = grads.get(v.index)
                if g is None:
                    continue
                buf = ctx["G"][v.slot]
                if state == "buf":
                    be.add_(buf, g)
                elif state == "entry" and ctx["E"][e] is not None:
                    be.copy_(buf, be.add(ctx["E"][e], g))
                else:
                    be.copy_(buf, g)
        self.plan.append(run)
        self.text.append(f"backward from {root.name}: "
                         + ", ".join(c.name if b is None else c.spec.name for c, b in steps))

    def step(self, k: int, event: Step, opt) -> None:
        be, layout = self.be, self.layout
        decoupled = bool(event.kind == "adam"
                         and opt.param_groups[0].get("decoupled_weight_decay"))
        for gi, (group, slots) in enumerate(zip(opt.param_groups, event.groups)):
            h = len(layout.hyper)
            layout.hyper.append((k, gi, _HYPER[event.kind]))
            wd_on = group["weight_decay"] != 0
            items = []
            for slot in slots:
                state = self.grad_state.get(slot, "entry")
                if state == "none":
                    continue
                if state != "buf":
                    raise Unsupported("optimizer.step() on gradients from before the call (no "
                                      "zero_grad/backward inside fn)")
                p = layout.leaves.index(slot)
                if event.kind == "sgd":
                    items.append((slot, p, self.state_index(k, slot, "momentum_buffer")
                                  if group["momentum"] != 0 else None))
                else:
                    items.append((slot, p, *(self.state_index(k, slot, key) for key in
                                             ("step", "exp_avg", "exp_avg_sq"))))
            if event.kind == "sgd":
                mom_on = group["momentum"] != 0
                layout.flags.append((k, gi, ("momentum", "weight_decay"), (mom_on, wd_on)))

                def run(env, ctx, items=items, h=h, mom_on=mom_on, wd_on=wd_on):
                    lr, momentum, wd = ctx["H"][h]
                    lr = float(lr)
                    L = ctx["L"]
                    for slot, p, b in items:
                        d = ctx["G"][slot]
                        if wd_on:
                            d = be.add(d, be.mul(L[p], wd))
                        if mom_on:
                            buf = L[b]
                            be.mul_(buf, momentum)
                            be.add_(buf, d)
                            d = buf
                        be.add_scaled_(L[p], d, -lr)
            else:
                layout.flags.append((k, gi, ("weight_decay", "decoupled_weight_decay"),
                                     (wd_on, decoupled)))

                def run(env, ctx, items=items, h=h, wd_on=wd_on):
                    lr, (beta1, beta2), eps, wd = ctx["H"][h]
                    lr = float(lr)
                    L = ctx["L"]
                    for slot, p, s, m_i, v_i in items:
                        s_arr = L[s]
                        if isinstance(s_arr, np.ndarray):
                            np.add(s_arr, 1, out=s_arr)
                            step = float(s_arr)
                        else:  # a step count kept on the device: eager reads it back too
                            be.add_(s_arr, 1)
                            step = float(be.to_host(s_arr))
                        g = ctx["G"][slot]
                        if wd_on:
                            if decoupled:
                                be.mul_(L[p], 1 - lr * wd)
                            else:
                                g = be.add(g, be.mul(L[p], wd))
                        m, v = L[m_i], L[v_i]
                        be.add_(m, be.mul(be.sub(g, m), 1 - beta1))
                        be.mul_(v, beta2)
                        be.add_(v, be.mul(be.mul(g, 1 - beta2), g))
                        step_size = lr / (1 - beta1 ** step)
                        bc2_sqrt = (1 - beta2 ** step) ** 0.5
                        denom = be.add(be.div(be.sqrt(v), bc2_sqrt), eps)
                        be.add_(L[p], be.div(be.mul(m, -step_size), denom))
            self.plan.append(run)
            self.text.append(f"{event.kind} step, group {gi}: parameters "
                             f"{[s for s, *_ in items]}")

    def finish(self, result: list) -> Generated:
        be, layout, program = self.be, self.layout, self.program
        plan = list(self.plan)
        args = [v for kind, v in program.args if kind == "tensor"]
        leaf_values = [self.leaves[s] for s in layout.leaves]
        final = {slot: name for slot, name in layout.final_grads.items() if name}
        n_leaves = len(leaf_values)
        consts = [(v, program.consts[v.slot]) for v in program.values if v.kind == "const"]

        def build():
            G = {slot: be.empty(self.leaves[slot].shape, self.leaves[slot].dtype)
                 for slot in self.leaves}
            F = {f.name: f.buffers() for f in set(self.fused.values())}
            ctx: dict = {"G": G, "ONE": {}, "F": F}
            env: dict = {}

            def run(A, L, E, H):
                for v, a in zip(args, A):
                    env[v.index] = a
                for v, a in zip(leaf_values, L[:n_leaves]):
                    env[v.index] = a
                for v, a in consts:  # made inside fn by creation functions
                    env[v.index] = a
                ctx["L"], ctx["E"], ctx["H"] = L, E, H
                for f in plan:
                    f(env, ctx)
                out = tuple(env[v.index] for v in result)
                env.clear()  # hold no array of this call past it
                return out
            return run, {name: G[slot] for slot, name in final.items()}

        text = "\n".join(['"""CUDA step plan (symgrad.compile.cuda_step): each line one '
                          'prepared call on device arrays."""'] + self.text)
        gen = Generated(text, {}, layout, [], None)
        runs = sorted(set(self.fused.values()), key=lambda f: f.group.index)
        gen.module = _Module(build, text, runs)
        return gen


def _result_values(result) -> list:
    kind, x = result
    if kind == "value":
        return [x]
    if kind in ("tuple", "list"):
        return [v for y in x for v in _result_values(y)]
    return []


def generate_cuda(program: Program) -> Generated:
    """The plan of a CUDA step (raises Unsupported with the reason); ``.module.make``."""
    return _Builder(program).build()
