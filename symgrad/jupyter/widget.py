"""The Inspector: an interactive view of a graph, its saved operands and its proof.

One anywidget model per Inspector, kept small because notebooks save the state of every
widget (nbclient does, and JupyterLab when asked): the synced traits are the selection
(``selected``), the tolerances (``rtol``/``atol``) and the verification state (``status``,
``progress``, ``message``). The graph and the verifier's report (``graph``, ``report``:
plain traitlets, not synced) reach the front end as custom comm messages, which saved
widget state never records; a notebook keeps the graph once, in the ``%%symgrad`` graph
output beside the Inspector.

The front end (``_esm``) is inspector_stub.js, a loader of about 600 bytes. In
JupyterLab 4 and Notebook 7 it hands the view to the symgrad labextension, loaded once
per page, which registers ``globalThis[Symbol.for("symgrad.inspector.v1")]``: the
interactive graph (pan, zoom, click to select), node panel, agreement table, tolerance
inputs, Verify and Stop, and a progress bar. Where the extension is absent (VS Code, a
server without symgrad) the stub asks the kernel for inspector_static.js, which shows
:meth:`Inspector.static_html` as the kernel renders it: the static SVG (click a node to
select it), node panel, agreement table and the same controls. Every string from user
code is HTML-escaped before it reaches that HTML.

Messages, front end to kernel: ``{"type": "request"}`` (answered by ``{"type": "graph",
"graph", "report", "model_id"}``, sent again whenever they change), ``{"type":
"request-static-module"}`` (answered by ``{"type": "static-module", "code"}``),
``{"type": "request-static"}`` (answered by ``{"type": "static", "html"}``, sent again
on every change), ``{"type": "verify"}`` and ``{"type": "stop"}``. Selection and
tolerances are trait changes.
"""

from __future__ import annotations

import html
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ipywidgets as widgets  # first: on a core install the ImportError names it

# isort: split
import anywidget
import traitlets

from .graph import Namer, _check_names, apply_report, graph_json, with_layout
from .run import VerificationInterrupted, run_verify
from .svg import agreement_table_html, badge, esc, render_svg

__all__ = ["Inspector", "VerificationInterrupted", "run_verify", "STUB", "STATIC_VIEW",
           "API_KEY"]

#: The Inspector's anywidget front end (``_esm``): a loader saved with every Inspector.
STUB = Path(__file__).with_name("inspector_stub.js")
#: The view where the labextension is absent, sent by the kernel when the stub asks.
STATIC_VIEW = Path(__file__).with_name("inspector_static.js")


def _compact_js(source: str) -> str:
    """``source`` less its comment lines and indentation: every saved Inspector holds a
    copy. Enough for the stub, which has no multi-line string or template literal."""
    lines = (ln.strip() for ln in source.splitlines())
    return "\n".join(ln for ln in lines if ln and not ln.startswith("//"))


#: ``Symbol.for(API_KEY)`` on the page's global object is the labextension's view.
API_KEY = "symgrad.inspector.v1"


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def _default_selection(payload: Mapping[str, Any]) -> str:
    """The first bad node when there is one, else the first root, else the first node."""
    fb = (payload.get("agreement") or {}).get("first_bad_node")
    roots = payload.get("roots") or []
    nodes = payload.get("nodes") or []
    return fb or (roots[0] if roots else "") or (nodes[0]["id"] if nodes else "")


_STATUS_TEXT = {"not verified": "not verified", "verifying": "verifying\u2026",
                "interrupted": "verification interrupted", "done": "verified",
                "error": "verification failed"}


class Inspector(anywidget.AnyWidget):
    """Graph + node panel + agreement table for ``root`` (a symgrad or torch tensor).

    ``names`` maps variable names to objects (pass ``globals()`` or the notebook
    namespace) so leaves read ``c`` instead of ``t0``. With ``verify=True`` the verifier
    runs (in a background thread inside a live kernel, so the progress bar moves and Stop
    works; synchronously elsewhere). ``report`` reuses a Report already computed. Setting
    ``rtol`` or ``atol`` (the front end's inputs do) verifies again once it has run.
    """

    _esm = _compact_js(STUB.read_text(encoding="utf-8"))
    selected = traitlets.Unicode("").tag(sync=True)
    rtol = traitlets.Float(None, allow_none=True).tag(sync=True)
    atol = traitlets.Float(None, allow_none=True).tag(sync=True)
    status = traitlets.Unicode("not verified").tag(sync=True)
    progress = traitlets.Float(0.0).tag(sync=True)
    #: Why the last verification failed (``status == "error"``).
    message = traitlets.Unicode("").tag(sync=True)
    # Not synced: sent as messages (see the module docstring), so never in saved state.
    graph = traitlets.Dict()
    report = traitlets.Dict()
    # No Layout model per Inspector (each would add a kilobyte to a saved notebook); the
    # front end sizes the view itself. Assign a widgets.Layout to style it as usual.
    layout = traitlets.Instance(widgets.Layout, allow_none=True).tag(
        sync=True, **widgets.widget_serialization)

    def __init__(self, root: Any, names: Mapping[str, Any] | None = None,
                 verify: bool = True, *, report: Any = None, rtol: float | None = None,
                 atol: float | None = None, sample: int | None = None,
                 mode: str | None = None, timeout: float | None = None,
                 local_checks: bool = True, background: bool | None = None,
                 namespace: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        _check_names(names)  # before any state: a bad call leaves nothing half-made
        if names is None and namespace is None:
            from .._naming import caller_namespace

            namespace = caller_namespace()
        self._root = root
        self._namespace = namespace
        namer = Namer(dict(names) if names is not None else None, namespace)
        self._options = {"sample": sample, "mode": mode, "timeout": timeout}
        self._local_checks = local_checks
        self._background = background
        self._report_obj = None
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._updating = False
        self._static_views = False  # a front end without the labextension asked for HTML
        self._node_map: dict[int, str] = {}
        self._base_graph = graph_json(root, namer, node_map=self._node_map)
        # the verifier gets the graph's own leaf names: its rows and the graph's leaves
        # carry one name (and rows are tied to leaves by identity, see apply_report)
        self._names = namer.leaf_names()
        super().__init__(graph=self._base_graph, rtol=rtol, atol=atol,
                         selected=_default_selection(self._base_graph), **kwargs)
        self.on_msg(self._on_front_end_msg)
        self.observe(self._on_data, names=["graph", "report"])
        self.observe(self._on_tolerance, names=["rtol", "atol"])
        self.observe(self._on_view_state, names=["selected", "status", "message"])
        if report is not None:
            self._set_report(report)
            self.status = "done"
        if verify and report is None:
            self.verify(background=background)

    def __repr__(self) -> str:
        ops = sum(n["kind"] == "op" for n in self.graph.get("nodes", []))
        return (f"symgrad Inspector: {ops} op nodes, {len(self.graph.get('leaves', []))} "
                "leaves (a live widget: run the cell to use it)")

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

    def static_parts(self) -> dict[str, str]:
        """The static view's parts as HTML: ``svg`` (the graph, selection marked),
        ``panel`` (the selected node), ``formula`` (its LaTeX, for MathJax), ``agreement``
        (one row per leaf), ``symbolic`` (LaTeX gradients) and ``status``."""
        try:
            n = self.node()
        except KeyError:
            panel = formula = ""
        else:
            panel, formula = node_panel_html(n, self.graph), formula_html(n)
        symbolic = "".join(
            f"<div class='sg-symbolic' data-leaf='{esc(r['leaf'])}'>"
            f"$${html.escape(r['symbolic_latex'], quote=False)}$$</div>"
            for r in self.agreement_rows() if r.get("symbolic_latex"))
        return {"svg": render_svg(self.graph, self.selected), "panel": panel,
                "formula": formula, "agreement": agreement_table_html(self.graph.get("agreement")),
                "symbolic": symbolic, "status": self._status_html()}

    def static_html(self) -> str:
        """What a front end without the labextension shows: status and controls, the SVG,
        the node panel and the agreement table. Controls carry ``data-sg-action``
        (``verify``, ``stop``) or ``data-sg-trait`` (``rtol``, ``atol``) for the stub."""
        p = self.static_parts()
        busy = self.status == "verifying"

        def number(name: str) -> str:
            value = getattr(self, name)
            return (f'<label style="margin-right:8px">{name} <input data-sg-trait="{name}" '
                    f'type="number" step="any" min="0" style="width:7em" '
                    f'value="{"" if value is None else esc(repr(value))}"></label>')

        controls = (f'<div class="sg-controls" style="margin:4px 0">{number("rtol")}'
                    f'{number("atol")}<button data-sg-action="verify"'
                    f'{" disabled" if busy else ""}>Verify</button> '
                    f'<button data-sg-action="stop"{"" if busy else " disabled"}>Stop</button> '
                    f'{p["status"]}</div>')
        return ('<div class="symgrad-inspector-static">' + controls
                + '<div style="overflow:auto;max-height:480px">' + p["svg"] + "</div>"
                + p["panel"] + p["formula"] + p["agreement"] + p["symbolic"] + "</div>")

    def close(self) -> None:
        """Stop a running verification and close the widget's comm."""
        if hasattr(self, "_cancel"):  # a constructor that raised made no verification
            self.stop()
        super().close()

    # -- verification -------------------------------------------------------------------
    def verify(self, background: bool | None = None) -> None:
        """Run the verifier; in the background inside a kernel unless told otherwise."""
        if self._thread is not None and self._thread.is_alive():
            return
        if background is None:
            background = _in_kernel()
        self._cancel.clear()
        self.message = ""
        self.progress = 0.0
        self.status = "verifying"
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
            report = run_verify(roots[0], self._names, progress=progress,
                                namespace=self._namespace, rtol=self.rtol,
                                atol=self.atol, **self._options)
            progress(0.6, 1.0)
            local = None
            if self._local_checks and report.nodes and \
                    all(r.status == "not run" for r in report.nodes):
                # every leaf agreed, so the verifier skipped per-node checks; the node
                # panel wants them, and for a graph within the exact budget they are cheap
                options = dict(self._options, mode="local")
                local = run_verify(roots[0], self._names, namespace=self._namespace,
                                   rtol=self.rtol, atol=self.atol,
                                   **options)
            progress(0.9, 1.0)
            self._set_report(report, local)
        except (KeyboardInterrupt, VerificationInterrupted):
            self.status = "interrupted"
        except Exception as exc:  # noqa: BLE001 - shown in the widget, not lost in a thread
            self.message = f"{type(exc).__name__}: {exc}"
            self.status = "error"
        else:
            self.progress = 1.0
            self.status = "done"

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
            if self.selected not in {n["id"] for n in payload["nodes"]} or (
                    agreement.get("first_bad_node") and self.selected == self._first_root()):
                self.selected = _default_selection(payload)
        finally:
            self._updating = False
        self._push_graph()
        self._push_static()

    # -- the front end ------------------------------------------------------------------
    def _push_graph(self) -> None:
        # with the layout the static SVG uses (the view keeps the selection out of chains)
        # model_id: the labextension hides the graph output of the same id (the
        # ``%%symgrad`` twin) while this view draws it.
        self.send({"type": "graph", "graph": with_layout(self.graph, self.selected or None),
                   "report": self.report or None, "model_id": self.model_id})

    def _push_static(self) -> None:
        if self._static_views:
            self.send({"type": "static", "html": self.static_html()})

    def _on_front_end_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == "request":
            self._push_graph()
        elif kind == "request-static-module":
            self.send({"type": "static-module",
                       "code": STATIC_VIEW.read_text(encoding="utf-8")})
        elif kind == "request-static":
            self._static_views = True
            self._push_static()
        elif kind == "verify":
            self.verify(background=self._background)
        elif kind == "stop":
            self.stop()

    def _on_data(self, _change: dict) -> None:
        if not self._updating:
            self._push_graph()
            self._push_static()

    def _on_view_state(self, _change: dict) -> None:
        if not self._updating:
            self._push_static()

    def _on_tolerance(self, _change: dict) -> None:
        if self._updating or self.status == "verifying":
            return
        if self.status in ("done", "error", "interrupted"):
            self.verify(background=self._background)
        else:
            self._push_static()

    def _first_root(self) -> str:
        roots = self.graph.get("roots") or []
        return roots[0] if roots else ""

    def _status_html(self) -> str:
        if self.status == "done":
            ok = (self.graph.get("agreement") or {}).get("ok")
            verdict = (self.graph.get("agreement") or {}).get("verdict")
            if verdict:  # ok a bool too: agreement at the recorded values, said so
                return badge("pass" if ok else "fail" if ok is False else "error") + " " \
                    + esc(verdict)
            return (badge("pass" if ok else "fail" if ok is False else "none") + " "
                    + ("gradients agree" if ok else "gradients disagree" if ok is False
                       else "no verdict"))
        text = _STATUS_TEXT.get(self.status, self.status)
        if self.status == "error" and self.message:
            text += ": " + self.message
        return f'<span class="sg-status">{esc(text)}</span>'


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
        leaf = next((lf for lf in payload["leaves"] if lf["id"] == row["node"]), None)
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
