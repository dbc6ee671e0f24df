"""Anomaly detection: name the backward node that produced NaN and where it was recorded.

With anomaly mode on, every recorded node keeps the user's stack at the moment its
forward op ran (``node.metadata["traceback_"]``, as in PyTorch), and the engine checks
each backward output for NaN. A failing node raises
``Function 'LogBackward0' returned nan values in its 0th output.`` after warning with the
forward traceback. Off (the default), the only cost is one attribute test per node.
"""

from __future__ import annotations

import os
import traceback
import warnings

__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled",
           "is_anomaly_check_nan_enabled"]

_ENABLED_WARNING = ("Anomaly Detection has been enabled. This mode will increase the runtime "
                    "and should only be enabled for debugging.")


class _AnomalyState:
    __slots__ = ("enabled", "check_nan")

    def __init__(self) -> None:
        self.enabled = False
        self.check_nan = True


_anomaly = _AnomalyState()

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_anomaly_enabled() -> bool:
    return _anomaly.enabled


def is_anomaly_check_nan_enabled() -> bool:
    return _anomaly.check_nan


class detect_anomaly:  # noqa: N801  (PyTorch's name)
    """Context manager (and decorator) turning anomaly detection on for its body."""

    def __init__(self, check_nan: bool = True) -> None:
        self.check_nan = check_nan
        self.prev = (_anomaly.enabled, _anomaly.check_nan)
        warnings.warn(_ENABLED_WARNING, UserWarning, stacklevel=2)

    def __enter__(self) -> None:
        self.prev = (_anomaly.enabled, _anomaly.check_nan)
        _anomaly.enabled, _anomaly.check_nan = True, self.check_nan

    def __exit__(self, *exc) -> None:
        _anomaly.enabled, _anomaly.check_nan = self.prev

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)

        return wrapper


class set_detect_anomaly:  # noqa: N801
    """Turns anomaly detection on or off now; also usable as a context manager."""

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        self.prev = (_anomaly.enabled, _anomaly.check_nan)
        _anomaly.enabled, _anomaly.check_nan = bool(mode), bool(check_nan)

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        _anomaly.enabled, _anomaly.check_nan = self.prev


def forward_stack() -> list[str]:
    """The user's frames at this point, without symgrad's own (stored on the node)."""
    frames = [f for f in traceback.extract_stack()[:-1]
              if not os.path.abspath(f.filename).startswith(_PACKAGE_DIR + os.sep)]
    return traceback.format_list(frames)


def warn_forward_trace(node, stacklevel: int = 2) -> None:
    """PyTorch's warning: which node failed, and the forward call that recorded it."""
    stack = node.metadata.get("traceback_") if node._metadata is not None else None
    if stack is None:
        msg = (f"Error detected in {node.name()}. No forward pass information available. "
               "Enable detect anomaly during forward pass for more information.")
    else:
        msg = (f"Error detected in {node.name()}. Traceback of forward call that caused the "
               "error:\n" + "".join(stack))
    warnings.warn(msg, UserWarning, stacklevel=stacklevel)


def check_nan(node, outs) -> None:
    """Raise if a backward output holds NaN (the engine calls this in anomaly mode)."""
    import numpy as np

    for i, g in enumerate(outs):
        if g is None or not g.dtype.is_floating_point:
            continue
        data = g.cpu()._data if g.device.type != "cpu" else g._data
        if np.isnan(data).any():
            raise RuntimeError(f"Function '{node.name()}' returned nan values in its {i}th "
                               "output.")
