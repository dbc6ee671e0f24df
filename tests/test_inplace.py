"""In-place ops under autograd: version counters, PyTorch's errors, rebasing grad_fn.

Every test runs the same code on symgrad and on PyTorch (the oracle) and compares values,
gradients, grad_fn names and the key words of the errors.
"""

from __future__ import annotations

import re
import weakref

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg

# Small dyadic values: sums and products of them are exact in float32, and are compared
# exactly below; divisions and sin are not, and are bounded by tests/_tolerance.py.
X = np.array([1.5, -2.0, 0.5, 3.0], dtype=np.float32)
W = np.array([0.5, 1.5, -2.0, 0.25], dtype=np.float32)
C = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)

# method call -> (uses w, expected grad_fn name in torch)
INPLACE = {
    "add_(w)": True, "add_(w, alpha=2)": True, "sub_(w)": True, "sub_(w, alpha=3)": True,
    "mul_(w)": True, "div_(w)": True, "add_(1.5)": False, "sub_(2)": False, "mul_(3)": False,
    "div_(4)": False, "zero_()": False, "fill_(2.5)": False, "fill_(w.sum())": True,
    "copy_(w)": True, "copy_(w[0:1])": True, "clamp_(-1, 1)": False, "clamp_(min=0)": False,
    "clamp_(max=1)": False,
}


def _run(lib, call):
    x = lib.tensor(X, requires_grad=True)
    w = lib.tensor(W, requires_grad=True)
    a = x * 2  # a non-leaf that nothing saved
    old_fn = a.grad_fn
    obj = a
    ret = eval("a." + call, {"a": a, "w": w})
    assert ret is obj  # same object, returned for chaining
    (a * lib.tensor(C)).sum().backward()
    return a, old_fn, x.grad, w.grad


@pytest.mark.parametrize("call", sorted(INPLACE))
def test_inplace_on_non_leaf_rebases_grad_fn_like_torch(torch, call):
    a, old_fn, gx, gw = _run(sg, call)
    ta, told_fn, tgx, tgw = _run(torch, call)
    # the longest chain, div_(w): 2 x / w, then C, w and 2 again in the gradients and
    # -g a / (w w) for w's: four roundings at most
    assert_close(a, ta, terms=4)
    tname = ta.grad_fn.name()
    assert a.grad_fn.name() == tname.replace("torch::autograd::", "")
    assert a._version == ta._version == 1 and not a.is_leaf
    # the new node's first edge is the tensor's old grad_fn, as in torch
    assert a.grad_fn.next_functions[0][0] is old_fn
    assert ta.grad_fn.next_functions[0][0] is told_fn
    assert len(a.grad_fn.next_functions) == len(ta.grad_fn.next_functions)
    assert_close(gx, tgx, terms=4)
    if tgw is None:
        assert gw is None
    else:
        assert_close(gw, tgw, terms=4)


def _operators_program(lib, op, detach=None):
    """a = (3x op w) op 2, b = sin(x) op w; backward of (a * b).sum(), with one factor
    detached when asked (one term of the product rule)."""
    x = lib.tensor(X, requires_grad=True)
    w = lib.tensor(W, requires_grad=True)
    a = x * 3
    ident = id(a)
    exec(f"a {op} w\na {op} 2.0", {"a": a, "w": w})
    assert id(a) == ident
    b = x.sin()
    exec(f"b {op} w", {"b": b, "w": w})
    (a * b.detach() if detach == "b" else a.detach() * b if detach == "a" else a * b) \
        .sum().backward()
    return a, x, w


@pytest.mark.parametrize("op", ["+=", "-=", "*=", "/="])
def test_inplace_operators_on_non_leaf_match_torch(torch, op):
    results = []
    for lib in (sg, torch):
        a, x, w = _operators_program(lib, op)
        results.append((a.grad_fn.name(), a._version, a.detach().numpy().copy(),
                        x.grad.numpy().copy(), w.grad.numpy().copy()))
    (n1, v1, *arrays1), (n2, v2, *arrays2) = results
    assert (n1, v1) == (n2, v2) == (n2, 2)
    # x's and w's gradients add the product rule's two terms, which may cancel: the scale
    # is |term through a| + |term through b|, elementwise
    paths = [_operators_program(torch, op, detach) for detach in ("b", "a")]
    scales = [None] + [sum(np.abs(p[k].grad.numpy()) for p in paths) for k in (1, 2)]
    # a: 3x, two ops; b: sin (2), one op; a gradient: the partials (up to 3 roundings
    # each), the products with the other factor and the sum of the two terms
    for s, t, scale in zip(arrays1, arrays2, scales):
        assert_close(s, t, terms=10, scale=scale)


def test_chained_inplace_ops_and_second_derivative_match_torch(torch):
    out = []
    for lib in (sg, torch):
        x = lib.tensor(X.astype(np.float64), requires_grad=True)
        a = x * 1
        a.mul_(x).add_(x, alpha=3).div_(2).sub_(1).clamp_(-4, 6)  # a = clamp((x^2 + 3x)/2 - 1)
        (g,) = lib.autograd.grad(a.sum(), x, create_graph=True)
        (g2,) = lib.autograd.grad(g.sum(), x)
        out.append((a.detach().numpy().copy(), g.detach().numpy().copy(), g2.numpy().copy()))
    for s, t in zip(*out):  # dyadic x, float64: every step is exact
        np.testing.assert_array_equal(s, t)


def test_saved_self_of_inplace_mul_keeps_the_old_values(torch):
    for lib in (sg, torch):
        x = lib.tensor(X, requires_grad=True)
        w = lib.tensor(W, requires_grad=True)
        a = x * 1
        a.mul_(w)
        saved = a.grad_fn._saved_self
        assert saved is not a and saved._version == 0  # a copy of the pre-op values
        np.testing.assert_array_equal(saved.detach().numpy(), X)  # a copy
        assert a.grad_fn._saved_other is w


@pytest.mark.parametrize("call", ["add_(1)", "sub_(1)", "mul_(2)", "div_(2)", "zero_()",
                                  "fill_(1.0)", "copy_(o)", "clamp_(0, 1)"])
def test_inplace_on_leaf_requiring_grad_raises_like_torch(torch, call):
    for lib in (sg, torch):
        w = lib.tensor(X, requires_grad=True)
        with pytest.raises(RuntimeError) as info:
            eval("w." + call, {"w": w, "o": lib.tensor(W)})
        assert "a leaf Variable that requires grad is being used in an in-place operation." \
            in str(info.value)
        assert w._version == 0
    for lib in (sg, torch):
        w = lib.tensor(X, requires_grad=True)
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
            w += 1


def test_sgd_update_under_no_grad_matches_torch(torch):
    finals = []
    for lib in (sg, torch):
        w = lib.tensor(X, requires_grad=True)
        b = lib.tensor(0.5, requires_grad=True)
        versions = []
        for _ in range(3):
            loss = ((w * lib.tensor(C) + b) ** 2).mean()
            loss.backward()
            with lib.no_grad():
                w -= 0.1 * w.grad
                b.sub_(b.grad, alpha=0.1)
                w.grad.zero_()
                b.grad = None
            versions.append(w._version)
        assert w.is_leaf and w.requires_grad and w.grad_fn is None
        finals.append((w.detach().numpy().copy(), b.item(), versions))
    # per step: w C + b (2), the square, the mean over 4 (5), the gradient 2 (.) C / 4 and
    # b's sum over 4 (7), the update (2); three steps (the update contracts errors:
    # |1 - 0.1 * 2 C^2 / 4| < 1)
    terms = 3 * (2 + 1 + 5 + 7 + 2)
    assert_close(finals[0][0], finals[1][0], terms=terms)
    assert_close(finals[0][1], finals[1][1], terms=terms, dtype=np.float32)  # b.item()
    assert finals[0][2] == finals[1][2] == [1, 2, 3]


def _message_parts(msg):
    m = re.search(r"modified by an inplace operation: \[\w+\.(\w+) \[([\d, ]*)\]\](, which is "
                  r"output (\d+) of (\w+),)? is at version (\d+); expected version (\d+) instead",
                  msg)
    assert m, msg
    return m.group(1), m.group(2), m.group(4), m.group(5), m.group(6), m.group(7)


@pytest.mark.parametrize("case", ["saved_output", "saved_input_leaf", "saved_input_nonleaf",
                                  "saved_leaf_changed_under_no_grad", "saved_via_view",
                                  "inplace_twice"])
def test_modifying_a_saved_tensor_raises_at_backward_like_torch(torch, case):
    msgs = []
    for lib in (sg, torch):
        x = lib.tensor(X, requires_grad=True)
        if case == "saved_output":
            y = x.exp()  # ExpBackward0 saved its result
            y.add_(1)
            root, node = y.sum(), "ExpBackward0"
        elif case == "saved_input_leaf":
            z = lib.tensor(W)
            y = x * z  # MulBackward0 saved z
            z.mul_(2)
            root, node = y.sum(), "MulBackward0"
        elif case == "saved_input_nonleaf":
            q = x * 2
            y = q.sin()  # SinBackward0 saved q, then q is rebased onto MulBackward0
            q.mul_(3)
            root, node = y.sum(), "SinBackward0"
        elif case == "saved_leaf_changed_under_no_grad":
            y = x.cos()
            with lib.no_grad():
                x.add_(1)
            root, node = y.sum(), "CosBackward0"
        elif case == "saved_via_view":
            z = lib.tensor(np.stack([W, W]))
            y = x * z[0]
            z.view(-1).add_(1)  # another view of the same storage: the version is shared
            root, node = y.sum(), "MulBackward0"
        else:
            y = x * 1
            r = y * y
            y.add_(1)
            y.add_(1)
            root, node = r.sum(), "MulBackward0"
        with pytest.raises(RuntimeError) as info:
            root.backward()
        msg = str(info.value)
        assert msg.startswith("one of the variables needed for gradient computation has been "
                              "modified by an inplace operation")
        if lib is sg:
            assert f"saved for {node}" in msg  # symgrad also names the node that needed it
            assert "set_detect_anomaly(True)" in msg
        msgs.append(_message_parts(msg))
    assert msgs[0] == msgs[1]


def test_version_counter_is_shared_by_views_like_torch(torch):
    for lib in (sg, torch):
        a = lib.zeros(2, 3)
        v = a.view(6)
        t = a.t()
        v.add_(1)
        t.mul_(2)
        a[0].fill_(3)
        assert a._version == v._version == t._version == 3
        np.testing.assert_array_equal(a.numpy(), [[3, 3, 3], [2, 2, 2]])
        c = a.clone()
        assert c._version == 0


def test_leaf_without_grad_becomes_non_leaf_after_inplace_with_grad_operand(torch):
    outs = []
    for lib in (sg, torch):
        w = lib.tensor(W, requires_grad=True)
        z = lib.zeros(4)
        z.add_(w * w)
        assert not z.is_leaf and z.requires_grad and z.grad_fn.name() == "AddBackward0"
        assert z.grad_fn.next_functions[0] == (None, 0)
        (z * lib.tensor(C)).sum().backward()
        outs.append(w.grad.numpy().copy())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_inplace_without_grad_needed_stays_leaf_and_only_bumps_version(torch):
    for lib in (sg, torch):
        a = lib.tensor(X)
        a.add_(lib.tensor(W)).mul_(2)
        assert a.is_leaf and a.grad_fn is None and not a.requires_grad and a._version == 2
        x = lib.tensor(X, requires_grad=True)
        y = x * 2
        with lib.no_grad():
            y.add_(1)  # under no_grad the graph is not rebased
        assert y.grad_fn.name() == "MulBackward0" and y._version == 1


def test_inplace_errors_for_dtype_and_shape_match_torch(torch):
    for lib in (sg, torch):
        i = lib.tensor([1, 2])
        with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired "
                                               "output type Long"):
            i += 1.5
        with pytest.raises(RuntimeError, match="result type Float can't be cast"):
            i.div_(2)
        a = lib.zeros(3)
        with pytest.raises(RuntimeError, match=re.escape("output with shape [3] doesn't match "
                                                         "the broadcast shape [2, 3]")):
            a.add_(lib.ones(2, 3))
        with pytest.raises(RuntimeError, match="fill_ only supports 0-dimension value tensor"):
            a.fill_(lib.ones(2))
        i += 2  # int += int is fine
        assert i.tolist() == [3, 4]


def test_retain_grad_follows_the_inplace_version_like_torch(torch):
    got = []
    for lib in (sg, torch):
        x = lib.tensor(X, requires_grad=True)
        a = x * 2
        a.retain_grad()
        a.mul_(3)
        (a * a).sum().backward()
        got.append((a.grad.numpy().copy(), x.grad.numpy().copy()))
    np.testing.assert_array_equal(got[0][0], got[1][0])
    np.testing.assert_array_equal(got[0][1], got[1][1])


def test_tensor_hook_registered_before_inplace_sees_the_old_version_like_torch(torch):
    seen = []
    for lib in (sg, torch):
        x = lib.tensor(X, requires_grad=True)
        a = x * 2
        got = []
        a.register_hook(lambda g, got=got: got.append(g.numpy().copy()))
        a.mul_(3)
        (a * lib.tensor(C)).sum().backward()
        seen.append(got[0])
    np.testing.assert_array_equal(seen[0], seen[1])
    np.testing.assert_array_equal(seen[0], 3 * C)


def test_inplace_on_a_view_of_a_live_graph_tensor_is_refused_clearly():
    x = sg.tensor(X, requires_grad=True)
    base = x * 2
    v = base.view(2, 2)
    with pytest.raises(RuntimeError, match="in-place add on a view"):
        v.add_(1)
    assert v._version == 0  # refused before anything was written


def test_inplace_rebase_creates_no_reference_cycles(no_gc):
    before = sg.memory_allocated()
    x = sg.tensor(np.ones(1000, dtype=np.float32), requires_grad=True)
    w = sg.tensor(np.ones(1000, dtype=np.float32), requires_grad=True)
    a = x * 2
    a.mul_(w).add_(1).clamp_(0, 5)
    loss = a.sum()
    del a
    assert sg.memory_allocated() > before + 8000
    loss.backward()
    del loss, x, w  # refcounting alone frees everything (gc is off)
    assert sg.memory_allocated() == before


def test_under_record_the_inplace_node_keeps_the_pre_op_values_for_the_verifier():
    x = sg.tensor(X, requires_grad=True)
    with sg.record():
        a = x * 2
        a.add_(1)  # AddBackward0 saves nothing, but record() keeps every input's value
    ref = a.grad_fn._input_refs[0]
    np.testing.assert_array_equal(ref.detach().numpy(), 2 * X)
    np.testing.assert_array_equal(a.detach().numpy(), 2 * X + 1)
    y = x * 2
    y.add_(1)  # outside record(): only a weak reference, as for every node
    assert isinstance(y.grad_fn._input_refs[0], weakref.ref)
