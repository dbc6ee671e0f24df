"""Anomaly detection (NaN in backward, forward traceback) and the profiler (table, trace)."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg
from symgrad.autograd import function as function_module
from symgrad.autograd.profiler import profile, record_function

# -- anomaly mode --------------------------------------------------------------------------


def _nan_in_backward(lib, op):
    x = lib.tensor([0.0, 1.0], requires_grad=True)
    y = getattr(x, op)()  # anomaly-forward-line
    return x, (y * 0).sum()  # d/dy = 0, and 0 * (1/0) or 0 / 0 is NaN in the op's backward


@pytest.mark.parametrize("op,node", [("log", "LogBackward0"), ("sqrt", "SqrtBackward0")])
def test_detect_anomaly_names_the_node_and_shows_the_forward_line_like_torch(torch, op, node):
    for lib in (sg, torch):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with lib.autograd.detect_anomaly():
                _, loss = _nan_in_backward(lib, op)
                with pytest.raises(RuntimeError) as info:
                    loss.backward()
        assert str(info.value) == f"Function '{node}' returned nan values in its 0th output."
        messages = [str(w.message) for w in caught]
        assert any("Anomaly Detection has been enabled" in m for m in messages)
        (trace,) = [m for m in messages if m.startswith(f"Error detected in {node}. Traceback "
                                                        "of forward call that caused the error")]
        assert "test_anomaly_profiler.py" in trace
        assert "y = getattr(x, op)()  # anomaly-forward-line" in trace
        if lib is sg:  # symgrad shows the user's frames only, not its own internals
            assert "symgrad/functional.py" not in trace and "autograd/function.py" not in trace
        assert not (lib.is_anomaly_enabled() if lib is torch
                    else sg.autograd.is_anomaly_enabled())


def test_without_anomaly_mode_nan_passes_and_nodes_record_no_traceback(torch):
    for lib in (sg, torch):
        x, loss = _nan_in_backward(lib, "log")
        assert "traceback_" not in loss.grad_fn.metadata
        loss.backward()  # no check: the NaN lands in .grad, as in torch
        assert np.isnan(x.grad.numpy()[0])


def test_set_detect_anomaly_and_check_nan_flag(torch):
    sg.autograd.set_detect_anomaly(True)
    try:
        assert sg.autograd.is_anomaly_enabled() and sg.autograd.is_anomaly_check_nan_enabled()
        x = sg.tensor([1.0], requires_grad=True)
        y = x.exp()
        stack = y.grad_fn.metadata["traceback_"]
        assert isinstance(stack, list) and any("test_anomaly_profiler.py" in s for s in stack)
    finally:
        sg.autograd.set_detect_anomaly(False)
    assert not sg.autograd.is_anomaly_enabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with sg.autograd.detect_anomaly(check_nan=False):
            _nan_in_backward(sg, "log")[1].backward()  # traced, but NaN is not an error
        with torch.autograd.detect_anomaly(check_nan=False):
            _nan_in_backward(torch, "log")[1].backward()


def test_anomaly_mode_traces_other_backward_errors_too(torch):
    for lib in (sg, torch):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with lib.autograd.detect_anomaly():
                x = lib.tensor([1.0, 2.0], requires_grad=True)
                y = x.exp()  # saves its result
                y.add_(1)
                with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                    y.sum().backward()
        assert any(str(w.message).startswith("Error detected in ExpBackward0") for w in caught)


# -- profiler ------------------------------------------------------------------------------

LAYERS = [(4, 8), (8, 1)]  # (fan_in, fan_out) of the fixed 2-layer MLP
BATCH, LR = 16, 0.1


def _mlp_step(lib, params, x, y):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = h.relu()
    loss = (h - y).pow(2).mean()
    loss.backward()
    with lib.no_grad():
        for w, b in params:
            for p in (w, b):
                p -= LR * p.grad


def _mlp_params(lib):
    sg.manual_seed(0)
    params = []
    for fan_in, fan_out in LAYERS:
        w = sg.randn(fan_in, fan_out, requires_grad=True)
        b = sg.randn(fan_out, requires_grad=True)
        if lib is not sg:
            w = lib.tensor(w.detach().numpy(), requires_grad=True)
            b = lib.tensor(b.detach().numpy(), requires_grad=True)
        params.append((w, b))
    x = np.random.default_rng(1).standard_normal((BATCH, LAYERS[0][0])).astype(np.float32)
    y = np.random.default_rng(2).standard_normal((BATCH, LAYERS[-1][1])).astype(np.float32)
    return params, lib.tensor(x), lib.tensor(y)


def _expected_counts():
    """What one step calls, derived from the model's structure (not from the profiler)."""
    n = len(LAYERS)
    n_params = 2 * n
    forward = {"symgrad::mm": n, "symgrad::add": n, "symgrad::relu": n - 1,
               "symgrad::sub": 1, "symgrad::pow": 1, "symgrad::mean": 1,
               "symgrad::mul": n_params,   # LR * p.grad
               "symgrad::sub_": n_params}  # p -= ...
    backward = {"MmBackward0": n, "AddBackward0": n, "ReluBackward0": n - 1,
                "SubBackward0": 1, "PowBackward0": 1, "MeanBackward0": 1,
                "AccumulateGrad": n_params}
    return forward, backward


_ROW = re.compile(r"^\s*(\S(?:.*?\S)?)\s{2,}([\d.]+%)\s+([\d.]+(?:us|ms|s))\s+([\d.]+%)\s+"
                  r"([\d.]+(?:us|ms|s))\s+([\d.]+(?:us|ms|s))\s+(\d+)\s*$")


def _us(text):
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 1.0, "ms": 1e3, "s": 1e6}[unit]


def _parse_table(table):
    lines = table.rstrip("\n").split("\n")
    seps = [i for i, line in enumerate(lines) if set(line.strip()) == {"-", " "} or
            set(line.strip()) == {"-"}]
    assert len(seps) == 3, table
    header = lines[seps[0] + 1]
    rows = {}
    for line in lines[seps[1] + 1: seps[2]]:
        m = _ROW.match(line)
        assert m, line
        name, self_pct, self_t, tot_pct, tot_t, avg_t, calls = m.groups()
        rows[name] = dict(self_pct=float(self_pct[:-1]), self=_us(self_t),
                          total_pct=float(tot_pct[:-1]), total=_us(tot_t), avg=_us(avg_t),
                          calls=int(calls))
    footer = lines[seps[2] + 1:]
    return header, rows, footer


def test_profiler_table_lists_each_op_and_node_of_an_mlp_step_with_exact_counts(torch, tmp_path):
    params, x, y = _mlp_params(sg)
    _mlp_step(sg, params, x, y)  # warm up (kernel compilation) outside the profile
    with profile() as prof:
        _mlp_step(sg, params, x, y)
    assert function_module._profiler is None  # off again: apply tests one global
    forward, backward = _expected_counts()
    header, rows, footer = _parse_table(prof.key_averages().table(sort_by="cpu_time_total"))
    assert {k: v["calls"] for k, v in rows.items()} == {**forward, **backward}
    assert header.split() == ["Name", "Self", "CPU", "%", "Self", "CPU", "CPU", "total", "%",
                              "CPU", "total", "CPU", "time", "avg", "#", "of", "Calls"]
    assert len(footer) == 1 and footer[0].startswith("Self CPU time total: ")
    assert sum(r["self_pct"] for r in rows.values()) == pytest.approx(100.0, abs=0.05 * len(rows))
    for r in rows.values():
        assert r["total"] + 0.002 >= r["self"] >= 0
        assert r["avg"] == pytest.approx(r["total"] / r["calls"], rel=0.01, abs=0.002)
    totals = [r["total"] for r in rows.values()]
    assert totals == sorted(totals, reverse=True)

    # PyTorch's profiler, on the same step, runs the same backward nodes the same number
    # of times (its forward rows are aten:: ops and include the ops backward nodes call)
    tparams, tx, ty = _mlp_params(torch)
    with torch.autograd.profiler.profile() as tprof:
        _mlp_step(torch, tparams, tx, ty)
    theader, trows, _ = _parse_table(tprof.key_averages().table(sort_by="cpu_time_total"))
    assert theader.split() == header.split()
    tbackward = {k.replace("torch::autograd::", ""): v["calls"] for k, v in trows.items()
                 if k.endswith(tuple(backward)) and not k.startswith("autograd::engine")}
    assert tbackward == backward
    assert trows["aten::sub_"]["calls"] == forward["symgrad::sub_"]

    # the Chrome trace: complete events, one per call, properly nested per thread
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    counts = {}
    for e in events:
        counts[e["name"]] = counts.get(e["name"], 0) + 1
        assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    assert counts == {**forward, **backward}
    stack = []
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        if stack:
            assert e["ts"] + e["dur"] <= stack[-1] + 1e-3  # inside its parent
        stack.append(e["ts"] + e["dur"])


def _step_terms():
    """Rounding errors one step can accumulate in a parameter, counted along its chain:
    forward (each layer's mm over fan_in, add, relu), the loss (sub, pow, mean over the
    batch), backward (mm over fan_out for the input's gradient, mm/bias sum over the batch
    for the parameters', add, relu), and the update (LR * g, p -= ...)."""
    n = len(LAYERS)
    forward = sum(fan_in for fan_in, _ in LAYERS) + 2 * n
    loss = 2 + BATCH
    backward = 3 + sum(fan_out for _, fan_out in LAYERS) + BATCH + 2 * n
    return forward + loss + backward + 2


def test_profiler_gradients_match_torch_after_the_step(torch):
    params, x, y = _mlp_params(sg)
    tparams, tx, ty = _mlp_params(torch)
    before = [[p.detach().numpy().copy() for p in pair] for pair in params]
    with profile():
        _mlp_step(sg, params, x, y)
    _mlp_step(torch, tparams, tx, ty)
    for pair, tpair, pre in zip(params, tparams, before):
        for p, tp, p0 in zip(pair, tpair, pre):
            # the update's operands set the scale: |p| before the step and |LR * grad|
            scale = np.abs(p0).max() + LR * np.abs(tp.grad.numpy()).max()
            assert_close(p, tp, terms=_step_terms(), scale=scale, msg=str(tuple(p.shape)))


def test_profiler_sorting_row_limit_ranges_and_custom_functions():
    class Twice(sg.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    a = sg.tensor([1.0, 2.0], requires_grad=True)
    with profile() as prof:
        with record_function("outer"):
            y = Twice.apply(a.exp())
            y.sum().backward()
    _, rows, _ = _parse_table(prof.key_averages().table(sort_by="self_cpu_time_total",
                                                        row_limit=3))
    assert len(rows) == 3
    selfs = [r["self"] for r in rows.values()]
    assert selfs == sorted(selfs, reverse=True)
    _, rows, _ = _parse_table(prof.key_averages().table())
    assert rows["outer"]["calls"] == 1 and rows["Twice"]["calls"] == 1
    assert rows["TwiceBackward"]["calls"] == 1 and rows["symgrad::mul"]["calls"] == 1
    assert rows["outer"]["total"] >= rows["Twice"]["total"] >= rows["symgrad::mul"]["total"]
    events = prof.function_events
    twice = next(e for e in events if e.name == "Twice")
    assert [c.name for c in twice.cpu_children] == ["symgrad::mul"]
    assert twice.parent.name == "outer"
    # ops a backward node runs are part of its self time, unless asked for
    with profile(record_backward_ops=True) as prof2:
        Twice.apply(a.exp()).sum().backward()
    _, rows2, _ = _parse_table(prof2.key_averages().table())
    assert rows2["symgrad::mul"]["calls"] == 2  # forward's a * 2 and backward's g * 2
    assert len(prof.key_averages(group_by_input_shape=True)) == len(prof.key_averages())


def test_profiler_is_off_outside_and_refuses_nesting():
    assert function_module._profiler is None
    with profile() as prof:
        with pytest.raises(RuntimeError, match="Profiler is already enabled"):
            with profile():
                pass
        sg.tensor([1.0]).exp()
    assert function_module._profiler is None
    assert [e.name for e in prof.function_events] == ["symgrad::exp"]
    with profile(enabled=False) as off:
        sg.tensor([1.0]).exp()
    assert off.function_events is None
    with pytest.raises(RuntimeError, match="Profiler didn't finish running"):
        off.key_averages()
    with record_function("no profiler"):  # free when not profiling
        pass


def test_profiler_records_shapes_when_asked(tmp_path):
    a = sg.ones(2, 3)
    b = sg.ones(3, 4)
    with profile(record_shapes=True) as prof:
        a @ b
    (evt,) = prof.function_events
    assert evt.input_shapes == [(2, 3), (3, 4)]
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    (x_evt,) = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]
                if e["ph"] == "X"]
    assert x_evt["args"]["Input Dims"] == [[2, 3], [3, 4]]


def test_device_time_columns_when_a_device_is_timed(monkeypatch):
    """Ops on the timed device are synchronized before their range closes (no GPU needed)."""
    from symgrad.autograd import profiler as profiler_module

    synced = []
    monkeypatch.setattr(profiler_module, "_synchronize", lambda dev: synced.append(dev))

    class FakeDevice:
        type = "cuda"

    class FakeTensor:
        _device = FakeDevice()
        _data = np.zeros((2, 2))

    with profile(use_device="cuda") as prof:
        prof._record_call("symgrad::mm", "op", (FakeTensor(),), lambda: sum(range(1000)))
        sg.tensor([1.0]).exp()  # a CPU op: not synchronized, no device time
    assert synced == ["cuda"]
    gpu, cpu = prof.function_events
    assert gpu.device_time_total > 0 and cpu.device_time_total == 0
    table = prof.key_averages().table()
    assert re.search(r"Name\s+Self CPU %\s+Self CPU\s+CPU total %\s+CPU total\s+CPU time avg"
                     r"\s+Self CUDA\s+Self CUDA %\s+CUDA total\s+CUDA time avg\s+# of Calls",
                     table.split("\n")[1])  # PyTorch's column order
    assert "Self CUDA time total: " in table
