"""sg.compile's disk cache cannot break a step or be poisoned (issue 33, scope 3).

Every artefact kind (the generated step module, its proof record, the fused run's
derivation record, Numba's index and data files of the module) is damaged in each way a
disk, an interrupted write, an edit or another user can damage it; the step must then still
compile (no exception, no eager fallback), equal eager, say so in exactly one
``CacheWarning``, and leave a good file behind (the next load warns no more). A foreign file
with a side effect is never executed or unpickled, and a cache directory that another user
could write is not used at all.

The cache is made once (module fixture) and copied for each test; the generated module is
dropped from ``sys.modules`` so that each test loads it from its copy as a new process
would (a fresh module, fresh Numba dispatchers reading their cache files).
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import shutil
import stat
import sys
import tempfile
import warnings

import numba
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad import _codefiles
from symgrad.compile import loader


def _make(w, opt):
    def chain(x):
        opt.zero_grad()
        h = (x * w).tanh() + 1.0
        loss = ((h * h).sigmoid() * 0.5).sum()
        loss.backward()
        opt.step()
        return loss

    return chain


def _forget() -> None:
    """Drop the generated modules, so the next trace loads them from the disk cache."""
    for name in [n for n in sys.modules if n.startswith("symgrad_step_")]:
        del sys.modules[name]


def _run():
    """A fused, proved SGD step compiled from the current cache dir, three calls, each
    against eager. Returns (step, the CacheWarnings raised on the way)."""
    _forget()
    sg.manual_seed(0)
    w = sg.randn(6, 5, requires_grad=True)
    w_e = sg.tensor(w.detach().numpy().copy(), requires_grad=True)
    step = sg.compile(_make(w, sg.optim.SGD([w], lr=0.1)))
    eager = _make(w_e, sg.optim.SGD([w_e], lr=0.1))
    x = sg.randn(6, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            assert_close(step(x), eager(x), terms=(i + 1) * 32)
            assert_close(w, w_e, terms=(i + 1) * 32)
            assert_close(w.grad, w_e.grad, terms=(i + 1) * 32)
    assert step.stats["traces"] == 1
    assert not step.stats["fallbacks"], step.stats["fallbacks"]  # compiled, not eager
    assert step.stats["proofs"]
    others = [w for w in caught if not issubclass(w.category, _codefiles.CacheWarning)]
    assert not others, [str(w.message) for w in others]
    return step, [str(w.message) for w in caught]


def _files(folder) -> dict:
    """The artefacts of the step in ``folder``: kind -> path (Numba's in the in-tree
    ``__pycache__``, or under ``NUMBA_CACHE_DIR`` where the environment sets one)."""
    folder = str(folder)
    roots = [folder] + ([numba.config.CACHE_DIR] if numba.config.CACHE_DIR else [])

    def one(pattern):
        hits = sorted(p for r in roots for p in glob.glob(os.path.join(r, "**", pattern),
                                                            recursive=True))
        assert hits, pattern
        return hits[0]

    return {"module": one("symgrad_step_*.py"), "proof": one("symgrad_step_*.proof.json"),
            "derivation": one("fwdbwd_*.json"), "index": one("symgrad_step_*fused_0_0*.nbi"),
            "data": one("symgrad_step_*fused_0_0*.nbc")}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    folder = tmp_path_factory.mktemp("template") / "cc"
    old = os.environ.get("SYMGRAD_COMPILE_CACHE")
    os.environ["SYMGRAD_COMPILE_CACHE"] = str(folder)
    try:
        _, caught = _run()
        assert not caught
        files = _files(folder)
        with open(files["module"], "rb") as fh:
            text = fh.read()
    finally:
        if old is None:
            del os.environ["SYMGRAD_COMPILE_CACHE"]
        else:
            os.environ["SYMGRAD_COMPILE_CACHE"] = old
    return folder, text


@pytest.fixture
def cache(template, tmp_path, monkeypatch):
    """A private copy of the template cache, the cache dir of this test: (folder, files,
    the module's text)."""
    src, text = template
    folder = tmp_path / "cc"
    shutil.copytree(src, folder)  # copy2: Numba's source stamps (mtime, size) still hold
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(folder))
    return folder, _files(folder), text


def _payload(path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read().partition(b"\n")[2]


def _edit_number(data: bytes) -> bytes:
    """The first float constant written as 0.5 becomes 0.25 (a plausible, valid edit)."""
    assert b"0.5" in data
    return data.replace(b"0.5", b"0.25", 1)


def _random(n: int) -> bytes:
    return bytes(os.urandom(max(n, 64)))


# kind -> damage(path, data) -> new bytes
DAMAGE = {
    "empty": lambda data: b"",
    "truncated": lambda data: data[:len(data) // 2],
    "random": lambda data: _random(len(data)),
    "edited_constant": _edit_number,
}


def _check_good(files, text) -> None:
    """Every artefact is whole again: the module holds its text, the rest verify."""
    with open(files["module"], "rb") as fh:
        assert fh.read() == text
    for kind in ("proof", "derivation", "index", "data"):
        path = files[kind]
        with open(path, "rb") as fh:
            data = fh.read()
        head, _, payload = data.partition(b"\n")
        assert head.startswith(_codefiles._MAGIC), kind
        assert _codefiles.read_sealed(path, kind) == payload, kind


def _damaged_run(cache, kind, data_of):
    folder, files, text = cache
    path = files[kind]
    with open(path, "rb") as fh:
        data = fh.read()
    with open(path, "wb") as fh:
        fh.write(data_of(data))
    step, caught = _run()
    assert len(caught) == 1, caught
    assert os.path.basename(path) in caught[0]
    _check_good(files, text)
    _, caught = _run()  # regenerated: the next load finds good files
    assert not caught, caught
    return step


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("kind", ["module", "proof", "derivation"])
def test_a_damaged_artefact_is_replaced_with_one_warning(cache, kind, damage):
    if damage == "edited_constant" and kind == "proof":
        damage_of = lambda data: data.replace(b"16 points", b"17 points")  # noqa: E731
    else:
        damage_of = DAMAGE[damage]
    _damaged_run(cache, kind, damage_of)


@pytest.mark.parametrize("damage", ["empty", "truncated", "random"])
@pytest.mark.parametrize("kind", ["index", "data"])
def test_a_damaged_numba_cache_file_is_replaced_with_one_warning(cache, kind, damage):
    _damaged_run(cache, kind, DAMAGE[damage])


@pytest.mark.parametrize("kind", ["proof", "derivation"])
def test_a_record_that_is_not_json_is_replaced(cache, kind):
    _damaged_run(cache, kind, lambda data: data.partition(b"\n")[0] + b"\n{not json")


@pytest.mark.parametrize("key", ["proofs", "ok", "symgrad_failure"])
def test_a_proof_record_missing_a_key_is_replaced(cache, key):
    """Edited in place (the seal no longer matches) and written sealed by the cache's own
    writer with a key missing (the record's check catches it): both replaced, no KeyError."""
    folder, files, text = cache
    record = json.loads(_payload(files["proof"]))
    if key == "symgrad_failure":  # a failed proof without its reason
        record = {"ok": False, "symgrad": record["symgrad"]}
    else:
        del record[key]
    _damaged_run(cache, "proof", lambda data: data.partition(b"\n")[0] + b"\n"
                  + json.dumps(record).encode())
    assert _codefiles.write_record(files["proof"], record)
    _, caught = _run()
    assert len(caught) == 1 and "malformed" in caught[0], caught
    _check_good(files, text)


def test_a_foreign_module_is_never_executed(cache, tmp_path):
    """A valid module with the right name and a side effect, planted: replaced unrun."""
    folder, files, text = cache
    marker = tmp_path / "pwned"
    evil = f"open({str(marker)!r}, 'w').write('ran')\n".encode() + text
    _damaged_run(cache, "module", lambda data: evil)
    assert not marker.exists()


@pytest.mark.parametrize("kind", ["index", "data"])
def test_a_foreign_numba_pickle_is_never_unpickled(cache, tmp_path, kind):
    """Numba's cache files are pickles: one planted unsealed (in Numba's own format) must be
    deleted before anything unpickles it."""
    folder, files, text = cache
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return exec, (f"open({str(marker)!r}, 'w').write('ran')",)

    planted = (pickle.dumps(numba.__version__) if kind == "index" else b"") + \
        pickle.dumps(Evil())
    _damaged_run(cache, kind, lambda data: planted)
    assert not marker.exists()


def test_a_foreign_record_is_not_believed(cache):
    """A plain JSON proof record saying every loop was proved (the format before sealing,
    or planted): not believed, the step is proved again."""
    folder, files, text = cache
    _damaged_run(cache, "proof", lambda data: _payload(files["proof"]))


def _plant(folder, text, marker) -> str:
    path = os.path.join(folder, os.path.basename(_files_module_name(text)))
    with open(path, "wb") as fh:
        fh.write(f"open({str(marker)!r}, 'w').write('ran')\n".encode() + text)
    return path


def _files_module_name(text: bytes) -> str:
    import hashlib

    return f"symgrad_step_{hashlib.sha1(text).hexdigest()[:20]}.py"


def _no_disk_cache_run(folder, text, marker, uid=None):
    uid = os.getuid() if uid is None else uid
    step, caught = _run()
    assert len(caught) == 1 and "no disk cache" in caught[0], caught
    used = os.path.dirname(step._entries()[0].module.__file__)
    assert os.path.realpath(used) != os.path.realpath(folder)
    st = os.stat(used)
    assert st.st_uid == uid and stat.S_IMODE(st.st_mode) == 0o700
    predictable = os.path.join(tempfile.gettempdir(), f"symgrad-compile-{uid}")
    assert os.path.realpath(used) != os.path.realpath(predictable)
    assert not marker.exists()
    return used


def test_a_cache_dir_others_can_write_is_not_used(template, tmp_path, monkeypatch):
    _, text = template
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o770)  # group-writable: a group member could plant code
    marker = tmp_path / "pwned"
    _plant(folder, text, marker)
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(folder))
    _no_disk_cache_run(folder, text, marker)
    assert sorted(os.listdir(folder)) == [_files_module_name(text)]  # nothing written


def test_a_cache_dir_owned_by_another_user_is_not_used(template, tmp_path, monkeypatch):
    _, text = template
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    marker = tmp_path / "pwned"
    _plant(folder, text, marker)
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(folder))
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1000)  # the dir now belongs to another
    _no_disk_cache_run(folder, text, marker, uid=real)


def test_without_a_usable_cache_dir_no_shared_path_is_used(template, tmp_path, monkeypatch):
    """Neither $SYMGRAD_COMPILE_CACHE nor the user cache can be made: the step compiles in
    a directory of this process only (0700, a random name), said once."""
    _, text = template
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(blocker / "cc"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "xdg"))
    _no_disk_cache_run(blocker, text, tmp_path / "pwned")
    first = loader.cache_dir()
    assert loader.cache_dir() == first  # one directory for the process


def test_a_new_cache_dir_is_private(tmp_path, monkeypatch):
    folder = tmp_path / "a" / "cc"
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(folder))
    assert loader.cache_dir() == str(folder)
    for made in (folder, folder.parent):
        st = os.stat(made)
        assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700


def test_a_cache_dir_inside_a_dir_others_can_write_is_not_used(template, tmp_path,
                                                                monkeypatch):
    """A world-writable parent without the sticky bit: another user could rename the cache
    dir away and put one of theirs in its place."""
    _, text = template
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)
    folder = parent / "cc"
    folder.mkdir(mode=0o700)
    marker = tmp_path / "pwned"
    _plant(folder, text, marker)
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(folder))
    _no_disk_cache_run(folder, text, marker)


_KERNELS_CHILD = r"""
import json, os, sys, warnings
import symgrad._codefiles as cf
real = cf.writable
# the installed package's __pycache__ read-only, as in a system-wide install
cf.writable = lambda p: (False if p.endswith(os.path.join("cpu", "__pycache__"))
                         else real(p))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import symgrad as sg
    sg.manual_seed(0)
    x = sg.randn(64)
    y = (x * x).sum()  # Numba kernels from 16 elements (SYMGRAD_PARALLEL_MIN below)
print(json.dumps({"dir": os.environ["NUMBA_CACHE_DIR"], "y": float(y),
                  "warnings": [str(w.message) for w in caught
                               if issubclass(w.category, cf.CacheWarning)]}))
"""


def test_the_cpu_backends_numba_cache_fallback_is_private_and_checked(tmp_path):
    """Where the package's own __pycache__ is read-only, the CPU backend's Numba cache goes
    to a private user cache dir (no shared temp dir), and its files there are checked
    before Numba unpickles them: a truncated index and a planted pickle are replaced."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR",
                                                            "SYMGRAD_NUMBA_SEALED")}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), SYMGRAD_PARALLEL_MIN="16",
               PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(
                   sg.__file__)), env.get("PYTHONPATH")) if p))

    def child() -> dict:
        out = subprocess.run([sys.executable, "-c", _KERNELS_CHILD], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = child()
    folder = str(tmp_path / "xdg" / "symgrad" / "numba")
    assert first["dir"] == folder and not first["warnings"]
    st = os.stat(folder)
    assert st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700
    index = sorted(glob.glob(os.path.join(folder, "**", "*.nbi"), recursive=True))
    data = sorted(glob.glob(os.path.join(folder, "**", "*.nbc"), recursive=True))
    assert index and data
    for path in index + data:
        with open(path, "rb") as fh:
            assert fh.read().startswith(_codefiles._MAGIC)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return exec, (f"open({str(marker)!r}, 'w').write('ran')",)

    with open(index[0], "r+b") as fh:
        fh.truncate(os.path.getsize(index[0]) // 2)
    with open(data[-1], "wb") as fh:
        fh.write(pickle.dumps(Evil()))
    second = child()
    assert second["y"] == first["y"]
    assert not marker.exists()
    assert len(second["warnings"]) == 2, second["warnings"]
    for path in (index[0], data[-1]):
        assert sum(os.path.basename(path) in w for w in second["warnings"]) == 1, path
    third = child()
    assert not third["warnings"] and third["y"] == first["y"]
