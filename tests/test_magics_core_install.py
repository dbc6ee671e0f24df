"""The magics on the core install: a real kernel whose Python has no ipywidgets.

``pip install symgrad`` without the ``jupyter`` extra has no ipywidgets (nor anywidget).
The kernel here runs in a venv made at test time (no network, under a second): its
site-packages holds a symlink to every entry of this venv's site-packages except the
files of the ipywidgets, anywidget, widgetsnbextension and jupyterlab_widgets
distributions (read from their RECORD). So ``import ipywidgets`` fails as on a core
install: no finder trick, ``importlib.util.find_spec`` says None and importlib.metadata
does not list it. symgrad comes with the rest (here through the editable install's
``.pth`` file; the kernel's symgrad is checked to be the one under test).
nbclient runs a notebook on that kernel and the saved outputs are checked: the graph
bundle carrying the verdicts, the report as a separate rich output, the one-line notice,
no error outputs. A last test runs the magics in a plain InteractiveShell (what terminal
IPython is) and reads the printed text.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sysconfig
import venv
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("ipykernel")

import symgrad  # noqa: E402
from symgrad.jupyter import GRAPH_MIME, REPORT_MIME, load_schema  # noqa: E402

WIDGET_PACKAGES = ("ipywidgets", "anywidget", "widgetsnbextension", "jupyterlab_widgets")
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
NOTICE = ("%%symgrad: ipywidgets is not installed; showing the static graph and report "
          "(pip install 'symgrad[jupyter]' for the Inspector)")

WRONG_FUNCTION = '''\
from symgrad.autograd import Function

class Softplus(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x.exp() + 1).log()

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * x.sigmoid() * 1.01   # the bug

    @staticmethod
    def sympy(x):
        import sympy
        return sympy.log(1 + sympy.exp(x))'''


def _widget_entries(site: Path) -> set[str]:
    """Top-level names in ``site`` that belong to the widget distributions."""
    out: set[str] = set()
    for name in WIDGET_PACKAGES:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or []:
            top = f.parts[0]
            if top != ".." and (site / top).exists():
                out.add(top)
    return out


def make_core_venv(where: Path) -> Path:
    """A venv with this one's packages minus the widget distributions; its python."""
    venv.create(where, with_pip=False, system_site_packages=False, symlinks=True)
    python = where / "bin" / "python"
    target = Path(subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    site = Path(sysconfig.get_paths()["purelib"])
    skip = _widget_entries(site)
    assert "ipywidgets" in skip or importlib.util.find_spec("ipywidgets") is None
    for entry in site.iterdir():
        if entry.name not in skip and not (target / entry.name).exists():
            (target / entry.name).symlink_to(entry)
    return python


def _kernel_env(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(JUPYTER_PATH=str(root), JUPYTER_DATA_DIR=str(root / "data"),
               JUPYTER_RUNTIME_DIR=str(root / "runtime"), IPYTHONDIR=str(root / "ipython"),
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    return env


@pytest.fixture(scope="module")
def core_python(tmp_path_factory):
    root = tmp_path_factory.mktemp("core-install")
    python = make_core_venv(root / "venv")
    probe = ("import importlib.util, importlib.metadata, sys\n"
             "for name in ('ipywidgets', 'anywidget'):\n"
             "    try:\n"
             "        __import__(name)\n"
             "    except ModuleNotFoundError:\n"
             "        pass\n"
             "    else:\n"
             "        sys.exit(name + ' imports')\n"
             "    assert importlib.util.find_spec(name) is None\n"
             "import symgrad, symgrad.jupyter.magics, ipykernel\n"
             "print(symgrad.__file__)")
    res = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                         env=_kernel_env(root), cwd=root)
    assert res.returncode == 0, res.stdout + res.stderr
    assert Path(res.stdout.strip()).resolve() == Path(symgrad.__file__).resolve()  # under test
    return root, python


@pytest.fixture(scope="module")
def executed(core_python):
    root, python = core_python
    spec_dir = root / "kernels" / "symgrad-core"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "symgrad core install", "language": "python"}))
    cells = [
        "%load_ext symgrad",
        "import importlib.util, sys, symgrad\n"
        "print(sys.prefix, importlib.util.find_spec('ipywidgets') is None, symgrad.__file__)",
        "import symgrad as sg\n"
        "a = sg.tensor(2., requires_grad=True)\n"
        "b = sg.tensor(3., requires_grad=True)\n"
        "c = sg.tensor(4., requires_grad=True)",
        "%%symgrad\nd = 5 * (a + b)\ne = c * d\ne.backward()\ne",
        "%symgrad verify e --rtol 1e-5",
        "%symgrad graph e",
        "%symgrad saved e",
        WRONG_FUNCTION,
        "%%symgrad\n"
        "w = sg.tensor([[0.5, -1.0], [2.0, 0.25]], requires_grad=True)\n"
        "v = sg.tensor([1.0, -2.0], requires_grad=True)\n"
        "loss = Softplus.apply(w @ v).tanh().sum()\n"
        "loss.backward()",
        "%%symgrad --no-verify\nf = (a * b).sin()",
        "%%symgrad --mode exact\n"
        "M = sg.randn(40, 40, requires_grad=True)\n"
        "L = ((M @ M) @ M).tanh().sum()\n"
        "L.item() == L.item()",
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    mp = pytest.MonkeyPatch()
    for k, v in _kernel_env(root).items():
        mp.setenv(k, v)
    try:
        client = nbclient.NotebookClient(nb, timeout=180, kernel_name="symgrad-core",
                                         resources={"metadata": {"path": str(root)}})
        client.execute()
    finally:
        mp.undo()
    out = root / "executed.ipynb"
    nbformat.write(nb, str(out))
    return root, nbformat.read(str(out), as_version=4)  # what a saved notebook holds


def kinds(outs) -> list[str]:
    """Each output as ``stderr``/``stdout``, ``graph``, ``report``, ``result``, ..."""
    res = []
    for o in outs:
        if o.output_type == "stream":
            res.append(o.name)
        elif o.output_type == "error":
            res.append("error")
        elif GRAPH_MIME in o.data:
            res.append("graph" if o.output_type == "display_data" else "graph-result")
        elif REPORT_MIME in o.data:
            res.append("report" if o.output_type == "display_data" else "report-result")
        else:
            res.append(o.output_type)
    return res


def test_the_kernel_has_no_ipywidgets(executed):
    root, nb = executed
    prefix, missing, where = nb.cells[1].outputs[0].text.split()
    assert Path(prefix) == root / "venv" and missing == "True"
    assert Path(where).resolve() == Path(symgrad.__file__).resolve()
    for cell in nb.cells:
        assert all(o.output_type != "error" for o in cell.outputs), cell.source
        assert all(WIDGET_MIME not in o.get("data", {}) for o in cell.outputs)


def test_cell_magic_shows_graph_with_verdicts_and_report(executed):
    _root, nb = executed
    outs = nb.cells[3].outputs
    assert kinds(outs) == ["stderr", "graph", "report", "execute_result"]
    assert outs[0].text == NOTICE + "\n"
    graph, report, result = outs[1].data, outs[2].data, outs[3].data
    assert set(graph) == {GRAPH_MIME, "text/html", "text/plain"}
    payload = graph[GRAPH_MIME]
    jsonschema.validate(payload, load_schema())
    agreement = payload["agreement"]
    assert agreement["ok"] is True and agreement["mode"] == "exact"
    assert agreement["first_bad_node"] is None
    assert {r["leaf"]: r["status"] for r in agreement["rows"]} == \
        {"a": "pass", "b": "pass", "c": "pass"}
    # the local run filled a verdict on every op node (the graph's badges)
    assert {n["label"]: n["check"]["status"] for n in payload["nodes"]
            if n["kind"] == "op"} == {"AddBackward0": "pass", "MulBackward0": "pass"}
    assert "<svg" in graph["text/html"] and "sg-agreement-row" in graph["text/html"]
    assert graph["text/plain"].startswith("symgrad graph: 3 op nodes, 3 leaves, gradients agree")
    # the report: Report._repr_mimebundle_, a separate output
    assert set(report) == {REPORT_MIME, "text/html", "text/plain"}
    assert report[REPORT_MIME]["schema"] == "symgrad.report/1" and report[REPORT_MIME]["ok"]
    assert "<table>" in report["text/html"] and "OK" in report["text/html"]
    assert report["text/plain"].startswith("symgrad.verify: OK  (mode exact")
    assert result["text/plain"] == "tensor(100., grad_fn=<MulBackward0>)"


def test_line_magics(executed):
    _root, nb = executed
    verify = nb.cells[4].outputs
    assert kinds(verify) == ["report-result"]  # no notice: nothing is missing here
    data = verify[0].data
    assert {REPORT_MIME, "text/html", "text/plain"} <= set(data)
    assert data[REPORT_MIME]["ok"] is True
    assert data[REPORT_MIME]["tolerances"]["float32"]["rtol"] == 1e-5
    assert "symgrad.verify: OK" in data["text/plain"]
    graph = nb.cells[5].outputs
    assert kinds(graph) == ["graph-result"]
    jsonschema.validate(graph[0].data[GRAPH_MIME], load_schema())
    saved = nb.cells[6].outputs[0].data
    assert "MulBackward0 (e)._saved_other [] = 25.  same object as d" in saved["text/plain"]


def test_wrong_custom_function_is_named(executed):
    _root, nb = executed
    outs = nb.cells[8].outputs
    assert kinds(outs) == ["graph", "report"]  # the notice was shown once, in cell 3
    payload = outs[0].data[GRAPH_MIME]
    jsonschema.validate(payload, load_schema())
    agreement = payload["agreement"]
    assert agreement["ok"] is False
    bad = next(n for n in payload["nodes"] if n["id"] == agreement["first_bad_node"])
    assert bad["label"] == "SoftplusBackward" and bad.get("first_bad") is True
    assert bad["check"]["status"] == "fail"
    assert {r["leaf"]: r["status"] for r in agreement["rows"]} == {"w": "fail", "v": "fail"}
    assert "GRADIENTS DISAGREE" in outs[0].data["text/plain"]
    report = outs[1].data
    assert report[REPORT_MIME]["ok"] is False
    assert report[REPORT_MIME]["first_bad_node"] is not None
    assert "first bad node: SoftplusBackward" in report["text/plain"]
    assert "MISMATCH" in report["text/html"]


def test_no_verify_and_verifier_error(executed):
    _root, nb = executed
    outs = nb.cells[9].outputs
    assert kinds(outs) == ["graph"]
    assert outs[0].data[GRAPH_MIME]["agreement"] is None
    outs = nb.cells[10].outputs
    # the verifier refused (exact mode over budget): graph kept, one line, result kept
    assert kinds(outs) == ["graph", "stderr", "execute_result"]
    assert outs[0].data[GRAPH_MIME]["agreement"] is None
    line = outs[1].text
    assert line.startswith("%%symgrad: verification failed: VerifierBudgetError: exact mode")
    assert line.count("\n") == 1
    assert outs[2].data["text/plain"] == "True"


def test_terminal_ipython_prints_readable_text(capsys):
    """A plain InteractiveShell (terminal IPython): no kernel, so text/plain is printed."""
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    created = not InteractiveShell.initialized()
    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "symgrad")
        ip.run_cell("import symgrad as sg\n"
                    "a = sg.tensor(2., requires_grad=True)\n"
                    "b = sg.tensor(3., requires_grad=True)\n"
                    "c = sg.tensor(4., requires_grad=True)")
        capsys.readouterr()
        ip.run_cell("%%symgrad\nd = 5 * (a + b)\ne = c * d\ne.backward()\ne")
        out, err = capsys.readouterr()
        assert err == ""  # no notice: a terminal shows no widget anyway
        graph_at = out.index("symgrad graph: 3 op nodes, 3 leaves, gradients agree")
        report_at = out.index("symgrad.verify: OK")
        assert graph_at < report_at < out.index("tensor(100., grad_fn=<MulBackward0>)")
        assert out.count("symgrad graph:") == 1  # shown once (no update in a terminal)
        assert "    AddBackward0 [] [pass]" in out
        assert re.search(r"^\s*a\s+scalar\b.*\bok\b", out, re.M)
        assert "<svg" not in out and "<table" not in out and '"schema"' not in out

        ip.run_cell("%symgrad verify e")
        out, _ = capsys.readouterr()
        assert "symgrad.verify: OK" in out
        assert re.search(r"^\s*c\s+scalar\b.*\bok\b", out, re.M)

        ip.run_cell("M = sg.randn(40, 40, requires_grad=True)\n"
                    "L = ((M @ M) @ M).tanh().sum()")
        ip.run_cell("%%symgrad --mode exact --root L\npass")
        out, err = capsys.readouterr()
        assert out.startswith("symgrad graph: 4 op nodes, 1 leaves\n")
        assert err.startswith("%%symgrad: verification failed: VerifierBudgetError:")
        assert err.count("\n") == 1
        with pytest.raises(UsageError, match=r"^%symgrad verify: VerifierBudgetError: "):
            ip.run_line_magic("symgrad", "verify L --mode exact")
    finally:
        if created:
            InteractiveShell.clear_instance()
