"""Per-node checks fanned out over processes (``verify(..., workers=N)`` or ``executor=``).

Local mode checks every node on its own: the node's numeric backward on a seeded random
cotangent against its op's symbolic Jacobian at the recorded inputs. The backward needs the
live graph (its saved tensors, the engine), the symbolic side only numbers. So the work is
split where the backward is called:

1. here, in node order, ``check_node`` runs until the node's backward has run on its
   cotangent; its result (NumPy arrays) is recorded and the check stops (``_Deferred``);
2. a worker receives one work item (the op's name and parameters, the node's recorded
   inputs and outputs, the recorded backward, the node's own random generator, as it was
   before step 1): plain data that pickles. It rebuilds the node, runs ``check_node`` from
   the start with the same generator (so the same cotangent: the recorded backward checks
   it is), and returns the ``NodeCheck``.

Every node has its own generator (``node_rngs``), in serial runs too, so a report is the
same whichever way it was computed. A node whose check needs more than its item holds
(a custom Function, a meaning of a torch fused node, a second call of the backward, a value
of another node) is checked here, as in a serial run. Any ``concurrent.futures.Executor``
works (a ``dask.distributed`` client's ``get_executor()`` too); an in-process one (threads)
runs the checks one at a time, as SymPy's and mpmath's global state need. On an exception
in the caller (Ctrl-C, a progress callback that raises), the futures not started are
cancelled and a pool made here is shut down without waiting.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import os
import pickle
import threading
import time
from contextlib import nullcontext
from typing import Any

import numpy as np

from ._common import TimeoutExpired

__all__ = ["Fan", "resolve", "node_rngs", "node_checks"]

#: held around every node check run in this process (SymPy and mpmath keep global state)
_LOCK = threading.RLock()

#: the last fanned-out run, by where each node's check ran: ``sent`` (a worker finished
#: it), ``fallback`` (a worker handed it back), ``here`` (never sent: a custom Function,
#: a torch fused meaning, decided before its backward ran)
LAST_RUN: dict = {}


class _Deferred(BaseException):
    """Raised by the recording backward: the rest of the check runs in a worker."""


class _Fallback(BaseException):
    """A worker met something its item does not hold: the node is checked here."""


def resolve(workers: Any, executor: Any) -> Fan | None:
    """A ``Fan`` for ``verify``'s ``workers`` / ``executor`` arguments (None: in this
    process); TypeError / ValueError naming the argument."""
    if workers is not None and executor is not None:
        raise ValueError("verify(): pass workers=N or executor=..., not both")
    if executor is not None:
        if not isinstance(executor, cf.Executor):
            raise TypeError(
                f"verify(): argument 'executor' must be a concurrent.futures.Executor (a "
                f"ProcessPoolExecutor, or a dask.distributed Client's get_executor()), not "
                f"{type(executor).__module__}.{type(executor).__qualname__}")
        return Fan(executor, False)
    if workers is None:
        return None
    if isinstance(workers, (bool, np.bool_)) or not isinstance(workers, (int, np.integer)):
        raise TypeError(f"verify(): argument 'workers' must be a positive int or None, not "
                        f"{type(workers).__name__}")
    if workers < 1:
        raise ValueError(f"verify(): workers must be at least 1, not {int(workers)}")
    if workers == 1:
        return None  # one process: this one
    return Fan(None, True, int(workers))


def _mp_context():
    """Fresh worker processes, not forks of this one (a fork of a process running
    threads, as NumPy's and numba's pools do, can deadlock): the forkserver, which
    imports symgrad's verifier and SymPy once, where it exists; else spawn."""
    import multiprocessing as mp

    try:
        ctx = mp.get_context("forkserver")
    except ValueError:  # pragma: no cover - Windows
        return mp.get_context("spawn")
    ctx.set_forkserver_preload(["symgrad.symbolic.fanout", "symgrad.symbolic.local",
                                "sympy"])
    return ctx


class Fan:
    """Where the per-node checks go: an executor (the caller's, or a process pool made
    for one ``verify`` call)."""

    def __init__(self, executor, owned: bool, workers: int = 0) -> None:
        self.executor = executor
        self.owned = owned
        self.workers = workers

    def open(self) -> cf.Executor:
        if self.executor is None:
            self.executor = cf.ProcessPoolExecutor(max_workers=self.workers,
                                                   mp_context=_mp_context())
        return self.executor

    def close(self, cancel: bool = False) -> None:
        """Shut down a pool made here (without waiting when ``cancel``: interrupted)."""
        ex, self.executor = self.executor, None
        if not self.owned or ex is None:
            return
        if cancel:
            procs = list((getattr(ex, "_processes", None) or {}).values())
            ex.shutdown(wait=False, cancel_futures=True)
            for p in procs:  # a running check cannot be cancelled: stop its process
                if p.is_alive():
                    p.terminate()
        else:
            ex.shutdown(wait=True)


def node_rngs(rng: np.random.Generator, n: int) -> list:
    """One independent generator per node, derived from ``rng`` (the same whether the
    checks run here or in workers, in whatever order they finish)."""
    try:
        return list(rng.spawn(n))
    except (AttributeError, TypeError, ValueError):  # a generator without a SeedSequence
        seeds = rng.integers(0, 2 ** 63, size=n)
        return [np.random.default_rng(int(s)) for s in seeds]


# -- the parent's side ---------------------------------------------------------------
def node_checks(graph, engine, engine_name, rngs, sample, tol_for, deadline, progress,
                fan: Fan | None):
    """``(gnode, NodeCheck)`` for every node in graph order; ``None`` for a node that
    ran out of time (and every node after it that did not finish): the caller then
    raises TimeoutExpired. ``progress.update(1)`` as each node finishes."""
    from .local import check_node

    if fan is None:
        for k, g in enumerate(graph.nodes):
            try:
                chk = check_node(g, graph, engine, engine_name, rngs[k], sample, tol_for,
                                 deadline)
            except TimeoutExpired:
                for h in graph.nodes[k:]:
                    yield h, None
                return
            yield g, chk
            if progress is not None:
                progress.update(1)
        return
    yield from _fanned(graph, engine, engine_name, rngs, sample, tol_for, deadline, progress,
                       fan)


def _fanned(graph, engine, engine_name, rngs, sample, tol_for, deadline, progress, fan):
    from .local import check_node

    n = len(graph.nodes)
    results: list = [None] * n
    done = [False] * n
    futures: dict = {}
    saved_rngs = [None] * n  # each node's generator before its check (for a fallback)
    timed_out = False

    def local(k):
        g = graph.nodes[k]
        with _LOCK:
            return check_node(g, graph, engine, engine_name, copy.deepcopy(saved_rngs[k]),
                              sample, tol_for, deadline)

    def finish(k, chk, where="here"):
        LAST_RUN[where] += 1
        results[k], done[k] = chk, True
        if progress is not None:
            progress.update(1)

    executor = fan.open()
    LAST_RUN.clear()
    LAST_RUN.update(sent=0, fallback=0, here=0)
    try:
        later = []
        for k, g in enumerate(graph.nodes):
            saved_rngs[k] = copy.deepcopy(rngs[k])
            if not _portable(g):
                later.append(k)
                continue
            try:
                with _LOCK:
                    out = _prepare(g, graph, engine, engine_name, rngs[k], sample, tol_for,
                                   deadline)
            except TimeoutExpired:
                timed_out = True
                break
            if out[0] == "done":  # decided before any backward ran (skipped, unsupported)
                finish(k, out[1])
                continue
            item = out[1]
            item.update(rng=copy.deepcopy(saved_rngs[k]), sample=sample,
                        engine_name=engine_name, tol=_Tolerances.of(tol_for, item),
                        left=None if deadline is None else deadline - time.perf_counter(),
                        pid=os.getpid())
            try:  # plain data by construction; a parameter that does not pickle stays here
                pickle.dumps(item)
            except Exception:  # noqa: BLE001
                later.append(k)
                continue
            futures[executor.submit(check_item, item)] = k
        for k in later if not timed_out else ():  # checked here while the workers run
            try:
                finish(k, local(k))
            except TimeoutExpired:
                timed_out = True
                break
        pending = set(futures)
        while pending and not timed_out:
            left = None if deadline is None else max(deadline - time.perf_counter(), 0.0)
            ready, pending = cf.wait(pending, timeout=left, return_when=cf.FIRST_COMPLETED)
            if not ready:  # the deadline passed with checks still running
                timed_out = True
                break
            for fut in ready:
                k = futures[fut]
                status, chk = fut.result()  # a worker's exception is raised here, as serially
                where = "sent"
                if status == "fallback":
                    where = "fallback"
                    try:
                        chk = local(k)
                    except TimeoutExpired:
                        timed_out = True
                        break
                elif status == "timeout":
                    timed_out = True
                    break
                elif chk.glue is not None:
                    chk.glue.node = graph.nodes[k].node
                finish(k, chk, where)
        if timed_out:
            for fut in futures:
                fut.cancel()
    except BaseException:  # Ctrl-C, a progress callback that raised: no hang, no leak
        for fut in futures:
            fut.cancel()
        fan.close(cancel=True)
        raise
    fan.close(cancel=timed_out)
    for k, g in enumerate(graph.nodes):
        yield g, (results[k] if done[k] else None)


def _portable(g) -> bool:
    """Can a worker rebuild this node from plain data? Ops of the registry whose replay is
    the registry's forward (not a custom Function, not a torch fused meaning)."""
    from ..ops import OPS

    spec = g.spec
    fwd = getattr(g.forward_numeric, "__qualname__", "")
    return (g.custom is None and spec is not None and OPS.get(spec.name) is spec
            and fwd == "_spec_forward.<locals>.fwd")


def _prepare(g, graph, engine, engine_name, rng, sample, tol_for, deadline):
    """``("done", NodeCheck)`` when the check ended before the node's backward ran, else
    ``("item", work item)`` with the backward's result recorded."""
    from .local import check_node

    rec: dict = {}
    backward = g.backward

    def recording(graph_, g_, vs):
        res = backward(graph_, g_, vs)
        rec["vs"] = [np.array(v, copy=True) for v in vs]
        rec["res"] = [None if r is None else _Shipped.of(r) for r in res]
        rec["glue"] = _pack_glue(g_.glue)
        raise _Deferred

    g.backward = recording
    try:
        return "done", check_node(g, graph, engine, engine_name, rng, sample, tol_for,
                                  deadline)
    except _Deferred:
        pass
    finally:
        g.backward = backward
        g.glue = None
    outputs = {}
    for nr in range(max(len(g.out_shapes), 1)):
        try:
            outputs[nr] = np.asarray(graph.value_of(("node", g.index, nr)))
        except Exception as exc:  # noqa: BLE001 - raised again where the check asks
            outputs[nr] = RuntimeError(f"{type(exc).__name__}: {exc}")
    own = [(g.index, nr) for nr in outputs]
    recorded = getattr(graph, "_recorded", None)  # the outputs the walker found recorded
    values = getattr(graph, "_values", {})
    item = {"index": g.index, "name": g.name, "spec": g.spec.name, "params": dict(g.params),
            "inputs": list(g.inputs), "out_shapes": list(g.out_shapes),
            "out_dtypes": list(g.out_dtypes), "needs": tuple(g.needs),
            "input_names": tuple(g.input_names), "note": g.note,
            "in_values": [_Shipped.of(x) for x in graph.node_inputs(g)], "outputs": outputs,
            "rec": rec,
            # what a check reads of the graph about this node: its kind, the device of its
            # root, which of the node's outputs were recorded, and their values
            "kind": graph.kind,
            "device": getattr(getattr(graph.root_tensor, "device", None), "type", "cpu"),
            "recorded": None if recorded is None else {k for k in own if k in recorded},
            "values": {k: np.asarray(values[k]) for k in own if k in values}}
    return "item", item


class _Tolerances:
    """``tol_for`` as data: (rtol, atol) for each float dtype a node's check may ask about,
    and whether the user gave them (then they replace the rounding bound)."""

    __slots__ = ("table", "user")

    def __init__(self, table: dict, user: bool) -> None:
        self.table, self.user = table, user

    @staticmethod
    def of(tol_for, item: dict) -> _Tolerances:
        names = {"float16", "float32", "float64"}
        for x in item["in_values"]:
            a = x.a if isinstance(x, _Shipped) else x
            if isinstance(a, np.ndarray) and a.dtype.kind == "f":
                names.add(a.dtype.name)
        return _Tolerances({n: tuple(tol_for(np.dtype(n))) for n in names},
                           bool(getattr(tol_for, "user", False)))

    def __call__(self, dt):
        try:
            name = np.dtype(dt).name
        except TypeError:
            name = str(dt)
        hit = self.table.get(name)
        if hit is None:
            raise _Fallback(f"tolerance for {name}")
        return hit


class _Shipped:
    """An array sent with its layout: a broadcast view (zero strides, as an expanded
    gradient is) is sent as its one distinct slice and broadcast again on arrival, other
    arrays in their own memory order, so that NumPy's sums over it run in the same order
    there as here (a contiguous copy of a broadcast array sums in another order, and the
    report's errors would differ in the last bit)."""

    __slots__ = ("a", "shape")

    def __init__(self, a, shape) -> None:
        self.a, self.shape = a, shape

    @staticmethod
    def of(x):
        if not isinstance(x, np.ndarray):
            return np.asarray(x) if hasattr(x, "__array__") and not np.isscalar(x) else x
        if x.size and 0 in x.strides:
            idx = tuple(slice(0, 1) if st == 0 else slice(None) for st in x.strides)
            return _Shipped(np.array(x[idx], order="K", copy=True), x.shape)
        return np.array(x, order="K", copy=True)

    @staticmethod
    def back(x):
        return np.broadcast_to(x.a, x.shape) if isinstance(x, _Shipped) else x


class _Arr:
    """A gradient as NumPy, read the way ``glue.check_fit`` reads a tensor."""

    __slots__ = ("a",)

    def __init__(self, a) -> None:
        self.a = a

    def detach(self):
        return self

    def numpy(self):
        return self.a


def _as_arr(t):
    if t is None:
        return None
    d = t.detach()
    d = d.cpu() if hasattr(d, "cpu") else d
    return _Arr(np.array(d.numpy(), copy=True))


def _pack_glue(glue):
    """``g.glue`` (tensors from ``node.apply`` and what the engine made of them) as data."""
    if glue is None:
        return None
    raw, fitted = glue
    if isinstance(fitted, BaseException):
        try:  # the exception itself (its type is part of the finding's text)
            fitted_p: Any = pickle.loads(pickle.dumps(fitted))
        except Exception:  # noqa: BLE001
            fitted_p = RuntimeError(f"{type(fitted).__name__}: {fitted}")
    else:
        fitted_p = [_as_arr(f) for f in fitted]
    return [_as_arr(r) for r in raw], fitted_p


# -- the worker's side ---------------------------------------------------------------
class _OwnValues(dict):
    """The node's own recorded values; any other key is not in the item."""

    def __missing__(self, key):
        raise _Fallback(f"value {key!r}")


class _NodeGraph:
    """What a node's check may read of its graph: its inputs and its own outputs, the
    graph's kind and its root's device (anything else: checked in the caller)."""

    def __init__(self, item: dict) -> None:
        from types import SimpleNamespace

        self.index = item["index"]
        self.outputs = item["outputs"]
        self.kind = item["kind"]
        self.root_tensor = SimpleNamespace(device=SimpleNamespace(type=item["device"]))
        self._recorded = item["recorded"]
        self._values = _OwnValues(item["values"])

    def node_inputs(self, g):
        return g.in_values

    def value_of(self, ref):
        if ref[0] == "scalar":
            return ref[1]
        if ref[0] == "node" and ref[1] == self.index and ref[2] in self.outputs:
            v = self.outputs[ref[2]]
            if isinstance(v, BaseException):
                raise v
            return v
        raise _Fallback(f"value {ref!r}")

    def __getattr__(self, name):
        raise _Fallback(f"graph.{name}")


class _Replayed:
    """The node's backward, as recorded in the parent for exactly this cotangent."""

    def __init__(self, rec: dict) -> None:
        self.rec = rec
        self.calls = 0

    def __call__(self, graph, g, vs):
        self.calls += 1
        want = self.rec["vs"]
        if self.calls > 1 or len(vs) != len(want) or not all(
                np.array_equal(np.asarray(a), b, equal_nan=True) for a, b in zip(vs, want)):
            raise _Fallback("another cotangent than the recorded one")
        g.glue = self.rec["glue"]
        return [_Shipped.back(r) for r in self.rec["res"]]


def check_item(item: dict):
    """Run one node's local check from its work item: ``("done", NodeCheck)``,
    ``("fallback", None)`` (check it in the parent) or ``("timeout", None)``."""
    from ..ops import OPS
    from . import _engine as E
    from .graph import GNode, _spec_forward
    from .local import check_node

    spec = OPS.get(item["spec"])
    if spec is None:  # an op registered at run time in the caller's process only
        return "fallback", None
    g = GNode(item["index"], None, item["name"], spec, list(item["inputs"]), item["params"],
              list(item["out_shapes"]), list(item["out_dtypes"]), needs=item["needs"],
              input_names=item["input_names"])
    g.note = item["note"]
    g.in_values = [_Shipped.back(x) for x in item["in_values"]]
    g.forward_numeric = _spec_forward(spec, item["params"])
    g.backward = _Replayed(item["rec"])
    graph = _NodeGraph(item)
    engine, engine_name = E.pick_engine(item["engine_name"])
    left = item["left"]
    deadline = None if left is None else time.perf_counter() + left
    same_process = item["pid"] == os.getpid()  # threads: one check at a time
    try:
        with _LOCK if same_process else nullcontext():
            chk = check_node(g, graph, engine, engine_name, copy.deepcopy(item["rng"]),
                             item["sample"], item["tol"], deadline)
    except _Fallback:
        return "fallback", None
    except TimeoutExpired:
        return "timeout", None
    if chk.glue is not None:
        chk.glue.node = None  # the parent puts its grad_fn back
    return "done", chk
