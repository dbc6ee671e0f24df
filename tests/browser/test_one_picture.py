"""One picture per ``%%symgrad`` cell, and a notebook saved from the live UI reopens clean,
in JupyterLab 4 and in Notebook 7 (issue 29, scopes 3 and 4).

Live, with widgets: each ``%%symgrad`` cell shows exactly one graph and one agreement
table (the Inspector's); the static graph output stays in the page, hidden. Saved with
Ctrl+S: the file holds the static graph with its verdicts and no widget view. Reopened
with no kernel and with a fresh kernel: the graph and its agreement table are drawn, no
"Error displaying widget", nothing in the console. The assertions read the rendered page:
visibility, text, attributes.
"""

from __future__ import annotations

import json
import time
import urllib.error
from pathlib import Path

import nbformat
import pytest

GRAPH_MIME = "application/vnd.symgrad.graph+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
GRAPH = ".sg-view[data-symgrad=graph]"
AGREEMENT = "[data-symgrad=agreement]"
# Notebook 7.6's keyboard-shortcut settings plugin raises this on every page load, with
# or without the symgrad extension (test_saved_notebooks.py checked it): not ours.
KNOWN_NB7_ERROR = "Cannot read properties of undefined (reading 'schema')"

CELLS = [
    "%load_ext symgrad\nimport symgrad as sg",
    "%%symgrad\n"
    "a = sg.tensor(2.0, requires_grad=True)\n"
    "b = sg.tensor(3.0, requires_grad=True)\n"
    "c = sg.tensor(4.0, requires_grad=True)\n"
    "e = (a + b) * c\n"
    "e.backward()",
    "%%symgrad\n"
    "x = sg.tensor([1.0, -2.0, 3.0], requires_grad=True)\n"
    "w = sg.tensor([0.5, 0.25, 2.0], requires_grad=True)\n"
    "loss = (x * w).sum()\n"
    "loss.backward()",
]
SYMGRAD_CELLS = [1, 2]
# op nodes and leaves of each %%symgrad cell's graph
SHAPES = {1: (2, 3), 2: (2, 2)}


class _Front:
    """What differs between JupyterLab and Notebook 7: the URL of a notebook and how to
    know that its kernel is ready."""

    def __init__(self, name: str, server) -> None:
        self.name, self.server = name, server
        self.n = 0

    def url(self, path: str) -> str:
        self.n += 1
        if self.name == "lab":  # a fresh workspace: nothing restored from the last page
            return f"{self.server.url}/lab/workspaces/pic{self.n}/tree/{path}"
        return f"{self.server.url}/notebooks/{path}"

    def wait_kernel_idle(self, page) -> None:
        if self.name == "lab":
            # the execution indicator says idle before the kernel is attached; the status
            # bar text does not
            page.wait_for_selector("#jp-main-statusbar >> text=/Idle/", timeout=60_000)
            return
        # Notebook 7 has no status bar: ask the server, then give the page a moment
        deadline = time.monotonic() + 60
        while True:
            try:
                kernels = self.server.api("GET", "/api/kernels")
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise
                kernels = []
            if kernels and all(k["execution_state"] == "idle" for k in kernels):
                break
            assert time.monotonic() < deadline, f"no idle kernel: {kernels}"
            time.sleep(0.25)
        time.sleep(1.0)

    def stop_kernels(self) -> None:
        for session in self.server.api("GET", "/api/sessions"):
            self.server.api("DELETE", f"/api/sessions/{session['id']}")
        assert self.server.api("GET", "/api/kernels") == []


@pytest.fixture(params=["lab", "nb7"])
def front(request) -> _Front:
    server = request.getfixturevalue("lab_server" if request.param == "lab"
                                     else "notebook_server")
    return _Front(request.param, server)


def _open(browser, url: str):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.errors = []
    page.console_errors = []
    page.on("pageerror", lambda e: page.errors.append(f"{e}\n{e.stack}"))
    page.on("console", lambda m: page.console_errors.append(m.text)
            if m.type == "error" else None)
    page.goto(url)
    page.wait_for_selector(".jp-Notebook .jp-Cell", state="attached", timeout=60_000)
    return page


def _problems(page) -> list[str]:
    """Page errors and console errors, less Notebook 7's own known one."""
    return [e for e in page.errors + page.console_errors if KNOWN_NB7_ERROR not in e]


def _visible(locator) -> list:
    return [locator.nth(i) for i in range(locator.count()) if locator.nth(i).is_visible()]


def _wait_saved(path: Path, timeout: float = 30) -> dict:
    """The notebook file once every %%symgrad cell has a graph output with verdicts."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            nb = json.loads(path.read_text())
        except json.JSONDecodeError:  # caught mid-write
            nb = {"cells": []}
        done = [i for i in SYMGRAD_CELLS if i < len(nb["cells"]) and any(
            (o.get("data", {}).get(GRAPH_MIME) or {}).get("agreement")
            for o in nb["cells"][i].get("outputs", []))]
        if done == SYMGRAD_CELLS:
            return nb
        if time.monotonic() > deadline:
            raise AssertionError(f"not saved with verdicts: cells {done} of {SYMGRAD_CELLS}")
        time.sleep(0.25)


def _check_drawn_from_file(page, front: _Front, shot: Path) -> None:
    """The reopened notebook: the saved graph and its agreement table, drawn."""
    for i in SYMGRAD_CELLS:
        cell = page.locator(".jp-Notebook .jp-Cell").nth(i)
        cell.scroll_into_view_if_needed()
        graph = cell.locator(f".jp-OutputArea-output {GRAPH}")
        graph.locator("[data-symgrad=overall]").wait_for(state="visible", timeout=30_000)
        assert len(_visible(cell.locator(GRAPH))) == 1, i
        assert graph.get_attribute("data-state") == "ready", i
        assert graph.locator("[data-symgrad=overall]").get_attribute("data-status") == \
            "pass", i
        ops, leaves = SHAPES[i]
        assert graph.locator(".sg-node[data-kind=op]").count() == ops, i
        assert graph.locator(".sg-node[data-kind=accumulate]").count() == leaves, i
        table = graph.locator(AGREEMENT)
        assert table.is_visible(), i
        assert table.locator("tbody tr").count() == leaves, i
        assert "gradients agree" in graph.locator("[data-symgrad=overall]").inner_text()
        assert cell.locator(".symgrad-inspector").count() == 0, i
    assert page.get_by_text("Error displaying widget").count() == 0
    assert page.get_by_text("model not found").count() == 0
    page.locator(".jp-Notebook .jp-Cell").nth(1).screenshot(path=str(shot))
    # console errors come late (a widget manager that misses a model logs after drawing)
    page.wait_for_timeout(1500)
    assert _problems(page) == []


def test_one_graph_per_cell_and_saved_notebook_reopens_clean(browser, front, artifacts):
    t0 = time.monotonic()
    root = front.server.root
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = root / f"one_picture_{front.name}.ipynb"
    nbformat.write(nb, path)

    # -- live: one graph per %%symgrad cell, the Inspector's ---------------------------
    page = _open(browser, front.url(path.name))
    front.wait_kernel_idle(page)
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputArea-editor").click()
    for _ in CELLS:
        page.keyboard.press("Shift+Enter")
    for i in SYMGRAD_CELLS:
        cell = page.locator(".jp-Notebook .jp-Cell").nth(i)
        cell.locator(".symgrad-inspector [data-symgrad=status][data-status=done]").wait_for(
            state="attached", timeout=120_000)
        cell.locator(f".symgrad-inspector {GRAPH} .sg-node").first.wait_for(
            state="visible", timeout=60_000)
        cell.scroll_into_view_if_needed()
        graphs = _visible(cell.locator(GRAPH))
        assert len(graphs) == 1, (i, len(graphs))
        assert graphs[0].evaluate("el => !!el.closest('.symgrad-inspector')"), i
        assert len(_visible(cell.locator("svg.symgrad-graph"))) == 0, i  # no static SVG
        assert len(_visible(cell.locator(AGREEMENT))) == 1, i
        # the static graph is still there (the file keeps it), hidden, with its verdicts
        static = cell.locator(".sg-mime[data-sg-twin]")
        assert static.count() == 1, i
        assert not static.is_visible(), i
        assert static.locator("[data-symgrad=overall]").get_attribute("data-status") == "pass"
        ops, leaves = SHAPES[i]
        assert graphs[0].locator(".sg-node[data-kind=op]").count() == ops
        assert graphs[0].locator(".sg-node[data-kind=accumulate]").count() == leaves
    page.mouse.move(1, 1)
    page.screenshot(path=str(artifacts / f"{front.name}-one-picture-live.png"))
    assert page.get_by_text("Error displaying widget").count() == 0
    assert _problems(page) == []

    # -- Ctrl+S: the file holds the static graph with verdicts, no widget view ----------
    page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-InputPrompt").click()
    page.keyboard.press("Control+s")
    saved = _wait_saved(path)
    for i in SYMGRAD_CELLS:
        outputs = saved["cells"][i]["outputs"]
        assert [o for o in outputs if WIDGET_MIME in o.get("data", {})] == [], i
        graphs = [o for o in outputs if GRAPH_MIME in o.get("data", {})]
        assert len(graphs) == 1, i
        assert graphs[0]["data"][GRAPH_MIME]["agreement"]["ok"] is True, i
        assert "text/html" in graphs[0]["data"] and "text/plain" in graphs[0]["data"]
    page.close()
    front.stop_kernels()

    # -- reopened with no kernel --------------------------------------------------------
    copy = dict(saved, metadata={k: v for k, v in saved["metadata"].items()
                                 if k not in ("kernelspec", "language_info")})
    nokernel = root / f"one_picture_{front.name}_nokernel.ipynb"
    nokernel.write_text(json.dumps(copy))
    page = _open(browser, front.url(nokernel.name))
    page.locator(".jp-Dialog .jp-Dialog-button", has_text="No Kernel").click(timeout=30_000)
    page.locator(".jp-Dialog").wait_for(state="detached", timeout=30_000)
    _check_drawn_from_file(page, front, artifacts / f"{front.name}-reopened-no-kernel.png")
    assert front.server.api("GET", "/api/kernels") == []
    page.close()

    # -- reopened with a (fresh) kernel ---------------------------------------------------
    page = _open(browser, front.url(path.name))
    front.wait_kernel_idle(page)
    _check_drawn_from_file(page, front, artifacts / f"{front.name}-reopened-kernel.png")
    page.close()
    front.stop_kernels()
    print(f"\n{front.name}: one picture, save and reopen: {time.monotonic() - t0:.1f} s")
