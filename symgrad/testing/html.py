"""The session report page: one section per check, every string escaped.

Each check's report is drawn by ``symgrad.symbolic.report.render_html`` from its JSON, so
the page, ``Report._repr_html_`` and the text report use the same names and columns.
"""

from __future__ import annotations

import html

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1em}
td,th{border:1px solid #ccc;padding:2px 8px;font-family:monospace;text-align:left;
vertical-align:top}
th{background:#f4f4f4}
.symgrad-legend{color:#555;max-width:60em}
.ok{color:#fff;background:#2e7d32;padding:1px 6px;border-radius:3px}
.fail{color:#fff;background:#c62828;padding:1px 6px;border-radius:3px}
"""


def html_page(checks: list[dict]) -> str:
    from ..symbolic.report import render_html

    failed = sum(not c["ok"] for c in checks)
    parts = [f"<!doctype html><meta charset=utf-8><title>symgrad gradient checks</title>"
             f"<style>{_STYLE}</style><h1>symgrad gradient checks</h1>"
             f"<p>{len(checks)} checks, {failed} failed</p>"]
    for c in checks:
        rep = c["report"]
        badge = '<span class="ok">ok</span>' if c["ok"] else '<span class="fail">FAILED</span>'
        parts.append(f"<h2>{badge} {html.escape(c['name'])}</h2>")
        parts.append(render_html(rep))
    return "\n".join(parts)
