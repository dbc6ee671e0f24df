"""Writing into a view of a graph tensor, compared with torch.

``y = x * w; y[:, 0].mul_(3)`` (or ``y[1][0] = v``): torch makes ``y``'s grad_fn
``CopySlices`` over its old one, and the view's own grad_fn ``AsStridedBackward0`` of the
new ``y``. symgrad records the same names; every value and leaf gradient equals torch's.
(CopySlices' second edge differs by design: symgrad's is the op's node applied to the old
view, torch hides that node inside CopySlices; see symgrad/_inplace_views.py.)
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad.ops import OPS

X = np.arange(1.0, 13.0).reshape(3, 4) / 4 - 1.2
W = np.linspace(0.5, 2.0, 12).reshape(3, 4)


def _name(fn) -> str | None:
    return None if fn is None else fn.name().replace("torch::autograd::", "")


def _run(L, write):
    """y = x * w; ``write(L, y)`` returns the view written (or None); loss of y."""
    x = L.tensor(X, requires_grad=True)
    w = L.tensor(W, requires_grad=True)
    y = x * w
    v = write(L, y)
    names = (_name(y.grad_fn), _name(y.grad_fn.next_functions[0][0]),
             None if v is None else _name(v.grad_fn))
    if v is not None:
        assert v.grad_fn.next_functions[0][0] is y.grad_fn
        assert len(v.grad_fn.next_functions) == 1
    loss = (y * y).sum() + (0 if v is None else v.sin().sum())
    loss.backward()
    return names, y.detach().numpy(), x.grad.numpy(), w.grad.numpy()


def _compare(torch, write, terms=8):
    t_names, *t_vals = _run(torch, write)
    s_names, *s_vals = _run(sg, write)
    assert s_names == t_names
    for s, t in zip(s_vals, t_vals):
        assert_close(s, t, terms=terms)
    return s_names


# -- in-place op forms x view forms ------------------------------------------------------------
def _iadd(v):
    v += 1.5
    return v


INPLACE = {
    "mul_": lambda L, v: v.mul_(3),
    "add_alpha": lambda L, v: v.add_(L.ones(tuple(v.shape), dtype=L.float64) * 0.5, alpha=3),
    "relu_": lambda L, v: v.relu_(),
    "clamp_": lambda L, v: v.clamp_(-0.5, 1.0),
    "zero_": lambda L, v: v.zero_(),
    "fill_": lambda L, v: v.fill_(2.5),
    "copy_": lambda L, v: v.copy_(L.tensor(np.full(tuple(v.shape), 0.75))),
    "iadd": lambda L, v: _iadd(v),
    "masked_fill_": lambda L, v: v.masked_fill_(
        L.tensor(np.arange(v.numel()).reshape(tuple(v.shape)) % 2 == 0), -1.0),
}

VIEWS = {
    "select": lambda y: y[1],
    "select_dim1": lambda y: y[:, 0],
    "slice": lambda y: y[:, 1:3],
    "narrow": lambda y: y.narrow(0, 1, 2),
    "chained": lambda y: y[1:][:, 2],
    "chained_select": lambda y: y[1][1:3],
    "unsqueeze": lambda y: y[2][None],
}


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("op", sorted(INPLACE))
def test_inplace_on_view_matches_torch(torch, op, view):
    names = _compare(torch, lambda L, y: INPLACE[op](L, VIEWS[view](y)))
    assert names[0] == "CopySlices" and names[2] == "AsStridedBackward0"


def test_inplace_with_operand_requiring_grad_reaches_it(torch):
    def write(L, y):
        b = L.tensor(W[0, :3] * 0.5, requires_grad=True)
        v = y[0][:3]
        v.mul_(b)
        v.add_(b, alpha=2)
        return v
    _compare(torch, write)


def test_several_inplace_ops_on_one_view_and_on_two_views(torch):
    def write(L, y):
        a = y[0]
        a.mul_(2).add_(1)
        b = y[:, 1]
        b.mul_(0.5)
        c = y[2][1:]
        c.clamp_(0, 3)
        return c
    names = _compare(torch, write)
    assert names[1] == "CopySlices"


def test_a_written_view_follows_later_writes_into_its_base(torch):
    """torch regenerates ``v``'s grad_fn from its base after ``w``'s write; symgrad rebases
    the views written before (here overlapping: element [1, 0])."""
    out = []
    for L in (sg, torch):
        x = L.tensor(X, requires_grad=True)
        y = x * 2
        y.retain_grad()
        v = y[1]
        v.mul_(3)
        w = y[:, 0]
        w.mul_(-2)
        assert v.grad_fn.next_functions[0][0] is y.grad_fn
        assert _name(v.grad_fn) == "AsStridedBackward0"
        ((y * y).sum() + (v * v * v).sum()).backward()
        out.append((x.grad.numpy(), y.grad.numpy()))
    for s, t in zip(*out):
        assert_close(s, t, terms=8)


def test_a_written_view_follows_writes_into_the_base_itself(torch):
    out = []
    for L in (sg, torch):
        x = L.tensor(X, requires_grad=True)
        y = x * 2
        v = y[1]
        v.mul_(3)
        y.mul_(-2)
        y[0, 0] = 4.0
        y[:, 1] = 7.0
        assert v.grad_fn.next_functions[0][0] is y.grad_fn
        ((v * v * v).sum() + (y * y).sum()).backward()
        out.append(x.grad.numpy())
    assert_close(out[0], out[1], terms=8)


def test_views_made_before_a_write_follow_it(torch):
    """Views made by indexing, select and narrow, never written themselves, are rebased onto
    AsStridedBackward0 of the base after a write into it (torch regenerates them)."""
    out = []
    for L in (sg, torch):
        x = L.tensor(X, requires_grad=True)
        y = x * 2
        views = [y[:, 0], y.narrow(1, 1, 2), y.select(1, 3), y[0:2][1]]
        b = y[1]
        b.mul_(-3)
        y[2, 0] = 5.0
        y.mul_(2)
        for v in views:
            assert _name(v.grad_fn) == "AsStridedBackward0"
            assert v.grad_fn.next_functions[0][0] is y.grad_fn
        sum((v ** 3).sum() for v in views).backward()
        out.append(x.grad.numpy())
    assert_close(out[0], out[1], terms=16)


# -- assignment through a view -----------------------------------------------------------------
def _assign_scalar(L, y):
    y[1][0] = 5.0
    return None


def _assign_tensor(L, y):
    t = L.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    v = y[1:]
    v[:, 1] = t[:2] * 3
    v[0][2:] = t[1:]
    return v


def _assign_index(L, y):
    v = y[2]
    v[L.tensor([0, 3])] = L.tensor(np.array([7.0, 8.0]))
    v[...] = v * 2
    return v


@pytest.mark.parametrize("write", [_assign_scalar, _assign_tensor, _assign_index])
def test_assignment_through_a_view_matches_torch(torch, write):
    names = _compare(torch, write)
    assert names[0] == "CopySlices"


def test_assigned_value_gets_its_gradient(torch):
    grads = []
    for L in (sg, torch):
        x = L.tensor(X, requires_grad=True)
        t = L.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
        y = x * 2
        y[0][:, None][1:][:, 0] = t
        (y * y).sum().backward()
        grads.append((x.grad.numpy(), t.grad.numpy()))
    for s, t in zip(*grads):
        assert_close(s, t, terms=4)


# -- backward twice, version errors --------------------------------------------------------------
def test_backward_twice_with_retain_graph(torch):
    grads = []
    for L in (sg, torch):
        x = L.tensor(X, requires_grad=True)
        y = x * 2
        y[:, 1].mul_(3)
        y[2].relu_()
        loss = (y * y).sum()
        loss.backward(retain_graph=True)
        loss.backward()
        grads.append(x.grad.numpy())
    assert_close(grads[0], grads[1], terms=4)


def _saved_result_then_written(L):
    x = L.tensor(X, requires_grad=True)
    y = x * 2
    y[0].exp_()          # ExpBackward0 saves its result (a view of y)
    y[1:][:, 0].mul_(2)  # the same storage: version + 1
    return y.sum()


def _saved_input_then_written(L):
    x = L.tensor(X, requires_grad=True)
    y = x * 2
    z = y[0].sin()       # saves y[0]
    y[2][1] = 0.0
    return z.sum()


@pytest.mark.parametrize("build", [_saved_result_then_written, _saved_input_then_written])
def test_saved_tensor_modified_through_a_view_raises_like_torch(torch, build):
    msg = "one of the variables needed for gradient computation has been modified by an " \
          "inplace operation"
    for L in (torch, sg):
        loss = build(L)
        with pytest.raises(RuntimeError, match=msg):
            loss.backward()


# -- leaf views, refused views, base gone ------------------------------------------------------
LEAF_VIEW = "a view of a leaf Variable that requires grad is being used in an in-place operation."


@pytest.mark.parametrize("write", [
    lambda x: x[0].mul_(2),
    lambda x: x[:, 1:].relu_(),
    lambda x: x.t()[0].add_(1),
    lambda x: x[1].__setitem__(0, 5.0),
    lambda x: x[1][1:].__setitem__(slice(None), 5.0),
])
def test_view_of_leaf_raises_torch_error(torch, write):
    for L in (torch, sg):
        x = L.tensor(X, requires_grad=True)
        with pytest.raises(RuntimeError) as info:
            write(x)
        assert str(info.value) == LEAF_VIEW
        assert x._version == 0


@pytest.mark.parametrize("view, name", [
    (lambda y: y.t(), "TBackward0"),
    (lambda y: y.transpose(0, 1)[1], "TransposeBackward0"),
    (lambda y: y.permute(1, 0)[0], "PermuteBackward0"),
    (lambda y: y.view(12)[2:5], "ViewBackward0"),
    (lambda y: y.diagonal(), "DiagonalBackward0"),
])
def test_views_not_expressible_as_a_region_are_refused_naming_the_op(view, name):
    x = sg.tensor(X, requires_grad=True)
    y = x * 2
    v = view(y)
    with pytest.raises(RuntimeError, match=rf"in-place mul on a view \({name}\)"):
        v.mul_(2)
    with pytest.raises(RuntimeError, match=rf"assignment on a view \({name}\)"):
        v[0] = 1.0
    assert y._version == 0 and y.grad_fn.name() == "MulBackward0"


def test_base_gone_records_on_the_view_alone(torch):
    grads = []
    for L in (sg, torch):
        x = L.tensor(X, requires_grad=True)
        y = x * 2
        v = y[1]
        del y
        v.mul_(3)
        (v * v).sum().backward()
        grads.append(x.grad.numpy())
    assert_close(grads[0], grads[1], terms=4)


def test_no_grad_write_into_view_records_nothing():
    x = sg.tensor(X, requires_grad=True)
    y = x * 2
    with sg.no_grad():
        y[0].mul_(2)
        y[1][0] = 3.0
    assert y.grad_fn.name() == "MulBackward0"


# -- the verifier, the graph JSON, freeing ------------------------------------------------------
def _program(record=False):
    rng = np.random.default_rng(0)
    x = sg.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w = sg.tensor(rng.standard_normal(4), requires_grad=True)
    y = x.tanh() * 1.5
    y[1].mul_(w)
    y[:, 2].add_(w[:3], alpha=2)
    y[0][1:3] = w[:2] * 2
    v = y[2][1:]
    v += 1
    return (y.sin() * y).sum() + v.exp().sum()


@pytest.mark.parametrize("record", [False, True])
@pytest.mark.parametrize("mode", ["exact", "local"])
def test_verifier_proves_writes_into_views(mode, record):
    if record:
        with sg.record():
            loss = _program()
    else:
        loss = _program()
    rep = sg.verify(loss) if mode == "exact" else sg.verify(loss, mode="local")
    assert rep.ok, str(rep)


@pytest.mark.parametrize("op, name", [("as_strided_region", "AsStridedBackward0"),
                                      ("copy_slices", "CopySlices")])
def test_verifier_catches_a_wrong_rule_of_these_nodes(monkeypatch, op, name):
    right = OPS[op].grads["self"]
    if op == "as_strided_region":
        def wrong(grad, _region, self_sym_sizes):
            return right(grad, _region, self_sym_sizes) * 1.001
    else:
        def wrong(grad, _region):
            return right(grad, _region) * 1.001
    monkeypatch.setitem(OPS[op].grads, "self", wrong)
    loss = _program()
    rep = sg.verify(loss)
    assert not rep.ok
    assert rep.first_bad_node is not None and rep.first_bad_node.name() == name, str(rep)


def test_graph_json_of_writes_into_views():
    from symgrad.jupyter import graph_json

    data = graph_json(_program())
    text = str(data)
    assert "CopySlices" in text and "AsStridedBackward0" in text


def test_graph_of_writes_into_views_is_freed_without_gc():
    gc.collect()
    gc.disable()
    try:
        x = sg.tensor(X, requires_grad=True)
        y = x * 2
        v = y[1]
        seen = y[2][1:]  # made, never written: rebased by the writes below
        v.mul_(3)
        y[0][1] = 5.0
        nodes = [weakref.ref(y.grad_fn), weakref.ref(v.grad_fn),
                 weakref.ref(y.grad_fn.next_functions[0][0])]
        nodes.append(weakref.ref(seen.grad_fn))
        ((y * y).sum() + seen.sum()).backward()
        del y, v, seen
        assert all(n() is None for n in nodes)
    finally:
        gc.enable()


# -- views made by other view ops (t, view, expand ...), then a write into the base ----------
# torch regenerates such a view's grad_fn (AsStridedBackward0) from its base after a write;
# symgrad replays the view's chain of ops on the written base, keeping their names.
OTHER_VIEWS = {
    "t": lambda y: y.t(),
    "transpose": lambda y: y.transpose(0, 1),
    "permute": lambda y: y.permute(1, 0),
    "view": lambda y: y.view(2, 6),
    "reshape": lambda y: y.reshape(12),
    "expand": lambda y: y.unsqueeze(0).expand(2, 3, 4),
    "squeeze": lambda y: y.view(3, 1, 4).squeeze(1),
    "squeeze_all": lambda y: y.view(1, 3, 4).squeeze(),
    "unsqueeze": lambda y: y.unsqueeze(1),
    "t_select": lambda y: y.t()[0],
    "view_slice": lambda y: y.view(12)[1:],
    "select_unsqueeze_expand": lambda y: y[0].unsqueeze(0).expand(3, 4),
    "diagonal": lambda y: y.diagonal(),
}


def _setitem(L, y):
    y[0] = 5.0


WRITES = {
    "mul_": lambda L, y: y.mul_(2),
    "add_": lambda L, y: y.add_(1),
    "setitem": _setitem,
    "two_writes": lambda L, y: (y.mul_(-2), y.__setitem__((1, 2), -1.5)),
    "through_a_region": lambda L, y: y[:, 1].mul_(3),
}


def _stale_run(L, view, write, both):
    x = L.tensor(X, requires_grad=True)
    w = L.tensor(W, requires_grad=True)
    y = x * w
    v = OTHER_VIEWS[view](y)
    write(L, y)
    loss = (v * v * v).sum()
    if both:
        loss = loss + (y.sin() * y).sum()
    loss.backward()
    return (_name(v.grad_fn), v.detach().numpy().copy(), y.detach().numpy(), x.grad.numpy(),
            w.grad.numpy())


@pytest.mark.parametrize("both", [False, True])
@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("view", sorted(OTHER_VIEWS))
def test_views_made_by_other_ops_follow_a_write_into_their_base(torch, view, write, both):
    t_name, *t_vals = _stale_run(torch, view, WRITES[write], both)
    s_name, *s_vals = _stale_run(sg, view, WRITES[write], both)
    assert t_name == "AsStridedBackward0"
    for s, t in zip(s_vals, t_vals):
        assert_close(s, t, terms=16)


def test_replayed_view_sits_on_the_written_base_and_keeps_its_op_name():
    x = sg.ones(2, 3, requires_grad=True)
    y = x * 2
    v = y.t()
    y.mul_(2)
    assert _name(v.grad_fn) == "TBackward0"
    assert v.grad_fn.next_functions[0][0] is y.grad_fn
    v.sum().backward()
    assert_close(x.grad.numpy(), np.full((2, 3), 4.0), terms=1)


def test_replayed_view_keeps_retain_grad(torch):
    out = []
    for L in (sg, torch):
        x = L.tensor(X, requires_grad=True)
        y = x * 2
        v = y.t()
        v.retain_grad()
        y.add_(1)
        y[1] = 2.0
        (v * v).sum().backward()
        out.append((v.grad.numpy(), x.grad.numpy()))
    for s, t in zip(*out):
        assert_close(s, t, terms=4)


def test_replayed_views_double_backward(torch):
    out = []
    for L in (sg, torch):
        x = L.tensor(X, requires_grad=True)
        w = L.tensor(W, requires_grad=True)
        y = x * w
        v = y.view(12)[1:]
        u = y.t()
        y.mul_(w)
        y[2] = 1.0
        loss = (v ** 3).sum() + (u.sin() * u).sum()
        (gx,) = L.autograd.grad(loss, x, create_graph=True)
        (gx * gx).sum().backward()
        out.append((gx.detach().numpy(), x.grad.numpy(), w.grad.numpy()))
    for s, t in zip(*out):
        assert_close(s, t, terms=32)


@pytest.mark.parametrize("record", [False, True])
def test_verifier_proves_replayed_views(record):
    def program():
        rng = np.random.default_rng(1)
        x = sg.tensor(rng.standard_normal((3, 4)), requires_grad=True)
        w = sg.tensor(rng.standard_normal(4), requires_grad=True)
        y = x.tanh() * w
        v = y.t()[1:]
        u = y.view(12)
        y.mul_(w)
        y[0][1] = 2.0
        return (v * v).sum() + u.exp().sum()

    if record:
        with sg.record():
            loss = program()
    else:
        loss = program()
    rep = sg.verify(loss)
    assert rep.ok, str(rep)


def test_views_through_a_multi_output_op_are_left_alone():
    """They keep their old grad_fn (torch raises once it is read); nothing crashes."""
    x = sg.tensor(X, requires_grad=True)
    y = x * 2
    a, b = y.t().unbind(0)[:2]
    c = y.split(2, dim=1)[0].t()
    y.mul_(2)
    y[0] = 1.0
    (a.sum() + b.sum() + c.sum()).backward()  # (their old graph: no crash)
    assert x.grad is not None


def test_graph_of_replayed_views_is_freed_without_gc():
    gc.collect()
    gc.disable()
    try:
        x = sg.tensor(X, requires_grad=True)
        y = x * 2
        v = y.t()[1:]
        u = y.view(12)
        y.mul_(3)
        y[0] = 1.0
        nodes = [weakref.ref(y.grad_fn), weakref.ref(v.grad_fn),
                 weakref.ref(v.grad_fn.next_functions[0][0]), weakref.ref(u.grad_fn)]
        ((y * y).sum() + v.sum() + u.sum()).backward()
        del y, v, u
        assert all(n() is None for n in nodes)
    finally:
        gc.enable()
