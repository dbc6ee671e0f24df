"""tests/_nanogpt.py, the one nanoGPT-shaped model the tests and benchmarks build: the same
definition in torch and symgrad gives the same loss and gradients with equal weights, in
each variant its users take (sdpa or the explicit causal mask, tied or untied embedding,
Dropout(0.0) modules or none), and it loads neither library itself."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from _nanogpt import gpt
from _tolerance import assert_close, magnitude

import symgrad as sg

torch = pytest.importorskip("torch", reason="PyTorch is the test oracle")

SIZES = dict(vocab=7, block_size=4, n_layer=2, n_head=2, n_embd=8)


@pytest.mark.parametrize("options", [
    {}, {"flash": False, "tie_weights": False}, {"dropout": 0.0}])
def test_torch_and_symgrad_models_agree(options):
    torch.manual_seed(0)
    tm = gpt(torch, **SIZES, **options).double()
    sm = gpt(sg, **SIZES, **options).double()
    state = tm.state_dict()
    assert list(sm.state_dict()) == list(state)
    assert ("h.0.attn.bias" in state) == (options.get("flash") is False)
    tied = tm.wte.weight is tm.lm_head.weight
    assert tied == options.get("tie_weights", True) and \
        (sm.wte.weight is sm.lm_head.weight) == tied
    assert any(type(m).__name__ == "Dropout" for m in sm.modules()) == ("dropout" in options)
    sm.load_state_dict({k: sg.tensor(v.detach().numpy().copy()) for k, v in state.items()})
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 7, (3, 4)), rng.integers(0, 7, (3, 4))
    tl, sl = tm(torch.tensor(x), torch.tensor(y)), sm(sg.tensor(x), sg.tensor(y))
    tl.backward()
    sl.backward()
    # a forward of 2 blocks: matmuls of length 4 * n_embd, softmaxes, a mean over 12 rows
    terms = SIZES["n_layer"] * (4 * SIZES["n_embd"] + 3 * SIZES["n_embd"]) + 12
    assert_close(sl, tl, terms=terms)
    # a gradient sums products of O(1) normalised activations with weights and upstream
    # gradients: relative to the largest of those anywhere in the model (it can cancel)
    params = list(tm.parameters())
    scale = magnitude(*(p.grad for p in params), *params, 1.0)
    for tp, sp in zip(params, sm.parameters()):
        assert_close(sp.grad, tp.grad, terms=2 * terms, scale=scale)


def test_the_definition_imports_neither_library():
    here = str(pathlib.Path(__file__).parent)
    code = (f"import sys; sys.path.insert(0, {here!r}); import _nanogpt; "
            "print(sorted(m for m in ('torch', 'symgrad') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == "[]"
