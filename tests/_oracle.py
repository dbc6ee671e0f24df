"""Shared helpers for the op-set oracle tests: run one program on symgrad and on torch and
compare values, gradients, second derivatives and the whole recorded graph."""

from __future__ import annotations

import numpy as np
from _tolerance import as_array, magnitude
from _tolerance import assert_close as _assert_close

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
    return as_array(t)


def first(out):
    """The differentiable result of a program (values of a max(dim) named tuple)."""
    return out[0] if isinstance(out, tuple) else out


def weights(shape, seed=7):
    return np.random.default_rng(seed).uniform(-1, 1, size=shape)


def program_terms(arrays, out_shape=(), create_graph=False):
    """How many rounding errors a program of the op set can accumulate (for the tolerance).

    No op of the set sums over more elements than its inputs hold (sum/mean/softmax over
    some of them, a matmul over its inner dim), and the weighted-sum loss adds one term per
    output element; a second derivative runs the chain again and sums g * g over the
    gradients (as many elements as the inputs)."""
    n = sum(max(int(np.size(a)), 1) for a in arrays) + max(int(np.prod(out_shape)), 1)
    return 2 * n + sum(max(int(np.size(a)), 1) for a in arrays) if create_graph else n


def run_grads(lib, fn, arrays, create_graph=False):
    """Run ``fn`` on leaves made from ``arrays``; the loss is the weighted sum of its output.

    Sets ``run_grads.signature`` (the graph) and ``run_grads.terms`` (program_terms)."""
    xs = leaves(lib, arrays)
    out = first(fn(lib, *xs))
    run_grads.terms = program_terms(arrays, tuple(out.shape), create_graph)
    run_grads.signature = graph_signature(out.grad_fn, terms=run_grads.terms,
                                          scale=magnitude(*arrays))
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


def assert_close(a, b, *, terms=1, scale=None, inputs=(), msg=""):
    """Values or gradients of the two libraries within the dtype's rounding bound
    (tests/_tolerance.py) over ``terms`` accumulated errors. The scale defaults to the
    magnitude of ``b`` and of the program's ``inputs`` (its reductions sum products of the
    inputs with weights in [-1, 1], and may cancel). ``None`` (no gradient) on one side
    requires exact zeros on the other: a gradient that does not depend on the input is never
    computed by rounding."""
    if a is None or b is None:
        for v in (a, b):
            if v is not None:
                _assert_close(v, np.zeros_like(as_np(v)), msg=msg or "None vs a gradient")
        return
    a, b = as_np(a), as_np(b)
    if scale is None:
        scale = magnitude(b, *inputs)
    _assert_close(a, b, terms=terms, scale=scale, msg=msg)


class SavedArray:
    """A saved tensor in a graph signature: equal to another when shape and dtype match and
    the values agree within the rounding bound of ``terms`` accumulated errors."""

    def __init__(self, array, terms, scale=0.0):
        self.array, self.terms, self.scale = array, terms, scale

    def __eq__(self, other):
        if not isinstance(other, SavedArray):
            return NotImplemented
        a, b = self.array, other.array
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        try:  # the suite's one comparison (NaN, inf and integer rules included)
            _assert_close(a, b, terms=max(self.terms, other.terms),
                          scale=max(magnitude(b), self.scale, other.scale))
        except AssertionError:
            return False
        return True

    __hash__ = None

    def __repr__(self):
        return f"SavedArray({self.array.shape}, {self.array.dtype}, {self.array.tolist()})"


def _saved_value(v, terms, scale):
    if hasattr(v, "detach") and hasattr(v, "shape"):
        return ("T", SavedArray(as_np(v), terms, scale))
    if isinstance(v, tuple):
        return tuple(_saved_value(x, terms, scale) for x in v)
    return v  # Python numbers are the program's constants: exact


def graph_signature(fn, memo=None, terms=1, scale=0.0):
    """Nested (name, saved attrs, children) of a grad_fn, torch's prefixes stripped; saved
    tensors compare within the rounding bound of ``terms`` accumulated errors, relative to
    their magnitude or ``scale`` (the inputs'), whichever is larger."""
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
            saved[attr] = _saved_value(getattr(fn, attr), terms, scale)
    edges = tuple(fn.next_functions)
    if name == "WhereBackward0" and len(edges) == 3:
        # symgrad keeps where's condition as a first, edge-less input (None, 0) (the fused
        # CPU kernel's layout); torch's WhereBackward0 has only the two value edges.
        assert edges[0] == (None, 0)
        edges = edges[1:]
    sig = (name, tuple(sorted(saved.items())),
           tuple((graph_signature(n, memo, terms, scale), nr) for n, nr in edges))
    memo[id(fn)] = sig
    return sig
