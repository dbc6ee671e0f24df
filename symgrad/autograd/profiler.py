"""``symgrad.autograd.profiler``: where a step's time goes, op by op and node by node.

``with profile() as prof:`` records every forward op (``symgrad::mm``, ``symgrad::add``,
in-place ``symgrad::sub_`` ...), every backward node the engine runs (``MmBackward0``,
``AccumulateGrad``), custom ``Function`` forwards and ``record_function`` ranges, each with
its self and total CPU time. ``prof.key_averages().table(sort_by=..., row_limit=...)``
prints PyTorch's table; ``prof.export_chrome_trace(path)`` writes a trace that
chrome://tracing and https://ui.perfetto.dev open.

Cost when not profiling: ``apply`` and the engine test one module global each.

Differences from PyTorch (documented): the ops a backward node runs internally are
part of that node's self time rather than rows of their own, unless
``profile(record_backward_ops=True)``; this keeps the forward-op counts equal to the
calls the user's code makes, whichever kernels a backend fuses. Device time (CUDA) is
the op's wall time measured with the device synchronized after the op.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import function as _fn

__all__ = ["profile", "record_function", "EventList", "FunctionEvent", "FunctionEventAvg"]


class FunctionEvent:
    """One timed range: an op call, a backward node, a Function forward, a user range."""

    __slots__ = ("id", "name", "kind", "thread", "start_ns", "end_ns", "parent", "cpu_children",
                 "input_shapes", "device_type", "device_time_ns", "sequence_nr", "_timer")

    def __init__(self, id: int, name: str, kind: str, thread: int, start_ns: int,
                 parent: FunctionEvent | None, input_shapes=None, device_type: str = "cpu",
                 sequence_nr: int = -1) -> None:
        self.id = id
        self.name = name
        self.kind = kind
        self.thread = thread
        self.start_ns = start_ns
        self.end_ns = start_ns
        self.parent = parent
        self.cpu_children: list[FunctionEvent] = []
        self.input_shapes = input_shapes
        self.device_type = device_type
        self.device_time_ns = 0
        self.sequence_nr = sequence_nr
        self._timer = None  # the backend's device timer (CUDA events) while the range is open

    key = property(lambda self: self.name)
    count = property(lambda self: 1)

    @property
    def cpu_time_total(self) -> float:
        """Microseconds from start to end, children included."""
        return (self.end_ns - self.start_ns) / 1000.0

    @property
    def self_cpu_time_total(self) -> float:
        return self.cpu_time_total - sum(c.cpu_time_total for c in self.cpu_children)

    cpu_time = cpu_time_total

    @property
    def device_time_total(self) -> float:
        return self.device_time_ns / 1000.0

    @property
    def self_device_time_total(self) -> float:
        return self.device_time_total - sum(c.device_time_total for c in self.cpu_children)

    device_time = device_time_total
    cuda_time_total = device_time_total
    self_cuda_time_total = self_device_time_total

    def __repr__(self) -> str:
        return (f"<FunctionEvent id={self.id} name={self.name} cpu_time="
                f"{_format_time(self.cpu_time_total)} self_cpu_time="
                f"{_format_time(self.self_cpu_time_total)}>")


class FunctionEventAvg:
    """Events of one name (and input shapes, if grouped so) summed up."""

    def __init__(self, key: str, input_shapes=None) -> None:
        self.key = key
        self.input_shapes = input_shapes
        self.count = 0
        self.cpu_time_total = 0.0
        self.self_cpu_time_total = 0.0
        self.device_time_total = 0.0
        self.self_device_time_total = 0.0
        self.device_type = "cpu"

    def add(self, evt) -> FunctionEventAvg:
        self.count += evt.count
        self.cpu_time_total += evt.cpu_time_total
        self.self_cpu_time_total += evt.self_cpu_time_total
        self.device_time_total += evt.device_time_total
        self.self_device_time_total += evt.self_device_time_total
        if evt.device_type != "cpu":
            self.device_type = evt.device_type
        return self

    @property
    def cpu_time(self) -> float:
        """Average total CPU time per call, in microseconds."""
        return self.cpu_time_total / self.count if self.count else 0.0

    @property
    def device_time(self) -> float:
        return self.device_time_total / self.count if self.count else 0.0

    cuda_time_total = property(lambda self: self.device_time_total)
    self_cuda_time_total = property(lambda self: self.self_device_time_total)

    def __repr__(self) -> str:
        return (f"<FunctionEventAvg key={self.key} self_cpu_time="
                f"{_format_time(self.self_cpu_time_total)} cpu_time="
                f"{_format_time(self.cpu_time_total)} count={self.count}>")


def _format_time(time_us: float) -> str:
    if time_us >= 1e6:
        return f"{time_us / 1e6:.3f}s"
    if time_us >= 1e3:
        return f"{time_us / 1e3:.3f}ms"
    return f"{time_us:.3f}us"


def _format_share(time_us: float, total_us: float) -> str:
    if total_us == 0:
        return "NaN"
    return f"{time_us * 100.0 / total_us:.2f}%"


_SORT_KEYS = {"cpu_time_total", "self_cpu_time_total", "cpu_time", "count",
              "device_time_total", "self_device_time_total", "device_time",
              "cuda_time_total", "self_cuda_time_total", "cuda_time"}


class EventList(list):
    """A list of events (or of averages) that prints as PyTorch's profiler table."""

    def __init__(self, events: Iterable = (), use_device: str | None = None) -> None:
        super().__init__(events)
        self.use_device = use_device

    def key_averages(self, group_by_input_shape: bool = False) -> EventList:
        """One row per event name (and per input shapes when asked), in first-seen order."""
        groups: dict[Any, FunctionEventAvg] = {}
        for evt in self:
            shapes = str(evt.input_shapes) if group_by_input_shape else None
            k = (evt.key, shapes)
            if k not in groups:
                groups[k] = FunctionEventAvg(evt.key, evt.input_shapes
                                             if group_by_input_shape else None)
            groups[k].add(evt)
        return EventList(groups.values(), use_device=self.use_device)

    @property
    def self_cpu_time_total(self) -> float:
        return sum(e.self_cpu_time_total for e in self)

    def table(self, sort_by: str | None = None, row_limit: int = 100,
              max_name_column_width: int = 55, header: str | None = None,
              top_level_events_only: bool = False) -> str:
        """PyTorch's table: Name, Self CPU %, Self CPU, CPU total %, CPU total, CPU time avg,
        (device columns when a device was timed), # of Calls; then the self-time total."""
        return _build_table(self, sort_by, row_limit, max_name_column_width, header,
                            top_level_events_only, self.use_device)

    def export_chrome_trace(self, path: str) -> None:
        _export_chrome_trace(self, path)


def _build_table(events, sort_by, row_limit, max_name_width, header, top_level_only,
                 use_device) -> str:
    if len(events) == 0:
        return ""
    if sort_by is not None:
        if sort_by not in _SORT_KEYS:
            raise AttributeError(f"cannot sort by {sort_by!r}; choose one of "
                                 f"{sorted(_SORT_KEYS)}")
        attr = sort_by.replace("cuda", "device")
        events = sorted(events, key=lambda e: getattr(e, attr), reverse=True)
    note = _device_note(use_device) if use_device else None  # why there is no device time
    has_device = any(e.self_device_time_total > 0 for e in events) or note is not None
    dev = (use_device or "cuda").upper()
    name_width = max(len(e.key) for e in events) + 4
    if max_name_width is not None:
        name_width = min(name_width, max_name_width)
    headers = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"]
    if has_device:
        headers += [f"Self {dev}", f"Self {dev} %", f"{dev} total", f"{dev} time avg"]
    headers.append("# of Calls")
    widths = [name_width] + [12] * (len(headers) - 1)
    row_format = "".join("{:>" + str(w) + "}  " for w in widths)
    sep = "".join("-" * w + "  " for w in widths)
    line_length = sum(w + 2 for w in widths) - 2
    total_self = sum(e.self_cpu_time_total for e in events)
    total_dev = sum(e.self_device_time_total for e in events)
    out = []
    if header is not None:
        out += ["=" * line_length, header]
    out += [sep, row_format.format(*headers), sep]
    shown = 0
    for e in events:
        if shown == row_limit:
            break
        if top_level_only and getattr(e, "parent", None) is not None:
            continue
        shown += 1
        name = e.key
        if max_name_width is not None and len(name) >= max_name_width - 3:
            name = name[: max_name_width - 3] + "..."
        row = [name, _format_share(e.self_cpu_time_total, total_self),
               _format_time(e.self_cpu_time_total),
               _format_share(e.cpu_time_total, total_self), _format_time(e.cpu_time_total),
               _format_time(e.cpu_time_total / max(e.count, 1))]
        if note is not None:
            row += ["unavailable"] * 4
        elif has_device:
            row += [_format_time(e.self_device_time_total),
                    _format_share(e.self_device_time_total, total_dev),
                    _format_time(e.device_time_total),
                    _format_time(e.device_time_total / max(e.count, 1))]
        row.append(e.count)
        out.append(row_format.format(*row))
    out.append(sep)
    out.append(f"Self CPU time total: {_format_time(total_self)}")
    if note is not None:
        out.append(f"Self {dev} time total: unavailable ({note})")
    elif has_device:
        out.append(f"Self {dev} time total: {_format_time(total_dev)}")
    return "\n".join(out) + "\n"


_CATEGORY = {"op": "cpu_op", "backward": "cpu_op", "function": "python_function",
             "user": "user_annotation"}


def _export_chrome_trace(events, path: str) -> None:
    pid = os.getpid()
    trace = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
              "args": {"name": "symgrad"}}]
    threads = sorted({e.thread for e in events})
    tids = {t: i for i, t in enumerate(threads)}
    for t, i in tids.items():
        trace.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": i,
                      "args": {"name": f"thread {i} ({t})"}})
    for e in sorted(events, key=lambda e: (e.start_ns, -e.end_ns)):
        args: dict[str, Any] = {"kind": e.kind}
        if e.input_shapes is not None:
            args["Input Dims"] = [list(s) if s is not None else [] for s in e.input_shapes]
        if e.sequence_nr >= 0:
            args["Sequence number"] = e.sequence_nr
        if e.device_time_ns:
            args["device_time_us"] = e.device_time_total
        trace.append({"ph": "X", "cat": _CATEGORY.get(e.kind, "cpu_op"), "name": e.name,
                      "pid": pid, "tid": tids[e.thread], "ts": e.start_ns / 1000.0,
                      "dur": (e.end_ns - e.start_ns) / 1000.0, "args": args})
    with open(path, "w") as f:
        json.dump({"traceEvents": trace, "displayTimeUnit": "ms",
                   "otherData": {"producer": "symgrad.autograd.profiler"}}, f)


def _shapes(inputs) -> list | None:
    return [tuple(x._data.shape) if hasattr(x, "_data") else None for x in inputs]


def _device_of(inputs) -> str:
    for x in inputs:
        dev = getattr(x, "_device", None)
        if dev is not None:
            return dev.type
    return "cpu"


class profile:  # noqa: N801  (PyTorch's name)
    """Context manager recording ops and backward nodes while active (process-wide).

    Arguments follow ``torch.autograd.profiler.profile``: ``enabled``, ``use_cuda`` /
    ``use_device`` (time the device too: ops on it are synchronized), ``record_shapes``.
    symgrad's own: ``record_backward_ops`` (also list the ops backward nodes run).
    """

    def __init__(self, enabled: bool = True, *, use_cuda: bool = False,
                 use_device: str | None = None, record_shapes: bool = False,
                 record_backward_ops: bool = False, profile_memory: bool = False,
                 with_stack: bool = False) -> None:
        self.enabled = enabled
        self.use_device = use_device or ("cuda" if use_cuda else None)
        self.record_shapes = record_shapes
        self.record_backward_ops = record_backward_ops
        self.function_events: EventList | None = None
        self._events: list[FunctionEvent] = []
        self._stacks: dict[int, list[FunctionEvent]] = {}
        self._t0 = 0
        self._lock = threading.Lock()
        self._prev = None

    # -- context ---------------------------------------------------------------------------
    def __enter__(self) -> profile:
        if not self.enabled:
            return self
        if _fn._profiler is not None:
            raise RuntimeError("Profiler is already enabled on this thread")
        self._events = []
        self._stacks = {}
        self._t0 = time.perf_counter_ns()
        _fn._profiler = self
        return self

    def __exit__(self, *exc) -> None:
        if not self.enabled:
            return
        _fn._profiler = None
        self.function_events = EventList(sorted(self._events, key=lambda e: e.start_ns),
                                         use_device=self.use_device)

    # -- recording (called by apply, the engine, in-place ops, Function.apply) -------------
    def _open(self, name: str, kind: str, inputs=(), sequence_nr: int = -1) -> FunctionEvent:
        tid = threading.get_ident()
        stack = self._stacks.setdefault(tid, [])
        parent = stack[-1] if stack else None
        with self._lock:
            evt = FunctionEvent(len(self._events), name, kind, tid, 0, parent,
                                _shapes(inputs) if self.record_shapes else None,
                                _device_of(inputs), sequence_nr)
            self._events.append(evt)
        if parent is not None:
            parent.cpu_children.append(evt)
        stack.append(evt)
        if self.use_device is not None and evt.device_type == self.use_device:
            evt._timer = _device_timer(evt.device_type)
        evt.start_ns = time.perf_counter_ns() - self._t0
        return evt

    def _close(self, evt: FunctionEvent) -> None:
        if evt._timer is not None:  # the backend's events: the op's own time on the device
            evt.device_time_ns = evt._timer.elapsed_ns()
            evt._timer = None
            evt.end_ns = time.perf_counter_ns() - self._t0
        elif self.use_device is not None and evt.device_type == self.use_device \
                and _device_note(evt.device_type) is None:
            _synchronize(evt.device_type)
            evt.end_ns = time.perf_counter_ns() - self._t0
            evt.device_time_ns = evt.end_ns - evt.start_ns
        else:
            evt.end_ns = time.perf_counter_ns() - self._t0
        self._stacks[evt.thread].pop()

    def _record_call(self, name: str, kind: str, inputs, fn: Callable, *args,
                     quiet: bool = False, sequence_nr: int = -1):
        """Time ``fn(*args)``; with ``quiet`` the ops it runs are not recorded."""
        evt = self._open(name, kind, inputs, sequence_nr)
        if quiet:
            _fn._profiler = None
        try:
            return fn(*args)
        finally:
            if quiet:
                _fn._profiler = self
            self._close(evt)

    def _record_op(self, spec, inputs, params):
        return self._record_call("symgrad::" + spec.name, "op", inputs, _fn.apply, spec, inputs,
                                 params, quiet=True)

    def _record_node(self, node, fn: Callable, *args):
        return self._record_call(node.name(), "backward", (), fn, *args,
                                 quiet=not self.record_backward_ops,
                                 sequence_nr=node._sequence_nr)

    # -- results -------------------------------------------------------------------------
    def _check_finished(self) -> EventList:
        if self.function_events is None:
            raise RuntimeError("Profiler didn't finish running")
        return self.function_events

    def key_averages(self, group_by_input_shape: bool = False) -> EventList:
        return self._check_finished().key_averages(group_by_input_shape)

    def table(self, sort_by: str | None = None, row_limit: int = 100, **kwargs) -> str:
        """One row per recorded event (``key_averages().table()`` groups them by name)."""
        return self._check_finished().table(sort_by=sort_by, row_limit=row_limit, **kwargs)

    def total_average(self) -> FunctionEventAvg:
        total = FunctionEventAvg("Total")
        for e in self._check_finished():
            total.add(e)
        return total

    @property
    def self_cpu_time_total(self) -> float:
        return self._check_finished().self_cpu_time_total

    def export_chrome_trace(self, path: str) -> None:
        """Write the trace as Chrome trace-event JSON (``ph: "X"`` complete events, in us)."""
        self._check_finished().export_chrome_trace(path)

    def __str__(self) -> str:
        return self.table() if self.function_events is not None else "<unfinished profile>"


class record_function:  # noqa: N801
    """A named user range in the profile (also a decorator); free when not profiling."""

    def __init__(self, name: str, args: str | None = None) -> None:
        self.name = name
        self._evt = None
        self._prof = None

    def __enter__(self) -> record_function:
        prof = _fn._profiler
        if prof is not None:
            self._prof = prof
            self._evt = prof._open(self.name, "user")
        return self

    def __exit__(self, *exc) -> None:
        if self._evt is not None:
            self._prof._close(self._evt)
            self._evt = self._prof = None

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with record_function(self.name):
                return fn(*args, **kwargs)

        return wrapper


def _device_timer(device_type: str):
    """A started device timer from the backend (CUDA events on a GPU), or None."""
    from ..backends import backend_for

    try:
        start = getattr(backend_for(device_type), "device_timer", None)
    except RuntimeError:
        return None
    return start() if start is not None else None


def _device_note(device_type: str) -> str | None:
    """Why ``device_type`` cannot be timed (the CUDA simulator), or None when it can."""
    from ..backends import backend_for

    try:
        return getattr(backend_for(device_type), "device_timing_note", None)
    except RuntimeError:
        return None


def _synchronize(device_type: str) -> None:
    from ..backends import backend_for

    be = backend_for(device_type)
    sync = getattr(be, "synchronize", None)
    if sync is not None:
        sync()
