"""The fused CPU attention node torch 2.13 records for ``scaled_dot_product_attention``.

``_scaled_dot_product_flash_attention_for_cpu`` (ScaledDotProductFlashAttentionForCpu
Backward0) on 4-D query/key/value: one node saving query, key, value, output, logsumexp,
attn_mask (float, additive), dropout_p, is_causal and scale. Its forward here is composed
of backend kernels (matmul, mul, add, where, softmax pieces), so every backend runs it and
the SymPy backend replays its exact meaning (STRUCTURAL). Scores are ``(q k^T) * scale +
mask`` (the flash CPU kernel's order); a row whose every score is -inf gives zeros and a
logsumexp of 0, as torch does. The backward recomputes the probabilities from q and k in
differentiable tensor ops (so ``create_graph=True`` and the verifier's audit see their
dependence on the inputs); the saved logsumexp is torch's, kept for ``_saved_logsumexp``.
"""

from __future__ import annotations

import math

import numpy as np

from ._ints import u64
from .registry import register
from .softmax import _safe_softmax, _symbolic
from .spec import STRUCTURAL, OpSpec

__all__ = ["FLASH_CPU", "flash_scale"]

#: the op's registry name (aten's)
FLASH_CPU = "scaled_dot_product_flash_attention_for_cpu"


def _arr(x):
    return getattr(x, "_data", x)


def flash_scale(scale, head_dim: int) -> float:
    """The factor the scores are multiplied by: ``scale`` or ``1/sqrt(E)``."""
    return float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)


def _causal_keep(L: int, S: int) -> np.ndarray:
    """torch's ``ones(L, S).tril()``: row i attends to columns j <= i."""
    return np.arange(L)[:, None] >= np.arange(S)[None, :]


def _group(be, x, repeats: int):
    """Key/value heads repeated for grouped-query attention (``repeat_interleave`` dim 1)."""
    if repeats == 1:
        return x
    b, h, s, e = x.shape
    grown = be.broadcast_to(be.reshape(x, (b, h, 1, s, e)), (b, h, repeats, s, e))
    return be.reshape(grown, (b, h * repeats, s, e))


def _flash_fwd(be, query, key, value, attn_mask, dropout_p, is_causal, scale):
    """(output, logsumexp): ``softmax(q k^T * scale + mask) v`` and the rows' logsumexp."""
    fast = getattr(be, "flash_attention", None)
    if fast is not None:  # a numeric backend's one-pass kernel; None: it declines
        done = fast(query, key, value, _arr(attn_mask), is_causal, scale)
        if done is not None:
            return done
    repeats = query.shape[1] // key.shape[1]
    key, value = _group(be, key, repeats), _group(be, value, repeats)
    factor = flash_scale(scale, query.shape[-1])
    scores = be.mul(be.matmul(query, be.transpose(key, (0, 1, 3, 2))), factor)
    if attn_mask is not None:
        scores = be.add(scores, _arr(attn_mask))
    L, S = query.shape[-2], key.shape[-2]
    if is_causal:
        keep = be.from_host(np.broadcast_to(_causal_keep(L, S), scores.shape).copy())
        scores = be.where(keep, scores, be.full(scores.shape, float("-inf"), scores.dtype))
    probs = _safe_softmax(be, scores, -1)
    out = be.matmul(probs, value)
    if type(out) is np.ndarray and out.dtype != object and type(query) is np.ndarray:
        # torch's kernel writes the output in the query's memory order (``empty_like``):
        # the views users then take of it record ViewBackward0 where torch's do
        laid = np.empty_like(query, dtype=out.dtype)
        laid[...] = out
        out = laid
    if _symbolic(scores):
        lse = be.log(be.sum(be.exp(scores), (3,), False))
    else:
        m = be.amax(scores, (3,), True)
        dead = be.eq(m, float("-inf"))
        zero = be.full(m.shape, 0, m.dtype)
        m = be.where(dead, zero, m)
        total = be.sum(be.exp(be.sub(scores, m)), (3,), True)
        lse = be.where(dead, zero, be.add(be.log(be.where(dead, be.full(m.shape, 1, m.dtype),
                                                           total)), m))
        lse = be.reshape(lse, lse.shape[:-1])
    return out, lse


# -- backward (tensor ops) -------------------------------------------------------------------
def _probs(query, key, attn_mask, is_causal, scale):
    """The attention probabilities (B, H, L, S) recomputed in differentiable ops."""
    from .. import _tensor_layer as _tl
    from .registry import OPS

    factor = flash_scale(scale, query.shape[-1])
    scores = (query @ key.transpose(-2, -1)) * factor
    if attn_mask is not None:
        scores = scores + attn_mask
    if is_causal:
        L, S = scores.shape[-2], scores.shape[-1]
        mask = np.where(_causal_keep(L, S), 0.0, -np.inf)
        scores = scores + _tl.tensor(mask, dtype=scores.dtype, device=scores.device)
    return _tl.apply(OPS["safe_softmax"], (scores,), {"dim": u64(3)})


def _grouped(x, heads: int):
    """``x`` (B, Hk, ...) repeated to ``heads`` heads, as the forward does."""
    repeats = heads // x.shape[1]
    if repeats == 1:
        return x
    b, h, s, e = x.shape
    return x.unsqueeze(2).expand(b, h, repeats, s, e).reshape(b, h * repeats, s, e)


def _ungroup(g, heads: int):
    """A repeated head's gradient summed back onto its key/value head."""
    b, h, s, e = g.shape
    if h == heads:
        return g
    return g.reshape(b, heads, h // heads, s, e).sum(2)


def _score_grad(grad, query, key, value, output, attn_mask, is_causal, scale):
    """dL/d(scores) * scale and the probabilities: ``P * (dO v^T - rowsum(dO * O))``."""
    probs = _probs(query, _grouped(key, query.shape[1]), attn_mask, is_causal, scale)
    dp = grad @ _grouped(value, query.shape[1]).transpose(-2, -1)
    ds = probs * (dp - (grad * output).sum(3, keepdim=True))
    return ds * flash_scale(scale, query.shape[-1]), probs


def flash_query_grad(grad, query, key, value, output, logsumexp, attn_mask,
                     dropout_p, is_causal, scale):
    ds, _ = _score_grad(grad, query, key, value, output, attn_mask, is_causal, scale)
    return ds @ _grouped(key, query.shape[1])


def flash_key_grad(grad, query, key, value, output, logsumexp, attn_mask,
                   dropout_p, is_causal, scale):
    ds, _ = _score_grad(grad, query, key, value, output, attn_mask, is_causal, scale)
    return _ungroup(ds.transpose(-2, -1) @ query, key.shape[1])


def flash_value_grad(grad, query, key, value, output, logsumexp, attn_mask,
                     dropout_p, is_causal, scale):
    probs = _probs(query, _grouped(key, query.shape[1]), attn_mask, is_causal, scale)
    return _ungroup(probs.transpose(-2, -1) @ grad, value.shape[1])


register(OpSpec(
    FLASH_CPU, "ScaledDotProductFlashAttentionForCpuBackward0", ("query", "key", "value"),
    _flash_fwd,
    {"query": flash_query_grad, "key": flash_key_grad, "value": flash_value_grad},
    STRUCTURAL, dtype_rule="same", outputs=("output", "logsumexp"),
    fused_backward="flash_attention_backward",
    doc="F.scaled_dot_product_attention on 4-D inputs (torch's fused CPU node): "
        "softmax(q k^T * scale + attn_mask, causal) v; logsumexp of the scores' rows "
        "(0 where a row is fully masked, whose output is zeros)."))
