"""scaled_dot_product_attention's causal mask: its array is made once per (L, S, dtype,
device) and each call wraps a fresh tensor over it (nn/attention.py); the graph, the
values, the memory count and what a profiler sees stay as when it was made every call.
The mask belongs to the math path, which 3-D inputs take (4-D ones record torch's fused
node, whose causality is a flag)."""

from __future__ import annotations

import numpy as np

import symgrad as sg
from symgrad.nn import attention as att


def _grad_fns(t) -> list:
    out, stack, seen = [], [t.grad_fn], set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n.name())
        stack += [nf for nf, _ in n.next_functions]
    return sorted(out)


def test_cached_mask_gives_the_same_values_graph_and_gradients():
    sg.manual_seed(0)
    q = sg.randn(6, 5, 4, requires_grad=True)
    att._CAUSAL.clear()
    first = sg.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert len(att._CAUSAL) == 1
    (g1,) = sg.autograd.grad(first.sum(), [q])
    second = sg.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    (g2,) = sg.autograd.grad(second.sum(), [q])
    np.testing.assert_array_equal(first._data, second._data)
    np.testing.assert_array_equal(g1._data, g2._data)
    assert _grad_fns(first) == _grad_fns(second)
    mask = att._causal_additive_mask(5, 5, sg.float32, q.device)
    ref = att._additive_mask(att._causal_mask(5, 5, q.device), sg.float32)
    np.testing.assert_array_equal(mask._data, ref._data)
    assert mask._data is att._CAUSAL[(5, 5, sg.float32, q.device)]
    assert mask._storage is not att._causal_additive_mask(5, 5, sg.float32, q.device)._storage


def test_memory_returns_to_where_it_was():
    q = sg.randn(2, 6, 4)
    att._CAUSAL.clear()
    sg.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)  # fills the cache
    before = sg.memory_allocated()
    out = sg.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    del out
    assert sg.memory_allocated() == before


def test_profiler_still_sees_the_mask_ops():
    q = sg.randn(1, 3, 2)
    sg.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)  # cached
    with sg.autograd.profiler.profile() as prof:
        sg.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    names = [e.name for e in prof.function_events]
    assert "symgrad::where" in names, names


def test_cache_keeps_few_entries():
    q = sg.randn(1, 2, 2)
    for n in range(2, 2 + 3 * att._CAUSAL_KEEP):
        k = sg.randn(1, n, 2)
        sg.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True)
    assert len(att._CAUSAL) == att._CAUSAL_KEEP
    assert len(att._CAUSAL) <= att._CAUSAL_KEEP
