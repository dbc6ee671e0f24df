"""The session report page: one section per check, every string escaped."""

from __future__ import annotations

import html

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:2px 8px;font-family:monospace;text-align:left}
.ok{color:#fff;background:#2e7d32;padding:1px 6px;border-radius:3px}
.fail{color:#fff;background:#c62828;padding:1px 6px;border-radius:3px}
"""


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    if isinstance(v, (list, dict)):
        v = str(v)
        v = v if len(v) < 80 else v[:77] + "..."
    return html.escape(str(v))


def _table(rows: list[dict]) -> str:
    if not rows:
        return ""
    cols = [k for k in rows[0] if not isinstance(rows[0][k], (list, dict)) or k == "shape"]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def html_page(checks: list[dict]) -> str:
    failed = sum(not c["ok"] for c in checks)
    parts = [f"<!doctype html><meta charset=utf-8><title>symgrad gradient checks</title>"
             f"<style>{_STYLE}</style><h1>symgrad gradient checks</h1>"
             f"<p>{len(checks)} checks, {failed} failed</p>"]
    for c in checks:
        rep = c["report"]
        badge = '<span class="ok">ok</span>' if c["ok"] else '<span class="fail">FAILED</span>'
        parts.append(f"<h2>{badge} {html.escape(c['name'])}</h2>")
        parts.append(f"<p>mode: {html.escape(str(rep.get('mode')))}; first bad node: "
                     f"{html.escape(str(rep.get('first_bad_node')))}</p>")
        parts.append(_table(rep.get("leaves") or []))
        bad_nodes = [n for n in rep.get("nodes") or [] if n.get("status") not in ("ok", None)]
        parts.append(_table(bad_nodes))
    return "\n".join(parts)
