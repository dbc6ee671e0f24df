"""Elementwise math written once: an op's ``Scalar`` stanza is the only definition.

Checks that the language rejects what backends could not compile, that each stanza's grads
are the derivatives of its meaning (SymPy, at sample points away from kinks and ties), and
that every backend's kernels come from the stanza: the generated Numba loops and the CPU
backend's kernels equal the NumPy reference, the fused backwards equal the tensor-op
formulas, and the SymPy backend replays the meaning. (The CUDA kernels are checked the same
way under the simulator in tests/cuda/test_cuda_stanzas.py.)
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad.backends import get_backend
from symgrad.backends.cpu import rules
from symgrad.backends.sympy_backend import SympyBackend
from symgrad.ops import OPS
from symgrad.ops.elementwise import fused_from_stanza, scalar_kernels, scalar_ops
from symgrad.ops.scalar import Scalar, build, sympy_namespace

KERNELS = scalar_kernels()
FUSED = fused_from_stanza()
POINTS = (-2.5, -0.75, 0.3, 1.7)
#: inputs that must stay positive for a real, finite meaning
POSITIVE = {"log", "sqrt", "pow", "pow_tensor", "reciprocal"}
#: sample values of the params, per op
PARAMS = {"pow": [{"exponent": 3}, {"exponent": 2.5}, {"exponent": 0}],
          "softplus": [{"beta": 1, "threshold": 20}, {"beta": 2.0, "threshold": 1.0}],
          "addcmul": [{"value": 0.5}],
          "leaky_relu": [{"negative_slope": 0.01}, {"negative_slope": -0.5}],
          "elu": [{"alpha": 1.0, "scale": 1, "input_scale": 1},
                  {"alpha": 0.7, "scale": 1.5, "input_scale": 0.5}],
          "hardtanh": [{"min_val": -1.0, "max_val": 1.0}, {"min_val": -0.6, "max_val": 2.0}]}
#: op arguments saved but not read by the scalar math
SAVED_ONLY = {"gelu": {"approximate": "none"}, "gelu_tanh": {"approximate": "tanh"}}


def _stanza(kernel: str):
    return next(s for s in OPS.values() if s.kernel == kernel)


def test_the_elementwise_ops_are_on_the_stanza_path():
    assert set(KERNELS) >= {
        "neg", "exp", "log", "sin", "cos", "tanh", "sigmoid", "relu", "sqrt", "abs", "sign",
        "reciprocal", "log1p", "expm1", "erf", "silu", "softplus", "add", "sub", "mul", "div",
        "pow", "maximum", "minimum", "atan2", "hypot", "gt", "ge", "lt", "le", "eq", "ne",
        "logical_or", "logical_and", "logical_not", "where", "addcmul"}
    assert set(scalar_ops(2)) >= {"add", "mul", "atan2", "hypot"}
    for op in FUSED:
        assert OPS[op].fused_backward == op + "_backward"
    assert {"mul", "div", "where", "pow", "maximum", "atan2", "hypot", "softplus"} <= set(FUSED)


@pytest.mark.parametrize("bad", ["foo(x)", "x.real", "x[0]", "lambda: x", "z + 1",
                                 "__import__('os')", "exp(x) if x else 0"])
def test_the_expression_language_rejects_what_backends_cannot_compile(bad):
    with pytest.raises(ValueError):
        Scalar(bad)


def test_a_unary_grad_may_read_one_saved_operand_only():
    with pytest.raises(ValueError, match="one saved operand"):
        Scalar("tanh(x)", "g * x * y")


def test_an_nary_stanza_gives_one_grad_per_input_and_no_reserved_names():
    with pytest.raises(ValueError, match="one grad per input"):
        Scalar("a * b", ("g * b",), inputs=("a", "b"))
    with pytest.raises(ValueError, match="reserved"):
        Scalar("y * b", ("g * b", "g * y"), inputs=("y", "b"))
    with pytest.raises(ValueError, match="unknown name"):
        Scalar("x * beta", "g * beta")  # beta not declared as a param


def test_build_refuses_to_shadow_the_vocabulary():
    with pytest.raises(ValueError):
        build("exp", ("x",), "exp(x)", {"exp": math.exp})


def _points(op: str, n_inputs: int, has_condition: bool):
    pts = [p for p in POINTS if p > 0] if op in POSITIVE else list(POINTS)
    combos = itertools.product(pts, repeat=n_inputs - has_condition)
    for combo in itertools.islice(combos, 12):
        if len(set(combo)) < len(combo):
            continue  # a tie: maximum's kink
        if has_condition:
            yield (True,) + combo
            yield (False,) + combo
        else:
            yield combo


@pytest.mark.parametrize("op", FUSED)
def test_grads_are_the_derivatives_of_the_meaning(op):
    sp = pytest.importorskip("sympy")
    scalar = OPS[op].scalar
    syms = [sp.Symbol(v, real=True) for v in scalar.inputs]
    ns = sympy_namespace(sp)
    for params in PARAMS.get(op, [{}]):
        meaning = build(f"{op}_m", scalar.inputs + scalar.params,
                        scalar.meaning or scalar.forward, ns)(*syms, **params)
        has_condition = scalar.grads[0] is None and scalar.inputs[0] == "c"
        checked = 0
        for values in _points(op, len(syms), has_condition):
            at = dict(zip(syms, values))
            y = complex(meaning.subs(at).evalf())
            if y.imag or not math.isfinite(y.real):
                continue
            for i, text in enumerate(scalar.grads):
                if text is None:
                    continue
                want = float(sp.diff(meaning, syms[i]).subs(at).evalf())
                env = dict(zip(scalar.inputs, values)) | {"y": y.real}
                got = rules.scalar_rule(op, i)(
                    1.0, *(env[v] for v in scalar.reads(i)),
                    *(params[p] for p in scalar.param_reads(i)))
                assert got == pytest.approx(want, rel=1e-12, abs=1e-12), (op, i, values, params)
                checked += 1
        assert checked, f"{op}: no sample point checked"


def _arrays(kernel: str, dtype, n: int = 600, seed: int = 0):
    """Inputs for ``kernel``: in its domain, with zeros, signed zeros, ties and large values."""
    spec = _stanza(kernel)
    rng = np.random.default_rng(seed)
    out = []
    for k, v in enumerate(spec.scalar.inputs):
        if v == "c":
            out.append(rng.random(n) > 0.5)
            continue
        x = rng.uniform(-3, 3, n).astype(dtype)
        if n < 8:
            pass
        elif kernel in POSITIVE or spec.name in POSITIVE:
            x = np.abs(x) + dtype(0.1)
            x[:4] = (1.0, 2.0, 4.0, 9.0)
        else:
            x[:4] = (0.0, -0.0, 50.0, -50.0)
            if k:  # ties with input 0 (maximum's kink, eq's True)
                x[4:8] = out[0][4:8]
        out.append(x)
    return out


def _params(kernel: str):
    return PARAMS.get(_stanza(kernel).name, [{}])[0]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_cpu_kernels_and_generated_loops_equal_the_reference(kernel, dtype):
    """Bit for bit: one IEEE operation sequence in NumPy and in the Numba loop."""
    ref, cpu = get_backend("numpy"), get_backend("cpu")
    xs, params = _arrays(kernel, dtype), _params(kernel)
    want = getattr(ref, kernel)(*xs, **params)
    np.testing.assert_array_equal(getattr(cpu, kernel)(*xs, **params), want)
    if rules.forward_loop(kernel):
        from symgrad.backends.cpu.backend import load_kernels

        serial, _ = load_kernels()[kernel + "_f"]
        out = np.empty_like(want)
        scalar = _stanza(kernel).scalar
        ps = [dtype(params[p]) for p in scalar.params]
        if len(xs) == 2 and not ps:
            serial(xs[0], xs[1], out, 1, 1)
            np.testing.assert_array_equal(out, want)
            one = np.empty_like(want)
            serial(xs[0], xs[1][:1], one, 1, 0)  # the scalar-operand version
            np.testing.assert_array_equal(one, getattr(ref, kernel)(xs[0], xs[1][0]))
        else:
            serial(*xs, *ps, out)
            np.testing.assert_array_equal(out, want)


def _formulas(op: str, g, saved: dict, needed):
    """The op's registered tensor-op formulas on symgrad tensors (the definition)."""
    spec = OPS[op]
    out = []
    for i, name in enumerate(spec.inputs):
        if not needed[i] or name not in spec.grads:
            out.append(None)
            continue
        kw = {p: (sg.tensor(saved[p]) if isinstance(saved[p], np.ndarray) else saved[p])
              for p in spec.formula_params[name]}
        out.append(np.asarray(spec.grads[name](sg.tensor(g), **kw).numpy()))
    return out


@pytest.mark.parametrize("op", FUSED)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 10, 600])
def test_fused_backward_equals_the_formulas(op, dtype, n):
    """One element (Python rules), small (NumPy rules) and from FUSED_MIN (Numba loops, or
    NumPy where the rule calls libm), for every subset of needed inputs."""
    spec, cpu = OPS[op], get_backend("cpu")
    xs = _arrays(spec.kernel or op, dtype, n=n, seed=n)
    params = PARAMS.get(op, [{}])[-1]
    values = dict(zip(spec.inputs, xs)) | params | SAVED_ONLY.get(op, {})
    if "result" in spec.saved:
        values["result"] = getattr(get_backend("numpy"), spec.kernel or op)(*xs, **params)
    saved = {p: values[p] for p in spec.saved}
    g = np.random.default_rng(7).standard_normal(n).astype(dtype)
    grads = [i for i, t in enumerate(spec.scalar.grads) if t is not None]
    for k in range(1, len(grads) + 1):
        for subset in itertools.combinations(grads, k):
            needed = tuple(i in subset for i in range(len(spec.inputs)))
            got = getattr(cpu, spec.fused_backward)(g, needed, *(saved[p] for p in spec.saved))
            assert got is not None, (op, n, needed)
            want = _formulas(op, g, saved, needed)
            for i, (a, b) in enumerate(zip(got, want)):
                assert (a is None) == (b is None), (op, i, needed)
                if a is not None:
                    assert a.dtype == dtype and a.shape == b.shape
                    # the rule's few roundings; Numba may evaluate a literal's product wider
                    assert_close(a, b, terms=6)


@pytest.mark.parametrize("kernel", [k for k in KERNELS
                                    if getattr(getattr(SympyBackend, k), "from_stanza", False)])
def test_the_sympy_backend_replays_the_stanza_meaning(kernel):
    sp = pytest.importorskip("sympy")
    be = SympyBackend()
    scalar = _stanza(kernel).scalar
    syms = [sp.Symbol(v, positive=True) for v in scalar.inputs]
    params = _params(kernel)
    out = getattr(be, kernel)(*(np.array([s], dtype=object) for s in syms), **params)
    want = build("m", scalar.inputs + scalar.params, scalar.meaning or scalar.forward,
                 sympy_namespace(sp))(*syms, **params)
    assert sp.simplify(out[0] - want) == 0
