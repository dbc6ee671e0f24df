"""Shared helpers for the op-set oracle tests: run one program on symgrad and on torch and
compare values, gradients, second derivatives and the whole recorded graph."""

from __future__ import annotations

import numpy as np

import symgrad as sg


def leaves(lib, arrays, requires_grad=True):
    if lib is sg:
        return [sg.tensor(a, requires_grad=requires_grad and a.dtype.kind == "f") for a in arrays]
    import torch

    return [torch.tensor(a, requires_grad=requires_grad and a.dtype.kind == "f") for a in arrays]


def as_np(t):
    if t is None:
        return None
    if isinstance(t, sg.Tensor):
        return np.asarray(t.detach().numpy())
    return t.detach().numpy()


def first(out):
    """The differentiable result of a program (values of a max(dim) named tuple)."""
    return out[0] if isinstance(out, tuple) else out


def weights(shape, seed=7):
    return np.random.default_rng(seed).uniform(-1, 1, size=shape)


def run_grads(lib, fn, arrays, create_graph=False):
    xs = leaves(lib, arrays)
    out = first(fn(lib, *xs))
    run_grads.signature = graph_signature(out.grad_fn)
    w = weights(tuple(out.shape))
    wt = lib.tensor(w.astype(as_np(out).dtype)) if out.dtype in (lib.float32, lib.float64) \
        else None
    diff = [x for x in xs if x.requires_grad]
    if wt is None or not out.requires_grad or not diff:
        return out, None, None
    loss = (out * wt).sum()
    if lib is sg:
        grads = sg.autograd.grad(loss, diff, create_graph=create_graph, allow_unused=True)
    else:
        import torch

        grads = torch.autograd.grad(loss, diff, create_graph=create_graph, allow_unused=True)
    second = None
    if create_graph:
        gs = [g for g in grads if g is not None and g.requires_grad]
        if gs:
            total = sum((g * g).sum() for g in gs)
            autograd = sg.autograd if lib is sg else __import__("torch").autograd
            second = autograd.grad(total, diff, allow_unused=True)
    return out, grads, second


def assert_close(a, b, rtol=1e-5, atol=1e-6):
    if a is None or b is None:
        assert (a is None or np.allclose(as_np(a), 0)) and (b is None or np.allclose(as_np(b), 0))
        return
    a, b = as_np(a), as_np(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol)


def _saved_value(v):
    if hasattr(v, "detach") and hasattr(v, "shape"):
        a = as_np(v)
        return ("T", tuple(a.shape), str(a.dtype), np.round(a.astype(np.float64), 5).tolist())
    if isinstance(v, tuple):
        return tuple(_saved_value(x) for x in v)
    if isinstance(v, float):
        return round(v, 6)
    return v


def graph_signature(fn, memo=None):
    """Nested (name, saved attrs, children) of a grad_fn, torch's prefixes stripped."""
    if fn is None:
        return None
    memo = {} if memo is None else memo
    if id(fn) in memo:
        return memo[id(fn)]
    name = fn.name().replace("torch::autograd::", "")
    if name == "AccumulateGrad":
        return ("AccumulateGrad", tuple(fn.variable.shape))
    saved = {}
    for attr in dir(fn):
        if attr.startswith("_saved_"):
            saved[attr] = _saved_value(getattr(fn, attr))
    edges = tuple(fn.next_functions)
    if name == "WhereBackward0" and len(edges) == 3:
        # symgrad keeps where's condition as a first, edge-less input (None, 0) (the fused
        # CPU kernel's layout); torch's WhereBackward0 has only the two value edges.
        assert edges[0] == (None, 0)
        edges = edges[1:]
    sig = (name, tuple(sorted(saved.items())),
           tuple((graph_signature(n, memo), nr) for n, nr in edges))
    memo[id(fn)] = sig
    return sig
