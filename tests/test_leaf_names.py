"""Names users know: one naming of leaves for every view (``symgrad._naming``).

``tensor.name``, then the caller's ``names=``, then the parameter's path in the module
that owns it (``fc1.weight``, ``0.bias``), then the variable holding it (notebook cell
or calling frame), else ``t0, t1, ...``; ``d, d'`` for one name twice. The last test runs
one model through the four places a user meets leaf names (``%%symgrad`` in a real
kernel with the Inspector, ``sg.verify`` without ``names=``, a compiled step's
``verify()``, ``symgrad check`` and the pytest plugin's report) and compares them.
"""

from __future__ import annotations

import copy
import gc
import json
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest

import symgrad as sg
from symgrad import nn


def _names(report) -> list[str]:
    return [r.name for r in report.leaves]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 4).double()
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(4, 2).double())

    def forward(self, x):
        return self.body(self.fc1(x))


NET_NAMES = ["fc1.weight", "fc1.bias", "body.1.weight", "body.1.bias"]


def _x():
    return sg.tensor(np.linspace(-1, 1, 15).reshape(5, 3))


def test_parameters_are_named_by_their_path_in_the_owning_module():
    model = Net()
    assert _names(sg.verify(model(_x()).pow(2).sum())) == NET_NAMES


def test_a_model_no_variable_holds_still_names_its_parameters():
    from symgrad.testing import assert_gradients_match

    def loss():  # the model lives only while the check builds the graph
        return Net()(_x()).pow(2).sum()

    # a live model that no variable holds: found from the registry of live modules
    made = loss()
    assert _names(sg.verify(made)) == ["t0", "t1", "t3", "t4"]  # the model is gone
    # symgrad check and the pytest plugin keep the modules the check makes
    assert _names(assert_gradients_match(loss)) == NET_NAMES
    keep = Net()
    assert _names(sg.verify(keep(_x()).pow(2).sum(), namespace={})) == NET_NAMES


def test_sequential_paths_and_a_copied_model():
    seq = nn.Sequential(nn.Linear(3, 2).double(), nn.Tanh())
    twin = copy.deepcopy(seq)  # made without __init__: still found
    assert _names(sg.verify(twin(_x()).sum())) == ["0.weight", "0.bias"]


def test_priority_tensor_name_then_names_then_path_then_variable_then_t0():
    model = nn.Linear(2, 1).double()
    model.bias.name = "b_own"
    w = sg.tensor([[1.0, 2.0]], dtype=sg.float64, requires_grad=True)  # a variable
    hidden = [sg.tensor([0.5], dtype=sg.float64, requires_grad=True)]  # no variable
    x = sg.tensor([[0.1, 0.2]], dtype=sg.float64)
    out = (model(x) * (x @ w.t()) * hidden[0]).sum()
    assert _names(sg.verify(out)) == ["weight", "b_own", "w", "t0"]
    assert _names(sg.verify(out, names={"W": model.weight})) == ["W", "b_own", "w", "t0"]
    # another frame: the variables of the function that calls verify
    def inner(y):
        weights = w
        assert weights is w
        return sg.verify(y)

    assert "weights" in _names(inner(out))


def test_two_models_sharing_paths_are_told_apart_by_their_variables():
    gen, disc = nn.Linear(2, 2).double(), nn.Linear(2, 1).double()
    out = disc(gen(sg.tensor([[1.0, 2.0]], dtype=sg.float64))).sum()
    assert _names(sg.verify(out)) == ["gen.weight", "gen.bias", "disc.weight", "disc.bias"]
    # not held in variables: the same path twice becomes d, d'
    assert _names(sg.verify(out, namespace={})) == ["weight", "bias", "weight'", "bias'"]


def test_tied_weights_take_the_first_path_as_named_parameters_does():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Linear(2, 2, bias=False).double()
            self.head = nn.Linear(2, 2, bias=False).double()
            self.head.weight = self.emb.weight

        def forward(self, x):
            return self.head(self.emb(x))

    m = Tied()
    assert [n for n, _ in m.named_parameters()] == ["emb.weight"]
    assert _names(sg.verify(m(sg.tensor([[1.0, 2.0]], dtype=sg.float64)).sum())) == \
        ["emb.weight"]


def test_torch_modules_are_found_from_the_namespace():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh()).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    loss = model(x).pow(2).sum()
    assert _names(sg.verify(loss)) == ["0.weight", "0.bias"]


def test_the_registry_keeps_no_module_alive():
    from symgrad.nn.modules import _LIVE_MODULES, live_modules

    gc.disable()
    try:
        m = Net()
        ref, key = weakref.ref(m), id(m)
        assert m in live_modules() and key in _LIVE_MODULES
        del m
        assert ref() is None  # freed by reference counting: no cycle, no strong reference
        assert key not in _LIVE_MODULES  # and its entry went with it
    finally:
        gc.enable()


def test_bad_namespace_is_a_clear_type_error():
    with pytest.raises(TypeError, match="argument 'namespace' must be a mapping"):
        sg.verify(sg.tensor(1.0, requires_grad=True) * 2, namespace=[1, 2])


# -- the four places -------------------------------------------------------------------------

MODEL_FILE = '''
import symgrad as sg
from symgrad import nn
from symgrad.testing import gradient_check


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 4).double()
        self.body = nn.Sequential(nn.Tanh(), nn.Linear(4, 2).double())

    def forward(self, x):
        return self.body(self.fc1(x))


def make():
    sg.manual_seed(0)
    return Net(), sg.randn(5, 3, dtype=sg.float64)


@gradient_check()
def check_net():
    model, x = make()
    return model(x).pow(2).sum()
'''

PYTEST_FILE = '''
from names_model import make


def test_net(symgrad_check):
    model, x = make()
    symgrad_check(lambda inp: model(inp).pow(2).sum(), x)
'''

CELLS = [
    "import sys\nsys.path.insert(0, {dir!r})\nimport json\nimport symgrad as sg\n"
    "from names_model import make\nmodel, x = make()",
    "%load_ext symgrad",
    "%%symgrad\nloss = model(x).pow(2).sum()\nloss.backward()",
    "print(json.dumps([r.name for r in sg.verify(model(x).pow(2).sum()).leaves]))",
    "opt = sg.optim.SGD(model.parameters(), lr=0.01)\n\n"
    "@sg.compile\ndef step(inp):\n    opt.zero_grad()\n    loss = model(inp).pow(2).sum()\n"
    "    loss.backward()\n    opt.step()\n    return loss\n\n"
    "step(x)\nstep(x)\nprint(json.dumps([r.name for r in step.verify().leaves]))",
]


def _kernel_names(tmp_path) -> dict[str, list[str]]:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("ipywidgets")
    from symgrad.jupyter import GRAPH_MIME

    root = tmp_path / "jupyter"
    spec_dir = root / "kernels" / "symgrad-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "symgrad test", "language": "python"}))
    mp = pytest.MonkeyPatch()
    for var, sub in (("JUPYTER_PATH", ""), ("JUPYTER_DATA_DIR", "data"),
                     ("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython")):
        mp.setenv(var, str(root / sub) if sub else str(root))
    mp.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.replace("{dir!r}", repr(str(tmp_path))))
                for c in CELLS]
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="symgrad-test",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
    finally:
        mp.undo()
    graph = next(o.data[GRAPH_MIME] for o in nb.cells[2].outputs
                 if o.output_type == "display_data" and GRAPH_MIME in o.data)
    by_node = {lf["id"]: lf["name"] for lf in graph["leaves"]}
    rows = graph["agreement"]["rows"]
    assert all(by_node[r["node"]] == r["leaf"] for r in rows)

    def printed(i):
        text = "".join(o.text for o in nb.cells[i].outputs if o.output_type == "stream"
                       and o.name == "stdout")
        return json.loads(text.strip().splitlines()[-1])

    return {"%%symgrad": [r["leaf"] for r in rows], "sg.verify": printed(3),
            "step.verify()": printed(4)}


def test_one_model_has_the_same_leaf_names_in_every_place(tmp_path):
    (tmp_path / "names_model.py").write_text(MODEL_FILE)
    (tmp_path / "test_names_model.py").write_text(PYTEST_FILE)
    got = _kernel_names(tmp_path)
    cli = subprocess.run([sys.executable, "-m", "symgrad", "check", "names_model.py",
                          "--json", "cli.json"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    got["symgrad check"] = [lf["name"] for lf in json.loads(
        (tmp_path / "cli.json").read_text())["checks"][0]["report"]["leaves"]]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--symgrad-report=plugin.json",
                          "test_names_model.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    got["pytest plugin"] = [lf["name"] for lf in json.loads(
        (tmp_path / "plugin.json").read_text())["checks"][0]["report"]["leaves"]]
    assert got == {place: NET_NAMES for place in got}, got
    assert set(got) == {"%%symgrad", "sg.verify", "step.verify()", "symgrad check",
                        "pytest plugin"}


def test_notebook_variable_names_in_a_cell(tmp_path):
    """In IPython, a leaf no module owns is named by the cell's variable, in the graph,
    its agreement rows and the report alike."""
    from IPython.core.interactiveshell import InteractiveShell

    created = not InteractiveShell.initialized()
    ip = InteractiveShell.instance()
    try:
        ip.run_line_magic("load_ext", "symgrad")
        ip.run_cell(textwrap.dedent("""
            import symgrad as sg
            scale = sg.tensor([2.0, 3.0], requires_grad=True)
            lin = sg.nn.Linear(2, 2)
        """))
        ip.run_cell("%%symgrad\nout = (lin(scale) * scale).sum()\nout.backward()")
        magics = ip.find_cell_magic("symgrad").__self__
        assert _names(magics.last_report) == ["scale", "weight", "bias"]
        # a model the cell makes and drops still names its parameters
        before = magics.last_report
        ip.run_cell("%%symgrad\nh = sg.nn.Linear(2, 1)(scale).sum()\nh.backward()")
        assert magics.last_report is not before
        assert _names(magics.last_report) == ["scale", "weight", "bias"]
        # a torch model is found from the notebook's namespace
        ip.run_cell(textwrap.dedent("""
            import torch
            tmodel = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh()).double()
            tx = torch.ones(3, 2, dtype=torch.float64)
        """))
        before = magics.last_report
        ip.run_cell("%%symgrad\ntout = tmodel(tx).sum()\ntout.backward(retain_graph=True)")
        assert magics.last_report is not before
        assert _names(magics.last_report) == ["0.weight", "0.bias"]
    finally:
        ip.reset()
        if created:
            InteractiveShell.clear_instance()
