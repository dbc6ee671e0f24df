"""``Embedding(padding_idx=...)``: torch gives the padding row no gradient, and the verifier's
meaning says the same (the row is a constant there), so a correct graph is ok in every mode
and dtype, and a backward that forgets the padding row is caught (issue 31)."""

from __future__ import annotations

import pytest

import symgrad as sg
import symgrad.ops.norm as norm_ops


def _loss(dtype):
    sg.manual_seed(0)
    emb = sg.nn.Embedding(5, 3, padding_idx=0).to(dtype)
    with sg.no_grad():  # the padding row starts at zero; give it values so a leak shows
        emb.weight[0] = sg.tensor([0.5, -1.5, 2.0], dtype=dtype)
    idx = sg.tensor([[0, 2, 0], [1, 4, 2]])
    return (emb(idx) ** 2).sum(), emb.weight


@pytest.mark.parametrize("mode", ["exact", "local"])
@pytest.mark.parametrize("dtype", [sg.float32, sg.float64])
def test_padding_row_is_no_false_alarm(mode, dtype):
    loss, weight = _loss(dtype)
    loss.backward(retain_graph=True)
    assert (weight.grad[0] == 0).all()
    report = sg.verify(loss, names={"w": weight}, mode=mode)
    assert report.ok, report


@pytest.mark.parametrize("mode", ["exact", "local"])
def test_a_backward_that_forgets_the_padding_row_is_caught(monkeypatch, mode):
    real = norm_ops.embedding_backward

    def forgets_padding(grad, indices, padding_idx, scale_grad_by_freq, size):
        return real(grad, indices, -1, scale_grad_by_freq, size)

    monkeypatch.setattr(norm_ops, "embedding_backward", forgets_padding)
    loss, weight = _loss(sg.float64)
    loss.backward(retain_graph=True)
    assert not (weight.grad[0] == 0).all()  # the planted bug is live
    report = sg.verify(loss, names={"w": weight}, mode=mode)
    assert not report.ok
    if mode == "local":
        assert report.first_bad_node is not None
        assert "EmbeddingBackward0" in str(report.first_bad_node)
