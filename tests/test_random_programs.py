"""Random programs drawn from the whole op registry, run on symgrad and on torch: every
leaf gradient must agree. Ranks 0-3, broadcasting, 200 derandomized examples.

Every differentiable op in ``OPS`` has a generator in ``GENERATORS`` (asserted), so an op
added to the registry without one fails here until it is drawable.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import symgrad as sg  # noqa: E402
from symgrad.ops import OPS  # noqa: E402

torch = pytest.importorskip("torch")

#: Differentiable ops other issues own and test with their own drawers: the nn losses and
#: addmm (nn issue), the in-place ops (autograd-semantics issue), device copies (GPU issue).
NOT_DRAWN_HERE = {"addmm", "mse_loss", "binary_cross_entropy_with_logits", "nll_loss",
                  "nll_loss2d",
                  "copy_", "fill_", "fill_tensor_", "zero_", "to_cpu", "to_cuda"}
# The in-place random initialisers draw from symgrad's generator, not torch's, so their
# values cannot match; tests/test_tensor_api.py checks their grad_fn, zero gradient, version.
NOT_DRAWN_HERE |= {"uniform_", "normal_", "random_", "random_to_", "random_from_to_",
                   "bernoulli_", "bernoulli_tensor_", "exponential_", "log_normal_", "cauchy_",
                   "geometric_"}
# binary_cross_entropy raises unless its input is within [0, 1], which a pool holding nan
# cannot promise; tests/test_losses_api.py compares it with torch (graph, values, grads).
NOT_DRAWN_HERE |= {"binary_cross_entropy"}
# as_strided_region is only made by writing into a view (no public function makes it);
# tests/test_inplace_views.py compares those writes with torch.
NOT_DRAWN_HERE |= {"as_strided_region"}


class Builder:
    """Draws a program step by step; shapes are tracked by running it on symgrad."""

    def __init__(self, data):
        self.data = data
        self.steps = []  # ("leaf", array) | ("op", name, fn(L, P) -> tensor)
        self.shadow = []  # symgrad values (no grad) of the pool, to know shapes

    def draw(self, strategy):
        return self.data.draw(strategy)

    def leaf(self, shape):
        a = np.random.default_rng(len(self.steps) * 7919 + len(shape)).uniform(-1.5, 1.5,
                                                                              size=shape)
        self.steps.append(("leaf", a))
        self.shadow.append(sg.tensor(a))
        return len(self.shadow) - 1

    def shape(self):
        rank = self.draw(st.integers(0, 3))
        return tuple(self.draw(st.integers(1, 3)) for _ in range(rank))

    def pick(self, pred=lambda t: True, make=None):
        """Index of a float pool tensor satisfying ``pred`` (a new leaf if none does)."""
        ok = [i for i, t in enumerate(self.shadow) if t.dtype.is_floating_point and pred(t)]
        if ok and self.draw(st.integers(0, 4)):
            return self.draw(st.sampled_from(ok))
        if make is not None:
            return self.leaf(make())
        shape = self.shape()
        if not pred(sg.zeros(shape)):
            shape = (2, 3)
        return self.leaf(shape)

    def bshape(self, shape):
        """A shape that broadcasts with ``shape`` (some dims 1, maybe fewer dims)."""
        drop = self.draw(st.integers(0, len(shape)))
        return tuple(1 if self.draw(st.booleans()) else s for s in shape[drop:])

    def dim(self, t, extra=0):
        n = max(t.ndim + extra, 1)
        return self.draw(st.integers(-n, n - 1))

    def op(self, name, fn):
        """Add ``fn(L, pool)``: one tensor, or a tuple of them (split's pieces all join
        the pool, so each gets its own term in the loss)."""
        with sg.no_grad():
            value = fn(sg, self.shadow)
        self.steps.append(("op", name, fn))
        self.shadow.extend(value if isinstance(value, tuple) else (value,))


def _pos(L, x):
    return x.abs() + 0.5


def _unary(name, method, positive=False, squash=False):
    def gen(b):
        i = b.pick()

        def fn(L, P):
            x = P[i]
            if positive:
                x = _pos(L, x)
            if squash:
                x = x.tanh()
            return getattr(x, method)()

        b.op(name, fn)
    return gen


def _binary(name, fn2, positive_other=False):
    def gen(b):
        i = b.pick()
        j = b.pick(lambda t: True, make=lambda: b.bshape(tuple(b.shadow[i].shape)))
        try:
            np.broadcast_shapes(tuple(b.shadow[i].shape), tuple(b.shadow[j].shape))
        except ValueError:
            j = b.leaf(b.bshape(tuple(b.shadow[i].shape)))

        def fn(L, P):
            y = _pos(L, P[j]) if positive_other else P[j]
            return fn2(L, P[i], y)

        b.op(name, fn)
    return gen


def _simple(name, make):
    """An op on one pool tensor: ``make(b, t) -> fn(L, x)``."""
    def gen(b):
        i = b.pick()
        f = make(b, b.shadow[i])
        b.op(name, lambda L, P: f(L, P[i]))
    return gen


def _gen_cross_entropy(name):
    """cross_entropy with label smoothing and an ignored class: the losses' own small ops
    (mul_scalar, div_scalar, masked_fill) as torch's C++ composes them."""
    def gen(b):
        i = b.pick(lambda t: t.ndim == 2 and 0 not in t.shape, make=lambda: (3, 4))
        n, c = b.shadow[i].shape
        labels = [b.draw(st.integers(0, c - 1)) for _ in range(n)]
        ignore = b.draw(st.sampled_from([-100, labels[0]]))
        smoothing = b.draw(st.sampled_from([0.0, 0.1, 0.3]))
        b.op(name, lambda L, P: L.nn.functional.cross_entropy(
            P[i], L.tensor(labels), ignore_index=ignore, label_smoothing=smoothing))
    return gen


def _loss(name, make):
    """A loss of a pool tensor against a target built from it (so both get gradients)."""
    return _simple(name, lambda b, t: make(b))


def _nonempty_dim(b, t):
    return b.dim(t) if t.ndim else 0


def _reduce_dims(b, t):
    if t.ndim == 0:
        return 0
    dims = b.draw(st.lists(st.integers(0, t.ndim - 1), min_size=1, max_size=t.ndim, unique=True))
    return tuple(d - t.ndim if b.draw(st.booleans()) else d for d in dims)


def _gen_mm(b):
    i = b.pick(lambda t: t.ndim == 2, make=lambda: (b.draw(st.integers(1, 3)), 3))
    j = b.leaf((b.shadow[i].shape[1], b.draw(st.integers(1, 3))))
    b.op("mm", lambda L, P: L.mm(P[i], P[j]))


def _gen_mv(b):
    i = b.pick(lambda t: t.ndim == 2, make=lambda: (2, 3))
    j = b.pick(lambda t: t.ndim == 1 and t.shape[0] == b.shadow[i].shape[1],
               make=lambda: (b.shadow[i].shape[1],))
    b.op("mv", lambda L, P: P[i] @ P[j])


def _gen_dot(b):
    i = b.pick(lambda t: t.ndim == 1, make=lambda: (3,))
    j = b.leaf(tuple(b.shadow[i].shape))
    b.op("dot", lambda L, P: P[i] @ P[j])


def _gen_vecmat(b):  # 1-D @ 2-D ends with SqueezeBackward4 (squeeze_)
    i = b.pick(lambda t: t.ndim == 1, make=lambda: (3,))
    j = b.leaf((b.shadow[i].shape[0], b.draw(st.integers(1, 3))))
    b.op("squeeze_", lambda L, P: P[i] @ P[j])


def _gen_bmm(b):
    i = b.pick(lambda t: t.ndim == 3, make=lambda: (2, 2, 3))
    s = b.shadow[i].shape
    j = b.leaf((s[0], s[2], b.draw(st.integers(1, 3))))
    b.op("bmm", lambda L, P: L.bmm(P[i], P[j]))


def _gen_matmul_batched(b):
    """Batched @ with broadcasting (bmm or folded mm/mv, as torch dispatches)."""
    i = b.pick(lambda t: t.ndim >= 1)
    s = tuple(b.shadow[i].shape)
    k = s[-1]
    rank = b.draw(st.integers(1 if len(s) >= 3 else 3, 3))
    if rank == 1:
        other = (k,)
    else:
        batch = b.bshape(s[:-2]) if len(s) > 2 else tuple(b.draw(st.integers(1, 2))
                                                        for _ in range(rank - 2))
        other = batch + (k, b.draw(st.integers(1, 3)))
    j = b.leaf(other)
    b.op("bmm", lambda L, P: P[i] @ P[j])


def _gen_reshape(kind):
    return lambda b: _reshape(b, kind)


def _reshape(b, kind):
    i = b.pick()
    t = b.shadow[i]
    if kind == "view":
        if b.draw(st.booleans()):
            b.op("view", lambda L, P: P[i].reshape(-1))
        else:
            b.op("view", lambda L, P: P[i].flatten(0, -1) if P[i].ndim else P[i].reshape(1))
    elif kind == "alias":  # non-contiguous but viewable: ReshapeAliasBackward0
        b.op("reshape_alias", lambda L, P: P[i].unsqueeze(-1).transpose(-1, 0).reshape(
            (1,) + tuple(t.shape)))
    else:
        b.op("unsafe_view", lambda L, P: (P[i].unsqueeze(0).expand(2, *t.shape)).reshape(-1))


def _gen_index(b):
    i = b.pick(lambda t: t.ndim >= 1, make=lambda: (3, 2))
    n = b.shadow[i].shape[0]
    # an empty dimension takes only an empty index list (no integer is in bounds)
    idx = b.draw(st.lists(st.integers(-n, n - 1), min_size=0, max_size=4)) if n else []
    mask = b.draw(st.booleans())
    if mask:
        m = np.array(b.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
        b.op("index", lambda L, P: P[i][L.tensor(m)])
    else:
        b.op("index", lambda L, P: P[i][L.tensor(np.array(idx, dtype=np.int64))])


def _gen_select(b):
    i = b.pick(lambda t: t.ndim >= 1 and 0 not in t.shape, make=lambda: (3,))
    t = b.shadow[i]
    d = b.dim(t)
    k = b.draw(st.integers(-t.shape[d], t.shape[d] - 1))
    b.op("select", lambda L, P: P[i].select(d, k))


def _gen_slice(b):
    i = b.pick(lambda t: t.ndim >= 1, make=lambda: (3, 2))
    n = b.shadow[i].shape[-1]
    start = b.draw(st.integers(-n - 1, n))
    stop = b.draw(st.one_of(st.none(), st.integers(-n, n + 2)))
    step = b.draw(st.integers(1, 2))
    b.op("slice", lambda L, P: P[i][..., start:stop:step])


def _backward_op(kind):
    def gen(b):
        i = b.pick(lambda t: t.ndim >= 1, make=lambda: (2, 3))
        t = b.shadow[i]
        d = b.dim(t)
        n = t.shape[d]
        big = tuple(t.shape[:d % t.ndim]) + (n + 1,) + tuple(t.shape[d % t.ndim + 1:])
        if kind == "select_backward":
            sizes = tuple(t.shape[:d % t.ndim]) + (2,) + tuple(t.shape[d % t.ndim:])
            k = b.draw(st.integers(0, 1))

            def fn(L, P):
                if L is sg:
                    from symgrad.ops._ints import u64
                    from symgrad.ops.indexing import _apply
                    return _apply("select_backward", (P[i],), {"input_sizes": sizes,
                                                              "dim": u64(d % t.ndim),
                                                              "index": k})
                return torch.ops.aten.select_backward(P[i], sizes, d % t.ndim, k)
        elif kind == "slice_backward":
            def fn(L, P):
                if L is sg:
                    from symgrad.ops.indexing import _apply
                    return _apply("slice_backward", (P[i],), {"input_sizes": big,
                                                             "dim": d % t.ndim, "start": 1,
                                                             "end": n + 1, "step": 1})
                return torch.ops.aten.slice_backward(P[i], big, d % t.ndim, 1, n + 1, 1)
        else:
            m = t.shape[0]
            idx = np.array(b.draw(st.lists(st.integers(0, m), min_size=m, max_size=m)))
            sizes = (m + 1,) + tuple(t.shape[1:])

            def fn(L, P):
                if L is sg:
                    from symgrad.ops.indexing import _apply
                    return _apply("index_backward", (P[i],), {"indices": (sg.tensor(idx),),
                                                             "input_sizes": sizes})
                return torch.zeros(sizes, dtype=P[i].dtype).index_put(
                    (torch.tensor(idx),), P[i], accumulate=True)
        b.op(kind, fn)
    return gen


def _setitem_op(kind):
    def gen(b):
        i = b.pick(lambda t: t.ndim >= 1, make=lambda: (3, 2))
        t = b.shadow[i]
        if kind == "copy_slices":
            j = b.leaf(b.bshape(tuple(t.shape[1:])))
            idx = b.draw(st.integers(0, t.shape[0] - 1))
        elif kind == "setitem_copy":
            j = b.leaf(b.bshape(tuple(t.shape)))
            idx = Ellipsis
        else:
            j = b.leaf(b.bshape(tuple(t.shape[1:])))
            idx = [b.draw(st.integers(0, t.shape[0] - 1))]

        def fn(L, P):
            x = P[i] * 1
            x[idx] = P[j]
            return x

        b.op(kind, fn)
    return gen


def _list_op(kind):
    def gen(b):
        i = b.pick(lambda t: t.ndim >= 1) if kind == "cat" else b.pick()
        t = b.shadow[i]
        d = b.dim(t, extra=0 if kind == "cat" else 1)
        n = b.draw(st.integers(1, 3))
        others = []
        for _ in range(n - 1):
            shape = list(t.shape)
            if kind == "cat":
                shape[d] = b.draw(st.integers(0, 2))
            others.append(b.leaf(tuple(shape)))
        idxs = [i] + others
        b.op(kind, lambda L, P: getattr(L, kind)([P[k] for k in idxs], d))
    return gen


def _split_op(kind):
    """Pieces of a pool tensor, all of them or some (a piece left out gets no gradient)."""
    def gen(b):
        i = b.pick(lambda t: t.ndim >= 1, make=lambda: (3, 2))
        t = b.shadow[i]
        d = b.dim(t)
        n = t.shape[d]
        if kind in ("split", "unsafe_split"):
            size = b.draw(st.integers(1 if n else 0, max(n, 1) + 1))
            prefix = "unsafe_" if kind == "unsafe_split" else ""
            method = prefix + b.draw(st.sampled_from(["split", "chunk"]))
            arg = size if method.endswith("split") else b.draw(st.integers(1, 4))
        elif kind in ("split_with_sizes", "unsafe_split_with_sizes"):
            cuts = sorted(b.draw(st.lists(st.integers(0, n), max_size=3)))
            arg = [e - s for s, e in zip([0] + cuts, cuts + [n])]
            method = "split" if kind == "split_with_sizes" else kind
        else:
            method, arg = "unbind", None
        count = len(getattr(sg, method)(t, *(() if arg is None else (arg,)), d))
        keep = b.draw(st.lists(st.integers(0, max(count - 1, 0)), min_size=1, max_size=count,
                               unique=True)) if count else []

        def fn(L, P):
            pieces = getattr(L, method)(P[i], *(() if arg is None else (arg,)), d)
            return tuple(pieces[k] for k in keep) if keep else P[i] * 1

        b.op(kind, fn)
    return gen


def _gen_diagonal(b):
    i = b.pick(lambda t: t.ndim >= 2, make=lambda: (3, 3))
    t = b.shadow[i]
    d1 = b.dim(t)
    d2 = b.draw(st.sampled_from([d for d in range(-t.ndim, t.ndim)
                                 if d % t.ndim != d1 % t.ndim]))
    offset = b.draw(st.integers(-2, 2))
    b.op("diagonal", lambda L, P: P[i].diagonal(offset, d1, d2))


def _gen_diagonal_backward(b):
    """aten::diagonal_backward: zeros of (..., n, n + 1) with the pool tensor (..., n) on the
    diagonal of offset 1 (torch records DiagonalBackwardBackward0)."""
    i = b.pick(lambda t: t.ndim >= 1, make=lambda: (3,))
    t = b.shadow[i]
    n, k = t.shape[-1], t.ndim - 1
    sizes = tuple(t.shape[:-1]) + (n, n + 1)

    def fn(L, P):
        if L is sg:
            from symgrad.symbolic.audit import _sg_ops

            return _sg_ops("diagonal_backward", (P[i],), {"input_sizes": sizes, "offset": 1,
                                                          "dim1": k, "dim2": k + 1})
        return torch.ops.aten.diagonal_backward(P[i], sizes, 1, k, k + 1)

    b.op("diagonal_backward", fn)


def _gen_baddbmm(b):
    """beta * input + alpha * (batch1 @ batch2), input broadcast (MultiheadAttention's mask)."""
    i = b.pick(lambda t: t.ndim == 3, make=lambda: (2, 2, 3))
    s = b.shadow[i].shape
    j = b.leaf((s[0], s[2], b.draw(st.integers(1, 3))))
    k = b.leaf(b.bshape((s[0], s[1], b.shadow[j].shape[2])))
    beta, alpha = b.draw(st.sampled_from([1, 0.5, 0])), b.draw(st.sampled_from([1, -2.0]))
    b.op("baddbmm", lambda L, P: L.baddbmm(P[k], P[i], P[j], beta=beta, alpha=alpha))


def _gen_safe_softmax(b):
    """aten::_safe_softmax (scaled_dot_product_attention's), here on finite rows."""
    i = b.pick()
    d = _nonempty_dim(b, b.shadow[i])

    def fn(L, P):
        if L is sg:
            from symgrad.ops._ints import u64
            from symgrad.symbolic.audit import _sg_ops

            return _sg_ops("safe_softmax", (P[i],), {"dim": u64(d)})
        return torch._safe_softmax(P[i], d)

    b.op("safe_softmax", fn)


def _gen_sdpa(b):
    """scaled_dot_product_attention on 4-D (B, H, L, E) inputs, causal or not: where torch
    2.13 records its fused CPU node (a pool tensor torch sends down the math path, e.g. with
    a head dim that is not unit-strided, records the math path in both libraries)."""
    i = b.pick(lambda t: t.ndim == 4, make=lambda: (1, 2, 3, 2))
    s = tuple(b.shadow[i].shape)
    n = b.draw(st.integers(1, 3))
    j, k = b.leaf(s[:2] + (n, s[3])), b.leaf(s[:2] + (n, s[3]))
    causal = b.draw(st.booleans())
    b.op("scaled_dot_product_flash_attention_for_cpu",
         lambda L, P: L.nn.functional.scaled_dot_product_attention(P[i], P[j], P[k],
                                                                   is_causal=causal))


def _gen_where(b):
    i = b.pick()
    j = b.leaf(b.bshape(tuple(b.shadow[i].shape)))
    b.op("where", lambda L, P: L.where(P[i] > 0, P[i], P[j]))


def _gen_clamp_tensor(name):
    def gen(b):
        i = b.pick()
        s = tuple(b.shadow[i].shape)
        lo = b.leaf(b.bshape(s))
        hi = b.leaf(b.bshape(s))
        if name == "clamp_tensor":
            b.op(name, lambda L, P: P[i].clamp(P[lo] - 0.5, P[hi] + 0.5))
        elif name == "clamp_tensor_min":
            b.op(name, lambda L, P: L.clamp(P[i], min=P[lo]))
        else:
            b.op(name, lambda L, P: L.clamp(P[i], max=P[hi]))
    return gen


def _gen_clamp_one_tensor(name):
    def gen(b):
        i = b.pick()
        bound = b.leaf(b.bshape(tuple(b.shadow[i].shape)))
        fn = "clamp_min" if name == "clamp_min_tensor" else "clamp_max"
        b.op(name, lambda L, P: getattr(L, fn)(P[i], P[bound]))
    return gen


def _gen_inplace_compare(name):
    """``(x * 1).gt_(...)``: 0/1 written into a tensor that requires grad (GtBackward0/1)."""
    def gen(b):
        i = b.pick()
        method = name.split("_")[0] + "_"
        if name.endswith("_tensor_"):
            j = b.leaf(b.bshape(tuple(b.shadow[i].shape)))
            b.op(name, lambda L, P: getattr(P[i] * 1, method)(P[j]))
        else:
            b.op(name, lambda L, P: getattr(P[i] * 1, method)(0.25))
    return gen


def _gen_addcmul(b):
    i = b.pick()
    s = tuple(b.shadow[i].shape)
    j, k = b.leaf(b.bshape(s)), b.leaf(b.bshape(s))
    b.op("addcmul", lambda L, P: L.addcmul(P[i], P[j], P[k], value=0.5))


GENERATORS = {
    "neg": _unary("neg", "neg"), "exp": _unary("exp", "exp", squash=True),
    "log": _unary("log", "log", positive=True), "sin": _unary("sin", "sin"),
    "cos": _unary("cos", "cos"), "tanh": _unary("tanh", "tanh"),
    "sigmoid": _unary("sigmoid", "sigmoid"), "sqrt": _unary("sqrt", "sqrt", positive=True),
    "relu": _unary("relu", "relu"), "abs": _unary("abs", "abs"), "sign": _unary("sign", "sign"),
    "reciprocal": _unary("reciprocal", "reciprocal", positive=True),
    "clone": _unary("clone", "clone"),
    "log1p": _unary("log1p", "log1p"), "log2": _unary("log2", "log2", positive=True),
    "log10": _unary("log10", "log10", positive=True),
    "expm1": _unary("expm1", "expm1", squash=True),
    "erf": _unary("erf", "erf"),
    "silu": _simple("silu", lambda b, t: lambda L, x: L.nn.functional.silu(x)),
    "softplus": _simple("softplus", lambda b, t: (lambda beta, threshold: lambda L, x: (
        L.nn.functional.softplus(x, beta=beta, threshold=threshold)))(
        b.draw(st.sampled_from([1, 0.5, 2.0])), b.draw(st.sampled_from([20, 1.0, 0.0])))),
    "atan2": _binary("atan2", lambda L, x, y: L.atan2(x, y)),
    "gelu": _simple("gelu", lambda b, t: lambda L, x: L.nn.functional.gelu(x)),
    "gelu_tanh": _simple("gelu_tanh", lambda b, t: lambda L, x: L.nn.functional.gelu(
        x, approximate="tanh")),
    "leaky_relu": _simple("leaky_relu", lambda b, t: (lambda s: lambda L, x: (
        L.nn.functional.leaky_relu(x, s)))(b.draw(st.sampled_from([0.01, 0.2, -0.5])))),
    "elu": _simple("elu", lambda b, t: (lambda a: lambda L, x: L.nn.functional.elu(x, a))(
        b.draw(st.sampled_from([1.0, 0.5])))),
    "logsigmoid": _simple("logsigmoid", lambda b, t: lambda L, x: L.nn.functional.logsigmoid(x)),
    "hardtanh": _simple("hardtanh", lambda b, t: (lambda lo, hi: lambda L, x: (
        L.nn.functional.hardtanh(x, lo, hi)))(b.draw(st.sampled_from([-1.0, -0.3])),
                                              b.draw(st.sampled_from([1.0, 0.4])))),
    "hypot": _binary("hypot", lambda L, x, y: L.hypot(x, y)),
    "add": _binary("add", lambda L, x, y: L.add(x, y, alpha=1.5)),
    "sub": _binary("sub", lambda L, x, y: x - y),
    "mul": _binary("mul", lambda L, x, y: x * y),
    "div": _binary("div", lambda L, x, y: x / y, positive_other=True),
    "pow_tensor": _binary("pow_tensor", lambda L, x, y: _pos(L, x) ** y),
    "maximum": _binary("maximum", lambda L, x, y: L.maximum(x, y)),
    "minimum": _binary("minimum", lambda L, x, y: L.minimum(x, y)),
    "rsub": _simple("rsub", lambda b, t: lambda L, x: 2 - x),
    "pow": _simple("pow", lambda b, t: (lambda e: lambda L, x: x ** e)(
        b.draw(st.sampled_from([0, 1, 2, 3, -1.0, 0.5])))),
    "pow_scalar_base": _simple("pow_scalar_base", lambda b, t: lambda L, x: 2 ** x.tanh()),
    "clamp": _simple("clamp", lambda b, t: lambda L, x: x.clamp(-0.5, 0.7)),
    "clamp_min": _simple("clamp_min", lambda b, t: lambda L, x: x.clamp_min(0.1)),
    "clamp_max": _simple("clamp_max", lambda b, t: lambda L, x: x.clamp_max(-0.1)),
    "clamp_tensor": _gen_clamp_tensor("clamp_tensor"),
    "clamp_tensor_min": _gen_clamp_tensor("clamp_tensor_min"),
    "clamp_tensor_max": _gen_clamp_tensor("clamp_tensor_max"),
    "where": _gen_where, "addcmul": _gen_addcmul,
    "smooth_l1_loss": _loss("smooth_l1_loss", lambda b: (lambda beta: lambda L, x: (
        L.nn.functional.smooth_l1_loss(x, x.tanh(), beta=beta)))(
        b.draw(st.sampled_from([0.5, 1.0])))),
    "huber_loss": _loss("huber_loss", lambda b: (lambda delta: lambda L, x: (
        L.nn.functional.huber_loss(x, x.tanh(), delta=delta)))(
        b.draw(st.sampled_from([0.3, 1.0])))),
    "xlogy": _loss("xlogy", lambda b: lambda L, x: L.nn.functional.kl_div(
        x.log_softmax(-1), x.softmax(-1), reduction="sum") if x.ndim else x * 1),
    **{k: _gen_cross_entropy(k) for k in ("masked_fill", "mul_scalar", "div_scalar")},
    "clamp_min_tensor": _gen_clamp_one_tensor("clamp_min_tensor"),
    "clamp_max_tensor": _gen_clamp_one_tensor("clamp_max_tensor"),
    **{f"{c}{k}": _gen_inplace_compare(f"{c}{k}") for c in ("gt", "ge", "lt", "le", "eq", "ne")
       for k in ("_", "_tensor_")},
    "sum": _simple("sum", lambda b, t: lambda L, x: x.sum()),
    "sum_dim": _simple("sum_dim", lambda b, t: (lambda d, k: lambda L, x: x.sum(d, keepdim=k))(
        _reduce_dims(b, t), b.draw(st.booleans()))),
    "mean": _simple("mean", lambda b, t: lambda L, x: x.mean()),
    "mean_dim": _simple("mean_dim", lambda b, t: (lambda d, k: lambda L, x: x.mean(
        d, keepdim=k))(_reduce_dims(b, t), b.draw(st.booleans()))),
    "max": _simple("max", lambda b, t: lambda L, x: x.max()),
    "min": _simple("min", lambda b, t: lambda L, x: L.min(x)),
    "max_dim": _simple("max_dim", lambda b, t: (lambda d, k: lambda L, x: x.max(
        d, keepdim=k).values)(_nonempty_dim(b, t), b.draw(st.booleans()))),
    "min_dim": _simple("min_dim", lambda b, t: (lambda d, k: lambda L, x: x.min(
        d, keepdim=k)[0])(_nonempty_dim(b, t), b.draw(st.booleans()))),
    "logsumexp": _simple("logsumexp", lambda b, t: (lambda d, k: lambda L, x: x.logsumexp(
        d, keepdim=k))(_reduce_dims(b, t), b.draw(st.booleans()))),
    "softmax": _simple("softmax", lambda b, t: (lambda d: lambda L, x: x.softmax(d))(
        _nonempty_dim(b, t))),
    "log_softmax": _simple("log_softmax", lambda b, t: (lambda d: lambda L, x: x.log_softmax(
        d))(_nonempty_dim(b, t))),
    "view": _gen_reshape("view"), "reshape_alias": _gen_reshape("alias"),
    "unsafe_view": _gen_reshape("unsafe"),
    "t": _simple("t", lambda b, t: (lambda L, x: x.t()) if t.ndim <= 2 else
                 (lambda L, x: x[0].t())),
    "transpose": _simple("transpose", lambda b, t: (lambda d0, d1: lambda L, x: x.transpose(
        d0, d1))(b.dim(t), b.dim(t))),
    "permute": _simple("permute", lambda b, t: (lambda p: lambda L, x: x.permute(p))(
        [d - t.ndim if b.draw(st.booleans()) else d
         for d in b.draw(st.permutations(range(t.ndim)))])),
    "expand": _simple("expand", lambda b, t: (lambda s: lambda L, x: x.expand(*s))(
        (2,) + tuple(b.draw(st.sampled_from([-1, n])) if n != 1 else b.draw(
            st.integers(1, 2)) for n in t.shape))),
    "unsqueeze": _simple("unsqueeze", lambda b, t: (lambda d: lambda L, x: x.unsqueeze(d))(
        b.dim(t, extra=1))),
    "squeeze": _simple("squeeze", lambda b, t: (lambda d: lambda L, x: x.unsqueeze(d).squeeze(
        d))(b.dim(t, extra=1))),
    "squeeze_all": _simple("squeeze_all", lambda b, t: lambda L, x: x.unsqueeze(0).squeeze()),
    "squeeze_dims": _simple("squeeze_dims", lambda b, t: lambda L, x: x.unsqueeze(
        0).unsqueeze(-1).squeeze((0, -1))),
    "alias": _simple("alias", lambda b, t: lambda L, x: x[...]),
    "to_copy": _simple("to_copy", lambda b, t: lambda L, x: x.float().double()),
    "mm": _gen_mm, "mv": _gen_mv, "dot": _gen_dot, "squeeze_": _gen_vecmat, "bmm": _gen_bmm,
    "index": _gen_index, "select": _gen_select, "slice": _gen_slice,
    "select_backward": _backward_op("select_backward"),
    "slice_backward": _backward_op("slice_backward"),
    "index_backward": _backward_op("index_backward"),
    "copy_slices": _setitem_op("copy_slices"), "setitem_copy": _setitem_op("setitem_copy"),
    "index_put": _setitem_op("index_put"), "cat": _list_op("cat"), "stack": _list_op("stack"),
    "split": _split_op("split"), "split_with_sizes": _split_op("split_with_sizes"),
    "unbind": _split_op("unbind"), "unsafe_split": _split_op("unsafe_split"),
    "unsafe_split_with_sizes": _split_op("unsafe_split_with_sizes"),
    "diagonal": _gen_diagonal, "diagonal_backward": _gen_diagonal_backward,
    "baddbmm": _gen_baddbmm, "safe_softmax": _gen_safe_softmax,
    "scaled_dot_product_flash_attention_for_cpu": _gen_sdpa,
    "masked_fill_tensor": _simple("masked_fill_tensor", lambda b, t: (
        lambda grad_value: lambda L, x: x.masked_fill(x > 0.1, (x * 2).sum() if grad_value
                                                      else L.tensor(0.5, dtype=x.dtype)))(
        b.draw(st.booleans()))),
}
EXTRA = [_gen_matmul_batched]  # batched @ in all its torch dispatch forms


def test_every_differentiable_op_is_drawable():
    differentiable = {n for n, s in OPS.items() if s.differentiable
                      and not n.startswith(("cat[", "stack["))}
    missing = differentiable - set(GENERATORS) - NOT_DRAWN_HERE
    assert not missing, f"ops without a random-program generator: {sorted(missing)}"
    assert not (set(GENERATORS) - set(OPS)), "generators for unknown ops"


def _run(lib, steps, create_graph=False):
    pool, leaves = [], []
    for step in steps:
        if step[0] == "leaf":
            x = lib.tensor(step[1], requires_grad=True)
            leaves.append(x)
            pool.append(x)
        else:
            value = step[2](lib, pool)
            pool.extend(value if isinstance(value, tuple) else (value,))
    rng = np.random.default_rng(5)
    loss = None
    for t in pool:
        if t.requires_grad and t.dtype in (lib.float32, lib.float64):
            term = (t * lib.tensor(rng.uniform(-1, 1, tuple(t.shape)), dtype=t.dtype)).sum()
            loss = term if loss is None else loss + term
    grads = lib.autograd.grad(loss, leaves, allow_unused=True)
    outs = [np.asarray(t.detach().numpy()) for t in pool]
    return outs, [None if g is None else np.asarray(g.detach().numpy()) for g in grads]


def _check(steps):
    ours, g_ours = _run(sg, steps)
    theirs, g_theirs = _run(torch, steps)
    # The bound (tests/_tolerance.py): no op reduces over more elements than its inputs
    # hold, so the pool's element count bounds the roundings of any value along the
    # program, and the weighted-sum loss and the backward run that chain again. The terms
    # are products of pool values and weights in [-1, 1] and may cancel: the pool's
    # magnitude joins each result's in the scale. A program that rounds through float32
    # (to_copy: x.float().double()) is a float32 computation.
    n = sum(max(a.size, 1) for a in theirs)
    values, grads = n + len(steps), 2 * (n + len(steps))
    pool = magnitude(*theirs)
    f32 = any(s[0] == "op" and s[1] == "to_copy" for s in steps) or \
        any(a.dtype == np.float32 for a in theirs)
    dtype = np.float32 if f32 else None
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert_close(a, b, terms=values, scale=max(magnitude(b), pool), dtype=dtype)
    for k, (a, b) in enumerate(zip(g_ours, g_theirs)):
        if a is None or b is None:
            for g in (a, b):
                assert g is None or not np.any(g), f"leaf {k}"
            continue
        assert_close(a, b, terms=grads, scale=max(magnitude(b), pool), dtype=dtype,
                     msg=f"leaf {k}")


NAMES = sorted(GENERATORS)


@settings(derandomize=True, max_examples=int(os.environ.get("SYMGRAD_RANDOM_PROGRAMS", 200)),
          deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_random_programs_match_torch(data):
    b = Builder(data)
    for _ in range(data.draw(st.integers(1, 3))):
        b.leaf(b.shape())
    for _ in range(data.draw(st.integers(1, 6))):
        if data.draw(st.integers(0, 9)) == 0:
            data.draw(st.sampled_from(EXTRA))(b)
        else:
            GENERATORS[data.draw(st.sampled_from(NAMES))](b)
    _check(b.steps)


@pytest.mark.parametrize("name", NAMES)
def test_each_generator_alone_matches_torch(name):
    """Every op at least once, whatever the random draws cover (fixed seed per op)."""
    @settings(derandomize=True, max_examples=3, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def run(data):
        b = Builder(data)
        b.leaf(b.shape())
        GENERATORS[name](b)
        assert any(s[0] == "op" and s[1] == name for s in b.steps)
        _check(b.steps)

    run()


# -- convolution and pooling (issue 21)
def _gen_convolution(b):
    """conv1d on a batched (N, C, L) pool tensor, or conv2d on an unbatched (C, H, W) one."""
    i = b.pick(lambda t: t.ndim == 3 and 0 not in t.shape, make=lambda: (2, 2, 3))
    t = b.shadow[i]
    two_d = b.draw(st.booleans())
    c = t.shape[0] if two_d else t.shape[1]
    spatial = tuple(t.shape[1:]) if two_d else (t.shape[2],)
    groups = b.draw(st.sampled_from([g for g in (1, 2, 3) if c % g == 0]))
    stride, dilation = b.draw(st.integers(1, 2)), b.draw(st.integers(1, 2))
    padding = b.draw(st.integers(0, 1))
    k = b.draw(st.integers(1, 2))
    if any(s + 2 * padding < dilation * (k - 1) + 1 for s in spatial):
        k = 1
    w = b.leaf((groups * b.draw(st.integers(1, 2)), c // groups) + (k,) * len(spatial))
    bias = b.leaf((b.shadow[w].shape[0],)) if b.draw(st.booleans()) else None

    def fn(L, P):
        conv = L.nn.functional.conv2d if two_d else L.nn.functional.conv1d
        return conv(P[i], P[w], None if bias is None else P[bias], stride, padding, dilation,
                    groups)

    b.op("convolution", fn)


def _gen_same_pad(b):
    """padding='same' with an even kernel pads the input first (ConstantPadNdBackward0)."""
    i = b.pick(lambda t: t.ndim == 3 and 0 not in t.shape, make=lambda: (2, 2, 3))
    w = b.leaf((2, b.shadow[i].shape[1], 2))

    def fn(L, P):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch: "may require a padded copy"
            return L.nn.functional.conv1d(P[i], P[w], padding="same")

    b.op("constant_pad_nd", fn)


def _gen_pool(name):
    """Pooling of an unbatched (C, H, W) pool tensor, window at most 2 (pads <= half)."""
    def gen(b):
        i = b.pick(lambda t: t.ndim == 3 and 0 not in t.shape, make=lambda: (2, 3, 3))
        h, w = b.shadow[i].shape[1:]
        k = b.draw(st.integers(1, min(2, h, w)))
        stride, pad = b.draw(st.integers(1, 2)), b.draw(st.integers(0, k // 2))
        ceil = b.draw(st.booleans())
        if name == "max_pool2d_with_indices":
            b.op(name, lambda L, P: L.nn.functional.max_pool2d(P[i], k, stride, pad,
                                                               ceil_mode=ceil))
        elif name == "avg_pool2d":
            include = b.draw(st.booleans())
            b.op(name, lambda L, P: L.nn.functional.avg_pool2d(
                P[i], k, stride, pad, ceil_mode=ceil, count_include_pad=include))
        else:
            size = (b.draw(st.integers(1, h)), b.draw(st.integers(1, w)))
            b.op(name, lambda L, P: L.nn.functional.adaptive_avg_pool2d(P[i], size))
    return gen


# -- tensor functions and normalisation (issue 21)
# Index tensors are drawn to fit the pool tensor's shape. Ops whose gradient routes by
# order (sort, topk, the inf-norm) or divides by a value that a pool tensor may hold
# exactly (std by 0 spread, cumprod by 0) read a fresh leaf: uniform draws have no ties
# and no zeros, so the torch comparison is not about which of two equal elements wins.
def _ints(b, high, shape):
    return np.asarray([b.draw(st.integers(0, high - 1)) for _ in range(int(np.prod(shape)))],
                      dtype=np.int64).reshape(shape)


def _pick_nonempty(b, min_ndim=1):
    return b.pick(lambda t: t.ndim >= min_ndim and 0 not in t.shape,
                  make=lambda: (2, 3) if min_ndim <= 2 else (2, 2, 3))


def _fresh(b, min_ndim=1):
    rank = b.draw(st.integers(min_ndim, 3))
    return b.leaf(tuple(b.draw(st.integers(1, 3)) for _ in range(rank)))


def _gen_gather(b):
    i = _pick_nonempty(b)
    t = b.shadow[i]
    d = b.dim(t)
    shape = tuple(b.draw(st.integers(1, s)) for s in t.shape)
    idx = _ints(b, t.shape[d], shape)
    b.op("gather", lambda L, P: P[i].gather(d, L.tensor(idx)))


def _perm_index(b, shape, d):
    """A scatter index with no repeats along ``d`` (torch leaves the winner unspecified)."""
    rng = np.random.default_rng(b.draw(st.integers(0, 1000)))
    base = np.argsort(rng.uniform(size=shape), axis=d)
    return np.ascontiguousarray(base.astype(np.int64))


def _gen_scatter(name):
    def gen(b):
        i = _pick_nonempty(b)
        t = b.shadow[i]
        d = b.dim(t)
        if name == "scatter":
            idx = _perm_index(b, tuple(t.shape), d % t.ndim)
            j = b.leaf(tuple(t.shape))
            b.op(name, lambda L, P: P[i].scatter(d, L.tensor(idx), P[j]))
            return
        shape = tuple(b.draw(st.integers(1, s)) for s in t.shape)
        idx = _ints(b, t.shape[d], shape)
        if name == "scatter_value":
            v = b.draw(st.sampled_from([0.5, -2.0]))
            b.op(name, lambda L, P: P[i].scatter(d, L.tensor(idx), v))
        else:
            j = b.leaf(shape)
            b.op(name, lambda L, P: P[i].scatter_add(d, L.tensor(idx), P[j]))
    return gen


def _gen_index_select(b):
    i = _pick_nonempty(b)
    t = b.shadow[i]
    d = b.dim(t)
    idx = _ints(b, t.shape[d], (b.draw(st.integers(1, 4)),))
    b.op("index_select", lambda L, P: P[i].index_select(d, L.tensor(idx)))


def _gen_index_add(b):
    i = _pick_nonempty(b)
    t = b.shadow[i]
    d = b.dim(t)
    n = b.draw(st.integers(1, 4))
    idx = _ints(b, t.shape[d], (n,))
    shape = list(t.shape)
    shape[d] = n
    j = b.leaf(tuple(shape))
    alpha = b.draw(st.sampled_from([1, 0.5]))
    b.op("index_add", lambda L, P: P[i].index_add(d, L.tensor(idx), P[j], alpha=alpha))


def _gen_scan(name):
    def gen(b):
        i = _fresh(b) if name == "cumprod" else _pick_nonempty(b)
        d = b.dim(b.shadow[i])
        b.op(name, lambda L, P: getattr(P[i], name)(d))
    return gen


def _gen_prod(name):
    """prod / prod(dim): on a fresh leaf, half the time with one element zeroed (torch's
    zero-safe backward) and then sometimes a second (every exclusive product is zero)."""
    def gen(b):
        i = _fresh(b)
        t = b.shadow[i]
        zeros = b.draw(st.sampled_from([0, 0, 1, 2]))
        mask = np.ones(t.shape)
        for _ in range(zeros):
            mask.flat[b.draw(st.integers(0, mask.size - 1))] = 0.0
        d = b.dim(t)
        keep = b.draw(st.booleans())

        def fn(L, P):
            x = P[i] * L.tensor(mask, dtype=P[i].dtype) if zeros else P[i]
            return x.prod() if name == "prod" else x.prod(d, keepdim=keep)

        b.op(name, fn)
    return gen


def _gen_var_std(name):
    def gen(b):
        i = _fresh(b) if name == "std" else _pick_nonempty(b)
        t = b.shadow[i]
        d = b.dim(t)
        correction = b.draw(st.sampled_from([0, 1])) if t.shape[d] > 1 else 0
        keep = b.draw(st.booleans())
        b.op(name, lambda L, P: getattr(P[i], name)(d, correction=correction, keepdim=keep))
    return gen


def _gen_vector_norm(b):
    i = _fresh(b)
    t = b.shadow[i]
    order = b.draw(st.sampled_from([2, 1, 3, float("inf")]))
    d = b.draw(st.sampled_from([None, b.dim(t)]))
    b.op("linalg_vector_norm", lambda L, P: L.linalg.vector_norm(P[i], order, dim=d))


def _gen_layer_norm(b):
    i = _pick_nonempty(b)
    t = b.shadow[i]
    k = b.draw(st.integers(1, t.ndim))
    shape = tuple(t.shape[-k:])
    w = b.leaf(shape) if b.draw(st.booleans()) else None
    bias = b.leaf(shape) if b.draw(st.booleans()) else None
    b.op("native_layer_norm", lambda L, P: L.nn.functional.layer_norm(
        P[i], shape, None if w is None else P[w], None if bias is None else P[bias]))


def _gen_batch_norm(b):
    i = b.pick(lambda t: t.ndim >= 2 and 0 not in t.shape and t.numel() > t.shape[1],
               make=lambda: (3, 2))
    c = b.shadow[i].shape[1]
    w = b.leaf((c,)) if b.draw(st.booleans()) else None
    bias = b.leaf((c,)) if b.draw(st.booleans()) else None
    b.op("native_batch_norm", lambda L, P: L.nn.functional.batch_norm(
        P[i], None, None, None if w is None else P[w], None if bias is None else P[bias],
        training=True))


def _gen_embedding(b):
    i = b.pick(lambda t: t.ndim == 2 and 0 not in t.shape, make=lambda: (4, 3))
    n = b.shadow[i].shape[0]
    idx = _ints(b, n, (b.draw(st.integers(1, 3)), b.draw(st.integers(1, 3))))
    b.op("embedding", lambda L, P: L.nn.functional.embedding(L.tensor(idx), P[i]))


def _gen_sort(b):
    i = _fresh(b)
    d = b.dim(b.shadow[i])
    desc = b.draw(st.booleans())
    b.op("sort", lambda L, P: P[i].sort(d, descending=desc)[0])


def _gen_topk(b):
    i = _fresh(b)
    t = b.shadow[i]
    d = b.dim(t)
    k = b.draw(st.integers(1, t.shape[d]))
    largest = b.draw(st.booleans())
    b.op("topk", lambda L, P: P[i].topk(k, d, largest=largest)[0])


def _gen_triangle(name):
    def gen(b):
        i = b.pick(lambda t: t.ndim >= 2, make=lambda: (3, 3))
        k = b.draw(st.integers(-1, 1))
        b.op(name, lambda L, P: getattr(P[i], name)(k))
    return gen


def _gen_flip(b):
    i = _pick_nonempty(b)
    t = b.shadow[i]
    dims = sorted({d % t.ndim for d in [b.dim(t) for _ in range(b.draw(st.integers(1, 2)))]})
    b.op("flip", lambda L, P: P[i].flip(dims))


def _gen_roll(b):
    i = _pick_nonempty(b)
    t = b.shadow[i]
    d = b.draw(st.sampled_from([None, b.dim(t)]))
    shift = b.draw(st.integers(-3, 3))
    b.op("roll", lambda L, P: P[i].roll(shift, d))


def _gen_repeat(b):
    i = b.pick()
    t = b.shadow[i]
    reps = tuple(b.draw(st.integers(1, 2)) for _ in range(t.ndim + b.draw(st.integers(0, 1))))
    b.op("repeat", lambda L, P: P[i].repeat(*reps) if reps else P[i].repeat(()))


GENERATORS.update({
    "gather": _gen_gather, "index_select": _gen_index_select, "index_add": _gen_index_add,
    **{n: _gen_scatter(n) for n in ("scatter", "scatter_value", "scatter_add")},
    "cumsum": _gen_scan("cumsum"), "cumprod": _gen_scan("cumprod"),
    "prod": _gen_prod("prod"), "prod_dim": _gen_prod("prod_dim"),
    "var": _gen_var_std("var"), "std": _gen_var_std("std"),
    "linalg_vector_norm": _gen_vector_norm, "native_layer_norm": _gen_layer_norm,
    "native_batch_norm": _gen_batch_norm, "embedding": _gen_embedding,
    "sort": _gen_sort, "topk": _gen_topk, "tril": _gen_triangle("tril"),
    "triu": _gen_triangle("triu"), "flip": _gen_flip, "roll": _gen_roll,
    "repeat": _gen_repeat,
})
TENSOR_FUNCTION_OPS = ["gather", "index_select", "index_add", "scatter", "scatter_value",
                       "scatter_add", "cumsum", "cumprod", "prod", "prod_dim", "var", "std",
                       "linalg_vector_norm",
                       "native_layer_norm", "native_batch_norm", "embedding", "sort", "topk",
                       "tril", "triu", "flip", "roll", "repeat"]


@pytest.mark.parametrize("name", TENSOR_FUNCTION_OPS)
def test_each_tensor_function_generator_alone_matches_torch(name):
    test_each_generator_alone_matches_torch(name)


GENERATORS.update({
    "convolution": _gen_convolution, "constant_pad_nd": _gen_same_pad,
    **{n: _gen_pool(n) for n in ("max_pool2d_with_indices", "avg_pool2d",
                                 "adaptive_avg_pool2d")},
})
NAMES = sorted(GENERATORS)


@pytest.mark.parametrize("name", ["convolution", "constant_pad_nd", "max_pool2d_with_indices",
                                  "avg_pool2d", "adaptive_avg_pool2d"])
def test_each_conv_pool_generator_alone_matches_torch(name):
    """The generators above, each alone (the parametrized list above predates them)."""
    test_each_generator_alone_matches_torch(name)
