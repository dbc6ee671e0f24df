"""pytest plugin (entry point ``pytest11``): gradient checks as a fixture, a marker, a report.

- fixture ``symgrad_check(fn, *inputs, **options)`` runs the verifier on ``fn(*inputs)``;
  a mismatch fails the test with the verifier's table;
- fixture ``symgrad_function(MyFunction, *inputs, **options)`` proves a custom
  ``autograd.Function``'s backward (and double backward) against its traced forward
  (``symgrad.testing.assert_function_correct``);
- marker ``@pytest.mark.symgrad(mode=..., rtol=..., atol=..., workers=...)`` sets that
  test's defaults;
- ``--symgrad-mode`` sets the session default; ``--symgrad-workers=N`` runs each check's
  per-node checks in N processes (the same reports); ``--symgrad-report=PATH`` writes every
  check of the session as JSON (PATH) and HTML (PATH with ``.html``), gathered from all
  pytest-xdist workers.

symgrad itself is imported only inside hooks, so loading the plugin stays cheap.
"""

from __future__ import annotations

import json
import pathlib

import pytest

_RECORDS = pytest.StashKey[list]()


def pytest_addoption(parser) -> None:
    group = parser.getgroup("symgrad", "symgrad gradient checks")
    group.addoption("--symgrad-report", metavar="PATH", default=None,
                    help="write every gradient check of the session to PATH (JSON) and "
                         "PATH with .html")
    group.addoption("--symgrad-mode", default="auto",
                    choices=("auto", "exact", "local", "finite_differences"),
                    help="default verifier mode for symgrad_check (default: auto)")
    group.addoption("--symgrad-workers", metavar="N", type=_workers_arg, default=None,
                    help="run each gradient check's per-node checks in N processes (the "
                         "same reports; default: the test's own process)")


def _workers_arg(text: str) -> int:
    """An integer >= 1, else pytest's usage error naming the option (a copy of
    ``symgrad.cli.workers_arg``: importing symgrad here would slow every pytest start)."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of worker processes (>= 1), got {text!r}")
    return n


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "symgrad(mode=None, rtol=None, atol=None, order=1, workers=None): "
                   "options for the symgrad_check fixture in this test")
    config.stash[_RECORDS] = []


def _defaults(request) -> dict:
    """The session's options, then the test's ``symgrad`` marker's."""
    defaults = {"mode": request.config.getoption("--symgrad-mode")}
    workers = request.config.getoption("--symgrad-workers")
    if workers is not None:
        defaults["workers"] = workers
    marker = request.node.get_closest_marker("symgrad")
    if marker is not None:
        defaults.update({k: v for k, v in marker.kwargs.items() if v is not None})
    return defaults


@pytest.fixture
def symgrad_check(request):
    """Call as ``symgrad_check(fn, *inputs, **options)``; returns the verifier's Report."""
    from . import checks

    defaults = _defaults(request)

    def run(fn, *inputs, **options):
        opts = {**defaults, **options}
        start = len(checks.RECORDED)
        try:
            return checks.assert_gradients_match(
                fn, *inputs, check_name=f"{request.node.nodeid}::{getattr(fn, '__name__', fn)}",
                **opts)
        finally:
            request.config.stash[_RECORDS].extend(checks.RECORDED[start:])

    return run


@pytest.fixture
def symgrad_function(request):
    """Call as ``symgrad_function(MyFunction, *inputs, **options)``: proves the Function's
    backward (``assert_function_correct``); returns the verifier's Report."""
    from . import checks

    defaults = _defaults(request)

    def run(function_cls, *inputs, **options):
        opts = {**defaults, **options}
        if opts.get("mode") == "finite_differences":
            opts["mode"] = "local"
        start = len(checks.RECORDED)
        try:
            return checks.assert_function_correct(
                function_cls, *inputs,
                check_name=f"{request.node.nodeid}::{function_cls.__name__}", **opts)
        finally:
            request.config.stash[_RECORDS].extend(checks.RECORDED[start:])

    return run


def pytest_sessionfinish(session, exitstatus) -> None:
    config = session.config
    records = config.stash.get(_RECORDS, [])
    if hasattr(config, "workerinput"):  # an xdist worker: hand the records to the controller
        config.workeroutput["symgrad_checks"] = json.dumps(records)
        return
    path = config.getoption("--symgrad-report")
    if path:
        write_report(records, pathlib.Path(path))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: collect a finished worker's checks."""
    data = getattr(node, "workeroutput", {}).get("symgrad_checks")
    if data:
        node.config.stash[_RECORDS].extend(tuple(r) for r in json.loads(data))


def write_report(records, path: pathlib.Path) -> None:
    """The session report: ``{"schema": "symgrad.checks/1", "checks": [...]}`` + HTML."""
    from .html import html_page

    path.parent.mkdir(parents=True, exist_ok=True)
    checks = [{"name": name, "ok": bool(rep.get("ok")), "report": rep} for name, rep in records]
    payload = {"schema": "symgrad.checks/1", "total": len(checks),
               "failed": sum(not c["ok"] for c in checks), "checks": checks}
    path.write_text(json.dumps(payload, indent=1))
    html_path = path.with_suffix(".html")
    html_path.write_text(html_page(checks))
