"""Generated Python modules and cached records as real files, checked before they are used.

Numba keys its on-disk cache by the source file (path and contents): a generated module is
written once under a name derived from the hash of its text and imported from there; a
second process generating the same text finds the file and Numba's cache index next to it,
and compiles nothing. Used by the CPU backend's stanza loops and by ``sg.compile``.

Nothing read back from a cache directory is trusted by its name alone:

- a module is executed from the text the caller generated, after the file was compared
  with it byte for byte (a file holding anything else is replaced; Python's own bytecode
  cache is never used for these modules);
- records (JSON proofs, derivations) and Numba's index and data files (pickles) of the
  modules ``sg.compile`` generates are *sealed*: written atomically (a temp file renamed
  over the name) with a header holding the SHA-256 of their content, and checked against it
  before they are parsed or unpickled; a file that fails (no header: foreign or left by an
  older symgrad; truncated, altered) is deleted with one :class:`CacheWarning` and
  regenerated;
- a cache directory is used only when it is private: created 0700, owned by this user, not
  writable by group or others, and no parent that another user could rename it through
  (:func:`private_dir`). Otherwise the caller uses :func:`process_dir`, a fresh 0700
  directory of this process (removed at exit): no disk cache, never a predictable path.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import importlib.util
import io
import os
import pickle
import re
import shutil
import stat
import sys
import tempfile
import warnings

__all__ = ["CacheWarning", "import_text", "writable", "private_dir", "process_dir",
           "read_sealed", "write_sealed", "seal_numba_dir", "read_record", "write_record",
           "guard_numba_cache"]


class CacheWarning(UserWarning):
    """A cached artefact was damaged or foreign (it was deleted and regenerated), or no
    private cache directory exists (the process runs without a disk cache)."""


_WARNED: set = set()


def warn_once(key, message: str) -> None:
    """One warning per ``key`` per process."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(message, CacheWarning, stacklevel=3)


def writable(path: str) -> bool:
    """Can files be created in ``path`` (made if missing)? Tried, not guessed from modes."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            return True
    except OSError:
        return False


# -- private directories -------------------------------------------------------------------
def private_dir(path: str) -> str | None:
    """Make ``path`` (mode 0700 when created) and check that only this user can change what
    is in it: None when it is safe to keep a cache there, else why not. Its owner must be
    this user and it must not be writable by group or others; each parent must belong to
    this user or root and be writable by no other user unless sticky (as ``/tmp``; group
    write is accepted for the user's own primary group, as with per-user groups and umask
    002), so no other user can swap the directory. Missing parents are made 0700 too.
    Group/other read bits of a directory of ours are cleared (best effort)."""
    path = os.path.abspath(path)
    uid = os.getuid()
    try:
        missing, p = [], path
        while not os.path.lexists(p):
            missing.append(p)
            p = os.path.dirname(p)
        for p in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(p, 0o700)
        st = os.stat(path)
    except OSError as exc:
        return f"cannot be created ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    parent = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            pst = os.stat(parent)
        except OSError as exc:
            return f"parent {parent} cannot be read ({exc.strerror or exc})"
        if pst.st_uid not in (uid, 0):
            return f"parent {parent} is owned by another user (uid {pst.st_uid})"
        if not pst.st_mode & stat.S_ISVTX and (pst.st_mode & 0o002 or (
                pst.st_mode & 0o020 and pst.st_gid != os.getgid())):
            return f"parent {parent} is writable by other users"
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if st.st_mode & 0o077:
        try:
            os.chmod(path, 0o700)
        except OSError:
            pass
    if not writable(path):
        return "not writable"
    return None


_PROCESS_DIRS: dict = {}


def process_dir(kind: str) -> str:
    """This process's own cache directory for ``kind`` (``mkdtemp``: 0700, a random name),
    removed at exit: the no-disk-cache case."""
    path = _PROCESS_DIRS.get(kind)
    if path is None or not os.path.isdir(path):
        path = _PROCESS_DIRS[kind] = tempfile.mkdtemp(prefix=f"symgrad-{kind}-")
        atexit.register(shutil.rmtree, path, True)
    return path


# -- sealed files ----------------------------------------------------------------------
_MAGIC = b"symgrad-sealed-1 sha256="
#: the Numba cache files sealed: those of the modules sg.compile generates (the index and
#: data files are named after the module's stem); others are left to Numba as they are
_SEALED_NUMBA = re.compile(r"symgrad_(step|loops|cudafused)_[0-9a-f]{20}\.")


_SEALED_DIRS: set = set()


def seal_numba_dir(path: str) -> None:
    """Seal every Numba cache file under ``path`` too (a directory symgrad chose for Numba:
    the CPU backend's fallback ``NUMBA_CACHE_DIR``)."""
    _SEALED_DIRS.add(os.path.realpath(path))


def _sealed_numba(path: str) -> bool:
    if _SEALED_NUMBA.match(os.path.basename(path)):
        return True
    if not _SEALED_DIRS:
        return False
    real = os.path.realpath(os.path.dirname(path))
    return any(real == d or real.startswith(d + os.sep) for d in _SEALED_DIRS)


def _tag(payload: bytes) -> bytes:
    return hashlib.sha256(payload).hexdigest().encode()


def write_sealed(path: str, payload: bytes) -> bool:
    """Write ``payload`` with its seal, atomically (a temp file renamed over ``path``);
    False where the directory is not writable."""
    folder = os.path.dirname(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".",
                                   suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(_MAGIC + _tag(payload) + b"\n" + payload)
        os.replace(tmp, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        return False


def discard(path: str, what: str, why: str) -> None:
    """Delete a damaged or foreign cached file, with one warning."""
    with contextlib.suppress(OSError):
        os.remove(path)
    warnings.warn(f"symgrad cache: {what} {path} {why}; it was deleted and is regenerated",
                  CacheWarning, stacklevel=3)


def read_sealed(path: str, what: str) -> bytes | None:
    """The payload of a sealed file; None where it is missing, or (deleted, with a warning)
    not sealed by this cache or not what was sealed."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        discard(path, what, f"could not be read ({exc.strerror or exc})")
        return None
    head, sep, payload = data.partition(b"\n")
    if not sep or not head.startswith(_MAGIC):
        discard(path, what, "was not written by this cache (no seal)")
        return None
    if not hmac.compare_digest(head[len(_MAGIC):], _tag(payload)):
        discard(path, what, "does not match the hash recorded when it was written "
                "(truncated, altered or foreign)")
        return None
    return payload


def read_record(path: str, what: str, valid=None):
    """A JSON record written by :func:`write_record`: None where missing or damaged (then
    deleted with one warning). ``valid(data)`` returns None, "stale" (silently redone) or
    why the data cannot be used."""
    import json

    payload = read_sealed(path, what)
    if payload is None:
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        discard(path, what, "is not valid JSON")
        return None
    problem = valid(data) if valid is not None else None
    if problem == "stale":
        return None
    if problem is not None:
        discard(path, what, f"is malformed ({problem})")
        return None
    return data


def write_record(path: str, data) -> bool:
    """Keep ``data`` (JSON) at ``path``, sealed."""
    import json

    return write_sealed(path, json.dumps(data, sort_keys=True).encode())


# -- Numba's cache files --------------------------------------------------------------
def guard_numba_cache() -> None:
    """Seal Numba's cache index and data files (pickles) of the generated step modules (and
    all under a ``seal_numba_dir``) and check them before Numba unpickles them: a damaged
    or foreign one is deleted (one warning) and Numba compiles again. Other functions'
    files are left as Numba has them."""
    from numba.core import caching

    cls = caching.IndexDataCacheFile
    if cls.__dict__.get("_symgrad_guarded"):
        return
    load_index, load_data, open_for_write = (cls._load_index, cls._load_data,
                                             cls._open_for_write)

    def _load_index(self):
        path = self._index_path
        if not _sealed_numba(path):
            return load_index(self)
        payload = read_sealed(path, "Numba cache index")
        if payload is None:
            return {}
        try:
            fh = io.BytesIO(payload)
            version = pickle.load(fh)
            if version != self._version:
                return {}
            stamp, overloads = pickle.loads(fh.read())
        except Exception as exc:  # sealed by us, yet unreadable: a Numba change
            discard(path, "Numba cache index", f"could not be read ({type(exc).__name__})")
            return {}
        return overloads if stamp == self._source_stamp else {}

    def _load_data(self, name):
        path = self._data_path(name)
        if not _sealed_numba(path):
            return load_data(self, name)
        payload = read_sealed(path, "Numba cache data")
        if payload is None:
            raise FileNotFoundError(path)  # Numba's load() then compiles again
        try:
            return pickle.loads(payload)
        except Exception as exc:
            discard(path, "Numba cache data", f"could not be read ({type(exc).__name__})")
            raise FileNotFoundError(path) from None

    @contextlib.contextmanager
    def _open_for_write(self, filepath):
        if not _sealed_numba(filepath):
            with open_for_write(self, filepath) as fh:
                yield fh
            return
        buf = io.BytesIO()
        yield buf
        if not write_sealed(filepath, buf.getvalue()):
            raise OSError(f"cannot write {filepath}")

    cls._load_index, cls._load_data = _load_index, _load_data
    cls._open_for_write = _open_for_write
    cls._symgrad_guarded = True


# -- generated modules -------------------------------------------------------------------
def import_text(text: str, folder: str, stem: str, modname: str | None = None):
    """Import the module with this text from ``folder/<stem>_<hash>.py`` (written if not
    there yet or holding anything else; a private temp dir where ``folder`` is read-only).
    The code executed is ``text`` itself, compiled here; the file exists for Numba's cache
    and for reading the source back, and is checked to hold exactly ``text`` first.
    ``modname`` defaults to the file's stem; a module already imported under that name is
    returned as it is."""
    digest = hashlib.sha1(text.encode()).hexdigest()[:20]
    name = f"{stem}_{digest}"
    modname = modname or name
    mod = sys.modules.get(modname)
    if mod is not None:
        return mod
    if not writable(folder):
        folder = process_dir("modules")
    path = os.path.join(folder, f"{name}.py")
    data = text.encode()
    try:
        with open(path, "rb") as fh:
            old = fh.read()
    except FileNotFoundError:
        old = None
    except OSError:
        old = b""
    if old != data:
        if old is not None:
            discard(path, "generated module", "does not hold the code it is named for "
                    f"({len(old)} bytes instead of {len(data)}, or altered)")
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)  # atomic: concurrent processes write the same text
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
    if "numba" in text:
        guard_numba_cache()
    code = compile(text, path, "exec")
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    try:
        exec(code, mod.__dict__)  # noqa: S102  (the text we were given, not the file)
    except BaseException:
        del sys.modules[modname]  # never leave a half-run module to be found later
        raise
    return mod
