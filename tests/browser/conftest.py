"""Fixtures for the labextension's browser tests: headless Debian chromium (Playwright),
and a JupyterLab 4 and a Notebook 7 server, each on a free loopback port with a temporary
root and settings dir.

`make test` installs chromium (apt) and the `test` extra (JupyterLab, Notebook 7); a server
is stopped through its own process group at the end of the session.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api")
pytest.importorskip("jupyterlab")

from playwright.sync_api import Browser, sync_playwright  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# What headless Chromium needs as root on a machine without network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    def __init__(self, url: str, root: Path, proc: subprocess.Popen, log: Path) -> None:
        self.url, self.root, self.proc, self.log = url, root, proc, log

    def api(self, method: str, path: str) -> object:
        req = urllib.request.Request(self.url + path, method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
        return json.loads(body) if body else None

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:]


def _this_labextension(base: Path, env: dict[str, str]) -> None:
    """Serve the labextension built in this checkout (``symgrad/labextension``): a data
    dir first on JUPYTER_PATH links to it. With the usual editable install that is the
    build the venv links to anyway; from a second checkout (a git worktree sharing
    another's venv) it is this checkout's build, as PYTHONPATH makes the kernels import
    this checkout's symgrad."""
    build = REPO / "symgrad" / "labextension"
    if not (build / "package.json").exists():
        return  # no build here: the installed labextension serves
    data = base / "jupyter-data"
    (data / "labextensions").mkdir(parents=True)
    (data / "labextensions" / "symgrad").symlink_to(build, target_is_directory=True)
    env["JUPYTER_PATH"] = os.pathsep.join(
        [str(data), *filter(None, [os.environ.get("JUPYTER_PATH")])])


def _serve(tmp_path_factory: pytest.TempPathFactory, module: str,
           extra_args: list[str]) -> Iterator[LabServer]:
    """``python -m <module>`` (jupyterlab or notebook) on a free port, until the session ends."""
    base = tmp_path_factory.mktemp(module)
    root = base / "root"
    settings = base / "settings"
    root.mkdir()
    # A news toast would cover the bottom right of every page.
    notif = settings / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
               JUPYTER_CONFIG_DIR=str(base / "config"), PYTHONPATH=str(REPO))
    _this_labextension(base, env)
    port = _free_port()
    log = base / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--no-browser", "--allow-root",
             "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
             "--ServerApp.port_retries=0", "--ServerApp.token=", "--ServerApp.password=",
             "--ServerApp.disable_check_xsrf=True", *extra_args,
             f"--ServerApp.root_dir={root}"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = LabServer(f"http://127.0.0.1:{port}", root, proc, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{module} exited ({proc.returncode}):\n{server.log_tail()}")
            try:
                with urllib.request.urlopen(f"{server.url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{module} did not start in 60 s:\n{server.log_tail()}")
            time.sleep(0.25)
        yield server
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        if ARTIFACTS.exists():
            shutil.copy(log, ARTIFACTS / f"{module}-server.log")


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab 4: notebooks at /lab/tree/<path>."""
    yield from _serve(tmp_path_factory, "jupyterlab", ["--LabApp.expose_app_in_browser=True"])


@pytest.fixture(scope="session")
def notebook_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """Notebook 7: notebooks at /notebooks/<path>."""
    pytest.importorskip("notebook")
    yield from _serve(tmp_path_factory, "notebook", [])


@pytest.fixture(scope="session")
def ten_cells(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The saved notebook of tests/test_notebook_size.py: ten ``%%symgrad`` cells run by
    nbclient (widget state stored, as ``make demo`` does), with no kernel metadata, so
    that opening it starts no kernel."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from test_notebook_size import execute_ten_cells
    finally:
        sys.path.remove(str(REPO / "tests"))
    path = tmp_path_factory.mktemp("ten") / "ten_cells.ipynb"
    execute_ten_cells(path, kernel_metadata=False)
    return path
