"""A nanoGPT-shaped model small enough for the verifier in tests (blocks of the real
structure: pre-norm, causal attention, GELU MLP named c_fc/c_proj, tied embedding): the
one definition in ``_nanogpt.py`` at its smallest size."""

from __future__ import annotations

from _nanogpt import gpt

import symgrad as sg


def tiny_gpt_loss(seed: int = 0):
    """``(model, loss)`` of a 2-block GPT (vocab 3, 2 tokens, n_embd 4, 1 head) in float64
    on one batch of 2 tokens."""
    sg.manual_seed(seed)
    model = gpt(sg).double()
    idx = sg.randint(0, 3, (1, 2))
    targets = sg.randint(0, 3, (1, 2))
    return model, model(idx, targets)
