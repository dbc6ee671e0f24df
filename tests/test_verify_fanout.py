"""Per-node checks fanned out (issue 30, scope 3): ``sg.verify(..., workers=N)`` runs the
local checks in N processes, ``executor=`` on any ``concurrent.futures.Executor`` (a
``dask.distributed`` Client's ``get_executor()`` unchanged); the report is the same as in
one process, node by node, verdicts and values, a planted wrong rule included. Bad
arguments are clear errors; an interruption cancels what has not run and does not hang."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import numpy as np
import pytest

import symgrad as sg
from symgrad.ops import OPS
from symgrad.symbolic import fanout


def _graph():
    rng = np.random.default_rng(0)
    x = sg.tensor(rng.standard_normal((4, 5)), dtype=sg.float64, requires_grad=True)
    w = sg.tensor(rng.standard_normal((5, 3)), dtype=sg.float64, requires_grad=True)
    b = sg.tensor(rng.standard_normal((3,)), dtype=sg.float64, requires_grad=True)
    h = (x @ w + b).tanh()
    y = sg.softmax(h * 2, dim=1)
    return (y * h.sin()).sum(), {"x": x, "w": w, "b": b}


def _rows(rep):
    """Everything a node row says, and the leaf rows' verdicts and values."""
    nodes = [(n.id, n.name, n.status, n.max_abs_err, n.max_rel_err, n.bound, n.sampled,
              n.detail, n.formula) for n in rep.nodes]
    leaves = [(lf.name, lf.status, lf.engine_value, lf.fd_value, lf.worst_index)
              for lf in rep.leaves]
    return nodes, leaves, rep.ok, rep.first_bad_node_label


@pytest.fixture
def wrong_mul(monkeypatch):
    """d(self * other)/d other off by 0.1%: MulBackward0 must be named."""
    monkeypatch.setitem(OPS["mul"].grads, "other", lambda grad, self: grad * self * 1.001)


def _serial_and(loss, names, **kw):
    serial = sg.verify(loss, names=names, mode="local", namespace={})
    other = sg.verify(loss, names=names, mode="local", namespace={}, **kw)
    return serial, other


def test_workers_give_the_serial_report():
    loss, names = _graph()
    serial, fanned = _serial_and(loss, names, workers=2)
    assert serial.ok and all(n.status == "ok" for n in serial.nodes)
    assert _rows(fanned) == _rows(serial)
    # every node was checked by a worker process (none handed back, none kept here)
    assert fanout.LAST_RUN == {"sent": len(serial.nodes), "fallback": 0, "here": 0}


def test_workers_name_a_planted_wrong_rule_as_serial_does(wrong_mul):
    loss, names = _graph()
    serial, fanned = _serial_and(loss, names, workers=2)
    assert not serial.ok and serial.first_bad_node_label.startswith("MulBackward0")
    bad = [n for n in serial.nodes if n.status == "mismatch"]
    assert [n.name for n in bad] == ["MulBackward0"] and bad[0].max_abs_err > 0
    assert _rows(fanned) == _rows(serial)
    assert fanout.LAST_RUN["sent"] == len(serial.nodes)


def test_any_executor_and_its_futures_give_the_serial_report(wrong_mul):
    loss, names = _graph()
    with cf.ThreadPoolExecutor(2) as ex:
        serial, threaded = _serial_and(loss, names, executor=ex)
    assert _rows(threaded) == _rows(serial) and not serial.ok


def test_a_dask_local_cluster_gives_the_serial_report(wrong_mul):
    distributed = pytest.importorskip("distributed")
    loss, names = _graph()
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        serial, dasked = _serial_and(loss, names, executor=client.get_executor())
    assert _rows(dasked) == _rows(serial)
    assert fanout.LAST_RUN["sent"] == len(serial.nodes)
    assert not dasked.ok and dasked.first_bad_node_label.startswith("MulBackward0")


def test_a_torch_graph_fans_out_too():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = torch.tensor(rng.standard_normal((3, 4)), requires_grad=True)
    w = torch.tensor(rng.standard_normal((4, 2)), requires_grad=True)
    loss = (x @ w).tanh().sum()
    with cf.ThreadPoolExecutor(2) as ex:
        serial, threaded = _serial_and(loss, {"x": x, "w": w}, executor=ex)
    assert serial.ok and serial.graph_kind == "torch"
    assert _rows(threaded) == _rows(serial)
    assert fanout.LAST_RUN["sent"] >= 2  # mm and tanh at least went to the executor


@pytest.mark.parametrize("kw, err, match", [
    ({"workers": 0}, ValueError, "workers must be at least 1, not 0"),
    ({"workers": -3}, ValueError, "workers must be at least 1"),
    ({"workers": 2.5}, TypeError, "'workers' must be a positive int or None, not float"),
    ({"workers": True}, TypeError, "'workers' must be a positive int or None, not bool"),
    ({"executor": "processes"}, TypeError,
     "'executor' must be a concurrent.futures.Executor .* not builtins.str"),
    ({"executor": object()}, TypeError, "must be a concurrent.futures.Executor"),
    ({"workers": 2, "executor": cf.ThreadPoolExecutor(1)}, ValueError,
     "pass workers=N or executor=..., not both"),
])
def test_bad_fan_out_arguments_are_clear_errors(kw, err, match):
    loss, names = _graph()
    with pytest.raises(err, match=match):
        sg.verify(loss, names=names, mode="local", namespace={}, **kw)


def test_workers_one_is_this_process():
    loss, names = _graph()
    serial, one = _serial_and(loss, names, workers=1)
    assert _rows(one) == _rows(serial)


class _Recording(cf.ThreadPoolExecutor):
    """One thread; every check after the first is held until ``release`` is set (a slow
    check still running when the caller is interrupted). Keeps the futures it made."""

    def __init__(self) -> None:
        super().__init__(1)
        self.futures: list = []
        self.release = threading.Event()

    def submit(self, fn, *args, **kwargs):
        first = not self.futures

        def held(*a, **k):
            if not first:
                self.release.wait(60)
            return fn(*a, **k)

        fut = super().submit(held, *args, **kwargs)
        self.futures.append(fut)
        return fut


def test_an_interruption_cancels_the_checks_not_started_and_does_not_hang():
    """Ctrl-C while waiting for the workers (here: the progress callback, which runs in
    the caller as each node finishes, raises KeyboardInterrupt when the first is done):
    verify() returns at once, while the second check is still running (held), and every
    check not started is cancelled."""
    loss, names = _graph()
    ex = _Recording()

    def progress(done, total):
        raise KeyboardInterrupt

    t0 = time.perf_counter()
    try:
        with pytest.raises(KeyboardInterrupt):
            sg.verify(loss, names=names, mode="local", namespace={}, executor=ex,
                      progress=progress)
        assert time.perf_counter() - t0 < 30  # the held check was not waited for
        states = [f.cancelled() for f in ex.futures]
        assert len(states) == len(loss_nodes(loss, names)) and len(states) > 2
        assert ex.futures[0].done() and not states[0]  # finished: it raised the interrupt
        assert states[1] or not ex.futures[1].done()  # running (held): not waited for
        assert all(states[2:])  # not started: cancelled
    finally:
        ex.release.set()
        ex.shutdown(wait=True)


def loss_nodes(loss, names):
    return sg.verify(loss, names=names, mode="local", namespace={}).nodes


def test_progress_is_reported_as_nodes_finish():
    loss, names = _graph()
    seen = []
    with cf.ThreadPoolExecutor(2) as ex:
        sg.verify(loss, names=names, mode="local", namespace={}, executor=ex,
                  progress=lambda done, total: seen.append((done, total)))
    n = len(sg.verify(loss, names=names, mode="local", namespace={}).nodes)
    assert [d for d, _ in seen][:n] == list(range(1, n + 1))


class _Held(cf.ThreadPoolExecutor):
    """Every check held until ``release`` is set: workers slower than the timeout."""

    def __init__(self) -> None:
        super().__init__(1)
        self.release = threading.Event()

    def submit(self, fn, *args, **kwargs):
        def held(*a, **k):
            self.release.wait(60)
            return fn(*a, **k)

        return super().submit(held, *args, **kwargs)


def test_timeout_holds_with_slow_workers():
    loss, names = _graph()
    ex = _Held()
    t0 = time.perf_counter()
    try:
        rep = sg.verify(loss, names=names, mode="local", namespace={}, executor=ex,
                        timeout=3)
        elapsed = time.perf_counter() - t0
    finally:
        ex.release.set()
        ex.shutdown(wait=True)
    assert rep.timed_out and not rep.ok
    assert rep.nodes and all(n.status == "timeout" for n in rep.nodes)
    assert elapsed < 3 + 20  # the deadline, not the held checks (60 s), ended it


def test_the_progress_bar_counts_fanned_out_nodes(monkeypatch):
    """The bar a long run shows (tqdm) is updated as fanned-out nodes finish, and closed."""
    import sys

    V = sys.modules["symgrad.symbolic.verify"]

    class Bar:
        def __init__(self) -> None:
            self.n, self.closed = 0, False

        def update(self, n=1):
            self.n += n

        def close(self):
            self.closed = True

    bars = []
    monkeypatch.setattr(V, "_progress", lambda n_nodes, cost: bars.append(Bar()) or bars[-1])
    loss, names = _graph()
    with cf.ThreadPoolExecutor(2) as ex:
        rep = sg.verify(loss, names=names, mode="local", namespace={}, executor=ex)
    assert len(bars) == 1 and bars[0].closed and bars[0].n == len(rep.nodes)
