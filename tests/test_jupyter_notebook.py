"""``%load_ext symgrad`` and ``%%symgrad`` in a real kernel, executed with nbclient.

The kernel runs this venv's Python (a kernelspec written to a temporary JUPYTER_PATH),
so the test needs no installed kernel. The display data is what a saved notebook holds:
the graph bundle as its own output (JSON valid against the schema + SVG + text), the
Inspector as a separate widget output, then the cell's own unchanged result.
"""

from __future__ import annotations

import json
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("ipykernel")
pytest.importorskip("ipywidgets")

from symgrad.jupyter import GRAPH_MIME, REPORT_MIME, load_schema  # noqa: E402

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
XSS = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    root = tmp_path_factory.mktemp("jupyter")
    spec_dir = root / "kernels" / "symgrad-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "symgrad test", "language": "python"}))
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(root))
    mp.setenv("JUPYTER_DATA_DIR", str(root / "data"))
    mp.setenv("JUPYTER_RUNTIME_DIR", str(root / "runtime"))
    mp.setenv("IPYTHONDIR", str(root / "ipython"))
    mp.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    cells = [
        "%load_ext symgrad",
        "import symgrad as sg\n"
        "a = sg.tensor(2., requires_grad=True)\n"
        "b = sg.tensor(3., requires_grad=True)\n"
        "c = sg.tensor(4., requires_grad=True)",
        "%%symgrad\nd = 5 * (a + b)\ne = c * d\ne.backward()\ne",
        "a.grad, c.grad",
        "%%symgrad --no-verify\nf = (a * b).sin()\ng = f * 2",
        "%%symgrad --root e --rtol 1e-3\nprint('hello')",
        "%symgrad graph e",
        "%symgrad saved e",
        "%symgrad verify e --rtol 1e-5",
        "e.grad_fn",
        f"evil = sg.tensor([1., 2.], requires_grad=True)\nevil.name = {XSS!r}",
        "%%symgrad\nz = (evil * evil).sum()",
        "%%symgrad\nx = 1\nraise ValueError('boom from the cell')",
        "x",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.cells[12].metadata["tags"] = ["raises-exception"]
    try:
        client = nbclient.NotebookClient(nb, timeout=180, kernel_name="symgrad-test",
                                         resources={"metadata": {"path": str(root)}})
        client.execute()
    finally:
        mp.undo()
    out = root / "executed.ipynb"
    nbformat.write(nb, str(out))
    return nbformat.read(str(out), as_version=4)  # what a saved notebook holds


def outputs(nb, i):
    return nb.cells[i].outputs


def test_load_ext_and_cell_magic_outputs(executed):
    outs = outputs(executed, 2)
    assert [o.output_type for o in outs] == ["display_data", "display_data", "execute_result"]
    graph_out, widget_out, result = outs
    assert set(graph_out.data) == {GRAPH_MIME, "text/html", "text/plain"}
    payload = graph_out.data[GRAPH_MIME]
    jsonschema.validate(payload, load_schema())
    labels = sorted(n["label"] for n in payload["nodes"])
    assert labels == ["AddBackward0", "MulBackward0", "MulBackward0", "None", "a", "b", "c"]
    root = next(n for n in payload["nodes"] if n["id"] == payload["roots"][0])
    assert root["variable"] == "e"
    # e.backward() freed the saved tensors (as in torch), but under %%symgrad (record())
    # the node still holds its inputs, so the panel shows what was saved
    saved = {s["name"]: s for s in root["saved"]}
    assert (saved["other"]["kind"], saved["other"]["preview"]) == ("freed", "25.")
    assert saved["other"]["same_object_as"] == "d" and saved["self"]["same_object_as"] == "c"
    # the graph output was updated with the verifier's agreement table
    agreement = payload["agreement"]
    assert agreement["ok"] is True and agreement["mode"] == "exact"
    assert {r["leaf"]: r["status"] for r in agreement["rows"]} == \
        {"a": "pass", "b": "pass", "c": "pass"}
    assert "<svg" in graph_out.data["text/html"] and "sg-agreement-row" in \
        graph_out.data["text/html"]
    assert graph_out.data["text/plain"].startswith("symgrad graph: 3 op nodes, 3 leaves")
    # the Inspector is a separate output: a widget view, never in the graph's bundle
    assert WIDGET_MIME in widget_out.data and GRAPH_MIME not in widget_out.data
    model_id = widget_out.data[WIDGET_MIME]["model_id"]
    # one picture per cell: the graph names its Inspector twin (the labextension hides it
    # while that Inspector is live), and the Inspector's output is live-only (left out of
    # the file the labextension saves)
    assert graph_out.metadata == {"symgrad": {"inspector": model_id}}
    assert widget_out.metadata == {"symgrad": {"live": True}}
    state = executed.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    model = state[model_id]["state"]
    assert model["status"] == "done" and model["selected"] == payload["roots"][0]
    assert "graph" not in model and "report" not in model  # saved once, in the graph output
    # the cell's own result is unchanged
    assert result.data["text/plain"] == "tensor(100., grad_fn=<MulBackward0>)"
    assert outputs(executed, 3)[0].data["text/plain"] == "(tensor(20.), tensor(25.))"


def test_roots_found_without_a_final_expression(executed):
    outs = outputs(executed, 4)
    assert [o.output_type for o in outs] == ["display_data", "display_data"]
    payload = outs[0].data[GRAPH_MIME]
    jsonschema.validate(payload, load_schema())
    # f is an input of g, so g alone is the root; --no-verify leaves the table out
    assert payload["root_names"] == ["g"] and payload["agreement"] is None
    assert [n["label"] for n in payload["nodes"] if n["kind"] == "op"] == \
        ["MulBackward0", "SinBackward0", "MulBackward0"]


def test_root_option_and_printed_output(executed):
    outs = outputs(executed, 5)
    assert outs[0].output_type == "stream" and outs[0].text == "hello\n"
    payload = outs[1].data[GRAPH_MIME]
    assert payload["root_names"] == ["e"] and payload["agreement"]["rtol"] == 1e-3


def test_line_magics(executed):
    graph = outputs(executed, 6)[0]
    assert graph.output_type == "execute_result"
    assert set(graph.data) == {GRAPH_MIME, "text/html", "text/plain"}
    jsonschema.validate(graph.data[GRAPH_MIME], load_schema())
    saved = outputs(executed, 7)[0].data
    assert "MulBackward0 (e)._saved_other [] = 25.  same object as d (freed by backward)" \
        in saved["text/plain"]
    assert "sg-saved-row" in saved["text/html"]
    report = outputs(executed, 8)[0].data
    assert REPORT_MIME in report and report[REPORT_MIME]["ok"] is True
    assert report[REPORT_MIME]["tolerances"]["float32"]["rtol"] == 1e-5
    node = outputs(executed, 9)[0].data  # a grad_fn displays as the graph bundle
    assert GRAPH_MIME in node and node["text/plain"].startswith("<MulBackward0 object at")


def test_xss_in_notebook_outputs(executed):
    for i in (11,):
        for o in outputs(executed, i):
            for mime, value in o.get("data", {}).items():
                if mime in ("text/html",):
                    assert "<img" not in value
                    assert "&lt;img src=x onerror=alert(1)&gt;" in value
    payload = outputs(executed, 11)[0].data[GRAPH_MIME]
    assert any(lf["name"] == XSS for lf in payload["leaves"])


def test_errors_in_the_cell_propagate(executed):
    outs = outputs(executed, 12)
    assert [o.output_type for o in outs] == ["error"]
    assert outs[0].ename == "ValueError" and outs[0].evalue == "boom from the cell"
    # statements before the error ran in the user namespace
    assert outputs(executed, 13)[0].data["text/plain"] == "1"
