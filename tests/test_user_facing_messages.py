"""What users read besides reports (issue 29, scope 7): NumPy's floating-point warnings
name the user's op at the user's line (they named generated code, ``<symgrad fast method
mul>``, and its source line), and Numba's first-use compiles show one progress line (they
printed two stderr lines per kernel)."""

from __future__ import annotations

import re
import sys
import warnings

import numpy as np
import pytest

import symgrad as sg


def _overflow():
    x = sg.tensor([3e38, 1.0], requires_grad=True)
    return x * 10.0  # the line the warning must point at


def _lineno(fn, text: str) -> int:
    import inspect

    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(src) if text in line)


def test_fp_warning_names_the_op_at_the_users_line():
    with warnings.catch_warnings(record=True) as log:
        warnings.filterwarnings("always", category=RuntimeWarning, module=re.escape(__name__))
        y = _overflow()
    assert y.tolist()[0] == float("inf") and y.tolist()[1] == 10.0
    assert len(log) == 1, [str(w.message) for w in log]
    w = log[0]
    assert issubclass(w.category, RuntimeWarning)
    assert str(w.message) == "mul: overflow encountered in multiply"
    assert w.filename == __file__ and w.lineno == _lineno(_overflow, "x * 10.0")
    assert "<symgrad" not in w.filename


@pytest.mark.parametrize("how", ["method", "functional", "inf_times_zero"])
def test_no_warning_names_generated_code(how):
    a = sg.tensor([float("inf"), 2.0, 1e30], requires_grad=True)
    b = sg.tensor([0.0, 3.0, 1e30])
    with warnings.catch_warnings(record=True) as log:
        warnings.filterwarnings("always", category=RuntimeWarning, module=re.escape(__name__))
        out = {"method": lambda: a * b, "functional": lambda: sg.mul(a, b),
               "inf_times_zero": lambda: b * a}[how]()
    np.testing.assert_array_equal(out.detach().numpy()[1:], [6.0, np.float32(np.inf)])
    assert np.isnan(out.detach().numpy()[0])
    assert log, "NumPy's warnings are still said"
    for w in log:
        assert "<symgrad" not in w.filename and "<symgrad" not in str(w.message)
        assert str(w.message).startswith("mul: "), str(w.message)
        assert w.filename == __file__


def test_users_error_and_ignore_filters_still_apply():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match=r"^mul: overflow encountered in multiply$"):
            _overflow()
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("ignore")
        y = _overflow()
    assert log == [] and y.tolist()[0] == float("inf")


def test_first_use_compiles_show_one_progress_line(capsys, monkeypatch):
    numba = pytest.importorskip("numba")
    from numba.core import event

    from symgrad.backends.cpu import kernels

    monkeypatch.setattr(kernels._NOTICE, "delay", 1e9)  # the module's own notice stays quiet
    notice = kernels._CompileNotice()
    notice.delay = 0.0
    notice.idle = 60.0  # closed by hand below, not by the clock
    fns = []
    for k in range(3):
        ns: dict = {}
        exec(f"def fresh_{k}(x):\n    return x * {k + 2}.5 + 1\n", ns)  # noqa: S102
        fns.append(numba.njit(cache=False)(ns[f"fresh_{k}"]))
    capsys.readouterr()
    with event.install_listener("numba:compile", notice):
        for f in fns:
            f(np.ones(3))
            # let the timer thread open the line for the first one
            for _ in range(200):
                if notice._bar is not None:
                    break
                import time

                time.sleep(0.01)
        notice.close()
    err = capsys.readouterr().err
    assert "compiling Numba kernel '" not in err  # no line per kernel
    assert err.count("\n") == 1 and err.endswith("\n")  # one line, redrawn in place
    frames = [f for f in err.rstrip("\n").split("\r") if f]
    assert all(f.startswith(kernels._CompileNotice.desc) for f in frames)
    assert "3 done" in frames[-1] and "fresh_2" in frames[-1]
    assert sys.stderr is not None


def _backward_overflow():
    x = sg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 1e10  # finite: 1e10, 2e10
    y.backward(sg.tensor([1e30, 1.0]))  # 1e30 * 1e10 overflows float32 here


def test_fp_warning_in_a_backward_names_the_op_at_the_backward_call():
    with warnings.catch_warnings(record=True) as log:
        warnings.filterwarnings("always", category=RuntimeWarning, module=re.escape(__name__))
        _backward_overflow()
    assert [str(w.message) for w in log] == [
        "mul: overflow encountered in the backward of MulBackward0"]
    assert log[0].filename == __file__
    assert log[0].lineno == _lineno(_backward_overflow, "y.backward(")


def test_verify_says_non_finite_values_itself_without_numpy_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = sg.tensor([float("inf"), 1.0], requires_grad=True)
        b = sg.tensor([0.0, 2.0], requires_grad=True)
        d = (a * b).sum()
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter("always")
        rep = sg.verify(d, names={"a": a, "b": b})
    assert rep.status == "non-finite"
    assert [w for w in log if issubclass(w.category, RuntimeWarning)] == []
