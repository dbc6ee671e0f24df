"""Generated modules as real files under a cache dir, so Numba's ``cache=True`` works.

Numba keys its on-disk cache by the source file (path and contents), as
symgrad/backends/cpu/kernels.py's ``_generated`` relies on: the module is written once to
a file named by the hash of its text and imported from there; a second process generating
the same text finds the file and Numba's cache index next to it, and compiles nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile

__all__ = ["cache_dir", "load"]


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            return True
    except OSError:
        return False


def cache_dir() -> str:
    """``$SYMGRAD_COMPILE_CACHE``, else ``~/.cache/symgrad/compile``, else a temp dir."""
    explicit = os.environ.get("SYMGRAD_COMPILE_CACHE")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for cand in (explicit, os.path.join(base, "symgrad", "compile"),
                 os.path.join(tempfile.gettempdir(), f"symgrad-compile-{os.getuid()}")):
        if cand and _writable(cand):
            return cand
    return tempfile.mkdtemp(prefix="symgrad-compile-")


def load(text: str):
    """Import the module with this text (written to ``cache_dir()`` if not there yet)."""
    digest = hashlib.sha1(text.encode()).hexdigest()[:20]
    modname = f"symgrad_step_{digest}"
    mod = sys.modules.get(modname)
    if mod is not None:
        return mod
    folder = cache_dir()
    path = os.path.join(folder, f"{modname}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)  # atomic: concurrent processes write the same text
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[modname]  # never leave a half-run module to be found later
        raise
    return mod
