"""nanoGPT's model (Karpathy's model.py: pre-norm blocks of causal self-attention and a GELU
MLP named c_attn/c_proj/c_fc, learned positions from ``arange``, tied embedding), written
once for either library: ``gpt(L, ...)`` builds it with ``L`` = ``symgrad`` or ``torch``.

The one definition the tests (``_gpt_tiny.py``, test_compile_models.py) and the benchmarks
(bench_compile.py, bench_verify_models.py, which put tests/ on ``sys.path``) build their
nanoGPT-shaped models from. It imports neither library itself: a benchmark worker that
times torch alone does not load symgrad. ``flash=False`` is nanoGPT's explicit causal mask
(a ``bias`` buffer, ``masked_fill``, softmax) instead of ``scaled_dot_product_attention``;
``dropout=p`` adds nanoGPT's Dropout modules (None: none); ``tie_weights=False`` keeps
``wte`` and ``lm_head`` apart. ``forward(idx, targets)`` returns the cross-entropy loss.
"""

from __future__ import annotations

import functools
import math
import types


@functools.cache
def gpt_classes(L) -> types.SimpleNamespace:
    """The model's classes for library ``L`` (made once per library: all models built
    from one library share their classes, as repeated-block folding expects)."""
    nn = L.nn
    F = nn.functional

    class CausalSelfAttention(nn.Module):
        def __init__(self, n_embd: int, n_head: int, block_size: int, flash: bool = True,
                     dropout: float | None = None) -> None:
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)
            self.n_head, self.n_embd, self.flash, self.p = n_head, n_embd, flash, dropout
            if dropout is not None:
                self.resid_dropout = nn.Dropout(dropout)
            if not flash:
                self.register_buffer("bias", L.tril(L.ones(block_size, block_size))
                                     .view(1, 1, block_size, block_size))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            if self.flash:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                                   is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                att = F.softmax(att, dim=-1)
                y = att @ v
            y = self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return y if self.p is None else self.resid_dropout(y)

    class MLP(nn.Module):
        def __init__(self, n_embd: int, dropout: float | None = None) -> None:
            super().__init__()
            self.c_fc = nn.Linear(n_embd, 4 * n_embd)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * n_embd, n_embd)
            self.p = dropout
            if dropout is not None:
                self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            y = self.c_proj(self.gelu(self.c_fc(x)))
            return y if self.p is None else self.dropout(y)

    class Block(nn.Module):
        def __init__(self, n_embd: int, n_head: int, block_size: int, flash: bool = True,
                     dropout: float | None = None) -> None:
            super().__init__()
            self.ln_1 = nn.LayerNorm(n_embd)
            self.attn = CausalSelfAttention(n_embd, n_head, block_size, flash, dropout)
            self.ln_2 = nn.LayerNorm(n_embd)
            self.mlp = MLP(n_embd, dropout)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, vocab: int = 3, block_size: int = 2, n_layer: int = 2,
                     n_head: int = 1, n_embd: int = 4, *, flash: bool = True,
                     dropout: float | None = None, tie_weights: bool = True) -> None:
            super().__init__()
            self.wte = nn.Embedding(vocab, n_embd)
            self.wpe = nn.Embedding(block_size, n_embd)
            self.p = dropout
            if dropout is not None:
                self.drop = nn.Dropout(dropout)
            self.h = nn.ModuleList([Block(n_embd, n_head, block_size, flash, dropout)
                                    for _ in range(n_layer)])
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab, bias=False)
            if tie_weights:
                self.wte.weight = self.lm_head.weight

        def forward(self, idx, targets):
            b, t = idx.size()
            pos = L.arange(0, t, dtype=L.long)
            x = self.wte(idx) + self.wpe(pos)
            if self.p is not None:
                x = self.drop(x)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return types.SimpleNamespace(CausalSelfAttention=CausalSelfAttention, MLP=MLP,
                                 Block=Block, GPT=GPT)


def gpt(L, vocab: int = 3, block_size: int = 2, n_layer: int = 2, n_head: int = 1,
        n_embd: int = 4, **options):
    """A nanoGPT-shaped model of library ``L`` (defaults: the tiny one the verifier's
    tests use); ``options``: ``flash``, ``dropout``, ``tie_weights``."""
    return gpt_classes(L).GPT(vocab, block_size, n_layer, n_head, n_embd, **options)
