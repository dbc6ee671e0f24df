"""Op parity on "cuda" (the simulator in CI): every case of the op-set oracle tests runs with its
leaves on the device and must match the CPU backend: values, dtypes, gradients, the whole
recorded graph (grad_fn names, next_functions, ``_saved_*`` names and values), the devices
of results and gradients, and second derivatives for the core set."""

from __future__ import annotations

import numpy as np
import pytest
from _oracle import program_terms
from _tolerance import assert_close, magnitude

import symgrad as sg
from tests import test_ops_shape_index as shape_index
from tests import test_oracle_core as core

CPU = sg.device("cpu")
CUDA = sg.device("cuda:0")


class _OnCuda:
    """``L`` for the cases: symgrad whose ``tensor`` makes device tensors (as torch users do)."""

    def __getattr__(self, name):
        return getattr(sg, name)

    @staticmethod
    def tensor(data, **kw):
        kw.setdefault("device", "cuda")
        return sg.tensor(data, **kw)


LIBS = {"cpu": sg, "cuda": _OnCuda()}


@pytest.fixture(autouse=True, scope="module")
def _numpy_reference():
    """The CPU side is the NumPy reference backend (the oracle the compiled backends are
    tested against; it also spares these simulator runs Numba's CPU compile times)."""
    from symgrad import backends

    previous = backends.set_cpu_backend("numpy")
    yield
    backends.set_cpu_backend(previous)


def _np(t):
    return None if t is None else t.detach().cpu().numpy()


def _saved(v, values):
    """A saved operand's comparable form; tensors' values go to ``values`` (compared apart,
    with a tolerance: kernels may round differently in the last place). Python numbers are
    the program's constants: exact."""
    if isinstance(v, sg.Tensor):
        values.append(v)
        return ("T", tuple(v.shape), v.dtype.name)
    if isinstance(v, tuple):
        return tuple(_saved(x, values) for x in v)
    if isinstance(v, sg.device):
        return "device"
    return v


def signature(fn, values, memo=None):
    if fn is None:
        return None
    memo = {} if memo is None else memo
    if id(fn) in memo:
        return memo[id(fn)]
    name = fn.name()
    if name == "AccumulateGrad":
        return ("AccumulateGrad", tuple(fn.variable.shape), str(fn.variable.device))
    saved = {a: _saved(getattr(fn, a), values) for a in sorted(dir(fn))
             if a.startswith("_saved_")}
    sig = (name, tuple(sorted(saved.items())),
           tuple((signature(n, values, memo), nr) for n, nr in fn.next_functions))
    memo[id(fn)] = sig
    return sig


def _strip_device(sig, device):
    if isinstance(sig, tuple):
        return tuple(_strip_device(x, device) for x in sig)
    if sig == device:
        return "DEVICE"
    return sig


def run(device, fn, arrays, create_graph=False):
    L = LIBS[device]
    xs = [sg.tensor(a, device=device, requires_grad=a.dtype.kind == "f") for a in arrays]
    out = fn(L, *xs)
    out = out[0] if isinstance(out, tuple) else out
    values = []
    result = {"out": out, "sig": signature(out.grad_fn, values), "saved": values,
              "grads": None, "second": None}
    diff = [x for x in xs if x.requires_grad]
    if out.dtype not in (sg.float32, sg.float64) or not out.requires_grad or not diff:
        return result
    w = np.random.default_rng(7).uniform(-1, 1, size=tuple(out.shape))
    loss = (out * sg.tensor(w.astype(_np(out).dtype), device=device)).sum()
    grads = sg.autograd.grad(loss, diff, create_graph=create_graph, allow_unused=True)
    result["grads"] = grads
    if create_graph:
        gs = [g for g in grads if g is not None and g.requires_grad]
        if gs:
            total = sum((g * g).sum() for g in gs)
            result["second"] = sg.autograd.grad(total, diff, allow_unused=True)
    return result


def _close(a, b, terms, arrays):
    """Within the rounding bound of the dtype over the program's terms (tests/_tolerance.py);
    the scale is the result's magnitude or the inputs' (reductions may cancel)."""
    if a is None or b is None:
        assert a is None and b is None
        return
    assert a.device == CUDA and b.device == CPU
    x, y = _np(a), _np(b)
    assert x.shape == y.shape and x.dtype == y.dtype
    assert_close(x, y, terms=terms, scale=magnitude(y, *arrays))


def check(fn, arrays, create_graph=False):
    cpu = run("cpu", fn, arrays, create_graph)
    dev = run("cuda", fn, arrays, create_graph)
    terms = program_terms(arrays, tuple(cpu["out"].shape), create_graph)
    # the same graph; saved tensors live on the device, except wrapped Python scalars
    # (``2 * x`` saves a 0-dim CPU tensor in torch too)
    assert _strip_device(dev["sig"], "cuda:0") == _strip_device(cpu["sig"], "cpu")
    for a, b in zip(dev["saved"], cpu["saved"], strict=True):
        if a.device == CPU:
            assert a.ndim == 0 and b.device == CPU
            a = a.to("cuda")
        _close(a, b, terms, arrays)
    _close(dev["out"], cpu["out"], terms, arrays)
    assert (dev["grads"] is None) == (cpu["grads"] is None)
    for a, b in zip(dev["grads"] or (), cpu["grads"] or ()):
        _close(a, b, terms, arrays)
    for a, b in zip(dev["second"] or (), cpu["second"] or ()):
        _close(a, b, terms, arrays)


@pytest.mark.parametrize("case", core.CASES, ids=[c[0] for c in core.CASES])
def test_core_ops_match_cpu(case):
    _, fn, shapes, domain = case
    for dtype in (np.float32, np.float64):
        check(fn, core._inputs(shapes, domain, 0, dtype))


@pytest.mark.parametrize("case", core.CASES[::4], ids=[c[0] for c in core.CASES[::4]])
def test_core_second_derivatives_match_cpu(case):
    _, fn, shapes, domain = case
    check(fn, core._inputs(shapes, domain, 1, np.float64), create_graph=True)


@pytest.mark.parametrize("case", shape_index.CASES, ids=[c[0] for c in shape_index.CASES])
def test_shape_index_ops_match_cpu(case):
    _, fn, arrays = case
    check(fn, arrays)
