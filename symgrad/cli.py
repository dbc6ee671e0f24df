"""The ``symgrad`` command (also ``python -m symgrad``).

``symgrad check PATH_OR_MODULE[:FUNC] [-k EXPR] [--json OUT] [--html OUT] [--mode M]
[--workers N] [-v]`` verifies every function decorated with
``@symgrad.testing.gradient_check`` and exits 0 when all agree, 1 when any gradient is
wrong, 2 on a usage error (bad path, nothing found, ``--workers`` not an integer >= 1).
``--workers N`` runs each check's per-node checks in N processes (the same reports).
A failing check prints a summary that names the first bad node (grad_fn and position from
the root) and the leaves (parameter paths, argument names); ``-v`` prints full reports.
``symgrad verify-rules`` runs the rule audit over every registered op.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import pathlib
import re
import sys
from collections.abc import Iterator

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def _load_file(path: pathlib.Path):
    name = "symgrad_check_" + re.sub(r"\W", "_", str(path.resolve()))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def _modules(target: str) -> Iterator:
    path = pathlib.Path(target)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
        if not files:
            raise UsageError(f"no Python files under {target}")
        for f in files:
            yield _load_file(f)
    elif path.suffix == ".py":
        if not path.exists():
            raise UsageError(f"file not found: {target}")
        yield _load_file(path)
    elif path.exists():
        raise UsageError(f"{target} is neither a directory nor a .py file")
    elif _looks_like_path(target):  # nope/, ./checks, dir/file: not a module name
        raise UsageError(f"no such file or directory: {target}")
    else:
        try:
            yield importlib.import_module(target)
        except ModuleNotFoundError as exc:
            if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
                raise UsageError(f"no such file, directory or module: {target}") from None
            raise UsageError(f"cannot import module {target!r}: {exc}") from None
        except ImportError as exc:
            raise UsageError(f"cannot import module {target!r}: {exc}") from None


def _looks_like_path(target: str) -> bool:
    """A target no module name can be (``nope/``, ``./x``, ``a-b``): so a path."""
    return not all(part.isidentifier() for part in target.split("."))


def discover(target: str) -> list[tuple[str, object]]:
    """``(qualified name, function)`` for each ``@gradient_check`` function in ``target``."""
    func_name = None
    if ":" in target and not pathlib.Path(target).exists():
        target, func_name = target.rsplit(":", 1)
    found = []
    for module in _modules(target):
        label = pathlib.Path(getattr(module, "__file__", "") or module.__name__).name
        for name, obj in sorted(vars(module).items()):
            if callable(obj) and hasattr(obj, "__symgrad_check__") and \
                    getattr(obj, "__module__", None) == module.__name__:
                if func_name is None or name == func_name:
                    found.append((f"{label}::{name}", obj))
    if func_name is not None and not found:
        raise UsageError(f"no @gradient_check function named {func_name!r} in {target}")
    return found


_KEYWORDS = {"and", "or", "not"}


def keyword_matches(expr: str, name: str) -> bool:
    """pytest-style ``-k``: words are substrings of the name, joined by and/or/not/()."""
    tokens = re.findall(r"\(|\)|[^\s()]+", expr)
    if not tokens:
        raise UsageError("empty -k expression")
    out = []
    for tok in tokens:
        if tok in _KEYWORDS or tok in "()":
            out.append(tok)
        else:
            out.append(str(tok.lower() in name.lower()))
    try:
        return bool(eval(" ".join(out), {"__builtins__": {}}, {}))  # noqa: S307 (True/False/ops)
    except SyntaxError:
        raise UsageError(f"bad -k expression: {expr!r}") from None


def _progress(items, enabled: bool):
    if not enabled:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="symgrad check", unit="check", leave=False)


def _status_line(name: str, ok: bool, data: dict) -> str:
    """``ok     file.py::check  [mode exact]`` (+ the first bad node, or the error)."""
    line = f"{'ok' if ok else 'FAILED':6} {name}"
    if data.get("mode"):
        line += f"  [mode {data['mode']}]"
    if not ok:
        if "error" in data:
            line += f"  error: {data['error']}"
        elif data.get("first_bad_node_label"):
            line += f"  first bad node: {data['first_bad_node_label']}"
        else:
            bad = [lf["name"] for lf in data.get("leaves") or [] if lf.get("status") != "ok"]
            status = data.get("status") or "mismatch"
            if status != "mismatch":  # non-finite, changed in place ...: not a disagreement
                line += f"  {status}" + (": " + ", ".join(bad) if bad else "")
            elif bad:
                line += "  leaves that disagree: " + ", ".join(bad)
    return line


def cmd_check(args) -> int:
    import traceback

    from .symbolic.report import render_text
    from .testing.checks import run_marked
    from .testing.html import html_page

    found = discover(args.target)
    if args.k:
        found = [(n, f) for n, f in found if keyword_matches(args.k, n)]
    if not found:
        raise UsageError(f"no @symgrad.testing.gradient_check functions found in {args.target}")
    tty = sys.stdout.isatty()
    results = []
    for name, fn in _progress(found, tty):
        if args.mode:
            fn.__symgrad_check__ = {**fn.__symgrad_check__, "mode": args.mode}
        if args.workers is not None:
            fn.__symgrad_check__ = {**fn.__symgrad_check__, "workers": args.workers}
        trace = None
        try:
            report = run_marked(fn, name)
            ok, data = bool(report.ok), report.to_json()
        except Exception as exc:  # a check that cannot run counts as failed, with the reason
            ok, data = False, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            trace = traceback.format_exc()
        results.append({"name": name, "ok": ok, "report": data})
        print(_status_line(name, ok, data), flush=True)
        if args.verbose and trace is not None:
            print(_indent(trace.rstrip()), flush=True)
        elif "leaves" in data and (args.verbose or not ok):
            print(_indent(render_text(data, verbose=args.verbose, width=96)), flush=True)
    failed = sum(not r["ok"] for r in results)
    if failed and not args.verbose:
        print("(symgrad check --verbose shows every leaf and node, with formulas and "
              "tolerances)")
    print(f"{len(results) - failed} passed, {failed} failed")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(
            {"schema": "symgrad.checks/1", "total": len(results), "failed": failed,
             "checks": results}, indent=1, allow_nan=False))
    if args.html:
        pathlib.Path(args.html).write_text(html_page(results))
    return EXIT_FAILED if failed else EXIT_OK


def _indent(text: str) -> str:
    return "\n".join("    " + line if line else "" for line in text.splitlines())


def cmd_verify_rules(args) -> int:
    """Print one line per op (status, op, grad_fn); exit 1 if any rule failed or errored."""
    from .symbolic import audit_rules

    results = audit_rules()
    for line in rules_table(results):
        print(line, flush=True)
    failed = sum(row.status in ("failed", "error") for row in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return EXIT_FAILED if failed else EXIT_OK


def rules_table(results: list) -> list[str]:
    """A header and one line per audited op, each column as wide as its longest entry so
    that every row's columns start where the header's do (op names run to 30+ chars)."""
    head = ("status", "op", "grad_fn")
    cells = [(r.status, r.op, r.grad_fn or "") for r in results]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(2)]

    def line(status: str, op: str, grad_fn: str) -> str:
        return f"{status:{widths[0]}}  {op:{widths[1]}}  {grad_fn}"

    out = [line(*head)]
    for r, c in zip(results, cells):
        text = line(*c)
        if r.status in ("failed", "error") and r.detail:
            text += f"  {r.detail}"
        out.append(text.rstrip())
    return out


def workers_arg(text: str) -> int:
    """``--workers N``: an integer >= 1 (1: this process), else a usage error that says so.
    (The pytest plugin's ``--symgrad-workers`` has its own copy: it must not import symgrad
    when pytest starts.)"""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of worker processes (>= 1), got {text!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="symgrad", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="verify @gradient_check functions")
    check.add_argument("target", metavar="PATH_OR_MODULE[:FUNC]")
    check.add_argument("-k", metavar="EXPR", help="only checks whose name matches EXPR")
    check.add_argument("--json", metavar="OUT", help="write the results as JSON")
    check.add_argument("--html", metavar="OUT", help="write the results as HTML")
    check.add_argument("--mode", choices=("auto", "exact", "local", "finite_differences"))
    check.add_argument("--workers", metavar="N", type=workers_arg, default=None,
                       help="run each check's per-node checks in N processes (same "
                            "reports; default: this process)")
    check.add_argument("-v", "--verbose", action="store_true",
                       help="print every check's full report: all leaves and nodes, "
                            "formulas, tolerances, notes (default: a summary of failures)")
    check.set_defaults(run=cmd_check)
    rules = sub.add_parser("verify-rules", help="prove every op's backward rule symbolically")
    rules.set_defaults(run=cmd_verify_rules)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"symgrad: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    raise SystemExit(main())
