"""The one naming of a graph's leaves that every view uses.

``%%symgrad``, the Inspector, ``sg.verify``, ``sg.graph``, compiled steps' ``verify()``,
``symgrad check`` and the pytest plugin all call :func:`name_leaves`, so one leaf has one
name everywhere. A leaf is named, best first, by

1. ``tensor.name`` (symgrad tensors; torch's ``.name`` is always None);
2. an explicit ``names={"w": w}`` mapping the caller wrote;
3. its path in the ``nn.Module`` that owns it (``fc1.weight``, ``0.bias``,
   ``h.0.attn.c_attn.bias``), as ``named_parameters()``/``named_buffers()`` of the
   outermost owning module spell it. symgrad modules are found from a weak registry of
   every live Module (``nn.modules.live_modules``), so a model nobody holds in a variable
   still names its parameters; torch modules are found from the namespace. When two
   models own leaves whose paths collide, each path is prefixed with its model's variable;
4. the variable that holds it in a namespace (the notebook's, or the calling frame's);
5. ``t0, t1, ...`` in a fixed order of the graph (the same for every view).

Two tensors that would get one name are told apart as ``d``, ``d'``, ``d''``.

This module sits in the core: it imports nothing above it and reads torch objects by
duck typing (torch is never imported here).
"""

from __future__ import annotations

import sys
import weakref
from collections import ChainMap
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["name_leaves", "leaf_order", "unique_names", "caller_namespace", "is_module",
           "function_namespace", "argument_names", "referenced"]

#: IPython's own variables: never a user's name for a tensor
_IPYTHON_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython"})


def _is_torch(x: Any) -> bool:
    return (type(x).__module__ or "").startswith("torch")


def is_tensor(x: Any) -> bool:
    """A symgrad or torch tensor."""
    from .tensor import Tensor

    return isinstance(x, Tensor) or (_is_torch(x) and hasattr(x, "grad_fn")
                                     and hasattr(x, "shape"))


def is_module(x: Any) -> bool:
    """A symgrad or torch ``nn.Module``."""
    from .nn.modules import Module

    if isinstance(x, Module):
        return True
    return not isinstance(x, type) and _is_torch(x) and hasattr(x, "named_parameters") \
        and isinstance(getattr(x, "_modules", None), dict)


def own_name(t: Any) -> str | None:
    """``tensor.name`` when the user set one."""
    if _is_torch(t):
        return None
    name = getattr(t, "name", None)
    return name if isinstance(name, str) and name else None


def _maps(ns: Mapping | None) -> list[Mapping]:
    if ns is None:
        return []
    if isinstance(ns, ChainMap):
        return [m for sub in ns.maps for m in _maps(sub)]
    return [ns]


def _variables(ns: Mapping | None) -> tuple[dict[int, str], list[tuple[str, Any]]]:
    """(id(tensor) -> its first variable name, [(variable, module)]) of a namespace;
    private names (``_``, ``_3``) and IPython's own are skipped."""
    by_id: dict[int, str] = {}
    modules: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for m in _maps(ns):
        for key, value in list(m.items()):
            if not isinstance(key, str) or key.startswith("_") or key in _IPYTHON_NAMES:
                continue
            if is_tensor(value):
                by_id.setdefault(id(value), key)
            elif id(value) not in seen and is_module(value):
                seen.add(id(value))
                modules.append((key, value))
    return by_id, modules


def caller_namespace() -> Mapping[str, Any]:
    """The variables of the first frame outside symgrad (locals, then globals): what
    ``sg.verify(loss)`` called from a script, a function or a notebook cell names leaves
    by. A snapshot; no frame is kept."""
    frame = sys._getframe(1)
    try:
        while frame is not None:
            mod = frame.f_globals.get("__name__", "")
            if not (isinstance(mod, str) and (mod == "symgrad" or mod.startswith("symgrad."))):
                break
            frame = frame.f_back
        if frame is None:
            return {}
        local = frame.f_locals
        glob = frame.f_globals
        return ChainMap(dict(local), glob) if local is not glob else glob
    finally:
        del frame


# -- the variables a function's graph is named by ---------------------------------------

def _signature_target(fn: Any) -> tuple[Any, int]:
    """The callable whose parameters name ``fn``'s arguments (and how many leading ones
    to drop): a Module's ``forward``, a custom Function's ``forward`` after ``ctx``."""
    if is_module(fn):
        return fn.forward, 0
    owner = getattr(fn, "__self__", None)
    if getattr(fn, "__name__", "") == "apply" and isinstance(owner, type) and \
            hasattr(owner, "forward") and hasattr(owner, "backward"):
        return owner.forward, 1  # Function.apply(*args) -> forward(ctx, *args)
    return fn, 0


def argument_names(fn: Any, inputs: tuple | list) -> list[tuple[str, Any]]:
    """``(parameter name, value)`` for each positional input, as ``fn`` calls them
    (``args[0]`` for ``*args``)."""
    import inspect

    target, drop = _signature_target(fn)
    try:
        params = list(inspect.signature(target).parameters.values())[drop:]
    except (TypeError, ValueError):
        return []
    out = []
    k = 0
    for p in params:
        if k >= len(inputs):
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            out.append((p.name, inputs[k]))
            k += 1
        elif p.kind == p.VAR_POSITIONAL:
            out += [(f"{p.name}[{j}]", inputs[k + j]) for j in range(len(inputs) - k)]
            k = len(inputs)
    return out


def _code_names(code: Any) -> set[str]:
    """Global names a code object (and the lambdas/comprehensions inside it) reads."""
    import inspect

    names = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            names |= _code_names(c)
    return names


def referenced(fn: Any) -> list[tuple[str, Any]]:
    """``(variable name, value)`` for the closure cells, globals and bound ``self`` that
    ``fn`` reads: where the modules and tensors it uses live."""
    out: list[tuple[str, Any]] = []
    func = getattr(fn, "__func__", fn)
    owner = getattr(fn, "__self__", None)
    if owner is not None and is_module(owner):
        out.append(("self", owner))
    code = getattr(func, "__code__", None)
    if code is None:
        return out
    for name, cell in zip(code.co_freevars, getattr(func, "__closure__", None) or ()):
        try:
            out.append((name, cell.cell_contents))
        except ValueError:  # an empty cell
            continue
    glob = getattr(func, "__globals__", {})
    for name in sorted(_code_names(code)):
        if name in glob:
            out.append((name, glob[name]))
    return out


def function_namespace(fn: Any, inputs: tuple | list) -> dict[str, Any]:
    """The variables the graph ``fn(*inputs)`` builds is named by: ``fn``'s argument
    names, then the modules and tensors its code reads (closure, globals, bound
    ``self``); ``fn`` itself when it is a module (its paths need no prefix)."""
    ns: dict[str, Any] = {}
    if is_module(fn):
        ns[""] = fn
    for name, value in argument_names(fn, inputs) + referenced(fn):
        if name and not name.startswith("_"):
            ns.setdefault(name, value)
    return ns


# -- a fixed order of a graph's leaves ----------------------------------------------------

def _deref(ref: Any) -> Any:
    return ref() if isinstance(ref, weakref.ReferenceType) else ref


def leaf_order(roots: Any) -> list[Any]:
    """The leaf tensors behind ``roots`` (tensors or grad_fn nodes), in one fixed order:
    nodes in forward (post-order) order from the first root, each node's inputs in order.
    Every view numbers unnamed leaves in this order, so ``t0`` is one tensor everywhere."""
    roots = list(roots) if isinstance(roots, (list, tuple)) else [roots]
    out: list[Any] = []
    taken: set[int] = set()

    def add(t: Any) -> None:
        if is_tensor(t) and id(t) not in taken:
            taken.add(id(t))
            out.append(t)

    seen: set[int] = set()
    for root in roots:
        fn = getattr(root, "grad_fn", None) if is_tensor(root) else root
        if fn is None:
            add(root)
            continue
        stack = [(fn, False)]
        while stack:
            node, done = stack.pop()
            if done:
                for nxt, _ in getattr(node, "next_functions", ()) or ():
                    if nxt is not None and hasattr(nxt, "variable"):
                        add(nxt.variable)
                for ref in getattr(node, "_input_refs", ()) or ():
                    t = _deref(ref)
                    if is_tensor(t) and getattr(t, "grad_fn", None) is None:
                        add(t)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            for nxt, _ in reversed(getattr(node, "next_functions", ()) or ()):
                if nxt is not None and not hasattr(nxt, "variable") and id(nxt) not in seen:
                    stack.append((nxt, False))
    return out


# -- module paths -------------------------------------------------------------------------

def _module_paths(tensors: list[Any], held: list[tuple[str, Any]]) -> dict[int, str]:
    """id(tensor) -> its path in the outermost module that owns it (``fc1.weight``).

    The modules looked at are every live symgrad Module and the modules reachable from
    ``held`` (``(variable, module)`` pairs from the namespace: how torch models are
    found). Among several outermost owners, one held in a variable wins, then the nearest.
    Paths that two models would share are prefixed with the models' variable names."""
    from .nn.modules import live_modules

    wanted = {id(t) for t in tensors}
    if not wanted:
        return {}
    pool: dict[int, Any] = {}
    for m in live_modules():
        pool[id(m)] = m
    for _var, m in held:
        try:
            for sub in m.modules():
                pool.setdefault(id(sub), sub)
        except Exception:  # noqa: BLE001 - a module we cannot walk names nothing
            continue
    held_var = {id(m): var for var, m in held}
    owners: dict[int, list[Any]] = {}
    parents: dict[int, list[Any]] = {}
    for m in pool.values():
        d = m.__dict__
        for store in ("_parameters", "_buffers"):
            for value in (d.get(store) or {}).values():
                if value is not None and id(value) in wanted:
                    owners.setdefault(id(value), []).append(m)
        for child in (d.get("_modules") or {}).values():
            if child is not None and id(child) in pool:
                parents.setdefault(id(child), []).append(m)
    if not owners:
        return {}

    root_of: dict[int, Any] = {}

    def outermost(start: list[Any]) -> Any:
        """BFS upward from the owners: the first root held in a variable, else the
        nearest root."""
        frontier, visited, roots = list(start), {id(m) for m in start}, []
        while frontier:
            nxt = []
            for m in frontier:
                ups = parents.get(id(m))
                if not ups:
                    roots.append(m)
                    continue
                for p in ups:
                    if id(p) not in visited:
                        visited.add(id(p))
                        nxt.append(p)
            frontier = nxt
        for r in roots:
            if id(r) in held_var:
                return r
        return roots[0] if roots else start[0]

    path_cache: dict[int, dict[int, str]] = {}

    def paths_in(root: Any) -> dict[int, str]:
        got = path_cache.get(id(root))
        if got is None:
            got = {}
            try:
                for path, t in list(root.named_parameters()) + list(root.named_buffers()):
                    got.setdefault(id(t), path)
            except Exception:  # noqa: BLE001
                pass
            path_cache[id(root)] = got
        return got

    found: dict[int, tuple[Any, str]] = {}
    for t in tensors:
        own = owners.get(id(t))
        if not own:
            continue
        key = tuple(id(m) for m in own)
        root = root_of.get(key)
        if root is None:
            root = root_of[key] = outermost(own)
        path = paths_in(root).get(id(t))
        if path:
            found[id(t)] = (root, path)
    # two models, one path: prefix those models' paths with their variables
    by_path: dict[str, set[int]] = {}
    for root, path in found.values():
        by_path.setdefault(path, set()).add(id(root))
    clash = {r for roots in by_path.values() if len(roots) > 1 for r in roots}
    out = {}
    for key, (root, path) in found.items():
        var = held_var.get(id(root))
        out[key] = f"{var}.{path}" if id(root) in clash and var else path
    return out


# -- the names ----------------------------------------------------------------------------

def unique_names(tensors: Iterable[Any], names: Mapping[str, Any] | None = None,
                 namespace: Mapping[str, Any] | None = None,
                 generated: set[int] | None = None) -> list[str]:
    """One display name per tensor of ``tensors`` (in order; see the module docstring).

    ``names``: the caller's explicit ``{name: tensor}`` (beats module paths);
    ``namespace``: variables to fall back on (a notebook's ``user_ns``, a frame's locals).
    Modules found in either give their variable names to colliding module paths.
    ``generated``, when given, receives the positions that got ``t0, t1, ...``."""
    tensors = list(tensors)
    explicit, held = _variables(names)
    variables, held_ns = _variables(namespace)
    held = held + [hm for hm in held_ns if all(hm[1] is not m for _, m in held)]
    base: list[str | None] = [own_name(t) or explicit.get(id(t)) for t in tensors]
    pending = [t for t, b in zip(tensors, base) if b is None]
    if pending:
        paths = _module_paths(pending, held)
        base = [b or paths.get(id(t)) or variables.get(id(t)) for t, b in zip(tensors, base)]
    used = {b for b in base if b}
    out: list[str] = []
    taken: set[str] = set()
    auto = 0
    for k, b in enumerate(base):
        if not b:
            if generated is not None:
                generated.add(k)
            while f"t{auto}" in used or f"t{auto}" in taken:
                auto += 1
            b = f"t{auto}"
            auto += 1
        name = b
        while name in taken:  # one name twice: d, d', d'' ...
            name += "'"
        taken.add(name)
        out.append(name)
    return out


def name_leaves(roots: Any, names: Mapping[str, Any] | None = None,
                namespace: Mapping[str, Any] | None = None,
                extra: Iterable[Any] = (), generated: set[int] | None = None
                ) -> dict[int, str]:
    """``id(tensor) -> name`` for the leaves behind ``roots`` (in :func:`leaf_order`),
    then ``extra`` tensors not among them (leaves a walker found that the fixed order
    does not reach, named after the others). Valid while those tensors live.
    ``generated``, when given, receives the ids of the tensors named ``t0, t1, ...``."""
    tensors = leaf_order(roots)
    ids = {id(t) for t in tensors}
    for t in extra:
        if id(t) not in ids:
            ids.add(id(t))
            tensors.append(t)
    auto: set[int] = set()
    got = unique_names(tensors, names, namespace, auto)
    if generated is not None:
        generated.update(id(tensors[k]) for k in auto)
    return dict(zip((id(t) for t in tensors), got))
