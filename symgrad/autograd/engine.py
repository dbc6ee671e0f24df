"""The backward engine: iterative, dependency-counted, PyTorch's execution order.

``run_backward`` walks from the roots' grad_fns, counts how many edges point at each
node, and runs a node once all its incoming gradients have arrived (highest sequence
number first, as PyTorch does). It never recurses, so a 100,000-node chain is fine.
"""

from __future__ import annotations

import heapq

import numpy as np

from .. import _tensor_layer as _tl
from ..backends import backend_for
from ..dtypes import HALF_NP
from . import function as _fn
from .anomaly_mode import _anomaly
from .function import accumulator_of
from .grad_mode import _state
from .node import AccumulateGrad

__all__ = ["run_backward", "backward", "grad"]

#: the node whose backward runs now, for :func:`_fp_warning`
_running: list = [None]


def _fp_warning(err: str, flag: int) -> None:
    """NumPy's floating-point error in a backward (``inf * 0`` ...), said at the user's
    line (their ``backward()`` call) naming the op, not inside a generated rule."""
    from .fast_apply import warn_at_user

    node = _running[0]
    if node is None:
        warn_at_user(f"{err} encountered in backward()", RuntimeWarning)
        return
    spec = getattr(type(node), "_spec", None)
    name = node.name()
    op = spec.name if spec is not None else name
    warn_at_user(f"{op}: {err} encountered in the backward of {name}", RuntimeWarning)


def _fp_errstate():
    """For one backward pass: NumPy's warnings (where they are on) go to _fp_warning."""
    calls = {k: "call" for k, v in np.geterr().items() if v == "warn"}
    return np.errstate(call=_fp_warning, **calls)


def _needed_nodes(roots, targets):
    """Nodes from which some target node is reachable (only these run with ``inputs=``)."""
    needed: dict = {}
    stack = [(r, False) for r in roots]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            needed[node] = node in targets or any(
                needed.get(n, False) for n, _ in node.next_functions if n is not None)
            continue
        if node in needed:
            continue
        needed[node] = False  # placeholder while visiting (graphs are acyclic)
        stack.append((node, True))
        for n, _ in node.next_functions:
            if n is not None and n not in needed:
                stack.append((n, False))
    return {n for n, ok in needed.items() if ok}


def run_backward(roots, grad_roots, *, retain_graph: bool, create_graph: bool,
                 inputs=None, accumulate: bool = True, allow_unused: bool = False):
    """Backpropagate ``grad_roots`` from ``roots``.

    accumulate=True: add into leaves' ``.grad`` (``Tensor.backward``), restricted to
    ``inputs`` when given. accumulate=False: return the gradients of ``inputs``
    (``autograd.grad``) without touching any ``.grad``.
    """
    if inputs is None and accumulate:
        _backward_all(roots, grad_roots, retain_graph, create_graph)
        return None
    root_edges = []
    for t in roots:
        if t._grad_fn is not None:
            root_edges.append((t._grad_fn, t._output_nr))
        elif t._requires_grad:
            root_edges.append((accumulator_of(t), 0))
        else:
            raise RuntimeError(
                "element 0 of tensors does not require grad and does not have a grad_fn")

    # Where the gradients of `inputs` are caught: {(node, output_nr): index in inputs}.
    capture: dict = {}
    if inputs is not None:
        for i, t in enumerate(inputs):
            if t._grad_fn is not None:
                key = (t._grad_fn, t._output_nr)
            elif t._requires_grad:
                key = (accumulator_of(t), 0)
            else:
                raise RuntimeError("One of the differentiated Tensors does not require grad")
            capture[key] = i
        needed = _needed_nodes([n for n, _ in root_edges], {n for n, _ in capture})
    else:
        needed = None

    # Dependency counts over the part of the graph that will run.
    deps: dict = {}
    # several root edges may share a node (two outputs of one Function): visit it once
    roots = list(dict.fromkeys(n for n, _ in root_edges if needed is None or n in needed))
    seen = set(roots)
    stack = list(roots)
    while stack:
        node = stack.pop()
        for nxt, _ in node.next_functions:
            if nxt is None or (needed is not None and nxt not in needed):
                continue
            deps[nxt] = deps.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)

    buffers: dict = {}
    shared = set()  # storages that alias a caller's tensor: never accumulated into in place
    for (node, nr), g in zip(root_edges, grad_roots):
        _add_to_buffer(buffers, node, nr, g)
        shared.add(id(g._storage))

    results = [None] * (len(inputs) if inputs is not None else 0)
    # Each node is queued exactly once: a root only here (several root edges may share a
    # node, e.g. two outputs of one Function), any other node when its deps reach zero.
    ready = []
    for node in roots:
        if deps.get(node, 0) == 0:
            heapq.heappush(ready, (-node._sequence_nr, id(node), node))

    prev_mode = _state.enabled
    _state.enabled = create_graph
    errstate = _fp_errstate()
    errstate.__enter__()
    try:
        while ready:
            _, _, node = heapq.heappop(ready)
            _running[0] = node
            grads = buffers.pop(node, None) or [None] * node._num_outputs()
            if node._tensor_hooks or node._retained or node._pre_hooks:
                grads = _run_pre_hooks(node, grads, shared)
            stop_here = False
            if capture:
                for nr, g in enumerate(grads):
                    idx = capture.get((node, nr))
                    if idx is None:
                        continue
                    if accumulate:
                        target = (node.variable if isinstance(node, AccumulateGrad)
                                  else inputs[idx])
                        _accumulate_into(target, g, create_graph, shared)
                    else:
                        if isinstance(node, AccumulateGrad) and g is not None:
                            g = _leaf_hooks(node.variable, g)
                        results[idx] = g
                # a captured node runs on only if other captures lie below it
                stop_here = not any(nxt is not None and nxt in needed
                                    for nxt, _ in node.next_functions)
            if isinstance(node, AccumulateGrad):
                continue  # with inputs=, leaves are reached through the captures above
            if stop_here:
                if not retain_graph:
                    node._release()
                continue
            outs = _apply(node, grads, needed, shared)
            if not retain_graph:
                node._release()
            for (nxt, nr), g in zip(node.next_functions, outs):
                if nxt is None or (needed is not None and nxt not in needed):
                    continue
                if g is not None:
                    _add_to_buffer(buffers, nxt, nr, g)
                deps[nxt] -= 1
                if deps[nxt] == 0:
                    heapq.heappush(ready, (-nxt._sequence_nr, id(nxt), nxt))
    finally:
        errstate.__exit__(None, None, None)
        _state.enabled = prev_mode
        _running[0] = None

    if not accumulate and inputs is not None:
        for i, r in enumerate(results):
            if r is None and not allow_unused:
                raise RuntimeError(
                    "One of the differentiated Tensors appears to not have been used in the "
                    "graph. Set allow_unused=True if this is the desired behavior.")
            if r is not None and not create_graph:
                results[i] = r.detach()
        return tuple(results)
    return None


def _backward_all(roots, grad_roots, retain_graph: bool, create_graph: bool) -> None:
    """``Tensor.backward()`` without ``inputs=``: every leaf gets its gradient.

    The general loop of ``run_backward`` less what only ``inputs=`` and ``autograd.grad``
    need (captures, the needed-node filter, results), so a small graph's fixed cost stays low.
    """
    root_nodes = []
    buffers: dict = {}
    shared = set()  # storages that alias a caller's tensor: never accumulated into in place
    for t, g in zip(roots, grad_roots):
        node = t._grad_fn
        if node is not None:
            nr = t._output_nr
        elif t._requires_grad:
            node, nr = accumulator_of(t), 0
        else:
            raise RuntimeError(
                "element 0 of tensors does not require grad and does not have a grad_fn")
        if node not in buffers:
            root_nodes.append(node)  # several roots may share a node: it runs once
        _add_to_buffer(buffers, node, nr, g)
        shared.add(id(g._storage))

    if not root_nodes:
        return
    # Dependency counts: a node is new when deps lacks it (roots are marked seen).
    deps: dict = {}
    stack = list(root_nodes)
    seen = set(root_nodes) if len(root_nodes) > 1 else None
    first = root_nodes[0]
    while stack:
        node = stack.pop()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            c = deps.get(nxt)
            if c is None:
                deps[nxt] = 1
                if nxt is not first and (seen is None or nxt not in seen):
                    stack.append(nxt)
            else:
                deps[nxt] = c + 1
    ready = [(-n._sequence_nr, id(n), n) for n in root_nodes if n not in deps]
    heapq.heapify(ready)
    prev_mode = _state.enabled
    _state.enabled = create_graph
    try:
        with _fp_errstate():
            _run_plain(ready, buffers, deps, shared, retain_graph, create_graph)
    finally:
        _state.enabled = prev_mode
        _running[0] = None


def _run_plain(ready, buffers, deps, shared, retain_graph, create_graph) -> None:
    """The main loop of ``Tensor.backward`` without ``inputs=`` (the common case).

    Same order and semantics as the general loop; a node that is the only one ready
    after its producer ran is run directly instead of going through the heap.
    """
    heappop, heappush = heapq.heappop, heapq.heappush
    fn_mod, anomaly = _fn, _anomaly
    running = _running
    node = None
    while True:
        if node is None:
            if not ready:
                return
            node = heappop(ready)[2]
        running[0] = node
        grads = buffers.pop(node, None) or [None] * node._num_outputs()
        if node._tensor_hooks or node._retained or node._pre_hooks:
            grads = _run_pre_hooks(node, grads, shared)
        if isinstance(node, AccumulateGrad):
            _accumulate_node(node, grads, create_graph, shared)
            node = None
            continue
        if fn_mod._profiler is None and not anomaly.enabled:
            outs = _apply_node(node, grads, None, shared)
        else:
            outs = _apply(node, grads, None, shared)
        if not retain_graph:
            node._release()
        direct = None
        for (nxt, nr), g in zip(node.next_functions, outs):
            if nxt is None:
                continue
            if g is not None:
                buf = buffers.get(nxt)
                if buf is None:
                    buf = buffers[nxt] = [None] * nxt._num_outputs()
                    buf[nr] = g
                else:
                    buf[nr] = g if buf[nr] is None else _sum_grads(buf[nr], g)
            d = deps[nxt] - 1
            deps[nxt] = d
            if d == 0:  # only roots are queued at the start, and only with no deps
                if direct is None and not ready:
                    direct = nxt  # alone in the heap it would be popped next
                else:
                    if direct is not None:
                        heappush(ready, (-direct._sequence_nr, id(direct), direct))
                        direct = None
                    heappush(ready, (-nxt._sequence_nr, id(nxt), nxt))
        node = direct


def _accumulate_node(node, grads, create_graph, shared) -> None:
    """Run an AccumulateGrad node (timed as its own row under the profiler)."""
    if _fn._profiler is not None:
        _fn._profiler._record_node(node, _accumulate_into, node.variable, grads[0],
                                   create_graph, shared)
    else:
        _accumulate_into(node.variable, grads[0], create_graph, shared)


def _add_to_buffer(buffers, node, nr, g) -> None:
    buf = buffers.get(node)
    if buf is None:
        buf = buffers[node] = [None] * node._num_outputs()
    buf[nr] = g if buf[nr] is None else _sum_grads(buf[nr], g)


def _sum_grads(a, b):
    """Two gradients for one output: ``a + b``; with no graph to record and nothing to
    broadcast or promote, one backend add on the arrays (a Tensor op costs ~2 µs more)."""
    x, y = a._data, b._data
    if _state.enabled or x.shape != y.shape or x.dtype != y.dtype or a._device != b._device \
            or x.dtype in HALF_NP:  # half precision: through apply, computed in float32
        return a + b
    device = a._device
    return type(a)._wrap(_fn.as_array(backend_for(device.type).add(x, y)), device)


def _run_pre_hooks(node, grads, shared):
    if node._tensor_hooks:
        for nr, hooks in node._tensor_hooks.items():
            for fn in list(hooks.values()):
                if grads[nr] is None:
                    continue
                shared.add(id(grads[nr]._storage))  # the hook may keep what it was given
                new = fn(grads[nr])
                if new is not None:
                    _check_hook_result(fn, new, grads[nr])
                    grads[nr] = new
    if node._retained:
        for nr, ref in node._retained.items():
            t = ref()
            if t is not None and grads[nr] is not None:
                g = grads[nr]
                t._grad = g if _state.enabled else g.detach()
                shared.add(id(g._storage))
    if node._pre_hooks:
        for fn in list(node._pre_hooks.values()):
            shared.update(id(g._storage) for g in grads if g is not None)
            new = fn(tuple(grads))
            if new is not None:
                grads = list(new)
    return grads


def _check_hook_result(fn, new, old) -> None:
    name = getattr(fn, "__name__", repr(fn))
    if not hasattr(new, "_storage"):
        raise TypeError(f"expected Tensor or None (got {type(new).__name__}) from hook '{name}'")
    if new._data.shape != old._data.shape:
        raise RuntimeError(f"hook '{name}' has changed the size of value")


def _apply(node, grads, needed, shared):
    """Run one node's backward: timed under the profiler, checked under anomaly mode."""
    if _fn._profiler is None and not _anomaly.enabled:
        return _apply_node(node, grads, needed, shared)
    from .anomaly_mode import check_nan, warn_forward_trace

    try:
        if _fn._profiler is not None:
            outs = _fn._profiler._record_node(node, _apply_node, node, grads, needed, shared)
        else:
            outs = _apply_node(node, grads, needed, shared)
        if _anomaly.enabled and _anomaly.check_nan:
            check_nan(node, outs)
    except Exception:
        if _anomaly.enabled:
            warn_forward_trace(node, stacklevel=4)
        raise
    return outs


def _apply_node(node, grads, needed, shared):
    if needed is None:
        nf = node.next_functions
        if len(nf) == 1:  # the common arities without a comprehension
            mask = (nf[0][0] is not None,)
        elif len(nf) == 2:
            mask = (nf[0][0] is not None, nf[1][0] is not None)
        else:
            mask = tuple([nxt is not None for nxt, _ in nf])
    else:
        mask = tuple([nxt is not None and nxt in needed for nxt, _ in node.next_functions])
    outs = node.apply(grads, mask)
    _fit_to_inputs(node, outs)
    if len(outs) > 1 and len(grads) == 1:  # the common case of the rule below
        if grads[0] is not None:
            storage, handed = grads[0]._storage, 0
            for g in outs:
                if g is not None and g._storage is storage:
                    handed += 1
            if handed > 1:
                shared.add(id(storage))
    elif len(outs) > 1:
        # An output that aliases an incoming gradient (t(), view, add's pass-through) may
        # become a leaf's .grad without a copy unless that buffer is visible elsewhere: the
        # incoming one was shared already, or this node hands it to more than one edge.
        incoming = {id(g._storage) for g in grads if g is not None}
        handed_out = set()
        for g in outs:
            if g is None:
                continue
            sid = id(g._storage)
            if sid in incoming:
                if sid in handed_out:
                    shared.add(sid)
                handed_out.add(sid)
    if node._hooks:
        for fn in list(node._hooks.values()):
            new = fn(tuple(outs), tuple(grads))
            if new is not None:
                outs = list(new)
    return outs


def _fit_to_inputs(node, outs) -> None:
    """Glue after a node's backward, in place on ``outs``: each gradient summed over the
    broadcast dims to its input's shape, then cast to its input's dtype. One function so
    the verifier checks the step the engine runs (symgrad/symbolic/glue.py)."""
    meta = node._input_meta
    if meta is not None:
        for i, g in enumerate(outs):
            if g is None or meta[i] is None:
                continue
            shape, dtype = meta[i]
            if g._data.shape != shape:
                g = outs[i] = _sum_to(g, shape)
            if g._data.dtype is not dtype.np and g._data.dtype != dtype.np:
                outs[i] = g.to(dtype)
    else:  # every input is shaped like output 0 (see _record): only a dtype to check
        dtype = node._out_meta[0][1]
        for i, g in enumerate(outs):
            if g is not None and g._data.dtype is not dtype.np and g._data.dtype != dtype.np:
                outs[i] = g.to(dtype)


def _sum_to(g, shape):
    """``g.sum_to_size(shape)``; for leading broadcast dims when no graph is recorded (a
    bias's gradient), one backend sum straight on the array."""
    data = g._data
    gs = data.shape
    lead = len(gs) - len(shape)
    if lead > 0 and not _state.enabled and gs[lead:] == shape and data.dtype not in HALF_NP:
        be = backend_for(g._device.type)
        return type(g)._wrap(be.sum(data, tuple(range(lead)), False), g._device)
    return g.sum_to_size(shape)


def _accumulate_into(variable, g, create_graph, shared) -> None:
    """AccumulateGrad: ``.grad = g`` the first time, then ``.grad += g``."""
    if g is None:
        return
    if variable._backward_hooks:
        g = _leaf_hooks(variable, g)
    old = variable._grad
    if create_graph:
        variable._grad = g if old is None else old + g
        return
    if old is None:
        if id(g._storage) in shared or not g._data.flags.c_contiguous \
                or not g._data.flags.writeable or g._storage.nbytes != g._data.nbytes:
            g = g.detach().clone()
        else:
            g = g.detach()
        variable._grad = g
    elif old._grad_fn is not None:
        variable._grad = (old + g).detach()
    else:
        old._inplace_add(g)


def _leaf_hooks(variable, g):
    """``Tensor.register_hook`` hooks of a leaf, run before its gradient is used."""
    for fn in list((variable._backward_hooks or {}).values()):
        new = fn(g)
        if new is not None:
            _check_hook_result(fn, new, g)
            g = new
    return g


# -- the public entry points (symgrad.autograd.backward / grad, Tensor.backward) --------------
def _as_list(x):
    if x is None:
        return None
    if isinstance(x, _tl.Tensor):
        return [x]
    return list(x)


def _make_grads(outputs, grad_outputs, create_graph):
    grads = []
    for i, out in enumerate(outputs):
        g = grad_outputs[i] if grad_outputs is not None and i < len(grad_outputs) else None
        if g is None:
            data = out._data
            if data.size != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if data.dtype.kind != "f" and data.dtype not in HALF_NP:
                raise RuntimeError("grad can be implicitly created only for real scalar "
                                   f"outputs but got {out.dtype!r}")
            if out._device.type == "cpu":  # the common case, without the factory's checks
                g = type(out)._wrap(np.ones(data.shape, data.dtype), out._device)
            else:
                g = _tl.ones_like(out)
        else:
            if tuple(g.shape) != tuple(out.shape):
                raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of "
                                   f"{g.shape!r} and output[{i}] has a shape of {out.shape!r}.")
            if g.dtype is not out.dtype:
                g = g.to(out.dtype)
        grads.append(g)
    return grads


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None) -> None:
    """Accumulate gradients of ``tensors`` into the leaves' ``.grad``."""
    outputs = _as_list(tensors)
    grads = _make_grads(outputs, _as_list(grad_tensors), create_graph)
    if retain_graph is None:
        retain_graph = create_graph
    inputs = _as_list(inputs)
    if inputs is not None and len(inputs) == 0:
        raise RuntimeError("'inputs' argument to backward() cannot be empty.")
    run_backward(outputs, grads, retain_graph=retain_graph, create_graph=create_graph,
                 inputs=inputs, accumulate=True)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, allow_unused: bool | None = None,
         materialize_grads: bool = False) -> tuple:
    """Return the gradients of ``outputs`` with respect to ``inputs`` (no ``.grad`` touched)."""
    outs = _as_list(outputs)
    ins = _as_list(inputs)
    grads = _make_grads(outs, _as_list(grad_outputs), create_graph)
    if retain_graph is None:
        retain_graph = create_graph
    if allow_unused is None:
        allow_unused = materialize_grads
    result = run_backward(outs, grads, retain_graph=retain_graph, create_graph=create_graph,
                          inputs=ins, accumulate=False, allow_unused=allow_unused)
    if materialize_grads:
        result = tuple(_tl.zeros_like(x) if r is None else r for r, x in zip(result, ins))
    return result
