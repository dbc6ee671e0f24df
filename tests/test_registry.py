"""The op registry: every op is defined once and completely."""

from __future__ import annotations

import ast
import pathlib

import pytest

import symgrad as sg  # noqa: F401  (fills the registry)
from symgrad.ops import OPS, STRUCTURAL, OpSpec, check_complete
from symgrad.ops.registry import register

OPS_DIR = pathlib.Path(sg.__file__).parent / "ops"


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_has_every_facet(name):
    assert check_complete(OPS[name]) == []


def test_completeness_check_catches_a_missing_facet():
    spec = OpSpec("fake", "FakeBackward0", ("self", "other"), lambda be, s, o: s,
                  {"self": lambda grad: grad}, STRUCTURAL)
    assert any("other" in p for p in check_complete(spec))
    no_sympy = OpSpec("fake2", "Fake2Backward0", ("self",), lambda be, s: s,
                      {"self": lambda grad: grad}, None)
    assert "sympy meaning" in check_complete(no_sympy)
    with pytest.raises(ValueError, match="registered twice"):
        register(OPS["mul"])


def test_saved_names_are_derived_from_formula_parameters():
    assert OPS["mul"].saved == ("other", "self")
    assert OPS["exp"].saved == ("result",)
    assert OPS["mm"].saved == ("mat2", "mat2_sym_sizes", "mat2_sym_strides", "self",
                               "self_sym_sizes", "self_sym_strides")
    with pytest.raises(ValueError, match="must take grad first"):
        OpSpec("bad", "BadBackward0", ("self",), lambda be, s: s, {"self": lambda x: x}, STRUCTURAL)


def test_ops_package_imports_no_backend_or_ui_library():
    forbidden = {"numba", "ipywidgets", "sympy", "symengine", "torch"}
    for path in OPS_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [(node.module or "").split(".")[0]]
            else:
                continue
            assert not forbidden.intersection(names), f"{path.name} imports {names}"
