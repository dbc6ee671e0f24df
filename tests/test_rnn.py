"""The recurrent layers (issue 31, scope 4) against torch 2.13: RNN, LSTM, GRU and their cells.

torch's weights are copied into symgrad's modules (through ``load_state_dict``, so the names
must agree); values and the gradients w.r.t. the input, h0/c0 and every parameter must then
agree within a bound derived from the dtype and the length of the computation (see
``_terms``). Parameter names, order, shapes and reprs, the initialisation, error wording
side by side with torch, dropout between layers, and ``sg.verify`` on recurrent graphs.
"""

from __future__ import annotations

import collections
import gc
import math
import warnings
import weakref

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg
from symgrad.ops import OPS

CLASSES = ("RNN", "LSTM", "GRU")
I, H, T, B = 3, 4, 4, 2  # input size, hidden size, sequence length, batch


def _np(t) -> np.ndarray:
    return np.asarray(t.detach().cpu().numpy()) if hasattr(t, "cpu") else \
        np.asarray(t.detach().numpy())


def _pair(torch, cls: str, dtype, *args, **kwargs):
    """torch's module and symgrad's with torch's weights (loaded by name, strictly)."""
    tdt, sdt = {"float32": (torch.float32, sg.float32),
                "float64": (torch.float64, sg.float64)}[dtype]
    theirs = getattr(torch.nn, cls)(*args, dtype=tdt, **kwargs)
    ours = getattr(sg.nn, cls)(*args, dtype=sdt, **kwargs)
    state = {k: sg.tensor(_np(v)) for k, v in theirs.state_dict().items()}
    assert repr(ours.load_state_dict(state, strict=True)) == "<All keys matched successfully>"
    return theirs, ours


def _data(shape, seed: int, dtype: str) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=shape).astype(dtype)


def _terms(m, steps: int, batch: int) -> tuple[int, int]:
    """Rounding errors a forward (and a backward) can pile up: ``(forward, backward)``.

    One step of a layer is a dot product over ``in + hidden`` features plus the two biases
    and at most ten elementwise ops (LSTM: add, 3 sigmoid, 2 tanh, 3 mul, add); the steps of
    a layer run in a chain, and each layer runs over the whole output sequence of the one
    below (the reverse direction is a parallel chain of the same length). The backward runs
    that chain again, a parameter's gradient is in addition summed over time and batch, and
    the weighted-sum loss adds one term per output element (output and final states: at
    most ``2 * steps * batch * width``).
    """
    hidden, width, layers = m.hidden_size, m.input_size, 1
    if hasattr(m, "num_layers"):
        layers = m.num_layers
        width = max(width, hidden * (2 if m.bidirectional else 1))
    forward = layers * steps * (width + hidden + 2 + 10)
    return forward, 2 * forward + steps * batch + 2 * steps * batch * width


def _loss(lib, outs, seed: int):
    """Weighted sum of every output (weights in [-1, 1], fixed per output)."""
    total = 0
    for k, o in enumerate(outs):
        w = _data(tuple(o.shape), seed + k, str(o.dtype).split(".")[-1])
        total = total + (o * lib.tensor(w)).sum()
    return total


def _flat(result):
    """``(output, h_n)`` or ``(output, (h_n, c_n))`` (or a cell's result) as a list."""
    if not isinstance(result, tuple):
        return [result]
    out = []
    for r in result:
        out.extend(r if isinstance(r, tuple) else [r])
    return out


def _compare(torch, theirs, ours, arrays, call, steps, batch):
    """Run ``call(lib, module, *leaves)`` on both; compare outputs and all gradients."""
    results = {}
    for lib, m in ((torch, theirs), (sg, ours)):
        leaves = [lib.tensor(a, requires_grad=True) for a in arrays]
        outs = _flat(call(lib, m, *leaves))
        _loss(lib, outs, 100).backward()
        grads = [x.grad for x in leaves] + [p.grad for _, p in m.named_parameters()]
        results[lib] = (outs, grads, [n for n, _ in m.named_parameters()])
    (t_outs, t_grads, t_names), (s_outs, s_grads, s_names) = results[torch], results[sg]
    assert s_names == t_names
    fwd, bwd = _terms(ours, steps, batch)
    scale = magnitude(*arrays, *[_np(p) for p in theirs.parameters()])
    assert len(s_outs) == len(t_outs)
    for k, (a, e) in enumerate(zip(s_outs, t_outs, strict=True)):
        assert a.dtype == getattr(sg, str(e.dtype).split(".")[-1])
        assert_close(a, e, terms=fwd, scale=max(scale, magnitude(e)), msg=f"output {k}")
    labels = [f"input {k}" for k in range(len(arrays))] + [f"grad {n}" for n in t_names]
    for label, a, e in zip(labels, s_grads, t_grads, strict=True):
        assert a is not None and e is not None, label
        assert_close(a, e, terms=bwd, scale=max(scale, magnitude(e)), msg=label)


def _run_module(lib, m, x, *state):
    if not state:
        return m(x)
    return m(x, (state[0], state[1]) if len(state) == 2 else state[0])


# -- values and gradients against torch ------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("cls", CLASSES)
def test_sequence_values_and_gradients_match_torch(torch, cls, batch_first, bidirectional,
                                                   num_layers, dtype):
    theirs, ours = _pair(torch, cls, dtype, I, H, num_layers, batch_first=batch_first,
                         bidirectional=bidirectional)
    d = 2 if bidirectional else 1
    x = _data((B, T, I) if batch_first else (T, B, I), 1, dtype)
    states = [_data((num_layers * d, B, H), 2 + k, dtype) for k in
              range(2 if cls == "LSTM" else 1)]
    _compare(torch, theirs, ours, [x, *states], _run_module, T, B)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("cls", CLASSES)
def test_unbatched_input_matches_torch(torch, cls, with_state, batch_first):
    """2-D input (batch_first ignored, as torch), hx 2-D; results without the batch dim."""
    theirs, ours = _pair(torch, cls, "float64", I, H, 2, bidirectional=True,
                         batch_first=batch_first)
    x = _data((T, I), 3, "float64")
    states = [_data((4, H), 4 + k, "float64") for k in range(2 if cls == "LSTM" else 1)]
    arrays = [x, *states] if with_state else [x]
    _compare(torch, theirs, ours, arrays, _run_module, T, 1)
    out, hidden = ours(sg.tensor(x))
    assert out.shape == (T, 2 * H)
    for h in (hidden if cls == "LSTM" else (hidden,)):
        assert h.shape == (4, H)


@pytest.mark.parametrize("kwargs", [
    {"cls": "RNN", "nonlinearity": "relu"},
    {"cls": "RNN", "bias": False},
    {"cls": "LSTM", "bias": False, "bidirectional": True},
    {"cls": "GRU", "bias": False, "num_layers": 2},
    {"cls": "LSTM", "proj_size": 2, "num_layers": 2, "bidirectional": True},
    {"cls": "LSTM", "proj_size": 3, "batch_first": True, "bias": False},
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
def test_variants_match_torch(torch, kwargs, dtype):
    """relu, no bias, LSTM projections (h is proj_size wide, c hidden_size wide)."""
    kwargs = dict(kwargs)
    cls = kwargs.pop("cls")
    theirs, ours = _pair(torch, cls, dtype, I, H, **kwargs)
    d = 2 if kwargs.get("bidirectional") else 1
    n = kwargs.get("num_layers", 1) * d
    x = _data((B, T, I) if kwargs.get("batch_first") else (T, B, I), 5, dtype)
    if cls == "LSTM":
        states = [_data((n, B, kwargs.get("proj_size") or H), 6, dtype),
                  _data((n, B, H), 7, dtype)]
    else:
        states = [_data((n, B, H), 6, dtype)]
    _compare(torch, theirs, ours, [x, *states], _run_module, T, B)
    _compare(torch, theirs, ours, [x], _run_module, T, B)  # zero initial state


def _run_cell_chain(lib, m, x, *state):
    """Three steps of a cell over the rows of ``x`` (the state carried along)."""
    hidden = None if not state else (state if len(state) == 2 else state[0])
    outs = []
    for t in range(x.shape[0]):
        hidden = m(x[t], hidden)
        outs.extend(hidden if isinstance(hidden, tuple) else (hidden,))
    return tuple(outs)


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kwargs", [
    {"cls": "RNNCell"}, {"cls": "RNNCell", "nonlinearity": "relu", "bias": False},
    {"cls": "LSTMCell"}, {"cls": "LSTMCell", "bias": False}, {"cls": "GRUCell"},
    {"cls": "GRUCell", "bias": False},
])
def test_cells_match_torch(torch, kwargs, dtype, batched):
    kwargs = dict(kwargs)
    cls = kwargs.pop("cls")
    theirs, ours = _pair(torch, cls, dtype, I, H, **kwargs)
    steps = 3
    x = _data((steps, B, I) if batched else (steps, I), 8, dtype)
    states = [_data((B, H) if batched else (H,), 9 + k, dtype)
              for k in range(2 if cls == "LSTMCell" else 1)]
    _compare(torch, theirs, ours, [x, *states], _run_cell_chain, steps, B)
    _compare(torch, theirs, ours, [x], _run_cell_chain, steps, B)
    result = ours(sg.tensor(x[0]))
    for r in (result if cls == "LSTMCell" else (result,)):
        assert r.shape == ((B, H) if batched else (H,))


# -- parameters, init, repr --------------------------------------------------------------------
@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_named_parameters_order_and_shapes_match_torch(torch, cls, num_layers, bidirectional,
                                                       bias):
    args = dict(num_layers=num_layers, bidirectional=bidirectional, bias=bias)
    theirs, ours = getattr(torch.nn, cls)(I, H, **args), getattr(sg.nn, cls)(I, H, **args)
    expect = [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == expect
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert ours._flat_weights_names == theirs._flat_weights_names
    assert [[tuple(p.shape) for p in ws] for ws in ours.all_weights] == \
        [[tuple(p.shape) for p in ws] for ws in theirs.all_weights]
    assert all(p.dtype == sg.float32 and p.requires_grad for p in ours.parameters())


def test_lstm_projection_parameters_match_torch(torch):
    args = dict(num_layers=2, bidirectional=True, proj_size=2)
    theirs, ours = torch.nn.LSTM(I, H, **args), sg.nn.LSTM(I, H, **args)
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]


@pytest.mark.parametrize("cls", ["RNNCell", "LSTMCell", "GRUCell"])
@pytest.mark.parametrize("bias", [True, False])
def test_cell_parameters_match_torch(torch, cls, bias):
    theirs, ours = getattr(torch.nn, cls)(I, H, bias=bias), getattr(sg.nn, cls)(I, H, bias=bias)
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]
    assert (ours.bias_ih is None) == (not bias)


@pytest.mark.parametrize("cls", ["LSTM", "GRUCell"])
def test_init_draws_uniform_in_parameter_order(cls):
    """Every parameter from U(-1/sqrt(H), 1/sqrt(H)), drawn in named_parameters order (torch's
    reset_parameters): replaying the generator in that order gives the same numbers."""
    kwargs = {"num_layers": 2, "bidirectional": True} if cls == "LSTM" else {}
    sg.manual_seed(11)
    m = getattr(sg.nn, cls)(I, H, dtype=sg.float64, **kwargs)
    sg.manual_seed(11)
    bound = 1 / math.sqrt(H)
    for name, p in m.named_parameters():
        replay = sg.nn.init.uniform_(sg.empty(*p.shape, dtype=sg.float64), -bound, bound)
        assert np.array_equal(_np(p), _np(replay)), name
        values = _np(p)
        assert (np.abs(values) <= bound).all() and values.std() > bound / 4, name
    before = [_np(p).copy() for p in m.parameters()]
    m.reset_parameters()
    assert all(not np.array_equal(a, _np(p)) for a, p in zip(before, m.parameters(), strict=True))


@pytest.mark.parametrize("make", [
    lambda nn: nn.LSTM(3, 4, 2, batch_first=True, dropout=0.5, bidirectional=True),
    lambda nn: nn.RNN(3, 4, nonlinearity="relu", bias=False),
    lambda nn: nn.GRU(3, 4),
    lambda nn: nn.LSTM(3, 4, proj_size=2),
    lambda nn: nn.RNNCell(3, 4, nonlinearity="relu"),
    lambda nn: nn.LSTMCell(3, 4, bias=False),
    lambda nn: nn.GRUCell(3, 4),
])
def test_repr_matches_torch(torch, make):
    assert repr(make(sg.nn)) == repr(make(torch.nn))


def test_module_conversions_keep_the_layer_working():
    """``double()`` converts every parameter and the forward follows (weights read afresh)."""
    m = sg.nn.GRU(I, H, 2).double()
    out, h = m(sg.tensor(_data((T, B, I), 12, "float64")))
    assert out.dtype == h.dtype == sg.float64 and out.shape == (T, B, H) and h.shape == (2, B, H)
    assert all(p.dtype == sg.float64 for p in m._flat_weights)


# -- dropout between layers ------------------------------------------------------------------
def test_dropout_applies_between_layers_only_while_training(torch):
    """With p=1 the second layer sees zeros (torch's output too); eval drops nothing."""
    theirs, ours = _pair(torch, "LSTM", "float64", I, H, 2, dropout=1.0)
    x = _data((T, B, I), 13, "float64")
    for mode in ("train", "eval"):
        getattr(theirs, mode)()
        getattr(ours, mode)()
        t_out, (t_h, t_c) = theirs(torch.tensor(x))
        s_out, (s_h, s_c) = ours(sg.tensor(x))
        fwd, _ = _terms(ours, T, B)
        for a, e in ((s_out, t_out), (s_h, t_h), (s_c, t_c)):
            assert_close(a, e, terms=fwd, scale=1.0, msg=mode)
    theirs.train()
    ours.train()
    ref = sg.nn.LSTM(H, H, 1, dtype=sg.float64)  # layer 1 alone on a zero input
    ref.load_state_dict({k[:-1] + "0": v for k, v in ours.state_dict().items()
                         if k.endswith("l1")})
    expect, _ = ref(sg.zeros(T, B, H, dtype=sg.float64))
    assert np.array_equal(_np(ours(sg.tensor(x))[0]), _np(expect))


def test_dropout_half_draws_a_mask_in_training():
    sg.manual_seed(5)
    m = sg.nn.GRU(I, H, 2, dropout=0.5, dtype=sg.float64)
    x = sg.tensor(_data((T, B, I), 14, "float64"))
    m.eval()
    plain, _ = m(x)
    m.train()
    a, _ = m(x)
    b, _ = m(x)
    assert not np.array_equal(_np(a), _np(plain)) and not np.array_equal(_np(a), _np(b))


def test_dropout_with_one_layer_warns_as_torch(torch):
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        torch.nn.LSTM(3, 3, dropout=0.5)
    with warnings.catch_warnings(record=True) as ours:
        warnings.simplefilter("always")
        sg.nn.LSTM(3, 3, dropout=0.5)
    assert [(w.category, str(w.message)) for w in ours] == \
        [(w.category, str(w.message)) for w in theirs]
    assert ours[0].filename == __file__  # points at the caller


# -- error wording side by side with torch -------------------------------------------------
def _z(lib, *shape, dtype=None):
    return lib.zeros(*shape, dtype=dtype or lib.float32)


ERRORS = [
    lambda L: L.nn.LSTMCell(10, 20)(_z(L, 3, 5)),
    lambda L: L.nn.LSTMCell(10, 20)(_z(L, 3, 10), (_z(L, 2, 20), _z(L, 3, 20))),
    lambda L: L.nn.LSTMCell(10, 20)(_z(L, 3, 10), (_z(L, 3, 21), _z(L, 3, 20))),
    lambda L: L.nn.LSTMCell(10, 20)(_z(L, 3, 10), (_z(L, 3, 20), _z(L, 3, 21))),
    lambda L: L.nn.LSTMCell(10, 20)(_z(L, 10), (_z(L, 3, 20), _z(L, 3, 20))),
    lambda L: L.nn.LSTMCell(10, 20)(_z(L, 3, 10), (_z(L, 3, 20),)),
    lambda L: L.nn.LSTMCell(10, 20)(_z(L, 3, 10), (_z(L, 3, 20), _z(L, 3, 20, 1))),
    lambda L: L.nn.LSTMCell(10, 20)(_z(L, 3, 10, 1)),
    lambda L: L.nn.LSTMCell(10, 20)(_z(L, 3, 10, dtype=L.float64)),
    lambda L: L.nn.GRUCell(10, 20)(_z(L, 3, 5)),
    lambda L: L.nn.GRUCell(10, 20)(_z(L, 3, 10), _z(L, 2, 20)),
    lambda L: L.nn.GRUCell(10, 20)(_z(L, 3, 10), _z(L, 3, 21)),
    lambda L: L.nn.GRUCell(10, 20)(_z(L, 3, 10), _z(L, 1, 3, 20)),
    lambda L: L.nn.RNNCell(10, 20)(_z(L, 3, 5)),
    lambda L: L.nn.RNNCell(10, 20)(_z(L, 3, 10), _z(L, 2, 20)),
    lambda L: L.nn.RNNCell(10, 20)(_z(L, 3, 10, 1)),
    lambda L: L.nn.RNNCell(10, 20, nonlinearity="foo")(_z(L, 3, 10)),
    lambda L: L.nn.LSTM(10, 20)(_z(L, 5, 3, 5)),
    lambda L: L.nn.LSTM(10, 20)(_z(L, 5, 3, 10), (_z(L, 2, 3, 20), _z(L, 1, 3, 20))),
    lambda L: L.nn.LSTM(10, 20)(_z(L, 5, 3, 10), (_z(L, 1, 3, 20), _z(L, 2, 3, 20))),
    lambda L: L.nn.LSTM(10, 20)(_z(L, 5, 3, 10), (_z(L, 1, 3, 20), _z(L, 3, 20))),
    lambda L: L.nn.LSTM(10, 20)(_z(L, 5, 10), (_z(L, 1, 3, 20), _z(L, 1, 20))),
    lambda L: L.nn.LSTM(10, 20, batch_first=True)(_z(L, 5, 3, 10),
                                                  (_z(L, 1, 3, 20), _z(L, 1, 3, 20))),
    lambda L: L.nn.LSTM(10, 20, proj_size=5)(_z(L, 5, 3, 10),
                                             (_z(L, 1, 3, 20), _z(L, 1, 3, 20))),
    lambda L: L.nn.LSTM(10, 20)(_z(L, 5, 3, 10, 1)),
    lambda L: L.nn.LSTM(10, 20)(_z(L, 0, 3, 10)),
    lambda L: L.nn.GRU(10, 20)(_z(L, 5, 3, 5)),
    lambda L: L.nn.GRU(10, 20)(_z(L, 5, 3, 10), _z(L, 2, 3, 20)),
    lambda L: L.nn.GRU(10, 20)(_z(L, 5, 3, 10), _z(L, 3, 20)),
    lambda L: L.nn.GRU(10, 20)(_z(L, 5, 10), _z(L, 1, 3, 20)),
    lambda L: L.nn.GRU(10, 20, bidirectional=True)(_z(L, 5, 10), _z(L, 1, 20)),
    lambda L: L.nn.RNN(10, 20, 2)(_z(L, 5, 3, 10), _z(L, 1, 3, 20)),
    lambda L: L.nn.RNN(10, 20)(_z(L, 5, 3, 10, 2)),
    lambda L: L.nn.RNN(10, 20, nonlinearity="x"),
    lambda L: L.nn.GRU(10, 20, proj_size=2),
    lambda L: L.nn.RNN(10, 20, proj_size=2),
    lambda L: L.nn.RNN(10, 20, foo=2),
    lambda L: L.nn.LSTM(10, 20, dropout=2),
    lambda L: L.nn.LSTM(10, 20, dropout=True),
    lambda L: L.nn.LSTM(10, 0),
    lambda L: L.nn.LSTM(0, 3),
    lambda L: L.nn.LSTM(3, 3, num_layers=0),
    lambda L: L.nn.LSTM(3, 3, bias=1),
    lambda L: L.nn.LSTM(3, 3, batch_first=None),
    lambda L: L.nn.LSTM(3.0, 3),
    lambda L: L.nn.LSTM(3, 4, proj_size=-1),
    lambda L: L.nn.LSTM(3, 4, proj_size=4),
]


@pytest.mark.parametrize("case", range(len(ERRORS)))
def test_error_wording_matches_torch(torch, case):
    """Same exception type and message (dtype names spelt with the library's prefix)."""
    with pytest.raises(Exception) as theirs:
        ERRORS[case](torch)
    with pytest.raises(Exception) as ours:
        ERRORS[case](sg)
    assert type(ours.value).__name__ == type(theirs.value).__name__
    assert str(ours.value) == str(theirs.value).replace("torch.", "symgrad.")


def test_dtype_mismatch_names_both_dtypes():
    with pytest.raises(ValueError, match=r"RNN input dtype \(symgrad.float64\) does not match "
                                         r"weight dtype \(symgrad.float32\)"):
        sg.nn.GRU(3, 4)(sg.zeros(2, 1, 3, dtype=sg.float64))


# -- the graph ----------------------------------------------------------------------------------
def _node_names(root) -> collections.Counter:
    seen, stack, names = set(), [root], collections.Counter()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        names[node.name().replace("torch::autograd::", "")] += 1
        stack.extend(n for n, _ in node.next_functions)
    return names


@pytest.mark.parametrize("cls", [*CLASSES, "RNNCell", "LSTMCell", "GRUCell"])
def test_recorded_graph_has_torch_nodes(torch, cls):
    """The nodes torch records for float64 (its decomposed CPU path), one for one, the gates
    cut by ``unsafe_chunk`` (UnsafeSplitBackward0) included."""
    cell = cls.endswith("Cell")
    theirs, ours = _pair(torch, cls, "float64", I, H, *(() if cell else (2,)),
                         **({} if cell else {"bidirectional": True}))
    x = _data((B, I) if cell else (T, B, I), 20, "float64")
    n_states = 2 if cls.startswith("LSTM") else 1
    h = [_data((B, H) if cell else (4, B, H), 21 + k, "float64") for k in range(n_states)]
    counts = []
    for lib, m in ((torch, theirs), (sg, ours)):
        states = [lib.tensor(a, requires_grad=True) for a in h]
        out = m(lib.tensor(x, requires_grad=True), tuple(states) if n_states == 2 else states[0])
        first = out if not isinstance(out, tuple) else out[0]
        counts.append(_node_names(first.grad_fn))
    gated = not cls.startswith("RNN")  # LSTM and GRU cut their gates with unsafe_chunk
    assert (counts[0]["UnsafeSplitBackward0"] > 0) == gated
    assert counts[1] == counts[0]


def test_no_reference_cycles_in_recurrent_graphs(no_gc):
    m = sg.nn.LSTM(I, H, 2, bidirectional=True)
    x = sg.randn(T, B, I, requires_grad=True)
    out, (h, c) = m(x)
    (out.sum() + h.sum() + c.sum()).backward()
    ref = weakref.ref(m.weight_ih_l1_reverse)
    del m, out, h, c, x
    assert ref() is None
    assert gc.collect() == 0


def _lstm_cell_loss():
    sg.manual_seed(2)
    cell = sg.nn.LSTMCell(3, 2, dtype=sg.float64)
    x = sg.tensor(_data((2, 3), 15, "float64"), requires_grad=True)
    h = sg.tensor(_data((2, 2), 16, "float64"), requires_grad=True)
    c = sg.tensor(_data((2, 2), 17, "float64"), requires_grad=True)
    h1, c1 = cell(x, (h, c))
    h2, c2 = cell(h1[:, :1].expand(2, 3) * x, (h1, c1))
    return (h2 * sg.tensor([[1.0, -2.0], [0.5, 3.0]], dtype=sg.float64)).sum() + c2.sum()


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_verify_lstm_cell_graph(mode):
    rep = sg.verify(_lstm_cell_loss(), mode=mode)
    assert rep.ok and rep.mode == mode, str(rep)


def _lstm_loss():
    sg.manual_seed(3)
    m = sg.nn.LSTM(2, 2, 1, bidirectional=True, dtype=sg.float64)
    x = sg.tensor(_data((2, 1, 2), 18, "float64"), requires_grad=True)
    out, (h, c) = m(x)
    return (out * sg.tensor(_data(tuple(out.shape), 19, "float64"))).sum() + h.sum() + c.sum()


def test_verify_lstm_ok_and_a_planted_wrong_sigmoid_gradient_is_caught(monkeypatch):
    good = sg.verify(_lstm_loss(), mode="local")
    assert good.ok, str(good)
    monkeypatch.setitem(OPS["sigmoid"].grads, "self",
                        lambda grad, result: grad * result * (1 - result) * 1.001)
    root = _lstm_loss()
    root.backward(retain_graph=True)  # the planted bug is real: the engine uses it
    rep = sg.verify(root, mode="local")
    assert not rep.ok, str(rep)
    bad = [r.node for r in rep.nodes if r.status in ("mismatch", "error")]
    assert bad and all(n.name() == "SigmoidBackward0" for n in bad), str(rep)
    assert rep.first_bad_node.name() == "SigmoidBackward0", str(rep)
