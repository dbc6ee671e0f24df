"""``verify``: run the modes over a recorded graph and assemble the Report."""

from __future__ import annotations

import contextvars
import time

import mpmath
import numpy as np

from . import _engine as E
from ._common import all_finite, exact_zero
from .exact import SymbolicGraph, TimeoutExpired
from .fanout import node_checks, node_rngs
from .fanout import resolve as _resolve_fan
from .fd import fd_cost, fd_gradient
from .graph import Graph
from .local import rounding_bound
from .report import LeafRow, NodeRow, Report, as_index

__all__ = ["verify", "EXACT_BUDGET", "EXACT_BUDGETS", "DEFAULT_TOLERANCES",
           "VerifierBudgetError", "exact_cost"]

#: auto mode runs exact while the graph's estimated scalar operations stay under the
#: budget of the engine in use. Measured by benchmarks/bench_verify.py (a 32x48 @ 48x32
#: tanh layer, cost 101k): exact mode costs ~13 us per scalar op with symengine and
#: ~37 us with SymPy alone on a quiet machine (3-4x that with the 2 cores busy; mpmath
#: evaluation dominates), so both budgets keep an auto-mode exact run near 2 s.
EXACT_BUDGETS = {"symengine": 150_000, "sympy": 50_000}
EXACT_BUDGET = None  # set a number here to override both (tests do)

#: dtype-aware defaults: element i passes when
#: |engine_i - exact_i| <= atol + rtol * (|exact_i| + mean_j |exact_j|).
DEFAULT_TOLERANCES = {"float32": (1e-4, 1e-6), "float64": (1e-8, 1e-12),
                      "float16": (1e-2, 1e-4), "bfloat16": (2e-2, 1e-3)}

#: finite differences are taken at most at this many elements per leaf (seeded sample).
FD_SAMPLES = 16
#: in local mode (big graphs) finite differences are a spot check at this many elements.
FD_SAMPLES_LOCAL = 3
#: ... within about this many replays of the whole graph (big graphs: one element a leaf)
FD_LOCAL_REPLAYS = 4


#: The cost estimate auto mode compares with the budget (``exact_cost``): the scalar
#: operations of the replay, plus a per-node overhead (replay, atomizing, partials: about
#: 0.33 ms a node with symengine, 25 scalar operations' worth, measured on a 4,000-node
#: chain), plus for fused ops whose every output depends on a whole dim (softmax ...)
#: their input size x that dim's length x a factor (each output has a partial per element
#: of its dim; with the closed-form partials of fused.py a 16x17 softmax takes 0.11 s,
#: log_softmax 0.13 s, logsumexp 0.02 s; 32x33 0.8-1.0 s, 48x49 2.6-3.1 s).
NODE_COST = 25
FUSED_COST = {"softmax": 3, "log_softmax": 3, "logsumexp": 1}


def exact_cost(graph) -> int:
    """The estimated cost of an exact run, in the units of EXACT_BUDGETS."""
    total = graph.scalar_ops() + NODE_COST * len(graph.nodes)
    for g in graph.nodes:
        f = FUSED_COST.get(getattr(g.spec, "name", None))
        if not f or not g.inputs:
            continue
        shape = graph._shape_of(g.inputs[0])
        dims = g.params.get("dim", -1)
        dims = dims if isinstance(dims, (tuple, list)) else (dims,)
        n = int(np.prod(shape)) if shape else 1
        for d in dims:
            d = int(d)
            d = d - 2 ** 64 if d >= 2 ** 63 else d
            if shape and -len(shape) <= d < len(shape):
                n *= int(shape[d])
        total += f * n
    return int(total)


class VerifierBudgetError(RuntimeError):
    """mode='exact' on a graph over the exact-mode budget, with no timeout given."""


def _dtype_name(dt) -> str:
    return np.dtype(dt).name


def _tol_factory(rtol, atol):
    def tol_for(dt):
        name = _dtype_name(dt)
        r, a = DEFAULT_TOLERANCES.get(name, DEFAULT_TOLERANCES["float64"])
        return (r if rtol is None else rtol), (a if atol is None else atol)

    #: rtol/atol given: they replace the rounding bound (docs/verifier.md)
    tol_for.user = rtol is not None or atol is not None
    return tol_for


def _as_numpy(x):
    if x is None:
        return None
    if hasattr(x, "_data") and hasattr(x, "grad_fn"):
        return np.asarray(x.detach().numpy())
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _to_graph(root, names, namespace=None) -> Graph:
    from ..tensor import Tensor

    if isinstance(root, Tensor):
        from .graph import walk_symgrad

        return walk_symgrad(root, names, namespace)
    mod = type(root).__module__ or ""
    if mod.startswith("torch"):
        from .torch_graph import walk_torch

        return walk_torch(root, names, namespace)
    raise TypeError(f"verify() expects a symgrad or torch tensor, not {type(root).__name__}")


def _type_name(x) -> str:
    t = type(x)
    mod = t.__module__ or ""
    if mod == "builtins" or mod.startswith("symgrad"):
        return t.__name__
    return f"{mod.split('.')[0]}.{t.__name__}"


def _is_number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and \
        not isinstance(x, (bool, np.bool_))


def _check_args(root, gradient, names, namespace, mode, order, rtol, atol, sample, seed, timeout,
                backend, progress) -> None:
    """TypeError/ValueError naming the argument, before any work (and before a bad value
    could surface as an AttributeError deep inside the verifier)."""
    from collections.abc import Mapping

    from ..tensor import Tensor

    def is_tensor(x) -> bool:
        return isinstance(x, Tensor) or (
            (type(x).__module__ or "").startswith("torch") and hasattr(x, "grad_fn"))

    if isinstance(root, (list, tuple)):
        raise TypeError(f"verify() expects one symgrad or torch tensor, not a "
                        f"{type(root).__name__}: verify each root, or one scalar that "
                        "combines them (verify(a.sum() + b.sum()))")
    if not is_tensor(root):
        raise TypeError(f"verify() expects a symgrad or torch tensor, not {_type_name(root)}")
    if gradient is not None and not (is_tensor(gradient) or _is_number(gradient)
                                     or isinstance(gradient, (np.ndarray, list, tuple))):
        raise TypeError(f"verify(): argument 'gradient' must be a tensor, an array, a number "
                        f"or None, not {_type_name(gradient)}")
    if isinstance(gradient, (np.ndarray, list, tuple)):
        try:
            np.asarray(gradient, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError("verify(): argument 'gradient' must hold numbers (same shape as "
                            "root)") from None
    if names is not None and not isinstance(names, Mapping):
        raise TypeError(f"verify(): argument 'names' must be a mapping of name -> tensor "
                        f"(a dict such as locals() or {{'w': w}}) or None, not "
                        f"{_type_name(names)}")
    if namespace is not None and not isinstance(namespace, Mapping):
        raise TypeError(f"verify(): argument 'namespace' must be a mapping of variable name "
                        f"-> object (such as globals()) or None, not {_type_name(namespace)}")
    if not isinstance(mode, str):
        raise TypeError(f"verify(): argument 'mode' must be str ('auto', 'exact' or "
                        f"'local'), not {_type_name(mode)}")
    if mode not in ("auto", "exact", "local"):
        raise ValueError(f"mode must be 'auto', 'exact' or 'local', not {mode!r}")
    if isinstance(order, (bool, np.bool_)) or order not in (1, 2):
        raise ValueError(f"order must be 1 or 2, not {order!r}")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if v is None:
            continue
        if not _is_number(v):
            raise TypeError(f"verify(): argument '{name}' must be a number or None, not "
                            f"{_type_name(v)}")
        if not v >= 0 or v == float("inf"):  # nan fails >= 0
            raise ValueError(f"verify(): {name} must be a finite number >= 0, got {v!r}")
    if sample is not None:
        if not isinstance(sample, (int, np.integer)) or isinstance(sample, (bool, np.bool_)):
            raise TypeError(f"verify(): argument 'sample' must be a positive int or None, not "
                            f"{_type_name(sample)}")
        if sample < 1:
            raise ValueError(f"verify(): sample must be a positive int or None, got {sample}")
    if seed is not None and (not isinstance(seed, (int, np.integer))
                             or isinstance(seed, (bool, np.bool_))):
        raise TypeError(f"verify(): argument 'seed' must be an int, not {_type_name(seed)}")
    if timeout is not None:
        if not _is_number(timeout):
            raise TypeError(f"verify(): argument 'timeout' must be a number of seconds or "
                            f"None, not {_type_name(timeout)}")
        if not timeout > 0:
            raise ValueError(f"verify(): timeout must be a positive number of seconds or "
                             f"None, got {timeout!r}")
    if not isinstance(backend, str):
        raise TypeError(f"verify(): argument 'backend' must be str ('auto', 'sympy' or "
                        f"'symengine'), not {_type_name(backend)}")
    if progress is not None and not callable(progress):
        raise TypeError(f"verify(): argument 'progress' must be a callable(done, total) or "
                        f"None, not {_type_name(progress)}")


def verify(root, gradient=None, *, names=None, mode: str = "auto", order: int = 1,
           rtol: float | None = None, atol: float | None = None, sample: int | None = None,
           seed: int = 0, timeout: float | None = None, backend: str = "auto",
           progress=None, namespace=None, workers: int | None = None,
           executor=None) -> Report:
    """Check the engine's gradients of ``root`` against SymPy's (see docs/verifier.md).

    Leaves are named as every view names them (``symgrad._naming``): ``tensor.name``,
    then ``names`` (``{"w": w}``), then the owning module's parameter path
    (``fc1.weight``), then a variable of ``namespace`` (default: the calling frame's
    locals and globals), else ``t0, t1, ...``.

    ``progress``: optional ``callback(done, total)`` called as nodes are checked (widgets
    use it for a progress bar; an exception raised in it stops the verifier). Without
    one, long runs show a tqdm bar.

    ``workers=N`` runs the per-node (local) checks in N processes, ``executor=`` on any
    ``concurrent.futures.Executor`` (a ``dask.distributed`` Client's ``get_executor()``
    too): the same report as in one process (fanout.py).
    """
    _check_args(root, gradient, names, namespace, mode, order, rtol, atol, sample, seed, timeout,
                backend, progress)
    fan = _resolve_fan(workers, executor)
    # the report says where nan/inf arise; NumPy's warnings from the replays would be noise
    with np.errstate(all="ignore"):
        return _verify(root, gradient, names, mode, order, rtol, atol, sample, seed, timeout,
                       backend, progress, namespace, fan)


def _verify(root, gradient, names, mode, order, rtol, atol, sample, seed, timeout, backend,
            progress, namespace, fan=None) -> Report:
    t0 = time.perf_counter()
    deadline = None if timeout is None else t0 + float(timeout)
    engine, engine_name = E.pick_engine(backend)
    if namespace is None:
        from .._naming import caller_namespace

        namespace = caller_namespace()
    graph = _to_graph(root, names, namespace)
    #: the outputs the engine made (the forward check's values), before any replay
    graph._recorded = frozenset(graph._values)
    root_shape = graph.root_value.shape
    if gradient is None:
        if graph.root_value.size != 1:
            raise RuntimeError("grad can be implicitly created only for scalar outputs")
        gradient = np.ones(root_shape)
    else:
        gradient = np.asarray(_as_numpy(gradient), dtype=np.float64)
        if gradient.shape != root_shape:
            raise RuntimeError(f"Mismatch in shape: gradient has a shape of "
                               f"{list(gradient.shape)} and root has a shape of "
                               f"{list(root_shape)}.")
    gone = {k: c for k, c in graph.changed.items() if not c.kept}
    if gone:  # checked against values it no longer holds, any verdict would be wrong
        return _changed_report(graph, gone, mode, order, engine_name, t0)
    rng = np.random.default_rng(seed)
    tol_for = _tol_factory(rtol, atol)
    cost = exact_cost(graph)
    chosen = mode
    skipped: list[str] = []
    budget = EXACT_BUDGET if EXACT_BUDGET is not None else EXACT_BUDGETS[engine_name]
    blockers = _not_replayable(graph)
    if mode == "auto":
        chosen = "exact" if cost <= budget and not blockers else "local"
        if blockers:
            skipped.append("exact mode: no SymPy meaning for " + ", ".join(blockers))
        elif chosen == "local":
            skipped.append(f"exact mode: graph cost {cost} scalar ops is over the budget "
                           f"{budget}")
    elif mode == "exact" and blockers:
        raise NotImplementedError("exact mode needs a SymPy meaning for every node; none for "
                                  + ", ".join(blockers) + " (use mode='auto' or 'local')")
    elif mode == "exact" and cost > budget and timeout is None:
        raise VerifierBudgetError(
            f"exact mode on this graph would cost {cost} scalar operations, over the budget "
            f"of {budget} for {engine_name} (about {cost / budget * 3:.0f} s); use "
            "mode='auto' or mode='local' (sampled), or pass timeout=SECONDS to try anyway")
    rep = Report(ok=True, mode=chosen, requested_mode=mode, backend=engine_name, order=order,
                 rtol={}, atol={}, leaves=[], nodes=[], budget=budget, cost=cost,
                 graph_kind=graph.kind, skipped=skipped)
    rep._graph = graph
    rep._gradient = gradient
    for lf in graph.leaves:
        if lf.requires_grad and lf.is_float:
            r, a = tol_for(lf.value.dtype)
            rep.rtol[_dtype_name(lf.value.dtype)] = r
            rep.atol[_dtype_name(lf.value.dtype)] = a
    callback = progress
    progress = _CallbackProgress(callback, 2 * len(graph.nodes)) if callback is not None \
        else _progress(len(graph.nodes), cost)
    try:
        try:
            engine_grads = graph.engine_grads(graph, gradient)
        except Exception as exc:  # noqa: BLE001 - a backward that raises is a finding
            if graph.changed and "modified by an inplace operation" in str(exc):
                return _changed_report(graph, graph.changed, mode, order, engine_name, t0,
                                       "the engine's backward cannot run again on tensors "
                                       "changed since")
            return _raised_report(graph, exc, chosen, mode, order, engine_name, t0, rng)
        if chosen == "exact":
            _run_exact(rep, graph, engine, engine_name, gradient, engine_grads, tol_for, rng,
                       sample, deadline, progress)
            if not rep.ok:
                _run_local(rep, graph, engine, engine_name, rng, sample, tol_for, deadline,
                           progress, fan)
            elif not rep.nodes:
                rep.nodes = [_not_run(g) for g in graph.nodes]
                rep.skipped.append("local checks: every leaf agreed, so they were not needed")
                _run_forward(rep, graph, deadline)
            if order == 2:
                _run_hvp(rep, graph, gradient, tol_for, rng, deadline)
        else:
            _run_local(rep, graph, engine, engine_name, rng, sample, tol_for, deadline,
                       progress, fan)
            _leaf_rows_local(rep, graph, gradient, engine_grads, rng, sample, deadline)
            if order == 2:
                rep.skipped.append("order=2: Hessian-vector products need exact mode "
                                   "(graph over budget)")
        _run_glue(rep, graph, seed, deadline)
    except TimeoutExpired:
        rep.timed_out = True
        rep.ok = False
        rep.notes.append(f"timed out after {timeout} s; results so far are shown")
    finally:
        if progress is not None:
            progress.close()
        if rep._sym is not None:
            rep._sym.progress = None
    if not rep.timed_out:
        _explain_nonfinite(rep, graph, getattr(rep, "_backward_nonfinite", ""))
        if _has_mismatch(rep) and _is_float32(graph) and graph.kind == "symgrad" \
                and not _REPLAYING.get():
            _precision_replay(rep, graph, gradient, mode, sample, seed, deadline, backend)
    rep.status = _status(rep)
    if graph.changed:
        rep.notes.insert(0, _changed_names(graph, graph.changed) + " changed in place after "
                         "the graph was recorded; checked at the values recorded then "
                         "(symgrad.record() kept them)")
    _link_leaves(rep, graph)
    rep.notes.extend(graph.notes)
    rep.notes.extend(_node_notes(graph))
    rep.seconds = time.perf_counter() - t0
    return rep


#: the report status (and leaf row status) of a graph whose leaves changed in place since
#: it was recorded and whose recorded values are gone
CHANGED = "changed in place"


def _changed_names(graph, changed: dict) -> str:
    """``w (version 0 when recorded, 1 now), b (...)``: the leaves in ``changed``."""
    return ", ".join(f"{graph.leaves[k].name} ({c.versions()})" for k, c in changed.items())


def _changed_report(graph, changed: dict, mode, order, engine_name, t0,
                    why: str | None = None) -> Report:
    """The verdict for a graph whose leaves were written in place (an optimizer step,
    ``add_``, ``copy_``, ``zero_``) after it was recorded: its gradients belong to the
    old values, so comparing them with anything computed from the new ones would report
    rounding or disagreement that is neither. One line says which leaves and where the
    check belongs."""
    if why is None:
        why = ("its recorded value is gone" if len(changed) == 1
               else "their recorded values are gone")
    line = (f"{CHANGED}: {_changed_names(graph, changed)} written after the graph was "
            f"recorded; {why}, so nothing was checked: verify before opt.step(), or record "
            "the forward under symgrad.record() (as %%symgrad does)")
    rep = Report(ok=False, mode="local" if mode == "local" else "exact",
                 requested_mode=mode, backend=engine_name, order=order, rtol={}, atol={},
                 leaves=[], nodes=[_not_run(g) for g in graph.nodes],
                 graph_kind=graph.kind, skipped=["every check: " + CHANGED],
                 notes=[line], status=CHANGED)
    rep._graph = graph
    for k in changed:
        lf = graph.leaves[k]
        if lf.requires_grad and lf.is_float:
            rep.leaves.append(LeafRow(lf.name, lf.shape, _dtype_name(lf.value.dtype), None,
                                      None, None, None, None, None, CHANGED, None, 0, False,
                                      lf.latex))
    _link_leaves(rep, graph)
    rep.seconds = time.perf_counter() - t0
    return rep


#: the report status when the engine's backward raised (a shape or dtype error inside a
#: custom Function's backward, say): nothing could be compared
BACKWARD_RAISED = "backward raised"


def _raised_report(graph, exc: Exception, chosen, mode, order, engine_name, t0,
                   rng) -> Report:
    """The verdict for a graph whose backward raised: the node that raised (each node's
    backward is re-run alone on a random cotangent, last node first, as backward meets
    them), the exception's type and message; never the exception itself."""
    what = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    culprit = None
    for g in reversed(graph.nodes):
        if not any(g.needs):
            continue
        vs = [rng.standard_normal(shape).astype(dt if np.dtype(dt).kind == "f" else np.float64)
              for shape, dt in zip(g.out_shapes, g.out_dtypes)]
        try:
            g.backward(graph, g, vs)
        except Exception as node_exc:  # noqa: BLE001
            culprit, what = g, f"{type(node_exc).__name__}: {' '.join(str(node_exc).split())}"
            break
    where = culprit.name if culprit is not None else "the backward"
    line = (f"{BACKWARD_RAISED}: {where} raised {what}; nothing could be compared "
            "(fix the backward, then verify again)")
    rep = Report(ok=False, mode=chosen, requested_mode=mode, backend=engine_name, order=order,
                 rtol={}, atol={}, leaves=[], nodes=[_not_run(g) for g in graph.nodes],
                 graph_kind=graph.kind, skipped=["every check: " + BACKWARD_RAISED],
                 notes=[line], status=BACKWARD_RAISED)
    rep._graph = graph
    if culprit is not None:
        row = rep.nodes[graph.nodes.index(culprit)]
        row.status, row.detail = "error", f"backward raised {what}"
        rep.first_bad_node = culprit.node
    rep.seconds = time.perf_counter() - t0
    return rep


def _node_notes(graph) -> list[str]:
    """The nodes' notes, each said once: ``LogBackward0: <note>``, or for a note several
    nodes share, how many and which (``graph was freed: 12 nodes rebuilt ... (A, B, ...)``)."""
    by_note: dict[str, list[str]] = {}
    for g in graph.nodes:
        if g.note:
            by_note.setdefault(g.note, []).append(g.name)
    out = []
    for note, names in by_note.items():
        if len(names) == 1:
            out.append(f"{names[0]}: {note}")
            continue
        shown = ", ".join(dict.fromkeys(names[:6])) + (", ..." if len(names) > 6 else "")
        text = note.replace("node rebuilt", f"{len(names)} nodes rebuilt") \
            if "node rebuilt" in note else f"{note} ({len(names)} nodes)"
        out.append(f"{text} ({shown})")
    return out


def _link_leaves(rep, graph) -> None:
    """Each row holds the tensor it is about, so views tie rows to leaves by identity
    (leaf names are unique within a graph)."""
    by_name = {lf.name: lf.tensor for lf in graph.leaves}
    for row in rep.leaves:
        row.tensor = by_name.get(row.name)


def _has_mismatch(rep) -> bool:
    return any(r.status == "mismatch" for r in rep.leaves + rep.nodes)


def _is_float32(graph) -> bool:
    dts = [np.dtype(lf.value.dtype) for lf in graph.leaves if lf.is_float]
    dts += [np.dtype(d) for g in graph.nodes for d in g.out_dtypes if np.dtype(d).kind == "f"]
    return any(d.itemsize <= 4 for d in dts)


def _as_float64_param(v):
    """A node parameter naming float32 (cumsum's ``dtype``, ``to(float32)``, softmax's
    ``dtype=``) names float64 in the replay; everything else stays as recorded."""
    from .. import dtypes

    if v is dtypes.float32:
        return dtypes.float64
    if isinstance(v, np.dtype) and v == np.float32:
        return np.dtype(np.float64)
    if v is np.float32:
        return np.float64
    return v


#: set while a float64 replay is being verified: that check never replays again
_REPLAYING: contextvars.ContextVar[bool] = contextvars.ContextVar("symgrad_replaying",
                                                                  default=False)


def _replay_float64(graph):
    """The graph's ops re-run by the engine on float64 copies of its inputs: (root, leaves
    by index, outputs by (node, nr)); None where a node cannot be re-run."""
    from .. import tensor as _tensor
    from ..autograd.function import apply
    from ..autograd.grad_mode import enable_grad

    leaves = {}
    for lf in graph.leaves:
        v = np.asarray(lf.value)
        t = _tensor(v.astype(np.float64) if v.dtype.kind == "f" else v.copy())
        if lf.requires_grad and lf.is_float:
            t.requires_grad_(True)
        t.name = lf.name
        leaves[lf.index] = t
    outs = {}

    def val(r):
        if r[0] == "leaf":
            return leaves[r[1]]
        if r[0] == "node":
            return outs[(r[1], r[2])]
        return r[1]

    with enable_grad():
        for g in graph.nodes:
            ins = [val(r) for r in g.inputs]
            params = {k: _as_float64_param(v) for k, v in g.params.items()}
            if g.custom is not None:
                out = g.custom.apply(*ins)
            elif g.spec is not None:
                out = apply(g.spec, ins, params)
            else:
                return None
            out = out if isinstance(out, tuple) else (out,)
            for nr, o in enumerate(out):
                outs[(g.index, nr)] = o
    return val(graph.root), leaves, outs


def _precision_replay(rep, graph, gradient, mode, sample, seed, deadline, backend) -> None:
    """A float32 graph disagrees: verify the same graph re-run in float64 on the engine.
    If that agrees, the float32 disagreement is rounding (rows ``imprecise``, ``ok``
    stays true, ``precise`` false); if not, the rule is wrong (rows stay ``mismatch``)."""
    try:
        replay = _replay_float64(graph)
    except Exception as exc:  # noqa: BLE001  (a node that cannot be re-run in float64)
        rep.notes.append(f"float64 replay not possible ({type(exc).__name__}: {exc}); "
                         "float32 disagreements are reported as mismatches")
        return
    if replay is None:
        return
    root64, _, outs = replay
    if any(np.asarray(o.detach().numpy()).dtype == np.float32 for o in outs.values()
           if hasattr(o, "detach")):
        rep.notes.append("float64 replay not possible (a node kept float32); float32 "
                         "disagreements are reported as mismatches")
        return
    timeout = None if deadline is None else max(deadline - time.perf_counter(), 0.5)
    token = _REPLAYING.set(True)  # the replay's own check never replays again
    try:
        rep64 = verify(root64, gradient, mode=mode, sample=sample, seed=seed,
                       timeout=timeout, backend=backend,
                       namespace={})  # the copies carry the leaves' names
    finally:
        _REPLAYING.reset(token)
    rep.ran.append("float64 replay")
    if not rep64.ok:
        rep.notes.append(f"the same graph re-run in float64 disagrees too ({rep64.status}): "
                         "a wrong rule, not float32 rounding")
        return
    # where the precision is lost: the first node whose float32 output is farther from
    # the float64 replay's than its own rounding, else the first node whose float32
    # backward was outside its bound
    where = None
    eps = float(np.finfo(np.float32).eps)
    for g in graph.nodes:
        for nr in range(len(g.out_shapes)):
            o = outs.get((g.index, nr))
            try:
                v32 = np.asarray(graph.value_of(("node", g.index, nr)), dtype=np.float64)
            except Exception:  # noqa: BLE001
                continue
            if o is None or v32.dtype.kind != "f":
                continue
            v64 = np.asarray(o.detach().numpy(), dtype=np.float64)
            if v64.shape != v32.shape:
                continue
            fin = np.isfinite(v64)
            scale = np.abs(v64) + (np.mean(np.abs(v64[fin])) if fin.any() else 0.0)
            with np.errstate(invalid="ignore"):
                off = np.abs(v32 - v64) > 4 * eps * scale
            if (off & fin).any():
                i = int(np.argmax(off & fin))
                where = (g, f"the forward of {g.name}: float32 {float(v32.reshape(-1)[i]):.8g}"
                            f", float64 {float(v64.reshape(-1)[i]):.8g} at "
                            f"{list(as_index(i, v64.shape) or [])}")
                break
        if where is not None:
            break
    if where is None:
        for r in rep.nodes:
            if r.status == "mismatch":
                g = graph.nodes[r.id]
                where = (g, f"the backward of {g.name} in float32 ({r.detail})")
                break
    text = where[1] if where is not None else "float32 rounding"
    nonfinite = {id(r): st for r, st in getattr(rep, "_nonfinite_rows", ())}
    for r in rep.leaves + rep.nodes:
        if r.status == "mismatch" and id(r) in nonfinite:  # rounding, but nan/inf stays
            r.status = nonfinite[id(r)]
        elif r.status == "mismatch":
            r.status = "imprecise"
            r.detail = (f"float32 rounding: the float64 replay of the graph agrees; "
                        f"precision lost in {text}" + (f"; {r.detail}" if r.detail else ""))
    rep.precise = False
    rep.imprecise_node = where[0].node if where is not None else None
    rep.first_bad_node = None
    rep.notes.append(f"float32 disagreement is rounding, not a wrong rule: the same graph "
                     f"re-run in float64 agrees; precision lost in {text}")
    if not any(r.status in ("non-finite", "could not evaluate", "unsupported", "error")
               for r in rep.leaves + rep.nodes):
        rep.ok = True


def _not_replayable(graph) -> list[str]:
    from ..ops.spec import STRUCTURAL

    out = []
    for g in graph.nodes:
        if g.custom is not None:
            from .custom import replayable

            ok = replayable(g, graph)
        else:
            ok = g.spec is not None and (callable(g.spec.sympy) or g.spec.sympy == STRUCTURAL)
        if not ok and g.name not in out:
            out.append(g.name)
    return out


class _CallbackProgress:
    """A tqdm-like ``update``/``close`` that reports to ``callback(done, total)``."""

    def __init__(self, callback, total: int) -> None:
        self.callback = callback
        self.total = max(total, 1)
        self.done = 0

    def update(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        self.callback(self.done, self.total)

    def close(self) -> None:
        pass


def _progress(n_nodes, cost):
    if n_nodes < 200 and cost < 50_000:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        return None
    return tqdm(total=n_nodes, desc="symgrad.verify", leave=False, mininterval=0.5)


def _not_run(g):
    return NodeRow(g.index, g.name, "not run", _meaning(g), node=g.node)


def _meaning(g) -> str:
    if g.spec is None:
        return "custom Function" if g.custom is not None else ""
    if callable(g.spec.sympy):
        return f"{g.spec.name}: elementwise SymPy meaning"
    return f"{g.spec.name}: structural"


def _engine_dtype(graph, lf):
    """The dtype a leaf's gradient was computed in: the widest float dtype of the graph's
    nodes (a float32 leaf promoted into float64 ops gets a float64-rounded gradient, and
    float32 rounding anywhere upstream dominates otherwise)."""
    widths = [np.dtype(dt) for g in graph.nodes for dt in g.out_dtypes
              if np.dtype(dt).kind == "f"]
    if not widths:
        return lf.value.dtype
    return min(widths + [lf.value.dtype], key=lambda d: d.itemsize)


def _compare(e, s, rtol, atol, allowed=None, zeros=False):
    with np.errstate(invalid="ignore"):
        err = np.where(e == s, 0.0, np.abs(e - s))  # equal infinities agree
    both_nan = np.isnan(e) & np.isnan(s)
    err = np.where(both_nan, 0.0, err)
    finite = np.isfinite(s)
    scale = np.abs(s) + (np.mean(np.abs(s[finite])) if finite.any() else 0.0)
    if allowed is None:
        allowed = atol + rtol * scale
    ok = (err <= allowed) | both_nan
    rel = err / np.where(np.abs(s) > 0, np.abs(s), 1.0)
    if zeros:
        zero = exact_zero(s, allowed)
        return err, np.where(zero, 0.0, rel), ok, zero
    return err, rel, ok


def _run_exact(rep, graph, engine, engine_name, gradient, engine_grads, tol_for, rng, sample,
               deadline, progress):
    sym = SymbolicGraph(graph, engine, engine_name, deadline=deadline, progress=progress)
    sym.build()
    rep._sym = sym
    exact = sym.gradient(gradient)
    rep.ran.append("exact")
    pending = []
    dterms = None
    fwd_nonfinite = any(_forward_nonfinite(graph))
    for lf in graph.leaves:
        if not (lf.requires_grad and lf.is_float):
            continue
        sym.check_time()
        with mpmath.workdps(E.DPS):
            s = np.array([float(v) for v in exact[lf.index].reshape(-1)], dtype=np.float64)
        e = engine_grads[lf.index]
        if np.shape(e) != lf.shape:  # a wrong reduction in the engine: no element to match
            row = LeafRow(lf.name, lf.shape, _dtype_name(lf.value.dtype), None, None, None,
                          None, None, None, "mismatch", None, 0, False, lf.latex)
            row.detail = (f"the engine's gradient has shape {list(np.shape(e))}, expected "
                          f"{list(lf.shape)}")
            rep.leaves.append(row)
            rep.ok = False
            continue
        e = e.reshape(-1)
        rtol, atol = tol_for(lf.value.dtype)
        if getattr(tol_for, "user", False):
            err, rel, ok, zero = _compare(e, s, rtol, atol, zeros=True)
            allowed = None
        else:
            mag = sym.magnitude[lf.index].reshape(-1)
            steps = sym.steps[lf.index].reshape(-1)
            dt = _engine_dtype(graph, lf)
            allowed = rounding_bound(dt, mag, steps + 2, finite=np.isfinite(s))
            err, rel, ok, zero = _compare(e, s, 0.0, 0.0, allowed, zeros=True)
            if not ok[np.isfinite(s)].all():  # the output-rounding term, only when needed
                if dterms is None:
                    dterms = sym.output_rounding(gradient, forward=not _is_float32(graph))
                allowed = rounding_bound(dt, mag, steps + 2, dterms[lf.index].reshape(-1),
                                         finite=np.isfinite(s))
                err, rel, ok, zero = _compare(e, s, 0.0, 0.0, allowed, zeros=True)
        # compared where the symbolic value is finite (an engine nan/inf there fails);
        # every non-finite element, engine or symbolic, goes to a row of its own. Where the
        # forward itself holds nan/inf, an engine nan/inf against a finite symbolic value is
        # IEEE arithmetic (0 * inf = nan) that SymPy cancelled (0 * x = 0 before x = inf),
        # not a wrong rule: it goes to the non-finite row only, and the local checks that
        # follow still name any node whose rule makes it
        sfin = np.isfinite(s)
        if fwd_nonfinite:
            sfin = sfin & np.isfinite(e)
        ok = ok | ~sfin
        err = np.where(sfin, np.where(np.isnan(err), np.inf, err), 0.0)
        rel = np.where(sfin, np.where(np.isnan(rel), np.inf, rel), 0.0)
        zero = zero & sfin
        if s.size and not sfin.any():
            _nonfinite_row(rep, lf, e, s)
            continue
        if s.size:
            key = np.where(ok, err, np.inf if not ok.all() else err)
            key = np.where(sfin, key, -1.0)
            w = int(np.argmax(key))
        else:
            w = 0
        status = "ok" if ok.all() else "mismatch"
        if status != "ok":
            rep.ok = False
        if allowed is not None and s.size:  # the row shows the element nearest its bound
            ratio = np.where(sfin, err / np.maximum(allowed, 1e-300), -1.0)
            w = int(np.argmax(ratio))
        row = LeafRow(
            lf.name, lf.shape, _dtype_name(lf.value.dtype),
            float(np.max(err)) if s.size else 0.0,
            None if s.size and zero[sfin].all() else float(np.max(rel)) if s.size else 0.0,
            as_index(w, lf.shape) if s.size else None,
            float(e[w]) if s.size else None, float(s[w]) if s.size else None,
            None, status, None, int(sfin.sum()), False, lf.latex)
        row.exact_zeros = int(zero.sum())
        if s.size:
            row.bound = float(allowed[w]) if allowed is not None else float(
                atol + rtol * (abs(s[w]) + (np.mean(np.abs(s[sfin])) if sfin.any() else 0)))
        rep.leaves.append(row)
        i = _nonfinite_row(rep, lf, e, s, row)
        if s.size:
            pending.append((row, lf, w if i is None else i, s))
    _fill_fd(rep, graph, gradient, pending, rng, sample, deadline)


#: Finite differences are a third opinion, so they get a budget: at most this many node
#: evaluations (a central difference at one element of a leaf costs two replays of the
#: nodes that depend on that leaf). Leaves that disagree get theirs first.
FD_BUDGET = 200_000


def _fill_fd(rep, graph, gradient, pending, rng, sample, deadline, local=False) -> None:
    """Finite-difference values for the rows in ``pending`` ((row, leaf, worst element,
    symbolic values or engine values in local mode)), within FD_BUDGET and the deadline."""
    left = FD_BUDGET
    skipped = 0
    order = sorted(range(len(pending)), key=lambda n: pending[n][0].status == "ok")
    per_local = FD_SAMPLES_LOCAL
    if local:
        # a spot check, so it costs no more than the local checks themselves: about
        # FD_LOCAL_REPLAYS replays of the graph, one element per leaf when that is all
        # it allows (the rows say how many elements each got)
        replay = max(sum(1 + len(g.inputs) for g in graph.nodes), 1)
        left = min(FD_BUDGET, FD_LOCAL_REPLAYS * replay)
        want = sum(fd_cost(graph, lf) for _, lf, _, _ in pending) * FD_SAMPLES_LOCAL
        if want > left:
            per_local = 1
        # the leaves whose differences replay the fewest nodes first: the budget then
        # covers as many leaves as it can (a first layer's costs a whole graph twice)
        order = sorted(order, key=lambda n: (pending[n][0].status == "ok",
                                             fd_cost(graph, pending[n][1])))
    for n in order:
        row, lf, w, ref = pending[n]
        per = fd_cost(graph, lf)
        k_max = left // per
        if k_max < 1:
            skipped += 1
            continue
        if local:
            idx = _fd_indices(lf.value.size, w, rng, per_local)
        else:
            idx = _fd_indices(lf.value.size, w, rng, sample)
        idx = idx[:k_max]
        left -= per * idx.size
        fd = fd_gradient(graph, gradient, lf, idx, deadline)
        with np.errstate(invalid="ignore"):
            errs = np.abs(fd - ref[idx])
        if local:  # the row shows the sampled element where fd and engine differ most
            j = int(np.nanargmax(np.where(np.isnan(errs), np.inf, errs)))
            row.worst_index = as_index(int(idx[j]), lf.shape)
            row.engine_value = float(ref[idx[j]])
            row.fd_value = float(fd[j])
            row.checked = int(idx.size)
        else:
            row.fd_value = float(fd[0])
        row.fd_max_abs_err = float(np.max(errs))
    rep.ran.append("finite differences")
    if skipped:
        budget = (f"about {FD_LOCAL_REPLAYS} replays of the graph in local mode" if local
                  else f"{FD_BUDGET} replayed node evaluations")
        rep.skipped.append(f"finite differences: not taken for {skipped} of {len(pending)} "
                           f"leaves (budget of {budget})")


def _nonfinite_row(rep, lf, e, s=None, row=None) -> int | None:
    """Say in ``lf``'s row (``row``; a new one when None: no element was comparable) which
    elements of its gradient are nan/inf in the engine's gradient or in the symbolic one
    (``s``; None in local mode), so each leaf has one row. Its status becomes
    ``non-finite`` (the engine's gradient has nan/inf there) or ``could not evaluate``
    (only the symbolic value is non-finite), and the row shows that element (returned);
    a ``mismatch`` row stays one, the non-finite elements said in its detail. Either makes
    the report not ok. Where the value arose is filled in by :func:`_explain_nonfinite`
    once every check has run."""
    if all_finite(e) and (s is None or all_finite(s)):
        return None
    bad = ~np.isfinite(e) if s is None else (~np.isfinite(e) | ~np.isfinite(s))
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    eng_bad = bool((~np.isfinite(e)).any())
    status = "non-finite" if eng_bad else "could not evaluate"
    what = "engine gradient" if not np.isfinite(e[i]) else "symbolic gradient"
    val = float(e[i]) if not np.isfinite(e[i]) else float(s[i])
    detail = (f"{what} is {val:g} at {lf.name}{list(as_index(i, lf.shape) or [])} "
              f"({int(bad.sum())} of {bad.size} elements non-finite)")
    rep.ok = False
    new = row is None
    if new:
        row = LeafRow(lf.name, lf.shape, _dtype_name(lf.value.dtype), None, None,
                      as_index(i, lf.shape), float(e[i]),
                      None if s is None else float(s[i]), None, status, None,
                      int(bad.sum()), False, lf.latex)
        rep.leaves.append(row)
    #: (row, its non-finite status), for _explain_nonfinite and _precision_replay
    rep.__dict__.setdefault("_nonfinite_rows", []).append((row, status))
    if row.status == "mismatch":
        row.detail = f"{row.detail}; {detail}" if row.detail else detail
        return None
    if new:
        row.detail = detail
        return i
    row.status = status
    row.worst_index = as_index(i, lf.shape)
    row.engine_value = float(e[i])
    row.symbolic_value = None if s is None else float(s[i])
    row.max_abs_err = row.max_rel_err = row.bound = None  # not comparable there
    row.detail = detail
    return i


def _first_nonfinite(v) -> tuple[float, list] | None:
    """(value, index) of the first nan (else the first ±inf) in a float array; None if finite."""
    v = np.asarray(v)
    if v.dtype.kind != "f" or all_finite(v):
        return None
    flat = v.reshape(-1)
    nan = np.isnan(flat)
    i = int(np.argmax(nan)) if nan.any() else int(np.argmax(~np.isfinite(flat)))
    return float(flat[i]), list(as_index(i, v.shape) or [])


def _forward_nonfinite(graph) -> tuple[str, str, str]:
    """Where nan and ±inf enter the recorded forward: (nan origin, inf origin made from finite
    values, inf origin at all), each "" if none. An input holding it, or the first node (in
    forward order) whose output holds it although its own inputs and numbers do not."""
    nan_at = inf_made = inf_any = ""
    for lf in graph.leaves:
        hit = _first_nonfinite(lf.value)
        if hit is None:
            continue
        text = f"input {lf.name} holds {hit[0]:g} at {hit[1]}"
        if np.isnan(hit[0]):
            return text, inf_made, inf_any or text
        inf_any = inf_any or text
    for g in graph.nodes:
        try:
            ins = graph.node_inputs(g)
            outs = [graph.value_of(("node", g.index, nr)) for nr in range(len(g.out_shapes))]
        except Exception:  # noqa: BLE001  (no recorded value: nothing to say)
            continue
        # Python numbers (scalar operands, float params) enter here, not at a leaf
        numbers = [v for r, v in zip(g.inputs, ins) if r[0] == "scalar"]
        numbers += [v for v in g.params.values() if isinstance(v, (float, np.floating))]
        for v in numbers:
            if isinstance(v, (float, np.floating)) and np.isnan(v):
                return (f"the number nan is an operand of {g.name}", inf_made,
                        inf_any or f"the number nan is an operand of {g.name}")
        in_hits = [h for h in map(_first_nonfinite, list(ins) + numbers) if h is not None]
        in_nan = any(np.isnan(h[0]) for h in in_hits)
        for out in outs:
            hit = _first_nonfinite(out)
            if hit is None:
                continue
            made = "from finite inputs" if not in_hits else "from inputs holding ±inf"
            text = f"the forward of {g.name} gives {hit[0]:g} at {hit[1]} {made}"
            if np.isnan(hit[0]) and not in_nan:
                return text, inf_made, inf_any or text
            if not in_hits and not inf_made:
                inf_made = text
            inf_any = inf_any or text
    return nan_at, inf_made, inf_any


def _explain_nonfinite(rep, graph, backward_origin: str) -> None:
    """Say where the nan/inf of each non-finite row arose, and decide whether non-finite
    forward values alone make the report not ok.

    A nan anywhere in the forward (an input holding it, inf - inf, 0 * inf, softmax of a row
    that is all -inf) or a non-finite root value is reported (status ``non-finite``) even
    where every gradient is finite. ±inf inside the graph is not in itself a fault: an
    attention mask of -inf that exp, softmax or max turns into exact zeros is correct, and
    any harm it does shows as a non-finite gradient row or a failed check; such a graph is
    ok, with a note saying where the infinities are."""
    nan_at, inf_made, inf_any = _forward_nonfinite(graph)
    origin = nan_at or inf_made or backward_origin or inf_any
    rows = getattr(rep, "_nonfinite_rows", [])
    for row, status in rows:
        why = origin or ("the symbolic derivative is undefined or infinite at the recorded "
                         "values" if status == "could not evaluate"
                         else "the engine's backward (every forward value is finite)")
        row.detail = f"{getattr(row, 'detail', '')}; arose in: {why}"
    if rows:  # the verdict, in one line
        status = "non-finite" if any(st == "non-finite" for _, st in rows) \
            else "could not evaluate"
        first = [r.detail.split("; arose in: ")[-1] for r, st in rows if st == status][0]
        rep.notes.insert(0, f"{status}: arose in: {first} (gradient of "
                         + ", ".join(dict.fromkeys(r.name for r, _ in rows)) + ")")
        return
    root = _first_nonfinite(graph.root_value)
    if nan_at or root is not None:
        rep.ok = False
        what = nan_at or f"the root holds {root[0]:g} at {root[1]}"
        if root is not None and nan_at:
            what += f"; the root holds {root[0]:g} at {root[1]}"
        rep.notes.append(f"non-finite value: {what}; the gradients through it are not "
                         "meaningful, so the report is not ok")
    elif inf_any:
        rep.notes.append(f"forward values hold ±inf (first: {inf_any}); every gradient and "
                         "the root are finite, so they are checked like any other value")


def _status(rep) -> str:
    if rep.timed_out:
        return "timed out"
    statuses = {r.status for r in rep.leaves} | {r.status for r in rep.nodes}
    if "mismatch" in statuses or "error" in statuses or rep.first_bad_node is not None:
        return "mismatch"
    for st in ("non-finite", "could not evaluate", "unsupported"):
        if st in statuses:
            return st
    if not rep.ok:
        return "non-finite" if any(n.startswith("non-finite value: ") for n in rep.notes) \
            else "mismatch"
    return "ok"


def _fd_indices(n, worst, rng, sample):
    k = min(n, FD_SAMPLES if sample is None else max(1, min(sample, FD_SAMPLES)))
    if n == 0:
        return np.array([], dtype=np.int64)
    rest = [i for i in rng.choice(n, size=min(n, k), replace=False).tolist() if i != worst]
    return np.array([worst] + rest[:k - 1], dtype=np.int64)


def _run_local(rep, graph, engine, engine_name, rng, sample, tol_for, deadline, progress=None,
               fan=None):
    rep.ran.append("local")
    rep.ran.append("forward values")
    rows = []
    origins = []
    first = None
    timed_out = False
    # one generator per node: the same checks in this process or fanned out (fanout.py)
    rngs = node_rngs(rng, len(graph.nodes))
    for g, chk in node_checks(graph, engine, engine_name, rngs, sample, tol_for, deadline,
                              progress, fan):
        if chk is None:  # out of time at this node (or before it finished)
            rows.append(NodeRow(g.index, g.name, "timeout", _meaning(g), node=g.node))
            timed_out = True
            continue
        row = NodeRow(g.index, g.name, chk.status, chk.formula or _meaning(g),
                      chk.max_abs_err, chk.max_rel_err, chk.sampled, chk.detail, node=g.node,
                      bound=chk.bound)
        rows.append(row)
        if chk.engine_nonfinite:
            origins.append((g, chk.engine_nonfinite))
        if chk.status in ("mismatch", "error") and first is None:
            first = g.node
        if chk.status == "unsupported":
            rep.notes.append(f"{g.name}: {chk.detail}")
    rep.nodes = rows
    if timed_out:
        raise TimeoutExpired
    rep.first_bad_node = first
    if first is not None or any(r.status in ("unsupported", "could not evaluate")
                                for r in rows):
        rep.ok = False
    for g, text in reversed(origins):  # nearest the root first, as the backward runs
        rep._backward_nonfinite = f"the backward of {g.name}: {text}"
        break
    if any(r.sampled for r in rows):
        rep.notes.append("local mode sampled elements of large tensors (seeded; see details)")


def _run_forward(rep, graph, deadline=None) -> None:
    """Exact mode: each node's recorded output against its meaning at its recorded inputs
    (forward.py), so a wrong forward kernel whose gradients agree is named like a wrong
    backward (local mode does this inside each node's check)."""
    from .forward import forward_check

    rows = {r.id: r for r in rep.nodes}
    first = None
    for g in graph.nodes:
        if deadline is not None and time.perf_counter() > deadline:
            raise TimeoutExpired
        try:
            fc = forward_check(g, graph, graph.node_inputs(g))
        except Exception:  # noqa: BLE001  (no value to compare: nothing to say)
            continue
        if fc is None or fc.ok:
            continue
        row = rows.get(g.index)
        if row is None:
            continue
        row.status = "mismatch"
        row.detail = fc.detail + (f"; {row.detail}" if row.detail else "")
        row.max_abs_err, row.bound = fc.err, fc.bound
        rep.ok = False
        if first is None:
            first = g.node
    rep.ran.append("forward values")
    if first is not None and rep.first_bad_node is None:
        rep.first_bad_node = first


def _run_glue(rep, graph, seed, deadline=None) -> None:
    """The engine's glue between rules (glue.py): accumulation of the gradients flowing
    into a tensor that feeds several nodes (through the engine's buffer helper and
    through its own backward loop), and AccumulateGrad into ``.grad``. (The
    broadcast reduction after each node is checked with the node, in local mode.) A fault
    makes the row of the receiving node or leaf a mismatch naming the step."""
    if graph.kind != "symgrad":
        return
    from ..autograd.node import _accumulator_of
    from .glue import check_accumulate_grad, check_accumulation, check_backward_loop

    rng = np.random.default_rng([int(seed), 18])  # its own stream: other draws unchanged
    faults = (check_accumulation(graph, rng, deadline)
              + check_accumulate_grad(graph, rng, deadline))
    named = {(f.index, None if f.leaf is None else f.leaf.index) for f in faults}
    faults += [f for f in check_backward_loop(graph, rng, deadline)  # one per place
               if (f.index, None if f.leaf is None else f.leaf.index) not in named]
    rep.ran.append("engine glue (accumulation, AccumulateGrad)")
    first = None
    for f in faults:
        text = f"{f.what}: {f.detail}"
        if f.leaf is not None:
            row = next((r for r in rep.leaves if r.name == f.leaf.name), None)
            node = _accumulator_of(f.leaf.tensor)
            if row is not None:
                row.status = "mismatch"
                row.detail = text + (f"; {row.detail}" if row.detail else "")
        else:
            node = f.node
            row = next((r for r in rep.nodes if r.id == f.index), None)
            if row is not None:
                row.status = "mismatch"
                row.detail = text + (f"; {row.detail}" if row.detail else "")
                if f.bound is not None:
                    row.bound = f.bound
        rep.notes.append(f"engine glue: {text}")
        rep.ok = False
        if first is None:
            first = node
    if first is not None and rep.first_bad_node is None:
        rep.first_bad_node = first


def _leaf_rows_local(rep, graph, gradient, engine_grads, rng, sample, deadline=None):
    """In local mode: engine gradients beside finite differences at sampled elements."""
    pending = []
    for lf in graph.leaves:
        if not (lf.requires_grad and lf.is_float):
            continue
        e = engine_grads[lf.index].reshape(-1)
        w = int(rng.integers(lf.value.size)) if lf.value.size else 0
        row = LeafRow(lf.name, lf.shape, _dtype_name(lf.value.dtype), None, None,
                      as_index(w, lf.shape) if e.size else None,
                      float(e[w]) if e.size else None, None, None, "not checked", None, 0,
                      True, lf.latex)
        rep.leaves.append(row)
        i = _nonfinite_row(rep, lf, e, None, row)
        if e.size:
            pending.append((row, lf, w if i is None else i, e))
    _fill_fd(rep, graph, gradient, pending, rng, sample, deadline, local=True)


def _run_hvp(rep, graph, gradient, tol_for, rng, deadline):
    leaves = [lf for lf in graph.leaves if lf.requires_grad and lf.is_float]
    us = {lf.index: rng.standard_normal(lf.shape).astype(lf.value.dtype) for lf in leaves}
    sym = rep._sym
    exact = sym.hvp(gradient, us)
    eng = graph.engine_hvp(graph, gradient, us)
    rep.ran.append("Hessian-vector products (order 2)")
    for lf in leaves:
        s = np.array([float(v) for v in exact[lf.index].reshape(-1)], dtype=np.float64)
        e = eng[lf.index].reshape(-1)
        rtol, atol = tol_for(lf.value.dtype)
        err, _, ok = _compare(e, s, rtol * 10, atol * 10)
        status = "ok" if ok.all() else "mismatch"
        if status != "ok":
            rep.ok = False
        rep.hvp.append({"name": lf.name, "status": status,
                        "max_abs_err": float(np.max(err)) if err.size else 0.0})
