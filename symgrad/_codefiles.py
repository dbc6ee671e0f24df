"""Generated Python modules as real files, so Numba's ``cache=True`` works for them.

Numba keys its on-disk cache by the source file (path and contents): a generated module is
written once under a name derived from the hash of its text and imported from there; a
second process generating the same text finds the file and Numba's cache index next to it,
and compiles nothing. Used by the CPU backend's stanza loops and by ``sg.compile``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile

__all__ = ["import_text", "writable"]


def writable(path: str) -> bool:
    """Can files be created in ``path`` (made if missing)? Tried, not guessed from modes."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            return True
    except OSError:
        return False


def import_text(text: str, folder: str, stem: str, modname: str | None = None):
    """Import the module with this text from ``folder/<stem>_<hash>.py`` (written if not
    there yet; a temp dir where ``folder`` is read-only). ``modname`` defaults to the file's
    stem; a module already imported under that name is returned as it is."""
    digest = hashlib.sha1(text.encode()).hexdigest()[:20]
    name = f"{stem}_{digest}"
    modname = modname or name
    mod = sys.modules.get(modname)
    if mod is not None:
        return mod
    if not writable(folder):
        folder = tempfile.mkdtemp(prefix=f"symgrad-{stem}-")
    path = os.path.join(folder, f"{name}.py")
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
