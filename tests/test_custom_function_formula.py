"""The Inspector shows a custom Function's traced forward as formulas beside its node.

A custom ``autograd.Function`` (symgrad or torch) without a ``sympy`` method has no op spec
to read a formula from: its graph JSON node carries its forward traced on symbols named
after its inputs (``x_{0}``), with the derivative of the first output element, so the
widget's panel and the labextension (which show ``formula``/``derivative``) show it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import symgrad as sg
from symgrad.autograd import Function
from symgrad.jupyter import graph_json, load_schema
from symgrad.jupyter.widget import formula_html

jsonschema = pytest.importorskip("jsonschema")


def _validate(payload):
    jsonschema.validate(payload, load_schema())
    json.dumps(payload)


def _node(payload, name):
    return next(n for n in payload["nodes"] if n["name"] == name)


class SmoothClamp(Function):
    @staticmethod
    def forward(ctx, x, c):
        ctx.save_for_backward(x)
        ctx.c = c
        return (x / c).tanh() * c

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (1 - (x / ctx.c).tanh() ** 2), None


class Branchy(Function):
    """where(x > 0, exp(x), sin(x)): the branch is decided at the recorded value."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return sg.where(x > 0, x.exp(), x.sin())

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * sg.where(x > 0, x.exp(), x.cos())


class PythonIf(Function):
    @staticmethod
    def forward(ctx, x):
        if x.sum().item() > 0:
            return x * 2
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def test_symgrad_custom_function_node_carries_its_traced_forward():
    x = sg.tensor([0.5, -1.0], dtype=sg.float64, requires_grad=True)
    y = SmoothClamp.apply(x, 2.0)
    payload = graph_json(y, {"x": x, "y": y})
    _validate(payload)
    node = _node(payload, "SmoothClampBackward")
    assert node["formula"].startswith("{y}_{0} = ")
    assert r"\tanh" in node["formula"] and "{x}_{0}" in node["formula"]
    assert "{y}_{1} = " in node["formula"] and "{x}_{1}" in node["formula"]
    assert node["derivative"].startswith(r"\frac{\partial {y}_{0}}{\partial {x}_{0}} = ")
    assert r"\tanh^{2}" in node["derivative"]
    html = formula_html(node)
    assert "sg-formula" in html and "sg-derivative" in html and r"\tanh" in html


def test_branches_are_decided_at_the_recorded_values():
    for v, want, other in ((0.5, "e^{", r"\sin"), (-0.5, r"\sin", "e^{")):
        x = sg.tensor([v], dtype=sg.float64, requires_grad=True)
        node = _node(graph_json(Branchy.apply(x), {"x": x}), "BranchyBackward")
        assert want in node["formula"] and other not in node["formula"], node["formula"]


def test_untraceable_forward_has_no_formula_and_no_error():
    x = sg.tensor([0.5, 1.0], dtype=sg.float64, requires_grad=True)
    payload = graph_json(PythonIf.apply(x), {"x": x})
    _validate(payload)
    node = _node(payload, "PythonIfBackward")
    assert node["formula"] is None and node["derivative"] is None


def test_formulas_off_and_large_inputs_leave_it_out():
    from symgrad.symbolic.custom import FORMULA_LIMIT

    x = sg.tensor(np.linspace(-1, 1, FORMULA_LIMIT + 1), requires_grad=True)
    node = _node(graph_json(SmoothClamp.apply(x, 2.0), {"x": x}), "SmoothClampBackward")
    assert node["formula"] is None
    x = sg.tensor([0.5], requires_grad=True)
    node = _node(graph_json(SmoothClamp.apply(x, 2.0), {"x": x}, formulas=False),
                 "SmoothClampBackward")
    assert node["formula"] is None


def test_torch_function_node_carries_its_traced_forward():
    torch = pytest.importorskip("torch")

    class LinearTanh(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            ctx.save_for_backward(x, w)
            return torch.tanh(x @ w.t() + b)

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError

    class TorchClamp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, c):
            return torch.tanh(x / c) * c

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError

    x = torch.tensor([[0.5, -1.0]], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([[0.1, 0.2], [0.3, -0.4]], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([0.1, 0.2], dtype=torch.float64, requires_grad=True)
    out = LinearTanh.apply(x, w, b)  # every argument a graph tensor: no capture needed
    payload = graph_json(out, {"x": x, "w": w, "b": b, "out": out})
    _validate(payload)
    node = _node(payload, "LinearTanhBackward")
    f = node["formula"]
    assert f.startswith(r"{\mathrm{out}}_{0,0} = \tanh")
    assert "{x}_{0,0}" in f and "{w}_{0,0}" in f and "{b}_{0}" in f
    assert r"\partial {b}_{0}" in node["derivative"]
    with sg.capture_torch():  # a non-tensor argument: read from the capture
        y = TorchClamp.apply(x.sin(), 2.0)
    node = _node(graph_json(y, {"x": x}), "TorchClampBackward")
    assert r"\tanh" in node["formula"] and "{x}_{0,1}" in node["formula"]
    node = _node(graph_json(TorchClamp.apply(x, 2.0), {"x": x}), "TorchClampBackward")
    assert node["formula"] is None  # no capture: the argument 2.0 is not known
