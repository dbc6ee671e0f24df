"""conv1d, conv2d and 2-D pooling as functions, with torch's arguments and error wording.

The checks run here, in Python, before any kernel: shapes, channel counts, strides,
paddings and window sizes are validated exactly where torch validates them, and the op
receives the arguments torch would save (``stride`` as a tuple, ``padding='same'`` turned
into numbers, torch's ``ConstantPadNdBackward0`` first where 'same' pads unevenly).
"""

from __future__ import annotations

import os
import warnings

from .. import functional as _F
from .._tensor_layer import CPP_NAMES, LEGACY_NAMES, TORCH_NAMES
from ..autograd.function import apply
from ..ops import OPS
from ..tensor import Tensor

__all__ = ["conv1d", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"]

_CONV = OPS["convolution"]
_PAD = OPS["constant_pad_nd"]
_MAX = OPS["max_pool2d_with_indices"]
_AVG = OPS["avg_pool2d"]
_ADAPTIVE = OPS["adaptive_avg_pool2d"]
_C_TYPE = CPP_NAMES


def _check_tensor(x, fn: str, arg: str, pos: int) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{fn}(): argument '{arg}' (position {pos}) must be Tensor, not "
                        f"{type(x).__name__}")


def _ints(v, name: str, n: int, dims: int) -> tuple[int, ...]:
    """The value torch saves: an int becomes ``dims`` of it (the function's own count), a
    list of one stays one (it stands for all n dims of the weight, as in torch's
    expand_param_if_needed)."""
    vals = [int(v)] * dims if isinstance(v, int) else [int(x) for x in v]
    if len(vals) not in (1, n):
        raise RuntimeError(f"expected {name} to be a single integer value or a list of {n} "
                           f"values to match the convolution dimensions, but got "
                           f"{name}={vals}")
    return tuple(vals)


def _full(v: tuple, n: int) -> tuple[int, ...]:
    return v * n if len(v) == 1 else v


def _size_str(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


_TORCH_TYPE = {k: "torch." + v for k, v in LEGACY_NAMES.items()}


def _torch_picks_mkldnn(input: Tensor, weight: Tensor, stride, dilation, groups) -> bool:
    """Whether torch 2.13 would run this convolution with oneDNN (its ``use_mkldnn``): its
    dtype-mismatch error is worded by the kernel it picked, so ours follows the same rule.
    A 1-D convolution is picked as its 4-D view (N, C, 1, L) with weight (O, C, 1, K)."""
    if input.dtype.name != "float32" or input.ndim not in (3, 4):
        return False
    n, c, *rest = input.shape
    h, w = (1, rest[0]) if input.ndim == 3 else rest
    kh, kw = (1, weight.shape[-1]) if input.ndim == 3 else weight.shape[-2:]
    threads = os.cpu_count() or 1  # torch's default intra-op thread count
    fast_enough = (any(s != 1 for s in stride) or any(d != 1 for d in dilation) or n >= 16
                   or kw != 1 or kh != 1 or threads > 1)
    worth_it = groups > 1 or (kw > 3 and kh > 3) or n > 1 or n * c * h * w > 20480
    return fast_enough and worth_it


# -- convolution ------------------------------------------------------------------------------
def _check_conv(input: Tensor, weight: Tensor, bias, stride, padding, dilation, groups):
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError("non-positive dilation is not supported")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    w = tuple(weight.shape)
    if input.ndim != weight.ndim:
        raise RuntimeError(f"Expected {weight.ndim}-dimensional input for {weight.ndim}-"
                           f"dimensional weight {_size_str(w)}, but got {input.ndim}-"
                           f"dimensional input of size {_size_str(input.shape)} instead")
    if w[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by "
                           f"{groups} at dimension 0, but got weight of size [{_size_str(w)}] "
                           "instead")
    if input.shape[1] != w[1] * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {_size_str(w)}, expected "
                           f"input{_size_str(input.shape)} to have {w[1] * groups} channels, "
                           f"but got {input.shape[1]} channels instead")
    if bias is not None and (bias.ndim != 1 or bias.shape[0] != w[0]):
        raise RuntimeError(f"Given weight of size {_size_str(w)}, expected bias to be "
                           f"1-dimensional with {w[0]} elements, but got bias of size "
                           f"{_size_str(bias.shape)} instead")
    spatial = input.shape[2:]
    padded = [s + 2 * p for s, p in zip(spatial, padding)]
    kernel = [d * (k - 1) + 1 for k, d in zip(w[2:], dilation)]
    if any(p < k for p, k in zip(padded, kernel)):
        raise RuntimeError(f"Calculated padded input size per channel: "
                           f"({' x '.join(map(str, padded))}). Kernel size: "
                           f"({' x '.join(map(str, kernel))}). Kernel size can't be greater "
                           "than actual input size")
    if input.dtype is not weight.dtype:
        if _torch_picks_mkldnn(input, weight, stride, dilation, groups):
            raise RuntimeError(f"Input type ({_TORCH_TYPE[input.dtype.name]}) and weight type "
                               f"({_TORCH_TYPE[weight.dtype.name]}) should be the same or "
                               "input should be a MKLDNN tensor and weight is a dense tensor")
        raise RuntimeError(f"expected scalar type {TORCH_NAMES[input.dtype.name]} but found "
                           f"{TORCH_NAMES[weight.dtype.name]}")
    if bias is not None and bias.dtype is not input.dtype:
        raise RuntimeError(f"Input type ({_C_TYPE[input.dtype.name]}) and bias type "
                           f"({_C_TYPE[bias.dtype.name]}) should be the same")


def _same_padding(weight: Tensor, stride, dilation, dims: int):
    """torch's _convolution_mode 'same': symmetric padding, plus the uneven remainder as a
    ConstantPadNd of the input (``pad`` from the last dim back), or None."""
    if any(s != 1 for s in stride):
        raise RuntimeError("padding='same' is not supported for strided convolutions")
    padding, pad_nd, even = [], [0] * (2 * dims), True
    for i in range(dims):
        total = dilation[i] * (weight.shape[2 + i] - 1)
        padding.append(total // 2)
        if total % 2:
            even = False
            pad_nd[2 * (dims - 1 - i) + 1] = total - 2 * (total // 2)
    return tuple(padding), (None if even else tuple(pad_nd))


def _convolution(input, weight, bias, stride, padding, dilation, groups, dims: int, name: str):
    _check_tensor(input, name, "input", 1)
    _check_tensor(weight, name, "weight", 2)
    if bias is not None:
        _check_tensor(bias, name, "bias", 3)
    if input.ndim not in (dims + 1, dims + 2):
        raise RuntimeError(f"Expected {dims + 1}D (unbatched) or {dims + 2}D (batched) input "
                           f"to {name}, but got input of size: {_size_str(input.shape)}")
    k = max(weight.ndim - 2, 1)
    stride, dilation = _ints(stride, "stride", k, dims), _ints(dilation, "dilation", k, dims)
    full_stride, full_dilation = _full(stride, k), _full(dilation, k)
    groups = int(groups)
    unbatched = input.ndim == dims + 1
    if unbatched:
        input = _F.unsqueeze(input, 0)
    output_padding = (0,) * k
    if isinstance(padding, str):
        if padding == "valid":
            padding = output_padding = (0,)
        elif padding == "same":
            padding, pad_nd = _same_padding(weight, full_stride, full_dilation, k)
            if weight.ndim == input.ndim and pad_nd is not None:
                warnings.warn("Using padding='same' with even kernel lengths and odd dilation "
                              "may require a zero-padded copy of the input be created",
                              UserWarning, stacklevel=3)
                input = apply(_PAD, (input,), {"pad": pad_nd, "value": 0})
        else:
            raise RuntimeError(f"Invalid padding string: '{padding}'")
    else:
        padding = _ints(padding, "padding", k, dims)
    _check_conv(input, weight, bias, full_stride, _full(padding, k), full_dilation, groups)
    params = {"stride": stride, "padding": tuple(padding), "dilation": dilation,
              "transposed": False, "output_padding": tuple(output_padding), "groups": groups,
              "bias_sym_sizes_opt": (weight.shape[0],) if bias is not None else (0,)}
    out = apply(_CONV, (input, weight, bias), params)
    return _F.squeeze(out, 0) if unbatched else out


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1) -> Tensor:
    """1-D convolution over (N, C, L) or (C, L) input (``ConvolutionBackward0``)."""
    return _convolution(input, weight, bias, stride, padding, dilation, groups, 1, "conv1d")


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1) -> Tensor:
    """2-D convolution over (N, C, H, W) or (C, H, W) input (``ConvolutionBackward0``)."""
    return _convolution(input, weight, bias, stride, padding, dilation, groups, 2, "conv2d")


# -- pooling ----------------------------------------------------------------------------------
def _pool_ints(v, fn: str, what: str, omitted_ok: bool = False) -> tuple[int, ...]:
    """An int or 1-2 ints, as given (torch saves ``kernel_size=3`` as (3, 3), [3] as (3,))."""
    if omitted_ok and v is None:
        return ()
    vals = (int(v), int(v)) if isinstance(v, int) else tuple(int(x) for x in v)
    if len(vals) not in (1, 2) and not (omitted_ok and not vals):
        rule = "either be omitted, a single int, or" if omitted_ok else "either be a single " \
            "int, or"
        raise RuntimeError(f"{fn}: {what} must {rule} a tuple of two ints")
    return vals


def _pair(v):
    return (v[0], v[0]) if len(v) == 1 else tuple(v)


def _trunc_half(v: int) -> int:
    return int(v / 2)


def _check_pool(input: Tensor, kernel, stride, padding, dilation, ceil_mode, max_pool: bool):
    """torch's pooling_output_shape and pool2d_shape_check, in their order."""
    from ..ops.pool import pool_out_size

    kernel, stride, padding, dilation = (_pair(kernel), _pair(stride) if stride else
                                         _pair(kernel), _pair(padding), _pair(dilation))
    for k, s, p, d in zip(kernel, stride, padding, dilation):
        if s == 0:
            raise RuntimeError("stride should not be zero")
        if p < 0:
            raise RuntimeError(f"pad must be non-negative, but got pad: {p}")
        if p > _trunc_half((k - 1) * d + 1):
            raise RuntimeError(f"pad should be at most half of effective kernel size, but got "
                               f"pad={p}, kernel_size={k} and dilation={d}")
    if kernel[0] <= 0 or kernel[1] <= 0:
        raise RuntimeError(f"kernel size should be greater than zero, but got kH: {kernel[0]} "
                           f"kW: {kernel[1]}")
    if stride[0] <= 0 or stride[1] <= 0:
        raise RuntimeError(f"stride should be greater than zero, but got dH: {stride[0]} dW: "
                           f"{stride[1]}")
    if dilation[0] <= 0 or dilation[1] <= 0:
        raise RuntimeError(f"dilation should be greater than zero, but got dilationH: "
                           f"{dilation[0]} dilationW: {dilation[1]}")
    shape = tuple(input.shape)
    if input.ndim not in (3, 4) or any(s == 0 for s in shape[-3:]):
        raise RuntimeError("non-empty 3D or 4D (batch mode) tensor expected for input")
    if kernel[1] // 2 < padding[1] or kernel[0] // 2 < padding[0]:
        raise RuntimeError(f"pad should be smaller than or equal to half of kernel size, but "
                           f"got padW = {padding[1]}, padH = {padding[0]}, kW = {kernel[1]}, "
                           f"kH = {kernel[0]}")
    out = [pool_out_size(*a, ceil_mode) for a in zip(shape[-2:], kernel, stride, padding,
                                                     dilation)]
    if out[0] < 1 or out[1] < 1:
        c, h, w = shape[-3:]
        raise RuntimeError(f"Given input size: ({c}x{h}x{w}). Calculated output size: "
                           f"({c}x{out[0]}x{out[1]}). Output size is too small")


def max_pool2d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False, return_indices: bool = False):
    """2-D max pooling (``MaxPool2DWithIndicesBackward0``); indices are in-plane offsets."""
    _check_tensor(input, "max_pool2d", "input", 1)
    kernel = _pool_ints(kernel_size, "max_pool2d", "kernel_size")
    stride = _pool_ints(stride, "max_pool2d", "stride", omitted_ok=True)
    padding = _pool_ints(padding, "max_pool2d", "padding")
    dilation = _pool_ints(dilation, "max_pool2d", "dilation")
    _check_pool(input, kernel, stride, padding, dilation, bool(ceil_mode), True)
    values, indices = apply(_MAX, (input,), {
        "kernel_size": kernel, "stride": stride, "padding": padding, "dilation": dilation,
        "ceil_mode": bool(ceil_mode)})
    return (values, indices) if return_indices else values


def _float_only(input: Tensor, name: str) -> None:
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f'"{name}" not implemented for '
                                  f"'{input.dtype.name.capitalize().replace('Int64', 'Long')}'")


def avg_pool2d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """2-D average pooling (``AvgPool2DBackward0``)."""
    _check_tensor(input, "avg_pool2d", "input", 1)
    if input.ndim < 3:
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-max(input.ndim, 1)}, {max(input.ndim, 1) - 1}], but got -3)")
    kernel = _pool_ints(kernel_size, "avg_pool2d", "kernel_size")
    stride = _pool_ints(stride, "avg_pool2d", "stride", omitted_ok=True)
    padding = _pool_ints(padding, "avg_pool2d", "padding")
    if divisor_override is not None and int(divisor_override) == 0:
        raise RuntimeError("divisor must be not zero")
    _check_pool(input, kernel, stride, padding, (1,), bool(ceil_mode), False)
    _float_only(input, "avg_pool2d")
    return apply(_AVG, (input,), {
        "kernel_size": kernel, "stride": stride, "padding": padding, "ceil_mode": bool(ceil_mode),
        "count_include_pad": bool(count_include_pad), "divisor_override": divisor_override})


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """Average over windows [floor(i*H/out), ceil((i+1)*H/out)); 1x1 is torch's mean."""
    _check_tensor(input, "adaptive_avg_pool2d", "input", 1)
    if input.ndim not in (3, 4):
        raise RuntimeError(f"adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got "
                           f"{_size_str(input.shape)}")
    if isinstance(output_size, int):
        size = (output_size, output_size)
    else:
        size = tuple(output_size)
        if len(size) != 2:
            raise RuntimeError("adaptive_avg_pool2d: output_size must be 2")
        size = tuple(input.shape[-2 + i] if v is None else int(v) for i, v in enumerate(size))
    if size[0] < 0 or size[1] < 0:
        raise RuntimeError("adaptive_avg_pool2d: elements of output_size must be greater than "
                           f"or equal to 0 but received {{{size[0]}, {size[1]}}}")
    for d in range(1, input.ndim):
        if input.shape[d] == 0:
            raise RuntimeError(f"adaptive_avg_pool2d(): Expected input to have non-zero size "
                               f"for non-batch dimensions, but input has sizes "
                               f"{_size_str(input.shape)} with dimension {d} being empty")
    _float_only(input, "adaptive_avg_pool2d")
    if size == (1, 1):
        return _F.mean(input, (-1, -2), keepdim=True)
    return apply(_ADAPTIVE, (input,), {"output_size": size})


def max_pool2d_values(input: Tensor, kernel_size, stride=(), padding=0, dilation=1,
                      ceil_mode: bool = False) -> Tensor:
    """``torch.max_pool2d``: the values only (no ``return_indices``), stride [] = kernel."""
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)
