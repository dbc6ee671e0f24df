"""The Inspector: an ipywidgets 8 view of a graph, its saved operands and its proof.

All state lives in synced traitlets (``graph``: the frozen graph JSON, ``selected``: a
node id, ``report``: the verifier's JSON, ``rtol``/``atol``, ``status``, ``progress``).
The graph is drawn by ``canvas``, the labextension's anywidget front end (pan, zoom,
click to select) bound to ``graph``/``selected``/``report``, when its bundle was built
and anywidget imports; otherwise by the static SVG in an HTML widget (``svg_view``,
always kept current). The other children (a node picker, the node panel, HTMLMath for
the LaTeX, the agreement table) work in any front end. Every string
from user code is HTML-escaped before it reaches an HTML widget.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ipywidgets as widgets
import traitlets

from .graph import apply_report, graph_json
from .run import VerificationInterrupted, run_verify
from .svg import agreement_table_html, badge, esc, render_svg

__all__ = ["Inspector", "VerificationInterrupted", "run_verify", "BUNDLE", "canvas_class"]

#: The labextension's drawing code as an ES module (built by esbuild; not committed).
BUNDLE = Path(__file__).with_name("static") / "inspector.js"
_CANVAS_CLASSES: dict[Path, type] = {}


def canvas_class() -> type | None:
    """The anywidget class drawing the interactive graph, or None where it cannot.

    None when the bundle was not built (a source checkout without ``jlpm``) or anywidget
    is not installed; the Inspector then shows its static SVG instead. The class is made
    on first use because anywidget reads ``_esm`` when the class is defined.
    """
    bundle = BUNDLE
    if not bundle.is_file():
        return None
    cls = _CANVAS_CLASSES.get(bundle)
    if cls is not None:
        return cls
    try:
        import anywidget
    except ImportError:
        return None

    class GraphCanvas(anywidget.AnyWidget):
        """The labextension's graph view; binds to ``graph``, ``selected`` and ``report``."""

        _esm = bundle
        graph = traitlets.Dict().tag(sync=True)
        selected = traitlets.Unicode("").tag(sync=True)
        report = traitlets.Dict().tag(sync=True)

    _CANVAS_CLASSES[bundle] = GraphCanvas
    return GraphCanvas


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


class Inspector(widgets.VBox):
    """Graph + node panel + agreement table for ``root`` (a symgrad or torch tensor).

    ``names`` maps variable names to objects (pass ``globals()`` or the notebook
    namespace) so leaves read ``c`` instead of ``t0``. With ``verify=True`` the verifier
    runs (in a background thread inside a live kernel, so the progress bar moves and Stop
    works; synchronously elsewhere). ``report`` reuses a Report already computed.
    """

    graph = traitlets.Dict().tag(sync=True)
    selected = traitlets.Unicode("").tag(sync=True)
    report = traitlets.Dict().tag(sync=True)
    rtol = traitlets.Float(None, allow_none=True).tag(sync=True)
    atol = traitlets.Float(None, allow_none=True).tag(sync=True)
    status = traitlets.Unicode("not verified").tag(sync=True)
    progress = traitlets.Float(0.0).tag(sync=True)

    def __init__(self, root: Any, names: Mapping[str, Any] | None = None,
                 verify: bool = True, *, report: Any = None, rtol: float | None = None,
                 atol: float | None = None, sample: int | None = None,
                 mode: str | None = None, timeout: float | None = None,
                 local_checks: bool = True, background: bool | None = None,
                 **kwargs: Any) -> None:
        self._root = root
        self._names = dict(names) if names is not None else None
        self._options = {"sample": sample, "mode": mode, "timeout": timeout}
        self._local_checks = local_checks
        self._report_obj = None
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._updating = False

        self.svg_view = widgets.HTML(layout=widgets.Layout(overflow="auto", max_height="480px"))
        self.node_picker = widgets.Dropdown(description="node", options=[],
                                            layout=widgets.Layout(width="auto"))
        self.node_panel = widgets.HTML()
        self.formula_view = widgets.HTMLMath()
        self.agreement_view = widgets.HTML()
        self.symbolic_view = widgets.HTMLMath()
        self.rtol_input = widgets.FloatText(description="rtol", step=1e-6,
                                            layout=widgets.Layout(width="180px"))
        self.atol_input = widgets.FloatText(description="atol", step=1e-6,
                                            layout=widgets.Layout(width="180px"))
        self.verify_button = widgets.Button(description="Verify", icon="check")
        self.stop_button = widgets.Button(description="Stop", icon="stop", disabled=True)
        self.progress_bar = widgets.FloatProgress(value=0.0, min=0.0, max=1.0,
                                                  description="verifying",
                                                  layout=widgets.Layout(visibility="hidden"))
        self.status_label = widgets.HTML()
        controls = widgets.HBox([self.rtol_input, self.atol_input, self.verify_button,
                                 self.stop_button, self.progress_bar, self.status_label])
        panel = widgets.VBox([self.node_picker, self.node_panel, self.formula_view])
        # the interactive canvas replaces the static SVG where the bundle exists; the SVG
        # is still kept current (it is cheap) so it can stand in for it
        canvas_cls = canvas_class()
        self.canvas = canvas_cls() if canvas_cls is not None else None
        graph_view = self.canvas if self.canvas is not None else self.svg_view
        super().__init__(children=[graph_view, panel, controls, self.agreement_view,
                                   self.symbolic_view],
                         **kwargs)
        self.add_class("symgrad-inspector")
        if self.canvas is not None:
            traitlets.dlink((self, "graph"), (self.canvas, "graph"))
            traitlets.dlink((self, "report"), (self.canvas, "report"))
            # a click in the browser sets the canvas's selection, which drives the panel
            traitlets.link((self, "selected"), (self.canvas, "selected"))

        self.rtol, self.atol = rtol, atol
        self._node_map: dict[int, str] = {}
        self._base_graph = graph_json(root, self._names, node_map=self._node_map)
        self.graph = self._base_graph
        self.node_picker.options = self._picker_options()
        self.node_picker.observe(self._on_picker, names="value")
        traitlets.dlink((self, "progress"), (self.progress_bar, "value"))
        self.rtol_input.observe(self._on_tolerance, names="value")
        self.atol_input.observe(self._on_tolerance, names="value")
        self.verify_button.on_click(lambda _b: self.verify(background=background))
        self.stop_button.on_click(lambda _b: self.stop())
        self.observe(self._on_selected, names="selected")
        self.observe(self._refresh_all, names=["graph", "report", "status"])

        if report is not None:
            self._set_report(report)
            self.status = "done"
        self.selected = self._default_selection()
        self._refresh_all()
        if verify and report is None:
            self.verify(background=background)

    # -- public helpers (also what the tests read) ------------------------------------
    def node(self, node_id: str | None = None) -> dict:
        """The JSON of a node (the selected one by default)."""
        nid = node_id or self.selected
        for n in self.graph.get("nodes", []):
            if n["id"] == nid:
                return n
        raise KeyError(nid)

    def find(self, label: str, nth: int = 0) -> str:
        """The id of the ``nth`` node whose label (grad_fn name or leaf name) is ``label``."""
        hits = [n["id"] for n in self.graph["nodes"] if n["label"] == label]
        return hits[nth]

    def badges(self) -> dict[str, str]:
        """Node id -> local check status (pass/fail/skipped/error/none)."""
        return {n["id"]: n["check"]["status"] for n in self.graph["nodes"]}

    def agreement_rows(self) -> list[dict]:
        return list((self.graph.get("agreement") or {}).get("rows", []))

    @property
    def report_object(self) -> Any:
        """The verifier's Report object behind ``report`` (None before verification)."""
        return self._report_obj

    def close(self) -> None:
        """Close the Inspector and every child widget (they hold the frozen graph)."""
        self.stop()
        if self.canvas is not None:
            self.canvas.close()
        for w in (self.svg_view, self.node_picker, self.node_panel, self.formula_view,
                  self.agreement_view, self.symbolic_view, self.rtol_input, self.atol_input,
                  self.verify_button, self.stop_button, self.progress_bar, self.status_label,
                  *self.children):
            w.close()
        super().close()

    # -- verification -------------------------------------------------------------------
    def verify(self, background: bool | None = None) -> None:
        """Run the verifier; in the background inside a kernel unless told otherwise."""
        if self._thread is not None and self._thread.is_alive():
            return
        if background is None:
            background = _in_kernel()
        self._cancel.clear()
        self.status = "verifying"
        self.progress = 0.0
        self.progress_bar.layout.visibility = "visible"
        self.stop_button.disabled = False
        self.verify_button.disabled = True
        if background:
            self._thread = threading.Thread(target=self._verify_body, daemon=True,
                                            name="symgrad-verify")
            self._thread.start()
        else:
            self._verify_body()

    def wait(self, timeout: float | None = None) -> None:
        """Block until a background verification finished."""
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self) -> None:
        """Stop a running background verification (the Stop button)."""
        self._cancel.set()
        thread = self._thread
        if thread is not None and thread.is_alive() and thread.ident is not None:
            import ctypes

            # raise VerificationInterrupted inside the verifier's thread at its next
            # bytecode (SymPy is pure Python, so this lands promptly)
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(VerificationInterrupted))


    def _verify_body(self) -> None:
        try:
            progress = _Progress(self)
            progress(0.05, 1.0)
            roots = self._root if isinstance(self._root, (list, tuple)) else [self._root]
            report = run_verify(roots[0], self._names, progress=progress, rtol=self.rtol,
                                atol=self.atol, **self._options)
            progress(0.6, 1.0)
            local = None
            if self._local_checks and report.nodes and \
                    all(r.status == "not run" for r in report.nodes):
                # every leaf agreed, so the verifier skipped per-node checks; the node
                # panel wants them, and for a graph within the exact budget they are cheap
                options = dict(self._options, mode="local")
                local = run_verify(roots[0], self._names, rtol=self.rtol, atol=self.atol,
                                   **options)
            progress(0.9, 1.0)
            self._set_report(report, local)
        except (KeyboardInterrupt, VerificationInterrupted):
            self.status = "interrupted"
        except Exception as exc:  # noqa: BLE001 - shown in the widget, not lost in a thread
            self._error = f"{type(exc).__name__}: {exc}"
            self.status = "error"
        else:
            self.progress = 1.0
            self.status = "done"
        finally:
            self.progress_bar.layout.visibility = "hidden"
            self.stop_button.disabled = True
            self.verify_button.disabled = False

    def _set_report(self, report: Any, local: Any = None) -> None:
        import copy

        self._report_obj = report if not isinstance(report, Mapping) else None
        data = report.to_json() if hasattr(report, "to_json") else dict(report)
        payload = copy.deepcopy(self._base_graph)
        apply_report(payload, report, self._node_map, local)
        _add_symbolic_latex(payload, report)
        agreement = payload.get("agreement") or {}
        self._updating = True
        try:
            if self.rtol is None and agreement.get("rtol") is not None:
                self.rtol = agreement["rtol"]
            if self.atol is None and agreement.get("atol") is not None:
                self.atol = agreement["atol"]
            self.graph = payload
            self.report = data
        finally:
            self._updating = False
        if self.selected not in {n["id"] for n in payload["nodes"]} or (
                agreement.get("first_bad_node") and self.selected == self._first_root()):
            self.selected = self._default_selection()

    def _on_tolerance(self, change: dict) -> None:
        if self._updating or self.status == "verifying":
            return
        new_rtol = self.rtol_input.value
        new_atol = self.atol_input.value
        if (new_rtol, new_atol) == (self.rtol, self.atol):
            return
        self.rtol, self.atol = new_rtol, new_atol
        if self.status in ("done", "error", "interrupted"):
            self.verify()

    # -- rendering ----------------------------------------------------------------------
    def _first_root(self) -> str:
        roots = self.graph.get("roots") or []
        return roots[0] if roots else ""

    def _default_selection(self) -> str:
        fb = (self.graph.get("agreement") or {}).get("first_bad_node")
        return fb or self._first_root() or (self.graph["nodes"][0]["id"]
                                             if self.graph.get("nodes") else "")

    def _picker_options(self) -> list[tuple[str, str]]:
        opts = []
        for n in sorted(self.graph.get("nodes", []), key=lambda n: n.get("order", 0)):
            text = n["label"]
            if n["kind"] == "accumulate":
                text = f"AccumulateGrad ({n['label']})"
            elif n["kind"] == "op" and n.get("variable"):
                text = f"{n['label']} ({n['variable']})"
            elif n["kind"] == "none" and n.get("variable"):
                text = f"None ({n['variable']})"
            opts.append((f"{n['id']}: {text}", n["id"]))
        return opts

    def _on_picker(self, change: dict) -> None:
        if change["new"] and change["new"] != self.selected:
            self.selected = change["new"]

    def _on_selected(self, change: dict) -> None:
        if self.node_picker.value != self.selected and \
                any(v == self.selected for _t, v in self.node_picker.options):
            self.node_picker.value = self.selected
        self._refresh_node()
        self.svg_view.value = render_svg(self.graph, self.selected)

    def _refresh_all(self, change: dict | None = None) -> None:
        if change is not None and change.get("name") == "graph":
            self.node_picker.options = self._picker_options()
            if any(v == self.selected for _t, v in self.node_picker.options):
                self.node_picker.value = self.selected
        self.svg_view.value = render_svg(self.graph, self.selected)
        self._refresh_node()
        self.agreement_view.value = agreement_table_html(self.graph.get("agreement"))
        self.symbolic_view.value = "".join(
            f"<div class='sg-symbolic' data-leaf='{esc(r['leaf'])}'>"
            f"$${html.escape(r['symbolic_latex'], quote=False)}$$</div>"
            for r in self.agreement_rows() if r.get("symbolic_latex"))
        self._updating = True
        try:
            if self.rtol is not None:
                self.rtol_input.value = self.rtol
            if self.atol is not None:
                self.atol_input.value = self.atol
        finally:
            self._updating = False
        text = {"not verified": "not verified", "verifying": "verifying…",
                "interrupted": "verification interrupted", "done": "verified",
                "error": "verification failed: " + getattr(self, "_error", "")}
        ok = (self.graph.get("agreement") or {}).get("ok")
        label = text.get(self.status, self.status)
        if self.status == "done":
            label = badge("pass" if ok else "fail" if ok is False else "none") + " " + \
                ("gradients agree" if ok else "gradients disagree" if ok is False
                 else "no verdict")
            self.status_label.value = label
        else:
            self.status_label.value = esc(label)

    def _refresh_node(self) -> None:
        try:
            n = self.node()
        except KeyError:
            self.node_panel.value = ""
            self.formula_view.value = ""
            return
        self.node_panel.value = node_panel_html(n, self.graph)
        self.formula_view.value = formula_html(n)


def _cell(v: Any) -> str:
    return f"<td style='padding:2px 8px'>{esc(v)}</td>"


def node_panel_html(n: dict, payload: dict) -> str:
    """The selected node: what it is, its check, and one row per saved operand."""
    status = n["check"]["status"]
    shape = n.get("shape")
    head = (f'<div class="sg-node-panel" data-id="{esc(n["id"])}" data-kind="{esc(n["kind"])}">'
            f'<b>{esc(n["name"] if n["kind"] != "accumulate" else "AccumulateGrad")}</b>')
    if n["kind"] in ("accumulate", "leaf"):
        head += f' for leaf <code>{esc(n["label"])}</code>'
    elif n.get("variable") and n["kind"] == "op":
        head += f' &rarr; <code>{esc(n["variable"])}</code>'
    elif n["kind"] == "none":
        head += " (an input that needs no gradient"
        head += f": <code>{esc(n['variable'])}</code>)" if n.get("variable") else ")"
    if shape is not None:
        head += f" &middot; shape {esc(shape)}"
    if n.get("dtype"):
        head += f" &middot; {esc(n['dtype'])}"
    head += f' &middot; local check {badge(status)}'
    msg = n["check"].get("message")
    if msg:
        head += f"<div><small>{esc(msg)}</small></div>"
    err = [f"{k.replace('_', ' ')} {n['check'][k]:.3g}" for k in ("max_abs_err", "max_rel_err")
           if n["check"].get(k) is not None]
    if err:
        head += f"<div><small>{esc(', '.join(err))}</small></div>"
    body = ""
    if n["saved"]:
        rows = []
        for s in n["saved"]:
            same = s.get("same_object_as")
            same_html = f"same object as <code>{esc(same)}</code>" if same else (
                "this node's output" if s.get("is_output") else "")
            rows.append(f'<tr class="sg-saved-row" data-name="{esc(s["name"])}" '
                        f'data-kind="{esc(s["kind"])}">'
                        + _cell(s.get("attr", "_saved_" + s["name"])) + _cell(s["kind"])
                        + _cell(s.get("shape", "")) + _cell(s.get("dtype", ""))
                        + _cell(s.get("preview", ""))
                        + f"<td style='padding:2px 8px'>{same_html}</td></tr>")
        th = "".join(f"<th style='text-align:left;padding:2px 8px'>{h}</th>" for h in
                     ("saved", "kind", "shape", "dtype", "values", ""))
        body = (f'<table class="sg-saved" style="border-collapse:collapse"><thead><tr>{th}'
                f'</tr></thead><tbody>{"".join(rows)}</tbody></table>')
    elif n["kind"] == "op":
        body = "<div><small>saves nothing</small></div>"
    elif n["kind"] in ("accumulate", "leaf"):
        leaf = next((lf for lf in payload.get("leaves", []) if lf["id"] == n["id"]), None)
        if leaf is not None:
            body = (f"<div>value <code>{esc(leaf.get('preview'))}</code>"
                    + (f" &middot; .grad <code>{esc(leaf.get('grad_preview'))}</code>"
                       if leaf.get("grad_preview") else "") + "</div>")
    return head + body + "</div>"


def formula_html(n: dict) -> str:
    """Formula and local derivative for HTMLMath; the LaTeX is HTML-escaped as text."""
    parts = []
    if n.get("formula"):
        parts.append(f"<div class='sg-formula'>$${html.escape(n['formula'], quote=False)}$$"
                     "</div>")
    if n.get("derivative"):
        parts.append(f"<div class='sg-derivative'>$${html.escape(n['derivative'], quote=False)}"
                     "$$</div>")
    return "".join(parts)


class _Progress:
    """A progress sink the verifier can call (``p(done, total)``) or use like tqdm
    (``p.total = n``, ``p.update(k)``); every step checks the Stop flag."""

    def __init__(self, inspector: Inspector) -> None:
        self._insp = inspector
        self.total: float | None = None
        self.n = 0.0

    def __call__(self, done: float, total: float | None = None, *_a: Any, **_k: Any) -> None:
        if total is not None:
            self.total = total
        self.n = float(done)
        self._report()

    def update(self, k: float = 1) -> None:
        self.n += k
        self._report()

    def reset(self, total: float | None = None) -> None:
        self.n = 0.0
        self.total = total
        self._report()

    def set_description(self, *_a: Any, **_k: Any) -> None:
        pass

    def set_postfix_str(self, *_a: Any, **_k: Any) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _report(self) -> None:
        insp = self._insp
        if insp._cancel.is_set():
            raise VerificationInterrupted("verification stopped by the user")
        frac = self.n / self.total if self.total else min(0.95, 1 - 1 / (1 + self.n / 8))
        insp.progress = max(0.0, min(1.0, frac))


def _add_symbolic_latex(payload: dict, report: Any, max_ops: int = 400) -> None:
    """The symbolic gradient of each small leaf as LaTeX (exact mode, small graphs only)."""
    grad_of = getattr(report, "symbolic_gradient", None)
    agreement = payload.get("agreement") or {}
    if grad_of is None or agreement.get("mode") != "exact" or \
            getattr(report, "cost", max_ops + 1) > max_ops:
        return
    try:
        import sympy
    except ImportError:  # pragma: no cover
        return
    from .graph import latex_name

    root = (payload.get("root_names") or ["L"])[0]
    root = "L" if root == "root" else root
    for row in agreement.get("rows", []):
        leaf = next((lf for lf in payload["leaves"] if lf["name"] == row["leaf"]), None)
        if leaf is None or row["status"] == "none" or len(leaf.get("shape") or []) > 0:
            continue
        try:
            expr = grad_of(row["leaf"])
            sym = report._ensure_sym()
            body = sympy.latex(expr, symbol_names=getattr(sym, "tex_map", None) or {})
        except Exception:  # noqa: BLE001 - a nicety; the numbers are what is checked
            continue
        row["symbolic_latex"] = (rf"\frac{{\partial {latex_name(root)}}}"
                                 rf"{{\partial {latex_name(row['leaf'])}}} = {body}")
