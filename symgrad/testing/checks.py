"""Assertion helpers that run the symbolic verifier and fail with its readable table.

Every check run here is also recorded in ``RECORDED`` so that the pytest plugin can write
one session report (JSON + HTML) of all checks, gathered across xdist workers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

__all__ = ["assert_gradients_match", "assert_function_correct", "check_function",
           "gradient_check", "resolve_inputs", "leaf_names", "RECORDED"]

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


# -- custom Functions: one line proves the backward ------------------------------------------
def _function_leaves(function_cls, inputs):
    """Copies of the float tensor inputs as leaves that require grad, named after forward's
    parameters; other arguments pass through."""
    from ..symbolic.trace import forward_arg_names
    from ..tensor import Tensor

    arg_names = forward_arg_names(function_cls, len(inputs))
    args, names, leaves = [], {}, []
    for j, x in enumerate(inputs):
        if isinstance(x, Tensor) and x.dtype.is_floating_point:
            t = x.detach().clone().requires_grad_(True)
            names[arg_names[j]] = t
            leaves.append((j, arg_names[j], t))
            args.append(t)
        else:
            args.append(x)
    return args, names, leaves


def _claims_double_backward(outs, cotangents, leaves) -> bool:
    """True when the Function's backward is differentiable: under create_graph=True the
    gradients it returns carry a grad_fn (not a once_differentiable backward)."""
    from ..autograd import grad

    try:
        gs = grad([o for o in outs], [t for _, _, t in leaves], cotangents,
                  retain_graph=True, create_graph=True, allow_unused=True)
    except Exception:  # noqa: BLE001 - not differentiable twice
        return False
    return any(g is not None and g.grad_fn is not None for g in gs)


def _function_failure(cls_name, report, leaves) -> str:
    """A readable reason naming the input whose gradient is wrong and the element."""
    from ..symbolic.report import node_detail

    pos = {name: j for j, name, _ in leaves}
    lines = []
    for row in report.leaves:
        if row.status in ("ok", "not checked"):
            continue
        where = "" if row.worst_index is None else \
            f"{row.name}{list(int(i) for i in row.worst_index)}"
        arg = f"input '{row.name}'" + (f" (argument {pos[row.name] + 1} of forward)"
                                        if row.name in pos else "")
        if row.status == "mismatch":
            bound = f", bound {row.bound:.3g}" if row.bound is not None else ""
            lines.append(f"{cls_name}.backward gives a wrong gradient for {arg}: worst "
                         f"element of the gradient at {where}: engine {row.engine_value:.10g}, "
                         f"exact {row.symbolic_value:.10g} (max abs err "
                         f"{row.max_abs_err:.3g}{bound})")
        else:
            lines.append(f"{arg}: {row.status}" + (f" ({row.detail})" if row.detail else ""))
    for row in report.nodes:
        if row.status in ("mismatch", "error", "could not evaluate") and row.detail:
            lines.append(f"{row.name} (its own backward against the derivative of its "
                         f"forward): {node_detail(row.detail)}")
    for h in report.hvp:
        if h.get("status") not in ("ok", None):
            lines.append(f"double backward of {cls_name}: the Hessian-vector product for "
                         f"input '{h.get('name')}' is {h.get('status')} (max abs err "
                         f"{h.get('max_abs_err', float('nan')):.3g}); its backward is "
                         "differentiable under create_graph=True, so it claims a double "
                         "backward (values saved from forward are constants there: decorate "
                         "the backward with @once_differentiable, or pass order=1)")
    if not lines:
        lines.append(f"{cls_name}: verification status {report.status!r}")
    return "\n".join(lines)


def assert_function_correct(function_cls, *inputs, order: int | None = None,
                            require_exact: bool = False, mode: str = "auto",
                            rtol: float | None = None, atol: float | None = None,
                            seed: int = 0, check_name: str | None = None):
    """Prove a custom ``autograd.Function``'s backward against the exact derivative of the
    forward it actually runs (traced on symbols; no ``sympy`` method needed), at
    ``inputs``; with ``order=2`` also its double backward (``None``, the default: when the
    backward is differentiable, i.e. its gradients carry a grad_fn under
    ``create_graph=True``).

    Float tensor inputs are copied as leaves that require grad and named after forward's
    parameters; other arguments pass through. Outputs are checked along a seeded cotangent.
    Raises AssertionError naming the input whose gradient is wrong and the element (engine
    against exact value), followed by the verifier's table. A forward that cannot be
    traced is checked by finite differences (the report's notes say which line stopped
    the trace); ``require_exact=True`` makes that a failure. A Function that declares
    ``surrogate_gradient = True`` (straight-through estimator) is not compared with its
    forward's derivative. Returns the Report."""
    from ..symbolic import verify
    from ..tensor import Tensor, tensor

    args, names, leaves = _function_leaves(function_cls, inputs)
    if not leaves:
        raise TypeError(f"{function_cls.__name__}: no floating-point tensor among the inputs")
    out = function_cls.apply(*args)
    outs = [o for o in (out if isinstance(out, tuple) else (out,))
            if isinstance(o, Tensor) and o.requires_grad]
    if not outs:
        raise TypeError(f"{function_cls.__name__}.apply returned no tensor that requires grad")
    rng = np.random.default_rng(seed)
    cots = [tensor(rng.uniform(0.5, 1.5, size=tuple(o.shape)), dtype=o.dtype) for o in outs]
    if order is None:
        order = 2 if _claims_double_backward(outs, cots, leaves) else 1
    if len(outs) == 1:
        root, gradient = outs[0], cots[0]
    else:  # several outputs: one scalar along the cotangents
        root = sum((o * c).sum() for o, c in zip(outs, cots))
        gradient = None
    kwargs: dict[str, Any] = {"mode": mode, "order": order, "names": names}
    if rtol is not None:
        kwargs["rtol"] = rtol
    if atol is not None:
        kwargs["atol"] = atol
    report = verify(root, gradient, **kwargs)
    _record(report, check_name or function_cls.__qualname__)
    fell_back = [n for n in report.notes if "could not be traced" in n or
                 "was not traced" in n]
    if not report.ok:
        raise AssertionError(_function_failure(function_cls.__name__, report, leaves)
                             + "\n\n" + str(report))
    if require_exact and fell_back:
        raise AssertionError(f"{function_cls.__name__}: not proved exactly: "
                             + "; ".join(fell_back))
    return report
