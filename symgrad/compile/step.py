"""``CompiledStep``: the callable ``sg.compile`` returns.

Per call: the signature picks a cache entry; an entry gathers the arrays it was generated
for (checking them), runs the generated ``run`` on plain arrays, then sets the leaves'
``.grad`` and wraps what fn returns. No Tensor or Node is made on the way, except the
returned tensors. A new signature traces fn again (up to ``cache_size`` entries); anything
the tracer or the code generator cannot handle makes that signature run eagerly, with one
UserWarning saying why.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import warnings
from collections import ChainMap
from collections.abc import Callable
from typing import Any

import numpy as np

from ..autograd import function as _fn
from ..autograd.record import before_write
from ..backends import backend_for
from ..device import device as _device
from ..dtypes import HALF_NP
from ..tensor import Tensor
from . import fuse, loader, prove
from .codegen import Generated, Unsupported, generate, group_flag
from .cuda_step import generate_cuda
from .graph import Program, Step
from .guards import signature
from .selfcheck import after_state, self_check
from .trace import _copy, trace

__all__ = ["CompiledStep"]


class _Stale(Exception):
    """An entry's leaves or optimizer state no longer fit its code (retrace)."""


class _EagerCall(Exception):
    """This call's arguments fit the signature but not the code (an argument's old .grad
    of another shape or dtype, or with a graph; the same tensor passed twice): run fn
    eagerly this once."""


class Entry:
    """One signature's generated code, bound to the leaves and optimizer it was traced on."""

    def __init__(self, program: Program, gen: Generated, module) -> None:
        self.program = program
        self.generated = gen
        self.layout = gen.layout
        self.module = module
        self.run, grad_buffers = module.make(gen.constants)
        by_slot = {v.slot: v for v in program.values if v.kind == "leaf"}
        self._leaf_values = [by_slot[s] for s in self.layout.leaves]
        self.device = _device(program.device or "cpu")
        self._grad_tensors = {slot: Tensor._wrap(grad_buffers[name], self.device)
                              for slot, name in self.layout.final_grads.items() if name}
        self._opts = {k: e.opt for k, e in enumerate(program.events) if isinstance(e, Step)}
        self._bound: list = []
        #: layout.state as runs of one parameter's keys, in order (one state lookup each)
        self._state_runs: list = []
        for k, slot, key in self.layout.state:
            if self._state_runs and self._state_runs[-1][:2] == (k, slot):
                self._state_runs[-1][2].append(key)
            else:
                self._state_runs.append((k, slot, [key]))
        self._result = program.result
        #: how many of run's outputs are fn's results (the arguments' gradients follow)
        self._n_results = len(_values_of(program.result))
        c = program.constants
        self._constants = c if c is not None and c.active else None
        #: copies of the traced call's tensor arguments (step.verify replays on them)
        self.example: list = []
        #: each optimizer's param lists as traced: a group added or a list replaced retraces
        self._param_lists = {k: [(id(g["params"]), len(g["params"]))
                                 for g in ref().param_groups] for k, ref in self._opts.items()}

    # -- per call -------------------------------------------------------------------------
    def _leaf(self, slot: int):
        t = self.program.leaves[slot]()
        if t is None:
            raise _Stale("a parameter was freed")
        return t

    def _gather(self) -> tuple[list, list, list, dict]:
        """This call's arrays (parameters, then optimizer state), the incoming grads, the
        hyperparameters, and the leaf tensors by slot; each weakref and each parameter's
        state dict is looked up once (the GPT step has 28 parameters and 84 state arrays)."""
        constants = self._constants
        if constants is not None:
            changed = constants.changed()
            if changed is not None:
                raise _Stale(changed)
        opts = {}
        for k, lists in self._param_lists.items():
            opt = opts[k] = self._opts[k]()
            if opt is None or len(opt.param_groups) != len(lists) or any(
                    id(g["params"]) != ps or len(g["params"]) != n
                    for g, (ps, n) in zip(opt.param_groups, lists)):
                raise _Stale("the optimizer's param groups changed")
        refs = self.program.leaves
        tensors = {}
        arrays = []
        for v in self._leaf_values:
            t = tensors[v.slot] = refs[v.slot]()
            if t is None:
                raise _Stale("a parameter was freed")
            if t._requires_grad is not v.requires_grad:
                raise _Stale("a parameter's requires_grad changed")
            arrays.append(t._data)
        for k, slot, keys in self._state_runs:
            opt = opts[k] if k in opts else self._opts[k]()
            t = tensors[slot] if slot in tensors else self._leaf(slot)
            st = opt.state.get(t) if opt is not None else None
            if st is None:
                raise _Stale("the optimizer state changed")
            for key in keys:
                s = st.get(key)
                if s is None:
                    raise _Stale("the optimizer state changed")
                arrays.append(s._data)
        bound = self._bound
        if len(bound) != len(arrays) or any(a is not b for a, b in zip(arrays, bound)):
            self._check_shapes(arrays)
            self._bound = arrays
        else:  # the same list while they are the same arrays: the generated code keeps
            arrays = bound  # what it derived from them (codegen._update_table) for it
        entry = []
        for slot in self.layout.entry_grads:
            if type(slot) is tuple:  # an argument's .grad: filled in by arg_entry
                entry.append(None)
                continue
            g = (tensors[slot] if slot in tensors else self._leaf(slot))._grad
            entry.append(None if g is None else g._data)
        hyper = []
        for (k, gi, keys), (_, _, names, flags) in zip(self.layout.hyper, self.layout.flags):
            group = (opts[k] if k in opts else self._opts[k]()).param_groups[gi]
            values = tuple(group[n] for n in keys)
            if tuple(group_flag(group, n) for n in names) != flags:
                raise _Stale(f"optimizer option {names} changed")
            hyper.append(values)
        return arrays, entry, hyper, tensors

    def _check_shapes(self, arrays: list) -> None:
        for a, v in zip(arrays, self._leaf_values):
            if a.shape != v.shape or a.dtype != v.dtype:
                raise _Stale("a parameter changed shape or dtype")
        for a, (_k, slot, key) in zip(arrays[len(self._leaf_values):], self.layout.state):
            leaf = self._leaf(slot)._data
            if key != "step" and (a.shape != leaf.shape or a.dtype != leaf.dtype):
                raise _Stale("optimizer state changed shape")
        n = len(self._leaf_values)
        for i in self.layout.f32_steps:  # read by the group update loops as such
            if arrays[n + i].dtype != np.float32 or arrays[n + i].size != 1:
                raise _Stale("an optimizer step count changed dtype")
        for a in arrays:
            if not (a.flags.writeable and a.flags.c_contiguous):
                raise _Stale("a parameter or optimizer state array that is not a writable "
                             "C-contiguous array")

    def arg_entry(self, args: tuple, entry: list) -> None:
        """The incoming ``.grad`` of each argument the code accumulates into (in place,
        as eager's ``old += g``), checked to be such an array."""
        seen: set = set()
        for i, _ in self.layout.arg_grads:
            a = args[i]
            if id(a) in seen or a._backward_hooks:
                raise _EagerCall
            seen.add(id(a))
        for k, key in enumerate(self.layout.entry_grads):
            if type(key) is not tuple:
                continue
            a = args[key[1]]
            g = a._grad
            if g is None:
                continue
            d = g._data
            if g._grad_fn is not None or g._device != a._device or not isinstance(
                    d, np.ndarray) or d.shape != a._data.shape or d.dtype != a._data.dtype \
                    or not d.flags.writeable:
                raise _EagerCall
            entry[k] = d

    def __call__(self, args: tuple):
        leaves, entry, hyper, by_slot = self._gather()
        arg_grads = self.layout.arg_grads
        if arg_grads:
            self.arg_entry(args, entry)
        tensors = [a._data for a in args if isinstance(a, Tensor)]
        written = [by_slot[s] if s in by_slot else self._leaf(s) for s in self.layout.written]
        for t in written:  # as eager's optimizer step: graphs recorded before see old values
            before_write(t)
        outs = self.run(tensors, leaves, entry, hyper)
        for t in written:
            t._storage.version += 1
        for slot, name in self.layout.final_grads.items():
            t = by_slot[slot] if slot in by_slot else self._leaf(slot)
            t._grad = self._grad_tensors[slot] if name else None
        if arg_grads:
            got = iter(outs[self._n_results:])
            for i, name in arg_grads:
                a = args[i]
                if name is None:
                    a._grad = None
                    continue
                g = next(got)
                old = a._grad
                if old is not None and old._data is g:  # added into in place (eager's
                    old._bump()                           # in-place add bumps the version)
                else:
                    a._grad = Tensor._wrap(g, self.device)
            outs = outs[:self._n_results]
        return _rebuild(self._result, iter(outs), args, self)



def _values_of(structure) -> list:
    kind, x = structure
    if kind == "value":
        return [x]
    if kind in ("tuple", "list"):
        return [v for y in x for v in _values_of(y)]
    return []


def _rebuild(structure, outs, args, entry):
    kind, x = structure
    if kind == "value":
        arr = next(outs)
        if x.kind == "arg":
            return args[x.slot]
        if x.kind == "leaf":
            return entry._leaf(x.slot)
        if entry.device.type != "cpu":
            return Tensor._wrap(backend_for(entry.device.type).copy(arr), entry.device)
        return Tensor._wrap(arr.copy())
    if kind in ("tuple", "list"):
        items = [_rebuild(y, outs, args, entry) for y in x]
        return tuple(items) if kind == "tuple" else items
    return x


class _Eager:
    """A signature that runs eagerly (the reason was warned once)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _snapshot(a):
    """A tensor argument's array and ``.grad`` as the traced call left them (a background
    self-check reads these while eager calls go on), anything else as it is."""
    if not isinstance(a, Tensor):
        return a
    t = Tensor._wrap(_copy(a._data), a._device)
    g = a._grad
    if g is not None:
        t._grad = Tensor._wrap(_copy(g._data), g._device)
    return t


class _Pending:
    """A signature whose code is generated, compiled, self-checked and proved in a thread
    (``compile(background=True)``); its calls run eagerly until ``outcome`` is set:
    (Entry or None, reason or None, seconds)."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.outcome: tuple | None = None


class CompiledStep:
    """``sg.compile(fn)``: call it as fn; ``source()``, ``verify()`` and ``stats`` help."""

    def __init__(self, fn: Callable, cache_size: int = 8, background: bool = False) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.cache_size = cache_size
        #: generate and compile in a thread after the traced (eager) first call; calls run
        #: eagerly until the code is ready (``wait()`` blocks until then)
        self.background = background
        self._cache: dict = {}
        #: traces, compile seconds of the last one, eager fallbacks (reasons)
        self.stats: dict[str, Any] = {"traces": 0, "compile_s": 0.0, "fallbacks": []}
        self._full_warned = False
        self._retraces: dict = {}  # signature -> how often a guard made it retrace
        self._baked: set = set()  # read paths warned about as baked in (once each)

    def __call__(self, *args, **kwargs):
        if kwargs:
            self._warn("keyword arguments (pass them positionally)")
            return self.fn(*args, **kwargs)
        if _fn._profiler is not None:  # being traced (a compiled step calling this one) or
            return self.fn(*args)      # profiled: run the ops so they are seen
        key, reason = signature(args)
        if key is None:
            return self._eager(reason, args)
        entry = self._cache.get(key)
        if entry is None:
            return self._trace(key, args)
        if type(entry) is _Pending:
            if not self._settle(key, entry, wait=False):
                return self.fn(*args)  # still compiling: eager meanwhile
            entry = self._cache[key]
        if isinstance(entry, _Eager):
            return self.fn(*args)
        try:
            return entry(args)
        except _EagerCall:
            return self.fn(*args)
        except _Stale as exc:
            del self._cache[key]
            n = self._retraces[key] = self._retraces.get(key, 0) + 1
            if n > self.cache_size:  # something changes every few calls: stop retracing
                self._cache[key] = _Eager(str(exc))
                return self._eager(f"retraced {n} times for one signature (last because "
                                   f"{exc}); it runs eagerly from now on", args)
            return self._trace(key, args)

    def _eager(self, reason: str, args: tuple):
        self._warn(reason)
        return self.fn(*args)

    def _warn(self, reason: str) -> None:
        self.stats["fallbacks"].append(reason)
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        warnings.warn(f"sg.compile({name}): running eagerly: {reason}", UserWarning,
                      stacklevel=4)

    def _trace(self, key, args: tuple):
        if len(self._cache) >= self.cache_size:
            if not self._full_warned:
                self._full_warned = True
                self._warn(f"more than {self.cache_size} signatures traced (cache_size); new "
                           "signatures run eagerly")
            return self.fn(*args)
        self.wait()  # a background compile may run tensor ops: never inside a trace
        self.stats["traces"] += 1
        result, program, reason = trace(self.fn, args)
        t0 = time.perf_counter()
        baked = [] if program is None or program.constants is None else [
            b for b in program.constants.unguarded if b not in self._baked]
        if baked:
            self._baked.update(baked)
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            warnings.warn(f"sg.compile({name}): values read through a property are baked "
                          f"into the compiled step, not guarded (a change is not seen): "
                          f"{', '.join(baked)}; pass them as arguments or keep them in a "
                          "plain attribute", UserWarning, stacklevel=3)
        if program is not None and self.background and program.device != "cuda":
            # the arguments as traced: eager calls meanwhile may change them in place
            snap = tuple(_snapshot(a) for a in args)
            after = after_state(program)  # what the self-check compares with, as of now
            pending = _Pending()

            def work() -> None:
                t1 = time.perf_counter()
                try:
                    entry, why = self._compile(program, snap, result, after)
                except BaseException as exc:  # noqa: BLE001 - reported, and it stays eager
                    entry, why = None, (f"background compile failed ({type(exc).__name__}: "
                                        f"{exc})")
                pending.outcome = (entry, why, time.perf_counter() - t1)

            pending.thread = threading.Thread(target=work, name="symgrad-compile", daemon=True)
            self._cache[key] = pending
            pending.thread.start()
            return result
        if program is not None:
            entry, reason = self._compile(program, args, result)
            if entry is not None:
                self._cache[key] = entry
        if reason is not None:
            self._cache[key] = _Eager(reason)
            self._warn(reason)
        self.stats["compile_s"] = time.perf_counter() - t0
        return result

    def _settle(self, key, pending: _Pending, wait: bool) -> bool:
        """Take a background compile's outcome into the cache (warning here, in the
        caller's thread, if it runs eagerly); False while it is still running."""
        if wait:
            pending.thread.join()
        elif pending.thread.is_alive():
            return False
        entry, reason, seconds = pending.outcome
        self.stats["compile_s"] = seconds
        if self._cache.get(key) is pending:
            if reason is None:
                self._cache[key] = entry
            else:
                self._cache[key] = _Eager(reason)
                self._warn(reason)
        return True

    def wait(self) -> None:
        """Block until every background compile of this step is done (see ``background``)."""
        for key, entry in list(self._cache.items()):
            if type(entry) is _Pending:
                self._settle(key, entry, wait=True)

    def _compile(self, program, args: tuple, result, after: dict | None = None) -> tuple:
        """(Entry, None) for a traced program, or (None, why it runs eagerly); ``after``:
        selfcheck.after_state of the traced call (a background compile checks later)."""
        reason = None
        entry = None
        try:
            if any(v.dtype in HALF_NP for v in program.values):
                raise Unsupported("float16/bfloat16 tensors run eagerly (the generated "
                                  "kernels take float32/float64; eager computes half "
                                  "precision in float32 and rounds once)")
            cuda = program.device == "cuda"
            try:
                # CUDA: a plan of device calls (cuda_step.py), no module text to load
                gen = generate_cuda(program) if cuda else generate(program,
                                                                   backend_for("cpu"))
            except Unsupported:
                raise
            except Exception as exc:  # fn already ran eagerly: its result stands
                raise Unsupported(f"code generation failed (a sg.compile bug: "
                                  f"{type(exc).__name__}: {exc})") from None
            if cuda:
                module = gen.module
            else:
                try:
                    module = loader.load(gen.text)
                    fuse.warm(module)
                except Exception as exc:  # a compile bug: say so, and stay eager
                    raise Unsupported(f"the generated code did not load ("
                                      f"{type(exc).__name__}: {exc})") from None
            try:
                entry = Entry(program, gen, module)
            except Exception as exc:  # make() failed: a compile bug, never fn's error
                raise Unsupported(f"the generated code did not load ("
                                  f"{type(exc).__name__}: {exc})") from None
            entry._gather()  # binds the arrays; raises _Stale if they cannot be used
            entry.example = [_copy(a._data) if isinstance(a, Tensor) else a for a in args]
            reason = self_check(entry, args, result, after)
            program.before = {}
            if reason is None:
                reason = self._prove(entry, cuda)
        except (Unsupported, _Stale) as exc:
            reason = str(exc)
        return (entry, None) if reason is None else (None, reason)

    def _prove(self, entry: Entry, cuda: bool) -> str | None:
        """Each fused backward loop (a CUDA step: each fused run's kernels) against SymPy's
        derivative, once per generated code (the outcome is kept in the disk cache): None,
        or why it is not used."""
        try:
            self.stats["proofs"] = prove.cuda_at_generation(entry.module.runs) if cuda else \
                prove.at_generation(entry.module, entry.generated.plan)
        except prove.ProofFailed as exc:
            what = "fused CUDA kernel" if cuda else "generated fused backward loop"
            return f"a {what} failed its SymPy proof: {exc}"
        return None

    # -- inspection -----------------------------------------------------------------------
    def _entries(self) -> list:
        self.wait()
        return [e for e in self._cache.values() if isinstance(e, Entry)]

    def source(self) -> str:
        """The generated module of every compiled signature (the latest last)."""
        entries = self._entries()
        if not entries:
            raise RuntimeError("nothing compiled yet: call the step first")
        return "\n\n".join(e.generated.text for e in entries)

    def _leaf_names(self, entry, root, copies: dict, namespace) -> dict:
        """``{name: copy}`` for the replayed graph's leaves, named as every view names the
        tensors they stand for (``symgrad._naming``): a parameter by its own name or module
        path (``fc1.weight``), an argument by ``fn``'s parameter name, then the variables of
        ``fn``'s code and of the caller, else ``t0, t1, ...`` in the graph's leaf order."""
        from .._naming import argument_names, function_namespace, leaf_order, unique_names

        program = entry.program
        original: dict[int, Any] = {}  # id(copy) -> the tensor the copy stands for
        explicit: dict[str, Any] = {}
        params = dict((k, name) for k, (name, _) in
                      enumerate(argument_names(self.fn, entry.example)))
        for key, copy in copies.items():
            slot = int(key[4:] if key.startswith("leaf") else key[3:])
            if key.startswith("leaf"):
                t = program.leaves[slot]()
                if t is not None:
                    original[id(copy)] = t
            elif slot in params:
                explicit.setdefault(params[slot], copy)
        order = leaf_order(root)
        stand_ins = [original.get(id(c), c) for c in order]
        ns = ChainMap(function_namespace(self.fn, entry.example), namespace)
        return dict(zip(unique_names(stand_ins, explicit, ns), order))

    def verify(self, **kwargs):
        """Prove the latest signature's step and return the Report (a finding is a report,
        not an exception): ``sg.verify`` on its traced forward, replayed on the CPU on
        copies of the current parameters and of the traced call's arguments (no side
        effects; a CUDA step's arrays are read back to the host); the generated code's
        gradients (a fresh instance, on copies on its own device) compared with the eager
        engine's on that replay; and each fused backward loop (a CUDA step: each fused
        run's kernels) proved against SymPy's derivative (``stats["proofs"]``).

        The compiled part is ``report.compiled``: one row per fused kernel and per gradient
        that disagrees (kind, name, status, detail, derivation: the ops a kernel fuses and
        its loop's source, or the generated statements that compute the gradient). A wrong
        kernel or gradient makes the report not ok, status ``mismatch``, with
        ``report.bad_kernel`` naming it. Keywords go to ``sg.verify`` (``mode="auto"``
        picks local checks on big shapes)."""
        from .replay import check_generated, replay

        entries = self._entries()
        if not entries:
            raise RuntimeError("nothing compiled yet: call the step first")
        entry = entries[-1]
        from .._naming import caller_namespace

        root, copies = replay(entry.program, entry.example)
        names = self._leaf_names(entry, root, copies, caller_namespace())
        # symgrad.verify is the public, lazy entry to the verifier (it sits above the core,
        # which may not import it); the package is loaded whenever a step exists
        kwargs.setdefault("names", names)
        kwargs.setdefault("namespace", {})
        report = sys.modules["symgrad"].verify(root, **kwargs)
        arrays, _, hyper, _ = entry._gather()
        problems = check_generated(entry.program, entry.example, entry.module.make,
                                   entry.generated.constants, entry.layout, arrays, hyper)
        rows = [_disagreement_row(p, entry.generated.text) for p in problems]
        cuda = entry.device.type == "cuda"
        # CUDA: each fused run's kernels (cuda_fused.py), as loaded, on their derivation
        kernels = (prove.prove_each_run(entry.module.runs) if cuda else
                   prove.prove_each(entry.module, entry.generated.plan))
        self.stats["proofs"] = {r["name"]: r["how"] if r["status"] == "ok" else r["detail"]
                                for r in kernels}
        _attach_compiled(report, kernels + rows, cuda)
        return report


def _writers(text: str, buffer: str | None) -> str:
    """The generated statements that write gradient buffer ``buffer`` (its derivation in
    the generated code), from the module's ``run``."""
    import re

    if not buffer:
        return "(returned by the generated run)"
    word = re.compile(rf"\b{re.escape(buffer)}f?\b")
    body = text.split("    def run(", 1)[-1]
    lines = [ln.strip() for ln in body.splitlines()
             if word.search(ln) and "np.empty" not in ln and "_update(" not in ln
             and not ln.strip().startswith(("return", "def "))]
    return "\n".join(lines)


def _disagreement_row(problem, text: str) -> dict:
    """A gradient where the generated code and eager disagree, as a report row."""
    key = getattr(problem, "key", None)
    return {"kind": "generated gradient", "name": f"gradient of {key}" if key else "gradient",
            "status": "mismatch", "how": None, "detail": str(problem),
            "derivation": _writers(text, getattr(problem, "buffer", None))}


def _attach_compiled(report, rows: list, cuda: bool) -> None:
    """The compiled step's rows on the Report: a wrong kernel or gradient makes it not ok
    (status ``mismatch``), named by ``bad_kernel`` (a wrong fused kernel before a gradient
    that disagrees: the kernel is the cause, the gradient its effect)."""
    report.compiled = rows
    bad = [r for r in rows if r["status"] != "ok"]
    if not bad:
        return
    first = next((r for r in bad if r["kind"] != "generated gradient"), bad[0])
    report.bad_kernel = first["name"]
    report.ok = False
    if report.status in ("", "ok"):
        report.status = "mismatch"
    where = "CUDA step" if cuda else "compiled step"
    for r in bad:
        report.notes.append(f"{where}: {r['kind']} {r['name']}: {r['status']}: {r['detail']}")
