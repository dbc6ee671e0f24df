"""unsafe_split, unsafe_split_with_sizes and unsafe_chunk against torch 2.13.

torch's LSTM and GRU cut their gates with ``unsafe_chunk`` (UnsafeSplitBackward0): the same
pieces as ``split``, which are no views for autograd (an in-place write into a piece is
allowed and records on the piece alone) while sharing the input's memory. Values and
gradients are cuts and copies of the inputs (no arithmetic), so they are compared exactly.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import symgrad as sg

torch = pytest.importorskip("torch")

X = np.arange(1.0, 25.0).reshape(4, 6) / 7.0  # distinct values: a misplaced piece shows

#: (label, call on the library L and a tensor x): every form, method and function
CALLS = [
    ("unsafe_split int", lambda L, x: L.unsafe_split(x, 4, 1)),
    ("method unsafe_split", lambda L, x: x.unsafe_split(3)),
    ("unsafe_split dim -1", lambda L, x: L.unsafe_split(x, 5, dim=-1)),
    ("unsafe_split_with_sizes", lambda L, x: L.unsafe_split_with_sizes(x, [1, 0, 5], 1)),
    ("method unsafe_split_with_sizes", lambda L, x: x.unsafe_split_with_sizes((3, 1))),
    ("unsafe_chunk", lambda L, x: L.unsafe_chunk(x, 4, 1)),  # sizes 2, 2, 2 (three pieces)
    ("method unsafe_chunk", lambda L, x: x.unsafe_chunk(3, 0)),  # sizes 2, 2
    ("unsafe_chunk of an empty dim", lambda L, x: L.unsafe_chunk(x[:, :0], 3, 1)),
]


def _run(L, call, x_np, weights=None):
    x = L.tensor(x_np, dtype=L.float64, requires_grad=True)
    y = x * 1  # a graph tensor, as the gates of an LSTM step
    pieces = call(L, y)
    loss = 0
    for k, p in enumerate(pieces):
        if k % 2 == 0:  # odd pieces get no gradient: the backward fills zeros there
            w = weights[k] if weights is not None else np.full(tuple(p.shape), k + 1.0)
            loss = loss + (p * L.tensor(w, dtype=L.float64)).sum()
    loss.backward()
    return x, pieces


@pytest.mark.parametrize("label,call", CALLS, ids=[c[0] for c in CALLS])
def test_pieces_grads_and_nodes_match_torch(label, call):
    tx, theirs = _run(torch, call, X)
    sx, ours = _run(sg, call, X)
    assert type(ours) is tuple and len(ours) == len(theirs)
    for t, s in zip(theirs, ours):
        np.testing.assert_array_equal(s.detach().numpy(), t.detach().numpy())
        assert s.grad_fn.name() == t.grad_fn.name()
        assert s.grad_fn is ours[0].grad_fn  # one node for all the pieces
        for attr in ("_saved_dim", "_saved_self_sym_sizes", "_saved_split_size",
                     "_saved_split_sizes"):
            if hasattr(t.grad_fn, attr):
                assert tuple(np.atleast_1d(getattr(s.grad_fn, attr))) == \
                    tuple(np.atleast_1d(getattr(t.grad_fn, attr))), attr
    assert ours[0].grad_fn.name().startswith("UnsafeSplit")
    np.testing.assert_array_equal(sx.grad.numpy(), tx.grad.numpy())


def test_a_piece_takes_an_in_place_write_as_in_torch():
    """No view for autograd: the write records on the piece alone (MulBackward0 over
    UnsafeSplitBackward0) and lands in the input's memory, where split's pieces refuse."""
    out = []
    for L in (torch, sg):
        x = L.tensor(X, dtype=L.float64, requires_grad=True)
        y = x * 1
        a, b = y.unsafe_chunk(2, 1)
        a.mul_(3.0)
        assert a.grad_fn.name() == "MulBackward0"
        assert a.grad_fn.next_functions[0][0].name() == "UnsafeSplitBackward0"
        (a.sum() * 2 + (b * b).sum()).backward()
        out.append((y.detach().numpy().copy(), x.grad.numpy().copy()))
        with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
            (x * 1).chunk(2, 1)[0].mul_(3.0)
    (t_y, t_grad), (s_y, s_grad) = out
    np.testing.assert_array_equal(s_y, t_y)  # the input's first half was multiplied
    np.testing.assert_array_equal(s_grad, t_grad)
    assert not np.array_equal(s_y, X)


BAD = [
    lambda L, x: L.unsafe_split(x, -1),
    lambda L, x: L.unsafe_split(x, 0),
    lambda L, x: L.unsafe_split(L.tensor(1.0), 1),
    lambda L, x: L.unsafe_split(x, [2, 4]),
    lambda L, x: L.unsafe_split(x, 1.5),
    lambda L, x: L.unsafe_split(x, True),
    lambda L, x: L.unsafe_split(x, 2, 1.0),
    lambda L, x: L.unsafe_split(x, 2, 1),
    lambda L, x: x.unsafe_split(1.5),
    lambda L, x: x.unsafe_split(2, 1.0),
    lambda L, x: L.unsafe_split_with_sizes(x, [2, 3]),
    lambda L, x: L.unsafe_split_with_sizes(x, [-1, 7]),
    lambda L, x: L.unsafe_split_with_sizes(x, [2.0, 4]),
    lambda L, x: L.unsafe_split_with_sizes(x, 3),
    lambda L, x: L.unsafe_split_with_sizes(x, [6], 1.0),
    lambda L, x: L.unsafe_split_with_sizes(L.tensor(1.0), [1]),
    lambda L, x: x.unsafe_split_with_sizes(3),
    lambda L, x: x.unsafe_split_with_sizes([1.0]),
    lambda L, x: x.unsafe_split_with_sizes([6], 1.0),
    lambda L, x: L.unsafe_chunk(x, 0),
    lambda L, x: L.unsafe_chunk(x, 1.5),
    lambda L, x: L.unsafe_chunk(x, 1.5, 1.0),
    lambda L, x: L.unsafe_chunk(x, 2, 1.0),
    lambda L, x: L.unsafe_chunk(L.tensor(1.0), 2),
    lambda L, x: x.unsafe_chunk(1.5),
    lambda L, x: x.unsafe_chunk(2, 1.0),
]


@pytest.mark.parametrize("k", range(len(BAD)))
def test_bad_arguments_get_torch_errors(k):
    errors = []
    for L in (torch, sg):
        with pytest.raises(Exception) as info:
            BAD[k](L, L.arange(6.0))
        errors.append((type(info.value), str(info.value).splitlines()[0]))
    assert errors[1] == errors[0]


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_verify_proves_the_unsafe_splits(mode):
    x = sg.tensor(X[:2, :5], dtype=sg.float64, requires_grad=True)
    a, b, c = sg.unsafe_chunk(x.sin(), 3, 1)
    d, e = (x * x).unsafe_split_with_sizes([1, 1], 0)
    root = (a * c).sum() + (b.exp() * d[:, :2]).sum() + e.sum()
    report = sg.verify(root, mode=mode)
    assert report.ok, report
    names = {n.name for n in report.nodes}
    assert {"UnsafeSplitBackward0", "UnsafeSplitWithSizesBackward0"} <= names


def test_the_verifier_reads_a_torch_lstm_cell():
    """torch's LSTMCell records UnsafeSplitBackward0 for its gates: the verifier knows the
    node now (it raised 'unknown torch node' before) and checks the whole cell."""
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(3, 2).double()
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    with sg.capture_torch():
        h, c = cell(x)
    for mode in ("exact", "local"):
        report = sg.verify((h * c).sum(), mode=mode)
        assert report.ok, report
        assert "UnsafeSplitBackward0" in {n.name for n in report.nodes}


def test_compiled_step_runs_unsafe_chunk_compiled(tmp_path, monkeypatch):
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path / "cc"))
    w = sg.nn.Parameter(sg.tensor(np.arange(6.0).reshape(2, 3)))

    def f(x):
        w.grad = None
        a, b, c = (x * w).unsafe_chunk(3, 1)
        loss = (a * b).sum() + sg.unsafe_split_with_sizes(c, [1, 1], 0)[1].sum()
        loss.backward()
        return loss

    step = sg.compile(f)
    x = sg.ones(2, 3, dtype=sg.float64)
    expected = [[1.0, 0.0, 0.0], [4.0, 3.0, 1.0]]  # d/dw of w00 w01 + w10 w11 + w12
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):  # the first call traces, the others run the generated code
            assert step(x).item() == 17.0  # 0*1 + 3*4 + 5
            assert w.grad.tolist() == expected
    assert step.stats["traces"] == 1 and step.stats["fallbacks"] == []
    src = step.source()  # the backward joins the pieces (into a buffer of make() or a new array)
    assert "cat_into(" in src or "np.concatenate((" in src


def test_the_audit_proves_both_rules_and_fails_a_wrong_one(monkeypatch):
    from symgrad.ops import OPS
    from symgrad.symbolic.audit import audit_rules

    assert [r.status for r in audit_rules(["unsafe_split", "unsafe_split_with_sizes"])] == \
        ["proved", "proved"]
    right = OPS["unsafe_split"].grads["self"]
    monkeypatch.setitem(OPS["unsafe_split"].grads, "self",
                        lambda grads, split_size, dim, self_sym_sizes:
                        right(grads, split_size, dim, self_sym_sizes) * 1.001)
    (r,) = audit_rules(["unsafe_split"])
    assert r.status == "failed"
