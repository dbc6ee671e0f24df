"""Notebook 07 on a kernel where PyTorch is not installed: it says so and how to install it.

The kernel gets a ``sitecustomize`` (first on PYTHONPATH) whose import hook makes
``import torch`` fail as it does when torch is absent, so the test runs where torch is.
"""

from __future__ import annotations

import os
import textwrap

import pytest

pytest.importorskip("nbformat", reason="the jupyter extra (`make test` installs it)")
pytest.importorskip("nbclient", reason="the jupyter extra (`make test` installs it)")

from test_notebooks import execute, text_of  # noqa: E402

NO_TORCH = textwrap.dedent('''
    import importlib.abc
    import sys


    class _NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None


    sys.meta_path.insert(0, _NoTorch())
''')


def test_notebook_07_without_torch_says_torch_is_needed(tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(NO_TORCH)
    paths = [str(tmp_path)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                               if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    nb = execute("07_checking_pytorch_models.ipynb")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(o.output_type != "error" for c in code for o in c.get("outputs", []))
    first = text_of(code[0])
    assert "This notebook needs PyTorch" in first
    assert "No module named 'torch'" in first  # why, in the kernel's own words
    assert "%pip install torch" in first and "restart the kernel" in first
    assert first.rstrip().endswith("torch available: False")
    for cell in code[1:]:  # every other cell says why it did nothing
        assert text_of(cell).strip() == \
            "skipped: this cell needs PyTorch (see the first cell)"
