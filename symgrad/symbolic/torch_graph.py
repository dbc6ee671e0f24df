"""PyTorch graphs in the verifier: torch's grad_fn chain read into the same ``Graph``.

Each torch node is matched by its grad_fn name to the op in symgrad's registry with that
name; its parameters come from torch's ``_saved_*`` attributes (or, for view/expand, the
shape its consumers saw). Input values come from the leaves (``AccumulateGrad.variable``),
from what torch saved, or by replaying the forward. PyTorch keeps no value for operands it
did not need (``a + b`` with b not requiring grad, ``2 - a``): such a value is an error
that names it and points to ``symgrad.capture_torch()``, a ``TorchFunctionMode`` that
records every forward call with its values so any supported torch graph verifies.
"""

from __future__ import annotations

import collections
import inspect

import numpy as np

from .graph import FreedGraphError, GNode, Graph, Leaf, _spec_forward, assign_names

__all__ = ["walk_torch", "capture_torch"]

#: grad_fn names shared by several registry ops: the one a torch node means.
_PREFER = {"ToCopyBackward0": "to_copy", "SqueezeBackward1": "squeeze",
           "SumBackward0": "sum", "SumBackward1": "sum_dim", "MeanBackward0": "mean",
           "MeanBackward1": "mean_dim", "ClampBackward1": "clamp"}

#: The most recent captures (strong: the recorded values outlive the ``with`` block).
_CAPTURES: collections.deque = collections.deque(maxlen=16)


#: torch nodes over a list of tensors: one next_function per tensor, so one registry spec
#: per number of tensors (ops/shape.py ``list_spec``)
_LIST_OPS = {"CatBackward0": "cat", "StackBackward0": "stack"}


def _spec_for(name, node=None):
    from ..ops import OPS

    if name in _LIST_OPS and node is not None:
        from ..ops.shape import list_spec

        return list_spec(_LIST_OPS[name], len(node.next_functions))
    pref = _PREFER.get(name)
    if pref is not None and pref in OPS:
        return OPS[pref]
    for spec in OPS.values():
        if spec.grad_fn == name:
            return spec
    return None


def _np(t):
    return np.asarray(t.detach().cpu().numpy())


def _plain(v):
    import torch

    if isinstance(v, torch.Size):
        return tuple(int(s) for s in v)
    if isinstance(v, (list, tuple)):
        return tuple(_plain(u) for u in v)
    return v


class _Capture:
    """The state of one ``capture_torch()``: forward calls by the grad_fn they made."""

    def __init__(self) -> None:
        self.calls: dict = {}  # id(grad_fn) -> (grad_fn, args, kwargs) with values
        self.mode = None
        #: the innermost torch nn.Module call running, as symgrad's own nodes record it
        #: (autograd/node.py ``_ModuleCalls``): (weakref to the module, enclosing entry)
        self.module_top = None
        self.module_calls: dict = {}  # id(grad_fn) -> (grad_fn, the entry it was made in)

    def record(self, out, args, kwargs) -> None:
        import torch

        outs = out if isinstance(out, (tuple, list)) else (out,)
        for o in outs:
            if isinstance(o, torch.Tensor) and o.grad_fn is not None:
                fn = o.grad_fn
                snap = tuple(_snap(a) for a in args)
                self.calls[id(fn)] = (fn, snap, {k: _snap(v) for k, v in kwargs.items()})
                if id(fn) not in self.module_calls:  # None: made outside any module
                    self.module_calls[id(fn)] = (fn, self.module_top)

    def module_hooks(self) -> tuple:
        """Global torch module hooks that keep ``module_top`` (removed on exit)."""
        import weakref

        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        def pre(module, args):
            self.module_top = (weakref.ref(module), self.module_top)

        def post(module, args, out):
            if self.module_top is not None:
                self.module_top = self.module_top[1]

        return (register_module_forward_pre_hook(pre),
                register_module_forward_hook(post, always_call=True))

    def lookup(self, fn):
        hit = self.calls.get(id(fn))
        return hit if hit is not None and hit[0] is fn else None


def _snap(a):
    import torch

    if isinstance(a, torch.Tensor):
        return ("tensor", _np(a), a)
    if isinstance(a, (list, tuple)):
        return ("seq", tuple(_snap(u) for u in a))
    return ("value", a)


def capture_torch():
    """``with symgrad.capture_torch():`` records torch forwards (values included)."""
    import torch
    from torch.overrides import TorchFunctionMode

    cap = _Capture()

    class _Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if torch.is_grad_enabled():
                cap.record(out, args, kwargs)
            return out

    class _Ctx:
        def __enter__(self_):
            cap.mode = _Mode()
            cap.mode.__enter__()
            _CAPTURES.append(cap)
            _wrap_function_apply(cap)
            self_.hooks = cap.module_hooks()
            self_.capture = cap
            return self_

        def __exit__(self_, *exc):
            for handle in self_.hooks:
                handle.remove()
            cap.module_top = None
            _unwrap_function_apply(cap)
            cap.mode.__exit__(*exc)

    return _Ctx()


_APPLY_STACK: list = []  # (capture, the apply it replaced)


def _wrap_function_apply(cap) -> None:
    """``torch.autograd.Function.apply`` records its arguments while ``cap`` is active
    (a TorchFunctionMode does not see ``apply`` itself, only the calls inside forward)."""
    from torch.autograd import Function

    old = Function.__dict__["apply"]
    inner = old.__func__ if isinstance(old, classmethod) else old

    def apply(cls, *args, **kwargs):
        import torch

        out = inner(cls, *args, **kwargs)
        if torch.is_grad_enabled():
            if kwargs:  # bind keyword arguments to forward's positions
                try:
                    args = _bind_forward(cls, args, kwargs)
                    kwargs = {}
                except TypeError:
                    pass
            cap.record(out, args, kwargs)
        return out

    _APPLY_STACK.append((cap, old))
    Function.apply = classmethod(apply)


def _unwrap_function_apply(cap) -> None:
    from torch.autograd import Function

    for k in range(len(_APPLY_STACK) - 1, -1, -1):
        if _APPLY_STACK[k][0] is cap:
            old = _APPLY_STACK[k][1]
            if k == len(_APPLY_STACK) - 1:
                Function.apply = old
            else:  # an inner capture exits after an outer one: re-chain
                _APPLY_STACK[k + 1] = (_APPLY_STACK[k + 1][0], old)
            del _APPLY_STACK[k]
            return


def _bind_forward(cls, args, kwargs):
    from .trace import _setup_context_style

    sig = inspect.signature(cls.forward)
    params = list(sig.parameters.values())
    if not _setup_context_style(cls):
        params = params[1:]
    sig = sig.replace(parameters=params)
    b = sig.bind(*args, **kwargs)
    b.apply_defaults()
    return tuple(b.args)


def _captured(fn):
    for cap in reversed(_CAPTURES):
        hit = cap.lookup(fn)
        if hit is not None:
            return hit
    return None


def captured_module_call(fn):
    """``(seen, entry)``: whether ``capture_torch()`` saw ``fn`` made, and the torch
    nn.Module call entry it was made in (None outside any). Torch's own nodes carry no
    module: only a capture records it."""
    for cap in reversed(_CAPTURES):
        hit = cap.module_calls.get(id(fn))
        if hit is not None and hit[0] is fn:
            return True, hit[1]
    return False, None


def _forward_params(spec):
    sig = inspect.signature(spec.forward)
    ps = list(sig.parameters.values())
    star = [k for k, q in enumerate(ps) if q.kind is inspect.Parameter.VAR_POSITIONAL]
    names = [q.name for q in ps[star[0] + 1:]] if star else \
        [q.name for q in ps[1 + len(spec.inputs):]]  # (be, *tensors, dim) or (be, a, b, p)
    return [(n, sig.parameters[n].default) for n in names]


def walk_torch(root, names=None, namespace=None) -> Graph:
    """Read torch's graph behind ``root`` (a torch tensor)."""
    import torch

    fn = root.grad_fn
    order, index = [], {}
    if fn is not None:
        stack, seen = [(fn, False)], set()
        while stack:
            node, done = stack.pop()
            if done:
                index[id(node)] = len(order)
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            for nxt, _ in reversed(node.next_functions):
                if nxt is not None and type(nxt).__name__ != "AccumulateGrad" and \
                        id(nxt) not in seen:
                    stack.append((nxt, False))
    # shapes of each node's output, as its consumers saw them
    out_shape: dict = {}
    if fn is not None:
        out_shape[id(fn)] = tuple(root.shape)
    for node in order:  # torch keeps each node's output metadata (the grads it receives)
        meta = getattr(node, "_input_metadata", None)
        if meta:
            out_shape[id(node)] = tuple(int(s) for s in meta[0].shape)
    for node in order:
        spec = None if _custom_cls(node) is not None or node.name() in _FUSED_MEANINGS \
            else _spec_for(node.name(), node)
        for i, (nxt, _) in enumerate(node.next_functions):
            if nxt is None or spec is None or i >= len(spec.inputs):
                continue
            nm = spec.inputs[i]
            sizes = getattr(node, f"_saved_{nm}_sym_sizes", None)
            if sizes is None:
                t = getattr(node, f"_saved_{nm}", None)
                sizes = tuple(t.shape) if isinstance(t, torch.Tensor) else None
            if sizes is not None:
                out_shape.setdefault(id(nxt), _plain(sizes))
    # each node's output as torch kept it (its saved result, or a consumer's saved input):
    # a constant operand of add/sub, which keep none, is solved from it
    kept = _kept_outputs(order, out_shape) if any(
        n.name() in _RECOVERABLE for n in order) else {}
    leaves: list[Leaf] = []
    leaf_of: dict = {}
    recovered: list = []  # (leaf index, node index, input index): filled from the output
    cat_sizes: list = []  # cat nodes whose ``_sizes`` the replay gives

    def leaf_ref(t, requires):
        k = leaf_of.get(id(t))
        if k is None:
            k = leaf_of[id(t)] = len(leaves)
            leaves.append(Leaf(k, t, _np(t), requires))
        return ("leaf", k)

    missing, gnodes = [], []
    for j, node in enumerate(order):
        name = node.name()
        if _custom_cls(node) is not None:
            gnodes.append(_custom_gnode(j, node, index, leaf_ref, missing))
            continue
        if name in _FUSED_MEANINGS:
            gnodes.append(_fused_gnode(j, node, index, leaf_ref, missing))
            continue
        spec = _spec_for(name, node)
        listed = name in _LIST_OPS  # captured as (tensors, dim): the tensors are one argument
        if spec is None:
            raise NotImplementedError(
                f"unknown torch node {name}: symgrad's op registry has no op with this "
                "grad_fn name, so the verifier cannot give it a SymPy meaning")
        cap = _captured(node)
        inputs = []
        for i, (nxt, nr) in enumerate(node.next_functions):
            nm = spec.inputs[i] if i < len(spec.inputs) else f"input{i}"
            if nxt is not None and type(nxt).__name__ == "AccumulateGrad":
                inputs.append(leaf_ref(nxt.variable, True))
            elif nxt is not None:
                if id(nxt) not in index:
                    missing.append(f"input '{nm}' of {name} (from {nxt.name()})")
                    inputs.append(("missing", nm))
                else:
                    inputs.append(("node", index[id(nxt)], nr))
            else:
                val = None
                try:
                    val = getattr(node, f"_saved_{nm}", None)
                except RuntimeError as exc:
                    raise FreedGraphError(f"{exc} (torch graph: use retain_graph=True or "
                                          "verify before backward)") from None
                if val is None and cap is not None:
                    val = _cap_arg(cap, i, listed)
                if isinstance(val, torch.Tensor):
                    if val.dim() == 0 and not val.requires_grad and cap is None:
                        inputs.append(("scalar", val.item()))  # a wrapped Python number
                    else:
                        inputs.append(leaf_ref(val, False))
                elif val is not None:
                    inputs.append(("scalar", val))
                elif name in _RECOVERABLE and id(node) in kept and i < 2:
                    out = kept[id(node)]
                    k = len(leaves)  # its value: from the output, once the graph replays
                    leaves.append(Leaf(k, out, _np(out), False))
                    recovered.append((k, j, i))
                    inputs.append(("leaf", k))
                else:
                    missing.append(f"input '{nm}' of {name}")
                    inputs.append(("missing", nm))
        params = {}
        extra = [] if cap is None else list(cap[1][1:]) if listed else \
            list(cap[1][len(spec.inputs):])
        for k, (p, default) in enumerate(_forward_params(spec)):
            if hasattr(node, f"_saved_{p}"):
                params[p] = _plain(getattr(node, f"_saved_{p}"))
            elif p == "size" and id(node) in out_shape:
                params[p] = out_shape[id(node)]
            elif cap is not None and p in cap[2]:
                params[p] = _unsnap(cap[2][p])
            elif k < len(extra):  # a positional argument of the captured call (2 - a)
                params[p] = _unsnap(extra[k])
            elif p == "_sizes" and listed:  # cat: each input's size, once they are replayed
                params[p] = None
                cat_sizes.append(j)
            elif default is inspect.Parameter.empty:
                missing.append(f"parameter '{p}' of {name}")
        n_out = max(1, spec.differentiable_outputs)
        g = GNode(j, node, name, spec, inputs, params, [], [],
                  needs=tuple(n is not None for n, _ in node.next_functions),
                  input_names=tuple(spec.inputs))
        g.forward_numeric = _spec_forward(spec, params)
        g.backward = _torch_backward
        g.out_shapes = [out_shape.get(id(node), None)] * n_out
        gnodes.append(g)
    if missing:
        raise FreedGraphError(
            "PyTorch did not keep the values the verifier needs: " + ", ".join(missing)
            + ". Record the forward under `with symgrad.capture_torch():` (a "
            "TorchFunctionMode that keeps every forward value), then verify.")
    graph = Graph("torch", gnodes, leaves, ("leaf", 0) if fn is None else
                  ("node", index[id(fn)], 0), _np(root), root_tensor=root)
    if fn is None:
        graph.root = leaf_ref(root, root.requires_grad)
    for k, j, i in recovered:
        _recover_operand(graph, k, gnodes[j], i, kept)
    for j in cat_sizes:  # in node order: a cat's inputs replay without it
        g = gnodes[j]
        g.params["dim"], g.params["_sizes"] = _cat_sizes(
            [np.shape(graph.value_of(r)) for r in g.inputs], g.params["dim"])
    # output shapes and dtypes by replaying (cheap: the graph is replayed once here)
    for g in gnodes:
        if g.spec is None:
            if g.custom is not None:
                g.out_shapes = [tuple(np.shape(graph.value_of(("node", g.index, nr))))
                                for nr in range(len(g.out_shapes))]
            continue
        v = graph.value_of(("node", g.index, 0)) if g.out_dtypes else None
        if v is None:
            g.out_dtypes = [np.asarray(_first_float(graph, g)).dtype]
            v = graph.value_of(("node", g.index, 0))
        g.out_shapes = [tuple(np.shape(v))]
        if g.spec.variadic_outputs:  # SplitBackward0 ...: the replay made every piece
            n = 1 + max(nr for j, nr in graph._values if j == g.index)
            g.out_shapes = [tuple(np.shape(graph.value_of(("node", g.index, nr))))
                            for nr in range(n)]
            g.out_dtypes = g.out_dtypes[:1] * n
    assign_names(leaves, root, names, namespace)
    graph.engine_grads = _torch_engine_grads
    graph.engine_hvp = _torch_engine_hvp
    return graph


#: nodes that keep no operand (only alpha): a constant operand torch did not keep is
#: recovered from the node's output where a consumer saved it. Composite torch ops (GRUCell's
#: ``(hx - newgate) * updategate + newgate``) make such nodes inside C++, out of
#: ``capture_torch()``'s sight, so capturing cannot supply the operand there.
_RECOVERABLE = ("AddBackward0", "SubBackward0")


def _kept_outputs(order, out_shape) -> dict:
    """id(node) -> its output (output 0) as torch saved it, where it did."""
    import torch

    kept: dict = {}

    def keep(node, t):
        shape = out_shape.get(id(node))
        if isinstance(t, torch.Tensor) and id(node) not in kept and \
                (shape is None or tuple(t.shape) == shape):
            kept[id(node)] = t

    for node in order:
        custom = _custom_cls(node) is not None
        spec = None if custom else _spec_for(node.name(), node)
        try:
            if not custom and hasattr(node, "_saved_result"):
                keep(node, node._saved_result)
            for i, (nxt, nr) in enumerate(node.next_functions):
                if nxt is not None and nr == 0 and spec is not None and i < len(spec.inputs) \
                        and id(nxt) not in kept:
                    keep(nxt, getattr(node, f"_saved_{spec.inputs[i]}", None))
        except RuntimeError:  # freed, or modified in place since: not kept
            continue
    return kept


def _recover_operand(graph, k, g, i, kept) -> None:
    """Leaf ``k``, operand ``i`` of ``out = self ± alpha * other``, solved from ``out`` (the
    leaf's placeholder value) and the other operand's value (as torch kept it, else
    replayed), in the output's dtype: exact where the forward's sum was (zeros, as a default
    hidden state is), else within one rounding of the original."""
    import torch

    leaf = graph.leaves[k]
    out = leaf.value
    ref = g.inputs[1 - i]
    node = graph.nodes[ref[1]].node if ref[0] == "node" and ref[2] == 0 else None
    other = _np(kept[id(node)]) if node is not None and id(node) in kept else \
        np.asarray(graph.value_of(ref))
    alpha = g.params.get("alpha", 1)
    sign = 1 if g.name == "AddBackward0" else -1
    with np.errstate(all="ignore"):
        if i == 0:  # self = out - sign * alpha * other
            v = out - sign * (other if alpha == 1 else other * alpha)
        else:  # other = sign * (out - self) / alpha
            v = sign * (out - other)
            if alpha != 1:
                v = v / alpha
    v = np.asarray(v, dtype=out.dtype)
    leaf.value = v
    leaf.tensor = torch.from_numpy(v.copy())


class _FlashAttentionForCpu:
    """The meaning of torch's fused CPU attention node (ScaledDotProductFlashAttentionForCpu
    Backward0, what ``scaled_dot_product_attention`` and MultiheadAttention's
    ``need_weights=False`` record on CPU): symgrad's op of the same node
    (symgrad/ops/attention.py, whose forward on the SymPy backend is its meaning) with the
    node's saved mask, causality and scale, traced on symbols like a custom Function's
    forward. Only the attention output is differentiable (torch's logsumexp is not), so the
    node has one output; its backward is torch's own node."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale):
        from .. import creation
        from ..autograd.function import apply
        from ..ops import OPS
        from ..ops.attention import FLASH_CPU

        if dropout_p:
            raise NotImplementedError("the verifier cannot give dropout a meaning")
        mask = None if attn_mask is None else creation.tensor(
            np.asarray(attn_mask), dtype=query.dtype, device=query.device)
        return apply(OPS[FLASH_CPU], (query, key, value),
                     {"attn_mask": mask, "dropout_p": 0.0, "is_causal": bool(is_causal),
                      "scale": None if scale is None else float(scale)})[0]

    @classmethod
    def apply(cls, *args):
        return cls.forward(None, *args)


#: torch nodes of fused kernels with no registry op: the composite that gives their meaning.
_FUSED_MEANINGS = {"ScaledDotProductFlashAttentionForCpuBackward0": _FlashAttentionForCpu}
_FUSED_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def _fused_gnode(j, node, index, leaf_ref, missing):
    """A fused torch node read as a custom-Function node: q, k, v from its edges, the rest
    from what torch saved; replayed by the aten kernel, differentiated by the node itself."""
    import torch

    name = node.name()
    inputs = []
    for k, (nxt, nr) in enumerate(node.next_functions):
        if nxt is not None and type(nxt).__name__ == "AccumulateGrad":
            inputs.append(leaf_ref(nxt.variable, True))
        elif nxt is not None and id(nxt) in index:
            inputs.append(("node", index[id(nxt)], nr))
        else:  # a query/key/value that needs no gradient: torch saved it
            try:
                t = getattr(node, f"_saved_{_FUSED_ARGS[k]}")
            except RuntimeError as exc:
                raise FreedGraphError(f"{exc} (torch graph: use retain_graph=True or "
                                      "verify before backward)") from None
            inputs.append(leaf_ref(t, False))
    mask = node._saved_attn_mask
    inputs.append(("scalar", None if mask is None else _np(mask)))
    inputs += [("scalar", node._saved_dropout_p), ("scalar", bool(node._saved_is_causal)),
               ("scalar", node._saved_scale)]
    meta = list(node._input_metadata)
    needs = tuple(n is not None for n, _ in node.next_functions) + (False,) * 4
    g = GNode(j, node, name, None, inputs, {}, [tuple(int(s) for s in m.shape) for m in meta],
              [_torch_np_dtype(m.dtype) for m in meta], needs=needs,
              custom=_FUSED_MEANINGS[name], input_names=_FUSED_ARGS)
    g.torch_positions = (0, 1, 2)

    def forward_numeric(be, arrays):
        if be.name != "numpy":
            raise NotImplementedError
        q, k, v = (torch.from_numpy(np.array(a)) for a in arrays[:3])
        m = None if arrays[3] is None else torch.from_numpy(np.array(arrays[3]))
        with torch.no_grad():
            out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, float(arrays[4]), bool(arrays[5]), attn_mask=m, scale=arrays[6])
        return (_np(out[0]),)

    g.forward_numeric = forward_numeric
    g.backward = _torch_backward
    return g


def _custom_cls(node):
    """The ``torch.autograd.Function`` class behind a node (its ``BackwardCFunction``)."""
    return getattr(type(node), "_forward_cls", None)


def _torch_np_dtype(dt):
    import torch

    return torch.empty(0, dtype=dt).numpy().dtype


def _custom_gnode(j, node, index, leaf_ref, missing):
    """A ``torch.autograd.Function`` node: its forward's arguments (tensor arguments from
    the graph's edges, the rest from ``capture_torch``), replayed and differentiated through
    the Function itself; its meaning is its forward traced on symbols (symbolic/custom.py)."""
    import torch

    from .trace import forward_arg_names

    cls = _custom_cls(node)
    name = node.name()
    needs = tuple(bool(b) for b in node.needs_input_grad)
    n_args = len(needs)
    edges = list(node.next_functions)
    arg_names = forward_arg_names(cls, n_args)
    cap = _captured(node)
    inputs = []
    if cap is not None and len(cap[1]) == n_args:
        snaps = cap[1]
        t_pos = [k for k, a in enumerate(snaps) if a[0] == "tensor"]
    elif len(edges) == n_args:  # every argument is a tensor: the edges say where from
        snaps, t_pos = None, list(range(n_args))
    else:
        snaps, t_pos = None, None
        missing.append(f"the arguments of {name} (a torch.autograd.Function with "
                       f"{n_args - len(edges)} non-tensor argument(s): torch keeps no "
                       "record of them)")
    if t_pos is not None and len(t_pos) != len(edges):
        missing.append(f"the arguments of {name} (captured {len(t_pos)} tensor arguments, "
                       f"the graph has {len(edges)})")
        t_pos = None
    positions = ()
    if t_pos is not None:
        positions = tuple(t_pos)
        for k in range(n_args):
            if k not in positions:
                inputs.append(("scalar", _unsnap(snaps[k])))
                continue
            nxt, nr = edges[positions.index(k)]
            if nxt is not None and type(nxt).__name__ == "AccumulateGrad":
                inputs.append(leaf_ref(nxt.variable, True))
            elif nxt is not None:
                if id(nxt) not in index:
                    missing.append(f"input '{arg_names[k]}' of {name} (from {nxt.name()})")
                    inputs.append(("missing", arg_names[k]))
                else:
                    inputs.append(("node", index[id(nxt)], nr))
            elif snaps is not None:  # a tensor that does not require grad: as captured
                t = snaps[k][2]
                if not isinstance(t, torch.Tensor) or not np.array_equal(
                        _np(t), snaps[k][1], equal_nan=snaps[k][1].dtype.kind == "f"):
                    t = _unsnap(snaps[k])
                inputs.append(leaf_ref(t, False))
            else:
                missing.append(f"input '{arg_names[k]}' of {name} (a tensor that does not "
                               "require grad: torch keeps no reference to it)")
                inputs.append(("missing", arg_names[k]))
    meta = list(getattr(node, "_input_metadata", ()) or ())
    g = GNode(j, node, name, None, inputs, {},
              [tuple(int(s) for s in m.shape) for m in meta] or [()],
              [_torch_np_dtype(m.dtype) for m in meta] or [np.dtype(np.float64)],
              needs=needs, custom=cls, input_names=arg_names)
    g.torch_positions = positions

    def forward_numeric(be, arrays):
        if be.name != "numpy":
            raise NotImplementedError
        args = [torch.from_numpy(np.array(a)) if k in positions else a
                for k, a in enumerate(arrays)]
        with torch.no_grad():
            out = cls.apply(*args)
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(_np(o) if isinstance(o, torch.Tensor) else o for o in outs)

    g.forward_numeric = forward_numeric
    g.backward = _torch_custom_backward
    return g


def _torch_custom_backward(graph, g, grads):
    """The Function's own backward (``ctx`` is the node) on numeric grads; each gradient
    reduced to its input's shape where torch's engine would (it must expand to it)."""
    import torch

    from ._common import _sum_to

    gts = []
    for k, v in enumerate(grads):
        if v is None:
            v = np.zeros(g.out_shapes[k], dtype=g.out_dtypes[k])
        gts.append(torch.from_numpy(np.ascontiguousarray(v)))
    try:
        with torch.no_grad():
            outs = g.node.apply(*gts)
    except RuntimeError as exc:
        if "freed" in str(exc) or "second time" in str(exc):
            raise FreedGraphError(f"{exc} (torch graph: use retain_graph=True or verify "
                                  "before backward)") from None
        raise
    outs = outs if isinstance(outs, tuple) else (outs,)
    res = []
    for k, r in enumerate(g.inputs):
        o = outs[k] if k < len(outs) else None
        if o is None or not g.needs[k] or r[0] == "scalar":
            res.append(None)
            continue
        o = _np(o).astype(np.float64) if isinstance(o, torch.Tensor) else \
            np.asarray(o, dtype=np.float64)
        shape = np.shape(graph.value_of(r))
        if o.shape != shape:
            try:
                np.broadcast_shapes(o.shape, shape)
                if len(o.shape) >= len(shape) and np.broadcast_shapes(o.shape, shape) == \
                        o.shape:
                    o = _sum_to(o, shape)
            except ValueError:
                pass
        res.append(o)
    return res


def _first_float(graph, g):
    for r in g.inputs:
        if r[0] in ("leaf", "node"):
            v = graph.value_of(r)
            if np.asarray(v).dtype.kind == "f":
                return v
    return np.zeros((), dtype=np.float32)


def _cap_arg(cap, i, listed=False):
    _, args, _ = cap
    if listed:  # cat/stack: input i is tensor i of the captured list
        seq = args[0] if args else None
        return _unsnap(seq[1][i]) if seq and seq[0] == "seq" and i < len(seq[1]) else None
    return _unsnap(args[i]) if i < len(args) else None


def _cat_sizes(shapes, dim) -> tuple:
    """``(dim, _sizes)`` of torch.cat as symgrad's cat takes them (functional.cat): ``dim``
    counted from the front (torch saves -1 as 2**64 - 1), each input's size along it, None
    for a 1-D empty input that cat skips (when another input is kept)."""
    from ..ops._ints import norm

    kept = [sh for sh in shapes if tuple(sh) != (0,)]
    ref = kept[0] if kept else shapes[0]
    d = norm(int(dim), len(ref))
    return d, tuple(None if (tuple(sh) == (0,) and kept) else int(sh[d]) for sh in shapes)


def _unsnap(s):
    kind = s[0]
    if kind == "tensor":
        import torch

        return torch.from_numpy(np.array(s[1]))
    if kind == "seq":
        return tuple(_unsnap(u) for u in s[1])
    return s[1]


def _torch_backward(graph, g, grads):
    import torch

    from ._common import _sum_to

    gts = [torch.from_numpy(np.ascontiguousarray(v)) for v in grads]
    outs = g.node(*gts)
    outs = outs if isinstance(outs, tuple) else (outs,)
    res = []
    for i, o in enumerate(outs):
        if o is None or not g.needs[i] or g.inputs[i][0] == "scalar":
            res.append(None)
            continue
        shape = np.shape(graph.value_of(g.inputs[i]))
        res.append(_sum_to(_np(o).astype(np.float64), shape))
    return res


def _torch_engine_grads(graph, gradient):
    import torch

    leaves = [lf for lf in graph.leaves if lf.requires_grad and lf.is_float]
    if not leaves:
        return {}
    root = graph.root_tensor
    g = torch.as_tensor(np.asarray(gradient), dtype=root.dtype)
    try:
        res = torch.autograd.grad([root], [lf.tensor for lf in leaves], [g], retain_graph=True,
                                  allow_unused=True)
    except RuntimeError as exc:
        if "second time" in str(exc) or "freed" in str(exc):
            raise FreedGraphError("PyTorch freed this graph in an earlier backward(); verify "
                                  "before backward() or call backward(retain_graph=True)"
                                  ) from None
        raise
    return {lf.index: (np.zeros(lf.shape) if r is None else _np(r).astype(np.float64))
            for lf, r in zip(leaves, res)}


def _torch_engine_hvp(graph, gradient, us):
    import torch

    leaves = [lf for lf in graph.leaves if lf.requires_grad and lf.is_float]
    root = graph.root_tensor
    g = torch.as_tensor(np.asarray(gradient), dtype=root.dtype)
    grads = torch.autograd.grad([root], [lf.tensor for lf in leaves], [g], retain_graph=True,
                                create_graph=True, allow_unused=True)
    s = sum(((gr * torch.as_tensor(us[lf.index], dtype=gr.dtype)).sum()
             for lf, gr in zip(leaves, grads) if gr is not None and gr.requires_grad),
            torch.zeros((), dtype=root.dtype))
    res = torch.autograd.grad([s], [lf.tensor for lf in leaves], retain_graph=True,
                              allow_unused=True) if s.requires_grad else [None] * len(leaves)
    return {lf.index: (np.zeros(lf.shape) if r is None else _np(r).astype(np.float64))
            for lf, r in zip(leaves, res)}
