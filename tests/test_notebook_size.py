"""A saved notebook stays light: ten ``%%symgrad`` cells under 200 KB.

The notebook is executed by nbclient, which stores the widget state as ``make demo`` does,
and saved by nbformat. Each cell keeps its graph once, in the graph output (graph JSON with
the verdicts, static SVG/HTML, text), plus an Inspector whose saved state is a small
loader and a few traits: the Inspector's drawing code comes from the labextension, and its
graph travels as comm messages that saved state does not record. The cells are the
showcase's two ``%%symgrad`` cells (notebooks/00_showcase.ipynb), five times each.
tests/browser/test_saved_notebooks.py opens this notebook in JupyterLab and Notebook 7.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

LIMIT = 200_000
GRAPH_MIME = "application/vnd.symgrad.graph+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
TUTORIAL = """%%symgrad
a{i} = sg.tensor(2.0, requires_grad=True)
b{i} = sg.tensor(3.0, requires_grad=True)
c{i} = a{i} + b{i}
d{i} = b{i} + 1
e{i} = c{i} * d{i}
print(e{i}.grad_fn, 'saves d:', e{i}.grad_fn._saved_other is d{i})
e{i}.backward()"""
NEURON = """%%symgrad
sg.manual_seed({i})
x{i} = sg.randn(4, 3)
w{i} = sg.randn(3, 1, requires_grad=True)
bias{i} = sg.zeros(1, requires_grad=True)
y{i} = sg.tensor([[0.0], [1.0], [1.0], [0.0]])
loss{i} = ((x{i} @ w{i} + bias{i}).sigmoid() - y{i}).pow(2).mean()
loss{i}.backward()"""
CELLS = ["import symgrad as sg\n%load_ext symgrad",
         *((TUTORIAL if i % 2 == 0 else NEURON).format(i=i) for i in range(10))]


def execute_ten_cells(path: Path, kernel_metadata: bool = True):
    """Run :data:`CELLS` on a fresh kernel of this Python with nbclient and save the
    notebook to ``path``; ``kernel_metadata=False`` drops kernelspec and language_info
    (then a front end opening it starts no kernel). Returns the executed notebook."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spec = root / "kernels" / "symgrad-size"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3", "language": "python"}))
        env = {"JUPYTER_PATH": str(root), "JUPYTER_DATA_DIR": str(root / "data"),
               "JUPYTER_RUNTIME_DIR": str(root / "runtime"),
               "IPYTHONDIR": str(root / "ipython"), "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            nb = nbformat.v4.new_notebook()
            nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
            nb.metadata["kernelspec"] = {"name": "symgrad-size", "display_name": "Python 3",
                                         "language": "python"}
            # store_widget_state is nbclient's default, and what symgrad.demo runs with
            nbclient.NotebookClient(nb, timeout=180, kernel_name="symgrad-size",
                                    store_widget_state=True,
                                    resources={"metadata": {"path": str(root)}}).execute()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    if not kernel_metadata:
        nb.metadata.pop("kernelspec", None)
        nb.metadata.pop("language_info", None)
    nbformat.write(nb, str(path))
    return nb


def _size(obj, depth: int) -> int:
    """Bytes of ``obj`` as nbformat writes it at nesting ``depth`` (indent 1)."""
    text = json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False)
    return len(text.encode()) + text.count("\n") * depth


def test_ten_symgrad_cells_save_under_200_kb(tmp_path):
    pytest.importorskip("ipywidgets")
    path = tmp_path / "ten.ipynb"
    nb = execute_ten_cells(path)
    size = path.stat().st_size
    cells = nb.cells[1:]
    graphs = [o for c in cells for o in c.outputs if GRAPH_MIME in o.get("data", {})]
    views = [o for c in cells for o in c.outputs if WIDGET_MIME in o.get("data", {})]
    state = nb.metadata["widgets"][WIDGET_STATE]["state"]
    parts = {
        "graph outputs": sum(_size(dict(o.data), 5) for o in graphs),
        "Inspector views": sum(_size(dict(o.data), 5) for o in views),
        "widget state": _size(nb.metadata["widgets"], 2),
    }
    breakdown = ", ".join(f"{k} {v / 1000:.1f} KB" for k, v in parts.items())
    print(f"\nten %%symgrad cells saved: {size / 1000:.1f} KB ({breakdown})")
    # every cell: its graph output with the verdicts, then one Inspector
    assert len(graphs) == len(views) == 10
    assert all(o.data[GRAPH_MIME]["agreement"]["ok"] is True for o in graphs)
    assert [c.outputs[-1].output_type for c in cells] == ["display_data"] * 10
    inspectors = [m for m in state.values() if m["model_name"] == "AnyModel"]
    assert len(inspectors) == len(state) == 10  # no Layout or child models
    for m in inspectors:
        s = m["state"]
        assert s["status"] == "done" and s["selected"]
        # the graph is saved once, in the graph output; the drawing code not at all
        assert "graph" not in s and "report" not in s
        assert len(s["_esm"]) < 1000
    assert size < LIMIT, (f"ten %%symgrad cells saved as {size / 1000:.1f} KB, over "
                          f"{LIMIT / 1000:.0f} KB ({breakdown})")
