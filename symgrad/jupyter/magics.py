"""``%%symgrad`` and ``%symgrad``: see the graph a cell built, and whether it is right.

``%%symgrad [--no-verify] [--root NAME] [--rtol X] [--atol X] [--sample N] [--mode M]``
runs the cell as IPython would (same namespace, same result, errors raised as usual)
under ``symgrad.record()`` so the graph stays inspectable after ``backward()``, then
verifies the graph it built (unless ``--no-verify``) and shows:

* always, the graph MIME bundle as its own output (graph JSON + static SVG/HTML + a
  text outline: it survives in a saved notebook), carrying the verdicts once known;
* in a kernel with ipywidgets (the ``jupyter`` extra), the Inspector widget as a second
  output; it runs the verifier with a progress bar and Stop. The two outputs carry
  metadata (``{"symgrad": {"inspector": <model id>}}`` on the graph, ``{"symgrad":
  {"live": true}}`` on the Inspector) by which the labextension shows one picture: the
  Inspector hides its graph twin while it draws, and a saved notebook keeps only the
  graph (with its verdicts), which every front end can show;
* otherwise (core install, or terminal IPython) the verifier's report as a second output
  (report JSON + HTML table + text). In a kernel without ipywidgets, one line on stderr
  says so, once per session. Terminal IPython prints the text/plain parts: the graph as
  an indented grad_fn outline, the report as tables.

If the verifier raises (over its budget, a freed graph ...) the cell prints
``%%symgrad: verification failed: <Error>: <message>`` on stderr below the graph, and
the cell still succeeds. The cell's own result is returned, so ``Out[n]`` is what it
would have been.

Line forms: ``%symgrad graph EXPR [--collapse C] [--focus PATH]`` (the graph bundle;
``--collapse`` and ``--focus`` are ``sg.graph``'s ``collapse=`` and ``focus=``: C is
``true``, ``false``, a depth, or module paths joined by commas), ``%symgrad verify EXPR
[options]`` (returns the Report, displayed as the report bundle; a verifier error is a
one-line UsageError), ``%symgrad saved EXPR`` (every node's saved operands).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import re
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from ..nn.modules import keep_new_modules
from .graph import GraphView, Namer, _is_tensor, apply_report, graph_json, mimebundle
from .run import run_verify, verify_with_node_checks
from .svg import esc

__all__ = ["SymgradMagics", "register", "find_roots"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%symgrad", add_help=False, exit_on_error=False)
    p.add_argument("--no-verify", dest="verify", action="store_false")
    p.add_argument("--root", default=None)
    p.add_argument("--rtol", type=float, default=None)
    p.add_argument("--atol", type=float, default=None)
    p.add_argument("--sample", type=int, default=None)
    p.add_argument("--mode", default=None)
    # %symgrad graph only (sg.graph's collapse= and focus=)
    p.add_argument("--collapse", default=None)
    p.add_argument("--focus", default=None)
    return p


def _parse(line: str) -> argparse.Namespace:
    try:
        args, rest = _parser().parse_known_args(shlex.split(line))
    except (argparse.ArgumentError, ValueError) as exc:
        raise UsageError(f"%%symgrad: {exc}") from None
    if rest:
        raise UsageError(f"%%symgrad: unrecognized arguments: {' '.join(rest)}")
    return args


_OPTION = re.compile(r"\s--(rtol|atol|sample|mode|root|collapse|focus)(?:\s+|=)(\S+)"
                     r"|\s--(no-verify)\b")
#: the options that only ``%symgrad graph`` takes
_GRAPH_ONLY = ("collapse", "focus")

_USAGE = ("usage: %symgrad graph EXPR [--collapse true|false|DEPTH|PATH[,PATH...]] "
          "[--focus PATH] | %symgrad verify EXPR [--rtol X] [--atol X] [--sample N] "
          "[--mode M] | %symgrad saved EXPR | %%symgrad [--no-verify] [--root NAME] ... (cell)")


def collapse_value(text: str) -> Any:
    """``--collapse``'s text as ``sg.graph``'s ``collapse=``: ``true``/``false``, a depth
    (an integer; 1 = the top-level modules), or module paths joined by commas."""
    low = text.strip().lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if re.fullmatch(r"[+-]?\d+", low):
        return int(low)
    paths = [p.strip() for p in text.split(",") if p.strip()]
    if not paths:
        raise UsageError(f"%symgrad graph: --collapse {text!r}: give true, false, a depth "
                         "or module paths joined by commas")
    return paths[0] if len(paths) == 1 else paths


def _split_line_options(text: str) -> tuple[str, argparse.Namespace]:
    """``EXPR --rtol 1e-3`` -> (``EXPR``, options); options may appear anywhere."""
    opts = " ".join(m.group(0).strip() for m in _OPTION.finditer(" " + text))
    expr = _OPTION.sub(" ", " " + text).strip()
    return expr, _parse(opts)


def _record_context():
    try:
        from .. import record  # type: ignore[attr-defined]
    except ImportError:
        try:
            from ..symbolic import record  # type: ignore[attr-defined]
        except ImportError:
            return contextlib.nullcontext()
    return record()


def _reachable(fn: Any, stop: set[int]) -> set[int]:
    """ids of nodes reachable from ``fn`` (excluding fn itself)."""
    seen: set[int] = set()
    stack = [nf for nf, _ in getattr(fn, "next_functions", ()) or () if nf is not None]
    while stack:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        stack.extend(nf for nf, _ in getattr(cur, "next_functions", ()) or () if nf is not None)
    return seen


def find_roots(candidates: list[Any]) -> list[Any]:
    """Tensors with a graph whose grad_fn is not inside another candidate's graph."""
    with_graph = []
    seen_fn: set[int] = set()
    for t in candidates:
        fn = getattr(t, "grad_fn", None)
        if _is_tensor(t) and fn is not None and id(fn) not in seen_fn:
            seen_fn.add(id(fn))
            with_graph.append(t)
    below: set[int] = set()
    for t in with_graph:
        below |= _reachable(t.grad_fn, below)
    return [t for t in with_graph if id(t.grad_fn) not in below]


def _has_kernel(shell: Any) -> bool:
    """A Jupyter kernel (a front end that renders rich outputs and widgets, and updates
    an output in place), as opposed to terminal IPython, which prints text/plain."""
    return getattr(shell, "kernel", None) is not None


def _inspector_class(shell: Any) -> tuple[type | None, str | None]:
    """The Inspector widget class when this front end can show it, else ``(None, why)``.

    ``why`` is None in terminal IPython: no widget could show there, so nothing is missing.
    """
    if not _has_kernel(shell):
        return None, None
    try:
        from .widget import Inspector
    except ImportError as exc:
        missing = getattr(exc, "name", None)
        return None, (f"{missing} is not installed" if missing else
                      f"the Inspector cannot be imported ({_one_line(exc)})")
    return Inspector, None


#: Output metadata key of symgrad's two ``%%symgrad`` outputs (see :func:`live_metadata`).
META_KEY = "symgrad"


def live_metadata() -> dict:
    """Metadata of the Inspector's output: live only. The labextension leaves such outputs
    out of the notebook file it saves (the widget's model dies with the kernel; saved, its
    view would reopen as "model not found"), so the file keeps the static graph."""
    return {META_KEY: {"live": True}}


def twin_metadata(inspector: Any) -> dict:
    """Metadata of the graph output shown beside ``inspector``: its widget model id. The
    labextension hides this output while that Inspector draws the same graph live."""
    model_id = getattr(inspector, "model_id", None)
    return {META_KEY: {"inspector": model_id}} if model_id else {}


class _GraphOutput:
    """The graph bundle as one output. In a kernel it is shown at once and updated in
    place when the verdicts are in; a terminal cannot update an output, so there it is
    shown once, by :meth:`show`. ``metadata`` (the Inspector twin's id) goes with every
    update, as an update replaces the output's metadata too."""

    def __init__(self, payload: dict, live: bool, metadata: dict | None = None) -> None:
        self.shown = payload if live else None
        self.metadata = metadata or {}
        self.handle = display(mimebundle(payload), raw=True, display_id=True,
                              metadata=self.metadata) if live else None

    def show(self, payload: dict) -> None:
        if payload is self.shown:
            return
        if self.handle is not None:
            self.handle.update(mimebundle(payload), raw=True, metadata=self.metadata)
        else:
            display(mimebundle(payload), raw=True, metadata=self.metadata)
        self.shown = payload


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _user_names(ns: Mapping[str, Any]) -> dict[str, Any]:
    """The notebook's tensors and modules (modules name their parameters: ``fc1.weight``)."""
    from .._naming import is_module

    return {k: v for k, v in ns.items()
            if not k.startswith("_") and (_is_tensor(v) or is_module(v))}


@magics_class
class SymgradMagics(Magics):
    """The ``symgrad`` line and cell magic."""

    @line_cell_magic
    def symgrad(self, line: str, cell: str | None = None) -> Any:
        if cell is None:
            return self._line(line)
        return self._cell(line, cell)

    # -- %%symgrad ---------------------------------------------------------------------
    def _cell(self, line: str, cell: str) -> Any:
        args = _parse(line)
        for name in _GRAPH_ONLY:
            if getattr(args, name) is not None:
                raise UsageError(f"%%symgrad: --{name} is an option of %symgrad graph "
                                 "(or sg.graph(..., collapse=, focus=))")
        shell = self.shell
        ns = shell.user_ns
        before = {k: id(v) for k, v in ns.items()}
        code = shell.transform_cell(cell)
        tree = ast.parse(code, filename="<symgrad-cell>")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        filename = "<symgrad-cell>"
        cache = getattr(getattr(shell, "compile", None), "cache", None)
        if cache is not None:
            with contextlib.suppress(Exception):
                filename = cache(code, getattr(shell, "execution_count", 0))
        value = None
        # a model the cell makes and drops (Net()(x)) still names its parameters
        with _record_context(), keep_new_modules() as _made:
            exec(compile(ast.Module(body=tree.body, type_ignores=[]), filename, "exec"), ns)
            if last is not None:
                value = eval(compile(last, filename, "eval"), ns)
        suppress = cell.rstrip().endswith(";")

        if args.root is not None:
            try:
                root = eval(args.root, ns)
            except Exception as exc:
                raise UsageError(f"%%symgrad --root {args.root}: {exc}") from None
            roots = root if isinstance(root, (list, tuple)) else [root]
        elif _is_tensor(value) and getattr(value, "grad_fn", None) is not None:
            roots = [value]
        else:
            changed = [v for k, v in ns.items()
                       if not k.startswith("_") and _is_tensor(v) and before.get(k) != id(v)]
            roots = find_roots(changed)
        if not roots:
            display({"text/plain": "%%symgrad: the cell built no graph (no tensor with a "
                                   "grad_fn); use --root NAME to pick one."}, raw=True)
            return None if suppress else value

        names = _user_names(ns)
        root_arg = roots[0] if len(roots) == 1 else list(roots)
        node_map: dict[int, str] = {}
        # one naming for the graph, the Inspector and the verifier (symgrad._naming)
        namer = Namer(None, names)
        payload = graph_json(root_arg, namer, node_map=node_map)
        inspector_cls, why_not = _inspector_class(shell)
        if why_not is not None:
            self._notice(why_not, f"%%symgrad: {why_not}; showing the static graph"
                         + (" and report" if args.verify else "")
                         + " (pip install 'symgrad[jupyter]' for the Inspector)")
        if inspector_cls is not None:  # the widget verifies (progress bar, Stop)
            inspector = inspector_cls(root_arg, None, verify=False, rtol=args.rtol,
                                      atol=args.atol, sample=args.sample, mode=args.mode,
                                      namespace=names)
            # Two outputs, never one bundle (DESIGN.md): the graph, which the saved file
            # keeps, and the Inspector, live only; while the Inspector draws, the
            # labextension hides its twin, so the live view shows one graph.
            graph_out = _GraphOutput(payload, live=True, metadata=twin_metadata(inspector))
            display(inspector, metadata=live_metadata())
            if args.verify:
                inspector.verify(background=False)
                graph_out.show(inspector.graph)
            self.last_inspector = inspector
            return None if suppress else value
        graph_out = _GraphOutput(payload, live=_has_kernel(shell))
        report = error = None
        if args.verify:
            try:
                report, local = verify_with_node_checks(
                    roots[0], namer.leaf_names(), namespace=names, rtol=args.rtol,
                    atol=args.atol, sample=args.sample, mode=args.mode)
            except Exception as exc:  # noqa: BLE001 - one line below the graph, not a traceback
                error = f"%%symgrad: verification failed: {_one_line(exc)}"
            else:
                payload = copy.deepcopy(payload)
                apply_report(payload, report, node_map, local)
        graph_out.show(payload)
        if error is not None:
            print(error, file=sys.stderr)
        if report is not None:
            display(report)  # its own output: report JSON + HTML table + text
        self.last_report = report
        return None if suppress else value

    def _notice(self, key: str, text: str) -> None:
        """``text`` on stderr, once per IPython session (shell) for each ``key``."""
        shown = self.__dict__.setdefault("_notices", set())
        if key not in shown:
            shown.add(key)
            print(text, file=sys.stderr)

    # -- %symgrad graph|verify|saved EXPR ----------------------------------------------
    def _line(self, line: str) -> Any:
        parts = line.strip().split(None, 1)
        if not parts or parts[0] not in ("graph", "verify", "saved"):
            raise UsageError(_USAGE)
        command = parts[0]
        rest = parts[1] if len(parts) > 1 else ""
        expr, opts = _split_line_options(rest)
        if not expr:
            raise UsageError(f"%symgrad {command}: an expression is needed")
        if command != "graph":
            for name in _GRAPH_ONLY:
                if getattr(opts, name) is not None:
                    raise UsageError(f"%symgrad {command}: --{name} is an option of "
                                     "%symgrad graph")
        ns = self.shell.user_ns
        target = eval(expr, ns)
        names = _user_names(ns)
        if command == "graph":
            collapse = None if opts.collapse is None else collapse_value(opts.collapse)
            payload = graph_json(target, namespace=names)  # EXPR's errors raise as before
            try:
                return GraphView(payload=payload, focus=opts.focus, collapse=collapse)
            except ValueError as exc:  # an unknown module path: sg.graph's words, one line
                raise UsageError(f"%symgrad graph: {exc}") from None
        if command == "saved":
            return SavedView(graph_json(target, formulas=False, namespace=names))
        try:
            return run_verify(target, None, namespace=names, rtol=opts.rtol, atol=opts.atol,
                              sample=opts.sample, mode=opts.mode)
        except Exception as exc:  # noqa: BLE001 - one line (UsageError), not a traceback
            raise UsageError(f"%symgrad verify: {_one_line(exc)}") from None


class SavedView:
    """``%symgrad saved EXPR``: every op node's ``_saved_*`` operands, as a table."""

    def __init__(self, payload: dict) -> None:
        self.payload = payload

    def _rows(self):
        for n in sorted(self.payload["nodes"], key=lambda n: n.get("order", 0)):
            if n["kind"] != "op":
                continue
            for s in n["saved"] or [None]:
                yield n, s

    def _repr_html_(self) -> str:
        out = ["<table class='sg-saved-all' style='border-collapse:collapse'><thead><tr>"
               + "".join(f"<th style='text-align:left;padding:2px 8px'>{h}</th>" for h in
                         ("node", "saved", "shape", "dtype", "values", "same object as"))
               + "</tr></thead><tbody>"]
        for n, s in self._rows():
            node = n["label"] + (f" ({n['variable']})" if n.get("variable") else "")
            if s is None:
                out.append(f"<tr data-id='{esc(n['id'])}'><td>{esc(node)}</td>"
                           "<td colspan='5'><i>saves nothing</i></td></tr>")
                continue
            out.append(f"<tr class='sg-saved-row' data-id='{esc(n['id'])}' "
                       f"data-name='{esc(s['name'])}'>" + "".join(
                           f"<td style='padding:2px 8px'>{esc(v)}</td>" for v in (
                               node, s.get("attr"), s.get("shape", ""), s.get("dtype", ""),
                               s.get("preview", ""), s.get("same_object_as") or ""))
                       + "</tr>")
        out.append("</tbody></table>")
        return "".join(out)

    def __repr__(self) -> str:
        lines = []
        for n, s in self._rows():
            node = n["label"] + (f" ({n['variable']})" if n.get("variable") else "")
            if s is None:
                lines.append(f"{node}: saves nothing")
                continue
            same = f"  same object as {s['same_object_as']}" if s.get("same_object_as") else ""
            shape = f" {s['shape']}" if s.get("shape") is not None else ""
            freed = " (freed by backward)" if s["kind"] == "freed" and shape else ""
            lines.append(f"{node}.{s.get('attr')}{shape} = {s.get('preview', '')}{same}{freed}")
        return "\n".join(lines)


def register(ipython: Any) -> None:
    ipython.register_magics(SymgradMagics)
