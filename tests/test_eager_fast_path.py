"""The straight-line apply (symgrad/autograd/fast_apply.py) against the general one.

Every eligible call must give the same tensor and the same node as ``_apply_general``:
every Tensor slot, the node's edges, input/output metadata, params and saved operands, and
the same gradients. Calls the straight line does not cover must reach the general path.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import symgrad as sg
from symgrad.autograd import function as fn_mod
from symgrad.autograd.record import record
from symgrad.ops.registry import OPS

TENSOR_SLOTS = ("_device", "_requires_grad", "_grad", "_output_nr", "_retains_grad", "_weak",
                "_backward_hooks", "name")
NODE_SLOTS = ("_input_meta", "_out_meta", "_freed", "_params")


def _inputs(kind: str, dtype):
    a = sg.tensor([[0.5, -1.5, 2.0], [1.0, 0.25, -0.75]], dtype=dtype, requires_grad=True)
    b = sg.tensor([[1.5, 0.5, -2.0], [0.5, 3.0, 1.25]], dtype=dtype)
    if kind == "both_grad":
        b.requires_grad_()
    elif kind == "scalar":
        b = 0.75
    elif kind == "int_scalar":
        b = 3
    elif kind == "broadcast":
        b = sg.tensor([1.5, 0.5, -2.0], dtype=dtype, requires_grad=True)
    elif kind == "non_leaf":
        a = a * 1.0
    return a, b


def _same_saved(x, y) -> None:
    assert type(x) is type(y)
    if isinstance(x, fn_mod.SavedTensor):
        assert x._tensor is y._tensor or np.array_equal(x.data, y.data)
        assert (x.output_nr, x.version) == (y.output_nr, y.version)
    elif isinstance(x, fn_mod._WrappedScalar):
        assert (x.value, x.dtype) == (y.value, y.dtype)
    else:
        assert x == y


def _same_result(fast, slow) -> None:
    assert type(fast) is type(slow)
    assert fast.dtype == slow.dtype and fast.shape == slow.shape
    np.testing.assert_array_equal(fast._data, slow._data)
    for s in TENSOR_SLOTS:
        assert getattr(fast, s) == getattr(slow, s), s
    assert fast._storage.nbytes == slow._storage.nbytes
    assert fast._storage.device_type == slow._storage.device_type
    assert fast._storage is not slow._storage
    nf, ns = fast.grad_fn, slow.grad_fn
    assert type(nf) is type(ns)
    if nf is None:
        return
    assert nf.next_functions == ns.next_functions
    for s in NODE_SLOTS:
        assert getattr(nf, s) == getattr(ns, s), s
    assert [type(r) for r in nf._input_refs] == [type(r) for r in ns._input_refs]
    assert nf._saved.keys() == ns._saved.keys()
    for k in nf._saved:
        _same_saved(nf._saved[k], ns._saved[k])


CASES = [(op, kind) for op in ("add", "sub", "mul", "div", "maximum", "atan2", "hypot")
         for kind in ("tensor", "both_grad", "broadcast", "non_leaf")] \
    + [(op, kind) for op in ("add", "sub", "mul", "div") for kind in ("scalar", "int_scalar")] \
    + [(op, "unary") for op in ("tanh", "exp", "sigmoid", "relu", "abs", "sqrt", "neg", "silu")]


@pytest.mark.parametrize("dtype", [sg.float32, sg.float64])
@pytest.mark.parametrize(("op", "kind"), CASES)
def test_fast_and_general_paths_make_the_same_tensor_and_node(op, kind, dtype):
    spec = OPS[op]
    a, b = _inputs("tensor" if kind == "unary" else kind, dtype)
    inputs = (a,) if kind == "unary" else (a, b)
    params = {"alpha": 1} if op in ("add", "sub") else None
    fast = fn_mod.apply(spec, inputs, None if params is None else dict(params))
    assert spec.__dict__["_run"].__name__ == "fast", "the op should have a straight line"
    slow = fn_mod._apply_general(spec, inputs, {} if params is None else dict(params))
    _same_result(fast, slow)
    # and the same gradients through either node
    g = sg.ones_like(fast) * 0.5
    leaves = [x for x in inputs if isinstance(x, sg.Tensor) and x.is_leaf and x.requires_grad]
    gf = sg.autograd.grad(fast, leaves, g, retain_graph=True)
    gs = sg.autograd.grad(slow, leaves, g)
    for x, y in zip(gf, gs):
        np.testing.assert_array_equal(x._data, y._data)


def _general_calls(monkeypatch) -> list:
    calls = []
    real = fn_mod._apply_general

    def counted(spec, inputs, params):
        calls.append(spec.name)
        return real(spec, inputs, params)

    monkeypatch.setattr(fn_mod, "_apply_general", counted)
    for spec in OPS.values():  # rebuild the straight lines around the counted general path
        spec.__dict__.pop("_run", None)
    return calls


def test_common_calls_never_reach_the_general_path(monkeypatch):
    calls = _general_calls(monkeypatch)
    a = sg.randn(4, 3, requires_grad=True)
    b = sg.randn(4, 3)
    ((a + b) * 2.0 - a.tanh() / (b.exp() + 1)).relu()
    assert calls == []
    monkeypatch.undo()
    for spec in OPS.values():
        spec.__dict__.pop("_run", None)


@pytest.mark.parametrize("call", [
    lambda a, i: a + i,                  # int64 tensor: promotion
    lambda a, i: i + i,                  # integer result
    lambda a, i: a + a.double(),         # mixed float dtypes
    lambda a, i: a + True,               # a bool number
])
def test_unusual_calls_take_the_general_path_and_match_torch_results(monkeypatch, call):
    calls = _general_calls(monkeypatch)
    a = sg.tensor([1.0, -2.0, 3.0], requires_grad=True)
    i = sg.tensor([1, 2, 3])
    out = call(a, i)
    assert calls, "expected the general path"
    torch = pytest.importorskip("torch", reason="torch 2.13 is the test oracle")
    ta = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    ti = torch.tensor([1, 2, 3])
    ref = call(ta, ti)
    assert str(out.dtype).split(".")[-1] == str(ref.dtype).split(".")[-1]
    np.testing.assert_array_equal(out.detach().numpy(), ref.detach().numpy())
    monkeypatch.undo()
    for spec in OPS.values():
        spec.__dict__.pop("_run", None)


def test_device_mismatch_is_reported_as_torch_does():
    a = sg.ones(3)
    b = sg.ones(3)
    b._device = sg.device("cuda")  # only the check is exercised: no kernel runs
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + b


def test_graph_of_fast_path_ops_is_freed_without_gc():
    gc.disable()
    try:
        a = sg.randn(5, requires_grad=True)
        y = (a * 2.0 + a).tanh()
        node = weakref.ref(y.grad_fn)
        acc = weakref.ref(y.grad_fn.next_functions[0][0].next_functions[0][0])
        del y
        assert node() is None
        assert acc() is None
    finally:
        gc.enable()


def test_record_mode_and_anomaly_mode_keep_their_behaviour():
    a = sg.randn(3, requires_grad=True)
    with record():
        y = a * 3.0
    assert y.grad_fn._input_refs[0] is a  # strong under record()
    z = a * 3.0
    assert z.grad_fn._input_refs[0]() is a  # weak otherwise
    with sg.autograd.detect_anomaly():
        w = a * 3.0
    assert "traceback_" in w.grad_fn.metadata
    assert "traceback_" not in z.grad_fn.metadata


def test_a_replaced_forward_is_used_by_the_fast_path(monkeypatch):
    spec = OPS["mul"]
    a = sg.tensor([1.0, 2.0])
    monkeypatch.setattr(spec, "forward", lambda be, x, y: be.add(x, y))
    assert (a * a).tolist() == [2.0, 4.0]
    monkeypatch.undo()
    assert (a * a).tolist() == [1.0, 4.0]


OPERATORS = [("add", lambda x, y: x + y, {"alpha": 1}), ("sub", lambda x, y: x - y, {"alpha": 1}),
             ("mul", lambda x, y: x * y, {}), ("div", lambda x, y: x / y, {})]


@pytest.mark.parametrize("dtype", [sg.float32, sg.float64])
@pytest.mark.parametrize("kind", ["tensor", "both_grad", "broadcast", "non_leaf", "scalar",
                                  "int_scalar"])
@pytest.mark.parametrize(("op", "call", "params"), OPERATORS, ids=[o[0] for o in OPERATORS])
def test_operators_make_the_same_tensor_and_node_as_the_general_path(op, call, params, kind,
                                                                       dtype):
    """``a + b`` runs the op's line as a Tensor method (tensor.py _install_operator_lines)."""
    a, b = _inputs(kind, dtype)
    fast = call(a, b)
    slow = fn_mod._apply_general(OPS[op], (a, b), dict(params))
    _same_result(fast, slow)


@pytest.mark.parametrize(("call", "op", "number", "params"), [
    (lambda a: 2.0 + a, "add", 2.0, {"alpha": 1}), (lambda a: 2 * a, "mul", 2, {})])
def test_reflected_operators_match_the_functional_form(call, op, number, params):
    a = sg.tensor([0.5, -1.5, 2.0], requires_grad=True)
    _same_result(call(a), fn_mod._apply_general(OPS[op], (a, number), params))


def test_operators_off_the_line_behave_as_the_functional_form():
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    out = a + np.float32(0.5)  # a NumPy scalar: the functional form converts it
    np.testing.assert_array_equal(out._data, np.array([1.5, 2.5], np.float32))
    assert out.grad_fn.name() == "AddBackward0"
    with pytest.raises(TypeError) as via_operator:
        a + "x"
    with pytest.raises(TypeError) as via_function:
        sg.add(a, "x")
    assert str(via_operator.value) == str(via_function.value)
    i = sg.tensor([1, 2])
    assert (i * i).dtype == sg.int64 and (i * i).tolist() == [1, 4]


def test_operators_are_seen_by_the_profiler():
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    with sg.autograd.profiler.profile() as prof:
        ((a + a) * a - a / a).sum()
    names = [e.name for e in prof.function_events]
    for op in ("add", "mul", "sub", "div"):
        assert f"symgrad::{op}" in names, names


def test_small_arrays_skip_the_parallel_loop_and_large_ones_take_it(monkeypatch):
    """The line calls the CPU backend's NumPy reference below PARALLEL_MIN elements (read
    per call) and the backend's kernel, with its parallel loop, from there on."""
    from symgrad.backends.cpu import backend as cpu_module

    monkeypatch.setitem(fn_mod._DEVICE_DEFAULT, "cpu", "cpu")  # the Numba backend, always
    loops = []
    real = cpu_module._run
    monkeypatch.setattr(cpu_module, "_run", lambda *args: (loops.append(args[0]),
                                                           real(*args))[1])
    a = sg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = sg.tensor([4.0, 5.0, 6.0])
    small = (a + b, a * b, a.relu(), sg.add(a, b))
    assert loops == []
    monkeypatch.setattr(cpu_module, "PARALLEL_MIN", 2)
    large = (a + b, a * b, a.relu(), sg.add(a, b))
    assert loops == ["add_f", "mul_f", "relu_f", "add_f"]
    for s, g in zip(small, large):
        np.testing.assert_array_equal(s._data, g._data)
        assert type(s.grad_fn) is type(g.grad_fn)


def test_memory_is_counted_as_by_the_general_path():
    a = sg.randn(64, requires_grad=True)
    before = sg.memory_allocated()
    fast = a * 2.0
    after_fast = sg.memory_allocated()
    slow = fn_mod._apply_general(OPS["mul"], (a, 2.0), {})
    assert after_fast - before == sg.memory_allocated() - after_fast == fast._data.nbytes
    assert sg.max_memory_allocated() >= sg.memory_allocated()
    del fast, slow
    assert sg.memory_allocated() == before


# -- one-input view ops (function._view_entry) -----------------------------------------------
VIEW_CASES = [("view", {"size": (3, 2)}), ("view", {"size": (6,)}), ("t", {}),
              ("transpose", {"dim0": 0, "dim1": 1}), ("expand", {"size": (4, 2, 3)}),
              ("unsqueeze", {"dim": 1}), ("permute", {"dims": (1, 0)}),
              ("unsafe_view", {"size": (3, 2)})]


@pytest.mark.parametrize("dtype", [sg.float32, sg.float64])
@pytest.mark.parametrize("leaf", [True, False])
@pytest.mark.parametrize(("op", "params"), VIEW_CASES, ids=[f"{c[0]}{c[1]}" for c in VIEW_CASES])
def test_view_line_and_general_path_make_the_same_view_and_node(op, params, leaf, dtype):
    from symgrad import _inplace_views

    spec = OPS[op]
    a = sg.tensor([[0.5, -1.5, 2.0], [1.0, 0.25, -0.75]], dtype=dtype, requires_grad=True)
    x = a if leaf else a * 1.0
    fast = fn_mod.apply(spec, (x,), dict(params))
    assert spec.__dict__["_run"].__name__ == "run" and spec.__dict__["_run"].__qualname__ \
        .startswith("_view_entry"), "the view op should have its straight line"
    slow = fn_mod._apply_general(spec, (x,), dict(params))
    assert type(fast) is type(slow) and fast.shape == slow.shape and fast.dtype == slow.dtype
    np.testing.assert_array_equal(fast._data, slow._data)
    for s in TENSOR_SLOTS:
        if s != "_weak":  # note_view gave both a weak reference to themselves
            assert getattr(fast, s) == getattr(slow, s), s
    assert fast._storage is slow._storage is x._storage  # both view the input's memory
    nf, ns = fast.grad_fn, slow.grad_fn
    assert type(nf) is type(ns) and nf.name() == ns.name()
    assert nf.next_functions == ns.next_functions
    for s in NODE_SLOTS:
        assert getattr(nf, s) == getattr(ns, s), s
    assert [r() for r in nf._input_refs] == [r() for r in ns._input_refs] == [x]
    assert nf._saved.keys() == ns._saved.keys()
    for k in nf._saved:
        _same_saved(nf._saved[k], ns._saved[k])
    assert nf._module_call == ns._module_call and nf._sequence_nr < ns._sequence_nr
    noted = [w() for w in _inplace_views.MADE.get(id(x._storage), ())]
    assert any(v is fast for v in noted) and any(v is slow for v in noted)
    g = sg.ones_like(fast) * 0.5
    gf = sg.autograd.grad(fast, [a], g, retain_graph=True)
    gs = sg.autograd.grad(slow, [a], g)
    np.testing.assert_array_equal(gf[0]._data, gs[0]._data)


def test_view_line_keeps_errors_no_grad_and_the_general_cases(monkeypatch):
    a = sg.randn(2, 3, requires_grad=True)
    with sg.no_grad():
        v = a.view(3, 2)
    assert v.grad_fn is None and not v.requires_grad and v._storage is a._storage
    with pytest.raises(RuntimeError, match="shape '\\[4, 2\\]' is invalid for input of size 6"):
        a.view(4, 2)
    with pytest.raises(IndexError):
        a.transpose(0, 5)
    calls = _general_calls(monkeypatch)
    a.view(3, 2), a.t(), a.transpose(0, 1), a.unsqueeze(0), a.expand(2, 2, 3)
    assert calls == []
    i = sg.tensor([[1, 2], [3, 4]])
    assert i.t().tolist() == [[1, 3], [2, 4]] and i.view(4).dtype == sg.int64
    with record():
        r = a.view(6)
    assert r.grad_fn._input_refs[0] is a  # strong under record()
    with sg.autograd.detect_anomaly():
        w = a.view(6)
    assert "traceback_" in w.grad_fn.metadata
    monkeypatch.undo()
    for spec in OPS.values():
        spec.__dict__.pop("_run", None)


def test_view_line_graph_is_freed_without_gc():
    gc.disable()
    try:
        a = sg.randn(2, 3, requires_grad=True)
        y = a.t().reshape(6)
        node = weakref.ref(y.grad_fn)
        del y
        assert node() is None
    finally:
        gc.enable()


# -- backwards of view ops on arrays (node._ARRAY_RULES) -------------------------------------
@pytest.mark.parametrize("make", [
    lambda x: x.view(6, 4).t(),                     # ViewBackward0, TBackward0
    lambda x: x.transpose(0, 2).reshape(4, 6),      # TransposeBackward0 + a copy (unsafe_view)
    lambda x: x.transpose(-1, -3),                  # negative dims
    lambda x: x.permute(2, 0, 1).reshape(2, 12),    # reshape_alias or unsafe_view
    lambda x: x.unsqueeze(0).squeeze(),             # squeeze_all
])
def test_view_backwards_on_arrays_match_the_formulas(monkeypatch, make):
    """Each structural node's array rule gives the gradient its formula gives (with a
    planted replacement the formulas are no longer pristine and run instead)."""
    from symgrad.autograd import node as node_mod

    a = sg.randn(2, 3, 4, requires_grad=True)
    y = make(a * 1.0)
    g = sg.randn(*y.shape)
    names = set()
    n = y.grad_fn
    while n is not None and hasattr(n, "_spec"):
        names.add(type(n)._spec.name)
        n = n.next_functions[0][0]
    assert names & set(node_mod._ARRAY_RULES)
    calls = []
    real = node_mod.OpNode._apply_array_rule
    monkeypatch.setattr(node_mod.OpNode, "_apply_array_rule",
                        lambda self, *args: (calls.append(type(self).__name__),
                                             real(self, *args))[1])
    (fast,) = sg.autograd.grad(y, [a], g, retain_graph=True)
    assert calls, "the array rules should have run"
    monkeypatch.undo()
    for name in names & set(node_mod._ARRAY_RULES):  # force the formulas
        monkeypatch.setattr(node_mod._NODE_CLASSES[name], "_array_rule", None)
    (slow,) = sg.autograd.grad(y, [a], g)
    np.testing.assert_array_equal(fast._data, slow._data)


def test_view_backward_keeps_the_incoming_buffer_shared():
    """A view's gradient that views the incoming one keeps its storage: the leaf's .grad
    then is a copy, never the caller's buffer (the engine's aliasing rule)."""
    a = sg.randn(3, 4, requires_grad=True)
    g = sg.randn(4, 3)
    a.t().backward(g)
    assert a.grad._storage is not g._storage
    np.testing.assert_array_equal(a.grad._data, g._data.T)
    g._data[...] = 0.0
    assert np.abs(a.grad._data).sum() > 0


def test_linear_on_3d_input_makes_torchs_graph_through_the_short_route():
    """nn.functional.linear of a contiguous >2-D input: view to rows, addmm over t(weight),
    view back (torch's graph), with the same values as matmul + bias."""
    sg.manual_seed(0)
    x = sg.randn(2, 3, 4, 5, requires_grad=True)
    w = sg.randn(6, 5, requires_grad=True)
    b = sg.randn(6, requires_grad=True)
    y = sg.nn.functional.linear(x, w, b)
    assert y.shape == (2, 3, 4, 6)
    assert y.grad_fn.name() == "ViewBackward0" and y.grad_fn._params == {"size": (2, 3, 4, 6)}
    addmm = y.grad_fn.next_functions[0][0]
    assert addmm.name() == "AddmmBackward0"
    assert [n.name() for n, _ in addmm.next_functions] == ["AccumulateGrad", "ViewBackward0",
                                                            "TBackward0"]
    assert addmm.next_functions[1][0]._params == {"size": (24, 5)}
    ref = (x._data @ w._data.T + b._data)
    np.testing.assert_allclose(y._data, ref, rtol=1e-5, atol=1e-6)
    y.sum().backward()
    np.testing.assert_allclose(x.grad._data, np.broadcast_to(w._data.sum(0), x.shape),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        sg.nn.functional.linear(x, sg.randn(6, 4), b)
