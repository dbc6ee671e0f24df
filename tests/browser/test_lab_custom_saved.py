"""JupyterLab: a custom Function's node panel lists what its forward saved.

``ctx.save_for_backward(x, y)`` and ``ctx.w = w`` show as rows ``saved_tensors[0]``,
``saved_tensors[1]`` and ``w`` (with shapes and values) in the labextension's node panel,
before backward (``%symgrad graph``) and after it in a ``%%symgrad`` cell (freed, the saved
input still shown from the recorded input); never "nothing saved".
"""

from __future__ import annotations

import nbformat

CELLS = [
    "%load_ext symgrad\nimport symgrad as sg",
    "class Scale(sg.autograd.Function):\n"
    "    @staticmethod\n"
    "    def forward(ctx, x, w):\n"
    "        y = x * w\n"
    "        ctx.save_for_backward(x, y)\n"
    "        ctx.w = w\n"
    "        return y\n"
    "    @staticmethod\n"
    "    def backward(ctx, g):\n"
    "        x, y = ctx.saved_tensors\n"
    "        return g * ctx.w, g * x\n"
    "x = sg.tensor([1.0, 2.0, 3.0], requires_grad=True)\n"
    "w = sg.tensor([4.0, 5.0, 6.0], requires_grad=True)\n"
    "loss = Scale.apply(x, w).sum()\n"
    "%symgrad graph loss",
    "%%symgrad\n"
    "u = sg.tensor([1.5, -2.0], requires_grad=True)\n"
    "v = sg.tensor([0.5, 0.25], requires_grad=True)\n"
    "out = Scale.apply(u, v).sum()\n"
    "out.backward()",
]


def _panel_rows(page, cell: int, live: bool = False) -> dict[str, list[str]]:
    """The saved-operand rows of the custom node's panel, in the picture the user sees: in
    a ``%%symgrad`` cell (``live``) the Inspector's (its static twin is hidden), else the
    graph output's."""
    where = page.locator(".jp-Notebook .jp-Cell").nth(cell)
    if live:
        where = where.locator(".symgrad-inspector")
    graph = where.locator(".sg-view[data-symgrad=graph]").first
    node = graph.locator(".sg-node[data-kind=op]", has_text="ScaleBackward")
    node.wait_for(state="visible", timeout=120_000)
    node.scroll_into_view_if_needed()
    node.click()
    panel = graph.locator("[data-symgrad=node-panel]")
    assert panel.get_attribute("data-selected") == node.get_attribute("data-node-id")
    assert "nothing saved" not in panel.text_content()
    rows = panel.locator("[data-symgrad=saved-operands] tbody tr")
    out = {}
    for i in range(rows.count()):
        tr = rows.nth(i)
        out[tr.get_attribute("data-saved-name")] = [
            " ".join(t.split()) for t in tr.locator("td").all_text_contents()]
    return out


def test_custom_function_saved_operands_in_jupyterlab(browser, lab_server, artifacts):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, lab_server.root / "custom_saved.ipynb")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{lab_server.url}/lab/workspaces/custom/tree/custom_saved.ipynb")
    page.wait_for_selector(".jp-Notebook .jp-Cell", state="attached", timeout=60_000)
    page.wait_for_selector("#jp-main-statusbar >> text=/Idle/", timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputArea-editor").click()
    for _ in CELLS:
        page.keyboard.press("Shift+Enter")

    # before backward: the saved tensors themselves
    rows = _panel_rows(page, 1)
    assert list(rows) == ["saved_tensors[0]", "saved_tensors[1]", "w"]
    assert rows["saved_tensors[0]"][:5] == ["saved_tensors[0]", "tensor", "[3]", "float32",
                                            "[1., 2., 3.]"]
    assert rows["saved_tensors[0]"][5] == "same object as x"
    assert rows["saved_tensors[1]"][:5] == ["saved_tensors[1]", "tensor", "[3]", "float32",
                                            "[4., 10., 18.]"]
    assert rows["saved_tensors[1]"][5] == "this node’s output"
    assert rows["w"][:5] == ["w", "tensor", "[3]", "float32", "[4., 5., 6.]"]
    assert rows["w"][5] == "same object as w"
    page.mouse.move(1, 1)
    page.locator(".jp-Notebook .jp-Cell").nth(1).screenshot(
        path=str(artifacts / "lab-custom-saved.png"))

    # after backward in a %%symgrad cell: freed, the saved input shown from the record
    rows = _panel_rows(page, 2, live=True)
    assert list(rows) == ["saved_tensors[0]", "saved_tensors[1]", "w"]
    assert rows["saved_tensors[0]"][1:4] == ["freed", "[2]", "float32"]
    assert rows["saved_tensors[0]"][5] == "same object as u"
    assert rows["saved_tensors[1]"][1] == "freed"
    assert rows["w"][:5] == ["w", "tensor", "[2]", "float32", "[0.5, 0.25]"]
    assert errors == []
    page.close()
