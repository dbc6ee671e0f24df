"""The light saved notebook, reopened with no kernel in JupyterLab 4 and Notebook 7, and
the live Inspector in Notebook 7.

The notebook is tests/test_notebook_size.py's: ten ``%%symgrad`` cells executed by
nbclient (widget state stored) and saved, under 200 KB. Opened with no kernel (it has no
kernel metadata, and the kernel dialog is answered "No Kernel"), every graph output must
be drawn by the labextension with its verdicts, not shown as the text or HTML fallback,
and the page must raise no error. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error

GRAPH_MIME = "application/vnd.symgrad.graph+json"
GRAPH = ".jp-OutputArea-output .sg-view[data-symgrad=graph]"


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.errors = []
    page.dialogs = []
    page.on("pageerror", lambda e: page.errors.append(f"{e}\n{e.stack}"))
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(url)
    page.wait_for_selector(".jp-Notebook .jp-Cell", state="attached", timeout=60_000)
    return page


# Notebook 7.6's keyboard-shortcut settings plugin raises this on every page load, with
# or without the symgrad extension (checked with it disabled): not ours to fail on.
KNOWN_NB7_ERROR = "Cannot read properties of undefined (reading 'schema')"


def _errors(page) -> list[str]:
    return [e for e in page.errors if not (
        e.startswith(KNOWN_NB7_ERROR) and "/static/notebook/notebook_core." in e)]


def _wait_kernel_idle(server, timeout: float = 60) -> None:
    """Notebook 7 has no status bar to read: ask the server until the page's kernel is
    idle, then give the page a moment to attach to it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            kernels = server.api("GET", "/api/kernels")
        except urllib.error.HTTPError as exc:
            # the kernel list can answer 500 while a kernel is being started (seen once in
            # a clean-clone run): ask again, and show the server's log if it never settles
            if exc.code < 500:
                raise
            kernels = f"HTTP {exc.code}\n{server.log_tail()}"
        if isinstance(kernels, list) and kernels and \
                all(k["execution_state"] == "idle" for k in kernels):
            break
        assert time.monotonic() < deadline, f"no idle kernel: {kernels}"
        time.sleep(0.25)
    time.sleep(1.0)


def _no_kernel(page) -> None:
    """Answer the kernel dialog (the notebook names no kernel) with "No Kernel"."""
    button = page.locator(".jp-Dialog .jp-Dialog-button", has_text="No Kernel")
    button.click(timeout=30_000)
    page.locator(".jp-Dialog").wait_for(state="detached", timeout=30_000)


def _op_counts(path) -> list[int]:
    nb = json.loads(path.read_text())
    return [sum(n["kind"] == "op" for n in o["data"][GRAPH_MIME]["nodes"])
            for c in nb["cells"] for o in c.get("outputs", [])
            if GRAPH_MIME in o.get("data", {})]


def _check_saved_graphs(page, server, ten_cells, shot) -> None:
    expected = _op_counts(ten_cells)
    assert len(expected) == 10
    # a notebook window renders cells as they scroll into view: visit each
    for i in range(1, 11):
        cell = page.locator(".jp-Notebook .jp-Cell").nth(i)
        cell.scroll_into_view_if_needed()
        graph = cell.locator(GRAPH)
        graph.locator("[data-symgrad=overall]").wait_for(state="attached", timeout=30_000)
        assert graph.get_attribute("data-state") == "ready", i
        assert graph.locator("[data-symgrad=overall]").get_attribute("data-status") == \
            "pass", i
        ops = graph.locator(".sg-node[data-kind=op]").count()
        assert ops == expected[i - 1], (i, ops)
        assert graph.locator(".sg-node[data-kind=op][data-status=pass]").count() == ops
        # the labextension drew it: no static SVG fallback in the graph output
        assert cell.locator(".jp-OutputArea-output svg.symgrad-graph").count() == 0
    assert server.api("GET", "/api/kernels") == []
    page.locator(".jp-Notebook .jp-Cell").nth(2).screenshot(path=str(shot))
    assert _errors(page) == [] and page.dialogs == []


def test_saved_notebook_reopens_in_jupyterlab(browser, lab_server, ten_cells, artifacts):
    t0 = time.monotonic()
    shutil.copy(ten_cells, lab_server.root / "ten_cells.ipynb")
    page = _open(browser, f"{lab_server.url}/lab/workspaces/saved/tree/ten_cells.ipynb")
    _no_kernel(page)
    _check_saved_graphs(page, lab_server, ten_cells, artifacts / "lab-saved-ten-cells.png")
    page.close()
    print(f"\nJupyterLab, saved ten-cell notebook: {time.monotonic() - t0:.1f} s")


def test_saved_notebook_reopens_in_notebook7(browser, notebook_server, ten_cells,
                                             artifacts):
    t0 = time.monotonic()
    shutil.copy(ten_cells, notebook_server.root / "ten_cells.ipynb")
    page = _open(browser, f"{notebook_server.url}/notebooks/ten_cells.ipynb")
    _no_kernel(page)
    _check_saved_graphs(page, notebook_server, ten_cells, artifacts / "nb7-saved-ten-cells.png")
    page.close()
    print(f"\nNotebook 7, saved ten-cell notebook: {time.monotonic() - t0:.1f} s")


def test_live_inspector_in_notebook7(browser, notebook_server, artifacts):
    import nbformat

    t0 = time.monotonic()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in (
        "%load_ext symgrad\nimport symgrad as sg",
        "%%symgrad\na = sg.tensor(2.0, requires_grad=True)\n"
        "b = sg.tensor(3.0, requires_grad=True)\ne = (a + b) * a\ne.backward()")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, notebook_server.root / "live.ipynb")
    page = _open(browser, f"{notebook_server.url}/notebooks/live.ipynb")
    _wait_kernel_idle(notebook_server)
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    page.keyboard.press("Shift+Enter")
    inspector = page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".symgrad-inspector")
    canvas = inspector.locator(".sg-view[data-symgrad=graph]")
    canvas.locator(".sg-node").first.wait_for(state="attached", timeout=120_000)
    assert canvas.locator(".sg-node[data-kind=op]").count() == 2
    assert inspector.locator("[data-symgrad=status] .sg-badge").get_attribute(
        "data-status") == "pass"
    add = canvas.locator(".sg-node[data-kind=op]", has_text="AddBackward0")
    add.scroll_into_view_if_needed()
    add.click()
    assert canvas.locator("[data-symgrad=node-panel]").get_attribute("data-selected") == \
        add.get_attribute("data-node-id")
    page.mouse.move(1, 1)
    inspector.screenshot(path=str(artifacts / "nb7-inspector.png"))
    assert _errors(page) == [] and page.dialogs == []
    for session in notebook_server.api("GET", "/api/sessions"):
        notebook_server.api("DELETE", f"/api/sessions/{session['id']}")
    page.close()
    print(f"\nNotebook 7, live Inspector: {time.monotonic() - t0:.1f} s")
