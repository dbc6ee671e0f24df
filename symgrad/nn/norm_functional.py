"""``F.layer_norm``, ``F.batch_norm``, ``F.dropout``, ``F.embedding`` with torch's
signatures, checks and graphs (symgrad/ops/norm.py holds the ops).

batch_norm updates the running statistics in place as torch does: ``running = (1 -
momentum) * running + momentum * batch`` with the *unbiased* batch variance for
``running_var``; the module passes ``momentum=None`` as ``1 / num_batches_tracked`` (a
cumulative average). dropout multiplies by one mask drawn from symgrad's generator
(``sg.manual_seed``), scaled by ``1 / (1 - p)``: torch's graph (MulBackward0), not its
random numbers.
"""

from __future__ import annotations

from .. import dtypes as _dt
from ..autograd import no_grad
from ..autograd.function import apply
from ..ops import OPS
from ..ops._ints import u64
from ..tensor import Tensor

__all__ = ["layer_norm", "batch_norm", "dropout", "embedding"]


def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    shape = (int(normalized_shape),) if isinstance(normalized_shape, int) else \
        tuple(int(n) for n in normalized_shape)
    if tuple(input.shape[input.ndim - len(shape):]) != shape or input.ndim < len(shape):
        raise RuntimeError(f"Given normalized_shape={list(shape)}, expected input with shape "
                           f"[*, {', '.join(str(n) for n in shape)}], but got input of size"
                           f"{list(input.shape)}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise RuntimeError(f"Expected {name} to be of same shape as normalized_shape, but "
                               f"got {name} of shape {list(t.shape)} and normalized_shape = "
                               f"{list(shape)}")
    out = apply(OPS["native_layer_norm"], (input, weight, bias),
                {"normalized_shape": shape, "eps": float(eps), "_eps": float(eps)})
    return out[0]


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    if input.ndim < 2:
        raise ValueError(f"Expected 2D or 3D input (got {input.ndim}D input)")
    c = input.shape[1]
    if training:
        per_channel = input.numel() // c
        if per_channel <= 1:
            raise ValueError("Expected more than 1 value per channel when training, got input "
                             f"size {input.shape!r}")
    elif running_mean is None:
        raise RuntimeError("running_mean must be defined in evaluation mode")
    elif running_var is None:
        raise RuntimeError("running_var must be defined in evaluation mode")
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if t is not None and t.numel() != c:
            raise RuntimeError(f"{name} should contain {c} elements not {t.numel()}")
    out = apply(OPS["native_batch_norm"], (input, weight, bias),
                {"running_mean": running_mean, "running_var": running_var,
                 "training": bool(training), "eps": float(eps)})
    if training and running_mean is not None:
        _update_running(out, input, running_mean, running_var, momentum)
    return out[0]


def _update_running(out, input, running_mean, running_var, momentum) -> None:
    with no_grad():
        mean = out[1]
        var = input.detach().var((0,) + tuple(range(2, input.ndim)), correction=1)  # unbiased
        m = float(momentum)
        running_mean.mul_(1 - m).add_(mean.to(running_mean.dtype) * m)
        if running_var is not None:
            running_var.mul_(1 - m).add_(var.to(running_var.dtype) * m)


def dropout(input: Tensor, p: float = 0.5, training: bool = True,
            inplace: bool = False) -> Tensor:
    """``input * mask / (1 - p)`` with mask ~ Bernoulli(1 - p) (MulBackward0, as torch)."""
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if inplace:
        raise NotImplementedError("dropout(inplace=True) is not implemented")
    if not training or p == 0.0:
        return input
    from ..creation import rand

    if p == 1.0:
        mask = rand(*input.shape, dtype=input.dtype, device=input.device) * 0
    else:
        keep = rand(*input.shape, dtype=input.dtype, device=input.device) >= p
        mask = keep.to(input.dtype) * (1.0 / (1.0 - p))
    return input * mask


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None,
              max_norm: float | None = None, norm_type: float = 2.0,
              scale_grad_by_freq: bool = False, sparse: bool = False) -> Tensor:
    if max_norm is not None:
        raise NotImplementedError("embedding(max_norm=...) is not implemented in symgrad (it "
                                  "renormalises weight rows in place)")
    if sparse:
        raise NotImplementedError("embedding(sparse=True): symgrad has no sparse gradients")
    if input.dtype is not _dt.int64:
        from .._tensor_layer import TORCH_NAMES

        raise RuntimeError("Expected tensor for argument #1 'indices' to have one of the "
                           "following scalar types: Long, Int; but got "
                           f"symgrad.{TORCH_NAMES.get(input.dtype.name, '')}Tensor instead "
                           "(while checking arguments for embedding)")
    num = weight.shape[0]
    if padding_idx is not None:
        if not -num <= padding_idx < num:
            raise AssertionError("Padding_idx must be within num_embeddings")
        padding_idx = padding_idx % num
    if input.numel() and input.device.type != "cpu":  # on the CPU: the op's forward checks
        values = input.detach().cpu().numpy()
        if (values < 0).any() or (values >= num).any():
            raise IndexError("index out of range in self")
    return apply(OPS["embedding"], (weight,),
                 {"indices": input, "padding_idx": u64(-1 if padding_idx is None else
                                                       padding_idx),
                  "scale_grad_by_freq": bool(scale_grad_by_freq), "sparse": False,
                  "weight_sym_argsize_0": num})
