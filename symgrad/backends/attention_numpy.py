"""The fused CPU attention node's backward on NumPy arrays (batched BLAS matmuls).

The cpu backend runs its softmax passes as Numba kernels (backend.py, kernels.attn_*) and
falls back to this module where those do not apply (a mask of another dtype, Hk not
dividing H, empty inputs); the kernels' tests compare against it.

ScaledDotProductFlashAttentionForCpuBackward0 in one pass, as torch's kernel does it: the
probabilities come back from the saved logsumexp (``P = exp(q k^T * scale + mask - lse)``,
zero on fully masked rows), then ``dv = P^T dO``, ``dS = P * (dO v^T - rowsum(dO * O))``,
``dq = dS k * scale``, ``dk = dS^T q * scale``. Tested equal to the op's tensor-op formulas.
The gradients come back in torch's layout: (B, H, L, E) views of (B, L, H, E) memory, as
torch's kernel allocates them whatever its inputs' strides (_grad_into).
"""

from __future__ import annotations

import math
import weakref

import numpy as np

__all__ = ["flash_attention", "flash_attention_backward"]


def _heads(x: np.ndarray, heads: int) -> np.ndarray:
    """Key/value heads repeated for grouped-query attention."""
    r = heads // x.shape[1]
    return x if r == 1 else np.repeat(x, r, axis=1)


def _factor(scale, query: np.ndarray):
    """The scores' factor in the query's dtype: ``scale``, else ``1/sqrt(E)``."""
    return query.dtype.type(scale if scale is not None else 1.0 / math.sqrt(query.shape[-1]))


def _unheads(g: np.ndarray, heads: int) -> np.ndarray:
    b, h, s, e = g.shape
    return g if h == heads else g.reshape(b, heads, h // heads, s, e).sum(2)


def packed_grads(query: np.ndarray, key: np.ndarray, value: np.ndarray) -> tuple | None:
    """Room for (dq, dk, dv) as (B, H, L, E) views of one (B, L, 3, H, E) array, or None
    where q, k and v differ in shape: the q|k|v concatenation a GPT's split backward
    builds, already in place (sg.compile's step then joins them without a copy:
    runtime.cat_into). Strides differ from torch's (rows 3HE apart), so only the compiled
    step, where no hook sees them, asks for this."""
    if key.shape != query.shape or value.shape != query.shape or \
            key.dtype != query.dtype or value.dtype != query.dtype:
        return None
    b, h, n, e = query.shape
    room = np.empty((b, n, 3, h, e), query.dtype)
    PACKED[id(room)] = room
    return tuple(room[:, :, i].swapaxes(1, 2) for i in range(3))


#: the arrays packed_grads made, while they live: runtime.cat_into takes only these as an
#: already joined concatenation (never a buffer something else may still read or write)
PACKED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _grad_into(a: np.ndarray, b: np.ndarray, heads: int, out=None) -> np.ndarray:
    """``_unheads(a @ b, heads)`` for 4-D ``a`` (B, H, L, S), ``b`` (B, H, S, E) of one
    dtype, with the same bits, as a (B, heads, L, E) view of (B, L, heads, E) memory: the
    layout torch's CPU flash backward gives dq, dk and dv whatever its inputs' strides (it
    fills zeros of the transposed sizes and transposes them back). A GPT's heads are
    transposed views of a split, so the view backward then needs no copy and the split
    backward copies whole rows instead of E-element runs. The product goes straight in
    (BLAS writes with a leading dimension); with grouped-query heads the summed product
    is copied in."""
    b0, h, n, _ = a.shape
    if out is None:
        out = np.empty((b0, n, heads, b.shape[3]), a.dtype).swapaxes(1, 2)
    if h == heads:
        np.matmul(a, b, out=out)
    else:
        np.copyto(out, _unheads(np.matmul(a, b), heads))
    return out


def _scores(query, key, value, attn_mask, is_causal, scale):
    """(k, v with the query's heads, the scale factor, the scaled and masked scores q k^T):
    what the forward and the backward (which recomputes the probabilities) both start from."""
    heads = query.shape[1]
    k, v = _heads(key, heads), _heads(value, heads)
    factor = _factor(scale, query)
    s = np.matmul(query, k.swapaxes(-1, -2))
    s *= factor
    if attn_mask is not None:
        s += attn_mask
    if is_causal:
        L, S = s.shape[-2:]
        s[..., np.arange(L)[:, None] < np.arange(S)[None, :]] = -np.inf
    return k, v, factor, s


def flash_attention_backward(grad, needed, attn_mask, dropout_p, is_causal, key, logsumexp,
                             output, query, scale, value):
    """(dq, dk, dv), None where not needed; None (decline) for what this does not cover."""
    arrays = (grad, key, logsumexp, output, query, value)
    if dropout_p or any(type(a) is not np.ndarray for a in arrays):
        return None
    dt = query.dtype
    if dt not in (np.float32, np.float64) or any(a.dtype != dt for a in arrays) or \
            (attn_mask is not None and (type(attn_mask) is not np.ndarray
                                        or attn_mask.dtype != dt)):
        return None
    k, v, factor, s = _scores(query, key, value, attn_mask, is_causal, scale)
    s -= logsumexp[..., None]
    p = np.exp(s, out=s)  # fully masked rows: exp(-inf - 0) = 0
    dq = dk = dv = None
    if needed[2]:
        dv = _grad_into(p.swapaxes(-1, -2), grad, value.shape[1])
    if needed[0] or needed[1]:
        ds = np.matmul(grad, v.swapaxes(-1, -2))
        ds -= np.einsum("bhle,bhle->bhl", grad, output)[..., None]
        ds *= p
        ds *= factor
        if needed[0]:
            dq = _grad_into(ds, k, query.shape[1])
        if needed[1]:
            dk = _grad_into(ds.swapaxes(-1, -2), query, key.shape[1])
    return dq, dk, dv


def flash_attention(query, key, value, attn_mask, is_causal, scale):
    """The fused node's forward, (output, logsumexp), in batched BLAS with the softmax in
    place, or None to decline (the op's generic lowering then runs)."""
    arrays = (query, key, value)
    if any(type(a) is not np.ndarray for a in arrays):
        return None
    dt = query.dtype
    if dt not in (np.float32, np.float64) or key.dtype != dt or value.dtype != dt or \
            (attn_mask is not None and (type(attn_mask) is not np.ndarray
                                        or attn_mask.dtype != dt)):
        return None
    k, v, factor, s = _scores(query, key, value, attn_mask, is_causal, scale)
    m = s.max(-1, keepdims=True)
    dead = m == -np.inf
    m[dead] = 0  # a fully masked row: exp(-inf) = 0 everywhere, output 0, logsumexp 0
    s -= m
    np.exp(s, out=s)
    total = s.sum(-1, keepdims=True)
    total[dead] = 1
    s /= total
    out = np.empty_like(query, shape=query.shape[:3] + value.shape[3:])  # in the query's
    # memory order, as torch's
    np.matmul(s, v, out=out)
    lse = np.log(total, out=total)
    lse += m
    return out, lse[..., 0]
