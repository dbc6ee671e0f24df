"""Tensor printing in PyTorch's style (precision 4, int mode, sci mode, summarization)."""

from __future__ import annotations

import math

import numpy as np

_THRESHOLD = 1000
_EDGE = 3
_LINEWIDTH = 80


def _float_formatter(values: np.ndarray):
    finite = values[np.isfinite(values)]
    nonzero = np.abs(finite[finite != 0])
    if nonzero.size == 0:
        return lambda v: _special(v) or ("-0." if math.copysign(1.0, v) < 0 else "0.")
    vmax, vmin = float(nonzero.max()), float(nonzero.min())
    int_mode = bool(np.all(finite == np.ceil(finite)))
    if int_mode:
        sci = vmax / vmin > 1000.0 or vmax > 1.0e8
        fmt = "{:.4e}" if sci else "{:.0f}."
    else:
        sci = vmax / vmin > 1000.0 or vmax > 1.0e8 or vmin < 1.0e-4
        fmt = "{:.4e}" if sci else "{:.4f}"
    return lambda v: _special(v) or fmt.format(v)


def _special(v: float) -> str | None:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return None


def format_data(a: np.ndarray, indent: int) -> str:
    """The bracketed body, e.g. ``[[1., 2.],\\n        [3., 4.]]``."""
    if a.dtype.kind not in "fbiu":  # bfloat16 (an extension dtype): its values, exactly
        a = a.astype(np.float32)
    summarize = a.size > _THRESHOLD
    sample = _summary_values(a) if summarize else a.ravel()
    if a.dtype.kind == "f":
        fmt = _float_formatter(sample.astype(np.float64))
    elif a.dtype.kind == "b":
        fmt = lambda v: "True" if v else "False"  # noqa: E731
    else:
        fmt = lambda v: str(int(v))  # noqa: E731
    # torch sizes columns by the nonzero finite values only (nan, inf and -0. are not
    # padded for)
    values = sample.tolist()
    if a.dtype.kind == "f":
        values = [v for v in values if math.isfinite(v) and v != 0]
    width = max((len(fmt(v)) for v in values), default=1)

    def render(x: np.ndarray, depth: int) -> str:
        if x.ndim == 0:
            return fmt(x.item()).rjust(width)
        if x.ndim == 1:
            items = x.tolist()
            if summarize and len(items) > 2 * _EDGE:
                cells = [fmt(v).rjust(width) for v in items[:_EDGE]] + [" ..."] + \
                        [fmt(v).rjust(width) for v in items[-_EDGE:]]
            else:
                cells = [fmt(v).rjust(width) for v in items]
            per_line = max(1, (_LINEWIDTH - indent - depth) // (width + 2))
            lines = [", ".join(cells[i:i + per_line]) for i in range(0, len(cells), per_line)]
            return "[" + (",\n" + " " * (indent + depth + 1)).join(lines) + "]"
        rows = range(x.shape[0])
        if summarize and x.shape[0] > 2 * _EDGE:
            parts = [render(x[i], depth + 1) for i in rows[:_EDGE]] + ["..."] + \
                    [render(x[i], depth + 1) for i in rows[-_EDGE:]]
        else:
            parts = [render(x[i], depth + 1) for i in rows]
        sep = "," + "\n" * (x.ndim - 1) + " " * (indent + depth + 1)
        return "[" + sep.join(parts) + "]"

    return render(a, 0)


def _summary_values(a: np.ndarray) -> np.ndarray:
    if a.ndim == 0:
        return a.ravel()
    if a.shape[0] > 2 * _EDGE:
        parts = [a[:_EDGE], a[-_EDGE:]]
    else:
        parts = [a]
    return np.concatenate([_summary_values(p[i]) for p in parts for i in range(p.shape[0])]
                          or [np.zeros(0, a.dtype)])
