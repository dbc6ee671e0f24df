"""float16, bfloat16 and the narrow integer dtypes (issue 31), side by side with torch 2.13.

Half precision is computed in float32 and rounded once, as torch's CPU kernels do; the
tolerances below count the roundings where the two libraries may round differently (a
float32 libm result a hair apart, a sum taken in another order), each worth one unit of
the dtype's eps at the result's magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad as sg

HALVES = ["float16", "bfloat16"]
NARROW = ["float16", "bfloat16", "int32", "int16", "int8", "uint8"]
ALL = NARROW + ["float32", "float64", "int64", "bool"]


@pytest.fixture
def default_dtype(torch):
    yield
    for lib in (sg, torch):
        lib.set_default_dtype(lib.float32)


def _shown(x) -> str:
    """What a result prints as, with the library prefix taken off (torch. / symgrad.)."""
    return repr(x).replace("torch.", "").replace("symgrad.", "")


def _same(code: str, torch) -> None:
    got = []
    for lib in (torch, sg):
        try:
            got.append(_shown(eval(code, {"lib": lib, "np": np})))
        except Exception as exc:  # noqa: BLE001 - the error is what is compared
            got.append(f"{type(exc).__name__}: {exc}")
    assert got[1] == got[0], code


# -- dtype objects, creation, casting, printing ---------------------------------------------
SURFACE = [
    "lib.{d}", "lib.{d}.itemsize", "lib.{d}.is_floating_point", "lib.{d}.is_signed",
    "lib.zeros(2, 3, dtype=lib.{d})", "lib.ones(3, dtype=lib.{d})",
    "lib.full((2,), 7, dtype=lib.{d})", "lib.arange(5, dtype=lib.{d})",
    "lib.tensor([1.5, 2.25, -3.0], dtype=lib.{d})", "lib.tensor(3, dtype=lib.{d})",
    "lib.tensor([[1, 2]], dtype=lib.{d}).t()", "lib.zeros(0, dtype=lib.{d})",
    "lib.tensor([1, 2]).to(lib.{d})", "lib.tensor([1.5, 2.]).to(dtype=lib.{d}) * 2",
    "lib.ones(2, dtype=lib.{d}).sum()", "lib.tensor([1, 2], dtype=lib.{d}).type()",
    "lib.tensor([3, 4], dtype=lib.{d})[1]", "lib.tensor([1, 2], dtype=lib.{d}) > 1",
    "lib.tensor([1, 2], dtype=lib.{d}).float()", "lib.tensor([1, 2], dtype=lib.{d}).tolist()",
    "lib.tensor([1, 2], dtype=lib.{d}) + 1", "lib.tensor([1, 2], dtype=lib.{d}) * 1.5",
    "lib.tensor([1, 2], dtype=lib.{d}).element_size()",
    "lib.from_numpy(np.array([1, 2], np.{d}))",
    "lib.zeros_like(lib.ones(2, dtype=lib.{d}))", "lib.full_like(lib.ones(2, dtype=lib.{d}), 3)",
]


@pytest.mark.parametrize("code", [c.format(d=d) for d in NARROW for c in SURFACE
                                  # NumPy has no bfloat16 of its own (torch reads no ml_dtypes)
                                  if not (d == "bfloat16" and "from_numpy" in c)])
def test_creation_casting_and_printing_match_torch(torch, code):
    _same(code, torch)


@pytest.mark.parametrize("code", [
    "lib.half", "lib.int", "lib.short", "lib.tensor([1.7, -2.]).half()",
    "lib.tensor([1.7, -2.]).bfloat16()", "lib.tensor([1.7, -2.]).int()",
    "lib.tensor([1.7, -2.]).short()", "lib.tensor([1.7, -2.]).char()",
    "lib.tensor([1.7, 2.]).byte()", "lib.HalfTensor([1, 2])", "lib.BFloat16Tensor([1, 2])",
    "lib.IntTensor([1, 2])", "lib.ShortTensor([1, 2]).type()", "lib.CharTensor([1]).type()",
    "lib.ByteTensor([1, 2]).type()", "lib.tensor([1., 2.]).half().type()",
    "lib.tensor([1., 2.]).bfloat16().type()", "lib.tensor([1., 2.]).type(lib.HalfTensor)",
    "lib.tensor([1., 2.]).type('torch.IntTensor')",
    "lib.tensor([0.1, 1e-5, 300.], dtype=lib.bfloat16)",
    "lib.tensor([0.1, 1e-5, 300.], dtype=lib.float16)", "lib.tensor([70000.], dtype=lib.float16)",
    "lib.tensor([[0.5, 2.], [1e4, -3.]], dtype=lib.float16)",
    "lib.tensor([1.5, 2.5], dtype=lib.float16).item()",
    "lib.tensor([1., 2.], dtype=lib.float16, requires_grad=True)",
    "lib.tensor([1., 2.], dtype=lib.bfloat16, requires_grad=True) * 2",
    "lib.linspace(0, 1, 5, dtype=lib.float16)", "lib.eye(2, dtype=lib.int32)",
    "lib.rand(3, dtype=lib.float16).dtype", "lib.randn(2, dtype=lib.bfloat16).dtype",
    "lib.empty(2, dtype=lib.bfloat16).dtype", "lib.randint(0, 5, (3,), dtype=lib.int32).dtype",
    "lib.tensor(np.array([1, 2], np.int32))", "lib.tensor(np.array([1., 2.], np.float16))",
    "isinstance(lib.ones(2, dtype=lib.float16), lib.HalfTensor)",
    "isinstance(lib.ones(2), lib.HalfTensor)",
])
def test_named_casts_legacy_types_and_printing_match_torch(torch, code):
    _same(code, torch)


def test_from_numpy_shares_float16_and_int32_memory():
    for a in (np.array([1.5, 2.5], np.float16), np.array([3, 4], np.int32)):
        t = sg.from_numpy(a)
        assert t.dtype.np == a.dtype
        a[0] = 7
        assert t[0].item() == 7  # the same memory, as torch.from_numpy


# -- promotion ------------------------------------------------------------------------------
@pytest.mark.parametrize("a", ALL)
@pytest.mark.parametrize("b", ALL)
def test_promotion_matches_torch(torch, a, b):
    _same(f"lib.promote_types(lib.{a}, lib.{b})", torch)
    _same(f"(lib.ones(2, dtype=lib.{a}) + lib.ones(2, dtype=lib.{b})).dtype", torch)
    _same(f"(lib.ones(2, dtype=lib.{a}) + lib.ones((), dtype=lib.{b})).dtype", torch)
    _same(f"(lib.ones((), dtype=lib.{a}) * lib.ones((), dtype=lib.{b})).dtype", torch)


@pytest.mark.parametrize("code", [
    "lib.tensor([1, 2], dtype=lib.int32) * 2.5", "lib.tensor([1, 2], dtype=lib.int32) + 7",
    "lib.tensor([1, 2], dtype=lib.float16) * 2.5", "lib.tensor([1, 2], dtype=lib.bfloat16) + 7",
    "lib.tensor([5, 2], dtype=lib.int32) / 2", "lib.tensor([1, 2], dtype=lib.uint8) - 3",
    "lib.tensor([1, 2], dtype=lib.int16) * lib.tensor([1, 2], dtype=lib.uint8)",
    "lib.tensor([1, 2], dtype=lib.int8) + lib.tensor([1, 2], dtype=lib.uint8)",
    "lib.tensor([1, 2], dtype=lib.float16) + lib.tensor(2., dtype=lib.float64)",
    "lib.tensor([1, 2], dtype=lib.int32) + lib.tensor(2., dtype=lib.float16)",
    "lib.tensor([1, 2], dtype=lib.int32).sum().dtype", "lib.tensor([1, 2], dtype=lib.uint8).sum()",
    "lib.where(lib.tensor([True, False]), lib.ones(2, dtype=lib.float16), 0.)",
    "lib.tensor([1, 2], dtype=lib.int32).mean()", "lib.tensor([1, 2]).mean()",
    "lib.tensor([1, 2], dtype=lib.uint8).mean()",
    "lib.mm(lib.ones(2, 2, dtype=lib.float16), lib.ones(2, 2))",
    "lib.mm(lib.ones(2, 2, dtype=lib.float64), lib.ones(2, 2, dtype=lib.bfloat16))",
    "lib.cat([lib.ones(1, dtype=lib.float16), lib.ones(1, dtype=lib.bfloat16)])",
])
def test_scalar_and_zero_dim_promotion_match_torch(torch, code):
    _same(code, torch)


def test_set_default_dtype_half_matches_torch(torch, default_dtype):
    for lib in (sg, torch):
        lib.set_default_dtype(lib.bfloat16)
    for code in ("lib.tensor(1.5)", "lib.zeros(2)", "lib.tensor([1, 2]) * 0.5",
                 "lib.get_default_dtype()"):
        _same(code, torch)


# -- arithmetic and autograd ----------------------------------------------------------------
#: op, and how many roundings may fall differently between the two libraries (see top)
OPS = [
    ("x + y", 0), ("x - y", 0), ("x * y", 0), ("x / y", 2), ("x @ m", 2), ("x.sum()", 2),
    ("x.mean()", 2), ("x.exp()", 1), ("x.tanh()", 1), ("x.relu()", 0), ("x.softmax(-1)", 2),
    ("x.sum(0)", 1), ("x ** 2", 1), ("x.sigmoid()", 1), ("x.log_softmax(-1)", 2),
    ("((x * y).tanh() @ m).exp().mean()", 4), ("x.abs().sqrt()", 1), ("x * 3 - 1", 1),
    ("(x + y.sum(0)).max(1).values", 2), ("x.clamp(-0.5, 0.5)", 0),
]


def _np(t) -> np.ndarray:
    return np.asarray(t.detach().float().numpy(), dtype=np.float64)


@pytest.mark.parametrize("d", HALVES)
@pytest.mark.parametrize("expr,roundings", OPS)
def test_half_arithmetic_and_gradients_match_torch(torch, d, expr, roundings):
    rng = np.random.default_rng(0)
    data = {"x": rng.standard_normal((4, 5)), "y": rng.uniform(0.5, 2, (4, 5)),
            "m": rng.standard_normal((5, 3))}
    results = {}
    for lib in (torch, sg):
        leaves = {k: lib.tensor(v, dtype=getattr(lib, d), requires_grad=True)
                  for k, v in data.items()}
        out = eval(expr, {}, leaves)
        g = lib.tensor(np.random.default_rng(5).uniform(-1, 1, tuple(out.shape)),
                       dtype=getattr(lib, d))  # the same for both libraries
        out.backward(g)
        results[lib] = [out] + [leaves[k].grad for k in data]
    eps = float(torch.finfo(getattr(torch, d)).eps)
    for ref, got in zip(results[torch], results[sg]):
        if ref is None:
            assert got is None
            continue
        assert str(got.dtype) == str(ref.dtype).replace("torch", "symgrad")
        a, b = _np(ref), _np(got)
        # roundings of one eps each, at the size of the values: half precision rounds
        # the chain's intermediate results (a gradient adds the backward's own steps)
        bound = (roundings + 1) * eps * max(np.abs(a).max(), eps)
        np.testing.assert_allclose(b, a, rtol=0, atol=bound, err_msg=expr)


@pytest.mark.parametrize("d", HALVES)
def test_elementwise_results_are_rounded_once_from_float32(d):
    """x * y + exp(x) on half tensors equals the float32 result of each op rounded once,
    which a computation in the half dtype itself (NumPy's bfloat16 loops) does not give."""
    rng = np.random.default_rng(1)
    x = sg.tensor(rng.standard_normal(300), dtype=getattr(sg, d))
    y = sg.tensor(rng.standard_normal(300), dtype=getattr(sg, d))
    half = getattr(sg, d).np
    xf, yf = x.float().numpy(), y.float().numpy()
    want = ((xf * yf).astype(half).astype(np.float32) + np.exp(xf).astype(half)
            .astype(np.float32)).astype(half)
    np.testing.assert_array_equal((x * y + x.exp()).numpy(), want)


@pytest.mark.parametrize("d", HALVES)
def test_half_sums_accumulate_in_float32(torch, d):
    """A sum of 5000 ones is 5000 (a half-precision accumulator stops at 2048 for float16,
    256 for bfloat16), in a full reduction, a reduction over dim 0, and the gradient of
    a broadcast bias (the engine's sum over leading dims)."""
    x = sg.ones(5000, 2, dtype=getattr(sg, d))
    assert x.sum().item() == torch.ones(5000, 2, dtype=getattr(torch, d)).sum().item()
    assert x.sum(0).tolist() == torch.ones(5000, 2, dtype=getattr(torch, d)).sum(0).tolist()
    b = sg.zeros(2, dtype=getattr(sg, d), requires_grad=True)
    (x + b).backward(sg.ones(5000, 2, dtype=getattr(sg, d)))
    assert b.grad.dtype is getattr(sg, d)
    tb = torch.zeros(2, dtype=getattr(torch, d), requires_grad=True)
    (torch.ones(5000, 2, dtype=getattr(torch, d)) + tb).backward(
        torch.ones(5000, 2, dtype=getattr(torch, d)))
    assert b.grad.tolist() == tb.grad.tolist()


@pytest.mark.parametrize("d", HALVES)
def test_half_tensors_never_reach_a_numba_kernel(monkeypatch, d):
    """Above the fused and parallel thresholds, every kernel call gets float32/float64
    arrays: the half operands were widened before the backend saw them."""
    from symgrad.backends.cpu import backend as cpu_mod

    monkeypatch.setattr(cpu_mod, "FUSED_MIN", 2)
    monkeypatch.setattr(cpu_mod, "PARALLEL_MIN", 8)
    seen = []
    real = cpu_mod._run

    def spy(name, n, *args):
        seen.append({a.dtype for a in args if isinstance(a, np.ndarray)})
        return real(name, n, *args)

    monkeypatch.setattr(cpu_mod, "_run", spy)
    rng = np.random.default_rng(2)
    x = sg.tensor(rng.standard_normal((64, 32)), dtype=getattr(sg, d), requires_grad=True)
    w = sg.tensor(rng.standard_normal((32, 16)), dtype=getattr(sg, d), requires_grad=True)
    loss = ((x @ w).tanh() * 2 + (x @ w).relu()).sigmoid().mean()
    loss.backward()
    assert seen, "the kernels were not exercised (thresholds)"
    assert all(dt <= {np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64),
                      np.dtype(np.bool_)} for dt in seen), seen
    assert x.grad.dtype is getattr(sg, d) and w.grad.dtype is getattr(sg, d)


def test_int32_arithmetic_matches_torch(torch):
    for code in ("lib.tensor([7, -3], dtype=lib.int32) * lib.tensor([2, 5], dtype=lib.int32)",
                 "lib.tensor([7, -3], dtype=lib.int32).max()",
                 "lib.tensor([[1, 2], [3, 4]], dtype=lib.int32) @ "
                 "lib.tensor([[1, 2], [3, 4]], dtype=lib.int32)",
                 "lib.tensor([7, -3], dtype=lib.int32).abs()",
                 "lib.tensor([7, -3], dtype=lib.int16).cumsum(0)"):
        _same(code, torch)


# -- save / load (the CUDA refusal: tests/cuda/test_cuda_half_refused.py) -----------------------
@pytest.mark.parametrize("d", NARROW)
def test_save_load_round_trip_keeps_the_dtype(tmp_path, d):
    t = sg.tensor([1.5, -2.0, 3.0, 100.0]).to(getattr(sg, d))
    path = tmp_path / "t.pt"
    sg.save({"t": t, "dtype": getattr(sg, d)}, path)
    back = sg.load(path)
    assert back["t"].dtype is getattr(sg, d) and back["dtype"] is getattr(sg, d)
    np.testing.assert_array_equal(back["t"].numpy().view(np.uint8), t.numpy().view(np.uint8))


# -- the verifier -------------------------------------------------------------------------------
def _float16_graph(wrong: bool):
    class Twice(sg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * (2.5 if wrong else 2)  # 25% off: far outside float16 rounding

        @staticmethod
        def sympy(x):
            return 2 * x

    a = sg.tensor([0.5, -1.25, 2.0], dtype=sg.float16, requires_grad=True)
    b = sg.tensor([1.5, 0.25, -0.75], requires_grad=True)
    loss = (Twice.apply(a) * b).sum()
    loss.backward(retain_graph=True)
    return loss


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_verify_checks_float16_graphs_both_ways(mode):
    assert sg.verify(_float16_graph(wrong=False), mode=mode).ok
    assert not sg.verify(_float16_graph(wrong=True), mode=mode).ok


def test_verify_refuses_bfloat16_graphs_rather_than_guess():
    a = sg.tensor([0.5, -1.25], dtype=sg.bfloat16, requires_grad=True)
    loss = (a.float() * 3).sum()  # bfloat16 only at the leaf
    loss.backward(retain_graph=True)
    with pytest.raises(NotImplementedError, match="bfloat16 tensors"):
        sg.verify(loss)


def test_ml_dtypes_loads_on_first_use_of_bfloat16():
    """``import symgrad`` does not pay for ml_dtypes; a bfloat16 array met first (before
    ``symgrad.bfloat16`` was ever named) is still read as bfloat16."""
    import subprocess
    import sys

    code = ("import sys, symgrad as sg\n"
            "assert 'ml_dtypes' not in sys.modules\n"
            "import numpy as np, ml_dtypes\n"
            "t = sg.from_numpy(np.array([2.5], ml_dtypes.bfloat16))\n"
            "assert t.dtype is sg.bfloat16 and (t * 2).tolist() == [5.0]\n"
            "assert isinstance(t, sg.BFloat16Tensor)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("d", HALVES)
def test_compile_runs_half_precision_eagerly_and_says_why(d):
    rng = np.random.default_rng(3)
    w = sg.tensor(rng.standard_normal((300, 4)), dtype=getattr(sg, d), requires_grad=True)
    x = sg.tensor(rng.standard_normal((8, 300)), dtype=getattr(sg, d))

    def step(x):
        loss = ((x @ w).tanh() * 2 + 1).sum()
        loss.backward()
        return loss

    want = step(x)
    want_grad = w.grad.clone()
    w.grad = None
    with pytest.warns(UserWarning, match="float16/bfloat16 tensors run eagerly"):
        got = sg.compile(step)(x)
    assert got.dtype is want.dtype and got.item() == want.item()
    np.testing.assert_array_equal(w.grad.float().numpy(), want_grad.float().numpy())


@pytest.mark.parametrize("d", HALVES)
@pytest.mark.parametrize("code,ulps", [
    ("x.add_(y)", 0), ("x.mul_(y)", 0), ("x.div_(y)", 0), ("x.mul_(0.1)", 0), ("x.exp_()", 0),
    ("x.clamp_(-0.5, 0.5)", 0), ("x.copy_(y)", 0), ("x.fill_(0.1)", 0),
    ("x.addcmul_(y, y, value=0.5)", 1),
    # torch fuses a + alpha * b into one float32 fma: one float32 rounding apart, which
    # moves the half result by at most one unit in the last place
    ("x.sub_(y, alpha=0.3)", 1), ("x.add_(1e-3)", 1),
])
def test_half_inplace_arithmetic_is_rounded_once_like_torch(torch, d, code, ulps):
    """In-place arithmetic on a half tensor runs the op in float32 (the NumPy kernels
    would round a Python scalar to the half dtype first: x.mul_(0.1) would differ)."""
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((3, 400)), rng.uniform(0.5, 2, (3, 400))
    got = []
    for lib in (torch, sg):
        x = lib.tensor(a, dtype=getattr(lib, d))
        y = lib.tensor(b, dtype=getattr(lib, d))
        eval(code, {}, {"x": x, "y": y})
        got.append(x.float().numpy().astype(np.float64))
    ulp = np.abs(np.spacing(got[0].astype(getattr(sg, d).np)).astype(np.float64))
    assert (np.abs(got[1] - got[0]) <= ulps * ulp).all(), code


@pytest.mark.parametrize("d", HALVES)
@pytest.mark.parametrize("code", [
    "x", "x - 0.3", "0.3 - x", "x + 0.3", "x + 1e-3", "x * 0.7", "x / 0.3", "x ** 1.3",
    "x.abs() ** 1.3", "1.3 ** x", "x > 0.3", "x == 0.3", "x <= 0.3", "x.clamp(0.3, 0.7)",
    "lib.tensor(a).to(x.dtype)", "lib.zeros(3000, dtype=x.dtype).copy_(lib.tensor(a))",
    "x.add_(0.3)", "x.mul_(0.7)",
])
def test_half_scalar_operands_and_conversions_match_torch_bit_for_bit(torch, d, code):
    """torch rounds the Python number of add/sub/pow/comparisons to the tensor's half dtype
    (mul/div read it as float32), and converts float64 to half through float32; values
    on both sides of half(0.3) make the comparisons tell."""
    a = np.random.default_rng(6).uniform(-2, 2, 3000)
    a[:20], a[20:40] = 0.30078125, 0.2998046875
    got = []
    for lib in (torch, sg):
        x = lib.tensor(a, dtype=getattr(lib, d))
        got.append(eval(code, {"lib": lib}, {"x": x, "a": a}).float().numpy())
    np.testing.assert_array_equal(got[1], got[0], err_msg=code)
