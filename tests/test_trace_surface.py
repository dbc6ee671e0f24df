"""Every Tensor method on the traced stand-in, or named in the documented list of what
cannot be traced.

A torch ``Function``'s forward is traced on stand-ins; a symgrad ``Function``'s on symgrad
tensors on the symbolic device. For every public method of torch's Tensor and of symgrad's
Tensor, the first call among a set of argument patterns that torch accepts is traced on
symbols (through a torch Function, and for symgrad's methods through a symgrad Function),
and its value at the recorded point must equal torch's; a method in the documented list
(``symgrad.symbolic.trace_values.UNTRACEABLE``, docs/differences.md) must instead stop the
trace. The few methods no pattern fits (hooks, device moves, backward) are named here.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the test oracle")

import mpmath  # noqa: E402
import sympy  # noqa: E402

import symgrad as sg  # noqa: E402
from symgrad.backends.sympy_backend import SympyBackend  # noqa: E402
from symgrad.symbolic import _engine as E  # noqa: E402
from symgrad.symbolic.trace import TorchSym, TraceError, trace_forward  # noqa: E402
from symgrad.symbolic.trace_values import UNTRACEABLE  # noqa: E402

#: the deliberate calls of deprecated torch methods warn; that is torch's, not the trace's
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LISTED = {n: why for why, names in UNTRACEABLE.items() for n in names}
RANDOM = next(names for why, names in UNTRACEABLE.items() if why.startswith("random"))

#: no argument pattern fits: not tensor computations a forward's meaning depends on
NO_PATTERN = {"backward", "register_hook", "register_post_accumulate_grad_hook",
              "retain_grad", "reinforce", "cuda", "xpu", "ipu", "mtia", "as_subclass",
              "is_set_to", "is_coalesced", "index", "slice_inverse", "lu_solve", "solve",
              "nonzero_static", "as_strided_scatter"}

_VALS = np.random.default_rng(1).uniform(0.1, 0.9, 9).reshape(3, 3)
_Y = np.random.default_rng(2).uniform(0.2, 0.8, 9).reshape(3, 3)


def _patterns():
    y = torch.tensor(_Y)
    idx = torch.tensor([2, 0])
    idx2 = torch.tensor([[2, 0, 1], [0, 1, 2]])
    mask = torch.tensor([[True, False, True], [False, True, False], [True, True, False]])
    v2 = torch.tensor(_Y[:2])
    k = torch.tensor([[1, 2, 3], [3, 2, 1], [0, 1, 2]])
    return [(), (y,), (0,), (1,), (0.5,), (2,), (mask,), (mask, 0.5), (y, y), (y, 0.5),
            (0, idx), (0, idx, v2), (0, idx, 0.5), (0, 1), (0, 0, 2), ((3, 3),), ((9,),),
            ((3, 3), 0.5), (0, idx2, v2), (0, idx2), (idx,), (y[0],), (y @ y,), (y, y[0]),
            (y[0], y[0]), (y.unsqueeze(0), y.unsqueeze(0)), ((idx,), v2), ([1, 2],),
            (1, (3, 1)), (y, 0, idx), (k,), (mask,), (y[0], 0.5), (y.unsqueeze(0),),
            (idx, y[0, :2]), (mask, y), (y[0], 0), (y[0], 0, 1), (y[:, :2], 1, 0, 2),
            (0, idx2, v2, "sum"), (y, y[0]), (0, idx, v2, "amax"), (0.5, False), ((3,), (1,)),
            (y, 1), ([1, 2], 0)]


#: what the method is called on when a float 3x3 matrix fits no pattern: a row, a batch of
#: one, integers, booleans (the trace's symbolic input transformed by the same call)
SELVES = {"matrix": lambda x: x, "row": lambda x: x[0], "batch": lambda x: x.unsqueeze(0),
          "ints": lambda x: (x * 10).long(), "int_row": lambda x: (x[0] * 10).long(),
          "bools": lambda x: x > 0.5, "scalar": lambda x: x[0, 0]}


def _call(t, name, args, self_="matrix"):
    t = SELVES[self_](t)
    attr = getattr(torch.Tensor, name)
    if not callable(attr):
        return getattr(t, name) if not args else None
    return getattr(t, name)(*args)


def _tensors(r):
    if isinstance(r, torch.Tensor):
        return [r]
    if isinstance(r, (tuple, list)) and r and all(isinstance(u, torch.Tensor) for u in r):
        return list(r)
    return None


def _find_call(name):
    """The first (self, argument pattern) torch accepts for ``name``: ``(self, args, the
    tensor results)``, ``"meta"`` where it gives no tensor (shape, dtype, flags), or None."""
    meta = False
    for self_ in SELVES:
        for args in _patterns():
            t = torch.tensor(_VALS)
            try:
                with torch.no_grad():
                    r = _call(t, name, args, self_)
            except Exception:  # noqa: BLE001 - not this pattern
                continue
            outs = _tensors(r)
            if outs is not None:
                return self_, args, outs
            meta = True
    return "meta" if meta else None


def _symbols():
    xs = np.array([sympy.Symbol(f"x{i}", real=True) for i in range(9)],
                  dtype=object).reshape(3, 3)
    ev = E.Evaluator({s: mpmath.mpf(float(v)) for s, v in zip(xs.flat, _VALS.flat)})
    return xs, ev


def _number(e, ev):
    if isinstance(e, (bool, np.bool_)):
        return float(e)
    try:
        return float(e)
    except TypeError:
        return float(ev(e))


def _trace(fn_cls, name, args):
    xs, ev = _symbols()
    outs = trace_forward(fn_cls, [xs], SympyBackend(sympy, valuation=ev), (0,))
    return [o for o in outs if o is not None], ev


def _torch_function(name, self_, args):
    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            r = _call(x, name, args, self_)
            return tuple(r) if isinstance(r, (tuple, list)) else r

    return Probe


def _sg_args(args):
    def conv(a):
        if isinstance(a, torch.Tensor):
            return sg.tensor(a.numpy())
        if isinstance(a, tuple):
            return tuple(conv(u) for u in a)
        return a

    return tuple(conv(a) for a in args)


def _sg_function(name, self_, args):
    class Probe(sg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            sargs = _sg_args(args)  # made inside the forward: on the trace's device
            x = SELVES[self_](x)
            attr = getattr(sg.Tensor, name)
            r = getattr(x, name)(*sargs) if callable(attr) else getattr(x, name)
            return tuple(r) if isinstance(r, (tuple, list)) else r

    return Probe


def _agree(got, want, ev) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        g = np.asarray(g)
        if tuple(g.shape) != tuple(w.shape):
            return False
        gv = np.array([_number(e, ev) for e in g.flat]).reshape(g.shape)
        wv = w.detach().double().numpy() if not w.dtype.is_complex else None
        if wv is None:
            return False
        # the symbolic meaning is exact; torch rounded once per element in its dtype
        eps = torch.finfo(w.dtype).eps if w.dtype.is_floating_point else 0.0
        if not np.allclose(gv, wv, rtol=8 * eps, atol=8 * eps, equal_nan=True):
            return False
    return True


def _public(cls):
    return sorted(n for n in dir(cls) if not n.startswith("_"))


TORCH_NAMES = _public(torch.Tensor)
SG_NAMES = _public(sg.Tensor)


def test_the_stand_in_has_every_method_or_it_is_listed():
    xs, ev = _symbols()
    seen = {}

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            assert isinstance(x, TorchSym)
            for n in set(TORCH_NAMES) | set(SG_NAMES):
                try:
                    getattr(x, n)
                    seen[n] = True
                except AttributeError:
                    seen[n] = False
                except Exception:  # noqa: BLE001 - a property torch refuses here (x.imag)
                    seen[n] = True
            return x * 1

    trace_forward(Probe, [xs], SympyBackend(sympy, valuation=ev), (0,))
    missing = sorted(n for n, ok in seen.items() if not ok and n not in LISTED)
    assert not missing, missing
    assert set(SG_NAMES) <= set(TORCH_NAMES)  # symgrad's Tensor is PyTorch-shaped


@pytest.mark.parametrize("name", TORCH_NAMES)
def test_each_torch_method_traces_to_torchs_value_or_is_listed(name):
    found = _find_call(name)
    if found is None:
        assert name in NO_PATTERN or name in LISTED, f"no argument pattern fits {name}"
        return
    if found == "meta" or name in RANDOM:
        return  # no tensor (on the stand-in: the first test), or random numbers
    self_, args, want = found
    try:
        got, ev = _trace(_torch_function(name, self_, args), name, args)
    except TraceError as exc:
        assert name in LISTED, f"{name}{args!r}: {exc}"
        return
    if name in LISTED:
        pytest.fail(f"{name} is listed as untraceable ({LISTED[name]}) but traced")
    if "empty" in name:  # uninitialised memory: only the shape is defined
        assert [np.shape(g) for g in got] == [tuple(w.shape) for w in want]
        return
    assert _agree(got, want, ev), (name, args, got, want)


@pytest.mark.parametrize("name", SG_NAMES)
def test_each_symgrad_method_traces_in_a_symgrad_function(name):
    if name in ("backward", "register_hook", "retain_grad", "cuda", "numpy", "tolist",
                "item") or name in RANDOM:
        return
    found = _find_call(name)
    if found is None or found == "meta":
        return
    self_, args, want = found
    if "empty" in name:
        return
    try:
        got, ev = _trace(_sg_function(name, self_, args), name, args)
    except TraceError as exc:
        if name in LISTED:
            return
        cause = exc.__cause__
        # symgrad refuses what torch allows in a few argument forms: then so does eager
        try:
            _sg_function(name, self_, args).forward(None, sg.tensor(_VALS))
        except Exception:  # noqa: BLE001 - symgrad itself rejects this call
            return
        pytest.fail(f"{name}{args!r}: {cause!r}")
    assert _agree(got, want, ev), (name, args, got, want)


def test_the_documented_list_is_the_code_list():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "differences.md").read_text()
    section = doc.split("## What a traced custom Function forward cannot use", 1)[1]
    section = " ".join(section.split("\n## ", 1)[0].split())
    for why, names in UNTRACEABLE.items():
        assert why in section, why
        for n in names:
            assert re.search(rf"`{re.escape(n)}`", section), n
