"""The fused CPU attention backward gives dq, dk, dv torch's strides, with unchanged bits.

torch 2.13's ScaledDotProductFlashAttentionForCpuBackward0 allocates its gradients as
(B, L, H, E) memory seen as (B, H, L, E), whatever its inputs' strides (checked here
against torch, through hooks: what a user observes). A GPT's heads are transposed views of
a split, so with that layout the view backward needs no copy and the split backward copies
whole rows (runtime.cat_into's one concatenate in a compiled step). The products go
straight into that layout; the bits must be those of the contiguous products before.
"""

from __future__ import annotations

import copy
import importlib

import numpy as np
import pytest
from _tolerance import assert_close, magnitude, tolerance

import symgrad as sg
from symgrad.backends import attention_numpy as ref
from symgrad.backends.cpu import backend as cpu
from symgrad.backends.cpu.backend import CpuBackend

B, T, H, E = 2, 5, 3, 4
C = H * E
LAYOUTS = ["gpt-split", "contiguous", "gqa", "masked", "permuted"]


def _inputs(L, layout: str, arrays: dict):
    """(leaves, q, k, v, sdpa keywords) of library ``L`` from the same NumPy arrays."""
    leaf = {n: L.tensor(a, requires_grad=n != "mask") for n, a in arrays.items()}

    def heads(t, h):  # (B, T, h*E) -> (B, h, T, E), as nanoGPT's CausalSelfAttention
        return t.view(B, T, h, E).transpose(1, 2)

    kw = {"is_causal": True}
    if layout == "contiguous":
        q, k, v = leaf["q"], leaf["k"], leaf["v"]
    elif layout == "permuted":  # (T, B, H, E) memory
        q, k, v = (leaf[n].permute(1, 2, 0, 3) for n in "qkv")
    elif layout == "gqa":  # one key/value head for the query's three
        q = heads(leaf["q"], H)
        k, v = (heads(t, 1) for t in leaf["kv"].split(E, dim=2))
        kw["enable_gqa"] = True
    else:
        q, k, v = (heads(t, H) for t in leaf["qkv"].split(C, dim=2))
        if layout == "masked":
            kw = {"attn_mask": leaf["mask"]}
    return leaf, q, k, v, kw


def _arrays(layout: str, rng) -> dict:
    shapes = {"contiguous": {n: (B, H, T, E) for n in "qkv"},
              "permuted": {n: (T, B, H, E) for n in "qkv"},
              "gqa": {"q": (B, T, C), "kv": (B, T, 2 * E)}}.get(layout, {"qkv": (B, T, 3 * C)})
    if layout == "masked":
        shapes["mask"] = (T, T)
    return {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


@pytest.mark.parametrize("layout,dtype", [(x, "float32") for x in LAYOUTS] + [
    ("gpt-split", "float16"), ("contiguous", "bfloat16"), ("masked", "float16")])
def test_gradient_strides_are_torch_s(torch, layout, dtype):
    """What hooks on q, k, v see: torch's strides ((B, L, H, E) memory order for every
    input layout and dtype: half gradients are rounded in the float32 kernel's layout)
    and its values, through the fused node in both libraries."""
    arrays = _arrays(layout, np.random.default_rng(3))
    w = np.random.default_rng(4).standard_normal((B, H, T, E)).astype(np.float32)
    seen = {}
    for L in (torch, sg):
        leaf, q, k, v, kw = _inputs(L, layout, arrays)
        if dtype != "float32":
            q, k, v = (t.to(getattr(L, dtype)) for t in (q, k, v))
            if "attn_mask" in kw:
                kw["attn_mask"] = kw["attn_mask"].to(getattr(L, dtype))
        got = seen[L.__name__] = {}
        for n, t in zip("qkv", (q, k, v)):
            t.register_hook(lambda g, n=n, got=got: got.__setitem__(n, (g.stride(), g)))
        y = L.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
        assert type(y.grad_fn).__name__ == "ScaledDotProductFlashAttentionForCpuBackward0"
        (y.float() * L.tensor(w)).sum().backward()
    hk = 1 if layout == "gqa" else H
    want = {"q": (T * C, E, C, 1), "k": (T * hk * E, E, hk * E, 1)}
    want["v"] = want["k"]
    terms = 3 * (E + T + 8) + E  # as test_attention_kernels: dots of E, softmax and sums of T
    for n in "qkv":
        (t_stride, t_grad), (s_stride, s_grad) = seen["torch"][n], seen["symgrad"][n]
        assert t_stride == want[n]  # torch's layout, whatever the inputs'
        assert s_stride == t_stride, (n, s_stride, t_stride)
        expected, got = t_grad.float().numpy(), s_grad.float().numpy()
        bound = tolerance(expected, terms=terms, dtype=np.float32,
                          scale=magnitude(expected, *arrays.values(), w))
        if dtype != "float32":  # torch's kernel rounds its intermediates (P, dS) to the
            # half type before its matmuls: a half-precision rounding per term
            bound *= torch.finfo(getattr(torch, dtype)).eps / np.finfo(np.float32).eps
        assert (np.abs(got - expected) <= bound).all(), (n, np.abs(got - expected).max())


def _previous(a, b, heads, out=None):
    """The path before: contiguous products, grouped heads summed (``out`` ignored)."""
    return ref._unheads(np.matmul(a, b), heads)


# (B, H, Hk, L, S, E, Ev), causal, mask shape, strided (a GPT's transposed split), dtype
BIT_CASES = [
    ((8, 4, 4, 32, 32, 16, 16), True, None, True, "float32"),  # the GPT benchmark's shape
    ((2, 3, 3, 7, 7, 5, 5), False, (7, 7), False, "float64"),
    ((2, 4, 2, 9, 11, 6, 6), False, (2, 4, 9, 11), True, "float32"),  # grouped-query
    ((2, 8, 1, 6, 4, 3, 3), True, None, True, "float64"),  # 8 query heads per key head
    ((1, 2, 2, 5, 6, 3, 7), True, None, False, "float32"),  # Ev != E
]


@pytest.mark.parametrize("path", ["kernels", "numpy"])
@pytest.mark.parametrize("case", BIT_CASES, ids=[str(i) for i in range(len(BIT_CASES))])
def test_same_bits_as_the_contiguous_products(monkeypatch, path, case):
    (b, h, hk, n, s, e, ev), causal, mshape, strided, dtype = case
    rng = np.random.default_rng(9)

    def make(heads, length, width):
        if strided:  # (B, T, H, E) memory seen as (B, H, T, E)
            return rng.standard_normal((b, length, heads, width)).astype(dtype).swapaxes(1, 2)
        return rng.standard_normal((b, heads, length, width)).astype(dtype)

    q, k, v = make(h, n, e), make(hk, s, e), make(hk, s, ev)
    mask = None if mshape is None else rng.standard_normal(mshape).astype(dtype)
    fwd, bwd = (CpuBackend.flash_attention, CpuBackend.flash_attention_backward) \
        if path == "kernels" else (ref.flash_attention, ref.flash_attention_backward)
    out, lse = fwd(q, k, v, mask, causal, None)
    g = make(h, n, ev)
    args = (mask, 0.0, causal, k, lse, out, q, None, v)
    new = bwd(g, (True,) * 3, *args)
    monkeypatch.setattr(cpu, "_attn_grad", _previous)
    monkeypatch.setattr(ref, "_grad_into", _previous)
    old = bwd(g, (True,) * 3, *args)
    for a, was, x in zip(new, old, (q, k, v)):
        assert a.shape == was.shape == x.shape and a.dtype == was.dtype
        assert was.flags.c_contiguous  # the layout before
        assert a.swapaxes(1, 2).flags.c_contiguous  # torch's
        np.testing.assert_array_equal(a, was)


def test_cat_into_one_concatenate_for_contiguous_pieces():
    """runtime.cat_into with every piece C-contiguous (reshaped as views, then one
    concatenate) equals the concatenate of the reshaped pieces, into a strided out too."""
    from symgrad.compile.runtime import cat_into

    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4, 2, 2))  # (3, 4, 4) through a view
    b = rng.standard_normal((3, 4, 1))
    c = rng.standard_normal((3, 8))  # -> (3, 4, 2)
    parts = ((a, (3, 4, 4)), (b, (3, 4, 1)), (c, (3, 4, 2)))
    want = np.concatenate([x.reshape(shape) for x, shape in parts], axis=2)
    out = np.full((3, 4, 7), np.nan)
    assert cat_into(out, 2, parts) is out
    np.testing.assert_array_equal(out, want)
    wide = np.full((4, 3, 7), np.nan).transpose(1, 0, 2)
    np.testing.assert_array_equal(cat_into(wide, 2, parts), want)


def _gpt_step(model):
    def step(x, y):
        for p in model.parameters():
            p.grad = None
        loss = model(x, y)
        loss.backward()
        return loss
    return step


def test_compiled_gpt_step_joins_packed_pieces_without_a_copy_with_the_same_bits(
        monkeypatch):
    """A small nanoGPT-shaped step compiled: the attention backward writes dq, dk, dv
    into one (B, L, 3, H, E) array (packed_grads), so the split backward's cat_into takes
    that array as the concatenation instead of copying into its buffer; compiled and eager
    gradients have the bits of the contiguous products' path."""
    from _nanogpt import gpt

    from symgrad.backends.attention_numpy import PACKED

    runtime = importlib.import_module("symgrad.compile.runtime")  # sg.compile: a function

    pieces, joined = [], []
    cat_into = runtime.cat_into

    def recording(out, axis, parts):
        pieces.extend(a for a, _ in parts)
        got = cat_into(out, axis, parts)
        joined.append(got is not out)
        return got

    monkeypatch.setattr(runtime, "cat_into", recording)
    sg.manual_seed(0)
    model = gpt(sg, vocab=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    x, y = sg.randint(0, 11, (2, 8)), sg.randint(0, 11, (2, 8))
    grads = {}
    for layout in ("torch's", "previous"):
        if layout == "previous":
            monkeypatch.setattr(cpu, "_attn_grad", _previous)
        for mode in ("compiled", "eager"):
            m = copy.deepcopy(model)
            step = _gpt_step(m)
            if mode == "compiled":
                step = sg.compile(step)
            step(x, y)
            if mode == "compiled":
                assert step.stats["fallbacks"] == []
            grads[layout, mode] = [p.grad.numpy().copy() for p in m.parameters()]
        if layout == "torch's":
            assert len(pieces) == 3 and joined == [True]
            base = pieces[0].base
            assert PACKED.get(id(base)) is base and all(a.base is base for a in pieces)
        else:
            assert joined[-1] is False  # separate arrays: copied into the step's buffer
    for mode in ("compiled", "eager"):
        for a, b in zip(grads["torch's", mode], grads["previous", mode]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_masked_backward_runs_the_kernel(monkeypatch, compiled):
    """The node keeps attn_mask as a Tensor: the kernel takes its array instead of
    declining (which sent every masked backward down the tensor-op formulas)."""
    calls = []
    kernel = CpuBackend.flash_attention_backward

    def spy(*args):
        r = kernel(*args)
        calls.append(r is not None)
        return r

    monkeypatch.setattr(CpuBackend, "flash_attention_backward", staticmethod(spy))
    rng = np.random.default_rng(5)
    arrays = _arrays("masked", rng)
    leaf, q, k, v, kw = _inputs(sg, "masked", arrays)
    w = sg.tensor(rng.standard_normal((B, H, T, E)).astype(np.float32))

    def step(qkv):
        q, k, v = (t.view(B, T, H, E).transpose(1, 2) for t in qkv.split(C, dim=2))
        loss = (sg.nn.functional.scaled_dot_product_attention(q, k, v, **kw) * w).sum()
        loss.backward()
        return loss

    x = leaf["qkv"]
    fn = sg.compile(step) if compiled else step
    fn(x)
    if compiled:
        assert fn.stats["fallbacks"] == []
    got, x.grad = x.grad.numpy().copy(), None
    assert calls and all(calls)
    monkeypatch.setattr(CpuBackend, "flash_attention_backward", staticmethod(
        lambda *args: None))  # the formulas
    step(x)
    want = x.grad.numpy()
    assert_close(got, want, terms=3 * (E + T + 8) + E, scale=magnitude(want, *arrays.values(),
                                                                         w.numpy()))


def test_cat_into_takes_only_packed_arrays_in_their_order():
    """cat_into returns a packed_grads array as the concatenation only when its pieces
    come in their place (q, k, v); reordered pieces, or an array it did not pack (another
    buffer that happens to hold the pieces in place), are copied into ``out``."""
    from symgrad.backends.attention_numpy import packed_grads

    runtime = importlib.import_module("symgrad.compile.runtime")
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    room = packed_grads(q, q, q)
    for r in room:
        r[...] = rng.standard_normal(r.shape)
    parts = tuple((r.swapaxes(1, 2), (2, 4, 15)) for r in room)
    want = np.concatenate([r.swapaxes(1, 2).reshape(2, 4, 15) for r in room], 2)
    out = np.empty((2, 4, 45), np.float32)
    got = runtime.cat_into(out, 2, parts)
    assert got is not out and got.base is room[0].base
    np.testing.assert_array_equal(got, want)
    swapped = (parts[1], parts[0], parts[2])
    got = runtime.cat_into(out, 2, swapped)
    assert got is out
    np.testing.assert_array_equal(got, np.concatenate([want[..., 15:30], want[..., :15],
                                                       want[..., 30:]], 2))
    other = np.empty_like(room[0].base)  # the same layout, not made by packed_grads
    views = tuple(other[:, :, i].swapaxes(1, 2) for i in range(3))
    for v, r in zip(views, room):
        v[...] = r
    got = runtime.cat_into(out, 2, tuple((v.swapaxes(1, 2), (2, 4, 15)) for v in views))
    assert got is out
    np.testing.assert_array_equal(got, want)


def test_cat_into_rejects_pieces_of_a_packed_array_out_of_their_place():
    """Pieces of a packed_grads array with the shapes and strides of their slices but
    another start (one element on), one piece twice, or the right start with other strides
    (two axes of one size swapped) are copied into ``out``: each such check missing would
    return the packed array as a wrong concatenation."""
    from symgrad.backends.attention_numpy import packed_grads

    runtime = importlib.import_module("symgrad.compile.runtime")
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 4, 4, 3)).astype(np.float32)  # heads == length: 4
    room = packed_grads(q, q, q)
    base = room[0].base
    base[...] = rng.standard_normal(base.shape)
    pieces = [r.swapaxes(1, 2) for r in room]  # (2, 4, 4, 3) each, in their place
    flat = base.reshape(2, 4, 36)
    shifted = flat[:, :, 1:13].reshape(2, 4, 4, 3)  # dq's shape and strides, one element on
    assert shifted.base is base and shifted.strides == pieces[0].strides
    turned = pieces[0].swapaxes(1, 2)  # dq's start and shape, other strides
    assert turned.base is base and turned.shape == pieces[0].shape
    out = np.empty((2, 4, 36), np.float32)
    assert runtime.cat_into(out, 2, tuple((p, (2, 4, 12)) for p in pieces)) is not out
    for first, second in ((shifted, pieces[1]), (pieces[0], pieces[0]), (turned, pieces[1])):
        parts = ((first, (2, 4, 12)), (second, (2, 4, 12)), (pieces[2], (2, 4, 12)))
        want = np.concatenate([a.reshape(s) for a, s in parts], 2)
        got = runtime.cat_into(out, 2, parts)
        assert got is out
        np.testing.assert_array_equal(got, want)


def test_cat_into_joins_packed_arrays_of_each_dtype_and_shape_in_turn():
    """The slice layouts cat_into keeps per shapes and itemsize: float32 and float64
    arrays of one shape, then another shape, each joined in place with the right values."""
    from symgrad.backends.attention_numpy import packed_grads

    runtime = importlib.import_module("symgrad.compile.runtime")
    rng = np.random.default_rng(6)
    for shape, dtype in [((2, 3, 4, 5), np.float32), ((2, 3, 4, 5), np.float64),
                         ((1, 2, 6, 3), np.float32), ((2, 3, 4, 5), np.float32)]:
        q = np.zeros(shape, dtype)
        room = packed_grads(q, q, q)
        room[0].base[...] = rng.standard_normal(room[0].base.shape)
        b, h, n, e = shape
        parts = tuple((r.swapaxes(1, 2), (b, n, h * e)) for r in room)
        out = np.empty((b, n, 3 * h * e), dtype)
        got = runtime.cat_into(out, 2, parts)
        assert got is not out and got.base is room[0].base
        np.testing.assert_array_equal(got, np.concatenate([a.reshape(s) for a, s in parts], 2))
