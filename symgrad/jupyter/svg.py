"""Static SVG/HTML of a graph payload: the view that works wherever no JavaScript runs.

VS Code, nbviewer, GitHub and a saved notebook without widget state all show this. Every
string that came from user code or the engine (tensor names, grad_fn names, previews,
messages) passes through :func:`esc`; nothing is inserted as markup. Nodes carry
``data-id``/``data-kind``/``data-status`` so the widget and the browser tests can find
them, and a ``<title>`` so hovering shows shape and dtype. Graphs above
``AUTO_COLLAPSE_NODES`` draw loop-built runs of ops as one chain box, so a 500-op loop is
a few KB of SVG rather than megabytes.
"""

from __future__ import annotations

import html
import itertools
from typing import Any

from .layout import (
    AUTO_COLLAPSE_NODES,
    BOX_H,
    MIN_RUN,
    VERDICT_MARK,
    VERDICT_STATUS,
    edge_points,
    find_chains,
    layout_bends,
    layout_boxes,
    layout_matches,
    module_clusters,
    payload_layout,
    static_texts,
    visible_graph,
)

__all__ = ["esc", "tex_to_text", "render_svg", "render_html", "agreement_table_html",
           "STATUS_COLORS", "find_chains", "AUTO_COLLAPSE_NODES", "MIN_RUN"]

_ids = itertools.count()

STATUS_COLORS = {"pass": "#1a7f37", "fail": "#cf222e", "skipped": "#9a6700",
                 "error": "#8250df", "none": "#57606a"}
_FILL = {"op": "#eef2f8", "accumulate": "#ddf4ff", "leaf": "#ddf4ff", "none": "#f6f8fa",
         "chain": "#fff8c5", "module": "#f3eefc"}
_VERDICT_WORDS = {"bad": "a node inside disagrees", "ok": "checked: every node agrees",
                  "unchecked": "not checked"}
_MODULE_FILL = ("#f6f8fa", "#fbf7ff")  # frames of expanded modules, alternating by depth


#: LaTeX commands the formula lines use, as the characters a plain-text view shows
_TEX_WORDS = {
    "sum": "\u03a3", "prod": "\u03a0", "max": "max", "min": "min", "log": "log", "exp": "exp",
    "cdot": "\u00b7", "odot": "\u2299", "times": "\u00d7", "le": "\u2264", "leq": "\u2264",
    "ge": "\u2265", "geq": "\u2265", "ne": "\u2260", "lfloor": "\u230a", "rfloor": "\u230b",
    "lceil": "\u2308", "rceil": "\u2309", "infty": "\u221e", "partial": "\u2202",
    "top": "\u1d40", "dots": "\u2026", "ldots": "\u2026", "cdots": "\u22ef",
    "lnot": "\u00ac", "neg": "\u00ac", "quad": "  ", "qquad": "   ", "left": "", "right": "",
    "textstyle": "", "displaystyle": "", "mathrel": "", "sqrt": "\u221a", "pi": "\u03c0",
}
_TEX_SPACES = {",": " ", ";": " ", ":": " ", "!": "", " ": " ", "{": "{", "}": "}", "_": "_",
               "%": "%", "&": "&", "#": "#", "$": "$"}


def _tex_group(tex: str, i: int) -> tuple[str, int]:
    """The argument at ``tex[i]``: a ``{...}`` group (without its braces) or one char."""
    if i >= len(tex):
        return "", i
    if tex[i] != "{":
        return tex[i], i + 1
    depth, j = 0, i
    while j < len(tex):
        depth += {"{": 1, "}": -1}.get(tex[j], 0)
        if depth == 0:
            return tex[i + 1:j], j + 1
        j += 1
    return tex[i + 1:], len(tex)


def tex_to_text(tex: str) -> str:
    """A formula line's LaTeX as plain Unicode text, for views without MathJax (the static
    SVG's hover text): ``\\sum_{p<3} w[o,p]\\,x[n,2i+p]`` reads ``Σ_{p<3} w[o,p] x[n,2i+p]``."""
    out: list[str] = []
    i = 0
    while i < len(tex):
        ch = tex[i]
        if ch == "\\":
            j = i + 1
            while j < len(tex) and tex[j].isalpha():
                j += 1
            word = tex[i + 1:j]
            if not word:  # \, \; \{ ...
                out.append(_TEX_SPACES.get(tex[j:j + 1], tex[j:j + 1]))
                i = j + 1
                continue
            i = j + (tex[j:j + 1] == " ")  # a space after a command only ends it
            if word == "frac":
                num, i = _tex_group(tex, i)
                den, i = _tex_group(tex, i)
                num, den = tex_to_text(num), tex_to_text(den)
                out.append((f"{num}/{den}" if len(num) <= 1 and len(den) <= 1
                            else f"({num})/({den})") + " ")
            elif word in ("mathrm", "operatorname", "text", "mathit", "mathbf", "textrm"):
                arg, i = _tex_group(tex, i)
                out.append(tex_to_text(arg) if word != "text" else arg)
            elif word == "bar":
                arg, i = _tex_group(tex, i)
                out.append(tex_to_text(arg) + "\u0304")
            else:
                out.append(_TEX_WORDS.get(word, word))
        elif ch == "^":
            arg, i = _tex_group(tex, i + 1)
            text = tex_to_text(arg)
            out.append(text if text == "\u1d40" else f"^{text}" if len(text) == 1
                       else f"^({text})")
        elif ch == "_":
            arg, i = _tex_group(tex, i + 1)
            text = tex_to_text(arg)
            out.append(text if text.isdigit() else f"_{text}" if len(text) == 1
                       else f"_{{{text}}}")
        elif ch in "{}":
            i += 1
        else:
            out.append(ch)
            i += 1
    return " ".join("".join(out).split())


def esc(value: Any) -> str:
    """HTML-escape any value for text and attribute positions (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


def _n(v: float) -> str:
    """A coordinate: whole pixels as ``12``, halves as ``12.5``."""
    return f"{v:.1f}".removesuffix(".0")


def render_svg(payload: dict, selected: str | None = None) -> str:
    """The graph as one ``<svg>`` element (roots on top, leaves at the bottom).

    Graphs above ``AUTO_COLLAPSE_NODES`` nodes draw runs of ops as one chain box
    (``data-kind="chain"``, ``data-members``), keeping the selected node out of them.
    Boxes and edges come from the payload's ``layout`` when it covers what is drawn (the
    one the labextension draws too), else from :func:`layout.payload_layout` now.
    """
    nodes, vis_edges = visible_graph(payload, selected)
    lay = payload.get("layout")
    if not layout_matches(lay, nodes):
        lay = payload_layout(payload, selected)
    boxes, bends = layout_boxes(lay), layout_bends(lay)
    clusters = module_clusters(payload, nodes, boxes)
    uid = f"sg{next(_ids)}"
    w, h = max(lay["width"], 60), max(lay["height"], BOX_H + 20)
    vx = min([0.0] + [c["rect"][0] - 2 for c in clusters])
    vy = min([0.0] + [c["rect"][1] - 2 for c in clusters])
    w = max([w] + [c["rect"][0] + c["rect"][2] + 2 for c in clusters]) - vx
    h = max([h] + [c["rect"][1] + c["rect"][3] + 2 for c in clusters]) - vy
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="symgrad-graph" '
           f'data-symgrad="graph" width="{w:.0f}" height="{h:.0f}" '
           f'viewBox="{vx:.0f} {vy:.0f} {w:.0f} {h:.0f}" font-family="ui-monospace, Menlo, '
           f'Consolas, monospace" font-size="12" role="img">',
           f'<defs><marker id="{uid}-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
           f'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
           f'<path d="M 0 0 L 10 5 L 0 10 z" fill="#8c959f"/></marker></defs>']
    if clusters:  # expanded modules: frames behind their nodes, outermost first
        out.append('<g class="sg-modules" fill-opacity="0.35" font-size="10" '
                   'text-anchor="start">')
        for c in clusters:
            color = STATUS_COLORS[VERDICT_STATUS.get(c["verdict"], "none")]
            mark = VERDICT_MARK.get(c["verdict"], "")
            d = " ".join("M " + " L ".join(f"{_n(px)} {_n(py)}" for px, py in poly) + " Z"
                         for poly in c["outline"])
            lx, ly = c["outline"][0][-1][0], c["outline"][0][0][1]  # the first piece's top left
            out.append(f'<g class="sg-module" data-path="{esc(c["path"])}" '
                       f'data-verdict="{esc(c["verdict"])}">'
                       f'<title>{esc(c["path"])}: {esc(c["type"])} ({esc(mark)})</title>'
                       f'<path d="{d}" fill="{_MODULE_FILL[c["depth"] % 2]}" '
                       f'stroke="{color}" stroke-dasharray="6 3" stroke-linejoin="round"/>'
                       f'<text x="{_n(lx + 6)}" y="{_n(ly + 11)}" fill="{color}" '
                       f'fill-opacity="1">{esc(c["path"])}: {esc(c["type"])} {esc(mark)}'
                       "</text></g>")
        out.append("</g>")
    by_id = {n["id"]: n for n in nodes}
    # shared presentation attributes sit on the groups (SVG inherits them): a saved
    # notebook carries one SVG per graph output, so every repeated byte counts
    out.append(f'<g class="sg-edges" fill="none" stroke="#8c959f" stroke-width="1.3" '
               f'marker-end="url(#{uid}-arrow)">')
    for e in vis_edges:
        a, b = e["from"], e["to"]
        if a == b or a not in boxes or b not in boxes:
            continue
        pts = edge_points(boxes, a, b, bends)
        d = "M " + " L ".join(f"{_n(px)} {_n(py)}" for px, py in pts)
        dash = ' stroke-dasharray="4 3"' if by_id[b]["kind"] == "none" else ""
        out.append(f'<path class="sg-edge" data-from="{esc(a)}" data-to="{esc(b)}" '
                   f'data-input="{esc(e["input"])}" d="{d}"{dash}/>')
    out.append("</g>")
    out.append('<g class="sg-nodes" text-anchor="middle" fill="#1f2328">')
    for n in nodes:
        box = boxes.get(n["id"])
        if box is None:
            continue
        x, y, bw, bh = box
        status = n["check"]["status"]
        stroke = STATUS_COLORS.get(status, STATUS_COLORS["none"])
        sw = 2.5 if status in ("fail", "pass") else 1.2
        if n["id"] == selected:
            sw = 3.5
        fill = "#ffebe9" if status == "fail" else _FILL.get(n["kind"], "#ffffff")
        dash = ' stroke-dasharray="5 3"' if n["kind"] == "none" else ""
        sel = ' data-selected="true"' if n["id"] == selected else ""
        if n["kind"] in ("chain", "module"):
            sel += f' data-members="{len(n["members"])}"'
        if n["kind"] == "module":
            sel += (f' data-paths="{esc(" ".join(n["paths"]))}" '
                    f'data-verdict="{esc(n["verdict"])}"')
        tip = [n["name"]] if n["kind"] != "module" else \
            [f"{', '.join(n['paths'])}: {n['name']}, {len(n['members'])} nodes, "
             + _VERDICT_WORDS.get(n["verdict"], "not checked")]
        if n.get("variable") and n["kind"] != "none":
            tip.append(f"variable: {n['variable']}")
        if n.get("shape") is not None:
            tip.append(f"shape: {n['shape']}")
        if n.get("dtype"):
            tip.append(f"dtype: {n['dtype']}")
        if n.get("formula"):
            tip.append(tex_to_text(n["formula"]))
        for s in n.get("saved") or ():  # what the node saved, as the Inspector lists it
            tip.append(_saved_line(s))
        if n.get("module"):
            tip.append(f"module: {n['module']}")
        if status != "none" and n["kind"] != "module":
            tip.append(f"local check: {status}")
        out.append(
            f'<g class="sg-node" '
            f'data-id="{esc(n["id"])}" data-kind="{esc(n["kind"])}" '
            f'data-status="{esc(status)}"{sel}>'
            f'<title>{esc(chr(10).join(tip))}</title>'
            f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(bw)}" height="{_n(bh)}" rx="6" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{sw}"{dash}/>')
        label, sub = static_texts(n)
        cx = _n(x + bw / 2)
        if sub:
            out.append(f'<text x="{cx}" y="{_n(y + bh / 2 - 3)}">{esc(label)}</text>'
                       f'<text x="{cx}" y="{_n(y + bh / 2 + 11)}" fill="#57606a" '
                       f'font-size="10">{esc(sub)}</text>')
        else:
            out.append(f'<text x="{cx}" y="{_n(y + bh / 2 + 4)}">{esc(label)}</text>')
        out.append("</g>")
    out.append("</g></svg>")
    return "".join(out)


def _saved_line(s: dict) -> str:
    """One saved operand for a node's hover text: ``saved x [3] = [1., 2., 3.]``."""
    shape = f" {s['shape']}" if s.get("shape") is not None and s.get("kind") != "scalar" else ""
    same = f" (same object as {s['same_object_as']})" if s.get("same_object_as") else ""
    freed = " (freed by backward)" if s.get("kind") == "freed" and shape else ""
    return (f"saved {s.get('attr', '_saved_' + s['name'])}{shape} = "
            f"{s.get('preview', '')}{same}{freed}")


def badge(status: str) -> str:
    """A coloured pass/fail pill (``data-status`` says which, for tests and CSS)."""
    color = STATUS_COLORS.get(status, STATUS_COLORS["none"])
    text = {"pass": "pass", "fail": "FAIL", "skipped": "skipped", "error": "error",
            "none": "not checked"}.get(status, status)
    return (f'<span class="sg-badge sg-badge-{esc(status)}" data-status="{esc(status)}" '
            f'style="display:inline-block;padding:0 6px;border-radius:8px;color:#fff;'
            f'background:{color};font-size:11px;line-height:16px">{esc(text)}</span>')


def _num(v: Any) -> str:
    """An error or tolerance: ``0.00012``, ``nan``, ``inf``; text from a hand-made payload
    is shown as it is (escaped)."""
    if v is None:
        return ""
    try:
        return f"{float(v):.3g}"
    except (TypeError, ValueError):
        return esc(v)


def _rel(row: dict) -> str:
    """The relative error cell: "exact 0" where the exact gradient is 0 (see
    symgrad.symbolic.report.rel_err_text)."""
    zeros = int(row.get("exact_zeros") or 0)
    rel = row.get("max_rel_err")
    if zeros and rel is None and row.get("max_abs_err") is not None:
        return "exact 0"
    text = _num(rel)
    return f"{text} (+{zeros} exact 0)" if zeros and rel is not None else text


def agreement_table_html(agreement: dict | None) -> str:
    """Per leaf: engine, symbolic, finite differences, max errors and a badge."""
    if not agreement:
        return '<div class="sg-agreement sg-empty">Not verified.</div>'
    rows = []
    for r in agreement.get("rows", []):
        rows.append(
            f'<tr class="sg-agreement-row" data-leaf="{esc(r["leaf"])}" '
            f'data-status="{esc(r["status"])}">'
            f'<td>{esc(r["leaf"])}</td><td>{esc(r.get("engine"))}</td>'
            f'<td>{esc(r.get("symbolic"))}</td><td>{esc(r.get("finite_diff"))}</td>'
            f'<td>{_num(r.get("max_abs_err"))}</td><td>{esc(_rel(r))}</td>'
            f'<td>{badge(r["status"])}</td></tr>')
    ok = agreement.get("ok")
    verdict = agreement.get("verdict") or \
        {True: "gradients agree", False: "gradients DISAGREE", None: "no verdict"}[ok]
    meta = []
    if agreement.get("mode"):
        meta.append(f"mode {agreement['mode']}")
    if agreement.get("rtol") is not None:
        meta.append(f"rtol {_num(agreement['rtol'])}")
    if agreement.get("atol") is not None:
        meta.append(f"atol {_num(agreement['atol'])}")
    msg = agreement.get("message")
    th = "".join(f"<th style='text-align:left;padding:2px 8px'>{h}</th>" for h in (
        "leaf", "engine .grad", "symbolic", "finite diff.", "max abs err", "max rel err", ""))
    return (f'<div class="sg-agreement" data-ok="{esc(ok)}">'
            f'<div><b>{esc(verdict)}</b> <small>{esc(", ".join(meta))}</small></div>'
            + (f'<div><small>{esc(msg)}</small></div>' if msg else "")
            + f'<table class="sg-agreement-table" style="border-collapse:collapse">'
              f'<thead><tr>{th}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>')


def render_html(payload: dict) -> str:
    """``text/html`` fallback: the SVG, and the agreement table when verified."""
    parts = ['<div class="symgrad-graph-output">', render_svg(payload)]
    if payload.get("truncated"):
        parts.append(f"<div><small>{esc(payload['truncated'])} more nodes not shown"
                     "</small></div>")
    if payload.get("formulas_omitted"):
        parts.append(f'<div class="sg-formulas-omitted"><small>'
                     f'{esc(payload["formulas_omitted"])} nodes shown without a formula '
                     "(graph too large to derive them all)</small></div>")
    if payload.get("agreement"):
        parts.append(agreement_table_html(payload["agreement"]))
    parts.append("</div>")
    return "".join(parts)
