"""Assertion helpers that run the symbolic verifier and fail with its readable table.

Every check run here is also recorded in ``RECORDED`` so that the pytest plugin can write
one session report (JSON + HTML) of all checks, gathered across xdist workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["assert_gradients_match", "check_function", "gradient_check", "resolve_inputs",
           "RECORDED"]

#: (check name, report JSON) for every check run in this process, in order.
RECORDED: list[tuple[str, dict]] = []


def _record(report, name: str | None) -> None:
    RECORDED.append((name or "check", report.to_json()))


def _verify(root, *, mode, rtol, atol, order, names, gradient=None):
    from ..symbolic import verify

    kwargs: dict[str, Any] = {"mode": mode, "order": order, "names": names}
    if rtol is not None:
        kwargs["rtol"] = rtol
    if atol is not None:
        kwargs["atol"] = atol
    return verify(root, gradient, **kwargs)


def _seeded_cotangent(out):
    from ..tensor import tensor

    rng = np.random.default_rng(0)
    return tensor(rng.uniform(0.5, 1.5, size=tuple(out.shape)), dtype=out.dtype)


def verify_call(fn: Callable, *inputs, mode: str = "auto", rtol: float | None = None,
                atol: float | None = None, order: int = 1, names: dict | None = None,
                check_name: str | None = None):
    """Build the graph by calling ``fn(*inputs)``, verify it and record the Report.

    A non-scalar output is checked along a fixed, seeded cotangent (a vector-Jacobian
    product), so every output element takes part.
    """
    from ..tensor import Tensor

    out = fn(*inputs)
    if isinstance(out, (tuple, list)):
        out = next(o for o in out if isinstance(o, Tensor) and o.requires_grad)
    if not isinstance(out, Tensor):
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} must return a Tensor, "
                        f"got {type(out).__name__}")
    gradient = None if out.numel() == 1 else _seeded_cotangent(out)
    if names is None:
        names = {f"x{i}": x for i, x in enumerate(inputs) if isinstance(x, Tensor)}
    report = _verify(out, mode=mode, rtol=rtol, atol=atol, order=order, names=names,
                     gradient=gradient)
    _record(report, check_name or getattr(fn, "__qualname__", None))
    return report


def assert_gradients_match(fn: Callable, *inputs, mode: str = "auto", rtol: float | None = None,
                           atol: float | None = None, order: int = 1,
                           names: dict | None = None, check_name: str | None = None):
    """Verify the graph ``fn(*inputs)`` builds; AssertionError with the verifier's table
    when any gradient disagrees. Returns the Report when all is well."""
    report = verify_call(fn, *inputs, mode=mode, rtol=rtol, atol=atol, order=order,
                         names=names, check_name=check_name)
    if not report.ok:
        report.assert_ok()
    return report


def check_function(function_cls, *inputs, mode: str = "auto", rtol: float | None = None,
                   atol: float | None = None, names: dict | None = None):
    """Verify a custom ``autograd.Function``'s backward (through its ``sympy`` meaning
    when it has one, else by local finite differences, as the verifier decides)."""
    return assert_gradients_match(function_cls.apply, *inputs, mode=mode, rtol=rtol, atol=atol,
                                  names=names, check_name=function_cls.__name__)


def gradient_check(inputs=None, *, mode: str = "auto", rtol: float | None = None,
                   atol: float | None = None, order: int = 1, seed: int = 0):
    """Mark a function for ``symgrad check``: ``inputs`` are tensors, shapes (random float64
    leaves that require grad, seeded), or a callable returning either."""

    def mark(fn):
        fn.__symgrad_check__ = {"inputs": inputs, "mode": mode, "rtol": rtol, "atol": atol,
                                "order": order, "seed": seed}
        return fn

    return mark


def resolve_inputs(spec, seed: int = 0) -> tuple:
    """Turn a ``gradient_check(inputs=...)`` value into a tuple of tensors."""
    from ..tensor import Tensor, tensor

    if callable(spec):
        spec = spec()
    if spec is None:
        return ()
    if isinstance(spec, Tensor):
        return (spec,)
    rng = np.random.default_rng(seed)
    out = []
    for item in spec:
        if isinstance(item, Tensor):
            out.append(item)
        elif isinstance(item, (tuple, list)) and all(isinstance(s, int) for s in item):
            out.append(tensor(rng.uniform(-1.5, 1.5, size=tuple(item)), dtype="float64",
                              requires_grad=True))
        elif isinstance(item, (int, float)):
            out.append(item)
        else:
            raise TypeError(f"gradient_check inputs: cannot make a tensor from {item!r}")
    return tuple(out)


def run_marked(fn, name: str | None = None):
    """Run one ``@gradient_check`` function; returns its Report (does not raise)."""
    opts = fn.__symgrad_check__
    inputs = resolve_inputs(opts["inputs"], opts["seed"])
    return verify_call(fn, *inputs, mode=opts["mode"], rtol=opts["rtol"], atol=opts["atol"],
                       order=opts["order"], check_name=name or fn.__qualname__)
