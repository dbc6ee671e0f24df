"""The CPU backend in real processes: import cost, threads, fork, disk cache, bounds checks.

Each test runs a fresh interpreter, so an abort (what a threading layer does when misused)
fails the test instead of killing the test run.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
from _tolerance import assert_close

ROOT = Path(__file__).resolve().parents[1]
TESTS = str(ROOT / "tests")  # the children import the tolerance helper from here


def _run(code: str, env: dict | None = None, timeout: int = 240, cwd=ROOT):
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "SYMGRAD_CPU_BACKEND": "cpu",
                **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def test_import_symgrad_loads_no_heavy_module():
    r = _run("""
        import sys
        import symgrad
        heavy = ("numba", "numba.cuda", "sympy", "symengine", "ipywidgets", "torch")
        print([m for m in heavy if m in sys.modules])
        x = symgrad.tensor([1.0, 2.0], requires_grad=True)
        (x * x).tanh().sum().backward()  # tiny tensors: NumPy and size-1 rules only
        print("numba" in sys.modules, *map(repr, x.grad.tolist()))
        x = symgrad.ones(symgrad.backends.cpu.FUSED_MIN, requires_grad=True)
        (x * x).tanh().sum().backward()  # a fused Numba kernel now runs
        print("numba" in sys.modules)
    """)
    assert r.returncode == 0, r.stderr
    loaded, tiny, big = r.stdout.splitlines()
    assert loaded == "[]"
    numba_loaded, *grad = tiny.split()
    assert numba_loaded == "False"
    x = np.array([1.0, 2.0])
    t = np.tanh(x * x)
    # 2x(1 - tanh(x^2)^2) in float32: x*x, tanh, t*t, 1 - t*t, and the product with 2x, the
    # product rounded twice (six roundings); 1 - t*t cancels, hence the scale 2x(1 + t*t)
    assert_close(np.array([float(v) for v in grad], dtype=np.float32), 2 * x * (1 - t * t),
                 terms=6, scale=2 * x * (1 + t * t))
    assert big == "True"


def test_threading_layer_and_two_python_threads_at_once():
    r = _run("""
        import threading
        import numpy as np
        from _tolerance import assert_close
        from symgrad.backends.cpu import backend as B
        import numba
        be = B.CpuBackend()
        rng = np.random.default_rng(0)
        big = rng.standard_normal(B.PARALLEL_MIN * 2)
        small = rng.standard_normal(B.FUSED_MIN)
        errors = []

        def work(seed):
            try:
                for i in range(40):
                    x = big if i % 2 else small
                    # one correctly rounded product (fastmath is off): the same bits
                    np.testing.assert_array_equal(be.mul(x, x), x * x)
                    (g,) = be.tanh_backward(x, (True,), x)
                    # g (1 - y y): three roundings, 1 - y y cancels: scale |g| (1 + y y)
                    assert_close(g, x * (1 - x * x), terms=3, scale=np.abs(x) * (1 + x * x))
                    ga, gb = be.mul_backward(x, (True, True), x, x)
                    np.testing.assert_array_equal(ga, x * x)
            except Exception as exc:  # reported below
                errors.append(repr(exc))

        threads = [threading.Thread(target=work, args=(s,)) for s in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(errors, numba.threading_layer(), B.threading_layer())
    """, {"PYTHONPATH": os.pathsep.join([str(ROOT), TESTS])})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "workqueue", "workqueue"]


def test_fork_after_a_parallel_kernel():
    r = _run("""
        import multiprocessing as mp
        import os
        import numpy as np
        from _tolerance import assert_close
        from symgrad.backends.cpu import backend as B
        be = B.CpuBackend()
        x = np.linspace(0, 1, B.PARALLEL_MIN * 2)
        be.mul(x, x)  # a parallel kernel: the worker threads now exist in the parent

        def child(k):
            y = be.mul(x, k * 1.0)  # a parallel kernel in the forked child
            (g,) = be.tanh_backward(y, (True,), y)
            return float(y.sum()), float(g.sum())

        with mp.get_context("fork").Pool(2) as pool:
            got = pool.map(child, [1, 2, 3])
        want = [(float((x * k).sum()), float((x * k * (1 - (x * k) ** 2)).sum()))
                for k in (1, 2, 3)]
        # y = x k is exact, so its sums agree bitwise; g = y (1 - y y) takes three roundings
        # per element (1 - y y cancels: terms |y| (1 + y y)), then NumPy's pairwise sum:
        # runs of 16 per partial sum in blocks of 128, then log2(n / 128) levels
        levels = int(np.ceil(np.log2(x.size / 128)))
        scale = [(1.0, float(np.sum(np.abs(x * k) * (1 + (x * k) ** 2)))) for k in (1, 2, 3)]
        assert [y for y, _ in got] == [y for y, _ in want]
        assert_close(np.array(got), np.array(want), terms=3 + 16 + levels,
                     scale=np.array(scale))
        pid = os.fork()
        if pid == 0:
            os._exit(0 if np.array_equal(be.add(x, x), x + x) else 3)
        _, status = os.waitpid(pid, 0)
        print("ok", os.waitstatus_to_exitcode(status))
    """, {"PYTHONPATH": os.pathsep.join([str(ROOT), TESTS])})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "0"]


_CACHE_PROBE = f"""
    import sys
    import numpy as np
    from symgrad.backends.cpu import backend as B
    sys.path.append({TESTS!r})
    from _tolerance import assert_close
    be = B.CpuBackend()
    x = np.linspace(0.1, 1, 50)
    (g,) = be.tanh_backward(x, (True,), x)
    assert_close(g, x * (1 - x * x), terms=3, scale=x * (1 + x * x))  # as in the threads test
    serial, _ = B.load_kernels()["tanh_b1"]
    print(sum(serial.stats.cache_hits.values()), sum(serial.stats.cache_misses.values()))
    print(B.__file__)
"""


def test_disk_cache_works_from_a_read_only_package(tmp_path):
    """A read-only install falls back to a user cache dir, reuses it, and says it compiles."""
    ro = tmp_path / "site"
    shutil.copytree(ROOT / "symgrad", ro / "symgrad",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc"))
    if os.geteuid() == 0:  # root ignores modes: make the cache dir impossible instead
        (ro / "symgrad" / "backends" / "cpu" / "__pycache__").write_text("not a directory")
    for p in [ro, *ro.rglob("*")]:
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    home = tmp_path / "home"
    env = {"PYTHONPATH": str(ro), "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
           "NUMBA_CACHE_DIR": "", "SYMGRAD_COMPILE_NOTICE_S": "0", "SYMGRAD_FUSED_MIN": "2"}
    try:
        first = _run(_CACHE_PROBE, env, cwd=tmp_path)
        second = _run(_CACHE_PROBE, env, cwd=tmp_path)
    finally:
        for p in [ro, *ro.rglob("*")]:
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    hits1, misses1 = map(int, first.stdout.split()[:2])
    hits2, misses2 = map(int, second.stdout.split()[:2])
    assert first.stdout.split()[2].startswith(str(ro))  # the read-only copy was used
    assert (hits1, misses1) == (0, 1) and (hits2, misses2) == (1, 0)
    assert list((home / ".cache" / "symgrad" / "numba").rglob("*.nbi"))
    # one progress line naming the kernel compiling (not a line per kernel)
    assert "symgrad: compiling Numba kernels" in first.stderr and "tanh_b1" in first.stderr
    assert "compiling Numba kernel '" not in first.stderr
    assert "compiling" not in second.stderr  # loaded from disk, nothing to say


def test_kernels_under_boundscheck(tmp_path):
    """The kernel and fuzz tests again with NUMBA_BOUNDSCHECK=1 (fresh cache: recompiled),
    and proof that the checks are on: a raw kernel call with a short output raises.
    Serial twins only: the parallel twin is the same loop body (``prange``), compiled again."""
    r = _run(f"""
        import sys
        import numpy as np
        import pytest
        code = pytest.main(["-q", "-p", "no:cacheprovider", "-k", "test_kernel_ and not parallel",
                            {str(ROOT / "tests" / "test_cpu_backend.py")!r}])
        from symgrad.backends.cpu import load_kernels
        serial, _ = load_kernels()["tanh_b1"]
        try:
            serial(np.ones(8), np.ones(8), np.empty(9), 1)
        except IndexError as exc:
            print("IndexError", exc)
        sys.exit(int(code))
    """, {"NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path / "cache")}, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and "IndexError" in r.stdout
