"""A custom Function's node shows what its forward saved, as a built-in node does.

``ctx.save_for_backward(x, y, None)`` gives rows ``saved_tensors[0..2]`` (torch exposes
these only as ``grad_fn.saved_tensors``, with no ``_saved_*`` attribute), and a tensor the
forward stored on ``ctx`` (``ctx.w = w``) a row named ``w`` (torch lists it in
``vars(grad_fn)``). The same rows appear in the graph JSON (the Inspector and the
labextension render ``node["saved"]``), ``%symgrad saved`` and the static SVG's hover text,
for symgrad and torch graphs alike.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

import symgrad as sg
from symgrad.jupyter import graph_json, load_schema
from symgrad.jupyter.magics import SavedView
from symgrad.jupyter.svg import render_svg

_SVG = "{http://www.w3.org/2000/svg}"
FREED = "freed by backward (use retain_graph=True)"


def scale_function(lib):
    class Scale(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            y = x * w
            ctx.save_for_backward(x, y, None)  # an input, the output, and None
            ctx.w = w  # a tensor kept on ctx
            ctx.k = 3  # not a tensor: not listed
            return y

        @staticmethod
        def backward(ctx, g):
            x, _y, _ = ctx.saved_tensors
            return g * ctx.w, g * x

    return Scale


def build(lib) -> dict:
    x = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = lib.tensor([4.0, 5.0, 6.0], requires_grad=True)
    y = scale_function(lib).apply(x, w)
    loss = y.sum()
    return dict(x=x, w=w, y=y, loss=loss)


def custom_node(payload: dict) -> dict:
    (node,) = [n for n in payload["nodes"] if n["label"] == "ScaleBackward"]
    return node


def check_schema(payload: dict) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(payload, load_schema())
    json.dumps(payload)


def rows(node: dict) -> list[tuple]:
    return [(s["name"], s["attr"], s["kind"], s.get("shape"), s.get("dtype"), s.get("preview"),
             s.get("same_object_as"), s.get("is_output")) for s in node["saved"]]


EXPECTED = [
    ("saved_tensors[0]", "saved_tensors[0]", "tensor", [3], "float32", "[1., 2., 3.]", "x",
     False),
    ("saved_tensors[1]", "saved_tensors[1]", "tensor", [3], "float32", "[4., 10., 18.]", None,
     True),
    ("saved_tensors[2]", "saved_tensors[2]", "none", None, None, "None", None, None),
    ("w", "w", "tensor", [3], "float32", "[4., 5., 6.]", "w", False),
]


def test_custom_function_node_lists_what_forward_saved():
    ns = build(sg)
    p = graph_json(ns["loss"], ns)
    check_schema(p)
    assert rows(custom_node(p)) == EXPECTED


def test_torch_custom_function_node_lists_the_same(torch):
    ns = build(torch)
    p = graph_json(ns["loss"], ns)
    check_schema(p)
    assert rows(custom_node(p)) == EXPECTED
    # the names are what torch users read: grad_fn.saved_tensors[i] and grad_fn.w
    node = ns["y"].grad_fn
    assert torch.equal(node.saved_tensors[0], ns["x"]) and node.w is ns["w"]
    assert [k for k, v in vars(node).items() if isinstance(v, torch.Tensor)] == ["w"]
    assert not any(a.startswith("_saved_") for a in dir(node))


def test_freed_custom_saved_operands_are_listed_after_backward():
    ns = build(sg)
    ns["loss"].backward()
    p = graph_json(ns["loss"], ns)
    check_schema(p)
    got = {s["name"]: s for s in custom_node(p)["saved"]}
    assert list(got) == ["saved_tensors[0]", "saved_tensors[1]", "saved_tensors[2]", "w"]
    # a freed saved input is shown from the input the node refers to, as built-ins do
    assert got["saved_tensors[0]"]["kind"] == "freed"
    assert got["saved_tensors[0]"]["shape"] == [3]
    assert got["saved_tensors[0]"]["same_object_as"] == "x"
    assert got["saved_tensors[1]"] == {"name": "saved_tensors[1]", "attr": "saved_tensors[1]",
                                       "kind": "freed", "preview": FREED}
    assert got["saved_tensors[2]"]["kind"] == "none"
    assert got["w"]["kind"] == "tensor" and got["w"]["preview"] == "[4., 5., 6.]"
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        ns["y"].grad_fn.saved_tensors  # noqa: B018 - the ctx API is unchanged


def test_freed_custom_saved_input_keeps_its_values_under_record():
    with sg.record():
        ns = build(sg)
    x = ns.pop("x")
    ns["loss"].backward()
    p = graph_json(ns["loss"], ns)
    row = custom_node(p)["saved"][0]
    assert (row["kind"], row["shape"], row["preview"]) == ("freed", [3], "[1., 2., 3.]")
    assert x.grad.tolist() == [4.0, 5.0, 6.0]


def test_torch_freed_custom_saved_tensors(torch):
    ns = build(torch)
    ns["loss"].backward()
    got = rows(custom_node(graph_json(ns["loss"], ns)))
    assert got == [("saved_tensors", "saved_tensors", "freed", None, None, FREED, None, None),
                   EXPECTED[3]]


def test_saved_view_and_static_svg_show_custom_saved_operands():
    ns = build(sg)
    p = graph_json(ns["loss"], ns)
    text = repr(SavedView(p)).splitlines()
    assert "ScaleBackward (y).saved_tensors[0] [3] = [1., 2., 3.]  same object as x" in text
    assert "ScaleBackward (y).saved_tensors[1] [3] = [4., 10., 18.]" in text
    assert "ScaleBackward (y).saved_tensors[2] = None" in text
    assert "ScaleBackward (y).w [3] = [4., 5., 6.]  same object as w" in text
    assert not any("saves nothing" in line for line in text)
    html = SavedView(p)._repr_html_()
    assert "saved_tensors[1]" in html and "saves nothing" not in html
    root = ET.fromstring(render_svg(p))
    node_id = custom_node(p)["id"]
    (g,) = [g for g in root.iter(f"{_SVG}g") if g.get("data-id") == node_id]
    tip = g.find(f"{_SVG}title").text.split("\n")
    assert "saved saved_tensors[0] [3] = [1., 2., 3.] (same object as x)" in tip
    assert "saved saved_tensors[1] [3] = [4., 10., 18.]" in tip
    assert "saved w [3] = [4., 5., 6.] (same object as w)" in tip


def test_symgrad_saved_magic_lists_custom_saved_operands(capsys):
    """``%symgrad saved y`` in an IPython shell, where the Function is defined in a cell."""
    from IPython.core.interactiveshell import InteractiveShell

    created = not InteractiveShell.initialized()
    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "symgrad")
        ip.run_cell("import symgrad as sg\n"
                    "class Cube(sg.autograd.Function):\n"
                    "    @staticmethod\n"
                    "    def forward(ctx, x):\n"
                    "        ctx.save_for_backward(x)\n"
                    "        return x ** 3\n"
                    "    @staticmethod\n"
                    "    def backward(ctx, g):\n"
                    "        (x,) = ctx.saved_tensors\n"
                    "        return 3 * x ** 2 * g\n"
                    "a = sg.tensor([1., 2.], requires_grad=True)\n"
                    "y = Cube.apply(a)\n")
        capsys.readouterr()
        view = ip.run_line_magic("symgrad", "saved y")
        assert repr(view) == "CubeBackward (y).saved_tensors[0] [2] = [1., 2.]  same object as a"
    finally:
        if created:
            InteractiveShell.clear_instance()
