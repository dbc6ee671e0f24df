"""Attention on the cuda device (numba's simulator in CI, a GPU where one exists) equals cpu."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg

# softmax, scaling, mask add and two matmuls of length <= 8 (plus the backward's chain)
TERMS = 48


def _leaves(device: str, *arrays):
    return [sg.tensor(a, device=device, requires_grad=True) for a in arrays]


@pytest.mark.parametrize("ev", [3, 4], ids=["fused-node", "math-path"])
@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"attn_mask": "bool"}])
def test_sdpa_on_cuda_equals_cpu(kw, ev):
    """Value head dim 3 (= query's): torch's fused node on both devices; 4: the math path."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in ((2, 2, 4, 3), (2, 2, 5, 3), (2, 2, 5, ev))]
    keep = rng.random((4, 5)) > 0.4
    keep[0] = False  # a fully masked row
    results = {}
    for dev in ("cpu", "cuda"):
        q, k, v = _leaves(dev, *arrays)
        kwd = {n: (sg.tensor(keep, device=dev) if x == "bool" else x) for n, x in kw.items()}
        out = sg.nn.functional.scaled_dot_product_attention(q, k, v, **kwd)
        fused = out.grad_fn.name() == "ScaledDotProductFlashAttentionForCpuBackward0"
        assert fused == (ev == 3), out.grad_fn.name()
        (out * out).sum().backward()
        results[dev] = [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]
    for got, want in zip(results["cuda"], results["cpu"]):
        assert_close(got, want, terms=TERMS)


@pytest.mark.parametrize("need_weights", [True, False])
def test_multihead_attention_on_cuda_equals_cpu(need_weights):
    sg.manual_seed(0)
    cpu = sg.nn.MultiheadAttention(8, 2, batch_first=True).double()
    cuda = sg.nn.MultiheadAttention(8, 2, batch_first=True).double()
    cuda.load_state_dict(cpu.state_dict())
    cuda.to("cuda")
    x = np.random.default_rng(1).standard_normal((2, 4, 8))
    pad = np.zeros((2, 4), dtype=bool)
    pad[:, -1] = True
    results = {}
    for dev, mha in (("cpu", cpu), ("cuda", cuda)):
        (xt,) = _leaves(dev, x)
        out, _ = mha(xt, xt, xt, key_padding_mask=sg.tensor(pad, device=dev),
                     need_weights=need_weights)
        (out * out).sum().backward()
        results[dev] = [out.detach().cpu(), xt.grad.cpu()] + [
            p.grad.cpu() for p in mha.parameters()]
    for got, want in zip(results["cuda"], results["cpu"]):
        assert_close(got, want, terms=TERMS)
