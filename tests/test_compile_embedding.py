"""sg.compile's direct embedding lines (rules.embedding_ok: fuse.LOOPS' embedding_rows and
embedding_rows_b instead of the op's stanza forward and node backward).

Eager's forward is a copy of rows after its bounds check, its backward zeros plus the rows
of the gradient added at the indices in index order: the compiled step must give the same
bits, for repeated indices, indices changing between calls, 2-D indices and a weight that
is also the output layer (its gradient a sum of several terms, in eager's order). An index
out of range raises eager's IndexError on a call after compilation, leaves everything as
eager leaves it, and the next calls go on as eager's. The other cases (a padding row)
keep the generic path and still equal eager.
"""

from __future__ import annotations

import copy
import re
import warnings

import numpy as np
import pytest

import symgrad as sg
from symgrad.nn import functional as F

V, D, T = 11, 6, 5  # vocabulary, width, sequence length


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Generated modules go to a temp dir, not the user's ~/.cache."""
    monkeypatch.setenv("SYMGRAD_COMPILE_CACHE", str(tmp_path_factory.getbasetemp() / "cc"))


class _Model:
    """Token and position tables (and momentum SGD over them), the token table optionally
    also the output layer: ``tied`` 0 (embedding only), 1 (``F.linear(h, W)`` too), 2 (a
    second lookup of W as well: three gradient terms)."""

    def __init__(self, dtype=sg.float32) -> None:
        sg.manual_seed(0)
        self.W = sg.randn(V, D, dtype=dtype, requires_grad=True)
        self.P = sg.randn(T, D, dtype=dtype, requires_grad=True)
        self.opt = sg.optim.SGD([self.W, self.P], lr=0.1, momentum=0.9)

    def step(self, tied: int, padding_idx=None, zero_grad: bool = True,
             backward: bool = True):
        W, P, opt = self.W, self.P, self.opt

        def fn(idx, c, c2):
            if zero_grad:
                opt.zero_grad()
            tok = F.embedding(idx, W, padding_idx=padding_idx)
            pos = F.embedding(sg.arange(idx.shape[-1]), P)
            h = tok + pos
            if not backward:  # the forward alone
                return tok, pos, (h * c).sum()
            loss = (h * c).sum()
            if tied >= 2:
                loss = loss + (F.embedding(idx.flip(-1), W) * c).sum()
            if tied >= 1:
                loss = loss + (F.linear(h, W) * c2).sum()
            loss.backward()
            opt.step()
            return tok, pos, loss
        return fn


def _data(shape, k: int, dtype=sg.float32):
    """Indices (repeated ones among them, different for each ``k``) and the loss weights."""
    sg.manual_seed(100 + k)
    idx = sg.randint(0, V, shape)
    a = idx.numpy()
    a.reshape(-1)[1] = a.reshape(-1)[0]  # a repeated index for sure
    a.reshape(-1)[-1] = a.reshape(-1)[0]
    c = sg.randn(*shape, D, dtype=dtype)
    c2 = sg.randn(*shape, V, dtype=dtype)
    return sg.tensor(a), c, c2


def _same_bits(got, want) -> None:
    g, w = np.asarray(got.detach().numpy()), np.asarray(want.detach().numpy())
    assert g.dtype == w.dtype and g.shape == w.shape
    assert g.tobytes() == w.tobytes(), np.abs(g.astype(np.float64) - w).max()


def _same_state(m: _Model, e: _Model) -> None:
    for p, q in ((m.W, e.W), (m.P, e.P)):
        _same_bits(p, q)
        assert (p.grad is None) == (q.grad is None)
        if q.grad is not None:
            _same_bits(p.grad, q.grad)
        st, st_e = m.opt.state.get(p, {}), e.opt.state.get(q, {})
        assert st.keys() == st_e.keys()
        if "momentum_buffer" in st_e:
            _same_bits(st["momentum_buffer"], st_e["momentum_buffer"])


def _call(step, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to eager is a UserWarning: fails here
        return step(*args)


def _run(shape, tied, dtype=sg.float32, padding_idx=None, calls=4):
    m = _Model(dtype)
    e = copy.deepcopy(m)
    step, eager = sg.compile(m.step(tied, padding_idx)), e.step(tied, padding_idx)
    for k in range(calls):
        data = _data(shape, k, dtype)
        got, want = _call(step, *data), eager(*data)
        for x, y in zip(got, want):
            _same_bits(x, y)
        _same_state(m, e)
    assert step.stats["traces"] == 1 and step.stats["fallbacks"] == []
    return step


@pytest.mark.parametrize("shape,tied", [((T,), 0), ((3, T), 0), ((3, T), 1), ((2, T), 2)])
def test_embedding_lines_are_direct_and_equal_eager_bit_for_bit(shape, tied):
    """Forward values and every gradient equal eager's bits over calls whose indices change
    (repeated ones included), for 1-D and 2-D indices and a tied output layer."""
    step = _run(shape, tied)
    src = step.source()
    assert src.count("embedding_rows(") == 2 + (tied >= 2)
    assert src.count("embedding_rows_b(") == 2 + (tied >= 2)
    assert "fwd_embedding" not in src and "bwd_embedding" not in src
    assert "as_out(v" not in src.split("embedding_rows(")[1].split("\n")[1]
    if tied == 0:  # W's gradient is the embedding's alone: written into .grad's buffer
        assert re.search(r"^ *embedding_rows_b\(.*, G\d+\)$", src, re.M), src


def test_float64_tables_equal_eager_bit_for_bit():
    src = _run((2, T), 1, dtype=sg.float64).source()
    assert "embedding_rows(" in src and "embedding_rows_b(" in src


def test_padding_idx_keeps_the_generic_path_and_equals_eager():
    """A padding row (no gradient for it) is not the plain case: the op's stanza forward
    and node backward, and eager's values."""
    src = _run((3, T), 1, padding_idx=2).source()
    assert src.count("embedding_rows(") == 1  # the positions' lookup only
    assert "fwd_embedding" in src and "bwd_embedding" in src


@pytest.mark.parametrize("bad", [V, V + 1000, -1])
@pytest.mark.parametrize("backward", [True, False])
def test_an_index_out_of_range_after_compilation_raises_as_eager(bad, backward):
    """Indices are data: one out of range on a call of the compiled code raises eager's
    IndexError and message in the forward (also with no backward after it), writes nothing
    (parameters, .grad, optimizer state stay as eager's), and the next calls equal eager's
    again. (No zero_grad in the step: eager's would clear .grad before its forward
    raises.)"""
    m = _Model()
    e = copy.deepcopy(m)
    step = sg.compile(m.step(1, zero_grad=False, backward=backward))
    eager = e.step(1, zero_grad=False, backward=backward)
    for k in range(2):
        data = _data((3, T), k)
        _call(step, *data), eager(*data)
    assert "embedding_rows(" in step.source()
    idx, c, c2 = _data((3, T), 5)
    a = idx.numpy().copy()
    a[1, 2] = bad
    with pytest.raises(IndexError) as want:
        eager(sg.tensor(a), c, c2)
    with pytest.raises(IndexError) as got:
        _call(step, sg.tensor(a), c, c2)
    assert str(got.value) == str(want.value) == "index out of range in self"
    _same_state(m, e)
    for k in range(6, 8):
        data = _data((3, T), k)
        for x, y in zip(_call(step, *data), eager(*data)):
            _same_bits(x, y)
        _same_state(m, e)
    assert step.stats["traces"] == 1 and step.stats["fallbacks"] == []


def test_step_with_direct_embeddings_verifies():
    """The step with a tied table and three gradient terms for it verifies (``verify``:
    the traced forward proved, the generated gradients compared with eager's on a replay,
    the fused loops proved), with the direct lines in its code."""
    m = _Model()
    step = sg.compile(m.step(2))
    data = _data((2, T), 0)
    _call(step, *data)
    _call(step, *data)
    assert "embedding_rows_b(" in step.source()
    report = step.verify()
    assert report.ok, report


def test_verify_catches_a_wrong_embedding_gradient(monkeypatch):
    """The direct backward is checked by verify like any rule: a doubled gradient (the
    self-check at generation turned off) is reported as a mismatch naming the gradient."""
    import sys

    from symgrad.compile import rules

    monkeypatch.setattr(sys.modules["symgrad.compile.step"], "self_check", lambda *a: None)
    right = rules.RULES["embedding"]
    monkeypatch.setitem(rules.RULES, "embedding",
                        lambda c, ctx, g: {0: f"(2 * {right(c, ctx, g)[0]})"})
    m = _Model()
    step = sg.compile(m.step(0))
    _call(step, *_data((2, T), 0))
    _call(step, *_data((2, T), 1))
    assert "(2 * embedding_rows_b(" in step.source()
    report = step.verify()
    assert not report.ok and report.status == "mismatch"
    assert report.bad_kernel.startswith("gradient of leaf")
