"""Tensor's methods come from one table, and the op-function modules sit below tensor.py.

Layering (issue 31, scope 6): functional.py, indexing.py and tensor_functions.py hold the
public op functions and never import tensor.py (they reach the class through
_tensor_layer.py at call time); tensor.py imports them at module level and binds their
functions in the class body, one line per method (``exp = _F.exp``). What the op registry
generates (in-place twins, random initialisers, in-place aliases, the straight lines of
``+ - * /``) is attached once below the class by ``_attach_registry_methods``. Nothing else
gives Tensor a method, so adding one is a line in the class body.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import test_layers as layers  # tests/ is on sys.path under pytest

import symgrad as sg
from symgrad import functional as F
from symgrad import indexing as IX
from symgrad import tensor_functions as TF

ROOT = Path(__file__).resolve().parent.parent / "symgrad"
FOUR = ("symgrad.tensor", "symgrad.functional", "symgrad.indexing", "symgrad.tensor_functions")
#: the aliases tensor.py gives those modules
MODULES = {"_F": F, "_ix": IX, "_TF": TF}
#: the operators whose table line is the fallback of their straight line
OPERATOR_LINES = {"__add__": F.add, "__radd__": F.add, "__sub__": F.sub, "__mul__": F.mul,
                  "__rmul__": F.mul, "__truediv__": F.div}


def _class_body() -> list[ast.stmt]:
    tree = ast.parse((ROOT / "tensor.py").read_text())
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor").body


def _table() -> list[tuple[str, object, bool]]:
    """(method name, function, is a property) for every ``name = _F.fn`` line of the body."""
    rows = []
    for stmt in _class_body():
        if not isinstance(stmt, ast.Assign):
            continue
        value, is_prop = stmt.value, False
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) \
                and value.func.id == "property" and len(value.args) == 1:
            value, is_prop = value.args[0], True
        if not (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                and value.value.id in MODULES):
            continue
        fn = getattr(MODULES[value.value.id], value.attr)
        rows.extend((t.id, fn, is_prop) for t in stmt.targets)
    return rows


def _defined_in_body() -> set[str]:
    names = set()
    for stmt in _class_body():
        if isinstance(stmt, ast.FunctionDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return names


def _function_level_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for n in ast.walk(node):
                if isinstance(n, ast.ImportFrom) and (
                        n.level or (n.module or "").split(".")[0] == "symgrad"):
                    out.append(f"{path.name}:{n.lineno} in {node.name}(): {ast.unparse(n)}")
                elif isinstance(n, ast.Import) and any(
                        a.name.split(".")[0] == "symgrad" for a in n.names):
                    out.append(f"{path.name}:{n.lineno} in {node.name}(): {ast.unparse(n)}")
    return out


# -- (a) no lazy imports: nothing left to hide a cycle ----------------------------------------
def test_no_function_level_imports_of_symgrad_in_the_four_modules():
    found = [line for m in FOUR for line in
             _function_level_imports(ROOT / (m.split(".")[1] + ".py"))]
    assert not found, "imports inside functions:\n" + "\n".join(found)


def test_the_lazy_import_check_sees_a_lazy_import(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import numpy\n\ndef f():\n    from . import functional as _F\n"
                 "    import symgrad.indexing\n    import math\n    return _F\n")
    assert len(_function_level_imports(p)) == 2


# -- (c) the layering: tensor.py above the op-function modules, no cycle ------------------------
def test_op_function_modules_never_reach_tensor_py():
    """Over the whole package's import graph (lazy imports included, TYPE_CHECKING not),
    nothing functional.py, indexing.py or tensor_functions.py imports leads back to
    tensor.py (or creation.py, which builds on it)."""
    graph = layers._without_allowed(layers.GRAPH)
    for start in FOUR[1:]:
        seen, stack, parent = {start}, [start], {}
        while stack:
            m = stack.pop()
            for t in graph.get(m, ()):
                if t not in seen:
                    seen.add(t)
                    parent[t] = m
                    stack.append(t)
        for bad in ("symgrad.tensor", "symgrad.creation"):
            if bad in seen:
                path, m = [bad], bad
                while m != start:
                    m = parent[m]
                    path.append(m)
                raise AssertionError(f"{start} reaches {bad}: {' -> '.join(reversed(path))}")


def test_the_four_modules_import_downward_only():
    edges = {(m, t) for m in FOUR for t in layers.GRAPH[m] if t in FOUR}
    # tensor.py imports all three; indexing.py builds on functional.py; nothing goes back
    assert {("symgrad.tensor", m) for m in FOUR[1:]} <= edges
    assert edges <= {("symgrad.tensor", m) for m in FOUR[1:]} | {
        ("symgrad.indexing", "symgrad.functional")}, edges
    sub = {m: {t: 0 for t in layers.GRAPH[m] if t in FOUR} for m in FOUR}
    assert not layers._cycles(sub)


def test_the_cycle_finder_sees_a_cycle():
    assert layers._cycles({"a": {"b": 1}, "b": {"a": 2}, "c": {}}) == [["a", "b"]]


# -- (b) the table: one line per method, the function itself ----------------------------------
def test_every_table_line_is_the_function_on_tensor():
    rows = _table()
    assert len(rows) > 120  # the whole table was read (not an empty parse)
    for name, fn, is_prop in rows:
        attr = inspect.getattr_static(sg.Tensor, name)
        if is_prop:
            assert isinstance(attr, property) and attr.fget is fn, name
            continue
        if name in OPERATOR_LINES:  # the straight line, documented as its fallback
            assert attr is not fn and attr.__globals__["fallback"] is fn is OPERATOR_LINES[name]
            assert (attr.__name__, attr.__doc__) == (fn.__name__, fn.__doc__), name
            continue
        assert attr is fn, f"Tensor.{name} is not {fn.__module__}.{fn.__qualname__}"
        bound = getattr(sg.ones(2), name)
        assert inspect.signature(getattr(sg.Tensor, name)) == inspect.signature(fn), name
        assert list(inspect.signature(bound).parameters) == \
            list(inspect.signature(fn).parameters)[1:], name
        assert getattr(sg.Tensor, name).__doc__ == fn.__doc__, name


def test_the_table_binds_each_name_once_and_the_registry_overrides_none():
    names = [name for name, _, _ in _table()]
    dup = sorted({n for n in names if names.count(n) > 1})
    assert not dup, f"bound twice in the class body (the first line is dead): {dup}"
    generated = set(F.inplace_methods()) | set(F._INPLACE_ALIASES)
    clash = sorted(generated & _defined_in_body())
    assert not clash, f"generated from the registry and also written in the class: {clash}"
    assert set(OPERATOR_LINES) <= set(names)


def test_every_method_comes_from_the_body_or_the_registry():
    """No third place: each Tensor attribute is written in the class body or attached by
    ``_attach_registry_methods`` (the registry's in-place forms, aliases, operator lines)."""
    generated = set(F.inplace_methods()) | set(F._INPLACE_ALIASES) | set(OPERATOR_LINES)
    body = _defined_in_body()
    inherited = set(dir(object)) | set(vars(sg.Tensor.__mro__[1]))
    stray = sorted(n for n in vars(sg.Tensor) if n not in body | generated | inherited
                   and n not in sg.Tensor.__slots__)
    assert not stray, f"Tensor attributes set outside the table and the registry: {stray}"
    for name, method in F.inplace_methods().items():  # (each call makes new closures)
        attr = inspect.getattr_static(sg.Tensor, name)
        assert attr.__code__ is method.__code__, name
        assert [c.cell_contents for c in attr.__closure__ or ()] == \
            [c.cell_contents for c in method.__closure__ or ()], name
    for alias, target in F._INPLACE_ALIASES.items():
        assert getattr(sg.Tensor, alias) is getattr(sg.Tensor, target), alias


def test_methods_keep_torch_signatures_where_they_differ_from_the_function():
    # Tensor.split names its argument split_size (torch), the function split_size_or_sections
    assert list(inspect.signature(sg.Tensor.split).parameters) == ["self", "split_size", "dim"]
    assert "split_size_or_sections" in inspect.signature(sg.split).parameters
    x = sg.arange(6.0)
    assert [p.tolist() for p in x.split(split_size=4)] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
    # norm is tensor_functions' (p, dim, keepdim, dtype), not functional's 2-norm
    assert sg.Tensor.norm is TF.norm
    assert x.norm(p=1).item() == 15.0


def test_tensor_functions_exports_are_the_package_functions():
    missing = [n for n in TF.FUNCTIONS if getattr(sg, n, None) is not getattr(TF, n)]
    assert not missing, missing


def test_what_the_verifier_swaps_is_read_at_call_time(monkeypatch):
    """The symbolic replay swaps ``symgrad.cuda._require_cuda`` for its own device check, so
    to_device reads it from the module at each call (not a name bound at import)."""
    import symgrad.cuda

    class Swapped(Exception):
        pass

    def swapped(device):
        raise Swapped(str(device))

    monkeypatch.setattr(symgrad.cuda, "_require_cuda", swapped)
    with pytest.raises(Swapped, match="^cuda$"):
        sg.ones(2).to("cuda")
