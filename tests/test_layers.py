"""The layers of DESIGN.md hold: no import cycle, ops below backends, the core below the rest.

Every module under symgrad/ is parsed with ``ast``; its imports are collected at module level
*and* inside functions (a lazy import is still a dependency: it only moves the failure from
import time to call time). Imports under ``if TYPE_CHECKING:`` never run and are skipped.
Relative imports are resolved; ``from pkg import name`` counts as importing ``pkg.name`` when
that is a module, else ``pkg``. Importing ``a.b.c`` also runs ``a/__init__`` at run time;
like import-linter, these implicit parent imports are not edges.

A lower layer that needs something from a higher one at run time (an op's backward formula
making zeros, the engine wrapping a gradient in a Tensor) reads it from the one registration
point, symgrad/_tensor_layer.py, which the higher modules fill at their import.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "symgrad"

#: Outside the core: the verifier, notebooks, the test helpers, the command line, the demo.
NON_CORE = ("symgrad.symbolic", "symgrad.jupyter", "symgrad.testing", "symgrad.cli",
            "symgrad.demo", "symgrad.__main__")
#: What the core may not import.
ABOVE_CORE = ("symgrad.symbolic", "symgrad.jupyter", "symgrad.testing")

#: The only imports from the core into the layers above it, each lazy (inside a function),
#: with the reason. Keep this minimal: a new entry needs a reason a reviewer accepts.
ALLOWED_UPWARD = {
    ("symgrad", "symgrad.symbolic"):
        "sg.verify / sg.capture_torch: the public API (DESIGN.md, Public API) forwards to the "
        "verifier on first use, so SymPy is not imported with symgrad",
    ("symgrad", "symgrad.symbolic.verify"):
        "the same forwarding (`from .symbolic import verify` also names that submodule)",
    ("symgrad", "symgrad.jupyter"):
        "load_ipython_extension: `%load_ext symgrad` looks the hook up on the package itself",
    ("symgrad", "symgrad.jupyter.graph"):
        "sg.graph(root): the public display helper, forwarded on first use",
}

#: Packages whose internal cycles get a test of their own (a failure names the package).
#: The verifier's modules share their low-level pieces through symbolic/_common.py and
#: graph.py, so none of them imports one that imports it back (issue 19, item 3).
KNOWN_CYCLE_PACKAGES = {
    "symgrad.symbolic": "the verifier's modules (graph, custom, exact, local, glue, trace, "
                        "torch_graph, verify, ...) must not import one another in a cycle",
}


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts.pop()
    return ".".join(parts), is_pkg


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """(module name, level, imported names, line) for every import that can run."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, 0, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            yield node.module or "", node.level, tuple(a.name for a in node.names), node.lineno
        stack.extend(ast.iter_child_nodes(node))


def _graph() -> dict[str, dict[str, int]]:
    """module -> {symgrad module it imports: first line}."""
    files = {}
    for path in sorted(ROOT.rglob("*.py")):
        name, is_pkg = _module_name(path)
        files[name] = (path, is_pkg)

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for mod, (path, is_pkg) in files.items():
        edges: dict[str, int] = {}
        for name, level, names, line in _imports(ast.parse(path.read_text(), str(path))):
            if level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[:len(base) - (level - 1)]
                name = ".".join(base + ([name] if name else []))
            if not (name == "symgrad" or name.startswith("symgrad.")):
                continue
            targets = [f"{name}.{n}" if f"{name}.{n}" in files else name for n in names] \
                or [name]
            for t in targets:
                t = known(t)
                if t and t != mod:
                    edges.setdefault(t, line)
        graph[mod] = edges
    return graph


GRAPH = _graph()


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _without_allowed(graph):
    return {m: {t: ln for t, ln in e.items() if (m, t) not in ALLOWED_UPWARD}
            for m, e in graph.items()}


def _describe(comp: list[str], graph) -> str:
    members = set(comp)
    lines = [f"import cycle among {len(comp)} modules: {', '.join(comp)}"]
    for m in comp:
        for t, ln in sorted(graph[m].items()):
            if t in members:
                lines.append(f"    {m} (line {ln}) -> {t}")
    return "\n".join(lines)


def _in_known_package(comp: list[str]) -> bool:
    return any(all(m == p or m.startswith(p + ".") for m in comp) for p in KNOWN_CYCLE_PACKAGES)


def test_the_parser_sees_lazy_imports():
    # autograd/variable.py imports the Tensor class inside a method: still an edge
    assert "symgrad.tensor" in GRAPH["symgrad.autograd.variable"]
    assert "symgrad.ops.registry" in GRAPH["symgrad.ops"]


def test_no_import_cycle_lazy_imports_included():
    graph = _without_allowed(GRAPH)
    bad = [c for c in _cycles(graph) if not _in_known_package(c)]
    assert not bad, "\n".join(_describe(c, graph) for c in bad)


def test_no_import_cycle_inside_the_verifier():
    graph = _without_allowed(GRAPH)
    bad = [c for c in _cycles(graph) if _in_known_package(c)]
    assert not bad, "\n".join(_describe(c, graph) for c in bad)


def test_ops_never_import_backends():
    """Ops are written against the backend they are handed (DESIGN.md, Layers)."""
    bad = [f"{m} (line {ln}) imports {t}" for m, e in GRAPH.items()
           if m == "symgrad.ops" or m.startswith("symgrad.ops.")
           for t, ln in e.items() if t == "symgrad.backends" or t.startswith("symgrad.backends.")]
    assert not bad, "\n".join(bad)


def test_ops_import_only_ops_and_leaf_modules():
    """The stronger form that holds today: an op module needs nothing above the registry."""
    allowed = ("symgrad.ops", "symgrad.dtypes", "symgrad._tensor_layer")
    bad = [f"{m} (line {ln}) imports {t}" for m, e in GRAPH.items()
           if m == "symgrad.ops" or m.startswith("symgrad.ops.")
           for t, ln in e.items() if not any(t == a or t.startswith(a + ".") for a in allowed)]
    assert not bad, "\n".join(bad)


def test_the_core_never_imports_the_layers_above_it():
    core = [m for m in GRAPH if not any(m == p or m.startswith(p + ".") for p in NON_CORE)]
    bad = [f"{m} (line {ln}) imports {t}" for m in core for t, ln in GRAPH[m].items()
           if any(t == p or t.startswith(p + ".") for p in ABOVE_CORE)
           and (m, t) not in ALLOWED_UPWARD]
    assert not bad, "\n".join(bad)


def test_every_allowed_exception_is_still_needed():
    stale = [pair for pair in ALLOWED_UPWARD if pair[1] not in GRAPH.get(pair[0], {})]
    assert not stale, f"no longer imported, remove from ALLOWED_UPWARD: {stale}"


def test_tensor_methods_are_defined_where_go_to_definition_looks():
    """Tensor's operators are bound in tensor.py's class body (not attached from elsewhere)."""
    tree = ast.parse((ROOT / "tensor.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor")
    names = set()
    for n in cls.body:
        if isinstance(n, ast.FunctionDef):
            names.add(n.name)
        elif isinstance(n, ast.Assign):
            names.update(t.id for t in n.targets if isinstance(t, ast.Name))
    for name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
                 "__truediv__", "__rtruediv__", "__pow__", "__rpow__", "__matmul__",
                 "__rmatmul__", "__neg__", "__pos__", "__abs__", "__eq__", "__ne__", "__lt__",
                 "__le__", "__gt__", "__ge__", "__and__", "__or__", "__invert__",
                 "__getitem__", "__setitem__", "__iter__", "exp", "sum", "matmul", "T", "mT"):
        assert name in names, f"Tensor.{name} is not defined in tensor.py's class body"
    # and nothing outside tensor.py sets them (_attach_registry_methods, below the class)
    for path in ROOT.rglob("*.py"):
        if path.name == "tensor.py" and path.parent == ROOT:
            continue
        src = path.read_text()
        assert "setattr(Tensor," not in src and "Tensor.__mul__ =" not in src, path
