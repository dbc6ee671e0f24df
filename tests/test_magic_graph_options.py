"""``%symgrad graph EXPR --collapse C --focus PATH``: sg.graph's ``collapse=`` and
``focus=`` from the line magic (issue 30, scope 1). The magic's view is the one
``sg.graph(loss, collapse=..., focus=...)`` makes, and an unknown module path is a
one-line UsageError in sg.graph's own words. Run in a plain InteractiveShell."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("IPython")

from IPython.core.error import UsageError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

import symgrad as sg  # noqa: E402
from symgrad.jupyter.graph import graph  # noqa: E402
from symgrad.jupyter.magics import _user_names, collapse_value  # noqa: E402


@pytest.fixture(scope="module")
def ip():
    created = not InteractiveShell.initialized()
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "symgrad")
    shell.run_cell(
        "import symgrad as sg\n"
        "sg.manual_seed(0)\n"
        "class Block(sg.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = sg.nn.Linear(3, 3)\n"
        "    def forward(self, x):\n"
        "        return x + self.fc(x).tanh()\n"
        "class Net(sg.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.inp = sg.nn.Linear(2, 3)\n"
        "        self.h = sg.nn.ModuleList([Block(), Block()])\n"
        "        self.out = sg.nn.Linear(3, 1)\n"
        "    def forward(self, x):\n"
        "        x = self.inp(x)\n"
        "        for b in self.h:\n"
        "            x = b(x)\n"
        "        return self.out(x)\n"
        "net = Net()\n"
        "loss = net(sg.randn(4, 2)).sum()")
    yield shell
    if created:
        InteractiveShell.clear_instance()


def _ref(ip, **kw):
    """sg.graph's view, its names taken from the notebook as the magic takes them."""
    return graph(ip.user_ns["loss"], namespace=_user_names(ip.user_ns), **kw)


def _view(ip, line: str):
    return ip.run_line_magic("symgrad", line)


def _same(view, ref) -> None:
    a, b = view.to_json(), ref.to_json()
    assert a.get("focus") == b.get("focus")
    assert a["collapsed"] == b["collapsed"]
    assert [n["id"] for n in a["nodes"]] == [n["id"] for n in b["nodes"]]
    def html(v) -> str:  # each drawing numbers its own marker ids
        return re.sub(r"\bsg\d+-", "sg-", v._repr_html_())

    assert html(view) == html(ref)


def test_collapse_values(ip):
    plain = _view(ip, "graph loss").to_json()
    assert plain["collapsed"] == []  # a small graph opens by default
    for text, value, collapsed in [
            ("true", True, ["inp", "h", "out"]),
            ("false", False, []),
            ("2", 2, ["h.0", "h.1"]),
            ("h.1", "h.1", ["h.1"]),
            ("h.0,out", ["h.0", "out"], ["h.0", "out"])]:
        assert collapse_value(text) == value
        view = _view(ip, f"graph loss --collapse {text}")
        assert sorted(view.to_json()["collapsed"]) == sorted(collapsed), text
        _same(view, _ref(ip, collapse=value))
    # an option may come first, and "=" works too
    _same(_view(ip, "graph --collapse=h.1 loss"), _ref(ip, collapse="h.1"))
    # collapsed modules draw as boxes in the static SVG: h.1's box, not its nodes
    html = _view(ip, "graph loss --collapse h.1")._repr_html_()
    assert 'data-id="module:h.1"' in html and 'data-id="module:h.0"' not in html


def test_focus(ip):
    view = _view(ip, "graph loss --focus h.0")
    data = view.to_json()
    assert data["focus"] == "h.0"
    assert {n.get("module") for n in data["nodes"]} <= {"h.0", "h.0.fc"}
    _same(view, _ref(ip, focus="h.0"))
    both = _view(ip, "graph loss --focus h --collapse 2")
    _same(both, _ref(ip, focus="h", collapse=2))


def test_unknown_paths_and_misplaced_options(ip):
    loss, net = ip.user_ns["loss"], ip.user_ns["net"]
    for kw, flag in [({"focus": "h.7"}, "--focus h.7"), ({"collapse": "nope"}, "--collapse nope"),
                     ({"collapse": 0}, "--collapse 0")]:
        with pytest.raises(ValueError) as want:
            sg.graph(loss, {"net": net}, **kw)
        with pytest.raises(UsageError) as got:
            _view(ip, f"graph loss {flag}")
        assert str(got.value) == f"%symgrad graph: {want.value}"
    with pytest.raises(UsageError, match=r"^%symgrad verify: --focus is an option of "
                                         r"%symgrad graph"):
        _view(ip, "verify loss --focus h")
    with pytest.raises(UsageError, match=r"^%%symgrad: --collapse is an option of"):
        ip.run_cell_magic("symgrad", "--collapse true", "y = loss * 2")
    with pytest.raises(UsageError, match=r"--collapse true\|false\|DEPTH"):
        ip.run_line_magic("symgrad", "help")
