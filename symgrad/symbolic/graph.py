"""A recorded graph, read into a neutral form the verifier's modes share.

``Graph`` lists the op nodes in forward (topological) order, the tensor inputs
("leaves": user tensors, requiring grad or not) with their display names, and for each
node where its inputs come from. Values the backward never saved are read through the
nodes' weak input references (or strong ones under ``symgrad.record()``); node outputs
nobody holds any more are recomputed by replaying the recorded forward.
PyTorch graphs are read into the same form by ``torch_graph``.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Graph", "GNode", "Leaf", "FreedGraphError", "walk_symgrad", "tex_name"]

FREED_HINT = ("Keep the graph alive for the verifier: verify before backward(), call "
              "backward(retain_graph=True), or record the forward under "
              "`with symgrad.record():` (in notebooks, `%%symgrad` does this).")


class FreedGraphError(RuntimeError):
    """The graph was freed and a value the verifier needs is gone."""


def deref(r):
    return r() if isinstance(r, weakref.ReferenceType) else r


@dataclass(eq=False)
class Leaf:
    """A tensor input of the graph (a leaf requiring grad, or a constant tensor)."""

    index: int
    tensor: Any
    value: np.ndarray
    requires_grad: bool
    name: str = ""
    latex: str = ""
    symbols: Any = None  # object array of engine symbols (numbers for int/bool tensors)

    @property
    def shape(self) -> tuple:
        return tuple(self.value.shape)

    @property
    def is_float(self) -> bool:
        return self.value.dtype.kind == "f"


@dataclass(eq=False)
class GNode:
    """One op node. ``inputs``: ("node", j, nr) | ("leaf", k) | ("scalar", v)."""

    index: int
    node: Any
    name: str
    spec: Any
    inputs: list
    params: dict
    out_shapes: list
    out_dtypes: list  # numpy dtypes
    needs: tuple = ()
    custom: Any = None  # a custom Function class (its ``sympy`` gives the meaning)
    input_names: tuple = ()
    in_values: list = field(default_factory=list)  # recorded values, filled lazily
    note: str = ""
    backward: Any = None  # callable(graph, gnode, np grads) -> list of np arrays | None
    #: set by node_backward: (raw gradients from node.apply, what the engine's
    #: _fit_to_inputs made of them), for the broadcast-reduction check (glue.py)
    glue: Any = None
    forward_numeric: Any = None  # callable(be, arrays) -> outputs (replay)


@dataclass
class Changed:
    """A leaf written in place after a node that reads it was recorded."""

    recorded: int  # its version when recorded (an upper bound when not ``exact``)
    now: int
    kept: bool  # its recorded value was kept (symgrad.record()) and is the leaf's value
    exact: bool = True
    replaced: bool = False  # ``.data`` was assigned: another storage now

    def versions(self) -> str:
        if self.replaced:
            return "its .data replaced"
        was = f"{self.recorded}" if self.exact else f"at most {self.recorded}"
        return f"version {was} when recorded, {self.now} now"


@dataclass(eq=False)
class Graph:
    kind: str  # "symgrad" | "torch"
    nodes: list
    leaves: list
    root: tuple  # ("node", j, nr) | ("leaf", k)
    root_value: np.ndarray
    root_tensor: Any = None
    freed: bool = False
    notes: list = field(default_factory=list)
    #: leaf index -> Changed: the leaves written in place since the graph was recorded
    changed: dict = field(default_factory=dict)
    engine_grads: Any = None  # callable(gradient np) -> {leaf index: np array}
    engine_hvp: Any = None  # callable(gradient, {leaf: u}) -> {leaf: np array}
    _values: dict = field(default_factory=dict)  # (j, nr) -> recorded numeric value

    def value_of(self, ref):
        """The recorded numeric value of an input reference."""
        if ref[0] == "leaf":
            return self.leaves[ref[1]].value
        if ref[0] == "scalar":
            return ref[1]
        key = (ref[1], ref[2])
        v = self._values.get(key)
        if v is None:
            self._replay_into(ref[1])
            v = self._values[key]
        return v

    def _replay_into(self, j: int) -> None:
        from ..backends.numpy_backend import NumpyBackend

        g = self.nodes[j]
        arrays = [self.value_of(r) for r in g.inputs]
        outs = g.forward_numeric(NumpyBackend(), arrays)
        for nr, o in enumerate(outs):
            if nr < len(g.out_dtypes):
                o = np.asarray(o).astype(g.out_dtypes[nr], copy=False)
            self._values.setdefault((j, nr), np.asarray(o))

    def node_inputs(self, g: GNode) -> list:
        if not g.in_values:
            g.in_values = [self.value_of(r) for r in g.inputs]
        return g.in_values

    def scalar_ops(self) -> int:
        """A cost estimate: scalar operations one symbolic replay performs."""
        total = 0
        for g in self.nodes:
            out = sum(int(np.prod(s)) for s in g.out_shapes) or 1
            ins = [self._shape_of(r) for r in g.inputs]
            if g.spec is not None and g.spec.name in ("mm", "mv", "dot", "addmm", "bmm",
                                                      "matmul", "baddbmm"):
                shapes = [self._shape_of(r) for r in g.inputs if r[0] != "scalar"]
                k = shapes[-1][0] if len(shapes[-1]) >= 2 else shapes[-1][-1]
                total += 2 * out * max(int(k), 1)
            else:
                total += out + sum(int(np.prod(s)) for s in ins)
        return total

    def _shape_of(self, ref):
        if ref[0] == "leaf":
            return self.leaves[ref[1]].value.shape
        if ref[0] == "scalar":
            return ()
        return tuple(self.nodes[ref[1]].out_shapes[ref[2]])


# -- names ------------------------------------------------------------------------------
_TEX_SPECIAL = {"\\": r"\backslash{}", "{": r"\{", "}": r"\}", "_": r"\_", "^": r"\^{}",
                "#": r"\#", "$": r"\$", "%": r"\%", "&": r"\&", "~": r"\~{}"}
_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
          "lambda", "mu", "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi",
          "psi", "omega"}


def tex_name(name: str) -> str:
    """A user name as LaTeX: escaped; multi-letter names upright; primes kept."""
    primes = len(name) - len(name.rstrip("'"))
    base = name[: len(name) - primes] if primes else name
    if base in _GREEK:
        out = "\\" + base
    else:
        esc = "".join(_TEX_SPECIAL.get(c, c) for c in base)
        out = esc if len(base) == 1 else r"\mathrm{" + esc + "}"
    return out + "'" * primes


def assign_names(leaves: list, root, names: dict | None = None, namespace=None) -> None:
    """Give every leaf its display name: the one naming every view uses (``_naming``):
    tensor.name, the caller's ``names``, the owning module's path, a ``namespace``
    variable, else t0, t1 ... in the graph's fixed leaf order; d, d' when shared."""
    from .._naming import name_leaves

    got = name_leaves([root], names, namespace, extra=[lf.tensor for lf in leaves])
    for leaf in leaves:
        leaf.name = got[id(leaf.tensor)]
        leaf.latex = tex_name(leaf.name)


def element_names(leaf: Leaf) -> tuple[list[str], list[str]]:
    """Symbol names ``w[i,j]`` and LaTeX ``w_{i,j}`` for every element (row-major)."""
    shape = leaf.shape
    if not shape:
        return [leaf.name], [leaf.latex]
    names, texes = [], []
    for idx in np.ndindex(*shape):
        s = ",".join(str(i) for i in idx)
        names.append(f"{leaf.name}[{s}]")
        base = leaf.latex if "'" not in leaf.latex else "{" + leaf.latex + "}"
        texes.append(f"{base}_{{{s}}}")
    return names, texes


def safe_text(name: str) -> str:
    return re.sub(r"[^\w\[\],.' -]", "?", name)


# -- symgrad graphs ---------------------------------------------------------------------
def _np_value(t) -> np.ndarray:
    return _host(t._data, t.device.type)


def _host(data, device_type: str) -> np.ndarray:
    if not isinstance(data, np.ndarray):
        from ..backends import backend_for

        data = backend_for(device_type).to_host(data)
    return np.asarray(data)


def _recorded_value(node, t) -> tuple[np.ndarray, Changed | None]:
    """The value ``t`` (an input of ``node`` that no op made) had when ``node`` was
    recorded, and how it changed since (None: unchanged). Under ``symgrad.record()`` the
    node kept the array it read (copied before any in-place write); otherwise the
    storage's write stamps say whether it was written after the node was made."""
    from ..autograd.record import written_since

    st = t._storage
    for k in getattr(node, "_kept", None) or ():
        if k.tensor is not t:
            continue
        replaced = k.storage is not st  # ``.data = ...``: the old array is intact
        if not (k.copied or replaced):
            if k.version == st.version:
                break  # unchanged
            # written without the hook (no copy was made): the array holds new values
            return _np_value(t), Changed(k.version, st.version, False)
        if k.array is None:  # written before the copy could be made (a dirty input)
            return _np_value(t), Changed(k.version, st.version, False, replaced=replaced)
        return (_host(k.array, k.storage.device_type),
                Changed(k.version, st.version, True, replaced=replaced))
    w = written_since(t, node._sequence_nr)
    if w is None:
        return _np_value(t), None
    return _np_value(t), Changed(w[0], w[1], False, exact=w[2])


def _written_after(t, node) -> bool:
    from ..autograd.record import written_since

    return hasattr(t, "_storage") and written_since(t, node._sequence_nr) is not None


def walk_symgrad(root, names=None, namespace=None) -> Graph:
    """Read the graph that produced the symgrad tensor ``root``."""
    from ..autograd.node import AccumulateGrad, OpNode

    order: list = []
    index: dict = {}
    fn = root._grad_fn
    if fn is not None:
        stack = [(fn, False)]
        seen = set()
        while stack:
            node, done = stack.pop()
            if done:
                index[node] = len(order)
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            for nxt, _ in reversed(node.next_functions):
                if nxt is not None and not isinstance(nxt, AccumulateGrad) and nxt not in seen:
                    stack.append((nxt, False))
    leaves: list[Leaf] = []
    leaf_of: dict[int, int] = {}
    freed = False
    missing: list[str] = []

    changed: dict = {}

    def leaf_ref(t, requires, node=None):
        k = leaf_of.get(id(t))
        if k is None:
            k = leaf_of[id(t)] = len(leaves)
            if node is None:
                value, change = _np_value(t), None
            else:
                value, change = _recorded_value(node, t)
            leaves.append(Leaf(k, t, value, requires))
            if change is not None:
                changed[k] = change
        return ("leaf", k)

    gnodes: list[GNode] = []
    consumer_vals: dict = {}
    for j, node in enumerate(order):
        custom = type(node)._forward_cls if is_custom(node) else None
        if not isinstance(node, OpNode) and custom is None:
            gnodes.append(GNode(j, node, node.name(), None, [], {}, [], [],
                                note="unsupported node type"))
            continue
        if getattr(node, "_freed", False):
            freed = True
        inputs = []
        refs = getattr(node, "_input_refs", ())
        spec = getattr(type(node), "_spec", None)
        if custom is not None:  # edges exist only for the tensor arguments
            positions = tuple(node._tensor_positions)
            in_names = tuple(f"arg{j}" for j in range(len(refs)))
            edges = [node.next_functions[positions.index(j)] if j in positions else (None, 0)
                     for j in range(len(refs))]
        else:
            in_names = spec.inputs
            edges = list(node.next_functions)
        for i, (nxt, nr) in enumerate(edges):
            r = refs[i] if i < len(refs) else None
            val = deref(r)
            if nxt is not None and isinstance(nxt, AccumulateGrad):
                inputs.append(leaf_ref(nxt.variable, True, node))
            elif nxt is not None:
                inputs.append(("node", index[nxt], nr))
                if val is not None and hasattr(val, "_data") and not _written_after(val, node):
                    consumer_vals.setdefault((index[nxt], nr), _np_value(val))
            elif isinstance(r, weakref.ReferenceType) or hasattr(val, "_data"):
                if val is None:
                    val = _saved_input(node, spec, in_names[i])
                if val is None:
                    missing.append(f"input '{in_names[i]}' of {node.name()}")
                    inputs.append(("missing", in_names[i]))
                else:
                    inputs.append(leaf_ref(val, bool(getattr(val, "requires_grad", False)),
                                           node))
            else:
                inputs.append(("scalar", r))
        out_meta = [m if m is not None else ((), None) for m in getattr(node, "_out_meta", ())]
        g = GNode(j, node, node.name(), spec, inputs, dict(getattr(node, "_params", {}) or {}),
                  [tuple(m[0]) for m in out_meta],
                  [np.dtype(np.float64) if m[1] is None else m[1].np for m in out_meta],
                  needs=tuple(n is not None for n, _ in edges),
                  custom=custom, input_names=tuple(in_names))
        if spec is not None:
            g.forward_numeric = _spec_forward(spec, g.params)
            g.backward = node_backward
        else:
            _fill_custom(g, node)
        gnodes.append(g)
    if missing:
        raise FreedGraphError(
            "The verifier needs values the graph no longer holds: " + ", ".join(missing)
            + " (the tensors were deleted and the backward never saved them). " + FREED_HINT)
    if fn is None:
        root_ref = leaf_ref(root, bool(root.requires_grad))
    else:
        root_ref = ("node", index[fn], root._output_nr)
    stale_root = fn is not None and _written_after(root, fn)
    graph = Graph("symgrad", gnodes, leaves, root_ref, _np_value(root), root_tensor=root,
                  freed=freed, changed=changed)
    graph._values.update(consumer_vals)
    if fn is not None and not stale_root:
        graph._values[(index[fn], root._output_nr)] = _np_value(root)
    elif stale_root:  # written under no_grad since: the recorded value is replayed
        graph.root_value = np.asarray(graph.value_of(root_ref))
    assign_names(leaves, root, names, namespace)
    graph.engine_grads = _symgrad_engine_grads  # called as f(graph, ...): no cycles
    graph.engine_hvp = _symgrad_engine_hvp
    return graph


def _saved_input(node, spec, name):
    saved = getattr(node, "_saved", None)
    if not saved or spec is None:
        return None
    s = saved.get(name)
    return getattr(s, "tensor", None)


def _spec_forward(spec, params):
    def fwd(be, arrays):
        out = spec.forward(be, *arrays, **params)
        return tuple(out) if len(spec.outputs) != 1 else (out,)  # (): variadic outputs

    return fwd


def node_backward(graph: Graph, g: GNode, grads: list) -> list:
    """The node's own numeric backward, reduced to input shapes as the engine does.

    A plain function (no closure over ``g``), so graphs and reports hold no cycles.
    """
    from .. import tensor as _tensor
    from ..autograd.grad_mode import no_grad

    node = g.node
    if getattr(node, "_freed", False):
        node = _rebuild(graph, g)
    from ..autograd import engine

    gts = [None if v is None else _tensor(np.asarray(v)) for v in grads]
    with no_grad():
        outs = node.apply(gts, g.needs)
        fitted = list(outs)
        try:  # the engine's own reduction/cast step, checked by glue.check_fit
            engine._fit_to_inputs(node, fitted)
        except Exception as exc:  # noqa: BLE001  (a broken glue step is a finding)
            fitted = exc
    g.glue = (list(outs), fitted)
    return _finish(graph, g, outs)


def _finish(graph, g, outs):
    res = []
    for i, o in enumerate(outs):
        if o is None or i >= len(g.inputs) or not g.needs[i]:
            res.append(None)
            continue
        shape = np.shape(graph.value_of(g.inputs[i])) if g.inputs[i][0] != "scalar" else ()
        if tuple(o.shape) != tuple(shape):
            o = o.sum_to_size(shape)
        res.append(np.asarray(o.detach().numpy(), dtype=np.float64))
    return res


def _rebuild(graph: Graph, g: GNode):
    """A fresh node for a freed one: re-apply the op to the recorded inputs."""
    from .. import tensor as _tensor
    from ..autograd.function import apply
    from ..autograd.grad_mode import enable_grad

    ins = []
    for i, (r, v) in enumerate(zip(g.inputs, graph.node_inputs(g))):
        if r[0] == "scalar":
            ins.append(v)
        else:
            t = _tensor(np.array(v))
            if g.needs[i] and t.dtype.is_floating_point:
                t.requires_grad_(True)
            ins.append(t)
    with enable_grad():
        out = apply(g.spec, ins, dict(g.params))
    out = out[0] if isinstance(out, tuple) else out
    g.note = "graph was freed: node rebuilt from the recorded inputs"
    return out.grad_fn


# -- custom Function nodes (the rest of their support is custom.py) -----------------------
def is_custom(node) -> bool:
    return getattr(type(node), "_forward_cls", None) is not None and hasattr(
        node, "_tensor_positions")


def _tensor_cls():
    from ..tensor import Tensor

    return Tensor


def fill_custom(g, node) -> None:
    """Set the replay and backward callables of a custom Function node."""
    cls = type(node)._forward_cls
    positions = tuple(node._tensor_positions)
    g.custom = cls
    from .trace import forward_arg_names

    g.input_names = forward_arg_names(cls, len(g.inputs))

    def forward_numeric(be, arrays):
        from ..autograd.grad_mode import no_grad
        from ..tensor import tensor

        if be.name != "numpy":
            raise NotImplementedError
        args = [tensor(np.asarray(a)) if j in positions else a for j, a in enumerate(arrays)]
        with no_grad():
            out = cls.apply(*args)
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(np.asarray(o.detach().numpy()) if isinstance(o, _tensor_cls()) else o
                     for o in outs)

    g.forward_numeric = forward_numeric
    g.backward = custom_backward


def custom_backward(graph, g, grads):
    """The Function's own backward on numeric grads, mapped back to its arguments."""
    from ..autograd.grad_mode import no_grad
    from ..tensor import tensor

    n = g.node
    positions = tuple(n._tensor_positions)
    if getattr(n, "_freed", False):
        n = _rebuild_custom(graph, g, g.custom, positions)
    gts = [None if v is None else tensor(np.asarray(v)) for v in grads]
    mask = tuple(g.needs[j] for j in positions)
    with no_grad():
        outs = n.apply(gts, mask)
    per_arg = [None] * len(g.inputs)
    for i, j in enumerate(positions):
        per_arg[j] = outs[i] if i < len(outs) else None
    return _finish(graph, g, per_arg)


def _rebuild_custom(graph, g, cls, positions):
    from ..autograd.grad_mode import enable_grad
    from ..tensor import tensor

    args = []
    for j, v in enumerate(graph.node_inputs(g)):
        if j in positions:
            t = tensor(np.array(v))
            if g.needs[j]:
                t.requires_grad_(True)
            args.append(t)
        else:
            args.append(v)
    with enable_grad():
        out = cls.apply(*args)
    out = out[0] if isinstance(out, tuple) else out
    g.note = "graph was freed: node rebuilt from the recorded inputs"
    return out.grad_fn


def _fill_custom(g: GNode, node) -> None:
    fill_custom(g, node)


def _retained_state(graph):
    saved = []
    for g in graph.nodes:
        ret = getattr(g.node, "_retained", None)
        if ret:
            for ref in ret.values():
                t = ref()
                if t is not None:
                    saved.append((t, t._grad))
    return saved


def _symgrad_engine_grads(graph: Graph, gradient):
    """The engine's gradients of the leaves requiring grad, leaving ``.grad`` untouched."""
    from .. import autograd
    from .. import tensor as _tensor

    leaves = [lf for lf in graph.leaves if lf.requires_grad and lf.is_float]
    if not leaves:
        return {}
    root = graph.root_tensor
    if graph.freed:
        out = {}
        for lf in leaves:
            gr = lf.tensor.grad
            if gr is None:
                raise FreedGraphError("The graph was freed by backward() and the engine's "
                                      f"gradient of '{lf.name}' is not in its .grad. "
                                      + FREED_HINT)
            out[lf.index] = _np_value(gr).astype(np.float64)
        graph.notes.append("graph was freed: engine gradients read from the leaves' .grad "
                           "(from the user's backward)")
        return out
    kept = _retained_state(graph)
    try:
        g = _tensor(np.asarray(gradient, dtype=root.dtype.np))
        res = autograd.grad([root], [lf.tensor for lf in leaves], [g], retain_graph=True,
                            allow_unused=True)
    finally:
        for t, old in kept:
            t._grad = old
    out = {}
    for lf, r in zip(leaves, res):
        out[lf.index] = (np.zeros(lf.shape) if r is None
                         else _np_value(r).astype(np.float64))
    return out


def _symgrad_engine_hvp(graph: Graph, gradient, us: dict):
    """Hessian-vector products from a create_graph=True backward (double backward)."""
    from .. import autograd
    from .. import tensor as _tensor

    leaves = [lf for lf in graph.leaves if lf.requires_grad and lf.is_float]
    root = graph.root_tensor
    if graph.freed:
        raise FreedGraphError("order=2 needs the live graph. " + FREED_HINT)
    kept = _retained_state(graph)
    try:
        g = _tensor(np.asarray(gradient, dtype=root.dtype.np))
        grads = autograd.grad([root], [lf.tensor for lf in leaves], [g], retain_graph=True,
                              create_graph=True, allow_unused=True)
        s = None
        for lf, gr in zip(leaves, grads):
            if gr is None or gr.grad_fn is None:
                continue
            term = (gr * _tensor(np.asarray(us[lf.index], dtype=gr.dtype.np))).sum()
            s = term if s is None else s + term
        if s is None:
            return {lf.index: np.zeros(lf.shape) for lf in leaves}
        res = autograd.grad([s], [lf.tensor for lf in leaves], retain_graph=True,
                            allow_unused=True)  # the user's graph stays usable
    finally:
        for t, old in kept:
            t._grad = old
    return {lf.index: (np.zeros(lf.shape) if r is None else _np_value(r).astype(np.float64))
            for lf, r in zip(leaves, res)}
