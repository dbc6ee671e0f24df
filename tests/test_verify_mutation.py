"""Seeded mutation test: plant a subtly wrong backward, the verifier must name that node.

Each case builds a small graph around one op, checks the correct engine verifies ``ok``,
then monkeypatches one backward formula in the op's ``OpSpec.grads`` (sign flip, a factor
off by 0.1%, a wrong broadcast reduction, a wrong axis) and asserts that ``verify()``
with default arguments reports ``first_bad_node`` as exactly the node of that op.
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad as sg
from symgrad.ops import OPS
from symgrad.ops.reduce import sum_backward


def _t(shape, seed, requires_grad=True, dtype=sg.float32, scale=1.0):
    rng = np.random.default_rng(seed)
    x = sg.tensor((rng.standard_normal(shape) * scale).astype(dtype.np))
    if requires_grad:
        x.requires_grad_(True)
    return x


def _find(root, name):
    """The unique node named ``name`` in root's graph."""
    found, stack, seen = [], [root.grad_fn], set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        if n.name() == name:
            found.append(n)
        stack.extend(m for m, _ in n.next_functions)
    assert len(found) == 1, (name, found)
    return found[0]


# Each case: (op name, input, wrong formula, builder returning root and target grad_fn name)
def _broadcast_add():
    x, b = _t((3, 4), 0), _t((4,), 1)
    return ((x * 1.5 + b).tanh()).sum(), "AddBackward0"


def _mul():
    x, w = _t((5,), 2), _t((5,), 3)
    return (x.sin() * w).sum(), "MulBackward0"


def _matmul():
    a, b = _t((3, 4), 4), _t((4, 2), 5)
    return (a @ b).tanh().sum(), "MmBackward0"


def _softmax():
    x = _t((2, 5), 6)
    w = _t((2, 5), 7, requires_grad=False)
    return (sg.softmax(x * 2, dim=1) * w).sum(), "SoftmaxBackward0"


def _logsumexp():
    x = _t((3, 4), 8)
    return (x.exp().logsumexp(dim=1) * sg.tensor([1.0, -2.0, 0.5])).sum(), "LogsumexpBackward0"


def _getitem_repeated():
    x = _t((5,), 9)
    idx = sg.tensor([0, 2, 2, 4, 0])
    return (x.sin()[idx] * sg.tensor([1.0, 2.0, 3.0, 4.0, 5.0])).sum(), "IndexBackward0"


def _view():
    x = _t((2, 3), 10)
    return (x.exp().view(3, 2) * sg.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])).sum(), \
        "ViewBackward0"


def _sum_keepdim():
    x = _t((3, 4), 11)
    return (x.sum(1, keepdim=True) * sg.tensor([[1.0], [-2.0], [3.0]])).tanh().sum(), \
        "SumBackward1"


def _exp():
    x = _t((4,), 12, scale=0.5)
    return (x * 2).exp().sum(), "ExpBackward0"


def _tanh():
    x = _t((4,), 13)
    return (x.tanh() * sg.tensor([1.0, 2.0, 3.0, 4.0])).sum(), "TanhBackward0"


def _div():
    x, y = _t((4,), 14), _t((4,), 15)
    return (x / (y.exp() + 1)).sum(), "DivBackward0"


def _transpose():
    x = _t((2, 3), 16)
    return (x.sin().transpose(0, 1) * sg.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])).sum(), \
        "TransposeBackward0"


def _mean_dim():
    x = _t((3, 4), 17)
    return (x.exp().mean(0) * sg.tensor([1.0, 2.0, 3.0, 4.0])).sum(), "MeanBackward1"


def _log_softmax():
    x = _t((2, 4), 18)
    return (sg.log_softmax(x, dim=0) * sg.tensor([[1.0, 0.0, 2.0, 1.0],
                                                   [0.0, 3.0, 1.0, 1.0]])).sum(), \
        "LogSoftmaxBackward0"


CASES = {
    # wrong broadcast reduction: mean instead of sum over the broadcast dim
    "broadcast add": ("add", "other", lambda grad, alpha: grad.mean(0), _broadcast_add),
    "mul sign flip": ("mul", "self", lambda grad, other: -(grad * other), _mul),
    "matmul 0.1%": ("mm", "self",
                    lambda grad, mat2, self_sym_sizes, self_sym_strides:
                    grad.mm(mat2.t()) * 1.001, _matmul),
    "softmax wrong axis": ("softmax", "self",
                           lambda grad, dim, result:
                           (grad - (grad * result).sum(1 - dim, keepdim=True)) * result,
                           _softmax),
    "logsumexp 0.1%": ("logsumexp", "self",
                       lambda grad, dim, keepdim, result, self:
                       grad.unsqueeze(1) * (self - result.unsqueeze(1)).exp() * 1.001,
                       _logsumexp),
    # repeated indices assigned instead of accumulated
    "getitem repeated": ("index", "self",
                         lambda grad, indices, self_sym_sizes:
                         _index_assign(grad, indices, self_sym_sizes), _getitem_repeated),
    "view wrong order": ("view", "self",
                         lambda grad, self_sym_sizes:
                         grad.t().reshape(self_sym_sizes), _view),
    "sum keepdim 0.1%": ("sum_dim", "self",
                         lambda grad, dim, keepdim, self_sym_sizes:
                         sum_backward(grad, self_sym_sizes, dim, keepdim) * 0.999,
                         _sum_keepdim),
    "exp 0.1%": ("exp", "self", lambda grad, result: grad * result * 1.001, _exp),
    "tanh sign flip": ("tanh", "self", lambda grad, result: grad * (1 + result * result),
                       _tanh),
    "div sign flip": ("div", "other", lambda grad, self, other: grad * self / (other * other),
                      _div),
    "transpose wrong axis": ("transpose", "self",
                             lambda grad, dim0, dim1: _wrong_transpose(grad, dim0, dim1),
                             _transpose),
    "mean_dim wrong count": ("mean_dim", "self",
                             lambda grad, dim, keepdim, self_sym_numel, self_sym_sizes:
                             sum_backward(grad, self_sym_sizes, dim, keepdim)
                             / self_sym_sizes[1], _mean_dim),
    "log_softmax wrong axis": ("log_softmax", "self",
                               lambda grad, dim, result:
                               grad - result.exp() * grad.sum(1 - dim, keepdim=True),
                               _log_softmax),
}


def _index_assign(grad, indices, self_sym_sizes):
    """Like index_backward, but repeated indices overwrite instead of adding up."""
    out = sg.zeros(tuple(self_sym_sizes), dtype=grad.dtype)
    data = out.numpy().copy()
    data[indices[0].numpy()] = grad.detach().numpy()
    return sg.tensor(data)


def _wrong_transpose(grad, dim0, dim1):
    """The right shape, but the elements of a transposed-and-reshaped grid (wrong axis)."""
    return grad.reshape(grad.shape[1], grad.shape[0])


def test_at_least_twelve_ops_are_mutated():
    assert len({c[0] for c in CASES.values()}) >= 12
    for op in ("add", "mul", "mm", "softmax", "logsumexp", "index", "view", "sum_dim"):
        assert any(c[0] == op for c in CASES.values()), op


@pytest.mark.parametrize("case", sorted(CASES))
def test_mutation_is_named_first_bad_node(case, monkeypatch):
    op, input_name, wrong, build = CASES[case]
    root, target_name = build()
    good = sg.verify(root)
    assert good.ok, str(good)
    assert good.first_bad_node is None
    # the formula must take the same saved operands as the registered one
    monkeypatch.setitem(OPS[op].grads, input_name, wrong)
    root, target_name = build()
    target = _find(root, target_name)
    rep = sg.verify(root)
    assert not rep.ok, str(rep)
    assert rep.first_bad_node is target, str(rep)
    bad = [r for r in rep.nodes if r.status in ("mismatch", "error")]
    assert [r.node for r in bad] == [target], str(rep)
    assert "local" in rep.ran


class _Cube(sg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x

    @staticmethod
    def sympy(x):
        return x ** 3


class _NoMeaning(sg.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin() * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * x.cos()


@pytest.mark.parametrize("cls", [_Cube, _NoMeaning])
def test_custom_function_mutation(cls, monkeypatch):
    def build():
        x = _t((4,), 20)
        return (cls.apply(x.tanh()) * sg.tensor([1.0, 2.0, -1.0, 0.5])).sum()

    good = sg.verify(build())
    assert good.ok, str(good)
    if cls.sympy is None:  # its forward is traced on symbols: exact, no finite differences
        assert good.mode == "exact" and not any("finite differences" in n for n in good.notes)
    original = cls.backward

    def wrong(ctx, grad):
        return original(ctx, grad) * 1.001

    monkeypatch.setattr(cls, "backward", staticmethod(wrong))
    root = build()
    target = _find(root, f"{cls.__name__}Backward")
    rep = sg.verify(root)
    assert not rep.ok
    assert rep.first_bad_node is target, str(rep)
