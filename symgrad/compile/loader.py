"""Generated modules as real files under a cache dir, so Numba's ``cache=True`` works.

The file handling is symgrad/_codefiles.py's, shared with the CPU backend's generated
loops; this module only chooses the cache directory.
"""

from __future__ import annotations

import os
import tempfile

from .._codefiles import import_text, writable

__all__ = ["cache_dir", "load"]


def cache_dir() -> str:
    """``$SYMGRAD_COMPILE_CACHE``, else ``~/.cache/symgrad/compile``, else a temp dir."""
    explicit = os.environ.get("SYMGRAD_COMPILE_CACHE")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for cand in (explicit, os.path.join(base, "symgrad", "compile"),
                 os.path.join(tempfile.gettempdir(), f"symgrad-compile-{os.getuid()}")):
        if cand and writable(cand):
            return cand
    return tempfile.mkdtemp(prefix="symgrad-compile-")


def load(text: str):
    """Import the module with this text (written to ``cache_dir()`` if not there yet)."""
    return import_text(text, cache_dir(), "symgrad_step")
