"""Every graph view survives any value: nan, inf, -inf, huge, tiny and empty tensors.

A tensor holding NaN used to make every view raise (``cannot convert float NaN to integer``
from the value previews). Each view is built here from graphs whose leaves, intermediates,
saved operands, Python scalar operands and gradients hold non-finite, extreme or no values;
the text must read ``nan``/``inf``/``-inf``/``1e+300`` and the graph JSON must stay strict
JSON (no bare ``NaN`` token, which a browser's ``JSON.parse`` and jupyter_client refuse)
valid against the schema.
"""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

import symgrad as sg
from symgrad.jupyter import GRAPH_MIME, graph_json, load_schema
from symgrad.jupyter.graph import _fmt, latex_number, preview, text_outline
from symgrad.jupyter.magics import SavedView
from symgrad.jupyter.svg import render_html, render_svg

jsonschema = pytest.importorskip("jsonschema")

NAN, INF = float("nan"), float("inf")
F32_MAX = float(np.finfo(np.float32).max)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def strict(payload: dict) -> None:
    """Valid against the schema, and JSON without NaN/Infinity tokens."""
    jsonschema.validate(payload, load_schema())
    text = json.dumps(payload, allow_nan=False)
    assert "NaN" not in text and "Infinity" not in text


# -- graphs --------------------------------------------------------------------------------

def g_leaves(lib):
    """Leaves holding nan, inf, -inf and float32's largest value; gradients too."""
    a = lib.tensor([1.0, NAN, INF, -INF], requires_grad=True)
    b = lib.tensor([F32_MAX, 2.0, 3.0, 4.0], requires_grad=True)
    c = a * b
    y = c.sum()
    y.backward(retain_graph=True)
    return dict(a=a, b=b, c=c, y=y), ["nan", "inf", "-inf", "3.403e+38"]


def g_overflow(lib):
    """Finite leaves, an intermediate that overflows float32 to inf and then nan."""
    x = lib.tensor([1e38, -1e38, 2.0], requires_grad=True)
    big = x * 1e10  # inf, -inf, 2e10
    z = big - big  # nan, nan, 0
    y = (z * x).sum() + (big * x).sum()  # both products save the non-finite operand
    y.backward(retain_graph=True)
    return dict(x=x, big=big, z=z, y=y), ["inf", "-inf", "nan", "1e+38"]


def g_scalars(lib):
    """Python scalar operands nan, inf and 1e300 (shown in formulas and None inputs)."""
    x = lib.tensor([1.0, 2.0], dtype=lib.float64, requires_grad=True)
    y = ((x * NAN) + (x + INF) + (x * 1e300) + (x * -1e300) + (x * 1e-300)).sum()
    return dict(x=x, y=y), ["nan", "inf", "1e+300", "-1e+300", "1e-300"]


def g_huge64(lib):
    """float64 values at the edges: 1e300, 1e-300, the largest double."""
    x = lib.tensor([1e300, 1e-300, 1.7976931348623157e308], dtype=lib.float64,
                   requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    return dict(x=x, y=y), ["1e+300", "1e-300", "1.798e+308", "inf"]


def g_empty(lib):
    """Empty tensors, shapes (0,) and (2, 0)."""
    e = lib.zeros(0, requires_grad=True)
    f = lib.zeros(2, 0, requires_grad=True)
    y = (e * 2).sum() + (f * 3).sum()
    y.backward(retain_graph=True)
    return dict(e=e, f=f, y=y), ["[]", "[] (shape [2, 0])"]


def g_clamp(lib):
    """Non-finite saved parameters (clamp bounds) and a nan-producing op (log of -1)."""
    x = lib.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    y = (x.clamp(min=-INF, max=INF).log() * x.clamp(min=NAN)).sum()
    return dict(x=x, y=y), ["nan", "-inf"]


GRAPHS = [g_leaves, g_overflow, g_scalars, g_huge64, g_empty, g_clamp]
IDS = [g.__name__[2:] for g in GRAPHS]


def all_text(payload: dict) -> str:
    return json.dumps(payload, allow_nan=False)


@pytest.mark.parametrize("make", GRAPHS, ids=IDS)
def test_graph_json_is_strict_and_reads_the_values(make):
    ns, expected = make(sg)
    p = graph_json(ns["y"], ns)
    strict(p)
    text = all_text(p)
    for word in expected:
        assert json.dumps(word)[1:-1] in text, (word, text)


@pytest.mark.parametrize("make", GRAPHS, ids=IDS)
def test_static_views(make):
    ns, expected = make(sg)
    view = sg.graph(ns["y"], ns)
    p = view.to_json()
    svg = render_svg(p)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    html = render_html(p)
    assert "symgrad-graph-output" in html
    outline = repr(view)
    assert outline == text_outline(p) and outline.startswith("symgrad graph:")
    bundle = view._repr_mimebundle_()
    assert set(bundle) >= {GRAPH_MIME, "text/html", "text/plain"}
    strict(bundle[GRAPH_MIME])
    assert "<svg" in view._repr_html_() and "<svg" in bundle["text/html"]


@pytest.mark.parametrize("make", GRAPHS, ids=IDS)
def test_grad_fn_display_hook(make):
    ns, _ = make(sg)
    fn = ns["y"].grad_fn
    bundle = fn._repr_mimebundle_()
    strict(bundle[GRAPH_MIME])
    assert bundle["text/plain"].startswith("<") and "<svg" in bundle["text/html"]
    assert "<svg" in fn._repr_html_()


def test_ipython_display_formatter_on_nan_graph():
    """What the notebook's display hook runs: the formatter over the grad_fn."""
    ip = pytest.importorskip("IPython.core.formatters")
    ns, _ = g_leaves(sg)
    data, _meta = ip.DisplayFormatter().format(ns["y"].grad_fn)
    assert GRAPH_MIME in data and "text/html" in data
    json.dumps(data[GRAPH_MIME], allow_nan=False)
    data, _meta = ip.DisplayFormatter().format(sg.graph(ns["y"], ns))
    json.dumps(data[GRAPH_MIME], allow_nan=False)


@pytest.mark.parametrize("make", GRAPHS, ids=IDS)
def test_saved_view(make):
    ns, _ = make(sg)
    view = SavedView(graph_json(ns["y"], ns, formulas=False))
    html = view._repr_html_()
    text = repr(view)
    assert "<table" in html and text


def test_saved_view_shows_nonfinite_values():
    ns, _ = g_leaves(sg)
    view = SavedView(graph_json(ns["y"], ns, formulas=False))
    text, html = repr(view), view._repr_html_()
    assert "[1., nan, inf, -inf]" in text and "[1., nan, inf, -inf]" in html
    assert "3.403e+38" in text


def test_previews_of_each_value():
    a = sg.tensor([1.0, NAN, INF, -INF], requires_grad=True)
    p = graph_json((a * 2).sum(), {"a": a})
    leaf = next(lf for lf in p["leaves"] if lf["name"] == "a")
    assert leaf["preview"] == "[1., nan, inf, -inf]"
    assert preview(np.array(NAN)) == "nan" and preview(np.array(-INF)) == "-inf"
    assert preview(np.array([1e300])) == "[1e+300]"
    assert preview(np.float32(F32_MAX)) == "3.403e+38"
    assert preview(np.zeros(0)) == "[]" and preview(np.zeros((2, 0))) == "[] (shape [2, 0])"
    assert preview(np.array([NAN] * 10)) == "[nan, nan, nan, …, nan, nan, nan] (10 values, " \
                                             "shape [10])"
    assert [_fmt(v) for v in (NAN, INF, -INF, 1e300, 1e-300, -0.0, 5.0, 2**70, True)] == \
        ["nan", "inf", "-inf", "1e+300", "1e-300", "-0.", "5.", str(2**70), "True"]


def test_latex_formulas_show_nonfinite_scalars():
    ns, _ = g_scalars(sg)
    p = graph_json(ns["y"], ns)
    formulas = " ".join(f"{n['formula']} {n['derivative']}" for n in p["nodes"]
                        if n["kind"] == "op")
    assert r"\mathrm{nan}" in formulas and r"\infty" in formulas
    assert r"10^{300}" in formulas and r"10^{-300}" in formulas
    assert "NaN" not in formulas and "1000000000000" not in formulas  # no 300-digit integer
    assert latex_number(NAN) == r"\mathrm{nan}" and latex_number(-INF) == r"-\infty"
    assert latex_number(1e300) == r"1 \cdot 10^{300}" and latex_number(0.25) == "0.25"
    ns, _ = g_clamp(sg)
    p = graph_json(ns["y"], ns)
    formulas = " ".join(str(n["formula"]) for n in p["nodes"] if n["kind"] == "op")
    assert r"\infty" in formulas and r"\mathrm{nan}" in formulas


def test_none_input_names_a_nonfinite_constant():
    x = sg.tensor([1.0], requires_grad=True)
    p = graph_json((x * NAN).sum(), {"x": x})
    strict(p)
    # a Python scalar operand is saved as a scalar: its preview reads nan
    saved = [s["preview"] for n in p["nodes"] for s in n["saved"] if s["kind"] == "scalar"]
    assert "nan" in saved


@pytest.mark.parametrize("make", [g_leaves, g_overflow, g_huge64, g_empty],
                         ids=lambda g: g.__name__)
def test_with_a_verifier_report(make):
    """The agreement table and node checks with nan/inf errors: strings or null, never NaN."""
    ns, _ = make(sg)
    report = sg.verify(ns["y"], names=ns)
    p = graph_json(ns["y"], ns, report)
    strict(p)
    for row in p["agreement"]["rows"]:
        for key in ("max_abs_err", "max_rel_err", "fd_max_abs_err"):
            v = row.get(key)
            assert v is None or math.isfinite(v)
    html = render_html(p)
    assert "sg-agreement" in html
    bundle = sg.graph(ns["y"], ns, report)._repr_mimebundle_()
    strict(bundle[GRAPH_MIME])


def test_agreement_rows_read_nonfinite_values():
    ns, _ = g_leaves(sg)
    report = sg.verify(ns["y"], names=ns)
    p = graph_json(ns["y"], ns, report)
    text = " ".join(str(r.get(k)) for r in p["agreement"]["rows"]
                    for k in ("engine", "symbolic", "finite_diff"))
    assert "nan" in text or "inf" in text


# -- torch graphs --------------------------------------------------------------------------

@pytest.mark.parametrize("make", [g_leaves, g_overflow, g_scalars, g_empty],
                         ids=lambda g: g.__name__)
def test_torch_graphs(make, torch):
    ns, expected = make(torch)
    p = graph_json(ns["y"], ns)
    assert p["source"] == "torch"
    strict(p)
    text = all_text(p)
    # torch's AddBackward1 keeps no scalar operand: x + inf leaves no "inf" to show
    skip = {"inf"} if make is g_scalars else set()
    for word in set(expected) - skip:
        assert json.dumps(word)[1:-1] in text, (word, text)
    view = sg.graph(ns["y"], ns)
    assert "<svg" in view._repr_mimebundle_()["text/html"]
    assert repr(view).startswith("symgrad graph:")
    saved = SavedView(graph_json(ns["y"], ns, formulas=False))
    assert repr(saved) and "<table" in saved._repr_html_()


def test_torch_nan_saved_operands(torch):
    a = torch.tensor([1.0, NAN], requires_grad=True)
    b = torch.tensor([INF, 2.0], requires_grad=True)
    y = (a * b).sum()
    p = graph_json(y, {"a": a, "b": b})
    strict(p)
    previews = [s.get("preview") for n in p["nodes"] for s in n["saved"]]
    assert "[1., nan]" in previews and "[inf, 2.]" in previews


# -- the Inspector widget ------------------------------------------------------------------

@pytest.mark.parametrize("make", [g_leaves, g_overflow, g_empty], ids=lambda g: g.__name__)
def test_inspector(make):
    pytest.importorskip("ipywidgets")
    from symgrad.jupyter import Inspector

    ns, _ = make(sg)
    ins = Inspector(ns["y"], ns, verify=False)
    strict(ins.graph)
    seen = []
    for n in ins.graph["nodes"]:
        ins.selected = n["id"]
        static = getattr(ins, "static_html", None)
        if static is not None:
            seen.append(static())
    ins.verify(background=False)
    strict(ins.graph)
    json.dumps(ins.report, allow_nan=False)
    if seen:
        assert all(isinstance(h, str) for h in seen)
    ins.close()


def test_inspector_panels_show_nonfinite_values():
    pytest.importorskip("ipywidgets")
    from symgrad.jupyter import Inspector
    from symgrad.jupyter.widget import node_panel_html

    ns, _ = g_leaves(sg)
    ins = Inspector(ns["y"], ns, verify=False)
    panels = "".join(node_panel_html(n, ins.graph) for n in ins.graph["nodes"])
    assert "nan" in panels and "-inf" in panels and "3.403e+38" in panels
    ins.close()


@pytest.mark.parametrize("shape", [(0,), (2, 0)])
def test_report_latex_with_an_empty_leaf(shape):
    x = sg.zeros(*shape, requires_grad=True)
    w = sg.tensor([1.0, 2.0], requires_grad=True)
    rep = sg.verify(x.sum() + (w * w).sum(), names={"x": x, "w": w})
    tex = rep.latex()
    assert r"\text{(empty, }" in tex and "w" in tex
