"""Model-scale local checks (issue 30, scope 2) and forward values (issue 32, scope 6).

* A float64 structural node (matmul, conv, pooling, softmax, indexing, views ...) is
  checked by the adjoint identity <u, J v> = <J^T u, v> over all its elements, ``J v``
  from a complex-step forward of the op's meaning: planted wrong backwards (a factor off
  by 0.1%, a wrong axis, a lost term) are still named, the layers of real models pass
  without falling back to the element-by-element SymPy replay, and nothing is sampled.
* Each node's recorded output is compared with its meaning at its recorded inputs, so a
  wrong forward kernel whose gradients are right is named too, in exact and local mode.

Small shapes: the model-sized timings are benchmarks/bench_verify_models.py's.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_verify_mutation as mut

import symgrad as sg
from symgrad.backends.cpu.backend import CpuBackend
from symgrad.ops import OPS

ADJOINT = "adjoint identity"


def _f64(shape, seed, requires_grad=True, dtype=None, scale=1.0):
    rng = np.random.default_rng(seed)
    x = sg.tensor(rng.standard_normal(shape) * scale, dtype=sg.float64)
    if requires_grad:
        x.requires_grad_(True)
    return x


# -- the mutation cases of test_verify_mutation, in float64 (the adjoint path) ------------
@pytest.mark.parametrize("case", sorted(mut.CASES))
def test_float64_mutation_is_named_by_the_fast_check(case, monkeypatch):
    op, input_name, wrong, build = mut.CASES[case]
    monkeypatch.setattr(mut, "_t", _f64)
    root, target_name = build()
    good = sg.verify(root, mode="local")
    assert good.ok, str(good)
    structural = not callable(OPS[op].sympy)
    if structural:  # the node of the op ran the fast check, over every element
        row = next(r for r in good.nodes if r.name == target_name)
        assert ADJOINT in row.formula, str(good)
        assert not row.sampled
    monkeypatch.setitem(OPS[op].grads, input_name, wrong)
    root, target_name = build()
    target = mut._find(root, target_name)
    for mode in ("local", "auto"):
        rep = sg.verify(root, mode=mode)
        assert not rep.ok, str(rep)
        assert rep.first_bad_node is target, str(rep)
        bad = [r for r in rep.nodes if r.status in ("mismatch", "error")]
        assert [r.node for r in bad] == [target], str(rep)


def test_a_single_element_off_by_a_thousandth_is_named():
    """A backward wrong in one element of a 40x30 gradient by 0.1% (what sampling 32
    elements would miss most of the time) is outside the adjoint identity's bound."""
    a, b = _f64((40, 20), 1), _f64((20, 30), 2)
    spec = OPS["mm"]
    right = spec.grads["mat2"]

    def one_off(grad, self, mat2_sym_sizes, mat2_sym_strides):
        g = right(grad, self, mat2_sym_sizes, mat2_sym_strides)
        bump = np.zeros(tuple(g.shape))
        bump[7, 11] = 1e-3 * float(g.detach().numpy()[7, 11])
        return g + sg.tensor(bump)

    root = (a @ b).tanh().sum()
    assert sg.verify(root, mode="local").ok
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(spec.grads, "mat2", one_off)
        root = (a @ b).tanh().sum()
        rep = sg.verify(root, mode="local")
    assert not rep.ok
    assert rep.first_bad_node.name() == "MmBackward0", str(rep)
    row = next(r for r in rep.nodes if r.name == "MmBackward0")
    assert "d/dmat2" in row.detail and ADJOINT in row.detail, row.detail


# -- large arrays: random factors a b^T instead of independent draws ----------------------
@pytest.fixture
def outer_everywhere(monkeypatch):
    """Every random array of two or more dims and 4+ elements drawn as an outer product
    (models' weights are; the mutation cases' small tensors are not otherwise)."""
    from symgrad.symbolic import _common

    monkeypatch.setattr(_common, "OUTER_FROM", 4)


@pytest.mark.parametrize("case", sorted(mut.CASES))
def test_mutation_is_named_with_outer_product_tangents(case, outer_everywhere, monkeypatch):
    op, input_name, wrong, build = mut.CASES[case]
    monkeypatch.setattr(mut, "_t", _f64)
    root, target_name = build()
    assert sg.verify(root, mode="local").ok
    monkeypatch.setitem(OPS[op].grads, input_name, wrong)
    root, target_name = build()
    target = mut._find(root, target_name)
    rep = sg.verify(root, mode="local")
    assert not rep.ok, str(rep)
    assert rep.first_bad_node is target, str(rep)
    assert [r.node for r in rep.nodes if r.status in ("mismatch", "error")] == [target]


def test_one_element_off_is_named_with_outer_product_tangents(outer_everywhere):
    test_a_single_element_off_by_a_thousandth_is_named()


@pytest.mark.parametrize("grad", ["mat1", "mat2", "self"])
def test_linear_layer_off_by_a_thousandth_is_named_via_rank_one_products(
        grad, outer_everywhere, monkeypatch):
    """A Linear layer (addmm of a transposed weight) whose backward is 0.1% off in one
    input: its check multiplies the outer-product tangents as matrix-vector products
    (never the dense h p q^T) and still names the input."""
    from symgrad.symbolic.adjoint import ComplexStepBackend

    used = []
    dense = ComplexStepBackend._matmul_outer

    def counting(a, b, fa, fb):
        used.append((fa is not None, fb is not None))
        return dense(a, b, fa, fb)

    monkeypatch.setattr(ComplexStepBackend, "_matmul_outer", staticmethod(counting))
    lin = sg.nn.Linear(12, 9).double()
    x = _f64((7, 12), 4)

    def build():
        return (lin(x).tanh() ** 2).sum()

    assert sg.verify(build(), mode="local").ok
    assert (True, True) in used  # the input and the weight both moved, both rank-1
    right = OPS["addmm"].grads[grad]
    monkeypatch.setitem(OPS["addmm"].grads, grad, lambda *a, **k: right(*a, **k) * 1.001)
    root = build()
    rep = sg.verify(root, mode="local")
    assert not rep.ok, str(rep)
    row = next(r for r in rep.nodes if r.name == "AddmmBackward0")
    assert row.status == "mismatch" and ADJOINT in row.detail, str(rep)
    assert rep.first_bad_node is row.node


@pytest.mark.parametrize("sa, sb", [((5, 4), (4, 3)), ((5, 4), (4,)), ((4,), (4, 3)),
                                     ((2, 5, 4), (4, 3)), ((5, 4), (2, 4, 3))])
@pytest.mark.parametrize("moved", ["a", "b", "ab"])
def test_rank_one_product_equals_the_dense_complex_product(sa, sb, moved):
    """The complex-step matmul with operands registered as ``x + i h p q^T`` gives the
    dense product's value and first-order tangent (batched and vector shapes too)."""
    from symgrad.symbolic.adjoint import ComplexStepBackend, H

    rng = np.random.default_rng(0)
    be = ComplexStepBackend()
    be.outer = {}

    def operand(shape, register):
        x = rng.standard_normal(shape)
        if not register or len(shape) != 2:
            return x + 0j * rng.standard_normal(shape)
        p, q = rng.standard_normal(shape[0]), rng.standard_normal(shape[1])
        z = np.empty(shape, dtype=complex)
        z.real, z.imag = x, H * np.outer(p, q)
        be.outer[id(z)] = (z, x, (p, q))
        return z

    a, b = operand(sa, "a" in moved), operand(sb, "b" in moved)
    got = be.matmul(a, b)
    want_val = a.real @ b.real
    want_tan = (a.imag / H) @ b.real + a.real @ (b.imag / H)
    assert got.shape == want_val.shape
    # two orders of the same sums: within float64 rounding of k-term dot products
    k = sa[-1]
    tol = 4 * k * np.finfo(np.float64).eps
    scale = np.abs(a.real) @ np.abs(b.real)
    assert np.all(np.abs(got.real - want_val) <= tol * scale)
    tscale = np.abs(a.imag / H) @ np.abs(b.real) + np.abs(a.real) @ np.abs(b.imag / H)
    assert np.all(np.abs(got.imag / H - want_tan) <= tol * tscale + 1e-300)


def test_random_uniform_outer_product_and_its_dot():
    from symgrad.symbolic._common import OUTER_FROM, outer_dot, random_uniform

    small, fac = random_uniform(np.random.default_rng(0), (3, 5))
    assert fac is None and small.shape == (3, 5) and np.all(np.abs(small) <= 1)
    shape = (64, OUTER_FROM // 64 + 1)
    for order in ("C", "F"):
        v, (a, b) = random_uniform(np.random.default_rng(1), shape, order)
        assert v.shape == shape and a.shape == (64,) and b.shape == (shape[1],)
        assert np.array_equal(v, np.multiply.outer(a, b))
        assert v.flags.f_contiguous if order == "F" else v.flags.c_contiguous
        e = np.random.default_rng(2).standard_normal(shape)
        e = np.asfortranarray(e) if order == "F" else e
        # a^T E b is <E, a b^T>, up to the rounding of two different sums
        want = float(np.vdot(e, v))
        bound = 4 * np.finfo(np.float64).eps * e.size * float(np.abs(e * v).sum())
        assert abs(outer_dot(e, (a, b)) - want) <= bound
    none, fac = random_uniform(np.random.default_rng(1), (4, OUTER_FROM), full=False)
    assert none is None and fac[0].shape == (4,)
    v3, (a, b) = random_uniform(np.random.default_rng(3), (4, 8, OUTER_FROM // 32 + 1))
    assert np.array_equal(v3.reshape(4, -1), np.multiply.outer(a, b))


# -- the layers of real models pass, each structural node by the fast check -----------------
def _small_cnn_and_attention():
    rng = np.random.default_rng(0)
    conv = sg.nn.Conv2d(2, 3, 3).double()
    lin = sg.nn.Linear(12, 5).double()
    x = sg.tensor(rng.standard_normal((2, 2, 6, 6)))
    h = sg.nn.functional.max_pool2d(conv(x).relu(), 2)
    logits = lin(h.flatten(1))
    loss1 = sg.nn.functional.cross_entropy(logits, sg.tensor([1, 3]))
    emb = sg.nn.Embedding(7, 8).double()
    ln = sg.nn.LayerNorm(8).double()
    qkv = sg.nn.Linear(8, 24).double()
    tok = sg.tensor(rng.integers(0, 7, (2, 4)))
    with sg.record():
        e = ln(emb(tok))
        q, k, v = qkv(e).split(8, dim=2)
        att = (q @ k.transpose(-2, -1)) * 8 ** -0.5
        mask = sg.tril(sg.ones(4, 4)) == 0
        att = sg.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        y = sg.nn.functional.gelu(att @ v)
        loss2 = (y * y).mean()
    return loss1 + loss2


def test_model_layers_pass_and_use_the_fast_check():
    root = _small_cnn_and_attention()
    rep = sg.verify(root, mode="local")
    assert rep.ok, str(rep)
    structural = [r for r in rep.nodes if "structural" in (r.formula or "")]
    assert structural
    slow = [r.name for r in structural if ADJOINT not in r.formula]
    assert not slow, slow  # every structural layer of these models took the fast path
    assert not any(r.sampled for r in rep.nodes)
    names = {r.name for r in structural}
    for want in ("ConvolutionBackward0", "MaxPool2DWithIndicesBackward0", "AddmmBackward0",
                 "NativeLayerNormBackward0", "SoftmaxBackward0", "MaskedFillBackward0",
                 "EmbeddingBackward0"):
        assert want in names, (want, sorted(names))


def test_float32_nodes_keep_the_element_check():
    """The adjoint identity's one scalar cannot bound float32 rounding per element, so
    float32 structural nodes keep the SymPy element check (sampled above 512 elements)."""
    a = sg.tensor(np.ones((3, 4), dtype=np.float32), requires_grad=True)
    b = sg.tensor(np.full((4, 2), 0.5, dtype=np.float32), requires_grad=True)
    rep = sg.verify((a @ b).sum(), mode="local")
    assert rep.ok
    row = next(r for r in rep.nodes if r.name == "MmBackward0")
    assert ADJOINT not in row.formula and "SymPy backend" in row.formula


# -- forward values: a wrong forward kernel is named ----------------------------------------
def _log1p_graph():
    rng = np.random.default_rng(3)
    x = sg.tensor(rng.uniform(0.1, 2.0, 16), requires_grad=True)
    w = sg.tensor(rng.standard_normal(16))
    y = x.log1p()
    return (y * w).sum(), y


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_wrong_log1p_kernel_is_named(mode, monkeypatch):
    root, _ = _log1p_graph()
    assert sg.verify(root, mode=mode).ok
    monkeypatch.setattr(CpuBackend, "log1p", staticmethod(lambda x: np.log(x)), raising=False)
    root, y = _log1p_graph()
    x = y.grad_fn._saved_self
    assert np.allclose(y.detach().numpy(), np.log(x.detach().numpy()))  # the plant took
    rep = sg.verify(root, mode=mode)
    assert not rep.ok, str(rep)
    assert rep.first_bad_node is y.grad_fn, str(rep)
    row = next(r for r in rep.nodes if r.node is y.grad_fn)
    assert row.status == "mismatch" and row.detail.startswith("forward:"), row.detail
    assert "forward" in str(rep)


def _elu_graph():
    rng = np.random.default_rng(4)
    x = sg.tensor(rng.standard_normal(20), requires_grad=True)
    w = sg.tensor(rng.standard_normal(20))
    y = sg.nn.functional.elu(x)
    return (y * w).sum(), y


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_expm1_replaced_by_exp_inside_elu_is_named(mode, monkeypatch):
    """elu's backward reads x, not its output: its gradients stay right, so only the
    forward check can see the wrong kernel."""
    root, _ = _elu_graph()
    assert sg.verify(root, mode=mode).ok
    right = CpuBackend.elu

    def wrong(x, alpha=1.0, scale=1.0, input_scale=1.0):
        out = right(x, alpha, scale, input_scale)
        return out + np.where(x > 0, 0.0, alpha * scale)  # exp(x) where expm1(x) belongs

    monkeypatch.setattr(CpuBackend, "elu", staticmethod(wrong))
    root, y = _elu_graph()
    x = y.grad_fn._saved_self.detach().numpy()
    assert np.allclose(y.detach().numpy(), np.where(x > 0, x, np.exp(x)))  # the plant took
    rep = sg.verify(root, mode=mode)
    assert not rep.ok, str(rep)
    assert rep.first_bad_node is y.grad_fn, str(rep)
    row = next(r for r in rep.nodes if r.node is y.grad_fn)
    assert row.detail.startswith("forward:"), row.detail
    assert [r.node for r in rep.nodes if r.status == "mismatch"] == [y.grad_fn]


def test_forward_check_runs_where_the_output_was_not_kept(monkeypatch):
    """Nobody holds log1p's output (the sum consumes it, the backward saves only x): the
    engine's kernel is run again on the recorded input and judged."""
    monkeypatch.setattr(CpuBackend, "log1p", staticmethod(lambda x: np.log(x)), raising=False)
    x = sg.tensor(np.linspace(0.5, 3.0, 12), requires_grad=True)
    root = x.log1p().sum()
    rep = sg.verify(root, mode="local")
    assert not rep.ok
    assert rep.first_bad_node.name() == "Log1PBackward0", str(rep)


def test_a_permutation_node_passes_exactly_and_a_wrong_one_is_still_named(monkeypatch):
    """t/view/permute... pass by exact equality (the meaning maps J^T u back onto u);
    a backward off in one element by one part in 1e9 breaks the equality, and the
    complex-step identity then names it."""
    c = _f64((7, 5), 2, requires_grad=False)

    def build():
        x = _f64((5, 7), 1)
        return (x.sin().t() * c).sum()

    good = sg.verify(build(), mode="local")
    assert good.ok, str(good)
    row = next(r for r in good.nodes if r.name == "TBackward0")
    assert "permutation" in row.formula and ADJOINT in row.formula, str(good)
    assert not row.sampled

    def wrong(grad):
        out = grad.t().clone()
        out[2, 3] = out[2, 3] * (1 + 1e-9)
        return out

    monkeypatch.setitem(OPS["t"].grads, "self", wrong)
    rep = sg.verify(build(), mode="local")
    assert not rep.ok, str(rep)
    bad = [r for r in rep.nodes if r.status in ("mismatch", "error")]
    assert [r.name for r in bad] == ["TBackward0"], str(rep)
    assert "permutation" not in bad[0].formula  # decided by the bounded identity


# -- the AccumulateGrad check hands the engine its own arrays -------------------------------
def test_accumulate_grad_scaling_its_input_in_place_is_named(monkeypatch):
    """Only under create_graph, the first gradient scaled by 0.999 in place before it is
    stored: named, although the check's gradients are windows of one shared pool and
    the engine is handed the second one itself (.grad is compared with values computed
    before the engine ran)."""
    from symgrad.autograd import engine

    right = engine._accumulate_into

    def scaled_in_place(variable, g, create_graph, shared):
        if create_graph and g is not None and variable._grad is None:
            g._data *= 0.999
        return right(variable, g, create_graph, shared)

    x = _f64((40, 30), 3)
    root = (x * x).sum()
    assert sg.verify(root, mode="local").ok
    monkeypatch.setattr(engine, "_accumulate_into", scaled_in_place)
    rep = sg.verify((x * x).sum(), mode="local")
    assert not rep.ok, str(rep)
    assert "AccumulateGrad into" in str(rep) and "(create_graph)" in str(rep), str(rep)
    assert type(rep.first_bad_node).__name__ == "AccumulateGrad"
