"""``nn.MultiheadAttention`` following torch's ``F.multi_head_attention_forward`` step by step.

Same parameters, state-dict keys and init as torch; the ``need_weights=True`` path computes
the weights explicitly (bmm, softmax, bmm), the ``need_weights=False`` path goes through
``scaled_dot_product_attention``. ``add_bias_kv`` appends the learned ``bias_k``/``bias_v``
(repeated over the batch, CatBackward0) and ``add_zero_attn`` a zero key/value per head, each
padding the masks by one column, as torch. torch's fast path (``_native_multi_head_attention``,
no grad and eval only) is not followed: symgrad always takes the recorded composite path.
"""

from __future__ import annotations

import math

from .. import creation
from .. import functional as _F
from ..autograd.function import apply
from ..autograd.record import record
from ..ops import OPS
from ..tensor import Tensor
from . import functional as F
from . import init
from .attention import _add_mask, _canonical_mask, _dropout, scaled_dot_product_attention
from .modules import Linear, Module
from .parameter import Parameter

__all__ = ["MultiheadAttention"]

_PAD = OPS["constant_pad_nd"]


class NonDynamicallyQuantizableLinear(Linear):
    """torch's name for MultiheadAttention's ``out_proj`` (a plain Linear; the repr shows it)."""


def _check_mha_shapes(query: Tensor, key: Tensor, value: Tensor,
                      key_padding_mask: Tensor | None) -> bool:
    """torch's ``_mha_shape_check``: True for batched (3-D) input, False for unbatched (2-D)."""
    if query.dim() == 3:
        if key.dim() != 3 or value.dim() != 3:
            raise AssertionError(
                "For batched (3-D) `query`, expected `key` and `value` to be 3-D but found "
                f"{key.dim()}-D and {value.dim()}-D tensors respectively")
        if key_padding_mask is not None and key_padding_mask.dim() != 2:
            raise AssertionError(
                "For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D "
                f"but found {key_padding_mask.dim()}-D tensor instead")
        return True
    if query.dim() == 2:
        if key.dim() != 2 or value.dim() != 2:
            raise AssertionError(
                "For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found "
                f"{key.dim()}-D and {value.dim()}-D tensors respectively")
        if key_padding_mask is not None and key_padding_mask.dim() != 1:
            raise AssertionError(
                "For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` or 1-D "
                f"but found {key_padding_mask.dim()}-D tensor instead")
        return False
    raise AssertionError(
        f"query should be unbatched 2D or batched 3D tensor but received {query.dim()}-D "
        "query tensor")


def _attn_mask_3d(attn_mask: Tensor, bsz_heads: int, tgt_len: int, src_len: int) -> Tensor:
    """A 2-D or 3-D attention mask checked and shaped ``(1 or bsz*heads, tgt, src)``."""
    if attn_mask.dim() == 2:
        if tuple(attn_mask.shape) != (tgt_len, src_len):
            raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but "
                               f"should be {(tgt_len, src_len)}.")
        return attn_mask.unsqueeze(0)
    if attn_mask.dim() == 3:
        if tuple(attn_mask.shape) != (bsz_heads, tgt_len, src_len):
            raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but "
                               f"should be {(bsz_heads, tgt_len, src_len)}.")
        return attn_mask
    raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")


def _pad_masks(attn_mask: Tensor | None, key_padding_mask: Tensor | None):
    """Both (float) masks padded by one zero column, as torch's ``pad(mask, (0, 1))`` for the
    key/value row that ``add_bias_kv`` or ``add_zero_attn`` appends."""
    return tuple(None if m is None else apply(_PAD, (m,), {"pad": (0, 1), "value": 0})
                 for m in (attn_mask, key_padding_mask))


def _check_key_padding_mask(key_padding_mask: Tensor, src_len: int, bsz: int) -> None:
    """torch's ``_check_key_padding_mask`` (its messages say "key_padded_mask")."""
    if key_padding_mask.shape[0] != bsz:
        raise AssertionError(f"Expected key_padded_mask.shape[0] to be {bsz}, but got "
                             f"{key_padding_mask.shape[0]}")
    if key_padding_mask.shape[1] != src_len:
        raise AssertionError(f"Expected key_padded_mask.shape[1] to be {src_len}, but got "
                             f"{key_padding_mask.shape[1]}")


def _packed_pieces(proj: Tensor, n: int, E: int) -> Tensor:
    """``(..., n*E)`` -> ``(n, ..., E)`` contiguous, as torch's ``unflatten(-1, (n, E))
    .unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()`` (same nodes recorded)."""
    proj = proj.reshape(*proj.shape[:-1], n, E)
    return proj.unsqueeze(0).transpose(0, -2).squeeze(-2).contiguous()


def _heads_first(x: Tensor, bsz: int, num_heads: int, head_dim: int) -> Tensor:
    """``(len, bsz, E)`` -> ``(bsz * heads, len, head_dim)`` as torch's view + transpose."""
    return x.view(x.shape[0], bsz * num_heads, head_dim).transpose(0, 1)


class MultiheadAttention(Module):
    """torch's ``nn.MultiheadAttention``: same parameters, state-dict keys, init and forward,
    ``add_bias_kv`` (parameters ``bias_k``, ``bias_v`` of shape ``(1, 1, embed_dim)``) and
    ``add_zero_attn`` included."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None,
                 dtype=None) -> None:
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")
        self._make_in_projection(bias, dtype)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias,
                                                        dtype=dtype)
        if add_bias_kv:
            self.bias_k = Parameter(creation.empty(1, 1, embed_dim, dtype=dtype))
            self.bias_v = Parameter(creation.empty(1, 1, embed_dim, dtype=dtype))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()
        if device is not None:
            self.to(device)

    def _make_in_projection(self, bias: bool, dtype) -> None:
        """One packed ``in_proj_weight`` when q, k, v share embed_dim, else three, as torch."""
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(creation.empty(3 * E, E, dtype=dtype))
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = Parameter(creation.empty(E, E, dtype=dtype))
            self.k_proj_weight = Parameter(creation.empty(E, self.kdim, dtype=dtype))
            self.v_proj_weight = Parameter(creation.empty(E, self.vdim, dtype=dtype))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(creation.empty(3 * E, dtype=dtype))
        else:
            self.register_parameter("in_proj_bias", None)

    def _reset_parameters(self) -> None:
        """torch's init: xavier-uniform projections, zero biases, xavier-normal bias_k/v."""
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def _in_projection(self, query: Tensor, key: Tensor, value: Tensor):
        """q, k, v projected as torch's ``_in_projection_packed`` / ``_in_projection`` do.

        The identities ``q is k is v`` (self-attention) and ``k is v`` pick torch's packed
        paths: one linear (or a q linear and one k/v linear) whose output is cut into heads'
        inputs, so the recorded graph has torch's nodes; otherwise the packed weight (and
        bias) are chunked into three linears.
        """
        E = self.embed_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        if not self._qkv_same_embed_dim:  # torch: in_proj_bias.chunk(3), three own weights
            b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
            return (F.linear(query, self.q_proj_weight, b_q),
                    F.linear(key, self.k_proj_weight, b_k),
                    F.linear(value, self.v_proj_weight, b_v))
        if key is value:
            if query is key:
                proj = _packed_pieces(F.linear(query, w, b), 3, E)
                return proj[0], proj[1], proj[2]
            w_q, w_kv = w.split([E, 2 * E])
            b_q, b_kv = (None, None) if b is None else b.split([E, 2 * E])
            kv = _packed_pieces(F.linear(key, w_kv, b_kv), 2, E)
            return F.linear(query, w_q, b_q), kv[0], kv[1]
        w_q, w_k, w_v = w.chunk(3)
        b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
        return F.linear(query, w_q, b_q), F.linear(key, w_k, b_k), F.linear(value, w_v, b_v)

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Tensor | None = None, need_weights: bool = True,
                attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        """``(attn_output, attn_weights)``; the weights are None unless ``need_weights``."""
        is_batched = query.dim() == 3
        if self.batch_first and is_batched:  # keep torch's "is" identities (packed paths)
            if key is value:
                if query is key:
                    query = key = value = query.transpose(1, 0)
                else:
                    query, key = (x.transpose(1, 0) for x in (query, key))
                    value = key
            else:
                query, key, value = (x.transpose(1, 0) for x in (query, key, value))
        out, weights = self._attention(query, key, value, key_padding_mask, need_weights,
                                       attn_mask, average_attn_weights, is_causal)
        if self.batch_first and is_batched:
            out = out.transpose(1, 0)
        return out, weights

    def _attention(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                   average_attn_weights, is_causal):
        """``F.multi_head_attention_forward`` on sequence-first input."""
        is_batched = _check_mha_shapes(query, key, value, key_padding_mask)
        if not is_batched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        tgt_len, bsz, _ = query.shape
        src_len = key.shape[0]
        H, D = self.num_heads, self.head_dim
        key_padding_mask = _canonical_mask(key_padding_mask, query.dtype)
        if is_causal and attn_mask is None:
            raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use "
                               "the Transformer module method `generate_square_subsequent_mask` "
                               "to create this mask.")
        if is_causal and key_padding_mask is None and not need_weights:
            attn_mask = None
        else:
            attn_mask = _canonical_mask(attn_mask, query.dtype)
            if key_padding_mask is not None:
                is_causal = False
        q, k, v = self._in_projection(query, key, value)
        if attn_mask is not None:
            attn_mask = _attn_mask_3d(attn_mask, bsz * H, tgt_len, src_len)
        if self.bias_k is not None and self.bias_v is not None:
            k = _F.cat([k, self.bias_k.repeat(1, bsz, 1)])
            v = _F.cat([v, self.bias_v.repeat(1, bsz, 1)])
            attn_mask, key_padding_mask = _pad_masks(attn_mask, key_padding_mask)
        q, k, v = (_heads_first(x, bsz, H, D) for x in (q, k, v))
        if self.add_zero_attn:
            zeros = creation.zeros(bsz * H, 1, D, dtype=k.dtype, device=k.device)
            k = _F.cat([k, zeros], dim=1)
            v = _F.cat([v, creation.zeros(bsz * H, 1, D, dtype=v.dtype, device=v.device)],
                       dim=1)
            attn_mask, key_padding_mask = _pad_masks(attn_mask, key_padding_mask)
        src_len = k.shape[1]
        if key_padding_mask is not None:
            _check_key_padding_mask(key_padding_mask, src_len, bsz)
            padding = key_padding_mask.reshape(bsz, 1, 1, src_len).expand(bsz, H, 1, src_len)
            padding = padding.reshape(bsz * H, 1, src_len)
            attn_mask = padding if attn_mask is None else _add_mask(attn_mask, padding)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = self._weighted(q, k, v, attn_mask, dropout_p, bsz, tgt_len)
            if average_attn_weights:
                weights = weights.mean(dim=1)
        else:
            out, weights = self._fused(q, k, v, attn_mask, dropout_p, is_causal, bsz, tgt_len)
        if not is_batched:
            out = out.squeeze(1)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights

    def _project_out(self, out: Tensor, tgt_len: int, bsz: int) -> Tensor:
        """``(tgt*bsz, E)`` through ``out_proj``, back to ``(tgt, bsz, E)``."""
        out = self.out_proj(out)
        return out.reshape(tgt_len, bsz, out.shape[1])

    def _weighted(self, q, k, v, attn_mask, dropout_p, bsz, tgt_len):
        """The ``need_weights=True`` path: explicit softmax(q k^T / sqrt(d) + mask) v."""
        q_scaled = q * math.sqrt(1.0 / float(q.shape[-1]))
        if attn_mask is not None:  # torch: baddbmm(attn_mask, q_scaled, k^T)
            with record():  # the node keeps the (temporary) mask for the verifier
                scores = _F.baddbmm(attn_mask, q_scaled, k.transpose(-2, -1))
        else:
            scores = _F.bmm(q_scaled, k.transpose(-2, -1))
        weights = _F.softmax(scores, dim=-1)
        if dropout_p > 0.0:
            weights = _dropout(weights, dropout_p)
        out = _F.bmm(weights, v).transpose(0, 1).reshape(tgt_len * bsz, self.embed_dim)
        out = self._project_out(out, tgt_len, bsz)
        return out, weights.reshape(bsz, self.num_heads, tgt_len, k.shape[1])

    def _fused(self, q, k, v, attn_mask, dropout_p, is_causal, bsz, tgt_len):
        """The ``need_weights=False`` path, through ``scaled_dot_product_attention``."""
        H, src_len = self.num_heads, k.shape[1]
        if attn_mask is not None:
            if attn_mask.shape[0] == 1 and attn_mask.dim() == 3:
                attn_mask = attn_mask.unsqueeze(0)
            else:
                attn_mask = attn_mask.view(bsz, H, -1, src_len)
        q = q.view(bsz, H, tgt_len, self.head_dim)
        k = k.view(bsz, H, src_len, self.head_dim)
        v = v.view(bsz, H, src_len, self.head_dim)
        out = scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)
        out = out.permute(2, 0, 1, 3).reshape(bsz * tgt_len, self.embed_dim)
        return self._project_out(out, tgt_len, bsz), None
