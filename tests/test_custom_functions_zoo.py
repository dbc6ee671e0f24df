"""A zoo of custom Functions written the way public libraries write them, proved exactly.

Activation functions, safe sqrt/log, sparsemax and sort-based entmax-1.5, a piecewise
linear spline with constant knots, quantisers, clamps with custom gradients, masked
softmax, top-k, Huber: each a ``torch.autograd.Function`` (torch is the oracle here) or a
symgrad ``Function``, verified through the documented path (``capture_torch`` +
``verify``). Their forwards use what made a third of such Functions fall back to finite
differences before: boolean-mask indexing and masked assignment, indices computed from the
values (sort, cumsum and a summed comparison, top-k, searchsorted), ``.item()`` of a constant
input, and tensor methods symgrad has no op for (``new_zeros``, ``round``, ``index_add_``).
Every correct one is proved in exact mode (no finite differences anywhere); a planted error
in five of them is a mismatch that names the Function's node.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is the test oracle")

import symgrad as sg  # noqa: E402

F = torch.autograd.Function
TF = torch.nn.functional


def _t(shape, seed, lo=-1.5, hi=1.5):
    return torch.tensor(np.random.default_rng(seed).uniform(lo, hi, size=shape),
                        dtype=torch.float64)


# -- torch Functions ------------------------------------------------------------------------
class Swish(F):
    """x * sigmoid(beta x) (a Python-float beta)."""

    @staticmethod
    def forward(ctx, x, beta):
        s = torch.sigmoid(beta * x)
        ctx.save_for_backward(x, s)
        ctx.beta = beta
        return x * s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        return g * (s + ctx.beta * x * s * (1 - s)), None


class SwishForgotGrad(Swish):
    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        return s + ctx.beta * x * s * (1 - s), None  # planted: grad_output forgotten


class Mish(F):
    """x * tanh(softplus(x))."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.tanh(TF.softplus(x))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        tsp = torch.tanh(TF.softplus(x))
        return g * (tsp + x * torch.sigmoid(x) * (1 - tsp * tsp))


_K = math.sqrt(2 / math.pi)


class GeluTanh(F):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return TF.gelu(x, approximate="tanh")

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        t = torch.tanh(_K * (x + 0.044715 * x ** 3))
        return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _K * (1 + 3 * 0.044715 * x * x))


class GeluTanhWrongConstant(GeluTanh):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        t = torch.tanh(_K * (x + 0.044715 * x ** 3))
        # planted: 0.044715 where the derivative of x^3 gives 3 * 0.044715
        return g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _K * (1 + 0.044715 * x * x))


class LeakyMasked(F):
    """Leaky ReLU by masked assignment: ``out[x < 0] *= slope``."""

    @staticmethod
    def forward(ctx, x, slope):
        ctx.save_for_backward(x)
        ctx.slope = slope
        out = x.clone()
        out[x < 0] *= slope
        return out

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        gx = g.clone()
        gx[x < 0] *= ctx.slope
        return gx, None


class EluWhere(F):
    @staticmethod
    def forward(ctx, x, alpha):
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return torch.where(x > 0, x, alpha * (torch.exp(x) - 1))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.where(x > 0, torch.ones_like(x), ctx.alpha * torch.exp(x)), None


class SafeSqrt(F):
    """sqrt where x > eps, 0 elsewhere (``out[m] = x[m].sqrt()`` into ``new_zeros``)."""

    @staticmethod
    def forward(ctx, x, eps):
        m = x > eps
        out = x.new_zeros(x.shape)
        out[m] = x[m].sqrt()
        ctx.save_for_backward(out, m)
        return out

    @staticmethod
    def backward(ctx, g):
        out, m = ctx.saved_tensors
        gx = torch.zeros_like(g)
        gx[m] = g[m] * 0.5 / out[m]
        return gx, None


class SafeLog(F):
    """log(x) where x > eps, log(eps) elsewhere (``result[x <= eps] = log(eps)``)."""

    @staticmethod
    def forward(ctx, x, eps):
        ctx.save_for_backward(x)
        ctx.eps = eps
        result = torch.log(x.clamp(min=eps))
        result[x <= eps] = math.log(eps)
        return result

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x > ctx.eps).to(g.dtype) / x.clamp(min=ctx.eps), None


class ClampCustomGrad(F):
    """clamp(x, lo, hi) with its (one-sided) derivative written out."""

    @staticmethod
    def forward(ctx, x, lo, hi):
        ctx.save_for_backward(x)
        ctx.lo, ctx.hi = lo, hi
        return x.clamp(lo, hi)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ((x >= ctx.lo) & (x <= ctx.hi)).to(g.dtype), None, None


class ClampWrongMask(ClampCustomGrad):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * ((x >= ctx.lo) | (x <= ctx.hi)).to(g.dtype), None, None  # planted: or


class ClampByItem(F):
    """clamp to ±limit where the limit is a constant tensor read with ``.item()``."""

    @staticmethod
    def forward(ctx, x, limit):
        lim = limit.item()
        ctx.save_for_backward(x)
        ctx.lim = lim
        return torch.clamp(x, -lim, lim) * 2

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * g * (x.abs() <= ctx.lim).to(g.dtype), None


class SafeDiv(F):
    """a / b with b kept away from 0 (both inputs differentiable)."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a / b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g / b, -g * a / (b * b)


class SafeDivSwapped(SafeDiv):
    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return -g * a / (b * b), g / b  # planted: the inputs' gradients swapped


class Sparsemax(F):
    """Sparsemax over the last dim (Martins & Astudillo): sort, cumsum, a support size from
    a summed comparison, and a gather at that computed index."""

    @staticmethod
    def forward(ctx, x):
        dim = -1
        zs, _ = torch.sort(x, dim=dim, descending=True)
        rng = torch.arange(1, x.size(dim) + 1, dtype=x.dtype)
        cs = zs.cumsum(dim)
        support = (1 + rng * zs) > cs
        k = support.sum(dim=dim, keepdim=True)
        tau = (cs.gather(dim, k - 1) - 1) / k.to(x.dtype)
        out = torch.clamp(x - tau, min=0)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        nz = (out > 0).to(g.dtype)
        v = (g * nz).sum(-1, keepdim=True) / nz.sum(-1, keepdim=True)
        return nz * (g - v)


class Entmax15(F):
    """Exact entmax with alpha = 1.5 by sorting (Peters, Niculae & Martins)."""

    @staticmethod
    def forward(ctx, x):
        dim = -1
        x = x / 2
        x = x - x.max(dim=dim, keepdim=True).values
        xs, _ = torch.sort(x, descending=True, dim=dim)
        rho = torch.arange(1, x.size(dim) + 1, dtype=x.dtype)
        mean = xs.cumsum(dim) / rho
        mean_sq = (xs ** 2).cumsum(dim) / rho
        ss = rho * (mean_sq - mean ** 2)
        delta = (1 - ss) / rho
        tau = mean - torch.sqrt(torch.clamp(delta, 0))
        support = (tau <= xs).sum(dim).unsqueeze(dim)
        tau_star = tau.gather(dim, support - 1)
        y = torch.clamp(x - tau_star, min=0) ** 2
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        gppr = y.sqrt()
        dx = g * gppr
        q = dx.sum(-1, keepdim=True) / gppr.sum(-1, keepdim=True)
        return dx - q * gppr  # d(clamp(x/2 - tau)^2) = 2 sqrt(y) * (1/2)


class MaskedSoftmax(F):
    """softmax over the positions a constant boolean mask keeps (masked_fill, then exp)."""

    @staticmethod
    def forward(ctx, x, mask):
        z = x.masked_fill(~mask, 0.0)
        m = z.max(dim=-1, keepdim=True).values
        e = torch.exp(z - m) * mask.to(x.dtype)
        y = e / e.sum(-1, keepdim=True)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return y * (g - (g * y).sum(-1, keepdim=True)), None


class SoftmaxSqueezeBug(F):
    """softmax over the last dim of a (B, 1, N) input; the backward squeezes every dim of
    size one where it meant only the reduced one."""

    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x, dim=-1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        s = (g * y).sum(-1).squeeze()  # planted: squeeze() where squeeze(-1) was meant
        return y * (g - s.unsqueeze(-1))


class SoftmaxSqueezeRight(SoftmaxSqueezeBug):
    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        s = (g * y).sum(-1, keepdim=True).squeeze(-1)
        return y * (g - s.unsqueeze(-1))


class Huber(F):
    """Huber loss per element against a constant target, by masked assignment."""

    @staticmethod
    def forward(ctx, pred, target, delta):
        d = pred - target
        loss = 0.5 * d ** 2
        big = d.abs() > delta
        loss[big] = delta * (d[big].abs() - 0.5 * delta)
        ctx.save_for_backward(d)
        ctx.delta = delta
        return loss

    @staticmethod
    def backward(ctx, g):
        (d,) = ctx.saved_tensors
        return g * d.clamp(-ctx.delta, ctx.delta), None, None


class TopKMean(F):
    """Mean of the k largest entries per row; the backward scatters into the indices."""

    @staticmethod
    def forward(ctx, x, k):
        vals, idx = x.topk(k, dim=-1)
        ctx.save_for_backward(idx)
        ctx.k, ctx.shape = k, x.shape
        return vals.mean(-1)

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        gx = g.new_zeros(ctx.shape)
        gx.scatter_(-1, idx, (g / ctx.k).unsqueeze(-1).expand(idx.shape).contiguous())
        return gx, None


class LinearSpline(F):
    """Piecewise-linear interpolation through learned values at constant knots: the
    segment index from searchsorted on the values, gathered, then index_add_ back."""

    @staticmethod
    def forward(ctx, x, knots, values):
        i = (torch.searchsorted(knots, x.detach()) - 1).clamp(0, knots.numel() - 2)
        h = knots[i + 1] - knots[i]
        t = (x - knots[i]) / h
        ctx.save_for_backward(i, t, h, values)
        return values[i] * (1 - t) + values[i + 1] * t

    @staticmethod
    def backward(ctx, g):
        i, t, h, values = ctx.saved_tensors
        gx = g * (values[i + 1] - values[i]) / h
        gv = torch.zeros_like(values)
        gv.index_add_(0, i, g * (1 - t))
        gv.index_add_(0, i + 1, g * t)
        return gx, None, gv


class FakeQuant(F):
    """Uniform fake quantisation with a learned step size: round(x / s) clamped, times s.
    The data x is a constant input; the derivative for s is the integer code (exact)."""

    @staticmethod
    def forward(ctx, x, s, qmax):
        q = torch.round(x / s).clamp(-qmax, qmax)
        ctx.save_for_backward(q)
        return q * s

    @staticmethod
    def backward(ctx, g):
        (q,) = ctx.saved_tensors
        return None, (g * q).sum().reshape(1), None


class L2Normalize(F):
    @staticmethod
    def forward(ctx, x):
        n = x.norm(dim=-1, keepdim=True)
        y = x / n
        ctx.save_for_backward(y, n)
        return y

    @staticmethod
    def backward(ctx, g):
        y, n = ctx.saved_tensors
        return (g - y * (g * y).sum(-1, keepdim=True)) / n


class MaxPool1d2(F):
    """Max over non-overlapping windows of 2 (unfold + max), backward by scatter_."""

    @staticmethod
    def forward(ctx, x):
        w = x.unfold(-1, 2, 2)
        y, idx = w.max(-1)
        ctx.save_for_backward(idx)
        ctx.shape = x.shape
        return y

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        gx = torch.zeros(ctx.shape, dtype=g.dtype)
        gx.view(*ctx.shape[:-1], -1, 2).scatter_(-1, idx.unsqueeze(-1), g.unsqueeze(-1))
        return gx


class RoundedResidual(F):
    """x - round(x) * step: the round is piecewise constant, so the derivative is 1."""

    @staticmethod
    def forward(ctx, x, step):
        return x - (x / step).round() * step

    @staticmethod
    def backward(ctx, g):
        return g, None


class ScatterByRank(F):
    """Each row's weighted entries written to the positions of their rank (``argsort``
    indices computed from the values, ``scatter_`` into ``x.new(shape).zero_()``)."""

    @staticmethod
    def forward(ctx, x, w):
        idx = x.argsort(dim=-1)
        out = x.new(x.shape).zero_()
        out.scatter_(-1, idx, x * w)
        ctx.save_for_backward(idx, x, w)
        return out

    @staticmethod
    def backward(ctx, g):
        idx, x, w = ctx.saved_tensors
        gg = g.gather(-1, idx)
        return gg * w, gg * x


class KeepRowMax(F):
    """Zero except each row's maximum (``index_put_`` at the argmax of each row)."""

    @staticmethod
    def forward(ctx, x):
        rows = torch.arange(x.shape[0])
        cols = x.argmax(dim=1)
        out = torch.zeros_like(x)
        out.index_put_((rows, cols), x[rows, cols] ** 2)
        ctx.save_for_backward(x, rows, cols)
        return out

    @staticmethod
    def backward(ctx, g):
        x, rows, cols = ctx.saved_tensors
        gx = torch.zeros_like(x)
        gx[rows, cols] = 2 * x[rows, cols] * g[rows, cols]
        return gx


# -- symgrad Functions ------------------------------------------------------------------------
SF = sg.autograd.Function


class SgSwish(SF):
    @staticmethod
    def forward(ctx, x):
        s = x.sigmoid()
        ctx.save_for_backward(x, s)
        return x * s

    @staticmethod
    def backward(ctx, g):
        x, s = ctx.saved_tensors
        return g * (s + x * s * (1 - s))


class SgSparsemax(SF):
    @staticmethod
    def forward(ctx, x):
        zs = x.sort(dim=-1, descending=True).values
        rng = sg.arange(1, x.shape[-1] + 1, dtype=x.dtype)
        cs = zs.cumsum(-1)
        k = ((1 + rng * zs) > cs).sum(-1, keepdim=True)
        tau = (cs.gather(-1, k - 1) - 1) / k.to(x.dtype)
        out = (x - tau).clamp(min=0)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        nz = (out > 0).to(g.dtype)
        v = (g * nz).sum(-1, keepdim=True) / nz.sum(-1, keepdim=True)
        return nz * (g - v)


class SgMaskedRelu6(SF):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        out = x.clone()
        out[x < 0] = 0.0
        out[x > 1] = 1.0
        return out * 6

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 6 * ((x >= 0) & (x <= 1)).to(g.dtype)


class SgSafeLog(SF):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return sg.where(x > 0.1, x.clamp(min=0.1).log(), x * 0 + math.log(0.1))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x > 0.1).to(g.dtype) / x.clamp(min=0.1)


class SgClampByItem(SF):
    @staticmethod
    def forward(ctx, x, limit):
        lim = limit.item()
        ctx.save_for_backward(x)
        ctx.lim = lim
        return x.clamp(-lim, lim)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x.abs() <= ctx.lim).to(g.dtype), None


# -- running them -----------------------------------------------------------------------------
def _torch_case(fn, *inputs, diff=None):
    """``fn.apply`` under capture, float tensor inputs at ``diff`` (default: every float
    tensor) requiring grad; the root is the outputs' weighted sum."""
    args, names = [], {}
    for j, a in enumerate(inputs):
        if isinstance(a, torch.Tensor) and a.dtype.is_floating_point and (
                diff is None or j in diff):
            a = a.clone().requires_grad_(True)
            names[f"in{j}"] = a
        args.append(a)
    with sg.capture_torch():
        out = fn.apply(*args)
    w = torch.tensor(np.random.default_rng(7).uniform(0.5, 1.5, size=tuple(out.shape)),
                     dtype=out.dtype)
    return (out * w).sum(), names


def _sg_case(fn, *inputs, diff=None):
    args, names = [], {}
    for j, a in enumerate(inputs):
        if isinstance(a, torch.Tensor):
            a = sg.tensor(a.numpy(), dtype=sg.float64 if a.dtype == torch.float64 else None)
            if a.dtype.is_floating_point and (diff is None or j in diff):
                a.requires_grad_(True)
                names[f"in{j}"] = a
        args.append(a)
    out = fn.apply(*args)
    w = sg.tensor(np.random.default_rng(7).uniform(0.5, 1.5, size=tuple(out.shape)),
                  dtype=out.dtype)
    _KEEP[:] = args  # the graph keeps no reference to an input that needs no grad
    return (out * w).sum(), names


_KEEP: list = []


_KNOTS = torch.tensor([-2.0, -0.5, 0.25, 1.0, 2.0], dtype=torch.float64)
_MASK = torch.tensor([[True, True, False, True], [False, True, True, True]])

#: (Function, inputs, differentiable positions or None, builder)
CORRECT = [
    (Swish, lambda: (_t((2, 3), 0), 1.7), None, _torch_case),
    (Mish, lambda: (_t((5,), 1),), None, _torch_case),
    (GeluTanh, lambda: (_t((5,), 2),), None, _torch_case),
    (LeakyMasked, lambda: (_t((6,), 3), 0.1), None, _torch_case),
    (EluWhere, lambda: (_t((6,), 4), 1.3), None, _torch_case),
    (SafeSqrt, lambda: (_t((6,), 5, -1.0, 2.0), 1e-3), None, _torch_case),
    (SafeLog, lambda: (_t((6,), 6, -1.0, 2.0), 1e-2), None, _torch_case),
    (ClampCustomGrad, lambda: (_t((6,), 7), -0.6, 0.8), None, _torch_case),
    (ClampByItem, lambda: (_t((6,), 8), torch.tensor(0.7, dtype=torch.float64)), (0,),
     _torch_case),
    (SafeDiv, lambda: (_t((4,), 9), _t((4,), 10, 0.5, 2.0)), None, _torch_case),
    (Sparsemax, lambda: (_t((2, 5), 11, -1.0, 1.0),), None, _torch_case),
    (Entmax15, lambda: (_t((2, 5), 12, -2.0, 2.0),), None, _torch_case),
    (MaskedSoftmax, lambda: (_t((2, 4), 13), _MASK), None, _torch_case),
    (SoftmaxSqueezeRight, lambda: (_t((3, 1, 4), 14),), None, _torch_case),
    (Huber, lambda: (_t((6,), 15, -2.0, 2.0), _t((6,), 16), 0.8), (0,), _torch_case),
    (TopKMean, lambda: (_t((2, 5), 17), 2), None, _torch_case),
    (LinearSpline, lambda: (_t((6,), 18, -1.9, 1.9), _KNOTS, _t((5,), 19)), (0, 2),
     _torch_case),
    (FakeQuant, lambda: (_t((6,), 20, -2.0, 2.0), torch.tensor([0.3], dtype=torch.float64),
                         4), (1,), _torch_case),
    (L2Normalize, lambda: (_t((2, 3), 21),), None, _torch_case),
    (MaxPool1d2, lambda: (_t((2, 6), 22),), None, _torch_case),
    (RoundedResidual, lambda: (_t((5,), 23), 0.5), None, _torch_case),
    (ScatterByRank, lambda: (_t((2, 4), 29), _t((2, 4), 30)), None, _torch_case),
    (KeepRowMax, lambda: (_t((3, 4), 31),), None, _torch_case),
    (SgSwish, lambda: (_t((2, 3), 24),), None, _sg_case),
    (SgSparsemax, lambda: (_t((2, 5), 25, -1.0, 1.0),), None, _sg_case),
    (SgMaskedRelu6, lambda: (_t((6,), 26, -0.5, 1.5),), None, _sg_case),
    (SgSafeLog, lambda: (_t((6,), 27, -1.0, 2.0),), None, _sg_case),
    (SgClampByItem, lambda: (_t((6,), 28), torch.tensor(0.7, dtype=torch.float64)), (0,),
     _sg_case),
]

PLANTED = [  # (buggy Function, the correct one's case)
    (SwishForgotGrad, Swish),
    (SoftmaxSqueezeBug, SoftmaxSqueezeRight),
    (GeluTanhWrongConstant, GeluTanh),
    (ClampWrongMask, ClampCustomGrad),
    (SafeDivSwapped, SafeDiv),
]


def _case(fn):
    return next(c for c in CORRECT if c[0] is fn)


def _node_name(fn) -> str:
    return f"{fn.__name__}Backward"


def test_the_zoo_is_large_enough():
    assert len(CORRECT) >= 20 and len(PLANTED) >= 5
    assert sum(1 for c in CORRECT if c[3] is _sg_case) >= 3
    assert all(getattr(c[0], "sympy", None) is None for c in CORRECT)  # traced, not told


@pytest.mark.parametrize("fn, inputs, diff, build", CORRECT, ids=[c[0].__name__ for c in CORRECT])
def test_correct_functions_are_proved_exactly(fn, inputs, diff, build):
    root, names = build(fn, *inputs(), diff=diff)
    rep = sg.verify(root, names=names)
    assert rep.ok and rep.status == "ok", str(rep)
    assert rep.mode == "exact", (rep.mode, rep.notes)  # not finite differences
    assert not any("finite differences" in n or "could not be traced" in n
                   for n in rep.notes), rep.notes
    assert names and all(lf.status == "ok" for lf in rep.leaves), str(rep)
    assert {lf.name for lf in rep.leaves} == set(names)


@pytest.mark.parametrize("bug, good", PLANTED, ids=[p[0].__name__ for p in PLANTED])
def test_planted_errors_are_caught_and_named(bug, good):
    _, inputs, diff, build = _case(good)
    root, names = build(bug, *inputs(), diff=diff)
    rep = sg.verify(root, names=names)
    assert not rep.ok and rep.status == "mismatch", str(rep)
    assert rep.mode == "exact", (rep.mode, rep.notes)
    assert rep.first_bad_node is not None and rep.first_bad_node.name() == _node_name(bug), \
        str(rep)
    row = next(n for n in rep.nodes if n.name == _node_name(bug))
    assert row.status == "mismatch", str(rep)


def test_data_dependent_structure_is_noted_as_decided_at_the_recorded_values():
    root, names = _torch_case(Sparsemax, _t((2, 5), 11, -1.0, 1.0))
    rep = sg.verify(root, names=names)
    note = next(n for n in rep.notes if n.startswith("SparsemaxBackward"))
    assert "decided at the recorded values" in note
    assert "sort order" in note and "comparisons" in note
    root, names = _torch_case(RoundedResidual, _t((5,), 23), 0.5)
    rep = sg.verify(root, names=names)
    assert any("round" in n and "decided at the recorded values" in n for n in rep.notes), \
        rep.notes


def test_the_local_mode_proves_them_symbolically_too():
    for fn in (Sparsemax, LinearSpline, ClampByItem, SgSparsemax):
        _, inputs, diff, build = _case(fn)
        root, names = build(fn, *inputs(), diff=diff)
        rep = sg.verify(root, names=names, mode="local")
        row = next(n for n in rep.nodes if n.name == _node_name(fn))
        assert rep.ok and row.status == "ok", str(rep)
        assert "traced on symbols" in row.formula, row.formula


def test_a_constant_input_stays_a_number():
    # ``limit`` does not require grad: ``.item()`` of it is a Python float inside the trace
    seen = []

    class Probe(ClampByItem):
        @staticmethod
        def forward(ctx, x, limit):
            seen.append(type(limit.item()))
            return ClampByItem.forward(ctx, x, limit)

    root, names = _torch_case(Probe, _t((4,), 8), torch.tensor(0.7, dtype=torch.float64),
                              diff=(0,))
    rep = sg.verify(root, names=names)
    assert rep.ok and rep.mode == "exact", str(rep)
    assert float in seen[1:] and all(t is float for t in seen), seen


_OUTSIDE = torch.zeros(4, dtype=torch.float64)  # a torch tensor made outside the forward


class WritesIntoOutside(F):
    @staticmethod
    def forward(ctx, x):
        buf = _OUTSIDE.clone()  # a real torch tensor: it cannot hold expressions
        buf[x > 0] = x[x > 0]
        return buf

    @staticmethod
    def backward(ctx, g):
        return g


def test_writing_symbols_into_an_outside_tensor_is_refused_not_silently_wrong():
    root, names = _torch_case(WritesIntoOutside, _t((4,), 32))
    rep = sg.verify(root, names=names)
    assert rep.mode == "local", str(rep)  # checked by finite differences, with the note
    note = next(n for n in rep.notes if "could not be traced" in n)
    assert "buf[x > 0] = x[x > 0]" in note and "made outside the traced forward" in note
    assert not rep.ok and rep.first_bad_node.name() == "WritesIntoOutsideBackward"
