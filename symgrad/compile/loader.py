"""Generated modules as real files under a cache dir, so Numba's ``cache=True`` works.

The file handling is symgrad/_codefiles.py's, shared with the CPU backend's generated
loops (every file is checked before it is used: modules against the text generated now,
records and Numba's files against the seal written with them); this module chooses the
cache directory, a private one or none, and keeps it bounded: after a load, the step
modules beyond ``max_files()`` are deleted, oldest written first, with their proof
records and compiled caches (modules imported by this process are never deleted).
"""

from __future__ import annotations

import glob
import os
import sys

from .._codefiles import import_text, private_dir, process_dir, warn_once

__all__ = ["cache_dir", "load", "max_files", "MAX_FILES"]

#: generated step modules kept in the cache dir (``$SYMGRAD_COMPILE_CACHE_FILES`` overrides)
MAX_FILES = 256
_STEM = "symgrad_step"


def cache_dir() -> str:
    """``$SYMGRAD_COMPILE_CACHE``, else ``$XDG_CACHE_HOME/symgrad/compile`` (default
    ``~/.cache``), used only if private (``_codefiles.private_dir``: 0700, this user's, no
    other user can write it or swap it); else this process's own temporary directory, so
    no disk cache (said once). Never a shared, predictable path."""
    path = os.environ.get("SYMGRAD_COMPILE_CACHE")
    if not path:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                                ".cache")
        path = os.path.join(base, "symgrad", "compile")
    why = private_dir(path)
    if why is None:
        return path
    warn_once(("no cache", path), f"sg.compile: no disk cache ({path}: {why}); the "
              "generated code is kept for this process only")
    return process_dir("compile")


def max_files() -> int:
    """How many generated step modules the cache dir keeps (at least 1)."""
    try:
        return max(1, int(os.environ.get("SYMGRAD_COMPILE_CACHE_FILES", MAX_FILES)))
    except ValueError:
        return MAX_FILES


def load(text: str):
    """Import the module with this text (written to ``cache_dir()`` if not there yet)."""
    mod = import_text(text, cache_dir(), _STEM)
    path = getattr(mod, "__file__", None)
    if path:
        evict(os.path.dirname(path), max_files())
    return mod


def evict(folder: str, keep: int) -> list[str]:
    """Delete the oldest generated step modules of ``folder`` beyond ``keep`` (by the time
    they were written: rewriting or touching one would make Numba's cache of it stale),
    with their proof record and ``__pycache__`` files. Modules this process imported are
    kept (their source is read again by ``step.verify``). Returns the deleted stems."""
    try:
        files = [(os.stat(p).st_mtime_ns, p) for p in glob.glob(
            os.path.join(glob.escape(folder), f"{_STEM}_*.py"))]
    except OSError:  # another process evicting at the same time
        return []
    if len(files) <= keep:
        return []
    files.sort()
    gone = []
    for _, path in files[:len(files) - keep]:
        stem = os.path.basename(path)[:-3]
        if stem in sys.modules:
            continue
        extra = glob.glob(os.path.join(glob.escape(folder), "__pycache__",
                                       glob.escape(stem) + ".*"))
        for p in [path, os.path.join(folder, stem + ".proof.json"), *extra]:
            try:
                os.remove(p)
            except OSError:  # gone already, or not ours to delete
                pass
        gone.append(stem)
    return gone
