"""Bad data gets torch's messages: tensor(), the creation functions and indexing run side by
side with torch 2.13 (the oracle: same exception type, same words); the verifier's and the
views' entry points name the argument and the types they take.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import symgrad as sg

NAN, INF = float("nan"), float("inf")


def outcome(fn):
    """(exception type name, message) or ("ok", result)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the error itself is what is compared
        return type(exc).__name__, str(exc)


def same_error(torch, expr: str, *, prefix: str | None = None, env=None) -> tuple[str, str]:
    """Run ``expr`` with ``lib`` = torch and = symgrad; both must raise the same type with
    the same message (torch's ``torch.`` names read ``symgrad.``). ``prefix``: compare the
    messages up to this text (torch lists dtypes symgrad has not)."""
    env = dict(env or {})
    theirs = outcome(lambda: eval(expr, {"lib": torch, "np": np, **env}))  # noqa: S307
    ours = outcome(lambda: eval(expr, {"lib": sg, "np": np, **env}))  # noqa: S307
    assert theirs[0] != "ok", f"torch accepts {expr}"
    want = theirs[1].replace("torch.", "symgrad.")
    got = ours[1] if ours[0] != "ok" else repr(ours[1])
    if prefix is not None:
        want, got = want.split(prefix)[0], got.split(prefix)[0]
    assert (ours[0], got) == (theirs[0], want), expr
    return ours


# -- tensor() --------------------------------------------------------------------------------

TENSOR_ERRORS = [
    "lib.tensor(None)",
    "lib.tensor([1.0, None])",
    "lib.tensor([None])",
    "lib.tensor([[None]])",
    "lib.tensor([None, 'a'])",
    "lib.tensor([np.float64(1), None])",
    "lib.tensor([True, None])",
    "lib.tensor([2**70])",
    "lib.tensor(2**70)",
    "lib.tensor([-2**70])",
    "lib.tensor([2**63])",
    "lib.tensor(-2**63 - 1)",
    "lib.tensor([1, 2**70])",
    "lib.tensor([2**70, True])",
    "lib.tensor([np.int64(3), 2**70])",
    "lib.tensor([2**70], dtype=lib.int64)",
    "lib.tensor('abc')",
    "lib.tensor(b'ab')",
    "lib.tensor(['a'])",
    "lib.tensor(['a', None])",
    "lib.tensor([1, 'a'])",
    "lib.tensor([1.0, 'a'])",
    "lib.tensor({1: 2})",
    "lib.tensor([{}])",
    "lib.tensor(object())",
    "lib.tensor([object()])",
    "lib.tensor(set([1]))",
    "lib.tensor(Ellipsis)",
    "lib.tensor([[1, 2], [3]])",
    "lib.tensor([[1], [2, 3]])",
    "lib.tensor([[1, 2], 3])",
    "lib.tensor([1, [2, 3]])",
    "lib.tensor([np.ones(2), np.ones(3)])",
    "lib.tensor([[1], np.array([1, 2])])",
    # with a dtype: each scalar is checked for it
    "lib.tensor([None], dtype=lib.float32)",
    "lib.tensor(None, dtype=lib.float32)",
    "lib.tensor([1, None], dtype=lib.int64)",
    "lib.tensor([None], dtype=lib.bool)",
    "lib.tensor(['a'], dtype=lib.float32)",
    "lib.tensor('a', dtype=lib.float32)",
    "lib.tensor(['a', 1], dtype=lib.bool)",
    "lib.tensor([1, 'a'], dtype=lib.bool)",
    "lib.tensor([1, 'a'], dtype=lib.int64)",
    "lib.tensor([1, 'a'], dtype=lib.float64)",
    "lib.tensor([1 + 2j], dtype=lib.float32)",
    "lib.tensor([1, 1 + 2j], dtype=lib.int64)",
    "lib.tensor([1, [1]], dtype=lib.float64)",
    "lib.tensor([1, [1]], dtype=lib.bool)",
    "lib.tensor([[1], 2], dtype=lib.float64)",
    "lib.tensor([float('nan')], dtype=lib.int64)",
    "lib.tensor([float('inf'), 2**70], dtype=lib.int64)",
    "lib.tensor([1e300], dtype=lib.int64)",
    "lib.tensor(np.float64(2**70), dtype=lib.int64)",
    # keyword arguments
    "lib.tensor([1, 2], dtype=42)",
    "lib.tensor([1, 2], requires_grad='yes')",
    "lib.tensor([1, 2], requires_grad=1)",
    "lib.tensor([1, 2], device=3.5)",
    "lib.tensor([1, 2], dtype=lib.int64, requires_grad=True)",
]


@pytest.mark.parametrize("expr", TENSOR_ERRORS)
def test_tensor_errors_match_torch(expr, torch):
    same_error(torch, expr)


@pytest.mark.parametrize("expr", [
    "lib.tensor(np.array([1, 'a'], dtype=object))",
    "lib.tensor(np.array([1, 2], dtype=object))",
    "lib.tensor(np.array([1, None], dtype=object))",
    "lib.tensor(np.array(['a']))",
])
def test_tensor_of_an_unsupported_ndarray(expr, torch):
    """torch's message, up to its list of dtypes (symgrad has no complex)."""
    kind, msg = same_error(torch, expr, prefix="The only supported types are:")
    assert kind == "TypeError" and "numpy." in msg


def test_the_issue_examples_name_the_type(torch):
    assert outcome(lambda: sg.tensor(None)) == ("RuntimeError",
                                                "Could not infer dtype of NoneType")
    assert outcome(lambda: sg.tensor([1.0, None])) == ("RuntimeError",
                                                       "Could not infer dtype of NoneType")
    kind, msg = outcome(lambda: sg.tensor(np.array([1, "a"], dtype=object)))
    assert kind == "TypeError" and msg.startswith(
        "can't convert np.ndarray of type numpy.object_.")
    assert outcome(lambda: sg.tensor([2**70])) == ("ValueError",
                                                   "Overflow when unpacking long long")
    for expr in ("tensor(None)", "tensor([1.0, None])", "tensor([2**70])"):
        assert "use symgrad.stack" not in str(outcome(lambda e=expr: eval(  # noqa: S307
            "sg." + e))[1])


@pytest.mark.parametrize("expr", [
    "lib.tensor([2**70, 1.5])",
    "lib.tensor([1.0, 2**70])",
    "lib.tensor([2**70], dtype=lib.float32)",
    "lib.tensor([2**70], dtype=lib.bool)",
    "lib.tensor([2**63 - 1])",
    "lib.tensor(-2**63)",
    "lib.tensor([[], [1]])",
    "lib.tensor([[]])",
    "lib.tensor(range(3))",
    "lib.tensor([1.5], dtype=lib.int64)",
    "lib.tensor([True, 2])",
    "lib.tensor([1e300], dtype=lib.float32)",
    "lib.tensor([float('nan'), float('inf')])",
    "lib.tensor([[1.0], [lib.ones(1)]])",
    "lib.tensor([lib.tensor(1.0), lib.tensor(2.0)])",
    "lib.tensor([2**53 + 1], dtype=lib.float32)",
    "lib.tensor(np.array([1, 2**63], dtype=np.uint64), dtype=lib.int64)",
])
def test_tensor_accepts_what_torch_accepts(expr, torch):
    theirs = eval(expr, {"lib": torch, "np": np})  # noqa: S307
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning from the cast either
        ours = eval(expr, {"lib": sg, "np": np})  # noqa: S307
    assert tuple(ours.shape) == tuple(theirs.shape)
    assert ours.dtype.name == str(theirs.dtype).replace("torch.", "")
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_tensors_in_a_list_are_stacked_and_ragged_ones_say_where():
    """symgrad's own convenience (torch takes one-element tensors only there)."""
    assert sg.tensor([sg.ones(2), sg.zeros(2)]).tolist() == [[1.0, 1.0], [0.0, 0.0]]
    with pytest.raises(ValueError, match=re.escape("expected sequence of length 2 at dim 1 "
                                                   "(got 3)")):
        sg.tensor([sg.ones(2), sg.ones(3)])


def test_uint64_beyond_int64_is_refused_without_a_dtype():
    with pytest.raises(ValueError, match="Overflow when unpacking long long.*uint64"):
        sg.tensor(np.array([2**64 - 1], dtype=np.uint64))
    assert sg.tensor(np.array([3], dtype=np.uint64)).tolist() == [3]


def test_complex_data_says_symgrad_has_no_complex():
    for data in (1 + 2j, [1 + 2j]):
        with pytest.raises(TypeError, match="symgrad has no complex dtype"):
            sg.tensor(data)


# -- creation functions ------------------------------------------------------------------

CREATION_ERRORS = [
    "lib.zeros('a')", "lib.zeros(2, 'a')", "lib.zeros((2, 'a'))", "lib.zeros(2.5)",
    "lib.zeros(None)", "lib.zeros([2, 3.0])", "lib.zeros(2, 3.0)", "lib.zeros(True)",
    "lib.ones('a')", "lib.empty('a')", "lib.rand('a')", "lib.randn(2, 'a')",
    "lib.full('a', 1.0)",
    "lib.zeros(2, dtype=42)", "lib.zeros(2, device=3.5)", "lib.zeros(2, requires_grad='x')",
    "lib.ones(2, dtype=lib.int64, requires_grad=True)",
    "lib.ones(-1)", "lib.empty(-1)", "lib.rand(-1)", "lib.randn(2, -3)", "lib.full((-1,), 1.)",
    "lib.randint(0, 5, (-1,))",
    "lib.full((2,), 'x')", "lib.full((2,), None)", "lib.full((2,), [1])",
    "lib.full((2,), lib.ones(2))", "lib.full((2,), 2**70)", "lib.full((2,), 2**63)",
    "lib.full((2,), 2**70, dtype=lib.float32)",
    "lib.full((2,), float('nan'), dtype=lib.int64)",
    "lib.arange('a')", "lib.arange(None)", "lib.arange([3])", "lib.arange(0, 5, 0)",
    "lib.arange(5, 0)", "lib.arange(0, 5, -1)", "lib.arange(float('nan'))",
    "lib.arange(float('inf'))", "lib.arange(0.5, float('inf'))", "lib.arange(-float('inf'), 0)",
    "lib.arange(1.5, float('nan'), 0.5)", "lib.arange(0, 5, float('nan'))",
    "lib.arange(2**70)", "lib.arange(0, 2**63)", "lib.arange(2.0**70)",
    "lib.arange(0, 1, 1e-300)",
    "lib.linspace(0, 1, -1)",
    "lib.eye('a')", "lib.eye(2.5)", "lib.eye(True)", "lib.eye(-1)", "lib.eye(2, -1)",
    "lib.randint(5, 0, (2,))", "lib.randint(0, 0, (2,))", "lib.randint('a', (2,))",
    "lib.zeros_like('a')", "lib.zeros_like(np.ones(2))", "lib.ones_like(None)",
    "lib.full_like(lib.ones(2), 'x')",
    "lib.from_numpy([1])",
]


@pytest.mark.parametrize("expr", CREATION_ERRORS)
def test_creation_errors_match_torch(expr, torch):
    same_error(torch, expr)


def test_from_numpy_of_strings(torch):
    same_error(torch, "lib.from_numpy(np.array(['a']))", prefix="The only supported types are:")


@pytest.mark.parametrize("expr, kind, pattern", [
    # torch answers these with its list of overloads; symgrad names the argument
    ("sg.arange(0, 'a')", TypeError, r"arange\(\): argument 'end' \(position 2\) must be "
                                     r"Number, not str"),
    ("sg.arange(0, 5, 'a')", TypeError, r"argument 'step' \(position 3\) must be Number"),
    ("sg.arange(0, 5, 2, dtype=42)", TypeError, r"argument 'dtype' must be symgrad.dtype, "
                                                r"not int"),
    ("sg.arange(1 + 2j)", TypeError, "symgrad has no complex dtype"),
    ("sg.full((2,), 1 + 2j)", TypeError, "symgrad has no complex dtype"),
    ("sg.linspace(0, 1, 'a')", TypeError, r"argument 'steps' \(position 3\) must be int, "
                                          r"not str"),
    ("sg.linspace(0, 1, 2.5)", TypeError, r"argument 'steps' \(position 3\) must be int"),
    ("sg.linspace('a', 1, 3)", TypeError, r"argument 'start' \(position 1\) must be Number"),
    ("sg.eye(2, 'a')", TypeError, r"eye\(\): argument 'm' \(position 2\) must be int, not str"),
    ("sg.randint(0, 5, 'a')", TypeError, r"argument 'size' must be tuple of ints, not str"),
    ("sg.randint(0, 5.5, (2,))", TypeError, r"argument 'high' \(position 2\) must be int, "
                                            r"not float"),
    ("sg.zeros(2, dtype='complex64')", TypeError, r"must be symgrad.dtype, not str \("
                                                   r"'complex64' has no symgrad dtype"),
    ("sg.zeros(2, dtype=np.complex64)", TypeError, "has no symgrad dtype"),
    ("sg.zeros(-1)", RuntimeError, re.escape("Trying to create tensor with negative "
                                             "dimension -1: [-1]")),
])
def test_creation_errors_name_the_argument(expr, kind, pattern):
    with pytest.raises(kind, match=pattern):
        eval(expr, {"sg": sg, "np": np})  # noqa: S307


def test_creation_accepts_what_torch_accepts(torch):
    for expr in ("lib.zeros(np.int64(2))", "lib.zeros(lib.tensor(2))", "lib.zeros((2, 3))",
                 "lib.zeros([2, 3])", "lib.arange(lib.tensor(3))", "lib.arange(np.int64(3))",
                 "lib.arange(True, 3)", "lib.arange(5, 5)", "lib.full((2,), True)",
                 "lib.full((2,), 1)", "lib.full((2,), lib.tensor(1.))",
                 "lib.full((2,), np.float32(1))", "lib.full((2,), 1.5, dtype=lib.int64)",
                 "lib.full((2,), float('nan'))", "lib.eye(lib.tensor(2))",
                 "lib.linspace(0, 1, lib.tensor(3))", "lib.linspace(0, float('nan'), 3)",
                 "lib.zeros(2, dtype=float)"):
        theirs = eval(expr, {"lib": torch, "np": np})  # noqa: S307
        ours = eval(expr, {"lib": sg, "np": np})  # noqa: S307
        assert ours.dtype.name == str(theirs.dtype).replace("torch.", ""), expr
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    r = sg.randint(5, (3,))  # randint(high, size), as torch
    assert r.shape == (3,) and r.dtype is sg.int64 and 0 <= r.numpy().min() <= r.numpy().max() < 5
    assert sg.randint(2, 5, (4,), dtype=sg.float32).dtype is sg.float32
    sg.manual_seed(-1)  # torch takes negative seeds (modulo 2**64)
    sg.manual_seed(0)


# -- indexing --------------------------------------------------------------------------------

INDEX_ERRORS = [
    # an int names its position in the index, as torch does
    "lib.zeros(2, 3)[1, 3]", "lib.zeros(2, 3)[..., 3]", "lib.zeros(2, 3)[None, 1, 3]",
    "lib.zeros(2, 3)[:, -4]", "lib.zeros(2, 3)[:, 3]", "lib.zeros(2, 3)[0:1, 3]",
    "lib.zeros(2, 3)[2]", "lib.zeros(2, 3)[-3]", "lib.zeros(2, 3)[1][3]",
    "lib.zeros(2, 3)[[0, 1], 3]", "lib.zeros(2, 3)[1, ..., 3]", "lib.zeros(2, 3)[..., 1, 3]",
    "X[1, ..., 5]", "X[..., 5]", "X[..., None, 5]", "X[:, None, 7]", "X[0:1, :, 4]",
    "X[1, 2, 4]", "X[1, [0], 4]", "X[[0], 5]", "X[True, 1, 3]", "X[1, True, 7]",
    "X[lib.tensor(1), lib.tensor(5)]", "X[None, ..., 5]", "X[None, None, 1, 3]",
    "X[1:, ..., 5]", "X[1, 2, ..., 4]", "X[..., 1, 5]", "X[:, :, :, 0]",
    "Z[..., 9]", "Z[0, ..., 9]", "Z[..., 7, 0]",
    # an index tensor names its place among the index tensors
    "X[:, [9]]", "X[:, :, [9]]", "X[[9], :]", "X[:, [0], [9]]", "X[0, :, [9]]",
    "X[None, :, [9]]", "X[..., [9]]", "X[[0], [0], [9]]", "X[[5], [0], [0]]",
    "X[[0], [7], [0]]", "X[:, [0, 1], 9]", "X[:, lib.tensor([[0], [8]])]",
    "X[lib.tensor([True, False]), 7]", "X[lib.tensor([True, False]), :, [7]]",
    "X[[0], None, [5]]", "X[True, [5]]", "X[0, [0], [7]]", "X[[0], ..., [9]]",
    "Z[lib.ones(2, 3, dtype=lib.bool), [9]]", "Z[:, 0, [1], [9]]",
    "X[1, :, lib.tensor([True, False, True])]",
]


def _index_env(lib):
    return {"X": lib.zeros(2, 3, 4), "Z": lib.zeros(2, 3, 4, 5)}


@pytest.mark.parametrize("expr", INDEX_ERRORS)
def test_index_errors_match_torch(expr, torch):
    theirs = outcome(lambda: eval(expr, {"lib": torch, **_index_env(torch)}))  # noqa: S307
    ours = outcome(lambda: eval(expr, {"lib": sg, **_index_env(sg)}))  # noqa: S307
    assert theirs[0] == "IndexError"
    assert ours == theirs


def _assign(expr: str, lib):
    env = {"lib": lib, **_index_env(lib)}
    exec(expr + " = 1.0", env)  # noqa: S102


@pytest.mark.parametrize("expr", [e for e in INDEX_ERRORS if "[1][3]" not in e])
def test_setitem_errors_match_torch(expr, torch):
    theirs = outcome(lambda: _assign(expr, torch))
    ours = outcome(lambda: _assign(expr, sg))
    assert theirs[0] == "IndexError"
    assert ours == theirs


def test_a_mask_spanning_dims_then_an_index(torch):
    """A 2-dim mask is one index spanning two dims: the next index is the third dim."""
    for lib in (torch, sg):
        z = lib.arange(120.0).reshape(2, 3, 4, 5).requires_grad_(True)
        m = lib.tensor([[True, False, True], [False, True, True]])
        w = lib.arange(20.0).reshape(4, 5)
        y = (z[m, [1]] * w).sum() + (z[:, m[0], 2] ** 2).sum()
        y.backward()
        b = lib.zeros(2, 3, 4, 5, requires_grad=True) * 1.0
        b[m, [1], 2] = lib.tensor(3.0)
        if lib is torch:
            want = (tuple(z[m, [1]].shape), y.item(), z.grad.numpy().copy(), b.detach().numpy())
    got = (tuple(z[m, [1]].shape), y.item(), z.grad.numpy(), b.detach().numpy())
    assert got[:2] == want[:2] == ((4, 5), want[1])
    np.testing.assert_array_equal(got[2], want[2])
    np.testing.assert_array_equal(got[3], want[3])


# -- the verifier, graph views and the Inspector ------------------------------------------

@pytest.fixture
def graph():
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    return a, (a * a).sum()


@pytest.mark.parametrize("kwargs, kind, pattern", [
    ({"names": 42}, TypeError, r"argument 'names' must be a mapping of name -> tensor.*not "
                               r"int"),
    ({"names": ["a"]}, TypeError, r"'names' must be a mapping.*not list"),
    ({"mode": 3}, TypeError, r"argument 'mode' must be str \('auto', 'exact' or 'local'\)"),
    ({"mode": "fast"}, ValueError, r"mode must be 'auto', 'exact' or 'local', not 'fast'"),
    ({"order": 3}, ValueError, "order must be 1 or 2"),
    ({"order": True}, ValueError, "order must be 1 or 2"),
    ({"rtol": "x"}, TypeError, r"argument 'rtol' must be a number or None, not str"),
    ({"atol": -1e-3}, ValueError, r"atol must be a finite number >= 0, got -0.001"),
    ({"rtol": NAN}, ValueError, r"rtol must be a finite number >= 0, got nan"),
    ({"rtol": INF}, ValueError, r"rtol must be a finite number >= 0"),
    ({"sample": 0}, ValueError, r"sample must be a positive int or None, got 0"),
    ({"sample": 2.5}, TypeError, r"argument 'sample' must be a positive int or None, not "
                                 r"float"),
    ({"sample": True}, TypeError, r"argument 'sample' must be a positive int"),
    ({"seed": "x"}, TypeError, r"argument 'seed' must be an int, not str"),
    ({"timeout": "x"}, TypeError, r"argument 'timeout' must be a number of seconds or None"),
    ({"timeout": 0}, ValueError, r"timeout must be a positive number of seconds"),
    ({"timeout": -1}, ValueError, r"timeout must be a positive number of seconds"),
    ({"backend": 3}, TypeError, r"argument 'backend' must be str"),
    ({"backend": "maple"}, ValueError, r"backend must be 'auto', 'sympy' or 'symengine'"),
    ({"progress": 3}, TypeError, r"argument 'progress' must be a callable"),
])
def test_verify_argument_errors(graph, kwargs, kind, pattern):
    _a, y = graph
    with pytest.raises(kind, match=pattern):
        sg.verify(y, **kwargs)


def test_verify_root_and_gradient_errors(graph):
    a, y = graph
    with pytest.raises(TypeError, match="expects a symgrad or torch tensor, not int"):
        sg.verify(42)
    with pytest.raises(TypeError, match=r"expects one symgrad or torch tensor, not a list.*"
                                        r"verify\(a.sum\(\) \+ b.sum\(\)\)"):
        sg.verify([y, y])
    with pytest.raises(TypeError, match=r"argument 'gradient' must be a tensor, an array, a "
                                        r"number or None, not str"):
        sg.verify(y, "x")
    with pytest.raises(TypeError, match="argument 'gradient' must hold numbers"):
        sg.verify(a * 2, ["a", "b"])
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        sg.verify(y, [1.0, 2.0])
    assert sg.verify(y, 1.0, names={"a": a}, rtol=1e-3, atol=0, sample=3, seed=1,
                     timeout=60).ok
    assert sg.verify(a * 2, [1.0, 2.0]).ok
    assert sg.verify(a * 2, np.ones(2)).ok


def test_graph_argument_errors(graph):
    a, y = graph
    with pytest.raises(TypeError, match="root must be a symgrad or torch tensor, a grad_fn "
                                        "node, or a list of them, not int"):
        sg.graph(42)
    with pytest.raises(TypeError, match="not str"):
        sg.graph([y, "x"])
    with pytest.raises(TypeError, match=r"names must be a mapping of variable name -> tensor.*"
                                        r"not int"):
        sg.graph(y, 42)
    assert sg.graph([y, y.grad_fn], {"a": a}).to_json()["roots"]


def test_inspector_argument_errors(graph):
    pytest.importorskip("ipywidgets")
    from symgrad.jupyter import Inspector

    with pytest.raises(TypeError, match="root must be a symgrad or torch tensor"):
        Inspector(42, verify=False)


def test_tensor_copies_what_it_reads(torch):
    """Data read through the buffer protocol (a torch tensor, array.array) is copied."""
    import array

    t = torch.ones(3)
    s = sg.tensor(t)
    t[0] = 5.0
    assert s.tolist() == [1.0, 1.0, 1.0]
    a = array.array("d", [1.0, 2.0])
    s = sg.tensor(a, dtype=sg.float64)
    a[0] = 9.0
    assert s.tolist() == [1.0, 2.0]


def test_inspector_names_must_be_a_mapping():
    pytest.importorskip("ipywidgets", reason="the Inspector needs the jupyter extra")
    from symgrad.jupyter import Inspector

    x = sg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(TypeError, match="names must be a mapping"):
        Inspector((x * x).sum(), names=42, verify=False)
