"""``x * 2`` saves the number as torch does (a wrapped 0-dim tensor), so backward frees it:
a second backward through such a node raises, and ``_saved_other`` is gone, exactly where
torch 2.13 does the same; a Scalar argument such as alpha stays readable."""

import pytest

import symgrad as sg

torch = pytest.importorskip("torch", reason="torch 2.13 is the oracle for this behaviour")

EXPRS = ["x * 1.0", "x * 2", "1.0 * x", "x / 2.0", "2.0 / x", "x + 1.0", "x - 1.0",
         "x.add(x, alpha=3)", "x.mul(3)", "x.div(2)", "x.pow(2)", "x ** 2.0"]


def _second_backward(lib, expr: str):
    x = lib.randn(3, requires_grad=True)
    y = eval(expr, {"x": x})
    y.sum().backward()
    try:
        y.sum().backward()
    except RuntimeError as exc:
        return "raises", str(exc).split(".")[0]
    return "ok", None


@pytest.mark.parametrize("expr", EXPRS)
def test_second_backward_raises_where_torch_raises(expr):
    assert _second_backward(sg, expr) == _second_backward(torch, expr)


@pytest.mark.parametrize("expr, name", [("x * 2", "_saved_other"), ("x / 2.0", "_saved_other"),
                                         ("x.add(x, alpha=3)", "_saved_alpha")])
def test_saved_number_after_backward_as_torch(expr, name):
    seen = []
    for lib in (sg, torch):
        x = lib.randn(3, requires_grad=True)
        y = eval(expr, {"x": x})
        getattr(y.grad_fn, name)  # readable before backward
        y.sum().backward()
        try:
            after = getattr(y.grad_fn, name)
        except RuntimeError as exc:
            after = str(exc).split(".")[0]
        seen.append(after)
    assert seen[0] == seen[1]


def test_retain_graph_keeps_the_number():
    x = sg.randn(3, requires_grad=True)
    y = x * 2
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    assert x.grad.tolist() == [4.0, 4.0, 4.0]
