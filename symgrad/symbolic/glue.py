"""Checks of the engine's glue between backward rules (issue 18).

The rules of the ops are checked node by node (local.py); what the engine does *between*
them is checked here, by running the engine's own functions on seeded random gradients
and comparing with their exact meaning in float64:

* broadcast reduction (``engine._fit_to_inputs``): a node's raw gradient for an input is
  summed over the broadcast dims to the input's shape and cast to its dtype; exact meaning
  the float64 sum over those dims of the raw gradient;
* accumulation at fan-out (``engine._add_to_buffer``, i.e. ``_sum_grads``): the gradients
  flowing into a tensor that feeds several nodes (or one node twice) are added; exact
  meaning their float64 sum;
* AccumulateGrad (``engine._accumulate_into``) into ``.grad``: the first gradient is
  stored, later ones (another backward call) are added; checked on a stand-in leaf of the
  same shape and dtype (the user's ``.grad`` is never touched), with and without
  ``create_graph``.

Each is compared within the rounding bound of local.py (``rounding_bound``: M the sum of
|terms|, n the number of terms plus a few), so a float32 sum is never a false alarm while
a wrong reduction (a mean, a dropped term, a factor) is far outside it.
"""

from __future__ import annotations

import time

import numpy as np

from ._common import (
    OUTER_FROM,
    TimeoutExpired,
    _sum_to,
    random_uniform,
    rounding_bound,
    same_memory,
)

__all__ = ["GlueFault", "check_fit", "check_accumulation", "check_accumulate_grad"]


class GlueFault:
    """A glue step outside its bound: ``what`` names it, ``detail`` says by how much."""

    __slots__ = ("what", "detail", "node", "leaf", "bound", "err", "index")

    def __init__(self, what, detail, node=None, leaf=None, bound=None, err=None,
                 index=None) -> None:
        self.what = what
        self.detail = detail
        self.node = node  # the grad_fn that receives the faulty gradient (or AccumulateGrad)
        self.leaf = leaf  # the Leaf, for faults on a leaf's gradient
        self.bound = bound
        self.err = err
        self.index = index  # the receiving node's index in the Graph, when a node

    def __repr__(self) -> str:
        return f"GlueFault({self.what!r})"


def _uniform(rng, shape):
    """Random values in [-1, 1) (both signs; a third of the cost of normal draws)."""
    return np.asarray(rng.uniform(-1.0, 1.0, shape), dtype=np.float64)  # = 2 random - 1


def _compare(got, want, mag, n, dtype):
    """(ok, worst flat index, error, bound) of ``got`` against the exact ``want``;
    ``mag``: the term magnitudes, or a function that makes them."""
    got, want = np.asarray(got), np.asarray(want)
    if same_memory(got, want):  # the very array handed in: equal element for element
        return True, 0, 0.0, 0.0
    if got.shape == want.shape and np.array_equal(got, want):
        return True, 0, 0.0, 0.0  # equal: within any bound (the common case, at no cost)
    got = np.asarray(got, dtype=np.float64).reshape(-1)
    want = np.asarray(want, dtype=np.float64).reshape(-1)
    if got.shape != want.shape:
        return False, 0, np.inf, 0.0
    if callable(mag):  # the term magnitudes, only built when the values differ
        mag = mag()
    allowed = rounding_bound(dtype, np.asarray(mag, dtype=np.float64).reshape(-1), n,
                             finite=np.isfinite(want))
    with np.errstate(invalid="ignore"):
        err = np.where(got == want, 0.0, np.abs(got - want))
    err = np.where(np.isnan(err), np.inf, err)
    # a non-finite exact value (nan/inf among the terms) has no error to bound: the
    # non-finite rows say where it arose; a float32 sum beyond float32's range is inf
    big = np.abs(want) > float(np.finfo(np.dtype(dtype)).max)
    err = np.where(~np.isfinite(want) | (big & np.isinf(got)), 0.0, err)
    ok = err <= allowed
    if ok.all():
        return True, 0, float(err.max()) if err.size else 0.0, 0.0
    w = int(np.argmax(np.where(ok, -1.0, err / allowed)))
    return False, w, float(err[w]), float(allowed[w])


def _eps_dtype(*dts):
    """The least precise float dtype of ``dts`` (its eps bounds the rounding)."""
    fl = [np.dtype(d) for d in dts if d is not None and np.dtype(d).kind == "f"]
    return min(fl, key=lambda d: d.itemsize) if fl else np.dtype(np.float64)


def _where(index, shape) -> str:
    return str([int(i) for i in np.unravel_index(index, shape)]) if shape else "[]"


def check_fit(g, raw, fitted, shapes, dtypes):
    """The engine's reduction/cast of node ``g``'s raw gradients (``raw``: tensors from
    ``node.apply``) against the exact float64 sum; ``fitted``: what the engine's
    ``_fit_to_inputs`` made of them. Returns a :class:`GlueFault` or None."""
    for i, (r, f) in enumerate(zip(raw, fitted)):
        if r is None or i >= len(shapes) or shapes[i] is None:
            continue
        name = g.input_names[i] if i < len(g.input_names) else str(i)
        rv = np.asarray(r.detach().numpy())
        if rv.dtype.kind != "f":
            continue
        shape = tuple(shapes[i])
        want_dt = np.dtype(dtypes[i]) if dtypes[i] is not None else rv.dtype
        broadcast = rv.shape != shape
        what = (f"broadcast reduction into {g.name}'s '{name}'" if broadcast
                else f"the engine's cast of {g.name}'s gradient for '{name}'")
        if f is None:
            return GlueFault(what, "the engine dropped the gradient", g.node)
        fv = np.asarray(f.detach().numpy())
        if fv.shape != shape:
            return GlueFault(what, f"the engine made shape {list(fv.shape)}, expected "
                                   f"{list(shape)} (the input's shape)", g.node)
        if fv.dtype != want_dt:
            return GlueFault(what, f"the engine made dtype {fv.dtype}, expected {want_dt}",
                             g.node)
        if not broadcast and fv.dtype == rv.dtype and (same_memory(fv, rv)
                                                        or np.array_equal(fv, rv)):
            continue  # nothing to reduce or cast, and the engine passed it on unchanged
        r64 = rv.astype(np.float64)
        try:
            want = _sum_to(r64, shape)
            mag = _sum_to(np.abs(r64), shape)
        except ValueError:
            return GlueFault(what, f"gradient of shape {list(rv.shape)} cannot be summed to "
                                   f"{list(shape)}", g.node)
        terms = max(r64.size // max(int(np.prod(shape)), 1), 1)
        ok, w, err, bound = _compare(fv, want, mag, terms + 2, _eps_dtype(rv.dtype, want_dt))
        if not ok:
            kind = (f"the sum over the broadcast dims of the {list(rv.shape)} gradient"
                    if broadcast else "the gradient")
            return GlueFault(what, f"at {name}{_where(w, shape)}: engine "
                                   f"{float(fv.reshape(-1)[w]):.8g}, exact "
                                   f"{float(want.reshape(-1)[w]):.8g} ({kind}); error "
                                   f"{err:.3g} > bound {bound:.3g}", g.node, bound=bound,
                             err=err)
    return None


class _Slot:
    """A stand-in for the node whose gradient buffer is filled (only its arity counts)."""

    __slots__ = ("n",)

    def __init__(self, n) -> None:
        self.n = n

    def _num_outputs(self) -> int:
        return self.n


def _check_time(deadline) -> None:
    if deadline is not None and time.perf_counter() > deadline:
        raise TimeoutExpired


def _fan_in(graph):
    """{input reference: number of gradient edges into it} for references fed > once."""
    count: dict = {}
    for g in graph.nodes:
        for i, r in enumerate(g.inputs):
            if r[0] not in ("node", "leaf") or i >= len(g.needs) or not g.needs[i]:
                continue
            if r[0] == "leaf" and not graph.leaves[r[1]].requires_grad:
                continue
            key = tuple(r)
            count[key] = count.get(key, 0) + 1
    return {k: c for k, c in count.items() if c > 1}


def _ref_info(graph, ref):
    """(display name, shape, dtype, grad_fn receiving it or None, Leaf or None)."""
    if ref[0] == "leaf":
        lf = graph.leaves[ref[1]]
        return f"'{lf.name}'", lf.shape, lf.value.dtype, None, lf
    g = graph.nodes[ref[1]]
    out = f" (output {ref[2]})" if len(g.out_shapes) > 1 else ""
    return (f"the output of {g.name}{out}", tuple(g.out_shapes[ref[2]]), g.out_dtypes[ref[2]],
            g, None)


def check_accumulation(graph, rng, deadline=None):
    """The engine's sum of the gradients flowing into each tensor that feeds several
    nodes (or one node more than once). Returns a list of :class:`GlueFault`."""
    faults = []
    passed = set()  # (shape, dtype, k) already checked and right: the step is the same
    for ref, k in _fan_in(graph).items():
        _check_time(deadline)
        key = _key(graph, ref, k)
        if key in passed:
            continue
        f = _check_one_sum(graph, rng, ref, k)
        if f is not None:
            f.index = ref[1] if ref[0] == "node" else None
            faults.append(f)
        else:
            passed.add(key)
    return faults


def _key(graph, ref, k):
    _, shape, dtype, _, _ = _ref_info(graph, ref)
    return (tuple(shape), np.dtype(dtype).str, k)


def _check_one_sum(graph, rng, ref, k):
    """``k`` random gradients of the tensor ``ref`` added by the engine's buffer code
    (grad mode off, as in a plain backward, and on, as under create_graph)."""
    from .. import tensor as _tensor
    from ..autograd import engine
    from ..autograd.grad_mode import enable_grad, no_grad

    name, shape, dtype, g, lf = _ref_info(graph, ref)
    if np.dtype(dtype).kind != "f":
        return None
    node = g.node if g is not None else None
    gs = [np.asarray(rng.standard_normal(shape)).astype(dtype) for _ in range(k)]
    want = np.sum([x.astype(np.float64) for x in gs], axis=0)
    mag = np.sum([np.abs(x.astype(np.float64)) for x in gs], axis=0)
    what = f"accumulation of the {k} gradients flowing into {name}"
    nr = ref[2] if ref[0] == "node" else 0
    for mode, ctx in (("", no_grad), (" (create_graph)", enable_grad)):
        slot = _Slot(len(g.out_shapes) if g is not None else 1)
        buffers: dict = {}
        try:
            with ctx():
                for x in gs:
                    engine._add_to_buffer(buffers, slot, nr, _tensor(x))
            got = buffers[slot][nr]
            gv = None if got is None else np.asarray(got.detach().numpy())
        except Exception as exc:  # noqa: BLE001  (a broken glue step is a finding)
            return GlueFault(what + mode, f"raised {type(exc).__name__}: {exc}", node, lf)
        if gv is None or gv.shape != tuple(shape):
            return GlueFault(what + mode, "the engine's sum has shape "
                             f"{None if gv is None else list(gv.shape)}, expected "
                             f"{list(shape)}", node, lf)
        ok, w, err, bound = _compare(gv, want, mag, k + 2, dtype)
        if not ok:
            return GlueFault(what + mode, f"at {_where(w, shape)}: engine "
                             f"{float(gv.reshape(-1)[w]):.8g}, exact sum "
                             f"{float(want.reshape(-1)[w]):.8g}; error {err:.3g} > bound "
                             f"{bound:.3g}", node, lf, bound, err)
    return None


def check_accumulate_grad(graph, rng, deadline=None):
    """AccumulateGrad into ``.grad`` for each leaf requiring grad, on a stand-in tensor of
    the leaf's shape and dtype: ``.grad`` is the first gradient, then ``.grad += g`` on a
    second backward (with and without create_graph). Returns a list of GlueFault.

    The two gradients are windows of one random pool (``g2[i] = g1[i + 1]`` in flat
    order: every element random, the two arrays different), made once for all leaves,
    and the engine gets the second one itself (a right AccumulateGrad only reads it;
    the sum it must make is computed before): a model's leaves hold hundreds of
    thousands of elements, and this check must not cost more than the model's own
    backward."""
    from ..autograd import engine
    from ..autograd.grad_mode import no_grad
    from ..tensor import Tensor

    faults = []
    passed = set()  # (shape, dtype) already checked and right (leaves without hooks)
    todo = [lf for lf in graph.leaves if lf.requires_grad and lf.is_float]
    pool = None
    for lf in todo:
        _check_time(deadline)
        key = (lf.shape, lf.value.dtype.str)
        if key in passed:
            continue
        if pool is None:
            need = max(int(np.prod(x.shape)) for x in todo) + 1
            side = int(np.ceil(np.sqrt(need)))  # (an outer product: _common.random_uniform)
            pool = random_uniform(rng, (side, side) if need >= OUTER_FROM else (need,))[0]
            pool = pool.reshape(-1)
        what = f"AccumulateGrad into {lf.name}.grad"
        dtype = lf.value.dtype
        n = int(np.prod(lf.shape))
        g1 = pool[:n].reshape(lf.shape).astype(dtype, copy=False)
        g2 = pool[1:n + 1].reshape(lf.shape).astype(dtype, copy=False)
        want1 = g1.astype(np.float64, copy=False)
        want2 = np.add(want1, g2, dtype=np.float64)

        def mag1(w=want1):
            return np.abs(w)

        def mag2(w=want1, g=g2):
            return np.abs(w) + np.abs(g.astype(np.float64, copy=False))

        for create_graph in (False, True):
            mode = " (create_graph)" if create_graph else ""
            stand = Tensor._wrap(np.zeros(lf.shape, dtype=dtype))  # (no copy of the zeros)
            stand.requires_grad_(True)
            # the first gradient becomes .grad (and without create_graph the second is
            # added into it in place): a copy, so .grad is compared with values the
            # engine never held (one that scaled it in place would pass against g1
            # itself); the second one a right AccumulateGrad only reads
            firsts = (Tensor._wrap(g1.copy()), Tensor._wrap(g2))
            fault = None
            try:
                with no_grad():
                    for step, (x, want, mag) in enumerate(((firsts[0], want1, mag1),
                                                           (firsts[1], want2, mag2))):
                        engine._accumulate_into(stand, x, create_graph, set())
                        got = stand.grad
                        if got is None:
                            fault = GlueFault(what + mode, ".grad is None after a backward",
                                              None, lf)
                            break
                        gv = np.asarray(got.detach().numpy())
                        if gv.shape != lf.shape or gv.dtype != dtype:
                            fault = GlueFault(what + mode, f".grad has shape "
                                              f"{list(gv.shape)} and dtype {gv.dtype}, "
                                              f"expected {list(lf.shape)} and {dtype}", None, lf)
                            break
                        ok, w, err, bound = _compare(gv, want, mag, 3, dtype)
                        if not ok:
                            which = ("the first backward's gradient" if step == 0 else
                                     ".grad + the second backward's gradient")
                            fault = GlueFault(
                                what + mode, f"after backward #{step + 1} at "
                                f"{lf.name}{_where(w, lf.shape)}: .grad "
                                f"{float(gv.reshape(-1)[w]):.8g}, exact "
                                f"{float(want.reshape(-1)[w]):.8g} ({which}); error "
                                f"{err:.3g} > bound {bound:.3g}", None, lf, bound, err)
                            break
            except Exception as exc:  # noqa: BLE001  (a broken glue step is a finding)
                fault = GlueFault(what + mode, f"raised {type(exc).__name__}: {exc}", None, lf)
            if fault is not None:
                faults.append(fault)
                break
        else:
            passed.add(key)
    return faults


_PASS = None


def _pass_function():
    """A custom Function whose backward passes the gradient through unchanged: the probe
    below routes gradients through the engine's loop without any op's rule."""
    global _PASS
    if _PASS is None:
        from ..autograd import Function

        class _GluePass(Function):
            @staticmethod
            def forward(ctx, x):
                return x.clone()

            @staticmethod
            def backward(ctx, grad):
                return grad

        _PASS = _GluePass
    return _PASS


def check_backward_loop(graph, rng, deadline=None):
    """The accumulation inside the engine's own backward loop (``Tensor.backward``, whose
    main loop fills gradient buffers inline rather than through ``_add_to_buffer``): for
    each tensor fed ``k`` times, a stand-in ``h = pass(s)`` of its shape and dtype feeds
    ``k`` roots ``pass(h)``; a backward from them with random gradients ``g_i`` must leave
    ``sum g_i`` in ``h``'s buffer (read with ``retain_grad``). Leaves' AccumulateGrad
    buffers are filled by the same lines; ``.grad`` itself is check_accumulate_grad's."""
    from .. import tensor as _tensor
    from ..autograd import engine
    from ..autograd.grad_mode import enable_grad

    faults = []
    passed = set()
    for ref, k in _fan_in(graph).items():
        _check_time(deadline)
        name, shape, dtype, g, lf = _ref_info(graph, ref)
        key = _key(graph, ref, k)
        if np.dtype(dtype).kind != "f" or key in passed:
            continue
        node = g.node if g is not None else None
        gs = [np.asarray(rng.standard_normal(shape)).astype(dtype) for _ in range(k)]
        want = np.sum([x.astype(np.float64) for x in gs], axis=0)
        mag = np.sum([np.abs(x.astype(np.float64)) for x in gs], axis=0)
        what = f"accumulation in the backward loop of the {k} gradients flowing into {name}"
        fault = None
        try:
            P = _pass_function()
            s = _tensor(np.zeros(shape, dtype=dtype))
            s.requires_grad_(True)
            with enable_grad():
                h = P.apply(s)
                h.retain_grad()
                roots = [P.apply(h) for _ in range(k)]
            engine.run_backward(roots, [_tensor(x) for x in gs], retain_graph=False,
                                create_graph=False)
            if h.grad is None:
                fault = GlueFault(what, "no gradient arrived", node, lf)
            else:
                gv = np.asarray(h.grad.detach().numpy())
                ok, w, err, bound = _compare(gv, want, mag, k + 2, dtype)
                if not ok:
                    fault = GlueFault(
                        what, f"at {_where(w, shape)}: engine {float(gv.reshape(-1)[w]):.8g}, "
                        f"exact sum {float(want.reshape(-1)[w]):.8g}; error {err:.3g} > "
                        f"bound {bound:.3g}", node, lf, bound, err)
        except Exception as exc:  # noqa: BLE001  (a broken glue step is a finding)
            fault = GlueFault(what, f"raised {type(exc).__name__}: {exc}", node, lf)
        if fault is not None:
            fault.index = ref[1] if ref[0] == "node" else None
            faults.append(fault)
        else:
            passed.add(key)
    return faults
