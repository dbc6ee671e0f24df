"""``scaled_dot_product_attention`` as torch's math path computes it.

A composite of symgrad's differentiable ops following ATen's
``_scaled_dot_product_attention_math`` step by step, so the verifier sees every elementary op
(matmul, add, softmax, where, ...). ``MultiheadAttention`` (in ``multihead_attention``) builds
on it; this module imports nothing from ``symgrad.nn`` so that ``nn.functional`` can.
"""

from __future__ import annotations

import math

from .. import creation
from .. import functional as _F
from ..autograd import function as _fn
from ..autograd.function import apply
from ..autograd.record import record
from ..dtypes import bool_
from ..ops import OPS
from ..ops._ints import u64
from ..ops.attention import FLASH_CPU
from ..tensor import Tensor

__all__ = ["scaled_dot_product_attention"]

_NEG_INF = float("-inf")


# -- private helpers (masked_fill / tril / dropout may become ops; swap them in here) ----

def _causal_mask(L: int, S: int, device) -> Tensor:
    """torch's ``ones(L, S, dtype=bool).tril()``: row i may attend to columns j <= i."""
    rows = creation.arange(L, device=device).unsqueeze(-1)
    cols = creation.arange(S, device=device)
    return rows >= cols


def _additive_mask(keep: Tensor, dtype) -> Tensor:
    """A bool mask (True = take part) as the float mask torch adds: 0 where True, -inf else."""
    zeros = creation.zeros(tuple(keep.shape), dtype=dtype, device=keep.device)
    return _F.where(keep, zeros, creation.full((), _NEG_INF, dtype=dtype, device=keep.device))


#: (L, S, dtype, device) -> the array of the causal additive mask, made once (few entries)
_CAUSAL: dict = {}
_CAUSAL_KEEP = 8


def _causal_additive_mask(L: int, S: int, dtype, device) -> Tensor:
    """``_additive_mask(_causal_mask(L, S))``: a constant of the sizes, so its array is made
    once and each call gets a fresh tensor over it (memory counted per tensor as before).
    While a profiler or compile tracer watches the ops, they are made again so it sees them."""
    if _fn._profiler is not None:
        return _additive_mask(_causal_mask(L, S, device), dtype)
    key = (L, S, dtype, device)
    data = _CAUSAL.get(key)
    if data is None:
        data = _additive_mask(_causal_mask(L, S, device), dtype)._data
        if len(_CAUSAL) >= _CAUSAL_KEEP:
            del _CAUSAL[next(iter(_CAUSAL))]
        _CAUSAL[key] = data
    return Tensor._wrap(data, device)


def _masked_to_neg_inf(mask: Tensor, dtype) -> Tensor:
    """torch's ``_canonical_mask`` for a bool mask (True = ignore): -inf where True, 0 else."""
    return _additive_mask(~mask, dtype)


def _canonical_mask(mask: Tensor | None, dtype) -> Tensor | None:
    """MultiheadAttention's masks as floats: bool ones become 0/-inf, float ones stay."""
    if mask is None or mask.dtype != bool_:
        return mask
    return _masked_to_neg_inf(mask, dtype)


def _safe_softmax(x: Tensor, dim: int) -> Tensor:
    """torch's ``_safe_softmax`` node (SafeSoftmaxBackward0): a row that is all -inf gives
    zeros (and zero gradient), not NaN."""
    return apply(OPS["safe_softmax"], (x,), {"dim": u64(dim)})


def _add_mask(scores: Tensor, mask: Tensor) -> Tensor:
    """``scores + mask``, the node keeping the (often temporary) mask for the verifier."""
    with record():
        return scores + mask


def _dropout(x: Tensor, p: float) -> Tensor:
    """Inverted dropout as ``at::dropout(x, p, train=True)``; draws from symgrad's generator."""
    if p == 1.0:
        return x * 0.0
    keep = creation.rand(tuple(x.shape), dtype=x.dtype, device=x.device) < (1.0 - p)
    return x * (keep.to(x.dtype) / (1.0 - p))


def _mul_scalar(x: Tensor, factor: float) -> Tensor:
    """aten's ``mul.Scalar`` (MulBackward1), which torch's C++ math path records."""
    return apply(OPS["mul_scalar"], (x,), {"other": factor})


def _repeat_heads(x: Tensor, repeats: int) -> Tensor:
    """``x.repeat_interleave(repeats, dim=-3)`` (grouped-query attention's shared key heads)."""
    if repeats == 1:
        return x
    *batch, heads, length, dim = x.shape
    grown = x.unsqueeze(-3).expand(*batch, heads, repeats, length, dim)
    return grown.reshape(*batch, heads * repeats, length, dim)


# -- scaled_dot_product_attention ---------------------------------------------------------

def _check_sdpa_inputs(query, key, value, attn_mask, dropout_p: float) -> None:
    """torch's ``validate_sdpa_input`` checks, with its wording."""
    if query.dtype != key.dtype or query.dtype != value.dtype:
        raise RuntimeError(
            "Expected query, key, and value to have the same dtype, but got query.dtype: "
            f"{_dtype_name(query)} key.dtype: {_dtype_name(key)} and value.dtype: "
            f"{_dtype_name(value)} instead.")
    if query.device != key.device or query.device != value.device:
        raise RuntimeError(
            "Expected query, key, and value to have the same device type, but got "
            f"query.device: {query.device} key.device: {key.device} and value.device: "
            f"{value.device} instead.")
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise RuntimeError(
            "Expected query, key, and value to all be  at least 2 dimensional, but got "
            f"query.dim: {query.dim()} key.dim: {key.dim()} and value.dim: {value.dim()} instead.")
    if attn_mask is not None and attn_mask.dtype not in (bool_, query.dtype):
        raise RuntimeError(
            "Expected attn_mask dtype to be bool or float or to match query dtype, but got "
            f"attn_mask.dtype: {_dtype_name(attn_mask)} and  query.dtype: {_dtype_name(query)} "
            "instead.")
    if not 0.0 <= dropout_p <= 1.0:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")


def _dtype_name(t: Tensor) -> str:
    """The C++ scalar-type name torch prints in these messages (``float``, ``double``, ``bool``)."""
    from .._tensor_layer import CPP_NAMES

    return CPP_NAMES.get(t.dtype.name, t.dtype.name)


def _gqa_repeats(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool) -> int:
    """How often each key/value head serves query heads (1 unless ``enable_gqa``)."""
    if not enable_gqa or query.dim() < 3:
        return 1
    q_heads, k_heads, v_heads = query.shape[-3], key.shape[-3], value.shape[-3]
    if q_heads % k_heads or q_heads % v_heads:
        raise RuntimeError(
            "Number of heads in key and value must divide the number of heads in query")
    return q_heads // k_heads


def _flash_applies(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None,
                   dropout_p: float, enable_gqa: bool) -> bool:
    """Whether torch 2.13 on CPU runs its fused kernel (one ScaledDotProductFlashAttention
    ForCpuBackward0 node) rather than the math path: 4-D inputs of one batch size, equal
    head dims, nonempty sequences, key/value heads equal to the query's (or dividing them
    with ``enable_gqa``), unit stride along the head dim, no dropout, and a 2-D or 4-D mask
    that needs no gradient."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4 or dropout_p > 0.0:
        return False
    if not query.dtype.is_floating_point:
        return False
    (b, h, L, e), (bk, hk, S, ek), (bv, hv, sv, ev) = query.shape, key.shape, value.shape
    if not (b == bk == bv and e == ek == ev and S == sv and hk == hv and L and S and e):
        return False
    if hk != h and not (enable_gqa and h % hk == 0):
        return False
    if any(t.stride(-1) != 1 for t in (query, key, value)):
        return False
    if attn_mask is not None and (attn_mask.requires_grad or attn_mask.dim() not in (2, 4)):
        return False
    return True


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``softmax(q k^T * scale + mask) v`` as torch's math path computes it.

    q and k are each scaled by ``sqrt(scale)`` before the matmul (torch does so for
    stability); a bool mask (True = take part) and ``is_causal`` become 0/-inf and are added;
    fully masked rows give zeros.
    """
    _check_sdpa_inputs(query, key, value, attn_mask, dropout_p)
    if is_causal and attn_mask is not None:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not "
                           "be set when is_causal=True")
    if _flash_applies(query, key, value, attn_mask, dropout_p, enable_gqa):
        if attn_mask is not None and attn_mask.dtype == bool_:
            attn_mask = _additive_mask(attn_mask, query.dtype)
        return apply(OPS[FLASH_CPU], (query, key, value),
                     {"attn_mask": attn_mask, "dropout_p": float(dropout_p),
                      "is_causal": bool(is_causal),
                      "scale": None if scale is None else float(scale)})[0]
    if attn_mask is not None and attn_mask.dtype == bool_:
        attn_mask = _additive_mask(attn_mask, query.dtype)
    negative = scale is not None and scale < 0
    scaling = math.sqrt(abs(scale) if scale is not None else 1.0 / math.sqrt(query.shape[-1]))
    query = _mul_scalar(query, -scaling if negative else scaling)
    if is_causal:
        if attn_mask is not None:
            raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not "
                               "be set when is_causal=True")
        attn_mask = _causal_additive_mask(query.shape[-2], key.shape[-2], query.dtype,
                                          query.device)
    repeats = _gqa_repeats(query, key, value, enable_gqa)
    key, value = _repeat_heads(key, repeats), _repeat_heads(value, repeats)
    attn = _F.matmul(query, _mul_scalar(key.transpose(-2, -1), scaling))
    if attn_mask is not None:
        attn = _add_mask(attn, attn_mask)
    attn = _safe_softmax(attn, -1)
    if dropout_p > 0.0:
        attn = _dropout(attn, dropout_p)
    return _F.matmul(attn, value)
