"""``symgrad.autograd.Function``: the same user code runs on symgrad and on PyTorch."""

from __future__ import annotations

import re

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg

X = np.array([0.5, -1.0, 2.0], dtype=np.float32)
Y = np.array([1.5, 0.25, -3.0], dtype=np.float32)


def exp_function(lib):
    class Exp(lib.autograd.Function):
        @staticmethod
        def forward(ctx, i):
            result = i.exp()
            ctx.save_for_backward(result)
            return result

        @staticmethod
        def backward(ctx, grad_output):
            (result,) = ctx.saved_tensors
            return grad_output * result

        @staticmethod
        def sympy(x):
            import sympy

            return sympy.exp(x)

    return Exp


def test_exp_function_names_repr_and_gradients_match_torch(torch):
    out = {}
    for lib in (sg, torch):
        Exp = exp_function(lib)
        x = lib.tensor(X, requires_grad=True)
        y = Exp.apply(x)
        node = y.grad_fn
        assert node.name() == "ExpBackward"
        assert "grad_fn=<ExpBackward>" in repr(y)
        prefix = "symgrad" if lib is sg else "torch"
        assert re.fullmatch(rf"<{prefix}\.autograd\.function\.ExpBackward object at 0x[0-9a-f]+>",
                            repr(node)), repr(node)
        assert type(node).__name__ == "ExpBackward"
        assert node.next_functions[0][0].variable is x
        assert node.needs_input_grad == (True,)
        assert node.metadata == {}
        node.metadata["tag"] = 1
        assert node.metadata == {"tag": 1}
        (saved,) = node.saved_tensors
        assert saved.grad_fn is node  # a saved output unpacks with the node as its grad_fn
        (y * lib.tensor(Y)).sum().backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            node.saved_tensors  # noqa: B018
        out[lib] = (y.detach().numpy().copy(), x.grad.numpy().copy())
    for a, b in zip(out[sg], out[torch]):
        assert_close(a, b, terms=3)  # exp (an elementary function: 2), times Y


def test_function_is_exported_where_torch_users_look():
    from symgrad.autograd import Function
    from symgrad.autograd import function as function_module

    assert function_module.Function is Function is sg.autograd.Function
    Exp = exp_function(sg)
    assert type(Exp.apply(sg.tensor(X, requires_grad=True)).grad_fn).__module__ == \
        "symgrad.autograd.function"


def test_sympy_staticmethod_is_kept_for_the_verifier():
    sympy = pytest.importorskip("sympy")
    Exp = exp_function(sg)
    y = Exp.apply(sg.tensor(X, requires_grad=True))
    meaning = type(y.grad_fn)._forward_cls.sympy
    s = sympy.Symbol("s", real=True)
    assert meaning(s) == sympy.exp(s)
    assert sg.autograd.Function.sympy is None  # optional: absent unless a subclass gives it


def two_in_two_out(lib, log):
    class Two(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a, k, b, shift):
            ctx.k = k
            log.append(("needs", ctx.needs_input_grad))
            ctx.save_for_backward(a, b)
            return a * k + shift, a * b

        @staticmethod
        def backward(ctx, g1, g2):
            a, b = ctx.saved_tensors
            log.append(("g2 is zero", not g2.detach().numpy().any()))
            return g1 * ctx.k + g2 * b, None, g2 * a, None

    return Two


def test_multiple_inputs_outputs_non_tensor_args_and_none_gradients(torch):
    out = {}
    for lib in (sg, torch):
        log = []
        Two = two_in_two_out(lib, log)
        a = lib.tensor(X, requires_grad=True)
        b = lib.tensor(Y, requires_grad=True)
        u, v = Two.apply(a, 3.0, b, 1.0)
        assert u.grad_fn is v.grad_fn and (u.grad_fn.name(), u.grad_fn.next_functions[1][0]
                                           .variable is b) == ("TwoBackward", True)
        assert len(u.grad_fn.next_functions) == 2  # edges for tensors only, as in torch
        assert (u._output_nr if lib is sg else u.output_nr) == 0
        u.sum().backward(retain_graph=True)  # v got no gradient: materialized as zeros
        grads1 = (a.grad.numpy().copy(), b.grad.numpy().copy())
        (u * v).sum().backward()
        out[lib] = (log, grads1, a.grad.numpy().copy(), b.grad.numpy().copy(),
                    u.detach().numpy().copy())
    expected_log = [("needs", (True, False, True, False)), ("g2 is zero", True),
                    ("g2 is zero", False)]
    assert out[sg][0] == out[torch][0] == expected_log
    # u = 3a + 1, v = a b; a.grad = 3 + 3 v + u b, b.grad = u a: up to six roundings, and
    # the sum may cancel: the scale is the largest of its terms
    u = 3 * X.astype(np.float64) + 1
    scale = magnitude(3.0, 3 * X * Y, u * Y, u * X, u)
    for s, t in zip(out[sg][1:], out[torch][1:]):
        for p, q in zip(s if isinstance(s, tuple) else (s,), t if isinstance(t, tuple) else (t,)):
            assert_close(p, q, terms=6, scale=scale)


def test_mark_non_differentiable_and_set_materialize_grads(torch):
    seen = {}
    for lib in (sg, torch):
        got = []

        class Split(lib.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                ctx.set_materialize_grads(False)
                mask = a > 0
                ctx.mark_non_differentiable(mask)
                return a * 2, mask

            @staticmethod
            def backward(ctx, g, g_mask, got=got):
                got.append((g is None, g_mask is None))
                return g * 2

        a = lib.tensor(X, requires_grad=True)
        y, mask = Split.apply(a)
        assert not mask.requires_grad and mask.grad_fn is None and y.requires_grad
        y.sum().backward()
        seen[lib] = (got, a.grad.numpy().copy())
    assert seen[sg][0] == seen[torch][0] == [(False, True)]
    np.testing.assert_array_equal(seen[sg][1], seen[torch][1])  # 1 * 2: exact


def test_mark_dirty_rebases_the_modified_input(torch):
    out = {}
    for lib in (sg, torch):
        class Double_(lib.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                a.mul_(2)
                ctx.mark_dirty(a)
                return a

            @staticmethod
            def backward(ctx, g):
                return g * 2

        x = lib.tensor(X, requires_grad=True)
        c = x.sin()
        old = c.grad_fn
        d = Double_.apply(c)
        assert d is c and c.grad_fn.name() == "Double_Backward"
        assert c.grad_fn.next_functions[0][0] is old
        (c * c).sum().backward()
        out[lib] = (c._version, x.grad.numpy().copy())
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad has been used "
                                               "in an in-place operation"):
            Double_.apply(lib.tensor(X, requires_grad=True))
    assert out[sg][0] == out[torch][0]
    # 2 c * 2 * cos(x) with c = 2 sin(x): sin and cos (2 each) and four products
    assert_close(out[sg][1], out[torch][1], terms=8)


def test_input_returned_unchanged_gets_a_new_tensor_object(torch):
    for lib in (sg, torch):
        class Ident(lib.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                return a

            @staticmethod
            def backward(ctx, g):
                return g * 3

        x = lib.tensor(X, requires_grad=True)
        y = Ident.apply(x)
        assert y is not x and x.is_leaf and y.grad_fn.name() == "IdentBackward"
        y.sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0, 3.0])  # 1 * 3: exact


BAD = {
    "too_few": ("lambda ctx, a, b: a + b", "lambda ctx, g: g",
                "function BadBackward returned an incorrect number of gradients "
                "(expected 2, got 1)"),
    "too_many": ("lambda ctx, a, b: a + b", "lambda ctx, g: (g, g, g)",
                 "function BadBackward returned an incorrect number of gradients "
                 "(expected 2, got 3)"),
    "wrong_shape": ("lambda ctx, a, b: a + b", "lambda ctx, g: (g[:2], g)",
                    "Function BadBackward returned an invalid gradient at index 0 - got [2] "
                    "but expected shape compatible with [3]"),
    "non_tensor_grad": ("lambda ctx, a, b: a * 2", "lambda ctx, g: (g * 2, g)",
                        "function BadBackward returned a gradient different than None at "
                        "position 2, but the corresponding forward input was not a Variable"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_backward_raises_naming_the_function_like_torch(torch, case):
    fwd, bwd, message = BAD[case]
    for lib in (sg, torch):
        Bad = type("Bad", (lib.autograd.Function,), {"forward": staticmethod(eval(fwd)),
                                                    "backward": staticmethod(eval(bwd))})
        a = lib.tensor(X, requires_grad=True)
        b = lib.tensor(Y, requires_grad=True) if case != "non_tensor_grad" else 3
        with pytest.raises(RuntimeError) as info:
            Bad.apply(a, b).sum().backward()
        assert message in str(info.value)


def test_broadcastable_gradient_is_summed_and_extra_none_gradients_are_accepted(torch):
    out = {}
    for lib in (sg, torch):
        class Wide(lib.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                return a * 1

            @staticmethod
            def backward(ctx, g):
                return g.expand(2, 3), None  # a broadcast gradient, and a trailing None

        a = lib.tensor(X, requires_grad=True)
        Wide.apply(a).sum().backward()
        out[lib] = a.grad.numpy().copy()
    np.testing.assert_array_equal(out[sg], out[torch])  # sums of ones: exact
    np.testing.assert_array_equal(out[sg], [2.0, 2.0, 2.0])


def grad_scale(lib):
    class ScaleGrad(lib.autograd.Function):
        """Identity forward; the backward rescales the incoming gradient on the fly."""

        @staticmethod
        def forward(ctx, x, scale):
            ctx.scale = scale
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g * ctx.scale, None

    return ScaleGrad


def test_pass_through_gradient_rescaling_inside_a_bigger_graph(torch):
    out = {}
    W = np.array([[0.5, -1.0], [2.0, 0.25], [1.0, 1.0]], dtype=np.float32)
    for lib in (sg, torch):
        ScaleGrad = grad_scale(lib)
        x = lib.tensor(X, requires_grad=True)
        w = lib.tensor(W, requires_grad=True)
        h = (x.unsqueeze(0) @ w).tanh()
        h2 = ScaleGrad.apply(h, -0.5)  # gradient reversal, as in domain adaptation
        loss = (h2 * h2).sum() + (h * 3).sum()
        loss.backward()
        out[lib] = (x.grad.numpy().copy(), w.grad.numpy().copy(), loss.item())
    # forward: mm over 3, tanh (2); loss: h2 * h2 and 3 h, two sums of 2 and their sum;
    # backward: -0.5 * 2 h + 3 (3), tanh's partial (3), x.grad sums 2 products
    terms = 3 + 2 + 1 + 1 + 2 + 2 + 1 + 3 + 3 + 2
    # |h| <= 1 and the incoming gradient -h + 3 <= 4: x.grad's terms are at most
    # 4 max_i sum_j |W_ij|, the loss's at most 2 * (1 + 3)
    scales = (4 * np.abs(W).sum(1).max(), None, 8.0)
    for s, t, scale in zip(out[sg], out[torch], scales):
        assert_close(s, t, terms=terms, scale=scale, dtype=np.float32)  # loss.item(): a float


def test_double_backward_through_a_custom_function_and_once_differentiable(torch):
    out = {}
    for lib in (sg, torch):
        class Cube(lib.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x ** 3

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * 3 * x ** 2

        x = lib.tensor(X.astype(np.float64), requires_grad=True)
        (g,) = lib.autograd.grad(Cube.apply(x).sum(), x, create_graph=True)
        (g2,) = lib.autograd.grad(g.sum(), x)
        out[lib] = (g.detach().numpy().copy(), g2.numpy().copy())

        from_module = sg.autograd if lib is sg else torch.autograd.function

        class Flat(lib.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x ** 3

            @staticmethod
            @from_module.once_differentiable
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return g * 3 * x ** 2

        (gf,) = lib.autograd.grad(Flat.apply(x).sum(), x, create_graph=True)
        assert not gf.requires_grad
    # x ** 3 and g * 3 * x ** 2, differentiated again: pows and products, six roundings
    for s, t in zip(out[sg], out[torch]):
        assert_close(s, t, terms=6)
    assert_close(out[sg][1], 6 * X.astype(np.float64), terms=6)


def test_setup_context_style_and_no_grad_inputs(torch):
    for lib in (sg, torch):
        class Mul(lib.autograd.Function):
            @staticmethod
            def forward(a, b):
                return a * b

            @staticmethod
            def setup_context(ctx, inputs, output):
                ctx.save_for_backward(*inputs)

            @staticmethod
            def backward(ctx, g):
                a, b = ctx.saved_tensors
                return g * b, g * a

        a = lib.tensor(X, requires_grad=True)
        b = lib.tensor(Y)
        y = Mul.apply(a, b)
        assert y.grad_fn.next_functions[1] == (None, 0)
        y.sum().backward()
        np.testing.assert_array_equal(a.grad.numpy(), Y)  # 1 * b: exact
        plain = Mul.apply(lib.tensor(X), b)  # nothing requires grad: no node
        assert plain.grad_fn is None and not plain.requires_grad
        with lib.no_grad():
            assert Mul.apply(a, b).grad_fn is None


def test_modifying_a_tensor_saved_by_a_custom_function_is_caught(torch):
    for lib in (sg, torch):
        Exp = exp_function(lib)
        x = lib.tensor(X, requires_grad=True)
        y = Exp.apply(x)
        y.add_(1)
        with pytest.raises(RuntimeError, match=r"modified by an inplace operation: .*output 0 of "
                                               r"Exp.* is at version 1; expected version 0"):
            y.sum().backward()


def test_custom_function_graph_has_no_reference_cycles(no_gc):
    Exp = exp_function(sg)
    before = sg.memory_allocated()
    x = sg.tensor(np.ones(1000, dtype=np.float32), requires_grad=True)
    y = Exp.apply(x * 2)
    assert sg.memory_allocated() == before + 8000  # x and y (saved as y's alias); x * 2 died
    del y  # frees the node, its saved output, and y: refcounting alone (gc is off)
    del x
    assert sg.memory_allocated() == before
