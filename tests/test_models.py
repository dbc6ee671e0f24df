"""Issue 21's acceptance: the layers of real models, step by step against torch.

A LeNet-shaped CNN (conv, relu, max-pool, linear, cross-entropy, SGD with momentum) and a
one-block transformer (embedding, multi-head attention, LayerNorm, a GELU MLP,
cross-entropy, AdamW) start from the same weights as their torch twins and take the same
steps on the same data: losses, parameters and gradients agree after every step, and
``sg.verify(loss, mode="local")`` passes on both graphs. Float64, so the comparison bounds
stay close to the arithmetic (see the terms at each assertion).
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg

torch = pytest.importorskip("torch")

STEPS = 3


def _copy_weights(sg_model, torch_model) -> None:
    state = {k: sg.tensor(v.detach().numpy().copy()) for k, v in torch_model.state_dict().items()}
    sg_model.load_state_dict(state)


def _lenet(L):
    nn = L.nn
    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10))


class _Block:
    """One pre-norm transformer block and a token classifier, for either library."""

    def __init__(self, L, vocab=12, d=8, heads=2, hidden=16):
        nn = L.nn
        self.L = L
        self.emb = nn.Embedding(vocab, d)
        self.ln1 = nn.LayerNorm(d)
        # no projection biases: attention is invariant to the key bias, so its gradient is
        # rounding noise, which Adam would scale up to full-size steps in either library
        self.attn = nn.MultiheadAttention(d, heads, bias=False, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))
        self.head = nn.Linear(d, vocab)
        self.model = nn.ModuleDict({"emb": self.emb, "ln1": self.ln1, "attn": self.attn,
                                    "ln2": self.ln2, "mlp": self.mlp, "head": self.head})

    def __call__(self, tokens):
        x = self.emb(tokens)
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        x = x + a
        x = x + self.mlp(self.ln2(x))
        return self.head(x)


def _batch_lenet():
    rng = np.random.default_rng(0)
    return rng.standard_normal((8, 1, 28, 28)), rng.integers(0, 10, 8)


def _batch_tokens():
    rng = np.random.default_rng(1)
    return rng.integers(0, 12, (3, 5)), rng.integers(0, 12, (3, 5))


def _train(L, model, params, opt, inputs, target, forward, verify=False):
    x = L.tensor(inputs)
    y = L.tensor(target)
    losses, grads = [], []
    reports = []
    for _ in range(STEPS):
        opt.zero_grad()
        # the verifier reads values the backward never saved (attention's masks): record
        with L.record() if verify else contextlib.nullcontext():
            out = forward(x)
            loss = L.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                 y.reshape(-1))
        loss.backward()
        if verify and not reports:  # the first step's graph (each step's is the same shape)
            t0 = time.perf_counter()
            reports.append(L.verify(loss, mode="local"))
            print(f"verify(mode='local'): {time.perf_counter() - t0:.1f} s")
        losses.append(float(loss.detach()))
        grads.append([p.grad.detach().numpy().copy() for p in params])
        opt.step()
    return losses, grads, [p.detach().numpy().copy() for p in params], reports


def test_lenet_matches_torch_step_by_step_and_verifies():
    torch.manual_seed(0)
    tm = _lenet(torch).double()
    sm = _lenet(sg).double()
    _copy_weights(sm, tm)
    x, y = _batch_lenet()
    tp, sp = list(tm.parameters()), list(sm.parameters())
    t_losses, t_grads, t_final, _ = _train(
        torch, tm, tp, torch.optim.SGD(tp, lr=0.05, momentum=0.9), x, y, tm)
    s_losses, s_grads, s_final, reports = _train(
        sg, sm, sp, sg.optim.SGD(sp, lr=0.05, momentum=0.9), x, y, sm, verify=True)
    # the longest reduction: 256-long dot products after 150-long convolutions, summed over
    # the batch; a few roundings per step
    terms = 256 + 150 + 8
    assert_close(np.array(s_losses), np.array(t_losses), terms=terms)
    for step in range(STEPS):
        for g, tg in zip(s_grads[step], t_grads[step]):
            assert_close(g, tg, terms=terms * (step + 1), scale=magnitude(tg))
    for p, tp_ in zip(s_final, t_final):
        assert_close(p, tp_, terms=terms * STEPS, scale=magnitude(tp_))
    assert all(r.ok for r in reports), str(next(r for r in reports if not r.ok))


def test_transformer_block_matches_torch_step_by_step_and_verifies():
    torch.manual_seed(0)
    tb = _Block(torch)
    tb.model.double()
    sb = _Block(sg)
    sb.model.double()
    _copy_weights(sb.model, tb.model)
    tokens, target = _batch_tokens()
    tp, sp = list(tb.model.parameters()), list(sb.model.parameters())
    t_losses, t_grads, t_final, _ = _train(
        torch, tb.model, tp, torch.optim.AdamW(tp, lr=0.01), tokens, target, tb)
    s_losses, s_grads, s_final, reports = _train(
        sg, sb.model, sp, sg.optim.AdamW(sp, lr=0.01), tokens, target, sb, verify=True)
    # reductions of 16 (MLP), 8 (attention, LayerNorm), 15 tokens and 12 classes; Adam
    # divides by sqrt(v), so a parameter's rounding follows its gradient's relative rounding
    terms = 16 + 8 + 15 + 12
    assert_close(np.array(s_losses), np.array(t_losses), terms=terms)
    for step in range(STEPS):
        for g, tg in zip(s_grads[step], t_grads[step]):
            assert_close(g, tg, terms=terms * (step + 1), scale=magnitude(tg))
    for p, tp_ in zip(s_final, t_final):
        assert_close(p, tp_, terms=terms * STEPS, scale=magnitude(tp_) + 0.01 * STEPS)
    assert all(r.ok for r in reports), str(next(r for r in reports if not r.ok))
