"""``gradcheck`` / ``gradgradcheck`` with PyTorch's signature and defaults.

Finite differences are the independent opinion here (the SymPy verifier is the other):
central differences on the inputs (use float64) against the engine's vector-Jacobian
products, either the full Jacobian or, with ``fast_mode=True``, one random projection
``v^T J u`` as PyTorch's fast mode does.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["GradcheckError", "gradcheck", "gradgradcheck"]


class GradcheckError(RuntimeError):
    """Raised by gradcheck when analytical and numerical gradients disagree."""


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _diff_inputs(inputs):
    from ..tensor import Tensor

    return [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]


def _outputs(func, inputs):
    from ..tensor import Tensor

    return [o for o in _as_tuple(func(*inputs)) if isinstance(o, Tensor)]


def _numerical_jacobians(func, inputs, out_index, eps):
    """Per differentiable input, the (numel_out, numel_in) central-difference Jacobian."""
    # grad mode stays on: for gradgradcheck, ``func`` itself runs autograd.grad
    jacs = []
    for i in _diff_inputs(inputs):
        flat = inputs[i]._data.reshape(-1)  # a view: perturb in place, then restore
        cols = []
        for k in range(flat.size):
            orig = flat[k].item()
            flat[k] = orig + eps
            plus = _outputs(func, inputs)[out_index]._data.astype(np.float64).ravel()
            flat[k] = orig - eps
            minus = _outputs(func, inputs)[out_index]._data.astype(np.float64).ravel()
            flat[k] = orig
            cols.append((plus - minus) / (2 * eps))
        n_out = _outputs(func, inputs)[out_index].numel()
        jacs.append(np.stack(cols, axis=1) if cols else np.zeros((n_out, 0)))
    return jacs


def _analytical_jacobians(func, inputs, out_index):
    """Rows of the Jacobian from one vector-Jacobian product per output element."""
    from ..autograd import grad
    from ..creation import zeros_like

    idx = _diff_inputs(inputs)
    out = _outputs(func, inputs)[out_index]
    rows = [[] for _ in idx]
    for k in range(out.numel()):
        v = zeros_like(out)
        v._data.reshape(-1)[k] = 1
        gs = grad(out, [inputs[i] for i in idx], v, retain_graph=True, allow_unused=True)
        for r, g, i in zip(rows, gs, idx):
            n = inputs[i].numel()
            r.append(np.zeros(n) if g is None else g._data.astype(np.float64).ravel())
    return [np.stack(r) if r else np.zeros((0, inputs[i].numel())) for r, i in zip(rows, idx)]


def _fast_check(func, inputs, out_index, eps, atol, rtol, rng):
    """PyTorch's fast mode: compare v^T J u computed both ways for random u, v."""
    from ..autograd import grad
    from ..tensor import tensor

    idx = _diff_inputs(inputs)
    out = _outputs(func, inputs)[out_index]
    v = rng.standard_normal(out.numel())
    us = [rng.standard_normal(inputs[i].numel()) for i in idx]
    gs = grad(out, [inputs[i] for i in idx],
              tensor(v.reshape(tuple(out.shape)), dtype=out.dtype), retain_graph=True,
              allow_unused=True)
    analytical = sum(float(np.dot(u, g._data.astype(np.float64).ravel()))
                     for u, g in zip(us, gs) if g is not None)
    flats = [inputs[i]._data.reshape(-1) for i in idx]
    origs = [f.copy() for f in flats]
    for f, u in zip(flats, us):
        f += (eps * u).astype(f.dtype)
    plus = _outputs(func, inputs)[out_index]._data.astype(np.float64).ravel()
    for f, o, u in zip(flats, origs, us):
        f[...] = o - (eps * u).astype(f.dtype)
    minus = _outputs(func, inputs)[out_index]._data.astype(np.float64).ravel()
    for f, o in zip(flats, origs):
        f[...] = o
    numerical = float(np.dot(v, (plus - minus) / (2 * eps)))
    return analytical, numerical, abs(analytical - numerical) <= atol + rtol * abs(numerical)


def gradcheck(func: Callable, inputs, *, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, raise_exception: bool = True, nondet_tol: float = 0.0,
              check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
              check_batched_grad: bool = False, check_batched_forward_grad: bool = False,
              check_forward_ad: bool = False, check_backward_ad: bool = True,
              fast_mode: bool = False, masked: bool | None = None) -> bool:
    """Check the engine's gradients of ``func`` at ``inputs`` against finite differences."""
    inputs = _as_tuple(inputs)
    idx = _diff_inputs(inputs)
    if not idx:
        raise ValueError("gradcheck expects at least one input tensor to require gradient, "
                         "but none of the them have requires_grad=True.")
    for i in idx:
        if inputs[i].dtype.name != "float64":
            warnings.warn(f"Input #{i} requires gradient and is not a double precision floating "
                          "point. This check will likely fail if all the inputs are not of "
                          "double precision floating point. ", UserWarning, stacklevel=2)
    if not check_backward_ad:
        return True
    n_outputs = len(_outputs(func, inputs))
    rng = np.random.default_rng(0)
    for o in range(n_outputs):
        if fast_mode:
            a, n, ok = _fast_check(func, inputs, o, eps, atol, rtol, rng)
            if not ok:
                return _fail(raise_exception,
                             f"Jacobian mismatch for output {o} with respect to input(s) {idx},"
                             f"\nnumerical:{n}\nanalytical:{a}\n\nThe tolerance for nondeterminism "
                             f"was {nondet_tol}.\n(fast mode: v^T J u with random u, v)")
            continue
        numerical = _numerical_jacobians(func, inputs, o, eps)
        analytical = _analytical_jacobians(func, inputs, o)
        for j, (num, ana) in enumerate(zip(numerical, analytical)):
            if num.shape != ana.shape or not np.allclose(ana, num, rtol=rtol, atol=atol):
                return _fail(raise_exception,
                             f"Jacobian mismatch for output {o} with respect to input {idx[j]},"
                             f"\nnumerical:{num}\nanalytical:{ana}\n")
    return True


def _fail(raise_exception: bool, message: str) -> bool:
    if raise_exception:
        raise GradcheckError(message)
    return False


def gradgradcheck(func: Callable, inputs, grad_outputs: Sequence | None = None, *,
                  eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
                  gen_non_contig_grad_outputs: bool = False, raise_exception: bool = True,
                  nondet_tol: float = 0.0, check_undefined_grad: bool = True,
                  check_grad_dtypes: bool = False, check_batched_grad: bool = False,
                  check_fwd_over_rev: bool = False, check_rev_over_rev: bool = True,
                  fast_mode: bool = False, masked: bool = False) -> bool:
    """Check second derivatives: gradcheck of the (create_graph) vector-Jacobian product."""
    from ..autograd import grad
    from ..tensor import tensor

    inputs = _as_tuple(inputs)
    outs = _outputs(func, inputs)
    if grad_outputs is None:
        rng = np.random.default_rng(1)
        grad_outputs = tuple(
            tensor(rng.standard_normal(tuple(o.shape)), dtype=o.dtype, requires_grad=True)
            for o in outs)
    grad_outputs = _as_tuple(grad_outputs)
    n_in = len(inputs)
    idx = _diff_inputs(inputs)

    def vjp(*args):
        xs, gos = args[:n_in], args[n_in:]
        ys = _outputs(func, xs)
        gs = grad(ys, [xs[i] for i in idx], list(gos), create_graph=True, allow_unused=True)
        return tuple(g for g in gs if g is not None)

    return gradcheck(vjp, inputs + grad_outputs, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception, nondet_tol=nondet_tol,
                     fast_mode=fast_mode)
