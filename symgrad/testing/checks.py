"""Assertion helpers that run the symbolic verifier and fail with its readable table.

Every check run here is also recorded in ``RECORDED`` so that the pytest plugin can write
one session report (JSON + HTML) of all checks, gathered across xdist workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["assert_gradients_match", "assert_function_correct", "check_function",
           "gradient_check", "resolve_inputs", "leaf_names", "RECORDED"]

#: (check name, report JSON) for every check run in this process, in order.
RECORDED: list[tuple[str, dict]] = []


def _record(report, name: str | None) -> None:
    RECORDED.append((name or "check", report.to_json()))


def _verify(root, *, mode, rtol, atol, order, names, gradient=None, namespace=None,
            workers=None):
    from ..symbolic import verify

    kwargs: dict[str, Any] = {"mode": mode, "order": order, "names": names,
                              "namespace": namespace if namespace is not None else {},
                              "workers": workers}
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


def _namespace(fn: Callable, inputs: tuple) -> dict:
    """The variables the graph ``fn(*inputs)`` builds is named by (``symgrad._naming``)."""
    from .._naming import function_namespace

    return function_namespace(fn, inputs)


def leaf_names(fn: Callable, inputs: tuple) -> dict:
    """``{name: tensor}`` for the inputs of ``fn(*inputs)`` and the parameters of the
    modules it uses, named as every view names leaves (``symgrad._naming``):

    1. ``tensor.name``;
    2. ``named_parameters()`` / ``named_buffers()`` paths (``fc1.weight``) of the modules
       that own them; prefixed by the module's variable name when two models share a path;
    3. ``fn``'s argument names, then tensors in the closure or globals ``fn`` reads;
    4. ``t0, t1, ...`` for inputs nothing better names.
    """
    from .._naming import _variables, unique_names
    from ..tensor import Tensor

    ns = _namespace(fn, inputs)
    _tensors, modules = _variables(ns)
    tensors: list[Any] = []
    seen: set[int] = set()

    def add(t: Any) -> None:
        if isinstance(t, Tensor) and id(t) not in seen:
            seen.add(id(t))
            tensors.append(t)

    for _var, mod in modules:
        for _path, t in list(mod.named_parameters()) + list(mod.named_buffers()):
            add(t)
    for x in inputs:
        add(x)
    for value in ns.values():
        add(value)
    return dict(zip(unique_names(tensors, None, ns), tensors))


def verify_call(fn: Callable, *inputs, mode: str = "auto", rtol: float | None = None,
                atol: float | None = None, order: int = 1, names: dict | None = None,
                check_name: str | None = None, workers: int | None = None):
    """Build the graph by calling ``fn(*inputs)``, verify it and record the Report.

    A non-scalar output is checked along a fixed, seeded cotangent (a vector-Jacobian
    product), so every output element takes part. ``workers=N`` fans the per-node checks
    out over N processes (``symgrad.verify``'s argument: the same report).
    """
    from ..nn.modules import keep_new_modules
    from ..tensor import Tensor

    with keep_new_modules() as _made:  # a model fn makes still names its parameters
        out = fn(*inputs)
    if isinstance(out, (tuple, list)):
        out = next(o for o in out if isinstance(o, Tensor) and o.requires_grad)
    if not isinstance(out, Tensor):
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} must return a Tensor, "
                        f"got {type(out).__name__}")
    gradient = None if out.numel() == 1 else _seeded_cotangent(out)
    # the caller's names first, then the one naming of every view (symgrad._naming)
    report = _verify(out, mode=mode, rtol=rtol, atol=atol, order=order, names=names,
                     gradient=gradient, namespace=_namespace(fn, inputs), workers=workers)
    _record(report, check_name or getattr(fn, "__qualname__", None))
    return report


def assert_gradients_match(fn: Callable, *inputs, mode: str = "auto", rtol: float | None = None,
                           atol: float | None = None, order: int = 1,
                           names: dict | None = None, check_name: str | None = None,
                           workers: int | None = None):
    """Verify the graph ``fn(*inputs)`` builds; AssertionError with the verifier's table
    when any gradient disagrees. Returns the Report when all is well."""
    report = verify_call(fn, *inputs, mode=mode, rtol=rtol, atol=atol, order=order,
                         names=names, check_name=check_name, workers=workers)
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
                   atol: float | None = None, order: int = 1, seed: int = 0,
                   workers: int | None = None):
    """Mark a function for ``symgrad check``: ``inputs`` are tensors, shapes (random float64
    leaves that require grad, seeded), or a callable returning either; ``workers=N`` checks
    its nodes in N processes (``symgrad check --workers N`` sets it for every check)."""

    def mark(fn):
        fn.__symgrad_check__ = {"inputs": inputs, "mode": mode, "rtol": rtol, "atol": atol,
                                "order": order, "seed": seed, "workers": workers}
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
                       order=opts["order"], check_name=name or fn.__qualname__,
                       workers=opts.get("workers"))


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


def _torch_function_class(function_cls) -> bool:
    """True for a ``torch.autograd.Function`` subclass (torch is not imported for this:
    a class of torch's can only exist once torch is)."""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(function_cls, type) and \
        issubclass(function_cls, torch.autograd.Function)


def _torch_function_graph(function_cls, inputs, seed):
    """``function_cls.apply`` on leaf copies of the float torch tensors among ``inputs``,
    recorded under ``symgrad.capture_torch()`` (the path ``symgrad.verify`` documents for
    torch graphs), and the seeded cotangents: ``(outs, cotangents, names, leaves)``."""
    import torch

    from ..symbolic import capture_torch
    from ..symbolic.trace import forward_arg_names

    arg_names = forward_arg_names(function_cls, len(inputs))
    args, names, leaves = [], {}, []
    for j, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
            t = x.detach().clone().requires_grad_(True)
            names[arg_names[j]] = t
            leaves.append((j, arg_names[j], t))
            args.append(t)
        else:
            args.append(x)
    if not leaves:
        return None, None, names, leaves
    with capture_torch():
        out = function_cls.apply(*args)
    outs = [o for o in (out if isinstance(out, tuple) else (out,))
            if isinstance(o, torch.Tensor) and o.requires_grad]
    rng = np.random.default_rng(seed)
    cots = [torch.tensor(rng.uniform(0.5, 1.5, size=tuple(o.shape)), dtype=o.dtype)
            for o in outs]
    return outs, cots, names, leaves


def _torch_claims_double_backward(outs, cotangents, leaves) -> bool:
    """As :func:`_claims_double_backward`, through ``torch.autograd.grad``."""
    import torch

    try:
        gs = torch.autograd.grad(outs, [t for _, _, t in leaves], cotangents,
                                 retain_graph=True, create_graph=True, allow_unused=True)
    except Exception:  # noqa: BLE001 - not differentiable twice
        return False
    return any(g is not None and g.grad_fn is not None for g in gs)


def assert_function_correct(function_cls, *inputs, order: int | None = None,
                            require_exact: bool = False, mode: str = "auto",
                            rtol: float | None = None, atol: float | None = None,
                            seed: int = 0, check_name: str | None = None,
                            workers: int | None = None):
    """Prove a custom ``autograd.Function``'s backward against the exact derivative of the
    forward it actually runs (traced on symbols; no ``sympy`` method needed), at
    ``inputs``; with ``order=2`` also its double backward (``None``, the default: when the
    backward is differentiable, i.e. its gradients carry a grad_fn under
    ``create_graph=True``).

    ``function_cls`` is a symgrad ``autograd.Function`` (symgrad tensor inputs) or a
    ``torch.autograd.Function`` (torch tensor inputs): a torch one is applied under
    ``symgrad.capture_torch()`` and its torch graph verified, the path
    ``symgrad.verify`` takes for any torch graph.

    Float tensor inputs are copied as leaves that require grad and named after forward's
    parameters; other arguments pass through. Outputs are checked along a seeded cotangent.
    Raises AssertionError naming the input whose gradient is wrong and the element (engine
    against exact value), followed by the verifier's table. A forward that cannot be
    traced is checked by finite differences (the report's notes say which line stopped
    the trace); ``require_exact=True`` makes that a failure. A Function that declares
    ``surrogate_gradient = True`` (straight-through estimator) is not compared with its
    forward's derivative. ``workers=N`` fans the verifier's per-node checks out over N
    processes (the Function's own node is checked in this process). Returns the Report."""
    from ..symbolic import verify

    if not isinstance(function_cls, type) or not callable(getattr(function_cls, "apply", None)):
        raise TypeError(f"assert_function_correct expects an autograd.Function class "
                        f"(symgrad or torch), not {function_cls!r}")
    is_torch = _torch_function_class(function_cls)
    kind = "floating-point torch tensor" if is_torch else "floating-point tensor"
    if is_torch:
        outs, cots, names, leaves = _torch_function_graph(function_cls, inputs, seed)
    else:
        outs, cots, names, leaves = _symgrad_function_graph(function_cls, inputs, seed)
    if not leaves:
        raise TypeError(f"{function_cls.__name__}: no {kind} among the inputs")
    if not outs:
        raise TypeError(f"{function_cls.__name__}.apply returned no tensor that requires grad")
    if order is None:
        claims = _torch_claims_double_backward if is_torch else _claims_double_backward
        order = 2 if claims(outs, cots, leaves) else 1
    if len(outs) == 1:
        root, gradient = outs[0], cots[0]
    else:  # several outputs: one scalar along the cotangents
        root, gradient = _combine(outs, cots, is_torch), None
    # forward's parameter names; the cotangents (constants) are named t0, t1 ...
    kwargs: dict[str, Any] = {"mode": mode, "order": order, "names": names, "namespace": {},
                              "workers": workers}
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


def _combine(outs, cots, is_torch: bool):
    """One scalar ``sum((o * c).sum())``; for torch under ``capture_torch()``, which keeps
    the values of the combining ops that torch itself does not save."""
    if not is_torch:
        return sum((o * c).sum() for o, c in zip(outs, cots))
    from ..symbolic import capture_torch

    with capture_torch():
        return sum((o * c).sum() for o, c in zip(outs, cots))


def _symgrad_function_graph(function_cls, inputs, seed):
    """``function_cls.apply`` on leaf copies of the float symgrad tensors among ``inputs``
    and the seeded cotangents: ``(outs, cotangents, names, leaves)``."""
    from ..tensor import Tensor, tensor

    args, names, leaves = _function_leaves(function_cls, inputs)
    if not leaves:
        return None, None, names, leaves
    out = function_cls.apply(*args)
    outs = [o for o in (out if isinstance(out, tuple) else (out,))
            if isinstance(o, Tensor) and o.requires_grad]
    rng = np.random.default_rng(seed)
    cots = [tensor(rng.uniform(0.5, 1.5, size=tuple(o.shape)), dtype=o.dtype) for o in outs]
    return outs, cots, names, leaves
