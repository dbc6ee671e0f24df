"""split / chunk / unbind / tensor_split against torch 2.13: values, gradients (pieces that
get no gradient included), one shared grad_fn per call with each piece's output_nr, saved
operands, views, in-place refusal with torch's words, error wording, the verifier, the
rule audit and the graph JSON.

Each case is ``fn(L, x) -> tuple of pieces`` run on ``L = symgrad`` and ``L = torch``.
"""

from __future__ import annotations

import gc
import warnings
import weakref

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg

CASES = {
    "split_int": ((5, 3), lambda L, x: L.split(x, 2)),
    "split_int_dim": ((2, 5), lambda L, x: x.split(2, dim=1)),
    "split_neg_dim": ((2, 3, 4), lambda L, x: x.split(3, -1)),
    "split_bigger": ((5, 3), lambda L, x: L.split(x, 7)),
    "split_sizes": ((5, 3), lambda L, x: L.split(x, [2, 3])),
    "split_sizes_tuple_dim": ((3, 6), lambda L, x: x.split((1, 0, 5), -1)),
    "split_keywords": ((4, 3), lambda L, x: x.split(split_size=3, dim=0)),
    "split_fn_keywords": ((4, 3), lambda L, x: L.split(x, split_size_or_sections=[1, 2],
                                                       dim=1)),
    "chunk_keywords": ((4, 3), lambda L, x: x.chunk(chunks=2, dim=-1)),
    "split_empty_dim": ((0, 3), lambda L, x: L.split(x, 2)),
    "chunk": ((5, 3), lambda L, x: L.chunk(x, 2)),
    "chunk_dim": ((3, 4), lambda L, x: x.chunk(3, 1)),
    "chunk_uneven": ((6, 2), lambda L, x: x.chunk(4)),
    "chunk_one": ((4,), lambda L, x: x.chunk(1)),
    "chunk_empty": ((0, 3), lambda L, x: L.chunk(x, 2)),
    "unbind": ((3, 2), lambda L, x: L.unbind(x)),
    "unbind_neg": ((2, 3, 2), lambda L, x: x.unbind(-2)),
    "unbind_1d": ((4,), lambda L, x: x.unbind()),
    "iterate": ((3, 2), lambda L, x: tuple(x)),
    "tensor_split_sections": ((5, 3), lambda L, x: L.tensor_split(x, 3)),
    "tensor_split_more_sections": ((3, 2), lambda L, x: x.tensor_split(5)),
    "tensor_split_indices": ((5, 3), lambda L, x: L.tensor_split(x, [1, 4, 9], dim=0)),
    "tensor_split_negative": ((2, 5), lambda L, x: x.tensor_split((-1, 2), -1)),
    "tensor_split_tensor": ((6,), lambda L, x: L.tensor_split(x, L.tensor([2, 3]))),
    "tensor_split_0d_tensor": ((6,), lambda L, x: L.tensor_split(x, L.tensor(4))),
}

#: which pieces enter the loss (the others get no gradient: the node must fill zeros)
USED = {"split_int": (0, 2), "split_sizes": (1,), "chunk_uneven": (0, 2), "unbind": (1,),
        "unbind_neg": (0, 2), "iterate": (0, 2), "tensor_split_indices": (0, 3)}


def _input(shape, dtype, seed=0):
    return np.random.default_rng(seed).uniform(-1.5, 1.5, shape).astype(dtype)


def _run(L, name, data, create_graph=False):
    x = L.tensor(data, requires_grad=True)
    pieces = CASES[name][1](L, x)
    rng = np.random.default_rng(1)
    used = USED.get(name, range(len(pieces)))
    loss = None
    for k, p in enumerate(pieces):
        w = L.tensor(rng.uniform(-1, 1, tuple(p.shape)).astype(data.dtype))
        if k in used:
            term = (p * w).sum()
            loss = term if loss is None else loss + term
    if loss is None:  # no piece with elements: the gradient is all zeros
        return x, pieces, np.zeros(data.shape, data.dtype)
    (g,) = L.autograd.grad(loss, x, create_graph=create_graph)
    return x, pieces, g


def _saved(node) -> dict:
    out = {}
    for a in dir(node):
        if a.startswith("_saved_"):
            v = getattr(node, a)
            out[a] = tuple(v) if isinstance(v, tuple) else v
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_grads_and_graph_match_torch(name, dtype, cpu_backend, torch):
    data = _input(CASES[name][0], dtype)
    x, pieces, g = _run(sg, name, data)
    tx, t_pieces, t_g = _run(torch, name, data)
    assert len(pieces) == len(t_pieces)
    for p, tp in zip(pieces, t_pieces):
        assert tuple(p.shape) == tuple(tp.shape)
        assert p.dtype.name == str(tp.dtype).replace("torch.", "")
        assert_close(p, tp, terms=1)  # a view: the same elements
        assert p.grad_fn.name() == tp.grad_fn.name()
        assert p._output_nr == tp.output_nr
        assert _saved(p.grad_fn) == _saved(tp.grad_fn)
        assert len(p.grad_fn.next_functions) == len(tp.grad_fn.next_functions) == 1
        assert p.grad_fn.next_functions[0][0].variable is x
    # one node for every piece where torch has one (split, chunk, unbind), else one each
    shared = len({id(tp.grad_fn) for tp in t_pieces})
    assert len({id(p.grad_fn) for p in pieces}) == shared
    # the pieces are views of x: they share its memory, as torch's share their base's
    for p in pieces:
        if p.numel():
            assert np.shares_memory(p.detach().numpy(), x.detach().numpy())
    assert_close(g, t_g, terms=2, scale=magnitude(t_g) + 1)


@pytest.mark.parametrize("name", ["split_int", "split_sizes", "unbind_neg", "chunk_uneven"])
def test_second_derivatives_match_torch(name, torch):
    """The backward is cat / stack of the pieces' gradients: differentiable again."""
    data = _input(CASES[name][0], np.float64, seed=3)
    results, names = [], []
    for L in (sg, torch):
        x = L.tensor(data, requires_grad=True)
        pieces = CASES[name][1](L, x)
        loss = sum(((p * p).sum() * (k + 1) for k, p in enumerate(pieces)
                    if k in USED.get(name, range(len(pieces)))), L.tensor(0.0, dtype=L.float64))
        (g,) = L.autograd.grad(loss, x, create_graph=True)
        names.append(g.grad_fn.name())
        (gg,) = L.autograd.grad((g * g).sum(), x)
        results.append(gg.detach().numpy())
    assert names[0] == names[1]
    assert_close(results[0], results[1], terms=4, scale=magnitude(results[1], data) + 1)


def test_pieces_share_one_node_without_cycles(no_gc):
    x = sg.tensor(_input((5, 3), np.float64), requires_grad=True)
    pieces = sg.split(x * 2, 2)
    node = weakref.ref(pieces[0].grad_fn)
    assert all(p.grad_fn is node() for p in pieces)
    assert [p._output_nr for p in pieces] == [0, 1, 2]
    del pieces
    assert node() is None  # freed by reference counting alone
    gc.collect()


def test_backward_with_some_pieces_unused_and_hooks(torch):
    for L in (sg, torch):
        x = L.tensor(np.arange(6.0).reshape(3, 2), requires_grad=True)
        a, b, c = L.unbind(x)
        seen = []
        b.register_hook(lambda g, seen=seen: seen.append(g.tolist()))
        (b * 3).sum().backward()
        assert x.grad.tolist() == [[0.0, 0.0], [3.0, 3.0], [0.0, 0.0]]
        assert seen == [[3.0, 3.0]]


def test_integer_and_no_grad_pieces(torch):
    for L in (sg, torch):
        t = L.arange(5)
        pieces = L.split(t, 2)
        assert [p.tolist() for p in pieces] == [[0, 1], [2, 3], [4]]
        assert all(p.grad_fn is None and str(p.dtype).endswith("int64") for p in pieces)
        x = L.ones(4, 2, requires_grad=True)
        with L.no_grad():
            assert all(p.grad_fn is None for p in x.chunk(2))
        assert L.unbind(L.zeros(0, 3, requires_grad=True)) == ()


# -- in place: torch refuses writes into the pieces while autograd is recording ----------------
def _grad_x(L):
    return L.tensor(np.arange(15.0).reshape(5, 3), requires_grad=True)


INPLACE = {
    "split_piece_mul_": lambda L: L.split(_grad_x(L) * 1, 2)[0].mul_(2),
    "split_leaf_piece": lambda L: L.split(_grad_x(L), 2)[1].add_(1),
    "sizes_piece": lambda L: L.split(_grad_x(L), [2, 3])[1].zero_(),
    "chunk_piece": lambda L: L.chunk(_grad_x(L), 2)[0].fill_(1.0),
    "unbind_piece": lambda L: L.unbind(_grad_x(L))[4].div_(2),
    "view_of_piece": lambda L: L.split(_grad_x(L), 2)[0].view(6).mul_(2),
    "setitem_select": lambda L: L.split(_grad_x(L) * 1, 2)[1].__setitem__(0, 1.0),
    "setitem_slice": lambda L: L.split(_grad_x(L) * 1, 2)[1].__setitem__(slice(1, None), 1.0),
    "setitem_whole": lambda L: L.split(_grad_x(L) * 1, 2)[1].__setitem__(Ellipsis, 1.0),
    "setitem_advanced": lambda L: L.split(_grad_x(L) * 1, 2)[1].__setitem__(
        L.tensor([True, False]), 1.0),
    "no_grad_base_grad_value": lambda L: L.split(L.zeros(4, 3), 2)[0].mul_(
        L.ones(2, 3, requires_grad=True)),
    "no_grad_base_setitem": lambda L: L.unbind(L.zeros(4, 3))[0].__setitem__(
        0, L.ones((), requires_grad=True)),
    "made_under_no_grad": lambda L: _under_no_grad(L).mul_(2),
}


def _under_no_grad(L):
    x = _grad_x(L)
    with L.no_grad():
        return L.split(x, 2)[0]


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_on_pieces_raises_torch_error(name, torch):
    messages = []
    for L in (sg, torch):
        with pytest.raises(RuntimeError) as info:
            INPLACE[name](L)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_inplace_on_pieces_allowed_where_torch_allows(torch):
    for L in (sg, torch):
        x = _grad_x(L)
        base = L.zeros(4, 3)
        a, _ = L.split(base, 2)
        a.mul_(2).add_(1)  # nothing requires grad: a plain write into the base
        assert base.tolist()[0] == [1.0, 1.0, 1.0] and base.tolist()[3] == [0.0, 0.0, 0.0]
        a, _, _ = L.split(x * 1, 2)
        with L.no_grad():
            a.mul_(2)  # not recorded
        a.detach().zero_()
        assert a.tolist()[0] == [0.0, 0.0, 0.0]


# -- errors ----------------------------------------------------------------------------------
ERRORS = [
    (lambda L, x: L.split(x, 0), RuntimeError),
    (lambda L, x: L.split(x, -1), RuntimeError),
    (lambda L, x: L.split(x, [2, 3]), RuntimeError),
    (lambda L, x: L.split(x, []), RuntimeError),
    (lambda L, x: L.split(x, [-1, 5]), RuntimeError),
    (lambda L, x: L.split(x, [-1, 6]), RuntimeError),
    (lambda L, x: L.split(x, 2, dim=2), IndexError),
    (lambda L, x: L.split(x, [1, 2], dim=-3), IndexError),
    (lambda L, x: L.split(x, 2.0), TypeError),
    (lambda L, x: L.split(x, [3.0]), TypeError),
    (lambda L, x: L.split(L.tensor(1.0), 1), RuntimeError),
    (lambda L, x: L.chunk(x, 0), RuntimeError),
    (lambda L, x: L.chunk(x, -2), RuntimeError),
    (lambda L, x: L.chunk(x, 2.0), TypeError),
    (lambda L, x: L.chunk(L.tensor(1.0), 1), RuntimeError),
    (lambda L, x: L.chunk(x, 2, 5), IndexError),
    (lambda L, x: L.split(x, 2, 1.0), TypeError),
    (lambda L, x: L.split(x, True), TypeError),
    (lambda L, x: L.unbind(L.tensor(1.0)), IndexError),
    (lambda L, x: L.unbind(x, 2), IndexError),
    (lambda L, x: L.tensor_split(x, 0), RuntimeError),
    (lambda L, x: L.tensor_split(L.tensor(1.0), 1), RuntimeError),
    (lambda L, x: L.tensor_split(x, L.tensor([[1]])), RuntimeError),
    (lambda L, x: L.tensor_split(x, L.tensor([1.0])), RuntimeError),
    (lambda L, x: L.tensor_split(x, 2.0), TypeError),
    (lambda L, x: L.tensor_split(x, 2, dim=3), IndexError),
]


@pytest.mark.parametrize("k", range(len(ERRORS)))
def test_errors_have_torch_wording(k, torch):
    fn, kind = ERRORS[k]
    messages = []
    for L in (sg, torch):
        with pytest.raises(kind) as info:
            fn(L, L.ones(4, 3))
        messages.append(str(info.value).splitlines()[0])
    assert messages[0] == messages[1]


# -- the verifier, the rule audit, the graph JSON ----------------------------------------------
@pytest.mark.parametrize("mode", ["exact", "local"])
@pytest.mark.parametrize("name", ["split_int", "split_sizes", "chunk_uneven", "unbind_neg",
                                  "tensor_split_indices"])
def test_verify(name, mode):
    data = _input(CASES[name][0], np.float64, seed=4)
    x = sg.tensor(data, requires_grad=True)
    with sg.record():  # keeps the constant start of the Python sum for the verifier
        pieces = CASES[name][1](sg, x)
        used = USED.get(name, range(len(pieces)))
        loss = sum(((p * p).sum() * (k + 1) for k, p in enumerate(pieces) if k in used),
                   sg.tensor(0.0, dtype=sg.float64))
    report = sg.verify(loss, mode=mode)
    assert report.ok, report


def _swapped(grads, split_size, dim, self_sym_sizes):
    """A wrong split rule: the pieces' gradients joined in reverse order."""
    from symgrad.ops.split import _split_grad

    out = _split_grad(grads, split_size, dim, self_sym_sizes)
    return out.flip(int(dim))


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_verify_names_a_wrong_split_rule(mode, monkeypatch):
    monkeypatch.setitem(sg.ops.OPS["split"].grads, "self", _swapped)
    x = sg.tensor(_input((4, 2), np.float64, seed=5), requires_grad=True)
    a, b = x.split(2)
    loss = (a * 2).sum() + (b * b).sum()
    report = sg.verify(loss, mode=mode)
    assert not report.ok
    if mode == "local":
        assert report.first_bad_node.name() == "SplitBackward0"


def test_rule_audit_proves_split_rules_and_catches_a_wrong_one(monkeypatch):
    from symgrad.symbolic.audit import audit_rules

    res = {r.op: r.status for r in audit_rules(["split", "split_with_sizes", "unbind"])}
    assert res == {"split": "proved", "split_with_sizes": "proved", "unbind": "proved"}
    monkeypatch.setitem(sg.ops.OPS["split"].grads, "self", _swapped)
    (bad,) = audit_rules(["split"])
    assert bad.status == "failed", bad.detail


def test_graph_json_matches_torch(torch):
    from symgrad.jupyter import graph_json

    def build(L):
        x = L.tensor(_input((4, 3), np.float64), requires_grad=True)
        a, b = L.chunk(x, 2)
        c, d, e = L.unbind(x, 1)
        return x, (a * b).sum() + (c * e).sum()

    def shape(p):
        by_id = {n["id"]: n for n in p["nodes"]}
        nodes = sorted((n["label"], tuple(sorted(s["name"] for s in n["saved"])))
                       for n in p["nodes"] if n["kind"] == "op")
        edges = sorted((by_id[e["from"]]["label"], e["input"], by_id[e["to"]]["label"],
                        e["output_nr"]) for e in p["edges"])
        return nodes, edges

    (x, loss), (tx, t_loss) = build(sg), build(torch)
    ours, theirs = shape(graph_json(loss, {"x": x})), shape(graph_json(t_loss, {"x": tx}))
    assert ours == theirs
    assert ("MulBackward0", 1, "SplitBackward0", 1) in ours[1]
    assert ("MulBackward0", 1, "UnbindBackward0", 2) in ours[1]


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_verify_reads_torch_split_graphs(mode, torch):
    """torch's SplitBackward0 / UnbindBackward0 nodes map onto the same op definitions."""
    x = torch.tensor(_input((4, 3), np.float64, seed=6), requires_grad=True)
    with sg.capture_torch():
        a, b = torch.split(x, 2)
        c = torch.unbind(x, 1)
        loss = (a * b).sum() + (c[0] * c[2]).sum()
    report = sg.verify(loss, mode=mode)
    assert report.ok, report
    assert {"SplitBackward0", "UnbindBackward0"} <= {n.name for n in report.nodes}


def test_compile_runs_split_and_unbind_compiled(tmp_path, monkeypatch):
    """split/unbind have compile rules (symgrad/compile/rules.py): no eager fallback, and
    the compiled step's gradient (a piece unused by unbind gets zeros) is eager's."""
    # a cache of its own: files left in the user's cache by another symgrad version are
    # replaced with a warning, which this test turns into an error
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path / "cc"))
    w = sg.nn.Parameter(sg.tensor(np.arange(6.0).reshape(2, 3)))

    def f(x):
        w.grad = None
        z = x * w
        a, b = z.split([1, 2], 1)
        loss = (a * b).sum() + z.unbind(0)[1].sum()
        loss.backward()
        return loss

    step = sg.compile(f)
    x = sg.ones(2, 3, dtype=sg.float64)
    expected = [[3.0, 0.0, 0.0], [10.0, 4.0, 4.0]]  # d/dw of w00*(w01+w02) + sum(w1.)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):  # the first call traces, the others run the generated code
            assert step(x).item() == 39.0  # 0*1 + 0*2 + 3*4 + 3*5 + (3 + 4 + 5)
            assert w.grad.tolist() == expected
    assert step.stats["traces"] == 1 and step.stats["fallbacks"] == []
    src = step.source()  # the backward joins the pieces (a buffer of make() or a new array)
    assert ("cat_into(" in src or "np.concatenate((" in src) and "np.stack((" in src
