"""Module paths of autograd nodes (``h.0.attn``), made only when a view asks.

``Module.__call__`` leaves on every node it saw made the entry of its call stack
(``Node._module_call``: ``(weakref to the module, the enclosing call's entry)``, see
``autograd/node.py``). A path is the innermost module's name in the outermost call's
``named_modules()``: the graph, the report and every view name a node's module alike.
Core code, duck-typed: no import of ``nn`` (nor of the verifier or the views).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ModulePaths"]


def call_modules(entry: Any) -> list[Any]:
    """The modules of a call entry, innermost first (None for one freed since)."""
    out = []
    while entry is not None:
        ref, entry = entry
        out.append(ref())
    return out


class ModulePaths:
    """Names nodes by module call; caches ``named_modules()`` once per root model.

    A module registered under two names keeps its first (``named_modules`` order); a
    module its root does not own (kept in a plain list, passed in as an argument) gives
    way to the nearest enclosing call that it does own; a node made outside any module
    call, by the root model itself, or of a torch graph, is ``""``.

    ``entries``: every call entry that will be asked about, when known. Their outermost
    calls are the graph's root models; a root that another one owns (``model.encoder``
    called on its own beside ``model``) is named through it. Several root models (a
    GAN's generator and discriminator) would share paths (``fc1``), so each is then a
    module of its own, named by its class (``Generator.fc1``; ``Net'`` for a second
    ``Net``).
    """

    def __init__(self, entries: Any = ()) -> None:
        self._by_root: dict[int, dict[int, str]] = {}
        self.modules: dict[str, Any] = {}  # path -> module, in named_modules() order
        self.params: dict[int, str] = {}  # id(parameter) -> path of the module owning it
        self._by_entry: dict[int, str] = {}
        self._keep: list[Any] = []  # roots and entries whose ids key the caches
        self._roots = self._main_roots(entries)

    def _main_roots(self, entries: Any) -> list[Any]:
        roots: dict[int, Any] = {}
        for entry in entries:
            mods = call_modules(entry)
            if mods and mods[-1] is not None:
                roots.setdefault(id(mods[-1]), mods[-1])
        if len(roots) < 2:
            return []
        owned: set[int] = set()
        for r in roots.values():
            named = getattr(r, "named_modules", None)
            if callable(named):
                owned |= {id(m) for path, m in named() if path}
        main = [r for k, r in roots.items() if k not in owned]
        if len(main) < 2:
            return main
        taken: set[str] = set()
        for r in main:
            label = type(r).__name__
            while label in taken:
                label += "'"
            taken.add(label)
            self._table(r, label)
        return main

    def _table(self, root: Any, prefix: str = "") -> dict[int, str]:
        got = self._by_root[id(root)] = {}
        self._keep.append(root)
        named = getattr(root, "named_modules", None)
        for path, m in (named() if callable(named) else [("", root)]):
            if prefix:
                path = prefix + ("." + path if path else "")
            got.setdefault(id(m), path)
            if path:
                self.modules.setdefault(path, m)
            for p in getattr(m, "_parameters", {}).values():
                if p is not None and path:
                    self.params.setdefault(id(p), path)
        return got

    def _names(self, root: Any) -> dict[int, str]:
        got = self._by_root.get(id(root))
        if got is not None:
            return got
        for main in self._roots:  # a root model owned by another one: named through it
            table = self._by_root.get(id(main)) or self._table(main)
            if id(root) in table:
                self._by_root[id(root)] = table
                return table
        return self._table(root)

    def of_entry(self, entry: Any) -> str:
        """The path of a call entry (nodes made in one call share it: cached)."""
        got = self._by_entry.get(id(entry))
        if got is None:
            got = self._by_entry[id(entry)] = self._path(entry)
            self._keep.append(entry)
        return got

    def _path(self, entry: Any) -> str:
        mods = call_modules(entry)
        if not mods or mods[-1] is None:
            return ""
        names = self._names(mods[-1])
        for m in mods:
            if m is not None and id(m) in names:
                return names[id(m)]
        return ""

    def of_node(self, node: Any) -> str:
        """The path of the module call that made ``node`` (a grad_fn), else ``""``."""
        return self.of_entry(getattr(node, "_module_call", None))
