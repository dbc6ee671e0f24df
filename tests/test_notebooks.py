"""Every notebook runs top to bottom on a real kernel (nbclient) and shows what it promises."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat", reason="the jupyter extra (`make test` installs it)")
nbclient = pytest.importorskip("nbclient", reason="the jupyter extra (`make test` installs it)")

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
GRAPH = "application/vnd.symgrad.graph+json"


def execute(name: str):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def text_of(cell) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            parts.append(o.text)
        elif "data" in o:
            parts.append(str(o.data.get("text/plain", "")))
            if "text/latex" in o.data:
                parts.append(o.data["text/latex"])
    return "".join(parts)


def all_text(nb) -> str:
    return "\n".join(text_of(c) for c in nb.cells if c.cell_type == "code")


def graphs(nb) -> list[dict]:
    return [o.data[GRAPH] for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if "data" in o and GRAPH in o.data]


def test_showcase():
    nb = execute("00_showcase.ipynb")
    out = all_text(nb)
    assert "saves d: True" in out
    assert "tensor(4.) tensor(9.)" in out
    gs = graphs(nb)
    assert len(gs) == 2 and all(g["agreement"]["ok"] for g in gs)
    names = {leaf_row["leaf"] for g in gs for leaf_row in g["agreement"]["rows"]}
    assert {"a", "b", "w", "bias"} <= names
    assert "True exact" in out and "cos" in out  # symbolic gradient 2*cos(a[i])


def test_autograd_basics():
    out = all_text(execute("01_autograd_basics.ipynb"))
    assert "tensor([2., 4., 6.])" in out
    assert "tensor([ 6., 12., 18.])" in out and "tensor([0., 0., 0.])" in out
    assert "backward through the graph a second time" in out
    assert "tensor([3.0000, 0.3000, 0.0300])" in out
    assert "False None" in out and "False True" in out
    assert "only change requires_grad flags of leaf" in out


def test_grad_fn_and_saved_operands():
    nb = execute("02_grad_fn_and_saved_operands.ipynb")
    out = all_text(nb)
    assert "<MulBackward0 object at 0x" in out
    assert "AccumulateGrad True" in out and "(None, 0)" in out
    assert "True True" in out and "ExpBackward0 tensor(7.3891" in out
    gs = graphs(nb)
    assert gs and all(g["agreement"]["ok"] for g in gs if g.get("agreement"))


def test_custom_functions():
    nb = execute("03_custom_functions.ipynb")
    out = all_text(nb)
    assert "ExpBackward" in out and "(True,)" in out
    assert "tensor([1.6487, 2.7183])" in out
    assert "after backward" in out
    assert "SmoothClamp: ok in exact mode" in out  # traced forward, no sympy method
    assert "WrongClamp.backward gives a wrong gradient for input 'x'" in out
    g = graphs(nb)[-1]
    assert g["agreement"]["ok"]
    assert {n["name"] for n in g["nodes"]} >= {"ExpBackward", "AddBackward"}


def test_memory():
    out = all_text(execute("04_memory.ipynb"))
    m = re.search(r"parameters: (\d+) bytes = (\d+)", out)
    assert m and m.group(1) == m.group(2) == str((64 * 256 + 256 * 16) * 4)
    assert "backbone still alive: True" in out
    assert "True True" in out and "checkpointed grad: symgrad.Size([128, 128])" in out


def test_training():
    out = all_text(execute("05_training_mlp.ipynb"))
    accs = [float(a) for a in re.findall(r"training accuracy ([\d.]+)%", out)]
    assert len(accs) == 2 and min(accs) >= 97.0
    assert "AddmmBackward0" in out and "Self CPU" in out


def test_finding_a_wrong_gradient():
    nb = execute("06_finding_a_wrong_gradient.ipynb")
    out = all_text(nb)
    assert "MISMATCH" in out and "first bad node: SoftplusBackward" in out
    g = graphs(nb)[-1]
    assert g["agreement"]["ok"] is False
    bad = [n for n in g["nodes"] if (n.get("check") or {}).get("status") in ("fail", "mismatch")]
    assert [n["name"] for n in bad][:1] == ["SoftplusBackward"]


def test_cnn():
    nb = execute("08_cnn.ipynb")
    out = all_text(nb)
    assert "verified: True local" in out
    assert "ConvolutionBackward0" in out and "MaxPool2DWithIndicesBackward0" in out
    g = graphs(nb)[-1]
    assert g["agreement"]["ok"] is True
    names = [n["name"] for n in g["nodes"]]
    assert names.count("ConvolutionBackward0") == 2
    assert names.count("MaxPool2DWithIndicesBackward0") == 2


def test_model_by_module():
    nb = execute("09_model_by_module.ipynb")
    out = all_text(nb)
    losses = [float(v) for v in re.findall(r"step +\d+ +loss ([\d.]+)", out)]
    assert len(losses) == 4 and losses[-1] < losses[0]
    top, depth2, verified, found, depth3, focused = graphs(nb)
    assert top["collapsed"] == ["wte", "wpe", "h", "ln_f", "lm_head"]
    assert {"label": "Block \u00d7 2", "parent": "h", "members": ["h.0", "h.1"]} in top["folds"]
    assert "fold:h.0" in depth2["layout"]["nodes"]  # the blocks drawn as one box
    assert verified["agreement"]["ok"] is True
    assert {m["verdict"] for m in verified["modules"]} == {"ok"}
    assert "first bad node: FastGELUBackward in h.1.mlp.gelu (#" in out
    bad = {"h", "h.1", "h.1.mlp", "h.1.mlp.gelu"}
    for g in (found, depth3):
        assert {m["path"] for m in g["modules"] if m["verdict"] == "bad"} == bad
        assert not any(f["parent"] == "h" for f in g["folds"])  # block 1 differs now
    assert "module:h.1.mlp" in depth3["layout"]["nodes"]
    assert focused["focus"] == "h.1.mlp"
    first = [n for n in focused["nodes"] if n.get("first_bad")]
    assert [(n["name"], n["module"]) for n in first] == [("FastGELUBackward", "h.1.mlp.gelu")]


def test_every_notebook_is_executed_by_a_test():
    source = pathlib.Path(__file__).read_text()
    missing = [p.name for p in sorted(NOTEBOOKS.glob("*.ipynb")) if f'"{p.name}"' not in source]
    assert not missing, f"notebooks no test executes: {missing}"


def test_checking_pytorch_models():
    out = all_text(execute("07_checking_pytorch_models.ipynb"))
    pytest.importorskip("torch", reason="the notebook's torch part needs PyTorch")
    assert "torch available: True" in out
    assert "True exact" in out or "True local" in out
    assert out.strip().endswith("True")


def test_make_demo_entry_point(tmp_path):
    from symgrad import demo

    assert demo.run(out_dir=tmp_path) == 0
    executed = nbformat.read(tmp_path / "00_showcase.ipynb", as_version=4)
    rows = demo.summarize(executed)
    assert len(rows) == 2 and all(r["ok"] for r in rows)
    assert (tmp_path / "00_showcase.html").read_text().count("<html") == 1
    json.dumps(rows)


def test_readme_example_runs():
    readme = (NOTEBOOKS.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "the README has a fenced Python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["w"].grad is not None and namespace["b"].grad is not None
