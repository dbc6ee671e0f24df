"""The tensor API PyTorch programs use, side by side with torch 2.13 (issue 20, item 2).

``Tensor(data)`` and the legacy ``FloatTensor``-style constructors, ``equal``/``allclose``/
``isclose``, the default dtype and device, the in-place random initialisers and the in-place
form of every elementwise op: values, dtypes, gradients, grad_fn names, saved operands,
``_version``, and the type and wording of every error, each compared with torch.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad.functional import _elementwise_functions


def _outcome(lib, code: str, **env):
    """What running ``code`` gives: ('ok', repr-able value) or (error type, message), with
    the library names taken out so both sides read alike."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = eval(code, {"lib": lib, "np": np, **env})  # noqa: S307 - test tables
    except Exception as e:  # noqa: BLE001 - the error is what is compared
        msg = re.sub(r"\b(torch|symgrad)\.", "", str(e))
        return type(e).__name__, msg
    if isinstance(value, tuple):  # Size
        value = tuple(value)
    elif type(value).__name__ == "dtype":
        value = str(value).split(".")[-1]
    elif isinstance(value, (sg.Tensor, sg.device, str)) or \
            type(value).__module__.startswith("torch"):
        value = re.sub(r"\b(torch|symgrad)\.", "", value if isinstance(value, str)
                       else repr(value))
    return "ok", value, [str(w.message)[:80] for w in caught]


def _same(code: str, torch, **env) -> None:
    ours = _outcome(sg, code, **{k: v[0] for k, v in env.items()})
    theirs = _outcome(torch, code, **{k: v[1] for k, v in env.items()})
    assert ours == theirs, f"{code}\n  symgrad: {ours}\n  torch:   {theirs}"


@pytest.fixture
def default_dtype(torch):
    """Restore both libraries' default dtype and device after a test changes them."""
    yield
    for lib in (sg, torch):
        lib.set_default_dtype(lib.float32)
        lib.set_default_device(None)


# -- 1. Tensor(data), Tensor(*sizes), Tensor(), legacy constructors ---------------------------

CONSTRUCT = [
    "lib.Tensor([1, 2])", "lib.Tensor([[1.5, 2], [3, 4]])", "lib.Tensor([True, False])",
    "lib.Tensor(2, 3).shape", "lib.Tensor(2, 3).dtype", "lib.Tensor(0)", "lib.Tensor()",
    "lib.Tensor([])", "lib.Tensor([[]])", "lib.Tensor((2, 3))", "lib.Tensor(range(3))",
    "lib.Tensor(lib.zeros(2, 3).shape).shape", "lib.Tensor(np.array([1, 2]))",
    "lib.Tensor(np.array([1.5, 2.0]))", "lib.Tensor(np.array(3.0))", "lib.Tensor(np.int64(2))",
    "lib.Tensor(lib.tensor([1, 2]))", "lib.Tensor(lib.tensor([1.0, 2.0], dtype=lib.float64))",
    "lib.Tensor(2, device='cpu')", "lib.Tensor([1], device='cpu')",
    "lib.Tensor(2.5)", "lib.Tensor('a')", "lib.Tensor(None)", "lib.Tensor(True)",
    "lib.Tensor(np.float64(2.0))", "lib.Tensor(-1)", "lib.Tensor(2, -3)",
    "lib.Tensor(2, 3.0)", "lib.Tensor(3, [1])", "lib.Tensor([1, None])",
    "lib.Tensor([[1, 2], [3]])",
    "lib.FloatTensor([1, 2])", "lib.DoubleTensor([1, 2])", "lib.LongTensor([1.7, -2.2])",
    "lib.BoolTensor([1, 0, 2])", "lib.LongTensor(2, 3).shape", "lib.LongTensor()",
    "lib.BoolTensor()", "lib.FloatTensor(lib.tensor([1.0, 2.0]))",
    "lib.LongTensor(lib.tensor([1, 2]))", "lib.LongTensor(lib.tensor([1.0, 2.0]))",
    "lib.FloatTensor(lib.tensor([1.0], dtype=lib.float64))", "lib.DoubleTensor(2).dtype",
    "isinstance(lib.zeros(2), lib.FloatTensor)",
    "isinstance(lib.zeros(2, dtype=lib.float64), lib.FloatTensor)",
    "isinstance(lib.zeros(2, dtype=lib.float64), lib.DoubleTensor)",
    "isinstance(lib.zeros(2, dtype=lib.int64), lib.LongTensor)",
    "isinstance(lib.zeros(2, dtype=lib.bool), lib.BoolTensor)",
    "isinstance(lib.zeros(2).requires_grad_(), lib.FloatTensor)",
    "isinstance(lib.ones(2) * 2, lib.FloatTensor)", "isinstance(lib.zeros(2), lib.LongTensor)",
    "isinstance(lib.Tensor([1]), lib.Tensor)", "isinstance(lib.FloatTensor([1]), lib.Tensor)",
    "issubclass(lib.FloatTensor, lib.Tensor)", "type(lib.FloatTensor([1])) is lib.Tensor",
    "type(lib.Tensor([1])) is lib.Tensor", "lib.FloatTensor.__name__",
    "lib.zeros(2).type()", "lib.zeros(2, dtype=lib.float64).type()",
    "lib.zeros(2, dtype=lib.int64).type()", "lib.zeros(2, dtype=lib.bool).type()",
    "lib.zeros(2).type(lib.LongTensor)", "lib.zeros(2).type('torch.DoubleTensor')",
    "lib.zeros(2).type(lib.float64)", "lib.zeros(2).type('torch.float64')",
]


#: torch leaves these uninitialized (symgrad fills zeros): shape and dtype are compared
UNINITIALIZED = {"lib.Tensor(np.int64(2))", "lib.Tensor(2, device='cpu')"}


@pytest.mark.parametrize("code", CONSTRUCT)
def test_tensor_constructors_match_torch(torch, code):
    if code in UNINITIALIZED:
        ours, theirs = eval(code, {"lib": sg, "np": np}), eval(code, {"lib": torch, "np": np})
        assert tuple(ours.shape) == tuple(theirs.shape)
        assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
        assert not ours.numpy().any()
        return
    _same(code, torch)


def test_tensor_of_a_tensor_is_an_alias_like_torch(torch):
    for lib in (sg, torch):
        x = lib.tensor([1.0, 2.0], requires_grad=True)
        a = lib.Tensor(x)
        assert a is not x and a.grad_fn.name() == "AliasBackward0"
        assert a.grad_fn.next_functions[0][0].variable is x
        (a * 3).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])
        b = lib.tensor([1.0, 2.0])
        c = lib.Tensor(b)
        c.add_(1)  # same storage: b sees it, and the version is shared
        assert b.tolist() == [2.0, 3.0] and b._version == c._version == 1


def test_tensor_class_still_checks_instances_and_parameters_still_build():
    t = sg.tensor([1.0])
    assert isinstance(t, sg.Tensor) and isinstance(sg.Tensor([1]), sg.Tensor)
    p = sg.nn.Parameter(sg.Tensor(2, 3))
    assert isinstance(p, sg.Tensor) and p.requires_grad and p.shape == (2, 3)
    assert repr(sg.FloatTensor) == "<class 'symgrad.FloatTensor'>"


def test_tensor_follows_the_default_dtype_and_float_tensor_does_not(torch, default_dtype):
    for lib in (sg, torch):
        lib.set_default_dtype(lib.float64)
    for code in ("lib.Tensor([1, 2])", "lib.Tensor(2).dtype", "lib.Tensor()",
                 "lib.FloatTensor([1])", "lib.Tensor(np.array([1.0], dtype=np.float32))",
                 "lib.Tensor(lib.tensor([1.0], dtype=lib.float32))",
                 "isinstance(lib.zeros(2), lib.DoubleTensor)"):
        _same(code, torch)


# -- 2. equal, allclose, isclose --------------------------------------------------------------

COMPARE = [
    "lib.equal(lib.tensor([1.0, 2]), lib.tensor([1.0, 2]))",
    "lib.equal(lib.tensor([1.0, 2]), lib.tensor([1, 2]))",
    "lib.equal(lib.tensor([1.0, 2]), lib.tensor([1.0, 2], dtype=lib.float64))",
    "lib.equal(lib.tensor([1.0, 2]), lib.tensor([1.0, 2, 3]))",
    "lib.equal(lib.tensor([1.0, 2]), lib.tensor([[1.0, 2]]))",
    "lib.equal(lib.tensor([float('nan')]), lib.tensor([float('nan')]))",
    "lib.equal(lib.tensor([True]), lib.tensor([1]))",
    "lib.equal(lib.tensor([1.0], requires_grad=True), lib.tensor([1.0]))",
    "lib.equal(lib.tensor([]), lib.tensor([]))",
    "lib.equal(lib.tensor([16777217]), lib.tensor([16777216.0]))",
    "lib.equal(lib.tensor([1.0, 2]), [1.0, 2])", "lib.equal(lib.tensor([1.0, 2]), 1.0)",
    "lib.equal([1.0], lib.tensor([1.0]))",
    "lib.tensor([1.0, 2]).equal(lib.tensor([1.0, 2]))",
    "lib.allclose(lib.tensor([1.0, 2]), lib.tensor([1.0, 2 + 1e-5]))",
    "lib.allclose(lib.tensor([1.0, 2]), lib.tensor([1.0, 2 + 1e-4]))",
    "lib.allclose(lib.tensor([1e-9]), lib.tensor([0.0]))",
    "lib.allclose(lib.tensor([2e-8]), lib.tensor([0.0]))",
    "lib.allclose(lib.tensor([1.0, 2]), lib.tensor([1, 2]))",
    "lib.allclose(lib.tensor([1.0, 2]), lib.tensor([1.0, 2], dtype=lib.float64))",
    "lib.allclose(lib.tensor([1, 2]), lib.tensor([1, 2]))",
    "lib.allclose(lib.tensor([1.0, 1.0]), lib.tensor([1.0]))",
    "lib.allclose(lib.tensor([1.0, 2]), lib.tensor([1.0, 2, 3]))",
    "lib.allclose(lib.tensor([1.0, float('nan')]), lib.tensor([1.0, float('nan')]))",
    "lib.allclose(lib.tensor([1.0, float('nan')]), lib.tensor([1.0, float('nan')]), "
    "equal_nan=True)",
    "lib.allclose(lib.tensor([float('inf')]), lib.tensor([float('inf')]))",
    "lib.allclose(lib.tensor([float('inf')]), lib.tensor([float('-inf')]))",
    "lib.allclose(lib.tensor([1.0, 2]), 1.0)",
    "lib.allclose(lib.tensor([1.0]), lib.tensor([1.0]), rtol=-1)",
    "lib.allclose(lib.tensor([1.0]), lib.tensor([1.0]), atol=-1)",
    "lib.allclose(lib.tensor([1.0]), lib.tensor([1.0]), rtol=float('nan'))",
    "lib.allclose(lib.tensor([1.0]), lib.tensor([1.0]), rtol='a')",
    "lib.isclose(lib.tensor([1.0]), lib.tensor([1.0]), atol=None)",
    "lib.isclose(lib.tensor([1.0]), lib.tensor([1.0]), equal_nan=1)",
    "lib.allclose(lib.tensor([True]), lib.tensor([True]))",
    "lib.allclose(lib.tensor([]), lib.tensor([]))",
    "lib.tensor([1.0, 2]).allclose(lib.tensor([1.0, 2.1]), 0.1)",
    "lib.tensor([1.0, 2]).allclose(lib.tensor([1.0, 2.1]), 0.01, 0.01, False)",
    "lib.isclose(lib.tensor([1.0, 2]), lib.tensor([1.0, 2.1]))",
    "lib.isclose(lib.tensor([1.0, 2]), lib.tensor([1, 2]))",
    "lib.isclose(lib.tensor([1, 2]), lib.tensor([1, 3]))",
    "lib.isclose(lib.tensor([1, 2]), lib.tensor([1, 3]), atol=1)",
    "lib.isclose(lib.tensor([1, 2]), lib.tensor([1, 3]), rtol=0.5)",
    "lib.isclose(lib.tensor([1, 2]), lib.tensor([1, 3]), rtol=0.33)",
    "lib.isclose(lib.tensor([True, False]), lib.tensor([True, True]))",
    "lib.isclose(lib.tensor([True, False]), lib.tensor([True, True]), atol=1)",
    "lib.isclose(lib.tensor([1.0, 2]), lib.tensor([[1.0], [2]]))",
    "lib.isclose(lib.tensor([1.0, 2]), lib.tensor([1.0, 2, 3]))",
    "lib.isclose(lib.tensor([[1.0, 2]] * 2), lib.tensor([[1.0], [2], [3]]))",
    "lib.isclose(lib.tensor([1.0, 2]), 2.0)", "lib.isclose(1.0, lib.tensor([1.0]))",
    "lib.isclose(lib.tensor([1.0, 2], requires_grad=True), lib.tensor([1.0, 2]))",
    "lib.isclose(lib.tensor([1.0]), lib.tensor([1.0]), rtol=-1)",
    "lib.isclose(lib.tensor([1.0]), lib.tensor([1.0]), atol=-0.5)",
    "lib.isclose(lib.tensor([1.0, float('nan')]), lib.tensor([1.0, float('nan')]))",
    "lib.isclose(lib.tensor([1.0, float('nan')]), lib.tensor([1.0, float('nan')]), "
    "equal_nan=True)",
    "lib.isclose(lib.tensor([float('inf'), float('-inf'), float('inf'), 1.0]), "
    "lib.tensor([float('inf'), float('-inf'), 3e38, float('nan')]))",
    "lib.isclose(lib.tensor([1.0, 2]), lib.tensor([1.5, 2]), rtol=0, atol=0)",
    "lib.isclose(lib.tensor([1.0, 2], dtype=lib.float64), lib.tensor([1.0, 2]))",
    "lib.isclose(lib.tensor(1.0), lib.tensor([1.0, 1.0 + 1e-6, 1.0 + 1e-4]))",
    "lib.tensor([1.0, 2]).isclose(lib.tensor([1.0, 2.0001]), 1e-3, 1e-3, True)",
    "lib.tensor([1.0, 2]).isclose(lib.tensor([1.0, 2.0001]), rtol=0.0, atol=1e-5)",
]


@pytest.mark.parametrize("code", COMPARE)
def test_equal_allclose_isclose_match_torch(torch, code):
    _same(code, torch)


def test_isclose_tolerances_are_applied_in_the_tensor_dtype_like_torch(torch, rng):
    a = rng.normal(size=2000).astype(np.float32)
    b = (a * (1 + rng.normal(scale=1e-5, size=2000))).astype(np.float32)
    for dt in (np.float32, np.float64):
        for kw in ({}, {"rtol": 1e-6, "atol": 1e-7}, {"rtol": 0.0, "atol": 1e-5}):
            ours = sg.isclose(sg.tensor(a.astype(dt)), sg.tensor(b.astype(dt)), **kw)
            theirs = torch.isclose(torch.tensor(a.astype(dt)), torch.tensor(b.astype(dt)), **kw)
            np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    ours = sg.isclose(sg.tensor([1.0]), sg.tensor([1.0]))
    assert ours.dtype is sg.bool and not ours.requires_grad and ours.grad_fn is None


# -- 3. default dtype and device --------------------------------------------------------------

CREATED = [
    "lib.tensor(1.).dtype", "lib.tensor([1, 2]).dtype", "lib.tensor(1.5)",
    "lib.tensor([0.5, 2])", "lib.zeros(2).dtype", "lib.ones(2).dtype", "lib.rand(2).dtype",
    "lib.randn(2).dtype", "lib.full((2,), 1.).dtype", "lib.full((2,), 1).dtype",
    "lib.arange(3).dtype", "lib.arange(3.).dtype", "lib.linspace(0, 1, 3).dtype",
    "lib.eye(2).dtype", "lib.empty(2).dtype", "lib.Tensor([1]).dtype",
    "lib.FloatTensor([1]).dtype", "lib.tensor(np.float32(1)).dtype",
    "lib.tensor(np.float64(1)).dtype", "lib.tensor(np.array([1.])).dtype",
    "(lib.tensor([1, 2]) / 2).dtype", "(lib.tensor([1, 2]) * 1.5).dtype",
    "lib.tensor([1, 2]).sqrt().dtype", "lib.nn.Linear(2, 2).weight.dtype",
    "lib.randint(0, 3, (2,)).dtype", "lib.zeros_like(lib.tensor([1, 2])).dtype",
    "lib.tensor([1., 2]).mean().dtype", "lib.get_default_dtype()", "(lib.tensor(1.) + 1)",
    "lib.tensor(1) + 0.5", "lib.tensor([1, 2]).float().dtype", "lib.zeros(2, dtype=lib.float32)",
    "lib.zeros(0)", "lib.zeros(0, dtype=lib.float32)", "lib.tensor([1, 2]).pow(0.5)",
    "lib.tensor([1, 2]).clamp(0.5)", "lib.where(lib.tensor([True, False]), 1., 0)",
]


@pytest.mark.parametrize("default", ["float64", "float32"])
@pytest.mark.parametrize("code", CREATED)
def test_default_dtype_decides_what_creation_gives_like_torch(torch, default_dtype, default,
                                                              code):
    for lib in (sg, torch):
        lib.set_default_dtype(getattr(lib, default))
    _same(code, torch)


@pytest.mark.parametrize("arg", ["lib.int64", "lib.bool", "'float64'", "float", "None", "1",
                                 "lib.float32", "lib.float64"])
def test_set_default_dtype_accepts_only_floating_dtypes_like_torch(torch, default_dtype, arg):
    _same(f"lib.set_default_dtype({arg})", torch)
    _same("lib.get_default_dtype()", torch)


def test_set_default_dtype_takes_torch_float_dtypes_and_half(torch, default_dtype):
    sg.set_default_dtype(torch.float64)
    assert sg.get_default_dtype() is sg.float64 and sg.zeros(1).dtype is sg.float64
    sg.set_default_dtype(torch.float16)  # torch 2.13 accepts it too
    assert sg.tensor(1.5).dtype is sg.float16 and (sg.tensor([1, 2]) * 1.5).dtype is sg.float16
    with pytest.raises(TypeError, match="only floating-point types are supported"):
        sg.set_default_dtype(torch.int32)
    with pytest.raises(TypeError, match="positional"):
        sg.set_default_dtype(d=sg.float32)


@pytest.mark.parametrize("code", [
    "lib.set_default_device('cpu')", "lib.set_default_device('cpu:0')",
    "lib.set_default_device(None)", "lib.set_default_device(lib.device('cpu'))",
])
def test_set_default_device_cpu_and_errors_like_torch(torch, default_dtype, code):
    _same(code, torch)
    _same("lib.get_default_device()", torch)
    _same("lib.zeros(2).device", torch)
    _same("lib.tensor([1.0]).device", torch)


def test_set_default_device_other_types_and_cuda(torch, default_dtype):
    with pytest.raises(RuntimeError, match="^Expected one of cpu, cuda device type at start of "
                                           "device string: foo$"):  # torch names 20 types
        sg.set_default_device("foo")
    with pytest.raises(TypeError, match=re.escape(
            "device() received an invalid combination of arguments - got (float)")):
        sg.set_default_device(2.5)
    assert sg.get_default_device() == sg.device("cpu")
    if not sg.cuda.is_available():  # the existing error, at once (torch: at first use)
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            sg.set_default_device("cuda")
        assert sg.get_default_device().type == "cpu"
        return
    sg.set_default_device("cuda")  # pragma: no cover - GPU machines
    assert repr(sg.get_default_device()) == "device(type='cuda', index=0)"
    for t in (sg.zeros(2), sg.rand(2), sg.tensor([1.0]), sg.Tensor(2), sg.arange(3),
              sg.full((2,), 3.0), sg.randint(0, 3, (2,)), sg.eye(2)):
        assert t.device.type == "cuda"
    assert sg.zeros(2, device="cpu").device.type == "cpu"
    assert sg.from_numpy(np.zeros(2)).device.type == "cpu"


# -- 4. in-place random initialisers ---------------------------------------------------------

INITIALISERS = ["uniform_()", "uniform_(-2, 3)", "normal_()", "normal_(1.0, 0.5)",
                "random_()", "random_(5)", "random_(1, 5)", "bernoulli_()",
                "bernoulli_(0.25)", "bernoulli_(p)", "exponential_()", "exponential_(3)",
                "log_normal_()", "cauchy_()", "geometric_(0.5)", "fill_(2)", "zero_()"]


@pytest.mark.parametrize("call", INITIALISERS)
def test_initialiser_on_a_non_leaf_records_torch_node_with_zero_gradient(torch, call):
    seen = []
    for lib in (sg, torch):
        x = lib.tensor([0.5, -1.0, 2.0], requires_grad=True)
        p = lib.tensor([0.25, 0.5, 1.0], requires_grad=True)
        a = x * 2
        old = a.grad_fn
        assert eval("a." + call, {"a": a, "p": p}) is a
        fn = a.grad_fn
        assert fn.next_functions[0][0] is old and a._version == 1
        kinds = [None if n is None else type(n).__name__ for n, _ in fn.next_functions]
        (a * lib.tensor([1.0, 2.0, 3.0])).sum().backward()
        seen.append((fn.name(), kinds, x.grad.tolist(), a.dtype == lib.float32,
                     sorted(k for k in dir(fn) if k.startswith("_saved_"))))
    assert seen[0] == seen[1]
    assert seen[0][2] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("call", INITIALISERS)
def test_initialiser_on_a_leaf_that_requires_grad_raises_and_no_grad_allows_it(torch, call):
    for lib in (sg, torch):
        x = lib.tensor([0.5, -1.0, 2.0], requires_grad=True)
        p = lib.tensor([0.25, 0.5, 1.0])
        with pytest.raises(RuntimeError, match="^a leaf Variable that requires grad is being "
                                               r"used in an in-place operation\.$"):
            eval("x." + call, {"x": x, "p": p})
        assert x._version == 0 and x.tolist() == [0.5, -1.0, 2.0]
        with lib.no_grad():  # how nn.init fills parameters
            eval("x." + call, {"x": x, "p": p})
        assert x._version == 1 and x.is_leaf and x.requires_grad and x.grad_fn is None


@pytest.mark.parametrize("call", ["uniform_(2, 1)", "normal_(0, -1)", "bernoulli_(2)",
                                  "random_(3, 2)", "exponential_(0)", "geometric_(0)",
                                  "uniform_('a')", "random_(1.5)"])
def test_leaf_error_comes_before_value_checks_and_draws_nothing(torch, call):
    _same(f"lib.zeros(2, requires_grad=True).{call}", torch)
    sg.manual_seed(3)
    with pytest.raises((RuntimeError, TypeError)):
        eval("sg.zeros(2, requires_grad=True)." + call)
    after = sg.rand(3).numpy()
    sg.manual_seed(3)
    np.testing.assert_array_equal(after, sg.rand(3).numpy())


def test_initialisers_are_seeded_by_manual_seed_and_follow_their_law():
    def draw():
        t = sg.empty(20000)
        return [t.uniform_(-2, 3).numpy().copy(), t.normal_(1.0, 0.5).numpy().copy(),
                t.random_(1, 5).numpy().copy(), t.bernoulli_(0.25).numpy().copy(),
                t.exponential_(4.0).numpy().copy(), t.log_normal_(0, 0.5).numpy().copy(),
                t.geometric_(0.5).numpy().copy(), t.cauchy_().numpy().copy()]

    sg.manual_seed(7)
    first = draw()
    sg.manual_seed(7)
    for a, b in zip(first, draw()):
        np.testing.assert_array_equal(a, b)
    u, n, r, b, e, ln, g, c = first
    assert u.min() >= -2 and u.max() < 3 and abs(u.mean() - 0.5) < 0.05
    assert abs(n.mean() - 1.0) < 0.02 and abs(n.std() - 0.5) < 0.02
    assert set(np.unique(r)) == {1.0, 2.0, 3.0, 4.0}
    assert set(np.unique(b)) == {0.0, 1.0} and abs(b.mean() - 0.25) < 0.02
    assert e.min() >= 0 and abs(e.mean() - 0.25) < 0.01
    assert ln.min() > 0 and abs(np.log(ln).std() - 0.5) < 0.02
    assert g.min() >= 1 and abs(g.mean() - 2.0) < 0.05
    assert abs(np.median(c)) < 0.05
    for x in first:
        assert x.dtype == np.float32


def test_initialiser_defaults_dtypes_and_generator():
    sg.manual_seed(0)
    f32 = sg.empty(5000).uniform_(0, 1e-30)  # rounding to float32 never reaches ``to``
    assert (f32.numpy() < np.float32(1e-30)).all()
    assert sg.zeros(1000, dtype=sg.float32).random_().numpy().max() <= 2**24
    assert sg.zeros(1000, dtype=sg.float64).random_().numpy().max() <= 2**53
    assert sg.zeros(1000, dtype=sg.float64).random_().numpy().max() > 2**40
    assert sg.zeros(1000, dtype=sg.int64).random_().numpy().min() >= 0
    assert set(sg.zeros(100, dtype=sg.bool).random_().tolist()) == {True, False}
    assert set(sg.zeros(100, dtype=sg.int64).bernoulli_().tolist()) == {0, 1}
    assert set(sg.zeros(100, dtype=sg.int64).random_(-3, 3).tolist()) == set(range(-3, 3))
    g1, g2 = np.random.default_rng(3), np.random.default_rng(3)
    np.testing.assert_array_equal(sg.empty(4).normal_(generator=g1).numpy(),
                                  sg.empty(4).normal_(generator=g2).numpy())
    with pytest.raises(TypeError, match="argument 'generator'"):
        sg.empty(4).normal_(generator="seed")
    half = sg.zeros(4, 3).bernoulli_(sg.tensor([0.0, 1.0, 0.0]))
    assert half.tolist() == [[0.0, 1.0, 0.0]] * 4


ERRORS = """z.uniform_(2, 1)
z.uniform_(1, 1)
z.uniform_('a')
z.uniform_(float('inf'))
z.uniform_(0, float('inf'))
z.uniform_(-3e38, 3e38)
d.uniform_(-3e38, 3e38).shape
z.uniform_(1, 2, 3)
z.uniform_(**{'from': 1, 'to': 2}).shape
z.uniform_(to=2).shape
i.uniform_()
b.uniform_()
z.normal_(0, -1)
z.normal_(0, float('nan'))
i.normal_()
z.normal_(std=2).shape
z.bernoulli_(2)
z.bernoulli_(-0.1)
z.bernoulli_(lib.tensor([2.0, 0, 0]))
z.bernoulli_(lib.tensor([1, 0, 0]))
z.bernoulli_(lib.tensor([1.0, 0]))
i.bernoulli_().dtype
b.bernoulli_(0.3).dtype
z.bernoulli_(lib.tensor(0.5)).shape
z.exponential_(0)
z.exponential_(-1)
i.exponential_()
b.exponential_()
z.random_(3, 2)
z.random_(0)
z.random_(-1)
z.random_(2**25).shape
z.random_(0, 2**25).shape
d.random_(2**60).shape
i.random_(2**63)
z.random_(1.5)
z.random_(1, 2, 3)
b.random_(3)
b.random_(2).dtype
b.random_().dtype
i.random_().dtype
i.random_(-5, 5).dtype
z.random_(to=5).shape
z.random_(5, None).shape
z.geometric_(0)
z.geometric_(1)
z.geometric_(0.5).shape
i.geometric_(0.5).dtype
b.geometric_(0.5)
z.geometric_()
z.log_normal_(0, 0)
i.log_normal_()
z.cauchy_(0, 0)
i.cauchy_()
b.cauchy_()
i.fill_(2.5)""".split("\n")


@pytest.mark.parametrize("code", ERRORS)
def test_initialiser_arguments_and_errors_match_torch(torch, code):
    envs = [{k: v for k, v in (("z", lib.zeros(3)), ("i", lib.zeros(3, dtype=lib.int64)),
                                ("b", lib.zeros(3, dtype=lib.bool)),
                                ("d", lib.zeros(3, dtype=lib.float64)))} for lib in (sg, torch)]
    _same(code, torch, **{k: (envs[0][k], envs[1][k]) for k in envs[0]})


# -- 5. in-place form of every elementwise op ------------------------------------------------

X = np.array([0.5, -0.25, 0.75, 1.5], dtype=np.float32)
W = np.array([0.5, 1.5, 0.25, 0.75], dtype=np.float32)
C = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)

# call -> rounding steps of the longest chain (values and gradients; exact calls are 0)
INPLACE = {
    "cos_()": 3, "sin_()": 3, "exp_()": 3, "log_()": 3, "tanh_()": 3, "sigmoid_()": 4,
    "relu_()": 0, "sqrt_()": 3, "abs_()": 0, "neg_()": 0, "reciprocal_()": 3, "sign_()": 0,
    "pow_(2)": 2, "pow_(2.5)": 4, "pow_(w)": 6, "pow_(3.0)": 3, "clamp_(-0.3, 0.6)": 0,
    "clamp_(w)": 0, "clamp_(None, w)": 0, "clamp_(min=w, max=w + 1)": 1, "clamp_(max=1)": 0,
    "clamp_min_(0)": 0, "clamp_max_(0.6)": 0, "clamp_min_(w)": 0, "clamp_max_(w)": 0,
    "addcmul_(w, w)": 2, "addcmul_(w, w, value=2)": 2, "gt_(0)": 0, "gt_(w)": 0, "ge_(1)": 0,
    "lt_(w)": 0, "le_(w)": 0, "eq_(0.5)": 0, "ne_(w)": 0, "logical_not_()": 0,
    "logical_and_(w)": 0, "logical_or_(w)": 0, "clip_(0, 1)": 0, "negative_()": 0,
    "true_divide_(w)": 3, "divide_(2)": 1, "multiply_(w)": 2, "subtract_(w, alpha=2)": 2,
    "greater_(0)": 0, "greater_equal_(w)": 0, "less_(w)": 0, "less_equal_(0.5)": 0,
    "not_equal_(w)": 0, "add_(w)": 1, "sub_(2)": 1, "mul_(w)": 2, "div_(w)": 3,
    "log2_()": 3, "log10_()": 3,
    "log1p_()": 3, "expm1_()": 3, "erf_()": 4, "atan2_(w)": 5, "hypot_(w)": 4,
}


def _inplace_run(lib, call):
    x = lib.tensor(X, requires_grad=True)
    w = lib.tensor(W, requires_grad=True)
    a = x * 2  # a non-leaf nothing saved
    old = a.grad_fn
    assert eval("a." + call, {"a": a, "w": w}) is a  # same object, for chaining
    fn = a.grad_fn
    facts = (fn.name(), [None if n is None else type(n).__name__ for n, _ in fn.next_functions],
             sorted(k for k in dir(fn) if k.startswith("_saved_")), a._version, a.is_leaf,
             fn.next_functions[0][0] is old, a.dtype == lib.float32)
    (a * lib.tensor(C)).sum().backward()
    return facts, a.detach().numpy().copy(), x.grad, w.grad


def test_every_elementwise_op_has_its_inplace_form_and_is_tested_here():
    methods = {name + "_" for name in _elementwise_functions()}
    assert methods <= {m for m in dir(sg.Tensor)}
    tested = {call.split("(")[0] for call in INPLACE}
    assert methods <= tested, f"untested in-place forms: {sorted(methods - tested)}"


@pytest.mark.parametrize("call", sorted(INPLACE))
def test_inplace_form_matches_torch(torch, call):
    facts, value, gx, gw = _inplace_run(sg, call)
    tfacts, tvalue, tgx, tgw = _inplace_run(torch, call)
    assert facts == tfacts
    terms = max(INPLACE[call], 1)
    assert_close(value, tvalue, terms=terms)
    assert_close(gx, tgx, terms=terms + 2)
    if tgw is None:
        assert gw is None
    else:
        assert_close(gw, tgw, terms=terms + 2)


def test_saved_self_is_a_clone_and_a_saved_result_is_the_tensor_like_torch(torch):
    seen = []
    for lib in (sg, torch):
        x = lib.tensor([0.5, -0.25, 0.75], requires_grad=True)
        a = x * 2
        a.cos_()  # CosBackward0 saved the old values: torch's original_self, a clone
        s = a.grad_fn._saved_self
        b = x * 2
        b.exp_()  # ExpBackward0 saved its result: b itself, at its new version
        r = b.grad_fn._saved_result
        seen.append((s.grad_fn.name(), s.tolist(), s._version, s is a, r.grad_fn.name(),
                     r._version, r is b, r.tolist() == b.tolist()))
    assert seen[0] == seen[1]


def _version_parts(msg: str):
    m = re.search(r"modified by an inplace operation: \[\w+\.(\w+) \[([\d, ]*)\]\](, which is "
                  r"output (\d+) of (\w+),)? is at version (\d+); expected version (\d+) instead",
                  msg)
    assert m, msg
    return m.groups()


SAVED = {
    "cos_ changes what sin saved": "a = x * 1; y = a.sin(); a.cos_(); y.sum().backward()",
    "add_ after exp_": "a = x * 1; a.exp_(); a.add_(1); a.sum().backward()",
    "mul_ after sigmoid_": "a = x * 1; a.sigmoid_(); a.mul_(2); a.sum().backward()",
    "cos_ after tanh_": "a = x * 1; a.tanh_(); a.cos_(); a.sum().backward()",
    "mul_ by itself": "a = x * 1; a.mul_(a); a.sum().backward()",
    "relu_ of a saved input": "a = x * 1; y = a * w; a.relu_(); y.sum().backward()",
    "uniform_ of a saved input": "a = x * 1; y = a.exp(); b = y * 1; y.uniform_(); "
                                 "b.sum().backward()",
    "clamp_ after sqrt_": "a = x * 1 + 2; a.sqrt_(); a.clamp_(0, 1); a.sum().backward()",
}


@pytest.mark.parametrize("name", sorted(SAVED))
def test_inplace_change_of_a_saved_tensor_fails_backward_like_torch(torch, name):
    msgs = []
    for lib in (sg, torch):
        env = {"x": lib.tensor([0.5, -0.25, 0.75], requires_grad=True),
               "w": lib.tensor([1.0, 2.0, 3.0], requires_grad=True)}
        with pytest.raises(RuntimeError, match="^one of the variables needed for gradient "
                                               "computation has been modified by an inplace "
                                               "operation") as info:
            exec(SAVED[name], env)  # noqa: S102 - test table
        msgs.append(_version_parts(str(info.value)))
    assert msgs[0] == msgs[1]


CHAINS = {
    "cos_ then cos_": "a = x * 1; a.cos_(); a.cos_(); out = a",
    "mul_ w then exp_": "a = x * 1; a.mul_(w); a.exp_(); out = a",
    "sin_ then add_": "a = x * 1; a.sin_(); a.add_(1); out = a",
    "clamp_ then pow_": "a = x * 1; a.clamp_(0, 0.6); a.pow_(w); out = a",
    "hook before tanh_": "a = x * 1; a.register_hook(lambda g: g * 10); a.tanh_(); out = a",
    "retain_grad then sigmoid_": "a = x * 2; a.retain_grad(); a.sigmoid_(); out = a * a; "
                                 "kept = a",
    "leaf without grad": "a = lib.zeros(3); a.addcmul_(x, w); a.sqrt_(); out = a",
    "gt_ then add_": "a = x * 1; a.gt_(0); a.add_(x); out = a",
    "logical_not_ keeps grad_fn": "a = x * 3; a.logical_not_(); out = a",
}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_chains_of_inplace_ops_match_torch(torch, name):
    got = []
    for lib in (sg, torch):
        env = {"lib": lib, "x": lib.tensor([0.5, -0.25, 0.75], requires_grad=True),
               "w": lib.tensor([1.0, 2.0, 3.0], requires_grad=True)}
        exec(CHAINS[name], env)  # noqa: S102 - test table
        out = env["out"]
        out.sum().backward()
        kept = env.get("kept")
        got.append((out.grad_fn.name(), out._version, out.detach().numpy().copy(),
                    env["x"].grad, env["w"].grad, None if kept is None else kept.grad))
    (n1, v1, o1, gx1, gw1, k1), (n2, v2, o2, gx2, gw2, k2) = got
    assert (n1, v1) == (n2, v2)
    assert_close(o1, o2, terms=6)
    for a, b in ((gx1, gx2), (gw1, gw2), (k1, k2)):
        if b is None:
            assert a is None
        else:
            assert_close(a, b, terms=12)


def test_second_derivative_through_inplace_ops_matches_torch(torch):
    got = []
    for lib in (sg, torch):
        x = lib.tensor([0.5, -0.25, 0.75], dtype=lib.float64, requires_grad=True)
        a = x * 1
        a.cos_()
        a.mul_(x)
        a.exp_()
        (g,) = lib.autograd.grad(a.sum(), x, create_graph=True)
        g.sum().backward()
        got.append((g.detach().numpy().copy(), x.grad.numpy().copy()))
    assert_close(got[0][0], got[1][0], terms=12)
    assert_close(got[0][1], got[1][1], terms=24)


DTYPE_ERRORS = [
    "lib.tensor([1, 2, 3]).cos_()", "lib.tensor([1, 2, 3]).sqrt_()",
    "lib.tensor([1, 2, 3]).sigmoid_()", "lib.tensor([1, 2, 3]).reciprocal_()",
    "lib.tensor([1, 2, 3]).neg_()", "lib.tensor([1, 2, 3]).abs_()",
    "lib.tensor([1, 2, 3]).relu_()", "lib.tensor([1, 2, 3]).sign_()",
    "lib.tensor([1, 2, 3]).pow_(2)", "lib.tensor([1, 2, 3]).pow_(0.5)",
    "lib.tensor([1, 2, 3]).pow_(-1)", "lib.tensor([1, 2, 3]).clamp_(0.5)",
    "lib.tensor([1, 2, 3]).clamp_(0, 2)", "lib.tensor([1, 2, 3]).clamp_min_(1.5)",
    "lib.tensor([1, 2, 3]).clamp_max_(2)", "lib.tensor([1, 2, 3]).gt_(1.5)",
    "lib.tensor([1, 2, 3]).logical_not_()", "lib.tensor([1, 2, 3]).addcmul_(lib.tensor([1]), "
                                            "lib.tensor([2]))",
    "lib.tensor([True, False]).neg_()", "lib.tensor([True, False]).sign_()",
    "lib.tensor([True, False]).cos_()", "lib.tensor([True, False]).abs_()",
    "lib.tensor([True, False]).relu_()", "lib.tensor([True, False]).logical_not_()",
    "lib.tensor([True, False]).add_(1)", "lib.tensor([True, False]).pow_(2)",
    "lib.tensor([True, False]).gt_(0)",
    "lib.tensor([1.0, 2], requires_grad=True).cos_()",
    "lib.tensor([1.0, 2], requires_grad=True).gt_(0)",
    "lib.tensor([1.0, 2], requires_grad=True).pow_(2)",
    "lib.tensor([1.0, 2], requires_grad=True).logical_not_()",
    "lib.zeros(3).cos_().add_(lib.ones(2, 3))",
    "lib.zeros(3).addcmul_(lib.ones(2, 3), lib.ones(3))", "lib.zeros(3).pow_(lib.ones(2, 3))",
    "lib.zeros(3).gt_(lib.ones(2, 3))", "lib.zeros(3).clamp_()",
    "lib.zeros(2, dtype=lib.float64).add_(lib.ones(2)).dtype",
    "lib.zeros(2).mul_(lib.ones(2, dtype=lib.float64))", "lib.zeros(2).pow_(lib.tensor([2, 3]))",
    "lib.zeros(2).exp_()._version", "lib.tensor([0.5, 2]).relu_().sigmoid_()._version",
    "-lib.tensor([True])", "lib.tensor([True]).abs()", "lib.tensor([True]).relu()",
    "lib.tensor([True, False]).sign()", "lib.tensor([True, False]).pow(2)",
    "lib.tensor([1, 2, 3]).pow(0.5)", "lib.tensor([1, 2, 3]).clamp_min(1.5)",
    "lib.tensor([True, False]).clamp(0, 1)",
    "lib.tensor([1, 2, 3]).addcmul_(lib.tensor([1, 2, 3]), lib.tensor([1, 2, 3]), value=0.5)",
    "lib.tensor([1, 2, 3]).addcmul(lib.tensor([1, 2, 3]), lib.tensor([1, 2, 3]), value=2.7)",
]


@pytest.mark.parametrize("code", DTYPE_ERRORS)
def test_inplace_dtypes_and_errors_match_torch(torch, code):
    _same(code, torch)


@pytest.mark.parametrize("name", ["neg_", "negative_", "reciprocal_", "exp_", "log_", "sin_",
                                  "cos_", "tanh_", "sigmoid_", "sqrt_", "relu_", "abs_",
                                  "clamp_", "clip_", "clamp_min_", "clamp_max_"])
def test_inplace_functions_of_the_module_like_torch(torch, name):
    args = {"clamp_": (0.1, 0.7), "clip_": (0.1, 0.7), "clamp_min_": (0.6,),
            "clamp_max_": (0.6,)}.get(name, ())
    out = []
    for lib in (sg, torch):
        t = lib.tensor([0.5, 0.25, 0.75])
        r = getattr(lib, name)(t, *args)
        assert r is t and t._version == 1
        out.append(t.numpy().copy())
    assert_close(out[0], out[1], terms=2)


def test_inplace_forms_under_the_profiler_and_the_verifier():
    x = sg.tensor([0.5, -0.25, 0.75], dtype=sg.float64, requires_grad=True)
    w = sg.tensor([0.5, 1.5, 0.25], dtype=sg.float64, requires_grad=True)
    with sg.autograd.profiler.profile() as prof:
        a = x * 2
        a.cos_()
        a.clamp_(-1, 0.95)
        a.mul_(w)
        a.exp_()
        b = x * 1
        b.uniform_(-1, 1)
        c = x * 1
        c.gt_(w)
        loss = (a * b).sum() + c.sum() + (x * 1).sigmoid_().sum()
    names = {e.key for e in prof.key_averages()}
    assert {"symgrad::cos_", "symgrad::uniform_", "symgrad::gt_"} <= names
    report = sg.verify(loss)
    assert report.ok, report
    assert {"CosBackward0", "UniformBackward0", "GtBackward1", "ExpBackward0",
            "ClampBackward1", "SigmoidBackward0"} <= {row.name for row in report.nodes}
    with sg.record():  # the stand-in keeps the old values for the verifier
        y = x * 2
        y.sin_()
        y.bernoulli_(0.5)
        y.add_(x)
        root = (y * x).sum()
    assert sg.verify(root).ok
