"""``symgrad.nn.functional``: layers and losses as functions, with torch's arguments.

Each function checks its arguments the way PyTorch does (same exception types and key
words) and calls one registered op, so the grad_fn names match torch's:
``linear`` is ``AddmmBackward0`` with a bias on 2-D input, ``cross_entropy`` is
``NllLossBackward0`` over ``LogSoftmaxBackward0``.
"""

from __future__ import annotations

import warnings

from .. import dtypes as _dt
from .. import functional as _F
from .._tensor_layer import TORCH_NAMES
from ..autograd.function import apply
from ..ops import OPS
from ..tensor import Tensor

__all__ = ["linear", "relu", "tanh", "sigmoid", "softmax", "log_softmax", "mse_loss",
           "binary_cross_entropy_with_logits", "nll_loss", "cross_entropy", "l1_loss",
           "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "kl_div"]

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def _reduction_enum(reduction: str) -> int:
    try:
        return _REDUCTIONS[reduction]
    except (KeyError, TypeError):
        raise ValueError(f"{reduction} is not a valid value for reduction") from None


def _check_tensor(x, fn: str, arg: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}(): argument '{arg}' (position 1) must be Tensor, not "
                        f"{type(x).__name__}")


# -- layers ----------------------------------------------------------------------------------
_ADDMM = OPS["addmm"]
_T_OP = OPS["t"]
_VIEW_OP = OPS["view"]
_UNIT = {"beta": 1, "alpha": 1}


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias``; torch's dispatch: addmm for 2-D input with a bias."""
    if bias is not None and isinstance(input, Tensor):  # the hot case, checked cheaply
        x, w, b = input._data, weight._data, bias._data
        if w.ndim == 2 and b.ndim == 1 and x.ndim >= 2 and x.shape[-1] == w.shape[1] \
                and b.shape[0] == w.shape[0] and x.dtype == w.dtype == b.dtype:
            if x.ndim == 2:
                return apply(_ADDMM, (bias, input, apply(_T_OP, (weight,))), _UNIT)
            if x.flags.c_contiguous and x.shape[-1]:  # (no C: reshape's -1 error below)
                # the general route below without its checks: a view to rows (what
                # reshape does for a contiguous input), addmm, and a view back
                lead = x.shape[:-1]
                rows = 1
                for n in lead:
                    rows *= n
                flat = apply(_VIEW_OP, (input,), {"size": (rows, x.shape[-1])})
                out = apply(_ADDMM, (bias, flat, apply(_T_OP, (weight,))), _UNIT)
                if out._data.flags.c_contiguous:
                    return apply(_VIEW_OP, (out,), {"size": lead + (w.shape[0],)})
                return _F.reshape(out, lead + (w.shape[0],))
    _check_tensor(input, "linear", "input")
    if input.ndim == 0:
        raise RuntimeError("both arguments to linear need to be at least 1D, but they are 0D "
                           f"and {weight.ndim}D")
    if input.shape[-1] != weight.shape[-1]:
        rows = input.numel() // max(input.shape[-1], 1)
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({rows}x"
                           f"{input.shape[-1]} and {weight.shape[-1]}x{weight.shape[0]})")
    if bias is None:  # torch: matmul (mm, or a folded mm under UnsafeViewBackward0)
        return _F.matmul(input, _F.t(weight))
    if input.dtype is not weight.dtype or bias.dtype is not weight.dtype:
        other = input.dtype if input.dtype is not weight.dtype else bias.dtype
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got "
                           f"{_torch_name(other)} and {_torch_name(weight.dtype)}")
    if input.ndim == 2:
        return addmm(bias, input, _F.t(weight))
    if not input.is_contiguous():  # torch: matmul, then the bias added (AddBackward0)
        return _F.matmul(input, _F.t(weight)) + bias
    lead = tuple(input.shape[:-1])
    out = addmm(bias, _F.reshape(input, (-1, input.shape[-1])), _F.t(weight))
    return _F.reshape(out, lead + (weight.shape[0],))


def _torch_name(d) -> str:
    return TORCH_NAMES[d.name]


def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * (mat1 @ mat2)`` (``AddmmBackward0``)."""
    if mat1.ndim != 2 or mat2.ndim != 2:
        raise RuntimeError(f"mat1 must be a matrix, got {mat1.ndim}-D tensor" if mat1.ndim != 2
                           else f"mat2 must be a matrix, got {mat2.ndim}-D tensor")
    if mat1.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({mat1.shape[0]}x"
                           f"{mat1.shape[1]} and {mat2.shape[0]}x{mat2.shape[1]})")
    out_shape = (mat1.shape[0], mat2.shape[1])
    shape = tuple(input.shape)
    pairs = zip(shape[::-1], out_shape[::-1], strict=False)
    if len(shape) > 2 or any(s not in (1, o) for s, o in pairs):
        raise RuntimeError(f"The expanded size of the tensor ({out_shape[-1]}) must match the "
                           f"existing size ({shape[-1] if shape else 1}) at non-singleton "
                           f"dimension 1.  Target sizes: {list(out_shape)}.  Tensor sizes: "
                           f"{list(shape)}")
    return apply(OPS["addmm"], (input, mat1, mat2), {"beta": beta, "alpha": alpha})


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """``max(input, 0)``. ``inplace=True`` is accepted but computes out of place."""
    return _F.relu(input)


def tanh(input: Tensor) -> Tensor:
    return _F.tanh(input)


def sigmoid(input: Tensor) -> Tensor:
    return _F.sigmoid(input)


def silu(input: Tensor, inplace: bool = False) -> Tensor:
    """``x * sigmoid(x)`` (``SiluBackward0``). ``inplace=True`` computes out of place."""
    _require_tensor("silu", input)
    return apply(OPS["silu"], (input,))


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta x)) / beta``, ``x`` where ``beta x > threshold`` (torch's
    numerics; ``SoftplusBackward0`` saves beta, self and threshold)."""
    _require_tensor("softplus", input)
    _require_number("softplus", "beta", beta)
    _require_number("softplus", "threshold", threshold)
    return apply(OPS["softplus"], (input,), {"beta": beta, "threshold": threshold})


def _require_tensor(fn: str, input) -> None:
    if not isinstance(input, Tensor):
        raise TypeError(f"{fn}(): argument 'input' (position 1) must be Tensor, not "
                        f"{type(input).__name__}")


def _require_number(fn: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{fn}(): argument '{name}' must be Number, not "
                        f"{type(value).__name__}")


#: torch's kernel names in its "not implemented for 'Long'" errors
_KERNEL_NAMES = {"gelu": "GeluKernelImpl", "gelu_tanh": "GeluKernelImpl",
                 "leaky_relu": "leaky_relu_cpu", "elu": "elu_cpu",
                 "logsigmoid": "log_sigmoid_cpu"}


def _activation(op: str, input: Tensor, **params) -> Tensor:
    """An activation op; those torch computes on floating tensors only refuse others with
    torch's message."""
    if op in _KERNEL_NAMES and not input.dtype.is_floating_point:
        raise NotImplementedError(f'"{_KERNEL_NAMES[op]}" not implemented for '
                                  f"'{TORCH_NAMES.get(input.dtype.name, input.dtype.name)}'")
    return apply(OPS[op], (input,), params)


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """``x * Phi(x)``; ``approximate="tanh"`` is torch's tanh form (``GeluBackward0``)."""
    _require_tensor("gelu", input)
    if approximate not in ("none", "tanh"):
        raise RuntimeError("approximate argument must be either none or tanh.")
    return _activation("gelu" if approximate == "none" else "gelu_tanh", input,
                       approximate=approximate)


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    """``x`` above 0, ``negative_slope * x`` below. ``inplace=True`` computes out of place."""
    _require_tensor("leaky_relu", input)
    _require_number("leaky_relu", "negative_slope", negative_slope)
    return _activation("leaky_relu", input, negative_slope=negative_slope)


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """``x`` above 0, ``alpha * (exp(x) - 1)`` below (``EluBackward0``, scale 1)."""
    _require_tensor("elu", input)
    _require_number("elu", "alpha", alpha)
    return _activation("elu", input, alpha=alpha, scale=1, input_scale=1)


def logsigmoid(input: Tensor) -> Tensor:
    """``log(sigmoid(x))`` without overflow (``LogSigmoidBackward0``)."""
    _require_tensor("logsigmoid", input)
    return _activation("logsigmoid", input)


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0,
             inplace: bool = False) -> Tensor:
    """``clamp(x, min_val, max_val)``; the gradient passes strictly inside the bounds."""
    _require_tensor("hardtanh", input)
    _require_number("hardtanh", "min_val", min_val)
    _require_number("hardtanh", "max_val", max_val)
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    return _activation("hardtanh", input, min_val=min_val, max_val=max_val)


def softmax(input: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    """``exp(x) / sum(exp(x), dim)`` (``SoftmaxBackward0``); torch's warning when dim is None."""
    return _F.softmax(input, dim, dtype)


def log_softmax(input: Tensor, dim: int | None = None, dtype=None) -> Tensor:
    """``x - logsumexp(x, dim)`` (``LogSoftmaxBackward0``)."""
    return _F.log_softmax(input, dim, dtype)


# -- losses ----------------------------------------------------------------------------------
_MSE = OPS["mse_loss"]
_MEAN = {"reduction": 1}


def mse_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
             reduction: str = "mean", weight=None) -> Tensor:
    """Mean squared error (``MseLossBackward0``); broadcasts with torch's warning."""
    if weight is not None:
        raise NotImplementedError("mse_loss(weight=...) is not supported")
    if size_average is None and reduce is None and reduction == "mean" \
            and isinstance(input, Tensor) and isinstance(target, Tensor):
        a, b = input._data, target._data  # the hot case: same shapes, floating dtypes
        if a.shape == b.shape and a.dtype.kind == "f" and b.dtype.kind == "f":
            return apply(_MSE, (input, target), _MEAN)
    red = _reduction_enum(_legacy_reduction(size_average, reduce, reduction))
    _check_tensor(input, "mse_loss", "input")
    _check_tensor(target, "mse_loss", "target")
    if tuple(target.shape) != tuple(input.shape):
        warnings.warn(
            f"Using a target size ({target.shape!r}) that is different to the input size "
            f"({input.shape!r}). This will likely lead to incorrect results due to "
            "broadcasting. Please ensure they have the same size.", UserWarning, stacklevel=2)
        shape = _broadcast_shape(input.shape, target.shape)
        input, target = _F.expand(input, shape), _F.expand(target, shape)
    floats = [t.dtype.is_floating_point for t in (input, target)]
    if not any(floats):  # torch promotes first; only an all-integer pair has no kernel
        promoted = _dt.promote([(t.dtype, t.ndim == 0) for t in (input, target)])
        raise NotImplementedError(f'"mse_cpu" not implemented for \'{_torch_name(promoted)}\'')
    if not floats[1]:  # an integer target (class values, counts) is promoted, as torch does
        target = target.to(input.dtype)
    elif not floats[0]:
        input = input.to(target.dtype)
    return apply(OPS["mse_loss"], (input, target), {"reduction": red})


def _legacy_reduction(size_average, reduce, reduction: str) -> str:
    """``reduction`` from torch's deprecated ``size_average``/``reduce``, with its warning."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    ret = "none" if not reduce else ("mean" if size_average else "sum")
    warnings.warn(f"size_average and reduce args will be deprecated, please use reduction='{ret}' "
                  "instead.", UserWarning, stacklevel=3)
    return ret


def _broadcast_shape(a, b) -> tuple[int, ...]:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        if da != db and da != 1 and db != 1:
            raise RuntimeError(f"The size of tensor a ({da}) must match the size of tensor b "
                               f"({db}) at non-singleton dimension {max(len(a), len(b)) - i}")
        out.append(max(da, db) if 0 not in (da, db) else 0)
    return tuple(reversed(out))


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     size_average=None, reduce=None, reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """Sigmoid + binary cross entropy, one stable op (BinaryCrossEntropyWithLogitsBackward0)."""
    red = _reduction_enum(_legacy_reduction(size_average, reduce, reduction))
    _check_tensor(input, "binary_cross_entropy_with_logits", "input")
    _check_tensor(target, "binary_cross_entropy_with_logits", "target")
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Target size ({target.shape!r}) must be the same as input size "
                         f"({input.shape!r})")
    for name, extra in (("weight", weight), ("pos_weight", pos_weight)):
        if extra is not None:
            _check_tensor(extra, "binary_cross_entropy_with_logits", name)
            _broadcast_shape(extra.shape, input.shape)
            if extra.device != input.device:
                raise RuntimeError("Expected all tensors to be on the same device, but found "
                                   f"at least two devices, {extra.device} and {input.device}!")
    return apply(OPS["binary_cross_entropy_with_logits"], (input, target),
                 {"weight": weight, "pos_weight": pos_weight, "reduction": red})


def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
             ignore_index: int = -100, reduce=None, reduction: str = "mean") -> Tensor:
    """Negative log likelihood over class scores: input (C,) or (N, C) (``NllLossBackward0``),
    (N, C, H, W) (``NllLoss2DBackward0``), other (N, C, d1, ...) viewed as (N, C, 1, -1) first,
    as torch's nll_loss_nd does."""
    red = _reduction_enum(_legacy_reduction(size_average, reduce, reduction))
    _check_tensor(input, "nll_loss", "input")
    _check_tensor(target, "nll_loss", "target")
    if input.ndim == 0:
        raise ValueError("Expected 1 or more dimensions (got 0)")
    if input.ndim > 2:
        return _nll_loss_nd(input, target, weight, ignore_index, red)
    if input.ndim == 2 and (target.ndim != 1 or target.shape[0] != input.shape[0]):
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target "
                         f"batch_size ({target.shape[0] if target.ndim else 1}).")
    if target.dtype.name != "int64":  # before the 1-D shape check, as torch
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got "
                           f"{_torch_name(target.dtype)}")
    if input.ndim == 1 and target.ndim != 0:
        raise RuntimeError("1D target tensor expects 1D input tensors, but found inputs with "
                           f"sizes {list(input.shape)} and {list(target.shape)}.")
    _nll_checks(input, target, weight, ignore_index)
    out = apply(OPS["nll_loss"], (input,), {"target": target, "weight": weight,
                                            "reduction": red, "ignore_index": ignore_index})
    return out[0]


def _nll_checks(input: Tensor, target: Tensor, weight, ignore_index: int) -> None:
    """What every nll_loss form checks before a kernel: dtype, weight size, device, range."""
    if target.dtype.name != "int64":
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got "
                           f"{_torch_name(target.dtype)}")
    n_classes = input.shape[1] if input.ndim > 1 else input.shape[0]
    if weight is not None:
        _check_tensor(weight, "nll_loss", "weight")
        if weight.numel() != n_classes:
            raise RuntimeError(f"weight tensor should be defined either for all {n_classes} "
                               f"classes or no classes but got weight tensor of shape: "
                               f"{list(weight.shape)}")
    if target.device != input.device:
        raise RuntimeError("Expected all tensors to be on the same device, but found at least "
                           f"two devices, {target.device} and {input.device}!")
    _check_targets(target, n_classes, ignore_index)


def _nll_loss_nd(input: Tensor, target: Tensor, weight, ignore_index: int, red: int) -> Tensor:
    """(N, C, d1, ...): torch's nll_loss_nd, with its views and its errors."""
    if target.ndim == 0 or input.shape[0] != target.shape[0]:
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target "
                         f"batch_size ({target.shape[0] if target.ndim else 1}).")
    n, c = input.shape[0], input.shape[1]
    out_size = [n, *input.shape[2:]]
    if input.ndim == 4:
        if tuple(target.shape) != (n, *input.shape[2:]):
            raise RuntimeError(f"size mismatch (got input: {list(input.shape)} , target: "
                               f"{list(target.shape)}")
    elif tuple(target.shape[1:]) != tuple(input.shape[2:]):
        raise RuntimeError(f"Expected target size {out_size}, got {list(target.shape)}")
    _nll_checks(input, target, weight, ignore_index)
    x, t = input, target
    if input.ndim != 4:
        empty = input.numel() == 0
        x = _F.reshape(input.contiguous(), (n, c, 0, 0) if empty else (n, c, 1, -1))
        t = _F.reshape(target.contiguous(), (n, 0, 0) if target.numel() == 0 else (n, 1, -1))
    out = apply(OPS["nll_loss2d"], (x,), {"target": t, "weight": weight, "reduction": red,
                                           "ignore_index": ignore_index})[0]
    if input.ndim != 4 and red == 0:
        out = _F.reshape(out, tuple(out_size))
    return out


def _check_targets(target: Tensor, n_classes: int, ignore_index: int) -> None:
    """Out-of-range class indices never reach a kernel (torch: IndexError)."""
    import numpy as np

    from ..backends import backend_for

    t = np.asarray(backend_for(target.device.type).to_host(target._data))
    bad = t[(t != ignore_index) & ((t < 0) | (t >= n_classes))]
    if bad.size:
        raise IndexError(f"Target {int(bad.flat[0])} is out of bounds.")


def cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                  size_average=None, ignore_index: int = -100, reduce=None,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """torch's cross_entropy: class indices (``nll_loss(log_softmax(input, 1))``) or, when
    target has input's shape, class probabilities; ``label_smoothing`` composed as torch's
    C++ does (so the graph shows AddBackward0 over two MulBackward1)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    red = _reduction_enum(reduction)
    _check_tensor(input, "cross_entropy", "input")
    _check_tensor(target, "cross_entropy", "target")
    class_dim = 0 if input.ndim == 1 else 1
    if tuple(input.shape) == tuple(target.shape):  # class probabilities
        if not target.dtype.is_floating_point:
            raise RuntimeError("Expected floating point type for target with class "
                               f"probabilities, got {_torch_name(target.dtype)}")
        if ignore_index >= 0:
            raise RuntimeError("ignore_index is not supported for floating point target")
        return _cross_entropy_probs(input, target, weight, red, label_smoothing, class_dim)
    if label_smoothing > 0.0:
        _check_label_smoothing(label_smoothing)
        return _cross_entropy_smoothed(input, target, weight, reduction, ignore_index,
                                       label_smoothing, class_dim)
    return nll_loss(log_softmax(input, class_dim), target, weight, ignore_index=ignore_index,
                    reduction=reduction)


def _check_label_smoothing(label_smoothing: float) -> None:
    if label_smoothing > 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: "
                           f"{label_smoothing:g}")


def _weight_view(weight: Tensor, ndim: int, class_dim: int) -> Tensor:
    shape = [1] * ndim
    shape[class_dim] = weight.shape[0]
    return _F.reshape(weight, tuple(shape))


def _cross_entropy_probs(input, target, weight, red, label_smoothing, class_dim):
    """``-(log_softmax(x) * t [* w]).sum()`` reduced as torch's cross_entropy_loss_prob_target."""
    logp = log_softmax(input, class_dim)
    n_classes = input.shape[class_dim]
    if label_smoothing > 0.0:
        _check_label_smoothing(label_smoothing)
        target = _F.add(apply(OPS["mul_scalar"], (target,), {"other": 1 - label_smoothing}),
                        label_smoothing / n_classes)
    prod = logp * target
    if weight is not None:
        prod = prod * _weight_view(weight, logp.ndim, class_dim)
    if red == 0:
        return -_F.sum(prod, class_dim)
    total = -_F.sum(prod)
    if red == 2:
        return total
    if input.numel() == 0:
        return total * float("nan")
    return apply(OPS["div_scalar"], (total,), {"other": input.numel() // n_classes})


def _cross_entropy_smoothed(input, target, weight, reduction, ignore_index, label_smoothing,
                            class_dim):
    """torch's cross_entropy_loss_label_smoothing: ``(1 - ls) nll + ls / C * smooth``."""
    logp = log_softmax(input, class_dim)
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    n_classes = logp.shape[class_dim]
    if weight is not None:
        smooth = -_F.sum(logp * _weight_view(weight, logp.ndim, class_dim), class_dim)
    else:
        smooth = -_F.sum(logp, class_dim)
    ignore_mask = _F.eq(target, ignore_index)
    smooth = apply(OPS["masked_fill"], (smooth,), {"mask": ignore_mask, "value": 0.0})
    if reduction == "mean":
        keep = _F.logical_not(ignore_mask)
        if weight is not None:
            from ..autograd.grad_mode import no_grad

            with no_grad():
                denom = _F.sum(weight[target[keep]])
            ret = _F.sum(smooth) / denom
        else:
            ret = _F.sum(smooth) / _F.sum(keep)
    elif reduction == "sum":
        ret = _F.sum(smooth)
    else:
        ret = smooth
    mul = OPS["mul_scalar"]
    return apply(mul, (nll,), {"other": 1 - label_smoothing}) + \
        apply(mul, (ret,), {"other": label_smoothing / n_classes})


# -- regression losses -----------------------------------------------------------------------
def _check_floating(input: Tensor, kernel: str) -> None:
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f'"{kernel}" not implemented for '
                                  f"'{_torch_name(input.dtype)}'")


def _broadcast_pair(input: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """torch's size warning, then ``broadcast_tensors(input, target)``."""
    if tuple(target.shape) != tuple(input.shape):
        warnings.warn(
            f"Using a target size ({target.shape!r}) that is different to the input size "
            f"({input.shape!r}). This will likely lead to incorrect results due to "
            "broadcasting. Please ensure they have the same size.", UserWarning, stacklevel=3)
        shape = _broadcast_shape(input.shape, target.shape)
        if tuple(input.shape) != shape:
            input = _F.expand(input, shape)
        if tuple(target.shape) != shape:
            target = _F.expand(target, shape)
    return input, target


def _reduce_tensor(x: Tensor, red: int) -> Tensor:
    """torch's apply_loss_reduction: ``mean()`` / ``sum()`` / as is."""
    if red == 1:
        return _F.mean(x)
    return _F.sum(x) if red == 2 else x


def _weighted_reduction(loss: Tensor, weight: Tensor, reduction: str, mean_by_weight: bool):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return _F.sum(loss)
    if reduction == "mean":
        return _F.sum(loss) / _F.sum(weight) if mean_by_weight else _F.mean(loss)
    raise ValueError(f"Invalid reduction mode: {reduction}. Expected one of 'none', 'mean', "
                     "'sum'.")


def l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
            reduction: str = "mean", weight: Tensor | None = None) -> Tensor:
    """Mean absolute error, composed as torch's is: ``|input - target|`` then mean/sum
    (MeanBackward0 over AbsBackward0 over SubBackward0; no node of its own)."""
    _check_tensor(input, "l1_loss", "input")
    _check_tensor(target, "l1_loss", "target")
    reduction = _legacy_reduction(size_average, reduce, reduction)
    input, target = _broadcast_pair(input, target)
    if weight is not None:
        if tuple(weight.shape) != tuple(input.shape):
            raise ValueError("Weights and input must have the same size.")
        return _weighted_reduction(_F.abs(_F.sub(input, target)) * weight, weight, reduction,
                                   True)
    red = _reduction_enum(reduction)
    return _reduce_tensor(_F.abs(_F.sub(input, target)), red)


def smooth_l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """Huber-like loss scaled by ``1/beta`` (``SmoothL1LossBackward0``); ``beta=0`` is
    ``l1_loss``, as in torch."""
    _check_tensor(input, "smooth_l1_loss", "input")
    _check_tensor(target, "smooth_l1_loss", "target")
    reduction = _legacy_reduction(size_average, reduce, reduction)
    input, target = _broadcast_pair(input, target)
    red = _reduction_enum(reduction)
    if beta == 0.0:
        return _reduce_tensor(_F.abs(_F.sub(input, target)), red)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    _check_floating(input, "smooth_l1_cpu")
    return apply(OPS["smooth_l1_loss"], (input, target), {"reduction": red, "beta": beta})


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    """Quadratic below ``delta``, linear above (``HuberLossBackward0``)."""
    _check_tensor(input, "huber_loss", "input")
    _check_tensor(target, "huber_loss", "target")
    input, target = _broadcast_pair(input, target)
    red = _reduction_enum(reduction) if weight is None else 0
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    _check_floating(input, "huber_cpu")
    if weight is not None and tuple(weight.shape) != tuple(input.shape):
        raise ValueError("Weights and input must have the same size.")
    loss = apply(OPS["huber_loss"], (input, target), {"reduction": red, "delta": delta})
    if weight is None:
        return loss
    return _weighted_reduction(loss * weight, weight, reduction, False)


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """``-w (t log x + (1 - t) log(1 - x))`` on probabilities, logs clamped at -100
    (``BinaryCrossEntropyBackward0``)."""
    red = _reduction_enum(_legacy_reduction(size_average, reduce, reduction))
    _check_tensor(input, "binary_cross_entropy", "input")
    _check_tensor(target, "binary_cross_entropy", "target")
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"Using a target size ({target.shape!r}) that is different to the "
                         f"input size ({input.shape!r}) is deprecated. Please ensure they have "
                         "the same size.")
    if weight is not None:
        _check_tensor(weight, "binary_cross_entropy", "weight")
        weight = _F.expand(weight, _broadcast_to_target(target.shape, weight.shape))
    for t in (target, weight):
        if t is not None and t.dtype is not input.dtype:
            raise RuntimeError(f"Found dtype {_torch_name(t.dtype)} but expected "
                               f"{_torch_name(input.dtype)}")
    _check_floating(input, "binary_cross_entropy")
    _check_unit_interval(input, "input")
    _check_unit_interval(target, "target")
    return apply(OPS["binary_cross_entropy"], (input, target),
                 {"weight": weight, "reduction": red})


def _broadcast_to_target(target_shape, weight_shape) -> tuple[int, ...]:
    """``broadcast_shapes(target, weight)`` with torch's message for a mismatch."""
    n = max(len(target_shape), len(weight_shape))
    out = []
    for i in range(-1, -n - 1, -1):
        t = target_shape[i] if -i <= len(target_shape) else 1
        w = weight_shape[i] if -i <= len(weight_shape) else 1
        if t != w and 1 not in (t, w):
            raise RuntimeError(f"Attempting to broadcast a dimension of length {w} at {i}! "
                               f"Mismatching argument at index 1 had {weight_shape!r}; but "
                               f"expected shape should be broadcastable to {list(target_shape)}")
        out.append(t if w == 1 else w)
    return tuple(reversed(out))


def _check_unit_interval(t: Tensor, name: str) -> None:
    """binary_cross_entropy's domain, checked before any kernel (NaN fails, as in torch)."""
    import numpy as np

    from ..backends import backend_for

    a = np.asarray(backend_for(t.device.type).to_host(t._data))
    if not bool(np.all((a >= 0) & (a <= 1))):
        raise RuntimeError(f"all elements of {name} should be between 0 and 1")


def kl_div(input: Tensor, target: Tensor, size_average=None, reduce=None,
           reduction: str = "mean", log_target: bool = False) -> Tensor:
    """``target * (log target - input)`` (input holds log-probabilities), composed as
    torch's: ``xlogy(t, t) - t * input`` (or ``exp(t) * (t - input)``), then reduced;
    ``batchmean`` divides the sum by the batch size."""
    _check_tensor(input, "kl_div", "input")
    _check_tensor(target, "kl_div", "target")
    if size_average is not None or reduce is not None:
        red = _reduction_enum(_legacy_reduction(size_average, reduce, reduction))
    else:
        if reduction == "mean":
            warnings.warn("reduction: 'mean' divides the total loss by both the batch size and "
                          "the support size.'batchmean' divides only by the batch size, and "
                          "aligns with the KL div math definition.'mean' will be changed to "
                          "behave the same as 'batchmean' in the next major release.",
                          UserWarning, stacklevel=2)
        red = _reduction_enum("sum" if reduction == "batchmean" else reduction)
    if log_target:
        out = _F.exp(target) * (target - input)
    else:
        from ..autograd.record import record

        plogp = apply(OPS["xlogy"], (target, target))
        with record():  # SubBackward0 keeps plogp (a temporary it never saves) for the verifier
            out = plogp - target * input
    out = _reduce_tensor(out, red)
    if reduction == "batchmean" and input.ndim != 0:
        out = out / input.shape[0]
    return out


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 one-hot rows of the class indices in ``tensor`` (no gradient, as torch)."""
    import numpy as np

    if not isinstance(tensor, Tensor) or tensor.dtype.name != "int64":
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    idx = np.asarray(tensor.detach().cpu().numpy())
    if num_classes == -1:
        if idx.size == 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(idx.max()) + 1
    if idx.size and idx.min() < 0:
        raise RuntimeError("Class values must be non-negative.")
    if idx.size and idx.max() >= num_classes:
        raise RuntimeError("Class values must be smaller than num_classes.")
    out = (idx[..., None] == np.arange(int(num_classes))).astype(np.int64)
    return Tensor._wrap(out).to(tensor.device)


__all__ += ["one_hot"]


# -- convolution and pooling (issue 21)
from ._conv_functional import (  # noqa: E402
    adaptive_avg_pool2d,
    avg_pool2d,
    conv1d,
    conv2d,
    max_pool2d,
)

__all__ += ["conv1d", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"]

# -- attention (issue 21)
from .attention import scaled_dot_product_attention  # noqa: E402, F401

# -- tensor functions and normalisation (issue 21) ---------------------------------------------
from .norm_functional import batch_norm, dropout, embedding, layer_norm  # noqa: E402

__all__ += ["layer_norm", "batch_norm", "dropout", "embedding"]
