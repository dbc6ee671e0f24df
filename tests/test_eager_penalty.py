"""The "eager penalty" pattern: backward each penalty at once, keep only the backbone.

Several penalty terms branch off a shared backbone. Each is backpropagated right away
with ``retain_graph=True`` (so the backbone survives) and its references are dropped:
``memory_allocated`` must show each penalty branch freed at once (reference counting
alone: gc is off) while the backbone's saved activations stay, and the final
``loss.backward()`` must leave the same gradients as one combined backward (and as torch).
"""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg

B, D, N_PEN = 8, 16, 3
RNG = np.random.default_rng(11)
X = RNG.standard_normal((B, D)).astype(np.float32)
W1 = (RNG.standard_normal((D, D)) / 4).astype(np.float32)
W2 = (RNG.standard_normal((D, D)) / 4).astype(np.float32)
CS = [(RNG.standard_normal((D, D)) / 4).astype(np.float32) for _ in range(N_PEN)]
LAMBDAS = [0.1, 0.01, 0.5]
ACT = B * D * 4  # bytes of one float32 activation
# Roundings along w1's gradient (w2's takes fewer): the forward h1 and h2 (mm over D, tanh);
# the loss's backward (mean, 2 h2, tanh', mm over D, tanh', mm over the batch); a penalty's
# (h1 @ C over D, 2 lambda, mm over D, tanh', mm over the batch); the N_PEN + 1 sums of
# the contributions, in a different order eagerly than combined.
TERMS = 2 * (D + 2) + (2 + 3 + D + 3 + B) + (D + 2 + D + 3 + B) + N_PEN + 1


def _params(lib):
    return lib.tensor(W1, requires_grad=True), lib.tensor(W2, requires_grad=True)


def _backbone(lib, w1, w2):
    h1 = (lib.tensor(X) @ w1).tanh()
    h2 = (h1 @ w2).tanh()
    return h1, (h2 * h2).mean()


def _penalty(lib, h1, k):
    return (h1 @ lib.tensor(CS[k])).pow(2).sum() * LAMBDAS[k]


def _eager(lib, w1, w2, levels=None):
    h1, loss = _backbone(lib, w1, w2)
    mem = sg.memory_allocated
    if levels is not None:
        levels.append(("backbone", mem()))
    for k in range(N_PEN):
        p = _penalty(lib, h1, k)
        if levels is not None:
            levels.append(("branch", mem()))
        p.backward(retain_graph=True)
        del p  # the branch's nodes and saved tensors go now
        if levels is not None:
            levels.append(("after", mem()))
    loss.backward()
    return w1.grad.numpy().copy(), w2.grad.numpy().copy()


def test_eager_penalties_free_their_branches_keep_the_backbone_and_match_combined(torch,
                                                                                  no_gc):
    w1, w2 = _params(sg)
    start = sg.memory_allocated()
    levels = []
    eager = _eager(sg, w1, w2, levels)

    names = [n for n, _ in levels]
    assert names == ["backbone"] + ["branch", "after"] * N_PEN
    backbone = levels[0][1]
    grad_w1 = W1.nbytes  # the first penalty creates w1.grad; later ones add into it in place
    for i in range(N_PEN):
        branch, after = levels[1 + 2 * i][1], levels[2 + 2 * i][1]
        # a live branch holds C (saved by its mm), h1 @ C (saved by PowBackward0) and p
        assert branch - (backbone + (grad_w1 if i else 0)) == CS[i].nbytes + ACT + 4
        # after backward + del, only the backbone (and w1.grad) remain
        assert after == backbone + grad_w1
    # the backbone keeps x (saved by the first mm), h1 and h2 (saved by tanh, mm, mul) and
    # the loss until the final backward
    assert backbone - start == 3 * ACT + 4

    cw1, cw2 = _params(sg)
    h1, loss = _backbone(sg, cw1, cw2)
    total = loss
    for k in range(N_PEN):
        total = total + _penalty(sg, h1, k)
    total.backward()
    assert_close(eager[0], cw1.grad, terms=TERMS, msg="w1: eager vs combined")
    assert_close(eager[1], cw2.grad, terms=TERMS, msg="w2: eager vs combined")

    tw1, tw2 = _params(torch)
    teager = _eager(torch, tw1, tw2)
    assert_close(eager[0], teager[0], terms=TERMS, msg="w1: vs torch")
    assert_close(eager[1], teager[1], terms=TERMS, msg="w2: vs torch")


def test_backbone_is_freed_by_the_final_backward(no_gc):
    w1, w2 = _params(sg)
    before = sg.memory_allocated()
    h1, loss = _backbone(sg, w1, w2)
    p = _penalty(sg, h1, 0)
    p.backward(retain_graph=True)
    del p, h1
    loss.backward()  # no retain_graph: the backbone's saved tensors are released
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()
    kept = sg.memory_allocated() - before
    del loss
    assert sg.memory_allocated() - before == W1.nbytes + W2.nbytes  # just the two .grad
    assert kept >= W1.nbytes + W2.nbytes
