"""symgrad.utils.data against torch.utils.data: datasets, samplers, default_collate and the
DataLoader give the same batches (types, shapes, dtypes, values), lengths and errors; the
shuffle order is symgrad's own (documented) but a permutation, reproducible from a seed or
a generator, new every epoch. Last, a small classifier written for torch (DataLoader,
CrossEntropyLoss with label smoothing, SGD with Nesterov momentum, StepLR, clip_grad_norm_)
runs with only the import changed and prints the same numbers."""

from __future__ import annotations

import collections
import importlib
import warnings

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad.utils import data as D


def _data(lib):
    return importlib.import_module(lib.__name__ + ".utils.data")


def _show(x):
    """A batch as plain Python: type names, dtypes (library name removed), values."""
    if hasattr(x, "tolist") and hasattr(x, "dtype") and not isinstance(x, np.ndarray):
        return ("Tensor", str(x.dtype).split(".")[-1], tuple(x.shape), x.tolist())
    if isinstance(x, dict):
        return {k: _show(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [_show(v) for v in x])
    return x


def _tensor_ds(lib):
    X = lib.tensor(np.arange(20.0).reshape(10, 2))
    Y = lib.tensor(np.arange(10))
    return _data(lib).TensorDataset(X, Y)


@pytest.mark.parametrize("kw", [dict(), dict(batch_size=3), dict(batch_size=3, drop_last=True),
                                dict(batch_size=4), dict(batch_size=10), dict(batch_size=11),
                                dict(batch_size=None), dict(batch_size=2, shuffle=False)])
def test_tensor_dataset_batches_match_torch(kw, torch):
    out = {}
    for lib in (sg, torch):
        ds = _tensor_ds(lib)
        dl = _data(lib).DataLoader(ds, **kw)
        out[lib] = (len(ds), _show(ds[3]), len(dl), [_show(b) for b in dl])
    assert out[sg] == out[torch]


class _Records:
    def __init__(self, lib):
        self.Base = _data(lib).Dataset

    def make(self):
        class P(self.Base):
            def __len__(self):
                return 5

            def __getitem__(self, i):
                return {"x": float(i), "n": i, "s": str(i), "a": np.array([i, i + 1.5]),
                        "t": (i, [1.0, 2.0]), "b": i % 2 == 0, "f": np.float32(i) / 2}

        return P()


Pt = collections.namedtuple("Pt", "x y")


def test_default_collate_of_records_matches_torch(torch):
    out = {}
    for lib in (sg, torch):
        L = _data(lib)
        batches = [_show(b) for b in L.DataLoader(_Records(lib).make(), batch_size=2)]
        named = [_show(b) for b in L.DataLoader(
            [Pt(lib.tensor([float(i)]), np.float64(i)) for i in range(4)], batch_size=3)]
        unbatched = [_show(b) for b in L.DataLoader([np.array([1.0, 2.0])], batch_size=None)]
        out[lib] = (batches, named, unbatched, _show(L.default_convert((1, np.float64(2.0)))),
                    [str(L.default_collate(v).dtype).split(".")[-1]
                     for v in ([1, 2], [1.0, 2.0], [True, False], [np.float32(1)])])
    assert out[sg] == out[torch]


def test_iterable_dataset_matches_torch(torch):
    out = {}
    for lib in (sg, torch):
        L = _data(lib)

        class It(L.IterableDataset):
            def __iter__(self):
                return iter(range(7))

            def __len__(self):
                return 7

        out[lib] = ([_show(b) for b in L.DataLoader(It(), batch_size=3)],
                    [_show(b) for b in L.DataLoader(It(), batch_size=3, drop_last=True)],
                    len(L.DataLoader(It(), batch_size=3)),
                    len(L.DataLoader(It(), batch_size=3, drop_last=True)),
                    [_show(b) for b in L.DataLoader(It(), batch_size=None)][:2])
    assert out[sg] == out[torch]


def _errors(lib):
    L = _data(lib)
    ds = _tensor_ds(lib)

    class It(L.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    msgs = []
    for bad in (lambda: L.DataLoader(ds, shuffle=True, sampler=L.SequentialSampler(ds)),
                lambda: L.DataLoader(ds, batch_size=0),
                lambda: L.DataLoader(ds, batch_size=2, drop_last=1),
                lambda: L.DataLoader(ds, batch_sampler=L.BatchSampler(range(3), 2, False),
                                     batch_size=2),
                lambda: L.DataLoader(ds, batch_size=None, drop_last=True),
                lambda: L.TensorDataset(ds.tensors[0], ds.tensors[1][:3]),
                lambda: L.DataLoader(It(), shuffle=True),
                lambda: L.random_split(ds, [3, 3]),
                lambda: L.random_split(ds, [1.2, -0.2]),
                lambda: list(L.DataLoader([object(), object()], batch_size=2)),
                lambda: list(L.DataLoader([[1, 2], [1]], batch_size=2)),
                lambda: list(L.DataLoader([np.array(["a"])], batch_size=1)),
                lambda: L.DataLoader(ds, num_workers=-1),
                lambda: L.DataLoader(ds, prefetch_factor=2),
                lambda: L.RandomSampler([]),
                lambda: L.RandomSampler(ds, replacement=1)):
        try:
            bad()
            msgs.append("no error")
        except Exception as e:  # noqa: BLE001  (the type and text are compared)
            msgs.append(f"{type(e).__name__}: {e}".replace(lib.__name__, "LIB"))
    return msgs


def test_errors_match_torch(torch):
    assert _errors(sg) == _errors(torch)


def test_samplers_and_splits_match_torch_where_they_are_deterministic(torch):
    out = {}
    for lib in (sg, torch):
        L = _data(lib)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            parts = L.random_split(range(3), [0.5, 0.5, 0.0])
        out[lib] = ([len(p) for p in parts], [str(x.message) for x in w],
                    [len(p) for p in L.random_split(range(10), [0.33, 0.33, 0.34])],
                    [len(p) for p in L.random_split(range(11), [0.3, 0.7])],
                    list(L.BatchSampler(L.SequentialSampler(range(10)), 4, False)),
                    list(L.BatchSampler(range(10), 4, True)),
                    len(L.BatchSampler(range(10), 4, True)),
                    len(_tensor_ds(lib) + _tensor_ds(lib)),
                    _show((_tensor_ds(lib) + _tensor_ds(lib))[12]),
                    _show(L.Subset(_tensor_ds(lib), [5, 1])[1]),
                    len(L.RandomSampler(range(5), replacement=True, num_samples=12)))
    assert out[sg] == out[torch]


def _epoch_orders(loader, epochs=3):
    return [sum((b[1].tolist() for b in loader), []) for _ in range(epochs)]


def test_shuffle_is_a_fresh_permutation_each_epoch_reproducible_from_a_seed():
    ds = _tensor_ds(sg)
    sg.manual_seed(0)
    a = _epoch_orders(D.DataLoader(ds, batch_size=3, shuffle=True))
    sg.manual_seed(0)
    b = _epoch_orders(D.DataLoader(ds, batch_size=3, shuffle=True))
    assert a == b
    assert all(sorted(o) == list(range(10)) for o in a)
    assert len({tuple(o) for o in a}) == 3  # a new order every epoch
    # a seeded generator: independent of the global seed, advancing between epochs
    g1 = np.random.default_rng(7)
    c = _epoch_orders(D.DataLoader(ds, batch_size=4, shuffle=True, generator=g1))
    sg.manual_seed(123)
    d = _epoch_orders(D.DataLoader(ds, batch_size=4, shuffle=True,
                                   generator=np.random.default_rng(7)))
    assert c == d and len({tuple(o) for o in c}) == 3


def test_generator_objects_holding_a_numpy_generator_are_accepted():
    class Gen:  # the shape of a symgrad.Generator: manual_seed() returns it, _rng holds PCG64
        def manual_seed(self, n):
            self._rng = np.random.default_rng(n)
            return self

    ds = _tensor_ds(sg)
    a = _epoch_orders(D.DataLoader(ds, batch_size=5, shuffle=True,
                                   generator=Gen().manual_seed(3)), 2)
    b = _epoch_orders(D.DataLoader(ds, batch_size=5, shuffle=True,
                                   generator=np.random.default_rng(3)), 2)
    assert a == b
    parts = D.random_split(ds, [0.7, 0.3], generator=Gen().manual_seed(1))
    assert sorted(parts[0].indices + parts[1].indices) == list(range(10))
    with pytest.raises(TypeError, match="'generator' must be a symgrad.Generator"):
        list(D.DataLoader(ds, shuffle=True, generator=42))


def test_sampling_with_replacement_and_subset_sampler():
    r = list(D.RandomSampler(range(5), replacement=True, num_samples=40,
                             generator=np.random.default_rng(0)))
    assert len(r) == 40 and set(r) <= set(range(5))
    s = list(D.SubsetRandomSampler([7, 8, 9], generator=np.random.default_rng(0)))
    assert sorted(s) == [7, 8, 9]
    more = list(D.RandomSampler(range(4), num_samples=10, generator=np.random.default_rng(0)))
    assert sorted(more) == sorted(list(range(4)) * 2 + more[8:]) and len(more) == 10


# -- a training program, written for torch, run with the import changed ---------------------
PROGRAM = '''
import numpy as np
import {lib} as torch
import {lib}.nn as nn
import {lib}.nn.functional as F
from {lib}.utils.data import DataLoader, TensorDataset

rng = np.random.default_rng(0)
centers = rng.standard_normal((3, 4)) * 2
X = np.concatenate([c + rng.standard_normal((20, 4)) * 0.5 for c in centers])
Y = np.repeat(np.arange(3), 20)
perm = rng.permutation(60)
ds = TensorDataset(torch.tensor(X[perm], dtype=torch.float64), torch.tensor(Y[perm]))
loader = DataLoader(ds, batch_size=16, shuffle=False, drop_last=False)

model = nn.Sequential(nn.Linear(4, 8, dtype=torch.float64), nn.Tanh(),
                      nn.Linear(8, 3, dtype=torch.float64))
init = np.random.default_rng(1)
with torch.no_grad():
    for p in model.parameters():
        p.copy_(torch.tensor(init.uniform(-0.5, 0.5, tuple(p.shape))))
loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, nesterov=True,
                      weight_decay=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
for epoch in range(6):
    total = 0.0
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        total += loss.item() * len(yb)
    sched.step()
    correct = (model(ds.tensors[0]).argmax(1) == ds.tensors[1]).sum().item()
    print(f"epoch {{epoch}} loss {{total / len(ds):.12f}} norm {{norm.item():.12f}} "
          f"acc {{correct}} lr {{sched.get_last_lr()[0]}}")
'''


def _run_program(lib_name):
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's call order: no warning on either side
        exec(PROGRAM.format(lib=lib_name), {})
    return buf.getvalue().splitlines()


def test_a_torch_training_program_runs_with_the_import_changed(torch):
    ours, theirs = _run_program("symgrad"), _run_program("torch")
    assert len(ours) == len(theirs) == 6
    for a, b in zip(ours, theirs, strict=True):
        fa, fb = a.split(), b.split()
        assert fa[::2] == fb[::2]  # labels, and the integer accuracy
        assert fa[7] == fb[7] and fa[9] == fb[9]  # accuracy and lr: exact
        # float64 losses and norms after up to 24 steps: a step's roundings (forward, softmax
        # over 3, backward, clipping, momentum) times the steps, relative to O(1) values
        for i in (3, 5):
            assert_close(float(fa[i]), float(fb[i]), terms=24 * 64, scale=1.0)
