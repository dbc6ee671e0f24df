"""Packed sequences (``nn.utils.rnn``) and the recurrent layers on them, against torch 2.13.

Packing, padding and unpacking only move numbers (slices, cat, stack, index_select), so
their values and gradients are compared exactly. The layers on a packed batch (sequences
of different lengths: each step runs the sequences still going, the reverse direction
starts each at its own end) compare within tests/test_rnn.py's bound from the dtype and the
length of the computation, gradients w.r.t. the padded input, h0/c0 and every parameter.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_rnn as R  # tests/ is on sys.path under pytest
from _tolerance import assert_close, magnitude

import symgrad as sg

torch = pytest.importorskip("torch")

T, B, I, H = 5, 4, 3, 2
LENGTHS = [3, 5, 1, 4]  # unsorted, one of full length, one of length 1


def _padded(seed: int = 0, batch_first: bool = False) -> np.ndarray:
    return R._data((B, T, I) if batch_first else (T, B, I), seed, "float64")


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("sort", ["sorted", "unsorted", "tensor lengths"])
def test_pack_and_pad_match_torch_values_and_gradients(batch_first, sort):
    x_np = _padded(1, batch_first)
    lengths = sorted(LENGTHS, reverse=True) if sort == "sorted" else LENGTHS
    got = {}
    for L in (torch, sg):
        x = L.tensor(x_np, requires_grad=True)
        lens = L.tensor(lengths) if sort == "tensor lengths" else lengths
        p = L.nn.utils.rnn.pack_padded_sequence(x, lens, batch_first=batch_first,
                                                enforce_sorted=sort == "sorted")
        padded, out_lens = L.nn.utils.rnn.pad_packed_sequence(
            p, batch_first=batch_first, padding_value=-2.5, total_length=T + 1)
        w = L.tensor(R._data(tuple(padded.shape), 7, "float64"))
        ((padded * w).sum() + (p.data * p.data).sum()).backward()
        got[L] = [R._np(p.data), R._np(p.batch_sizes)] + [
            None if t is None else R._np(t) for t in (p.sorted_indices, p.unsorted_indices)] + [
            R._np(padded), R._np(out_lens), R._np(x.grad)]
        assert type(p).__name__ == "PackedSequence" and p._fields == (
            "data", "batch_sizes", "sorted_indices", "unsorted_indices")
    for label, a, e in zip(["data", "batch_sizes", "sorted_indices", "unsorted_indices",
                            "padded", "lengths", "grad"], got[sg], got[torch]):
        if e is None:
            assert a is None, label
        else:
            assert a.dtype == e.dtype, label
            np.testing.assert_array_equal(a, e, err_msg=label)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_pack_unpack_unpad_sequence_match_torch(batch_first, side):
    seqs_np = [R._data((n, I), 10 + n, "float64") for n in LENGTHS]
    got = {}
    for L in (torch, sg):
        U = L.nn.utils.rnn
        seqs = [L.tensor(a, requires_grad=True) for a in seqs_np]
        padded = U.pad_sequence(seqs, batch_first=batch_first, padding_value=1.5,
                                padding_side=side)
        packed = U.pack_sequence(seqs, enforce_sorted=False)
        back = U.unpack_sequence(packed)
        unpadded = U.unpad_sequence(U.pad_sequence(seqs, batch_first), L.tensor(LENGTHS),
                                    batch_first)
        loss = (padded * padded).sum() + sum((b * (k + 1)).sum() for k, b in enumerate(back))
        loss = loss + sum(u.sum() for u in unpadded)
        loss.backward()
        got[L] = [R._np(padded), R._np(packed.data)] + [R._np(b) for b in back] + [
            R._np(u) for u in unpadded] + [R._np(s.grad) for s in seqs]
    assert len(got[sg]) == len(got[torch])
    for a, e in zip(got[sg], got[torch]):
        np.testing.assert_array_equal(a, e)


BAD = [
    ("unsorted with enforce_sorted",
     lambda L, x: L.nn.utils.rnn.pack_padded_sequence(x, [1, 5, 2, 3])),
    ("a zero length", lambda L, x: L.nn.utils.rnn.pack_padded_sequence(x, [5, 3, 2, 0])),
    ("too few lengths", lambda L, x: L.nn.utils.rnn.pack_padded_sequence(x, [5, 3])),
    ("total_length too small", lambda L, x: L.nn.utils.rnn.pad_packed_sequence(
        L.nn.utils.rnn.pack_padded_sequence(x, [5, 3, 2, 1]), total_length=4)),
    ("padding_side", lambda L, x: L.nn.utils.rnn.pad_sequence([x[0]], padding_side="top")),
    ("packed hx of the wrong batch", lambda L, x: L.nn.GRU(I, H, dtype=x.dtype)(
        L.nn.utils.rnn.pack_padded_sequence(x, [5, 3, 2, 1]), L.zeros(1, 3, H,
                                                                       dtype=x.dtype))),
]


@pytest.mark.parametrize("label,call", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_torch_errors(label, call):
    errors = []
    for L in (torch, sg):
        with pytest.raises(Exception) as info:
            call(L, L.tensor(_padded(2)))
        errors.append((type(info.value), str(info.value)))
    assert errors[1] == errors[0]


def test_a_length_beyond_the_padding_is_refused():
    """torch reads past the padded input there (no check); symgrad names the problem."""
    with pytest.raises(RuntimeError, match="a length of 6 exceeds the 5 time steps"):
        sg.nn.utils.rnn.pack_padded_sequence(sg.tensor(_padded(2)), [6, 3, 2, 1])


def _packed_run(lib, m, x, *state, lengths=LENGTHS, batch_first=False):
    U = lib.nn.utils.rnn
    packed = U.pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    hx = None if not state else (tuple(state) if len(state) == 2 else state[0])
    out, hidden = m(packed, hx)
    assert isinstance(out, U.PackedSequence)
    padded, _ = U.pad_packed_sequence(out, batch_first=batch_first)
    return (padded, hidden)


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("cls,kwargs", [
    ("RNN", {"num_layers": 2, "bidirectional": True}),
    ("GRU", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("LSTM", {"proj_size": 1, "batch_first": True}),
], ids=["rnn", "gru-batch-first", "lstm", "lstm-proj"])
def test_layers_on_packed_sequences_match_torch(cls, kwargs, with_state):
    theirs, ours = R._pair(torch, cls, "float64", I, H, **kwargs)
    batch_first = kwargs.get("batch_first", False)
    d = 2 if kwargs.get("bidirectional") else 1
    layers = kwargs.get("num_layers", 1)
    out = kwargs.get("proj_size") or H
    arrays = [_padded(3, batch_first)]
    if with_state:
        arrays.append(R._data((layers * d, B, out), 4, "float64"))
        if cls == "LSTM":
            arrays.append(R._data((layers * d, B, H), 5, "float64"))

    def call(lib, m, x, *state):
        return _packed_run(lib, m, x, *state, batch_first=batch_first)

    R._compare(torch, theirs, ours, arrays, call, T, B)


def test_packed_output_is_the_unpacked_run_of_each_sequence():
    """A sequence packed with longer ones gives what it gives alone (its own final state)."""
    sg.manual_seed(0)
    m = sg.nn.LSTM(I, H, bidirectional=True, dtype=sg.float64)
    x = _padded(6)
    padded, (h, c) = _packed_run(sg, m, sg.tensor(x))
    for b, n in enumerate(LENGTHS):
        alone, (h1, c1) = m(sg.tensor(x[:n, b:b + 1]))
        scale = magnitude(alone, h1, c1)
        fwd, _ = R._terms(m, T, 1)
        assert_close(padded[:n, b:b + 1], alone, terms=fwd, scale=scale)
        assert_close(h[:, b:b + 1], h1, terms=fwd, scale=scale)
        assert_close(c[:, b:b + 1], c1, terms=fwd, scale=scale)
        assert (padded[n:, b].detach().numpy() == 0).all()


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_verify_checks_a_packed_lstm(mode):
    sg.manual_seed(1)
    m = sg.nn.LSTM(2, 2, dtype=sg.float64)
    x = sg.tensor(R._data((3, 2, 2), 8, "float64"), requires_grad=True)
    with sg.record():  # keeps the padding's values, which no backward saves
        padded, (h, c) = _packed_run(sg, m, x, lengths=[2, 3])
        root = (padded * padded).sum() + h.sum() * c.sum()
    report = sg.verify(root, mode=mode)
    assert report.ok, report
