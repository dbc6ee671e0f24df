"""Writing in place into a view of a tensor in the graph, as PyTorch records it.

``y = x * 2; y[:, 0].mul_(3)`` (or ``y[1][0] = 5``) changes ``y``'s values, so ``y``'s
grad_fn becomes ``CopySlices``: ``y``'s old value with the view's region replaced by the op
applied to the old view values. The view's own grad_fn becomes a view of the new ``y``
(``AsStridedBackward0``, as torch names it).

symgrad has no ``_base`` attribute: the base is found through the view's graph (each view
node keeps its input 0, weakly unless under ``symgrad.record()``), as the deepest tensor
still alive that shares the view's storage. Only views made by basic indexing (select,
slice, narrow, unsqueeze, ``x[...]``, and the views this module makes) are expressed as a
region of the base; any other view op between the view and a live base (transpose,
view/reshape, expand, diagonal ...) is refused with its name rather than differentiated
wrongly. With no live base (only the view alive) the write is recorded on the view alone,
which is exact for the view's own graph.

torch regenerates a view's grad_fn from its base whenever the base was written since. Here
every view a registered view op makes of a graph tensor is noted (weakly, per storage, by
``apply``: see ``note_view``), as are the views written through; a write into the base
rebases the live ones (``refresh_views``): a region of the base onto AsStridedBackward0 of
its new grad_fn; any other (``y.t()``, ``y.view(6)[1:]``, ``y[0].expand(...)``) by
replaying its chain of view ops on the base's new state (``_Chain``), so its grad_fn keeps
the last op's name where torch says AsStridedBackward0 (see docs/differences.md). A view
through a multi-output op (unbind, split) keeps its grad_fn.

Recorded structure (exact for the verifier): ``CopySlices(base_old, op(as_strided(base_old)))``
where ``as_strided`` is the region view of the old base. torch hides the op's node inside
CopySlices (its next_functions are the base's old grad_fn and the op's other inputs); here
the op's node is CopySlices' second input, so ``next_functions[1]`` differs from torch's while
every gradient is the same.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import numpy as np

from . import _tensor_layer as _tl
from .autograd import function as _function
from .autograd.function import _is_view_of, _record, as_array
from .autograd.node import AccumulateGrad
from .ops._ints import norm, s64

__all__ = ["view_base", "compose", "LEAF_VIEW"]

LEAF_VIEW = ("a view of a leaf Variable that requires grad is being used in an in-place "
             "operation.")

#: as_strided_region node -> weakref to the base it views (its recorded input is a stand-in)
VIEW_BASE: Any = weakref.WeakKeyDictionary()

#: id(base) -> (weakref to the base, {id(view): (weakref to the view, region or _Chain)}):
#: the views written through (or on the way of a write) or located after one, rebased again
#: at every later write into the base, as torch regenerates a view's grad_fn when its base
#: changed
VIEWS_OF: dict = {}

#: id(storage) -> [weak reference to a view]: views made by a view op (``x[i]``, select,
#: ``t()``, ``view`` ...) of a graph tensor, not yet located; a write into their base
#: locates and rebases them. Plain weak references (the tensor's own ``_weak``), no
#: callbacks: dead ones are swept every ``_SWEEP_EVERY`` notes (a callback per view cost
#: ~0.7 µs per view made).
MADE: dict = {}
_SWEEP_EVERY = 1024
_counter = itertools.count(1)  # notes so far


def note_view(v) -> None:
    """Remember ``v``, a view just made of a tensor in the graph (``apply`` calls this
    for every view op's result)."""
    w = v._weak
    if w is None:
        w = v._weak = weakref.ref(v)
    views = MADE.get(id(v._storage))
    if views is None:
        MADE[id(v._storage)] = [w]
    else:
        views.append(w)
    if next(_counter) % _SWEEP_EVERY == 0:
        _sweep()


def _sweep() -> None:
    """Drop the dead views (and the storages left with none). A storage's id may be reused
    once it is gone; its dead entries are skipped and then swept, and a live view always
    keeps its own storage alive, so a live entry never belongs to another storage."""
    for key, views in list(MADE.items()):
        live = [w for w in views if w() is not None]
        if live:
            MADE[key] = live
        else:
            del MADE[key]


#: view ops whose output is a basic-index region of their input
_REGION_OPS = frozenset(("select", "slice", "unsqueeze", "alias", "as_strided_region"))


def _deref(r):
    return r() if isinstance(r, weakref.ref) else r


def view_base(t, what: str):
    """``(base, region)`` when ``t`` is a view of a live tensor in the graph, else None.

    Raises torch's error for a view of a leaf that requires grad, and a clear one (naming
    the op) for a view symgrad cannot express as a region of its base. ``what`` names the
    write for that message ("in-place mul", "assignment").
    """
    node = t._grad_fn
    steps: list = []  # view nodes from t down to the base
    base = None
    depth = 0
    alive: dict = {}  # level (0: t) -> a live view between t and the base
    storage = t._storage
    while node is not None:
        spec = getattr(type(node), "_spec", None)
        if spec is None or not spec.view:
            if isinstance(node, AccumulateGrad) and steps:
                raise RuntimeError(LEAF_VIEW)  # (the leaf itself is gone)
            break
        steps.append(node)
        ref = VIEW_BASE.get(node)
        inp = ref() if ref is not None else (
            _deref(node._input_refs[0]) if node._input_refs else None)
        if inp is not None:
            if getattr(inp, "_storage", None) is not storage:
                break
            base, depth = inp, len(steps)
            alive[depth] = inp
            if inp._grad_fn is None:
                break
        node = node.next_functions[0][0] if node.next_functions else None
    if base is None:
        return None
    if base._grad_fn is None:
        if base._requires_grad:
            raise RuntimeError(LEAF_VIEW)
        return None
    chain = steps[:depth]
    for n in chain:
        if type(n)._spec.name not in _REGION_OPS:
            raise RuntimeError(
                f"symgrad does not support {what} on a view ({n.name()}) of a tensor that "
                "requires grad yet: only views made by indexing (select, slice, narrow, "
                "unsqueeze) can be written into, so its base's gradient would be wrong. Apply "
                "the op out of place, or clone() the view first.")
    items: list = [range(n) for n in base._data.shape]
    others = []  # the live views in between, with their regions: rebased too
    for j in range(depth - 1, -1, -1):
        n = chain[j]
        items = _step(items, type(n)._spec.name, n._params)
        if items is None:
            raise RuntimeError(f"symgrad cannot locate the view ({n.name()}) written by "
                               f"{what} in its base tensor.")
        if 0 < j and j in alive and _same_view(base, to_region(items), alive[j]):
            others.append((alive[j], to_region(items)))
    region = to_region(items)
    if not _same_view(base, region, t):
        raise RuntimeError(f"symgrad cannot locate the view ({steps[0].name()}) written by "
                           f"{what} in its base tensor (its base changed shape since).")
    return base, region, tuple(others)


def _dims(items) -> list[int]:
    """Positions in ``items`` of the entries that make a dimension of the view."""
    return [k for k, e in enumerate(items) if not isinstance(e, int)]


def _step(items, op: str, params):
    """``items`` (ranges, ints, None over the base) after the view op ``op``."""
    items = list(items)
    dims = _dims(items)
    if op == "alias":
        return items
    if op == "as_strided_region":
        return from_region(params["_region"], items)
    if op == "unsqueeze":
        d = norm(params["dim"], len(dims) + 1)
        items.insert(dims[d] if d < len(dims) else len(items), None)
        return items
    d = norm(params["dim"], len(dims))
    k = dims[d]
    e = items[k]
    size = 1 if e is None else len(e)
    if op == "select":
        i = s64(params["index"])
        if not -size <= i < size:
            return None
        if e is None:
            del items[k]
        else:
            items[k] = e[i]
        return items
    # slice
    r = range(size)[s64(params["start"]):s64(params["end"]):params["step"]]
    if e is None:
        if len(r) != 1:
            return None
    else:
        items[k] = e[r.start:r.stop:r.step] if len(r) else range(e.start, e.start)
    return items


def from_region(region, items):
    """Apply a basic index tuple (ints, slices, None, Ellipsis) to ``items``."""
    items = list(items)
    used = sum(1 for b in region if b is not None and b is not Ellipsis)
    ellipsis = len(_dims(items)) - used  # the dims ``...`` stands for
    d = 0
    for b in region:
        if b is Ellipsis:
            d += ellipsis
        elif b is None:
            items = _step(items, "unsqueeze", {"dim": d})
            d += 1
        elif isinstance(b, slice):
            start, stop, step = b.indices(_len_at(items, d))
            items = _step(items, "slice", {"dim": d, "start": start, "end": stop,
                                           "step": step})
            d += 1
        else:
            items = _step(items, "select", {"dim": d, "index": int(b)})
        if items is None:
            return None
    return items


def _len_at(items, d: int) -> int:
    e = items[_dims(items)[d]]
    return 1 if e is None else len(e)


def compose(region, basic):
    """The region of ``base[region][basic]`` (``basic`` a basic index of the view)."""
    items: list = []
    for b in region:
        items.append(b if b is None or isinstance(b, int) else range(b.start, b.stop, b.step))
    out = from_region(basic, items)
    return None if out is None else to_region(out)


def to_region(items) -> tuple:
    out = []
    for e in items:
        if isinstance(e, range):
            stop = e.stop if e.stop >= 0 or len(e) == 0 else None
            out.append(slice(e.start, e.start if len(e) == 0 else stop, e.step))
        else:
            out.append(e)
    return tuple(out)


def _pointer(a):
    face = getattr(a, "__array_interface__", None) or getattr(a, "__cuda_array_interface__",
                                                               None)
    return None if face is None else face["data"][0]


def _same_view(base, region, t) -> bool:
    """Does ``base[region]`` cover exactly ``t``'s elements?"""
    from .ops.indexing import region_view

    v = region_view(_tl.backend_for(base._device.type), base._data, region)
    if tuple(v.shape) != tuple(t._data.shape):
        return False
    if v.size <= 1:
        return v.size == 0 or _pointer(v) == _pointer(t._data)
    strides = [(a, b) for a, b, n in zip(v.strides, t._data.strides, v.shape) if n > 1]
    return _pointer(v) == _pointer(t._data) and all(a == b for a, b in strides)


def stand_in(t, be, eager: bool):
    """A tensor standing for ``t`` as it is now (values and grad_fn) as a node's input: a
    copy under ``symgrad.record()`` / saved_tensors_hooks (the verifier reads the values
    later), else a free alias."""
    s = _tl.Tensor._wrap(be.copy(t._data) if eager else t._data, t._device,
                     None if eager else t._storage)
    s._grad_fn = t._grad_fn
    s._output_nr = t._output_nr
    s._requires_grad = t._requires_grad
    s.name = t.name
    return s


def _move_retained(t, old_node, old_nr: int) -> None:
    """``t.retain_grad()`` follows ``t`` onto its new grad_fn."""
    if t._retains_grad and old_node is not None and old_node._retained:
        old_node._retained.pop(old_nr, None)
        t._grad_fn._retained = {0: weakref.ref(t)}


def _entry_for(base):
    key = id(base)
    entry = VIEWS_OF.get(key)
    if entry is None or entry[0]() is not base:
        entry = VIEWS_OF[key] = (weakref.ref(base, lambda _r, k=key: VIEWS_OF.pop(k, None)),
                                 {})
    return entry


def record_write(base, old_base, src, region, view, view_region, others, be,
                 eager: bool) -> None:
    """After a write into ``view`` (``base[view_region]``): ``base``'s grad_fn becomes
    CopySlices(old base, src at ``region``) and ``view``'s AsStridedBackward0 of it, as do
    those of the live views ``others`` (``(tensor, region)``) the write went through."""
    from .ops import OPS

    old_node, old_nr = base._grad_fn, base._output_nr
    _record(OPS["copy_slices"], (old_base, src), {"_region": region}, [base])
    _move_retained(base, old_node, old_nr)
    entry = _entry_for(base)
    for v, r in ((view, view_region),) + tuple(others):
        entry[1][id(v)] = (weakref.ref(v), r)
    refresh_views(base, be, eager, ((view, view_region),) + tuple(others))


def refresh_views(base, be, eager: bool, written=()) -> None:
    """Rebase the views of ``base`` known here (noted when made, or written through
    before) onto ``base``'s current grad_fn, after a write into ``base``: a region as
    AsStridedBackward0, any other view by replaying its view ops."""
    from .ops import OPS

    entry = VIEWS_OF.get(id(base))
    if entry is None or entry[0]() is not base:
        entry = None
    made = MADE.get(id(base._storage))
    if made:  # views made by indexing before: locate them in base
        keep = []
        for ref in made:
            v = ref()
            if v is None:
                continue
            if v is base or v._grad_fn is None or any(v is w for w, _ in written):
                keep.append(ref)
                continue
            try:
                found = view_base(v, "")
            except RuntimeError:  # not a region of base (transpose ...): its chain of ops
                steps = view_chain(v, base)
                if steps is None:  # (through unbind, split ...): left as it is
                    keep.append(ref)
                    continue
                if entry is None:
                    entry = _entry_for(base)
                entry[1][id(v)] = (weakref.ref(v), _Chain(steps))
                continue
            if found is None or found[0] is not base:
                keep.append(ref)
                continue
            if entry is None:  # located: known from now on, rebased at every write
                entry = _entry_for(base)
            entry[1][id(v)] = (weakref.ref(v), found[1])
            VIEW_BASE[v._grad_fn] = weakref.ref(base)  # so the loop below rebases it
        if keep:
            MADE[id(base._storage)] = keep
        else:
            del MADE[id(base._storage)]
    if entry is None:
        return
    known = entry[1]
    for k, (ref, r) in list(known.items()):
        v = ref()
        if v is None:
            del known[k]
            continue
        if type(r) is _Chain:
            if v._storage is not base._storage or (
                    r.node is not None and r.node() is not v._grad_fn) or not _replay(
                    base, r, v, be, eager):
                del known[k]  # no longer that view of base (or it cannot be replayed)
            continue
        if not any(v is w for w, _ in written):
            # an earlier written view: still a view of base in the graph?
            b = VIEW_BASE.get(v._grad_fn) if v._grad_fn is not None else None
            if b is None or b() is not base or v._storage is not base._storage:
                del known[k]
                continue
        old_node, old_nr = v._grad_fn, v._output_nr
        _record(OPS["as_strided_region"], (stand_in(base, be, eager),), {"_region": r}, [v])
        VIEW_BASE[v._grad_fn] = weakref.ref(base)
        _move_retained(v, old_node, old_nr)


class _Chain:
    """A view of a base that is no region of it (``y.t()``, ``y.view(6)[1:]`` ...): the view
    ops from the base to it (``(spec, params)``, base first), replayed on the base's current
    state at every write into the base; ``node``: a weak reference to the view's grad_fn
    recorded by the last replay (None before the first)."""

    __slots__ = ("steps", "node")

    def __init__(self, steps) -> None:
        self.steps = steps
        self.node = None


def _plain(value) -> bool:
    """Is ``value`` a parameter a replay can reuse (numbers, strings, None, slices and
    tuples of them; no tensors or arrays)?"""
    if value is None or isinstance(value, (bool, int, float, str, slice, np.generic)) \
            or value is Ellipsis:
        return True
    if isinstance(value, (tuple, list)):
        return all(_plain(e) for e in value)
    return False


def view_chain(v, base):
    """The view ops from ``base`` to ``v`` (``(spec, params)``, base first) when ``v``'s
    grad_fn is a chain of single-output view nodes with plain parameters down to ``base``;
    else None (a multi-output op such as unbind on the way, another base)."""
    node = v._grad_fn
    steps: list = []
    storage = base._storage
    while node is not None:
        spec = getattr(type(node), "_spec", None)
        if spec is None or not spec.view or len(spec.outputs) != 1:
            return None
        params = getattr(node, "_params", None)
        if params is None or not all(_plain(p) for p in params.values()):
            return None
        steps.append((spec, params))
        ref = VIEW_BASE.get(node)
        inp = ref() if ref is not None else (
            _deref(node._input_refs[0]) if node._input_refs else None)
        if inp is base:
            steps.reverse()
            return steps
        if inp is not None and getattr(inp, "_storage", None) is not storage:
            return None
        node = node.next_functions[0][0] if node.next_functions else None
    return None


def _replay(base, chain: _Chain, v, be, eager: bool) -> bool:
    """Re-record ``v`` as its chain of view ops applied to ``base`` as it is now: ``v``'s
    grad_fn becomes the last op's node (torch names it AsStridedBackward0; see
    docs/differences.md). False (nothing recorded) when the replay does not give ``v``'s
    shape."""

    Tensor = _tl.Tensor
    cur = stand_in(base, be, eager)
    pending = []  # (spec, params, input, output) in order; output None for v itself
    last = len(chain.steps) - 1
    for k, (spec, params) in enumerate(chain.steps):
        try:
            a = as_array(spec.forward(be, cur._data, **params))
        except Exception:  # the base changed shape since (resize_ ...): left as it is
            return False
        if k == last:
            if tuple(a.shape) != tuple(v._data.shape) or a.dtype != v._data.dtype:
                return False
            pending.append((spec, params, cur, v))
            break
        out = Tensor._wrap(a, cur._device, cur._storage if _is_view_of(a, cur._data, be)
                           else None)
        pending.append((spec, params, cur, out))
        cur = out
    old_node, old_nr = v._grad_fn, v._output_nr
    for k, (spec, params, inp, out) in enumerate(pending):
        _record(spec, (inp,), params, [out])
        if k == 0:  # the chain's first node views base (its input is a stand-in)
            VIEW_BASE[out._grad_fn] = weakref.ref(base)
    chain.node = weakref.ref(v._grad_fn)
    _move_retained(v, old_node, old_nr)
    return True


_function._note_view = note_view  # every view op's result is noted from now on
