"""Assertion helpers that run the symbolic verifier and fail with its readable table.

Every check run here is also recorded in ``RECORDED`` so that the pytest plugin can write
one session report (JSON + HTML) of all checks, gathered across xdist workers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["assert_gradients_match", "check_function", "gradient_check", "resolve_inputs",
           "leaf_names", "RECORDED"]

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


# -- names the verifier gives the leaves ---------------------------------------------------
def _is_module(obj) -> bool:
    from ..nn import Module

    return isinstance(obj, Module)


def _signature_target(fn):
    """The callable whose parameters name ``fn``'s arguments (and a leading one to drop):
    a Module's ``forward``, a custom Function's ``forward`` after ``ctx``."""
    if _is_module(fn):
        return fn.forward, 0
    owner = getattr(fn, "__self__", None)
    if getattr(fn, "__name__", "") == "apply" and isinstance(owner, type) and \
            hasattr(owner, "forward") and hasattr(owner, "backward"):
        return owner.forward, 1  # Function.apply(*args) -> forward(ctx, *args)
    return fn, 0


def _argument_names(fn, inputs) -> list[tuple[str, Any]]:
    """``(parameter name, value)`` for each positional input, as ``fn`` calls them."""
    target, drop = _signature_target(fn)
    try:
        params = list(inspect.signature(target).parameters.values())[drop:]
    except (TypeError, ValueError):
        return []
    out = []
    k = 0
    for p in params:
        if k >= len(inputs):
            break
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            out.append((p.name, inputs[k]))
            k += 1
        elif p.kind == p.VAR_POSITIONAL:
            out += [(f"{p.name}[{j}]", inputs[k + j]) for j in range(len(inputs) - k)]
            k = len(inputs)
    return out


def _code_names(code) -> set[str]:
    """Global names a code object (and the lambdas/comprehensions inside it) reads."""
    names = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            names |= _code_names(c)
    return names


def _referenced(fn) -> Iterator[tuple[str, Any]]:
    """``(variable name, value)`` for the closure cells, globals and bound ``self`` that
    ``fn`` reads: where the modules and tensors it uses live."""
    func = getattr(fn, "__func__", fn)
    owner = getattr(fn, "__self__", None)
    if owner is not None and _is_module(owner):
        yield "self", owner
    code = getattr(func, "__code__", None)
    if code is None:
        return
    for name, cell in zip(code.co_freevars, getattr(func, "__closure__", None) or ()):
        try:
            yield name, cell.cell_contents
        except ValueError:  # an empty cell
            continue
    glob = getattr(func, "__globals__", {})
    for name in sorted(_code_names(code)):
        if name in glob:
            yield name, glob[name]


def leaf_names(fn: Callable, inputs: tuple) -> dict:
    """Names for the leaves of the graph ``fn(*inputs)`` builds, best first (the verifier
    keeps the first name it sees for each tensor; ``tensor.name`` beats all of them):

    1. ``named_parameters()`` / ``named_buffers()`` paths (``fc1.weight``) of the modules
       ``fn`` uses: ``fn`` itself, a module argument, or one its code reads (closure,
       globals, bound ``self``); prefixed by the module's variable name only when two
       modules are in play;
    2. ``fn``'s argument names (a custom Function's ``forward`` parameters, a Module's
       ``forward`` parameters, ``args[0]`` for ``*args``);
    3. tensors in the closure or globals ``fn`` reads, by variable name;
    4. ``x0, x1, ...`` for inputs nothing better names.
    """
    from ..tensor import Tensor

    args = _argument_names(fn, inputs)
    modules: list[tuple[str, Any]] = []
    tensors: list[tuple[str, Any]] = []
    seen: set[int] = set()
    candidates = [("", fn)] + args + list(_referenced(fn))
    for name, obj in candidates:
        if _is_module(obj) and id(obj) not in seen:
            seen.add(id(obj))
            modules.append((name, obj))
        elif isinstance(obj, Tensor) and name and not name.startswith("_"):
            tensors.append((name, obj))
    names: dict = {}
    for var, mod in modules:
        prefix = var if len(modules) > 1 and var else ""
        for path, t in list(mod.named_parameters(prefix=prefix)) + \
                list(mod.named_buffers(prefix=prefix)):
            names.setdefault(path, t)
    for name, t in tensors:
        names.setdefault(name, t)
    named = {id(t) for t in names.values()}
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor) and id(x) not in named:
            names.setdefault(f"x{i}", x)
    return names


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
    merged = dict(names or {})  # the caller's names come first
    for k, v in leaf_names(fn, inputs).items():
        merged.setdefault(k, v)
    report = _verify(out, mode=mode, rtol=rtol, atol=atol, order=order, names=merged,
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
    """Turn a ``gradient_check(inputs=...)`` value into a tuple of tensors (numbers and
    ``nn.Module`` instances pass through as they are)."""
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
        elif isinstance(item, (int, float)) or _is_module(item):
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
