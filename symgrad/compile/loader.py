"""Generated modules as real files under a cache dir, so Numba's ``cache=True`` works.

The file handling is symgrad/_codefiles.py's, shared with the CPU backend's generated
loops; this module chooses the cache directory and keeps it bounded: after a load, the
step modules beyond ``max_files()`` are deleted, oldest written first, with their proof
records and compiled caches (modules imported by this process are never deleted).
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile

from .._codefiles import import_text, writable

__all__ = ["cache_dir", "load", "max_files", "MAX_FILES"]

#: generated step modules kept in the cache dir (``$SYMGRAD_COMPILE_CACHE_FILES`` overrides)
MAX_FILES = 256
_STEM = "symgrad_step"


def cache_dir() -> str:
    """``$SYMGRAD_COMPILE_CACHE``, else ``~/.cache/symgrad/compile``, else a temp dir."""
    explicit = os.environ.get("SYMGRAD_COMPILE_CACHE")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for cand in (explicit, os.path.join(base, "symgrad", "compile"),
                 os.path.join(tempfile.gettempdir(), f"symgrad-compile-{os.getuid()}")):
        if cand and writable(cand):
            return cand
    return tempfile.mkdtemp(prefix="symgrad-compile-")


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
