"""Engine behaviour users rely on: accumulation, retain_graph, inputs=, grad modes, errors,
memory and weak references, and deep graphs. PyTorch is the oracle where it has the behaviour."""

from __future__ import annotations

import threading
import warnings
import weakref

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg

# Gradients below that are sums and products of small integers are exact in float32 and
# compared exactly; the others are bounded by tests/_tolerance.py.


def test_accumulates_with_retain_graph_and_zero_resets():
    a = sg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    loss = (a * a).sum()
    loss.backward(retain_graph=True)
    first = a.grad
    np.testing.assert_array_equal(first.numpy(), [2.0, 4.0, 6.0])
    loss.backward(retain_graph=True)
    assert a.grad is first  # accumulated in place, like torch
    np.testing.assert_array_equal(a.grad.numpy(), [4.0, 8.0, 12.0])
    a.grad.zero_()
    loss.backward()
    np.testing.assert_array_equal(a.grad.numpy(), [2.0, 4.0, 6.0])


def test_second_backward_through_freed_graph_raises_like_torch(torch):
    for lib in (sg, torch):
        a = lib.tensor([1.0, 2.0], requires_grad=True)
        loss = (a.exp() * a).sum()
        loss.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            loss.backward()
        with pytest.raises(RuntimeError, match="a second time"):
            loss.grad_fn.next_functions[0][0]._saved_self  # noqa: B018


def test_graph_without_saved_tensors_can_backward_twice(torch):
    for lib in (sg, torch):
        a = lib.tensor([1.0, 2.0], requires_grad=True)
        c = (a + a).sum()
        c.backward()
        c.backward()
        np.testing.assert_array_equal(a.grad.numpy(), [4.0, 4.0])


def test_explicit_gradient_for_non_scalar_matches_torch(torch):
    v = np.array([[0.5, -1.0, 2.0], [1.0, 0.0, 3.0]], dtype=np.float32)
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
    grads = []
    for lib in (sg, torch):
        a = lib.tensor(x, requires_grad=True)
        y = a.sin() * 3
        with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar"):
            y.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="Mismatch in shape"):
            y.backward(lib.tensor(v[0]), retain_graph=True)
        y.backward(lib.tensor(v))
        grads.append(a.grad.numpy())
    assert_close(grads[0], grads[1], terms=4)  # v * 3 * cos(x): cos (2) and two products


def test_user_gradient_is_not_aliased_into_grad():
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    b = sg.tensor([3.0, 4.0], requires_grad=True)
    v = sg.tensor([1.0, 1.0])
    (a + b).backward(v)
    a.grad.zero_()
    np.testing.assert_array_equal(v.numpy(), [1.0, 1.0])
    np.testing.assert_array_equal(b.grad.numpy(), [1.0, 1.0])


def _count_runs(root):
    """Attach a pre-hook to every node below ``root``; return the dict of run counts."""
    counts = {}
    stack, seen = [root.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        counts[node] = 0

        def hook(grads, node=node):
            counts[node] += 1

        node.register_prehook(hook)
        stack.extend(n for n, _ in node.next_functions)
    return counts


def test_backward_inputs_runs_only_the_nodes_those_inputs_need(torch):
    a = sg.tensor([0.5, 1.0], requires_grad=True)
    b = sg.tensor([2.0, 3.0], requires_grad=True)
    y = ((a * 2).exp() + (b * 3).sin()).sum()
    counts = _count_runs(y)
    y.backward(inputs=[a])
    ran = sorted(n.name() for n, c in counts.items() if c)
    assert ran == ["AccumulateGrad", "AddBackward0", "ExpBackward0", "MulBackward0",
                   "SumBackward0"]
    assert b.grad is None
    ta = torch.tensor([0.5, 1.0], requires_grad=True)
    tb = torch.tensor([2.0, 3.0], requires_grad=True)
    ((ta * 2).exp() + (tb * 3).sin()).sum().backward(inputs=[ta])
    assert_close(a.grad, ta.grad, terms=3)  # 2 * exp(2 a): exp (2), one product
    assert tb.grad is None


def test_backward_inputs_accepts_non_leaf_and_autograd_grad_leaves_grad_alone():
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    h = a * 3
    y = (h * h).sum()
    y.backward(inputs=[h], retain_graph=True)
    np.testing.assert_array_equal(h.grad.numpy(), [6.0, 12.0])
    assert a.grad is None
    (ga,) = sg.autograd.grad(y, a)
    np.testing.assert_array_equal(ga.numpy(), [18.0, 36.0])
    assert a.grad is None


def test_autograd_grad_unused_and_create_graph(torch):
    a = sg.tensor(2.0, requires_grad=True)
    b = sg.tensor(3.0, requires_grad=True)
    y = a ** 3
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        sg.autograd.grad(y, [a, b], retain_graph=True)
    ga, gb = sg.autograd.grad(y, [a, b], allow_unused=True, create_graph=True)
    # 3 a ** 2 and 6 a through pow and products (float32; .item() is a Python float)
    assert gb is None
    assert_close(ga.item(), 12.0, terms=3, dtype=np.float32)
    (gga,) = sg.autograd.grad(ga, a)
    assert_close(gga.item(), 12.0, terms=4, dtype=np.float32)  # d2/da2 a^3 = 6a


def test_retain_grad_and_non_leaf_grad_warning(torch):
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    h = a.exp()
    h.retain_grad()
    assert h.retains_grad and not a.retains_grad
    z = a * 2
    (h.sum() + z.sum()).backward()
    np.testing.assert_array_equal(h.grad.numpy(), [1.0, 1.0])
    with pytest.warns(UserWarning, match="not a leaf Tensor"):
        assert z.grad is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert a.grad is not None


def test_requires_grad_rules_match_torch(torch):
    for lib in (sg, torch):
        a = lib.tensor([1.0, 2.0], requires_grad=True)
        b = a * 2
        with pytest.raises(RuntimeError, match="only change requires_grad flags of leaf"):
            b.requires_grad = False
        with pytest.raises(RuntimeError, match="floating point"):
            lib.tensor([1, 2]).requires_grad_()
        with pytest.raises(RuntimeError,
                           match="Can't call numpy\\(\\) on Tensor that requires grad"):
            a.numpy()
        c = lib.tensor([1.0])
        c.requires_grad = True
        assert c.is_leaf and c.requires_grad
        assert b.is_leaf is False and (b * 0).requires_grad
        with pytest.raises(RuntimeError, match="does not require grad"):
            lib.tensor([1.0]).sum().backward()


def test_detach_clone_and_no_grad():
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    d = a.detach()
    assert not d.requires_grad and d.grad_fn is None
    assert d._storage is a._storage  # shares data, like torch
    c = a.clone()
    assert c.grad_fn.name() == "CloneBackward0" and c._storage is not a._storage
    with sg.no_grad():
        n = a * 2
        assert not sg.is_grad_enabled()
        with sg.enable_grad():
            assert (a * 2).requires_grad
    assert n.grad_fn is None and not n.requires_grad and sg.is_grad_enabled()
    with sg.inference_mode():
        assert not (a * 2).requires_grad
    with sg.set_grad_enabled(False):
        assert not (a * 2).requires_grad
    assert sg.is_grad_enabled()

    @sg.no_grad()
    def f(x):
        return x * 2

    @sg.no_grad
    def g(x):
        return x * 2

    assert not f(a).requires_grad and not g(a).requires_grad
    e = a * 1
    e.detach_()
    assert e.grad_fn is None and not e.requires_grad


def test_grad_mode_is_thread_local():
    seen = {}

    def worker():
        seen["thread"] = sg.is_grad_enabled()

    with sg.no_grad():
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert not sg.is_grad_enabled()
    assert seen["thread"] is True


def test_memory_returns_to_baseline_and_graph_dies_without_gc(no_gc):
    base = sg.memory_allocated()
    w = sg.randn(64, 32, requires_grad=True)
    x = sg.randn(16, 64)
    after_params = sg.memory_allocated()
    assert after_params - base == (64 * 32 + 16 * 64) * 4
    h = (x @ w).tanh()
    loss = (h * h).mean()
    node_ref = weakref.ref(loss.grad_fn)
    h_ref = weakref.ref(h)
    loss.backward()
    assert w.grad is not None
    del h, loss
    assert node_ref() is None and h_ref() is None
    assert sg.memory_allocated() - base == (64 * 32 * 2 + 16 * 64) * 4  # w, w.grad, x
    del w, x
    assert sg.memory_allocated() == base  # freed by reference counting: the collector is off


def test_views_share_storage_in_memory_accounting(no_gc):
    base = sg.memory_allocated()
    a = sg.zeros(10, 10)
    v = a.reshape(100)
    t = a.t()
    assert v._storage is a._storage and t._storage is a._storage
    assert sg.memory_allocated() - base == 400
    del a, v, t
    assert sg.memory_allocated() == base


def test_weakrefs_to_all_inputs_do_not_keep_tensors_alive(no_gc):
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    b = sg.tensor([3.0, 4.0])  # not saved by a + b
    c = a + b
    refs = c.grad_fn._input_refs
    assert refs[0]() is a and refs[1]() is b
    del b
    assert refs[1]() is None


def test_hundred_thousand_node_chain(no_gc):
    a = sg.tensor(1.0, requires_grad=True)
    x = a
    for _ in range(100_000):
        x = x * 1.0
    x.backward()
    assert a.grad.item() == 1.0
    ref = weakref.ref(x.grad_fn)
    del x  # freeing a deep graph must not overflow the C stack
    assert ref() is None


def test_errors_for_shapes_and_devices(torch):
    for lib in (sg, torch):
        with pytest.raises(RuntimeError, match=r"size of tensor a \(3\) must match the size of "
                                               r"tensor b \(4\) at non-singleton dimension 1"):
            lib.ones(2, 3) + lib.ones(2, 4)
        with pytest.raises(RuntimeError, match=r"shapes cannot be multiplied \(2x3 and 4x5\)"):
            lib.ones(2, 3) @ lib.ones(4, 5)
        with pytest.raises(RuntimeError, match="is invalid for input of size 6"):
            lib.ones(2, 3).reshape(4)
    if not sg.cuda.is_available():  # with a GPU (or the simulator) the move works instead
        with pytest.raises(RuntimeError, match="NUMBA_ENABLE_CUDASIM"):
            sg.ones(2).to("cuda")


def test_integer_outputs_cannot_be_differentiated():
    with pytest.raises(RuntimeError, match="floating point"):
        sg.arange(3).requires_grad_()
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    assert not (a > 1).requires_grad and (a > 1).grad_fn is None


def test_pass_through_gradients_never_alias_two_leaves_or_a_hooked_tensor():
    a = sg.tensor([1.0, 2.0], requires_grad=True)
    b = sg.tensor([3.0, 4.0], requires_grad=True)
    ((a + b) * 2).sum().backward()  # AddBackward0 hands one buffer to both leaves
    a.grad.zero_()
    np.testing.assert_array_equal(b.grad.numpy(), [2.0, 2.0])
    kept = []
    c = sg.tensor([1.0, 1.0], requires_grad=True)
    h = c * 3
    h.register_hook(lambda g: kept.append(g))
    (h.t() * 1.0).sum().backward()
    (c * 1).sum().backward()  # accumulates into c.grad in place
    np.testing.assert_array_equal(kept[0].numpy(), [1.0, 1.0])


def test_a_node_behind_two_root_outputs_runs_once():
    from symgrad.autograd import Function

    class Two(Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2, a * 3

        @staticmethod
        def backward(ctx, g1, g2):
            return g1 * 2 + g2 * 3

    a = sg.tensor([1.0, 2.0], requires_grad=True)
    x, y = Two.apply(a)
    runs = []
    x.grad_fn.register_prehook(lambda grads: runs.append(1))
    sg.autograd.backward([x, y], [sg.ones(2), sg.ones(2)])
    assert runs == [1]
    np.testing.assert_array_equal(a.grad.numpy(), [5.0, 5.0])  # g1 * 2 + g2 * 3


def test_backward_of_no_tensors_does_nothing_and_roots_reachable_from_roots_run_once(torch):
    """``autograd.backward([])`` is a no-op, as in torch; a root that is also reachable from
    another root receives both gradients before it runs (y feeds z: dz/dx + dy/dx)."""
    sg.autograd.backward([])
    x = sg.tensor(2.0, requires_grad=True)
    y = x * x
    z = y + 1
    sg.autograd.backward([z, y])
    xt = torch.tensor(2.0, requires_grad=True)
    yt = xt * xt
    torch.autograd.backward([yt + 1, yt])
    assert x.grad.item() == xt.grad.item() == 8.0


def test_two_gradients_for_one_output_are_summed(torch):
    """x * x hands x two gradients: summed as arrays (a 0-d result stays an array, not a
    NumPy scalar), or as a recorded add under create_graph, matching torch both ways."""
    x = sg.tensor(3.0, requires_grad=True)
    h = x.tanh()
    (h * h).backward()
    xt = torch.tensor(3.0, requires_grad=True)
    ht = xt.tanh()
    (ht * ht).backward()
    assert type(x.grad._data) is np.ndarray and x.grad.shape == ()
    # (h + h) * (1 - h * h): tanh (2), h * h, 1 - h h, the sum and the product; 1 - h h
    # cancels (h = tanh(3)), so the scale is 2 |h| (1 + h h)
    h = np.tanh(3.0)
    assert_close(x.grad.item(), xt.grad.item(), terms=6, scale=2 * h * (1 + h * h),
                 dtype=np.float32)
    x.grad = None
    (g,) = sg.autograd.grad(x * x, [x], create_graph=True)
    assert g.grad_fn is not None and g.item() == 6.0
    (gg,) = sg.autograd.grad(g, [x])
    assert gg.item() == 2.0


def test_a_saved_input_is_read_as_it_is_at_backward_time(torch):
    """``x.data = ...`` after the forward: the backward sees the new values, as torch's does,
    on the fused path (no graph recorded) and on the formula path (create_graph) alike."""
    x = sg.tensor([1.0, 2.0], requires_grad=True)
    xt = torch.tensor([1.0, 2.0], requires_grad=True)
    for create_graph in (False, True):
        y, yt = x.sin(), xt.sin()  # sin saves its input
        x.data, xt.data = sg.tensor([3.0, 4.0]), torch.tensor([3.0, 4.0])
        (g,) = sg.autograd.grad(y.sum(), [x], create_graph=create_graph)
        (gt,) = torch.autograd.grad(yt.sum(), [xt])
        assert_close(g, gt, terms=2)  # cos (2), times the incoming 1
        assert_close(gt, np.cos([3.0, 4.0]), terms=2)  # float32 cos against float64
        x.data, xt.data = sg.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])
