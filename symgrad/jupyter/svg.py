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

from .layout import BOX_H, box_width, layout

__all__ = ["esc", "render_svg", "render_html", "agreement_table_html", "STATUS_COLORS"]

_ids = itertools.count()

STATUS_COLORS = {"pass": "#1a7f37", "fail": "#cf222e", "skipped": "#9a6700",
                 "error": "#8250df", "none": "#57606a"}
_FILL = {"op": "#eef2f8", "accumulate": "#ddf4ff", "leaf": "#ddf4ff", "none": "#f6f8fa",
         "chain": "#fff8c5"}


def esc(value: Any) -> str:
    """HTML-escape any value for text and attribute positions (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


def _sublabel(n: dict) -> str:
    shape = n.get("shape")
    shape_txt = "" if shape is None else ("()" if shape == [] else str(shape))
    if n["kind"] == "accumulate":
        return ("AccumulateGrad " + shape_txt).strip()
    if n["kind"] == "chain":
        return f"{len(n['members'])} ops"
    if n["kind"] == "none":
        return n.get("variable") or ""
    if n["kind"] == "op" and n.get("variable"):
        return f"{n['variable']} {shape_txt}".strip()
    return shape_txt


#: Above this many nodes, runs of ops are drawn as one box (as the labextension does).
AUTO_COLLAPSE_NODES = 150
#: Shortest run of ops that is collapsed.
MIN_RUN = 6
_STATUS_RANK = {"fail": 4, "error": 3, "pass": 2, "skipped": 1, "none": 0}


def _summarize_run(labels: list[str]) -> str:
    for p in range(1, min(4, len(labels) // 2) + 1):
        if all(lb == labels[i % p] for i, lb in enumerate(labels)):
            reps, rest = divmod(len(labels), p)
            unit = labels[0] if p == 1 else "(" + " \u2192 ".join(labels[:p]) + ")"
            return f"{unit} \u00d7 {reps}" + (f" + {rest}" if rest else "")
    return f"{labels[0]} \u2192 \u2026 \u2192 {labels[-1]}"


def find_chains(payload: dict, keep: set[str] | frozenset[str] = frozenset()) -> list[dict]:
    """Maximal runs of op nodes ``a -> b -> c`` where each consumes only the next op and
    is consumed only by the previous one (leaves and None may hang off any member).

    Loops (``x = x * w + b``) build them; they are what makes a 500-op graph unreadable
    and slow to draw. Roots, ``keep`` (the selection) and failing nodes break runs, like
    the labextension's ``findChains``. Each group: ``id``, ``members`` (ids), ``label``,
    ``status`` (the worst member check).
    """
    by_id = {n["id"]: n for n in payload["nodes"]}
    op_children: dict[str, set[str]] = {}
    parents: dict[str, set[str]] = {}
    for e in payload["edges"]:
        parents.setdefault(e["to"], set()).add(e["from"])
        if by_id.get(e["to"], {}).get("kind") == "op":
            op_children.setdefault(e["from"], set()).add(e["to"])
    roots = set(payload.get("roots") or [])

    def breaker(n: dict) -> bool:
        return (n["kind"] != "op" or n["id"] in keep or n["id"] in roots
                or n.get("first_bad") is True or n["check"]["status"] in ("fail", "error"))

    nxt: dict[str, str] = {}
    has_prev: set[str] = set()
    for n in payload["nodes"]:
        kids = op_children.get(n["id"])
        if breaker(n) or not kids or len(kids) != 1:
            continue
        b = next(iter(kids))
        if not breaker(by_id[b]) and len(parents.get(b, ())) == 1:
            nxt[n["id"]] = b
            has_prev.add(b)
    groups = []
    for n in payload["nodes"]:
        if n["id"] not in nxt or n["id"] in has_prev:
            continue
        members = [n["id"]]
        seen = {n["id"]}
        cur = n["id"]
        while cur in nxt and nxt[cur] not in seen:
            cur = nxt[cur]
            seen.add(cur)
            members.append(cur)
        if len(members) >= MIN_RUN:
            status = max((by_id[m]["check"]["status"] for m in members),
                         key=lambda st: _STATUS_RANK.get(st, 0))
            groups.append({"id": "chain:" + n["id"], "members": members, "status": status,
                           "label": _summarize_run([by_id[m]["label"] for m in members])})
    return groups


def _visible(payload: dict, selected: str | None) -> tuple[list[dict], list[dict]]:
    """Nodes and edges to draw: runs collapsed into chain boxes in big graphs, with the
    edges of their members merged (so a leaf shared by a whole loop gets one edge)."""
    nodes, edges = payload["nodes"], payload["edges"]
    if len(nodes) <= AUTO_COLLAPSE_NODES:
        return nodes, edges
    groups = find_chains(payload, {selected} if selected else set())
    if not groups:
        return nodes, edges
    owner = {m: g["id"] for g in groups for m in g["members"]}
    first = {g["members"][0]: g for g in groups}
    vis_nodes = []
    for n in nodes:
        g = first.get(n["id"])
        if g is not None:
            vis_nodes.append({"id": g["id"], "kind": "chain", "label": g["label"],
                              "name": g["label"], "members": g["members"],
                              "check": {"status": g["status"]}})
        elif n["id"] not in owner:
            vis_nodes.append(n)
    vis_edges: dict[tuple[str, str], dict] = {}
    for e in edges:
        a, b = owner.get(e["from"], e["from"]), owner.get(e["to"], e["to"])
        if a != b and (a, b) not in vis_edges:
            vis_edges[(a, b)] = {"from": a, "to": b,
                                 "input": e["input"] if a == e["from"] else ""}
    return vis_nodes, list(vis_edges.values())


def render_svg(payload: dict, selected: str | None = None) -> str:
    """The graph as one ``<svg>`` element (roots on top, leaves at the bottom).

    Graphs above ``AUTO_COLLAPSE_NODES`` nodes draw runs of ops as one chain box
    (``data-kind="chain"``, ``data-members``), keeping the selected node out of them.
    """
    nodes, vis_edges = _visible(payload, selected)
    payload = dict(payload, nodes=nodes, edges=vis_edges)
    widths = {n["id"]: box_width(n["label"], _sublabel(n)) for n in nodes}
    lay = layout([n["id"] for n in nodes], [(e["from"], e["to"]) for e in payload["edges"]],
                 widths)
    uid = f"sg{next(_ids)}"
    w, h = max(lay.width, 60.0), max(lay.height, BOX_H + 20)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="symgrad-graph" '
           f'data-symgrad="graph" width="{w:.0f}" height="{h:.0f}" '
           f'viewBox="0 0 {w:.0f} {h:.0f}" font-family="ui-monospace, Menlo, Consolas, '
           f'monospace" font-size="12" role="img">',
           f'<defs><marker id="{uid}-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
           f'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
           f'<path d="M 0 0 L 10 5 L 0 10 z" fill="#8c959f"/></marker></defs>']
    by_id = {n["id"]: n for n in nodes}
    # shared presentation attributes sit on the groups (SVG inherits them): a saved
    # notebook carries one SVG per graph output, so every repeated byte counts
    out.append(f'<g class="sg-edges" fill="none" stroke="#8c959f" stroke-width="1.3" '
               f'marker-end="url(#{uid}-arrow)">')
    inputs = {(e["from"], e["to"]): e["input"] for e in payload["edges"]}
    for a, b, pts in lay.edges:
        d = "M " + " L ".join(f"{px:.1f} {py:.1f}" for px, py in pts)
        dash = ' stroke-dasharray="4 3"' if by_id[b]["kind"] == "none" else ""
        out.append(f'<path class="sg-edge" data-from="{esc(a)}" data-to="{esc(b)}" '
                   f'data-input="{esc(inputs.get((a, b), ""))}" d="{d}"{dash}/>')
    out.append("</g>")
    out.append('<g class="sg-nodes" text-anchor="middle" fill="#1f2328">')
    for n in nodes:
        box = lay.boxes.get(n["id"])
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
        if n["kind"] == "chain":
            sel += f' data-members="{len(n["members"])}"'
        tip = [n["name"]]
        if n.get("variable") and n["kind"] != "none":
            tip.append(f"variable: {n['variable']}")
        if n.get("shape") is not None:
            tip.append(f"shape: {n['shape']}")
        if n.get("dtype"):
            tip.append(f"dtype: {n['dtype']}")
        if status != "none":
            tip.append(f"local check: {status}")
        out.append(
            f'<g class="sg-node sg-kind-{esc(n["kind"])} sg-status-{esc(status)}" '
            f'data-id="{esc(n["id"])}" data-kind="{esc(n["kind"])}" '
            f'data-status="{esc(status)}"{sel}>'
            f'<title>{esc(chr(10).join(tip))}</title>'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw:.1f}" height="{bh:.1f}" rx="6" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{sw}"{dash}/>')
        sub = _sublabel(n)
        cx = x + bw / 2
        if sub:
            out.append(f'<text x="{cx:.1f}" y="{y + 14:.1f}">{esc(n["label"])}</text>'
                       f'<text x="{cx:.1f}" y="{y + 27:.1f}" fill="#57606a" '
                       f'font-size="10">{esc(sub)}</text>')
        else:
            out.append(f'<text x="{cx:.1f}" y="{y + 21:.1f}">{esc(n["label"])}</text>')
        out.append("</g>")
    out.append("</g></svg>")
    return "".join(out)


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
            f'<td>{_num(r.get("max_abs_err"))}</td><td>{_num(r.get("max_rel_err"))}</td>'
            f'<td>{badge(r["status"])}</td></tr>')
    ok = agreement.get("ok")
    verdict = {True: "gradients agree", False: "gradients DISAGREE", None: "no verdict"}[ok]
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
    if payload.get("agreement"):
        parts.append(agreement_table_html(payload["agreement"]))
    parts.append("</div>")
    return "".join(parts)
