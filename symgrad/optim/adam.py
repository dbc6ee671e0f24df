"""Adam (and AMSGrad): torch's single-tensor update, operation for operation."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..backends.cpu.backend import PARALLEL_MIN
from ..tensor import Tensor
from ._common import param_backend, scalar_state
from .optimizer import Optimizer, bump_step, check_flags

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    """``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``, as ``torch.optim.Adam``.

    ``m`` moves by ``lerp(m, g, 1 - b1)`` and ``v`` by ``b2 * v + (1 - b2) * g * g``; weight
    decay adds ``wd * p`` to the gradient (L2) unless ``decoupled_weight_decay`` (AdamW).
    """

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None,
                 decoupled_weight_decay: bool = False) -> None:
        check_flags(differentiable)
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if not (all(isinstance(b, float) for b in betas[:2])
                or all(isinstance(b, Tensor) for b in betas[:2])):
            raise ValueError("betas must be either both floats or both Tensors")
        for i, b in enumerate(betas[:2]):
            if isinstance(b, Tensor):
                if not capturable and foreach:
                    raise ValueError(f"betas[{i}] as a Tensor is not supported for "
                                     "capturable=False and foreach=True")
                if b.numel() != 1:
                    raise ValueError(f"Tensor betas[{i}] must be 1-element")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps,
                                  "weight_decay": weight_decay, "amsgrad": amsgrad,
                                  "maximize": maximize, "foreach": foreach,
                                  "capturable": capturable, "differentiable": differentiable,
                                  "fused": fused,
                                  "decoupled_weight_decay": decoupled_weight_decay})

    def _init_state(self, p: Tensor, amsgrad: bool, fused: bool | None = False) -> dict:
        from ..creation import zeros_like

        state = {"step": scalar_state(0.0, fused=fused), "exp_avg": zeros_like(p),
                 "exp_avg_sq": zeros_like(p)}
        if amsgrad:
            state["max_exp_avg_sq"] = zeros_like(p)
        self.state[p] = state
        return state

    def step(self, closure=None):
        loss = self._loss_of(closure)
        for group in self.param_groups:
            lr = float(group["lr"])
            # as torch: hyperparameters meet the arrays as Python numbers do (weak scalars,
            # rounded to the arrays' dtype); a NumPy float64 would make NumPy compute in
            # float64, and a NumPy scalar meeting a 0-d array gives no array to write into
            beta1, beta2 = (_number(b) for b in group["betas"])
            eps = _number(group["eps"])
            wd = _number(group["weight_decay"])
            amsgrad = group["amsgrad"]
            for p in group["params"]:
                grad = p._grad
                if grad is None:
                    continue
                be = param_backend(p)
                state = self.state.get(p) or self._init_state(p, amsgrad, group["fused"])
                step = bump_step(state["step"])
                g = grad._data
                if group["maximize"]:
                    g = be.neg(g)
                m = state["exp_avg"]._data
                v = state["exp_avg_sq"]._data
                if not amsgrad and be.name in _NUMPY_BACKENDS and _plain(p._data, g, m, v):
                    if be.name == "cpu" and _loop_ok(p._data, g, m, v, beta1, beta2, eps, wd):
                        _update_loop(p._data, g, m, v, step, lr, beta1, beta2, eps, wd,
                                     group["decoupled_weight_decay"])
                    else:
                        _update_numpy(p._data, g, m, v, step, lr, beta1, beta2, eps, wd,
                                      group["decoupled_weight_decay"])
                    p._storage.version += 1
                    state["exp_avg"]._storage.version += 1
                    state["exp_avg_sq"]._storage.version += 1
                    continue
                if wd != 0:
                    if group["decoupled_weight_decay"]:
                        be.mul_(p._data, 1 - lr * wd)
                    else:
                        g = be.add(g, be.mul(p._data, wd))
                be.add_(m, be.mul(be.sub(g, m), 1 - beta1))  # lerp_(g, 1 - beta1), weight < 0.5
                be.mul_(v, beta2)
                be.add_(v, be.mul(be.mul(g, 1 - beta2), g))  # addcmul_(g, g, value=1 - beta2)
                bias_correction1 = 1 - beta1 ** step
                bias_correction2 = 1 - beta2 ** step
                step_size = lr / bias_correction1
                bias_correction2_sqrt = bias_correction2 ** 0.5
                if amsgrad:
                    vmax = state["max_exp_avg_sq"]._data
                    be.copy_(vmax, be.maximum(vmax, v))
                    state["max_exp_avg_sq"]._storage.version += 1
                    v = vmax
                denom = be.add(be.div(be.sqrt(v), bias_correction2_sqrt), eps)
                be.add_(p._data, be.div(be.mul(m, -step_size), denom))  # addcdiv_
                p._storage.version += 1
                state["exp_avg"]._storage.version += 1
                state["exp_avg_sq"]._storage.version += 1
        return loss


class AdamW(Adam):
    """Adam with decoupled weight decay (``p *= 1 - lr * wd`` before the moments), as
    ``torch.optim.AdamW``: the same class as Adam with ``decoupled_weight_decay=True`` and
    ``weight_decay=1e-2`` by default."""

    def __init__(self, params: Iterable, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)

    def load_state_dict(self, state_dict: dict) -> None:
        """As torch: a loaded AdamW stays decoupled whatever the checkpoint says."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group["decoupled_weight_decay"] = True


def _number(x):
    """A hyperparameter as a Python number: NumPy scalars and one-element tensors (torch
    takes both where it takes a float) become floats."""
    if type(x) is float or type(x) is int:
        return x
    return float(x.item() if isinstance(x, Tensor) else x)


#: backends whose arrays are NumPy arrays computed by NumPy's ufuncs below PARALLEL_MIN
_NUMPY_BACKENDS = frozenset(("numpy", "cpu"))
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _plain(p, g, m, v) -> bool:
    """Arrays the ufunc update below takes: NumPy, one float dtype, below the size where
    the CPU backend switches to its parallel loops."""
    return (type(p) is np.ndarray and type(g) is np.ndarray and type(m) is np.ndarray
            and type(v) is np.ndarray and p.dtype in _FLOATS and g.dtype is p.dtype
            and m.dtype is p.dtype and v.dtype is p.dtype and p.size < PARALLEL_MIN)


def _update_numpy(p, g, m, v, step: float, lr: float, beta1: float, beta2: float,
                  eps: float, wd: float, decoupled: bool) -> None:
    """The single-tensor update of ``Adam.step`` as NumPy ufuncs writing into the state and
    one scratch array: the same operations on the same values in the same order as the
    backend calls (Python floats meet the arrays as NumPy's weak scalars either way), so
    the result is bit for bit the same, with ~13 ufunc calls instead of ~14 backend calls
    and their temporaries per parameter."""
    if p.ndim == 0:  # ufuncs on 0-d arrays return scalars: one-element views instead
        p, g, m, v = p.reshape(1), g.reshape(1), m.reshape(1), v.reshape(1)
    with np.errstate(all="ignore"):  # the backend's div and sqrt are quiet too
        if wd != 0:
            if decoupled:
                np.multiply(p, 1 - lr * wd, out=p)
            else:
                g = np.add(g, np.multiply(p, wd))
        tmp = np.subtract(g, m)
        np.multiply(tmp, 1 - beta1, out=tmp)
        np.add(m, tmp, out=m)  # lerp_(g, 1 - beta1), weight < 0.5
        np.multiply(v, beta2, out=v)
        np.multiply(g, 1 - beta2, out=tmp)
        np.multiply(tmp, g, out=tmp)
        np.add(v, tmp, out=v)  # addcmul_(g, g, value=1 - beta2)
        step_size = lr / (1 - beta1 ** step)
        bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
        denom = np.sqrt(v)
        np.divide(denom, bias_correction2_sqrt, out=denom)
        np.add(denom, eps, out=denom)
        np.multiply(m, -step_size, out=tmp)
        np.divide(tmp, denom, out=tmp)
        np.add(p, tmp, out=p)  # addcdiv_


def _loop_ok(p, g, m, v, *hyper) -> bool:
    """The CPU backend's arrays the one-pass loop below takes: one shape, C-contiguous, the
    gradient not sharing memory with the state (the ufuncs finish each operation over the
    whole array before the next; the loop does all of them per element), and Python
    numbers as hyperparameters (NumPy's weak scalars: rounded to the arrays' dtype; a NumPy
    float64 scalar would compute in float64 in the ufuncs)."""
    for h in hyper:
        if type(h) is not float and type(h) is not int:
            return False
    return (p.shape == g.shape == m.shape == v.shape
            and p.flags.c_contiguous and g.flags.c_contiguous and m.flags.c_contiguous
            and v.flags.c_contiguous and not np.may_share_memory(g, p)
            and not np.may_share_memory(g, m) and not np.may_share_memory(g, v))


_ADAM_LOOP: list = []
#: the step-independent scalars of the loop per (dtype, lr, betas, eps, wd), already
#: rounded to the dtype (NumPy scalars cost ~0.2 µs each to make, nine a parameter)
_ADAM_SCALARS: dict = {}


def _update_loop(p, g, m, v, step: float, lr: float, beta1: float, beta2: float,
                 eps: float, wd: float, decoupled: bool) -> None:
    """``_update_numpy`` as one pass over the elements: sg.compile's Adam loop
    (symgrad/compile/fuse.py's ``adam_update``: one definition for both), which does the
    ufuncs' operations per element in their order, on the scalars rounded to the dtype as
    NumPy rounds weak scalars: the same bits, without ~13 array passes per parameter."""
    if not _ADAM_LOOP:
        from ..compile.fuse import loops

        _ADAM_LOOP.append(loops().adam_update)
    dt = p.dtype.type
    key = (dt, lr, beta1, beta2, eps, wd)
    consts = _ADAM_SCALARS.get(key)
    if consts is None:
        if len(_ADAM_SCALARS) > 64:  # a learning-rate schedule: keep the cache small
            _ADAM_SCALARS.clear()
        consts = _ADAM_SCALARS[key] = (dt(1 - beta1), dt(beta2), dt(1 - beta2), dt(eps),
                                       dt(wd), dt(1 - lr * wd))
    c1, b2, c2, eps_, wd_, decay = consts
    mode = 0 if wd == 0 else (1 if not decoupled else 2)
    if p.ndim != 1:
        p, g, m, v = p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1)
    _ADAM_LOOP[0](p, g, m, v, c1, b2, c2, dt(-(lr / (1 - beta1 ** step))),
                  dt((1 - beta2 ** step) ** 0.5), eps_, wd_, mode, decay)
