"""layer_norm (NativeLayerNormBackward0), batch_norm (NativeBatchNormBackward0) and
embedding (EmbeddingBackward0), with torch's saved operands.

The forwards are composed of backend kernels (mean, sub, mul, sqrt, div, getitem), so the
SymPy backend replays their exact meaning; ``result1``/``result2`` are the statistics
torch saves (mean and 1/sqrt(var + eps)). Running statistics are updated by the public
function (symgrad/nn/norm_functional.py), never by a forward: a forward stays a pure
function of its inputs for the verifier's replay. The backwards are torch's
``native_layer_norm_backward`` / ``batchnorm_backward`` / ``embedding_dense_backward`` in
tensor ops, so ``create_graph=True`` works.
"""

from __future__ import annotations

import numpy as np

from .. import _tensor_layer as _tl
from ._ints import s64
from .registry import register
from .spec import STRUCTURAL, OpSpec


def _arr(x):
    return getattr(x, "_data", x)


def _normalize(be, x, axes, eps):
    """(x - mean) * rstd, mean, rstd over ``axes`` (kept as size-1 dims)."""
    mean = be.mean(x, axes, True)
    dev = be.sub(x, mean)
    var = be.mean(be.mul(dev, dev), axes, True)
    rstd = be.div(1.0, be.sqrt(be.add(var, eps)))
    return be.mul(dev, rstd), mean, rstd


def _affine(be, y, weight, bias, shape):
    if weight is not None:
        y = be.mul(y, be.reshape(weight, shape))
    if bias is not None:
        y = be.add(y, be.reshape(bias, shape))
    return y


# -- layer_norm --------------------------------------------------------------------------------
def _layer_axes(ndim, normalized_shape):
    return tuple(range(ndim - len(normalized_shape), ndim))


def _layer_norm_fwd(be, input, weight, bias, normalized_shape, eps, _eps=None):  # noqa: A002
    fast = getattr(be, "layer_norm", None)
    if fast is not None:  # a numeric backend's one-pass kernel; None: it declines
        out = fast(input, _arr(weight), _arr(bias), tuple(normalized_shape), eps)
        if out is not None:
            return out
    axes = _layer_axes(input.ndim, normalized_shape)
    y, mean, rstd = _normalize(be, input, axes, eps)
    return _affine(be, y, weight, bias, tuple(normalized_shape)), mean, rstd


def _statistics(input, axes, eps):  # noqa: A002
    """mean and 1/sqrt(var + eps) recomputed from ``input`` in differentiable ops: the
    saved result1/result2 are constants to autograd (non-differentiable outputs), so a rule
    reading them would lose the statistics' dependence on the input in second derivatives
    and in the verifier's symbolic audit; torch saves them for its fused kernel."""
    mean = input.mean(axes, keepdim=True)
    dev = input - mean
    return mean, 1 / ((dev * dev).mean(axes, keepdim=True) + eps).sqrt()


def layer_norm_input_grad(grad, input, normalized_shape, result1, result2, weight,  # noqa: A002
                          _eps):
    axes = _layer_axes(input.ndim, normalized_shape)
    result1, result2 = _statistics(input, axes, _eps)
    xhat = (input - result1) * result2
    g = grad if weight is None else grad * weight
    return result2 * (g - g.mean(axes, keepdim=True)
                      - xhat * (g * xhat).mean(axes, keepdim=True))


def _xhat(input, normalized_shape, result1, result2, eps):  # noqa: A002
    result1, result2 = _statistics(input, _layer_axes(input.ndim, normalized_shape), eps)
    return (input - result1) * result2


def _leading_sum(t, n_trailing):
    lead = tuple(range(t.ndim - n_trailing))
    return t.sum(lead) if lead else t * 1


register(OpSpec(
    "native_layer_norm", "NativeLayerNormBackward0", ("input", "weight", "bias"),
    _layer_norm_fwd,
    {"input": lambda grad, input, normalized_shape, result1, result2, weight,  # noqa: A006
        _eps: layer_norm_input_grad(grad, input, normalized_shape, result1, result2, weight,
                                    _eps),
     "weight": lambda grad, input, normalized_shape, result1, result2, _eps:  # noqa: A006
        _leading_sum(grad * _xhat(input, normalized_shape, result1, result2, _eps),
                     len(normalized_shape)),
     "bias": lambda grad, bias, normalized_shape: _leading_sum(grad, len(normalized_shape))},
    STRUCTURAL, dtype_rule="same", outputs=("result", "result1", "result2"),
    fused_backward="native_layer_norm_backward",
    doc="F.layer_norm: result1 = mean, result2 = 1/sqrt(var + eps) over the last dims."))


# -- batch_norm --------------------------------------------------------------------------------
def _channel_shape(ndim, c):
    return (1, c) + (1,) * (ndim - 2)


def _batch_axes(ndim):
    return (0,) + tuple(range(2, ndim))


def _batch_norm_fwd(be, input, weight, bias, running_mean, running_var, training,  # noqa: A002
                    eps):
    shape = _channel_shape(input.ndim, input.shape[1])
    if training:
        y, mean, rstd = _normalize(be, input, _batch_axes(input.ndim), eps)
        stats = (be.reshape(mean, (input.shape[1],)), be.reshape(rstd, (input.shape[1],)))
    else:
        mean = be.reshape(_arr(running_mean), shape)
        rstd = be.div(1.0, be.sqrt(be.add(be.reshape(_arr(running_var), shape), eps)))
        y = be.mul(be.sub(input, mean), rstd)
        stats = (be.full((0,), 0, input.dtype), be.full((0,), 0, input.dtype))
    return (_affine(be, y, weight, bias, shape),) + stats


def _batch_stats(input, result1, result2, running_mean, running_var, training, eps):  # noqa: A002
    """Per-channel mean and 1/std, shaped to broadcast against ``input``."""
    shape = _channel_shape(input.ndim, input.shape[1])
    if training:
        return _statistics(input, _batch_axes(input.ndim), eps)
    return running_mean.reshape(shape), 1 / (running_var.reshape(shape) + eps).sqrt()


def batch_norm_input_grad(grad, eps, input, result1, result2, running_mean,  # noqa: A002
                          running_var, training, weight):
    mean, invstd = _batch_stats(input, result1, result2, running_mean, running_var,
                                training, eps)
    shape = _channel_shape(input.ndim, input.shape[1])
    scale = invstd if weight is None else invstd * weight.reshape(shape)
    if not training:
        return grad * scale
    axes = _batch_axes(input.ndim)
    xhat = (input - mean) * invstd
    return scale * (grad - grad.mean(axes, keepdim=True)
                    - xhat * (grad * xhat).mean(axes, keepdim=True))


def batch_norm_weight_grad(grad, eps, input, result1, result2, running_mean,  # noqa: A002
                           running_var, training):
    mean, invstd = _batch_stats(input, result1, result2, running_mean, running_var,
                                training, eps)
    return (grad * ((input - mean) * invstd)).sum(_batch_axes(input.ndim))


register(OpSpec(
    "native_batch_norm", "NativeBatchNormBackward0", ("input", "weight", "bias"),
    _batch_norm_fwd,
    {"input": lambda grad, eps, input, result1, result2, running_mean,  # noqa: A006
        running_var, training, weight: batch_norm_input_grad(
            grad, eps, input, result1, result2, running_mean, running_var, training, weight),
     "weight": lambda grad, eps, input, result1, result2, running_mean,  # noqa: A006
        running_var, training: batch_norm_weight_grad(
            grad, eps, input, result1, result2, running_mean, running_var, training),
     "bias": lambda grad: grad.sum(_batch_axes(grad.ndim))},
    STRUCTURAL, dtype_rule="same", outputs=("result", "result1", "result2"),
    doc="F.batch_norm; training: batch statistics (result1 = mean, result2 = 1/std), "
        "else the running ones (running_mean/var are saved params, no edges)."))


# -- embedding ---------------------------------------------------------------------------------
def _embedding_fwd(be, weight, indices, padding_idx, scale_grad_by_freq, sparse,
                   weight_sym_argsize_0):
    idx = _arr(indices)
    # torch's bounds check, here on the host array (the op's own: a compiled step runs it
    # each call; F.embedding reads device indices back itself)
    if isinstance(idx, np.ndarray) and idx.size and (
            idx.min() < 0 or idx.max() >= weight_sym_argsize_0):
        raise IndexError("index out of range in self")
    rows = be.getitem(weight, (idx, Ellipsis))
    constant = getattr(be, "as_constant", None)
    pad = s64(padding_idx)
    if constant is not None and pad >= 0:  # the meaning: the padding row is a constant
        idx = np.asarray(_arr(indices))
        hit = idx == pad
        if hit.any():
            rows = np.array(rows, dtype=object)
            rows[hit] = constant(rows[hit])
    return rows


def embedding_backward(grad, indices, padding_idx, scale_grad_by_freq, weight_sym_argsize_0):
    from .gather import index_add

    flat = indices.reshape(-1)
    g = grad.reshape(flat.numel(), grad.shape[-1])
    pad = s64(padding_idx)
    if pad >= 0:
        g = g * (flat != pad).unsqueeze(1)
    if scale_grad_by_freq:
        counts = np.bincount(flat.cpu().numpy(), minlength=weight_sym_argsize_0)
        scale = _tl.tensor(1.0 / np.maximum(counts[flat.cpu().numpy()], 1), dtype=grad.dtype,
                           device=grad.device.type)
        g = g * scale.unsqueeze(1)
    out = _tl.zeros((weight_sym_argsize_0, grad.shape[-1]), dtype=grad.dtype,
                    device=grad.device)
    return index_add(out, 0, flat, g)


register(OpSpec(
    "embedding", "EmbeddingBackward0", ("weight",), _embedding_fwd,
    {"weight": lambda grad, indices, padding_idx, scale_grad_by_freq, sparse,
        weight_sym_argsize_0: embedding_backward(grad, indices, padding_idx,
                                                 scale_grad_by_freq, weight_sym_argsize_0)},
    STRUCTURAL, dtype_rule="same", fused_backward="embedding_backward",
    doc="F.embedding: rows of weight; padding_idx's row gets no gradient (-1 as u64: none)."))

