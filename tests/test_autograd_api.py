"""The autograd surface PyTorch programs use, run side by side with torch 2.13.

gradcheck / gradgradcheck (signatures, what they catch, failure wording), Variable,
autograd.functional (values and return structures), symgrad.func (grad, vmap, jacrev ...)
and ``grad_fn._raw_saved_*`` with ``register_hooks`` as in torch's saved-tensor tutorial.
Inputs are float64 with a few terms per result: values agree within a handful of float64
rounding errors (``terms`` below).
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
import symgrad.func as sf
from symgrad.autograd.gradcheck import GradcheckError

X = np.array([[0.5, -1.0, 2.0], [0.3, 0.2, -0.4]])
Y = np.array([1.5, 0.25, -3.0])


def _convert(lib, tree, requires_grad=False):
    """numpy leaves of a tuple/list/dict tree as float64 tensors of ``lib``."""
    if isinstance(tree, np.ndarray):
        return lib.tensor(tree, dtype=lib.float64, requires_grad=requires_grad)
    if isinstance(tree, tuple):
        return tuple(_convert(lib, t, requires_grad) for t in tree)
    if isinstance(tree, list):
        return [_convert(lib, t, requires_grad) for t in tree]
    if isinstance(tree, dict):
        return {k: _convert(lib, t, requires_grad) for k, t in tree.items()}
    return tree


def _same_structure_and_values(ours, theirs, torch, path="result", terms=16):
    """Same nesting (tuple/list/dict), shapes, requires_grad, and values within rounding."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, sg.Tensor), (path, type(ours))
        assert tuple(ours.shape) == tuple(theirs.shape), (path, ours.shape, theirs.shape)
        assert ours.requires_grad == theirs.requires_grad, path
        assert (ours.grad_fn is None) == (theirs.grad_fn is None), path
        assert_close(ours, theirs, terms=terms, msg=path)
    elif isinstance(theirs, (tuple, list, dict)):
        assert type(ours) is type(theirs), (path, type(ours), type(theirs))
        assert len(ours) == len(theirs), path
        keys = theirs.keys() if isinstance(theirs, dict) else range(len(theirs))
        for k in keys:
            _same_structure_and_values(ours[k], theirs[k], torch, f"{path}[{k!r}]", terms)
    else:
        assert ours == theirs, (path, ours, theirs)


def _outcome(fn):
    """``("ok", result)`` or the exception's type name and message (torch. -> symgrad.)."""
    try:
        return "ok", fn()
    except Exception as e:  # noqa: BLE001  (any error is compared with torch's)
        return type(e).__name__, str(e).replace("torch.", "symgrad.")


# -- gradcheck / gradgradcheck ------------------------------------------------------------

@pytest.mark.parametrize("name", ["gradcheck", "gradgradcheck"])
def test_gradcheck_signatures_match_torch(torch, name):
    ours = inspect.signature(getattr(sg.autograd, name)).parameters
    theirs = inspect.signature(getattr(torch.autograd, name)).parameters
    assert list(ours) == list(theirs)
    for p in theirs.values():
        assert ours[p.name].kind == p.kind, p.name
        assert ours[p.name].default == p.default, p.name
    # the testing package re-exports the same functions (one implementation)
    assert getattr(sg.testing, name) is getattr(sg.autograd, name)
    assert issubclass(GradcheckError, RuntimeError)
    assert sg.testing.GradcheckError is GradcheckError


def _square_function(lib, wrong_backward: bool):
    class Square(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a * a

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            return g * a if wrong_backward else 2 * g * a

    return Square


@pytest.mark.parametrize("fast_mode", [False, True])
def test_gradcheck_passes_correct_gradients_like_torch(torch, fast_mode):
    def check(lib):
        x, w = _convert(lib, (X, Y[:3]), requires_grad=True)
        sq = _square_function(lib, wrong_backward=False)
        assert lib.autograd.gradcheck(lambda a, b: ((a @ b).tanh(), sq.apply(b)), (x, w),
                                      fast_mode=fast_mode)
        assert lib.autograd.gradgradcheck(lambda a, b: (a @ b).sigmoid() * b.sum(), (x, w),
                                          fast_mode=fast_mode)
        assert lib.autograd.gradcheck(sq.apply, w, fast_mode=fast_mode)  # a bare tensor

    check(sg)
    check(torch)


def test_wrong_custom_function_is_caught_with_torchs_message(torch):
    def run(lib):
        bad = _square_function(lib, wrong_backward=True)
        x, w = _convert(lib, (X, Y[:2]), requires_grad=True)
        return (
            _outcome(lambda: lib.autograd.gradcheck(bad.apply, (w,))),
            # input 1 and output 1: indices count the inputs/outputs that require grad
            _outcome(lambda: lib.autograd.gradcheck(lambda a, b: (a * 2, bad.apply(b)),
                                                    (x, w))),
            lib.autograd.gradcheck(bad.apply, (w,), raise_exception=False))

    ours, theirs = run(sg), run(torch)
    assert ours == theirs
    kind, message = ours[0]
    assert kind == "GradcheckError"
    assert message.startswith("Jacobian mismatch for output 0 with respect to input 0,\n"
                              "numerical:tensor([[")
    assert "Jacobian mismatch for output 1 with respect to input 1," in ours[1][1]
    assert ours[2] is False


def test_fast_mode_failure_names_the_pair_and_recomputes_in_slow_mode(torch):
    def run(lib):
        bad = _square_function(lib, wrong_backward=True)
        w = _convert(lib, Y[:2], requires_grad=True)
        return _outcome(lambda: lib.autograd.gradcheck(bad.apply, (w,), fast_mode=True))

    (kind, ours), (tkind, theirs) = run(sg), run(torch)
    assert kind == tkind == "GradcheckError"
    # v^T J u uses random u, v (each library's own generator): the scalars differ, the
    # slow-mode recomputation that follows is identical
    assert ours.split("\n")[0] == theirs.split("\n")[0]
    assert ours.split("\nThe above quantities")[1] == theirs.split("\nThe above quantities")[1]


def test_wrong_second_derivative_is_caught_by_gradgradcheck(torch):
    from torch.autograd.gradcheck import GradcheckError as TorchGradcheckError

    for lib, error in ((sg, GradcheckError), (torch, TorchGradcheckError)):
        class DetachedCube(lib.autograd.Function):  # right first derivative, frozen second
            @staticmethod
            def forward(ctx, a):
                ctx.save_for_backward(a)
                return a ** 3

            @staticmethod
            def backward(ctx, g):
                (a,) = ctx.saved_tensors
                return g * 3 * a.detach() ** 2

        w = _convert(lib, Y[:2], requires_grad=True)
        assert lib.autograd.gradcheck(DetachedCube.apply, (w,))
        with pytest.raises(error, match="Jacobian mismatch for output 0 with respect to input 0"):
            lib.autograd.gradgradcheck(DetachedCube.apply, (w,))


def test_backward_not_multiplied_by_grad_output_like_torch(torch):
    def run(lib):
        class Ignores(lib.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                return a * 1

            @staticmethod
            def backward(ctx, g):
                return lib.ones_like(g)

        # one element: ones is then the right Jacobian, and the grad_output check fails
        w = _convert(lib, Y[:1], requires_grad=True)
        return _outcome(lambda: lib.autograd.gradcheck(Ignores.apply, (w,)))

    assert run(sg) == run(torch) == ("GradcheckError",
                                      "backward not multiplied by grad_output")


def test_gradcheck_argument_errors_and_warnings_like_torch(torch):
    cases = [
        lambda L: L.autograd.gradcheck(lambda a: a * 2, (L.tensor([1.0], dtype=L.float64),)),
        lambda L: L.autograd.gradcheck(lambda a: a, (_convert(L, Y, True),),
                                       check_forward_ad=False, check_backward_ad=False),
        lambda L: L.autograd.gradcheck(lambda a: a, (_convert(L, Y, True),),
                                       check_batched_grad=True, check_backward_ad=False),
        lambda L: L.autograd.gradgradcheck(lambda a: a, (_convert(L, Y, True),),
                                           check_rev_over_rev=False),
        lambda L: L.autograd.gradcheck(lambda a: a.sum(),
                                       (_convert(L, Y[:1], True).expand(3),)),
    ]
    for case in cases:
        assert _outcome(lambda c=case: c(sg)) == _outcome(lambda c=case: c(torch))
    for lib in (sg, torch):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lib.autograd.gradcheck(lambda a: a * 2, (lib.tensor([1.0], requires_grad=True),),
                                   atol=1e-2, rtol=1e-2, eps=1e-3)
        assert [str(w.message) for w in caught] == [
            "Input #0 requires gradient and is not a double precision floating point or "
            "complex. This check will likely fail if all the inputs are not of double "
            "precision floating point or complex. "]


@pytest.mark.parametrize("option", ["check_forward_ad", "check_batched_grad"])
def test_options_symgrad_cannot_honour_raise_naming_them(option):
    w = _convert(sg, Y, requires_grad=True)
    with pytest.raises(NotImplementedError, match=option):
        sg.autograd.gradcheck(lambda a: a * 2, (w,), **{option: True})
    with pytest.raises(NotImplementedError, match="check_fwd_over_rev"):
        sg.autograd.gradgradcheck(lambda a: a * 2, (w,), check_fwd_over_rev=True)
    # at their defaults (False) they are accepted
    assert sg.autograd.gradcheck(lambda a: a * 2, (w,), **{option: False})


# -- Variable ----------------------------------------------------------------------------

def test_variable_is_a_deprecated_alias_returning_tensors(torch):
    for lib in (sg, torch):
        V = lib.autograd.Variable
        x = lib.tensor([1.0, 2.0])
        v = V(x, requires_grad=True)
        assert type(v) is type(x) and v is not x and v.requires_grad and v.is_leaf
        (v * 3).sum().backward()
        assert v.grad.tolist() == [3.0, 3.0]
        assert isinstance(x, V) and not V(x).requires_grad
        y = v * 2
        assert V(y).grad_fn is None and V(y).tolist() == [2.0, 4.0]
        assert V().tolist() == []
    assert _outcome(lambda: sg.autograd.Variable([1.0])) == \
        _outcome(lambda: torch.autograd.Variable([1.0]))
    assert _outcome(lambda: sg.autograd.Variable(sg.tensor([1]), requires_grad=True)) == \
        _outcome(lambda: torch.autograd.Variable(torch.tensor([1]), requires_grad=True))


# -- autograd.functional ------------------------------------------------------------------

_FUNCTIONAL_CASES = [
    ("jacobian", lambda L, x: x.exp(), X, {}),
    ("jacobian", lambda L, x: (x.exp(), x.sum()), X, {}),
    ("jacobian", lambda L, x, y: (x * y).sum(1), (X, Y), {}),
    ("jacobian", lambda L, x, y: ((x * y).sum(1), y.sin()), (X, Y), {}),
    ("jacobian", lambda L, x, y: ((x * y).sum(1), y.sin()), (X, Y), {"create_graph": True}),
    ("jacobian", lambda L, x, y: x.exp(), (X, Y), {}),  # y unused: zeros
    ("jacobian", lambda L, x: x.exp(), X, {"vectorize": True}),
    ("jacobian", lambda L, x: x.exp(), X, {"vectorize": True, "strategy": "forward-mode"}),
    ("hessian", lambda L, x: (x ** 3).sum(), X, {}),
    ("hessian", lambda L, x, y: (x.sin() * y).sum(), (X, Y), {}),
    ("hessian", lambda L, x, y: (x.sin() * y).sum(), (X, Y), {"create_graph": True}),
    ("vjp", lambda L, x: x.exp().sum(1), X, {"v": np.ones(2)}),
    ("vjp", lambda L, x, y: (x * y).sum(), (X, Y), {}),
    ("vjp", lambda L, x, y: (x * y, y.tanh()), (X, Y), {"v": (np.ones((2, 3)), Y)}),
    ("vjp", lambda L, x: x.exp().sum(1), X, {"v": np.ones(2), "create_graph": True}),
    ("jvp", lambda L, x: x.exp().sum(1), X, {"v": np.ones((2, 3))}),
    ("jvp", lambda L, x, y: (x * y, y.tanh()), (X, Y), {"v": (np.ones((2, 3)), Y)}),
    ("jvp", lambda L, x: x.exp().sum(1), X, {"v": np.ones((2, 3)), "create_graph": True}),
    ("hvp", lambda L, x: (x ** 3).sum(), X, {"v": np.ones((2, 3))}),
    ("hvp", lambda L, x, y: (x.sin() * y).sum(), (X, Y), {"v": (X, Y)}),
    ("hvp", lambda L, x, y: (x.sin() * y).sum(), (X, Y), {"v": (X, Y), "create_graph": True}),
    ("vhp", lambda L, x, y: (x.sin() * y).sum(), (X, Y), {"v": (X, Y)}),
]


@pytest.mark.parametrize("name,fn,inputs,kwargs", _FUNCTIONAL_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(_FUNCTIONAL_CASES)])
def test_functional_matches_torch_values_and_structure(torch, name, fn, inputs, kwargs):
    def run(lib):
        kw = {k: _convert(lib, v) for k, v in kwargs.items()}
        return getattr(lib.autograd.functional, name)(lambda *a: fn(lib, *a),
                                                      _convert(lib, inputs), **kw)

    _same_structure_and_values(run(sg), run(torch), torch)


def _t(lib, values):
    return lib.tensor(values, dtype=lib.float64)


_FUNCTIONAL_ERRORS = [
    lambda L, F: F.jacobian(lambda x: x, [_t(L, [1.0])]),
    lambda L, F: F.jacobian(lambda x: x, (_t(L, [1.0]), 3)),
    lambda L, F: F.jacobian(lambda x: 3, _t(L, [1.0])),
    lambda L, F: F.jacobian(lambda x: x, _t(L, [1.0]), strategy="x"),
    lambda L, F: F.jacobian(lambda x: x, _t(L, [1.0]), strategy="forward-mode"),
    lambda L, F: F.jacobian(lambda x: x, _t(L, [1.0]), strategy="forward-mode",
                            create_graph=True),
    lambda L, F: F.jacobian(lambda x, y: x * 2, (_t(L, [1.0]), _t(L, [2.0])), strict=True),
    lambda L, F: F.jacobian(lambda x: _t(L, [2.0]), _t(L, [1.0]), strict=True),
    lambda L, F: F.jacobian(lambda x: x * 2, _t(L, [1.0]), strict=True, vectorize=True),
    lambda L, F: F.jacobian(lambda x: x * 2, _t(L, [1.0]), strict=True, create_graph=True),
    lambda L, F: F.vjp(lambda x: x * 2, _t(L, [1.0, 2.0])),
    lambda L, F: F.vjp(lambda x: x * 2, _t(L, [1.0, 2.0]), _t(L, [1.0, 2.0, 3.0])),
    lambda L, F: F.vjp(lambda x: (x * 2, x), _t(L, [1.0, 2.0]), (_t(L, [1.0, 2.0]),)),
    lambda L, F: F.vjp(lambda x: (x * 2, x), _t(L, [1.0, 2.0]),
                       (_t(L, [1.0, 2.0]), _t(L, [1.0]))),
    lambda L, F: F.vjp(lambda x, y: (x * 2).sum(), (_t(L, [1.0, 2.0]), _t(L, [1.0])),
                       strict=True),
    lambda L, F: F.jvp(lambda x: x * 2, _t(L, [1.0, 2.0])),
    lambda L, F: F.jvp(lambda x: x * 2, _t(L, [1.0, 2.0]), [_t(L, [1.0, 2.0])]),
    lambda L, F: F.jvp(lambda x: _t(L, [1.0, 2.0]), _t(L, [1.0, 2.0]), _t(L, [1.0, 2.0]),
                       strict=True),
    lambda L, F: F.hessian(lambda x: x * 2, _t(L, [1.0, 2.0])),
    lambda L, F: F.hessian(lambda x: (x * 2, x), _t(L, [1.0, 2.0])),
    lambda L, F: F.hessian(lambda x: (x * 2).sum(), _t(L, [1.0, 2.0]), strict=True),
    lambda L, F: F.hvp(lambda x: (x * 2).sum(), _t(L, [1.0, 2.0]), _t(L, [1.0, 2.0]),
                       strict=True),
    lambda L, F: F.hvp(lambda x, y: (x ** 2).sum(), (_t(L, [1.0]), _t(L, [2.0])),
                       (_t(L, [1.0]), _t(L, [2.0])), strict=True),
    lambda L, F: F.hvp(lambda x: x ** 3, _t(L, [1.0, 2.0]), _t(L, [1.0, 2.0])),
    lambda L, F: F.vhp(lambda x: (x ** 3, x), _t(L, [1.0, 2.0]), _t(L, [1.0, 2.0])),
    lambda L, F: F.hvp(lambda x: (x ** 3).sum(), _t(L, [1.0, 2.0])),
    lambda L, F: F.jacobian(lambda x: x.exp(), _t(L, [1.0, 2.0]), strategy="forward-mode",
                            vectorize=True, strict=True),
    lambda L, F: F.hessian(lambda x: (x ** 3).sum(), _t(L, [1.0, 2.0]),
                           outer_jacobian_strategy="x"),
]


@pytest.mark.parametrize("case", range(len(_FUNCTIONAL_ERRORS)))
def test_functional_errors_match_torch(torch, case):
    fn = _FUNCTIONAL_ERRORS[case]
    ours = _outcome(lambda: fn(sg, sg.autograd.functional))
    theirs = _outcome(lambda: fn(torch, torch.autograd.functional))
    assert ours[0] != "ok" and ours == theirs


def test_functional_signatures_match_torch(torch):
    for name in ("jacobian", "hessian", "vjp", "jvp", "hvp", "vhp"):
        ours = inspect.signature(getattr(sg.autograd.functional, name))
        theirs = inspect.signature(getattr(torch.autograd.functional, name))
        assert [(p.name, p.default) for p in ours.parameters.values()] == \
            [(p.name, p.default) for p in theirs.parameters.values()], name


def test_functional_leaves_the_callers_graph_alone(torch):
    for lib in (sg, torch):
        x = _convert(lib, Y, requires_grad=True)
        jac = lib.autograd.functional.jacobian(lambda a: a.exp(), x)
        assert x.grad is None and not jac.requires_grad
        jac = lib.autograd.functional.jacobian(lambda a: a.exp(), x, create_graph=True)
        jac.sum().backward()  # the Jacobian stays differentiable with respect to x
        assert_close(x.grad, np.exp(Y), terms=4)


# -- symgrad.func ------------------------------------------------------------------------

def _closure_grad(L, F):
    w = L.tensor(Y, dtype=L.float64, requires_grad=True)
    g = F.grad(lambda x: (x * w).sin().sum())(L.tensor(Y, dtype=L.float64))
    (g * g).sum().backward()
    return g, w.grad


def _vmap_backward(L, F):
    x = L.tensor(X, dtype=L.float64, requires_grad=True)
    y = F.vmap(lambda r: (r * r).sum() * r)(x)
    y.sum().backward()
    return y, x.grad


_FUNC_CASES = {
    "grad": lambda L, F: F.grad(lambda x: (x.sin() * x).sum())(_convert(L, X)),
    "grad-argnums": lambda L, F: F.grad(lambda x, y: (x * y).sum(),
                                        argnums=(0, 1))(*_convert(L, (X, Y))),
    "grad-argnum1": lambda L, F: F.grad(lambda x, y: (x * y).sum(),
                                        argnums=1)(*_convert(L, (X, Y))),
    "grad-has_aux": lambda L, F: F.grad(lambda x: ((x ** 2).sum(), x.exp()),
                                        has_aux=True)(_convert(L, X)),
    "grad-dict": lambda L, F: F.grad(lambda p, x: (p["w"] * x).sum() + p["b"].sum())(
        _convert(L, {"w": Y, "b": Y}), _convert(L, X)),
    "grad-of-grad": lambda L, F: F.grad(F.grad(lambda x: x.sin() * x ** 3))(
        L.tensor(0.7, dtype=L.float64)),
    "grad-of-leaf": lambda L, F: F.grad(lambda x: (x ** 3).sum())(
        _convert(L, Y, requires_grad=True)),
    "grad-closure": _closure_grad,
    "grad_and_value": lambda L, F: F.grad_and_value(lambda x: x.tanh().sum())(
        _convert(L, X)),
    "vjp": lambda L, F: (lambda out, fn: (out, fn(_convert(L, (X, Y)))))(
        *F.vjp(lambda x, y: (x * y, y.exp()), *_convert(L, (X, Y)))),
    "jacrev": lambda L, F: F.jacrev(lambda x: x.exp())(_convert(L, Y)),
    "jacrev-tuple": lambda L, F: F.jacrev(lambda x, y: (x * y, y.sum()),
                                          argnums=(0, 1))(*_convert(L, (X, Y))),
    "jacrev-dict": lambda L, F: F.jacrev(lambda p: p["a"] * 2)(_convert(L, {"a": Y})),
    "jacfwd": lambda L, F: F.jacfwd(lambda x, y: (x * y, y.sum()),
                                    argnums=(0, 1))(*_convert(L, (X, Y))),
    "hessian": lambda L, F: F.hessian(lambda x: (x.sin() * x).sum())(_convert(L, Y)),
    "jvp": lambda L, F: F.jvp(lambda x, y: (x * y, y.exp()), _convert(L, (X, Y)),
                              _convert(L, (X, Y))),
    "vmap": lambda L, F: F.vmap(lambda x: x.sum() * x)(_convert(L, X)),
    "vmap-in_dims": lambda L, F: F.vmap(lambda x, y: x * y, in_dims=(1, None))(
        *_convert(L, (X, Y[:2]))),
    "vmap-out_dims": lambda L, F: F.vmap(lambda x, y: (x * y, x.sum()), in_dims=(0, None),
                                         out_dims=(1, 0))(*_convert(L, (X, Y))),
    "vmap-negative": lambda L, F: F.vmap(lambda x: x * 2, in_dims=-1,
                                         out_dims=-1)(_convert(L, X)),
    "vmap-nested": lambda L, F: F.vmap(F.vmap(lambda a, b: a * b), in_dims=(0, None))(
        *_convert(L, (X, Y))),
    "vmap-of-grad": lambda L, F: F.vmap(F.grad(lambda x: (x ** 3).sum()))(_convert(L, X)),
    "vmap-dict": lambda L, F: F.vmap(lambda d: d["a"] * 2)(_convert(L, {"a": X})),
    "vmap-backward": _vmap_backward,
}


@pytest.mark.parametrize("case", list(_FUNC_CASES))
def test_func_matches_torch_func(torch, case):
    import torch.func as tf

    fn = _FUNC_CASES[case]
    _same_structure_and_values(fn(sg, sf), fn(torch, tf), torch)


_FUNC_ERRORS = [
    lambda L, F: F.grad(lambda a: a)(L.ones(2)),
    lambda L, F: F.grad(lambda a: 1.0)(L.ones(2)),
    lambda L, F: F.grad(lambda a: a.sum(), has_aux=True)(L.ones(2)),
    lambda L, F: F.grad(lambda a: a.sum(), argnums=2)(L.ones(2)),
    lambda L, F: F.grad(lambda a: a.sum(), argnums=(0, 0))(L.ones(2)),
    lambda L, F: F.grad(lambda a: a.sum(), argnums="a")(L.ones(2)),
    lambda L, F: F.grad(lambda a: a.sum())(L.ones(2, dtype=L.int64)),
    lambda L, F: F.grad(lambda a: a)(2.0),
    lambda L, F: F.vmap(lambda a, b: a + b)(L.ones(2), L.ones(3)),
    lambda L, F: F.vmap(lambda a: a, in_dims=2)(L.ones(2)),
    lambda L, F: F.vmap(lambda a: a, in_dims="a")(L.ones(2)),
    lambda L, F: F.vmap(lambda: 1)(),
    lambda L, F: F.vmap(lambda a: a, in_dims=0)(2.0),
    lambda L, F: F.vmap(lambda a: 1.0)(L.ones(2)),
    lambda L, F: F.vmap(lambda a: a * L.rand(1))(L.ones(2)),
    lambda L, F: F.vmap(lambda a: a, randomness="x")(L.ones(2)),
    lambda L, F: F.vmap(lambda a: a, chunk_size=0)(L.ones(2)),
    lambda L, F: F.vmap(lambda a: a, out_dims="a")(L.ones(2)),
    lambda L, F: F.jvp(lambda a: a, L.ones(2), L.ones(2)),
    lambda L, F: F.jvp(lambda a: L.ones(2), (L.ones(2),), (L.ones(2),), strict=True),
    lambda L, F: F.vjp(lambda a: L.ones(2, dtype=L.int64), L.ones(2)),
    lambda L, F: F.vjp(lambda a: 1.0, L.ones(2)),
    lambda L, F: F.vjp(lambda a: a * 2, L.ones(2))[1](L.ones(3)),
    lambda L, F: F.vjp(lambda a: a * 2, L.ones(2))[1]((L.ones(2),)),
    lambda L, F: F.jacrev(lambda a: a, chunk_size=0)(L.ones(2)),
]


@pytest.mark.parametrize("case", range(len(_FUNC_ERRORS)))
def test_func_errors_match_torch_func(torch, case):
    import torch.func as tf

    fn = _FUNC_ERRORS[case]
    ours, theirs = _outcome(lambda: fn(sg, sf)), _outcome(lambda: fn(torch, tf))
    assert ours[0] != "ok" and ours == theirs


def test_func_signatures_match_torch_func(torch):
    import torch.func as tf

    for name in ("grad", "grad_and_value", "vmap", "jacrev", "jacfwd", "vjp", "jvp",
                 "hessian"):
        ours = inspect.signature(getattr(sf, name)).parameters
        theirs = inspect.signature(getattr(tf, name)).parameters
        assert [(p.name, p.kind, p.default) for p in ours.values()] == \
            [(p.name, p.kind, p.default) for p in theirs.values()], name


def test_grad_results_are_plain_tensors_unless_an_outer_graph_needs_them(torch):
    for lib, F in ((sg, sf), (torch, __import__("torch.func").func)):
        x = lib.ones(2)
        assert not F.grad(lambda a: (a * a).sum())(x).requires_grad
        with lib.no_grad():
            leaf = lib.ones(2, requires_grad=True)
            assert not F.grad(lambda a: (a * a).sum())(leaf).requires_grad
        assert F.grad(lambda a: (a * a).sum())(lib.ones(2, requires_grad=True)).requires_grad


def test_vmap_randomness_same_and_different():
    sg.manual_seed(0)
    same = sf.vmap(lambda a: a + sg.rand(()), randomness="same")(sg.zeros(3))
    assert len(set(same.tolist())) == 1
    different = sf.vmap(lambda a: a + sg.rand(()), randomness="different")(sg.zeros(3))
    assert len(set(different.tolist())) == 3


# -- grad_fn._raw_saved_* and register_hooks (torch's saved-tensor hooks tutorial) --------

X5 = np.array([0.5, -1.0, 2.0, 1.5, 0.25], dtype=np.float32)


def _tutorial(lib):
    """The tutorial's "Registering hooks for a saved tensor" steps, with a log of what the
    hooks saw (values, and whether pack got a plain tensor)."""
    log = []

    def pack_hook(t):
        log.append(("pack", t.tolist(), t.requires_grad, t.grad_fn is None))
        return t

    def unpack_hook(t):
        log.append(("unpack", t.tolist()))
        return t

    x = lib.tensor(X5, requires_grad=True)
    y = x.pow(2)
    checks = [y.grad_fn._saved_self is x]
    y.grad_fn._raw_saved_self.register_hooks(pack_hook, unpack_hook)
    saved = y.grad_fn._saved_self  # unpack runs on access
    checks += [saved is x, saved.requires_grad, saved.is_leaf]
    y.sum().backward()  # and again for backward
    grads = [x.grad.numpy().copy()]
    x.grad = None
    y = x.exp()
    y.grad_fn._raw_saved_result.register_hooks(pack_hook, unpack_hook)
    result = y.grad_fn._saved_result
    checks += [result is y, result.grad_fn.name(), result.requires_grad]
    y.sum().backward()
    grads.append(x.grad.numpy().copy())
    return log, checks, grads


def test_raw_saved_hooks_replay_torchs_tutorial(torch):
    (log, checks, grads), (tlog, tchecks, tgrads) = _tutorial(sg), _tutorial(torch)
    assert checks == tchecks
    assert [entry[0] for entry in log] == [entry[0] for entry in tlog]
    assert [entry[2:] for entry in log] == [entry[2:] for entry in tlog]
    for entry, tentry in zip(log, tlog):
        assert_close(np.array(entry[1], np.float32), np.array(tentry[1], np.float32))
    assert_close(grads[0], tgrads[0])
    assert_close(grads[1], tgrads[1], terms=2)  # exp in each library's libm


def test_raw_saved_hooks_that_detach_keep_double_backward(torch):
    out = []
    for lib in (sg, torch):
        x = lib.tensor(X5, requires_grad=True)
        h = x * 3
        z = x * h
        z.grad_fn._raw_saved_self.register_hooks(lambda t: t.detach().clone(), lambda t: t)
        z.grad_fn._raw_saved_other.register_hooks(lambda t: t.detach().clone(), lambda t: t)
        s, o = z.grad_fn._saved_self, z.grad_fn._saved_other
        (g,) = lib.autograd.grad(z.sum(), x, create_graph=True)
        (g2,) = lib.autograd.grad(g.sum(), x)
        out.append(((s.requires_grad, s.is_leaf, o.grad_fn.name()), g.detach().numpy(),
                    g2.numpy()))
    assert out[0][0] == out[1][0] == (True, True, "MulBackward0")
    np.testing.assert_array_equal(out[0][1], out[1][1])  # dyadic values: exact
    np.testing.assert_array_equal(out[0][2], out[1][2])


def test_raw_saved_hooks_errors_like_torch(torch):
    def cases(lib):
        x = lib.tensor(X5, requires_grad=True)
        h = x * 3

        def twice():
            z = x * h
            z.grad_fn._raw_saved_self.register_hooks(lambda t: t, lambda t: t)
            z.grad_fn._raw_saved_self.register_hooks(lambda t: t, lambda t: t)

        def after_backward():
            w = x.exp()
            raw = w.grad_fn._raw_saved_result
            w.sum().backward()
            raw.register_hooks(lambda t: t, lambda t: t)

        def none_saved():
            (x * lib.tensor(X5)).grad_fn._raw_saved_self.register_hooks(lambda t: t,
                                                                         lambda t: t)

        def unpack_not_tensor():
            w = x.exp()
            w.grad_fn._raw_saved_result.register_hooks(lambda t: t, lambda t: 3)
            w.sum().backward()

        def under_context_hooks():
            with lib.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                z = x * h
            z.grad_fn._raw_saved_self.register_hooks(lambda t: t, lambda t: t)

        def not_callable():
            (x * h).grad_fn._raw_saved_self.register_hooks(1, lambda t: t)

        return [_outcome(f) for f in (twice, after_backward, none_saved, unpack_not_tensor,
                                      under_context_hooks,
                                      lambda: x.pow(2).grad_fn._raw_saved_exponent)] + \
            [_outcome(not_callable)[1].split("\n")[0]]

    assert cases(sg) == cases(torch)


def test_raw_saved_hooks_on_a_wrapped_scalar(torch):
    out = []
    for lib in (sg, torch):
        x = lib.tensor(X5, requires_grad=True)
        z = x * 2  # torch saves the 2 as a 0-dim tensor; its unpack hook scales it here
        z.grad_fn._raw_saved_other.register_hooks(lambda t: t, lambda t: t * 10)
        saved = z.grad_fn._saved_other
        z.sum().backward()
        out.append((saved.item(), x.grad.tolist()))
    assert out[0] == out[1] == (20, [20.0] * 5)


def test_func_and_vmap_are_reachable_from_the_top_level_as_in_torch(torch):
    import symgrad

    assert symgrad.func.grad is not None and symgrad.vmap is symgrad.func.vmap
    x = symgrad.tensor([[1.0, 2.0], [3.0, 4.0]])
    got = symgrad.vmap(lambda r: (r * r).sum())(x)
    want = torch.vmap(lambda r: (r * r).sum())(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert got.tolist() == want.tolist()
    assert symgrad.zeros(2, 3).nelement() == torch.zeros(2, 3).nelement() == 6
