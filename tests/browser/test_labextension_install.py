"""The installed package carries the prebuilt JupyterLab extension and the Inspector's
loader; the Inspector's drawing code is in the extension only."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import symgrad

PKG = Path(symgrad.__file__).parent


def test_labextension_paths_point_at_the_build():
    paths = symgrad._jupyter_labextension_paths()
    assert paths == [{"src": "labextension", "dest": "symgrad"}]
    meta = json.loads((PKG / paths[0]["src"] / "package.json").read_text())
    assert meta["name"] == "symgrad"
    assert meta["jupyterlab"]["mimeExtension"]  # a MIME renderer (the built entry point)
    # and an application plugin: notebooks are saved without the live-only Inspector
    assert meta["jupyterlab"]["extension"]
    assert meta["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")
    assert (PKG / "labextension" / "install.json").exists()


def test_jupyter_lists_symgrad_enabled():
    out = subprocess.run([sys.executable, "-m", "jupyter", "labextension", "list"],
                         capture_output=True, text=True, timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    line = next((ln for ln in text.splitlines() if ln.strip().startswith("symgrad ")), None)
    assert line is not None, text
    assert f"v{symgrad.__version__}" in line and "enabled" in line and "OK" in line, line


def test_inspector_front_end_is_the_labextension_and_a_small_loader():
    from symgrad.jupyter.widget import API_KEY, Inspector

    # the saved part: a loader of under a kilobyte, no drawing code
    assert len(Inspector._esm) < 1000 and "export default" in Inspector._esm
    assert f"Symbol.for('{API_KEY}')" in Inspector._esm
    # the drawing code: in the labextension, which registers the view under that key
    static = PKG / "labextension" / "static"
    assert any(API_KEY in f.read_text(errors="replace") for f in static.glob("*.js"))
    assert not (PKG / "jupyter" / "static" / "inspector.js").exists()
