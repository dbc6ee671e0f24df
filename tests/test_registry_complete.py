"""Complete by construction: every registered op has every facet on every backend.

One walk over the op registry and the backends (numpy, cpu, cuda under the simulator,
sympy). A missing facet fails with the op's name and the facet:

* forward kernel: each ``be.<kernel>`` the op's forward calls (read from its source,
  following ``getattr(be, name)`` through closures and helpers called with ``be``) exists
  on every backend
* backward formula: one per differentiable input (``check_complete``)
* fused kernel: where the op declares ``fused_backward``, every fused backend has it
* SymPy meaning: differentiable ops carry one (callable or STRUCTURAL)
* grad_fn name: torch's (tests/data/torch_grad_fn_names.tsv, or a node class of the
  installed torch's autograd), or listed in SYMGRAD_ONLY_GRAD_FNS
* torch parity case: drawn by tests/test_random_programs.py, or compared with torch by the
  test PARITY_ELSEWHERE names (which must exist)
* audit example: differentiable ops have an entry in symgrad.symbolic.audit.EXAMPLES

Gaps known today are listed in KNOWN_GAPS with the reason; a listed gap that is filled
fails too, so the list only shrinks.
"""

from __future__ import annotations

import csv
import importlib
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import symgrad as sg  # noqa: F401  (fills the registry)
from symgrad.backends import get_backend
from symgrad.ops import OPS, STRUCTURAL, OpSpec, check_complete
from symgrad.ops.registry import register

TESTS = pathlib.Path(__file__).resolve().parent
TSV = TESTS / "data" / "torch_grad_fn_names.tsv"

#: Backends with fused backward kernels (``OpSpec.fused_backward``); the NumPy reference and
#: the SymPy replay always run the tensor-op formulas.
FUSED_BACKENDS = ("cpu", "cuda")

#: grad_fn names symgrad prints that torch has no node for (none today).
SYMGRAD_ONLY_GRAD_FNS: dict[str, str] = {}

#: Ops the random programs do not draw (test_random_programs.NOT_DRAWN_HERE), and the test
#: that compares each with torch: ``file::test function`` (which must exist).
_LOSSES = "test_losses_api.py::test_loss_values_grads_and_graph_match_torch"
_INPLACE = "test_inplace.py::test_inplace_on_non_leaf_rebases_grad_fn_like_torch"
_INIT = "test_tensor_api.py::test_initialiser_on_a_non_leaf_records_torch_node_with_zero_gradient"
PARITY_ELSEWHERE = {
    "addmm": "test_nn.py::test_linear_matches_torch_on_every_input_rank",
    "mse_loss": _LOSSES, "binary_cross_entropy": _LOSSES,
    "binary_cross_entropy_with_logits": _LOSSES, "nll_loss": _LOSSES,
    "nll_loss2d": "test_torch_surface.py::test_nll_loss_nd_matches_torch",
    "as_strided_region": "test_inplace_views.py::test_inplace_on_view_matches_torch",
    "copy_": _INPLACE, "fill_": _INPLACE, "fill_tensor_": _INPLACE, "zero_": _INPLACE,
    "uniform_": _INIT, "normal_": _INIT, "random_": _INIT, "random_to_": _INIT,
    "random_from_to_": _INIT, "bernoulli_": _INIT, "bernoulli_tensor_": _INIT,
    "scaled_dot_product_flash_attention_for_cpu":
        "test_sdpa_fused.py::test_fused_node_values_saved_and_gradients_match_torch",
    "exponential_": _INIT, "log_normal_": _INIT, "cauchy_": _INIT, "geometric_": _INIT,
}

#: (op, facet) gaps known today, with the reason. Keep it short; it may only shrink.
KNOWN_GAPS: dict[tuple[str, str], str] = {
    ("to_cuda", "parity"): "the oracle torch is CPU-only; tests/cuda/test_cuda_parity.py "
                           "compares the cuda backend with symgrad's cpu instead",
    ("to_cpu", "parity"): "as to_cuda",
    ("to_cuda", "audit"): "no entry in symgrad/symbolic/audit.py EXAMPLES (a copy across "
                          "devices; audit.py belongs to the verifier work)",
    ("to_cpu", "audit"): "as to_cuda",
}


# -- the facets -------------------------------------------------------------------------------
def kernels_of(fn, _seen=None) -> set[str]:
    """Backend kernels ``fn(be, ...)`` calls: ``be.<name>``, ``getattr(be, <var>)`` with the
    variable read from the closure or module, and those of helpers it hands ``be`` to."""
    seen = _seen if _seen is not None else set()
    if fn in seen or not inspect.isfunction(fn):
        return set()
    seen.add(fn)
    code = fn.__code__
    params = code.co_varnames[:code.co_argcount]
    if not params:
        return set()
    be = params[0]
    try:
        src = inspect.getsource(fn)
    except OSError:
        return set()
    env = {**fn.__globals__, **inspect.getclosurevars(fn).nonlocals}
    names = set(re.findall(rf"(?<![\w.]){be}\.(\w+)", src))
    for var in re.findall(rf"getattr\({be},\s*(\w+)\)", src):
        value = env.get(var)
        names.add(value if isinstance(value, str) else f"<getattr {var}: unresolved>")
    for helper in re.findall(rf"(?<![\w.])(\w+)\({be}\b", src):
        names |= kernels_of(env.get(helper), seen)
    return names - {"name", "device_type"}


def _tsv_grad_fns() -> set[str]:
    with open(TSV, newline="") as fh:
        return {row[1] for row in csv.reader(fh, delimiter="\t") if len(row) > 1}


def _torch_grad_fns() -> set[str]:
    try:
        import torch
    except ImportError:
        return set()
    return {n for n in dir(torch._C._functions) if n[:1].isupper()}


def _drawn_ops() -> set[str]:
    try:
        return set(importlib.import_module("test_random_programs").GENERATORS)
    except pytest.skip.Exception:  # hypothesis or torch missing: only the listed files count
        return set()


def _audit_examples() -> set[str]:
    from symgrad.symbolic.audit import EXAMPLES

    return set(EXAMPLES)


def backends() -> dict[str, object]:
    out = {"numpy": get_backend("numpy"), "cpu": get_backend("cpu")}
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        from symgrad.backends.cuda import CudaBackend

        out["cuda"] = CudaBackend()
    from symgrad.backends.sympy_backend import SympyBackend

    out["sympy"] = SympyBackend()
    return out


class Coverage:
    """What the tests and the torch reference cover, gathered once."""

    def __init__(self):
        self.grad_fns = _tsv_grad_fns() | _torch_grad_fns() | set(SYMGRAD_ONLY_GRAD_FNS)
        self.drawn = _drawn_ops()
        self.examples = _audit_examples()
        self.parity_tests = {ref for ref in set(PARITY_ELSEWHERE.values()) if _defines(ref)}


def _defines(ref: str) -> bool:
    """``file::test_name`` names a test function that exists."""
    path, _, func = ref.partition("::")
    file = TESTS / path
    if not file.exists():
        return False
    return re.search(rf"^def {re.escape(func)}\(", file.read_text(), re.M) is not None


def missing_facets(name: str, spec: OpSpec, bes: dict, cov: Coverage) -> list[tuple[str, str]]:
    """(facet key, message) for every facet ``spec`` lacks; empty when it is complete."""
    out = []
    for problem in check_complete(spec):
        key = "sympy" if problem.startswith("sympy") else \
            "backward" if problem.startswith("backward") else problem
        out.append((key, problem))
    kernels = kernels_of(spec.forward)
    for be_name, be in bes.items():
        for k in sorted(kernels):
            if not hasattr(be, k):
                out.append((f"forward:{be_name}",
                            f"forward kernel {k!r} on the {be_name} backend"))
        fused = spec.fused_backward
        if fused and be_name in FUSED_BACKENDS and not hasattr(be, fused):
            out.append((f"fused:{be_name}",
                        f"fused kernel {spec.fused_backward!r} on the {be_name} backend"))
    if spec.differentiable:
        if spec.grad_fn not in cov.grad_fns:
            out.append(("grad_fn", f"grad_fn name {spec.grad_fn!r} (neither in "
                        f"{TSV.name} nor a torch autograd node, nor SYMGRAD_ONLY_GRAD_FNS)"))
        if name not in cov.drawn and PARITY_ELSEWHERE.get(name) not in cov.parity_tests:
            out.append(("parity", "torch parity case (no generator in test_random_programs."
                        "GENERATORS, no existing PARITY_ELSEWHERE test)"))
        if name not in cov.examples:
            out.append(("audit", "audit example (symgrad.symbolic.audit.EXAMPLES)"))
    return out


def _message(name, gaps) -> str:
    return "\n".join(f"op {name!r}: missing {msg}" for _, msg in gaps)


# -- the tests --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world():
    return backends(), Coverage()


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_is_complete_on_every_backend(name, world):
    bes, cov = world
    gaps = [g for g in missing_facets(name, OPS[name], bes, cov)
            if (name, g[0]) not in KNOWN_GAPS]
    assert not gaps, _message(name, gaps)


def test_known_gaps_are_still_gaps(world):
    bes, cov = world
    walked = [(op, facet) for op, facet in KNOWN_GAPS
              if facet.partition(":")[2] in ("", *bes)]  # cuda's only under the simulator
    filled = [(op, facet) for op, facet in walked if op not in OPS
              or facet not in {k for k, _ in missing_facets(op, OPS[op], bes, cov)}]
    assert not filled, f"filled since listed, remove from KNOWN_GAPS: {filled}"


def test_the_walk_covers_every_backend():
    names = set(backends())
    assert {"numpy", "cpu", "sympy"} <= names
    # cuda is in this process's walk only under the simulator; elsewhere the next test walks
    # it in a child process that has the simulator
    assert ("cuda" in names) == (os.environ.get("NUMBA_ENABLE_CUDASIM") == "1")


def test_every_op_is_complete_on_the_cuda_backend_under_the_simulator():
    """The cuda walk runs in a child process that has the simulator switched on (it must be
    set before numba loads, so this process, which loaded numba without it, cannot)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import test_registry_complete as t;"
        "bes = {'cuda': t.backends()['cuda']}; cov = t.Coverage();"
        "print(json.dumps([[n, k, m] for n, s in sorted(t.OPS.items())"
        " for k, m in t.missing_facets(n, s, bes, cov) if k.endswith(':cuda')]))")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    res = subprocess.run([sys.executable, "-c", code, str(TESTS)], capture_output=True,
                         text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    gaps = [(n, m) for n, k, m in json.loads(res.stdout.strip().splitlines()[-1])
            if (n, k) not in KNOWN_GAPS]
    assert not gaps, "\n".join(f"op {n!r}: missing {m}" for n, m in gaps)


def test_kernels_are_read_through_getattr_closures_and_helpers():
    assert kernels_of(OPS["mul"].forward) == {"mul"}  # getattr(be, kernel), kernel in a closure
    assert "index_put" in kernels_of(OPS["copy_slices"].forward)  # via write_region(be, ...)
    assert not any(k.startswith("<") for s in OPS.values() for k in kernels_of(s.forward))


def test_an_incomplete_op_is_named_with_each_missing_facet(world):
    """A stanza registered without its facets fails by name (and is removed again)."""
    bes, cov = world

    def forward(be, self):
        return be.softplus_kernel_nobody_wrote(self)

    spec = OpSpec("softplus_draft", "SoftplusBackward0", ("self", "beta"), forward,
                  {"self": lambda grad, self: grad * self.sigmoid()}, None,
                  fused_backward="softplus_draft_backward")
    register(spec)
    try:
        msg = _message("softplus_draft", missing_facets("softplus_draft", spec, bes, cov))
    finally:
        del OPS["softplus_draft"]
    for be_name in bes:
        assert (f"op 'softplus_draft': missing forward kernel 'softplus_kernel_nobody_wrote' "
                f"on the {be_name} backend") in msg
    assert "op 'softplus_draft': missing backward formula for ['beta']" in msg
    assert "op 'softplus_draft': missing sympy meaning" in msg
    assert "op 'softplus_draft': missing fused kernel 'softplus_draft_backward' on the cpu" in msg
    assert "op 'softplus_draft': missing torch parity case" in msg
    assert "op 'softplus_draft': missing audit example" in msg
    assert "softplus_draft" not in OPS

    wrong_name = OpSpec("exp_draft", "ExpBackwardZero", ("self",),
                        lambda be, self: be.exp(self),
                        {"self": lambda grad, result: grad * result}, STRUCTURAL)
    msg = _message("exp_draft", missing_facets("exp_draft", wrong_name, bes, cov))
    assert "op 'exp_draft': missing grad_fn name 'ExpBackwardZero'" in msg
    assert "forward kernel" not in msg
