"""Convolution (``ConvolutionBackward0``) lowered onto strided slices and one matrix product.

im2col is one basic slice per kernel tap of the (zero-padded) input, channels first, and
a ``be.stack`` of them: the columns come out laid out ``(groups, C/groups * prod(kernel),
N * prod(out))``, so one BLAS product (a batched one per group) gives the output channels
first. Only backend kernels are used, so the forward runs unchanged on every backend, and
on the SymPy backend it *is* the convolution's exact meaning (``STRUCTURAL``).

The backward formulas are differentiable tensor ops (create_graph works): the input
gradient is col2im, the scatter-add (``index_backward``) of ``weight^T @ grad`` with an
index array computed here in NumPy (every entry in range by construction; padding points
at one extra element that is dropped); the weight gradient is ``grad @ columns^T`` with
the columns sliced again from the saved input (torch saves the input, not the columns);
the bias gradient is a sum.

Numeric backends may compute the same numbers faster: the forward first asks the backend
for a one-call kernel ``be.convolution`` (numpy, cpu, cuda: im2col into one buffer and one
batched product, see backends/conv_numpy.py; None declines: integers, empty sizes), and
``fused_backward="convolution_backward"`` stands in for the three formulas when no graph
is recorded (cpu, cuda). create_graph, the SymPy backend and whatever a kernel declines run
the lowering and formulas here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from math import prod

import numpy as np

from .. import _tensor_layer as _tl
from . import _tex
from .registry import OPS, register
from .spec import STRUCTURAL, OpSpec


def _apply(name, inputs, params):
    return _tl.apply(OPS[name], inputs, params)


@dataclass(frozen=True)
class ConvPlan:
    """The geometry of one convolution: output sizes and the slices of each kernel tap."""

    groups: int
    out_channels: int
    rows: int  # C/groups * prod(kernel): the inner dimension of the product
    cols: int  # N * prod(out): one column per output position of every image
    out_spatial: tuple[int, ...]
    numel: int  # elements of the input
    padded: bool  # does a tap read padding (col2im's index then points at ``numel``)?
    padding: tuple[int, ...]  # per spatial dim, both sides
    taps: tuple[tuple[slice, ...], ...]  # per kernel tap: its slices of the padded input
    key: tuple  # conv_plan's arguments, for col2im_index

    @property
    def index(self) -> np.ndarray:
        """col2im's int64 index (groups * rows * cols,), entries in [0, numel]."""
        return col2im_index(*self.key)


def conv_out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _window_positions(size, out, k, s, p, d):
    """(k, out) input positions of each kernel tap at each output, and whether inside."""
    pos = np.arange(k)[:, None] * d + np.arange(out)[None, :] * s - p
    return pos, (pos >= 0) & (pos < size)


def _plane(spatial, kernel, out, stride, padding, dilation):
    """In-plane offset and validity of every (kernel tap..., output position...) pair."""
    dims = len(spatial)
    plane_strides = [prod(spatial[i + 1:]) for i in range(dims)]
    plane = np.zeros(kernel + out, dtype=np.int64)
    valid = np.ones(kernel + out, dtype=bool)
    for i in range(dims):
        pos, ok = _window_positions(spatial[i], out[i], kernel[i], stride[i], padding[i],
                                    dilation[i])
        shape = [1] * (2 * dims)
        shape[i], shape[dims + i] = kernel[i], out[i]
        plane = plane + pos.reshape(shape) * plane_strides[i]
        valid = valid & ok.reshape(shape)
    return plane, valid


@lru_cache(maxsize=16)
def conv_plan(in_shape: tuple, weight_shape: tuple, stride: tuple, padding: tuple,
              dilation: tuple, groups: int) -> ConvPlan:
    """The geometry of a convolution (cached: a training loop repeats its shapes)."""
    n, c = in_shape[:2]
    spatial, kernel = in_shape[2:], weight_shape[2:]
    out = tuple(conv_out_size(*a) for a in zip(spatial, kernel, stride, padding, dilation))
    padded = any(i * d - p < 0 or (o - 1) * s + i * d - p >= size
                 for size, k, s, p, d, o in zip(spatial, kernel, stride, padding, dilation, out)
                 for i in range(k))
    per_dim = [[slice(i * d, i * d + s * (o - 1) + 1, s) for i in range(k)]
               for k, s, d, o in zip(kernel, stride, dilation, out)]
    return ConvPlan(groups, weight_shape[0], c // groups * prod(kernel), n * prod(out), out,
                    n * c * prod(spatial), padded, tuple(padding), tuple(product(*per_dim)),
                    (in_shape, weight_shape, stride, padding, dilation, groups))


@lru_cache(maxsize=8)
def col2im_index(in_shape: tuple, weight_shape: tuple, stride: tuple, padding: tuple,
                 dilation: tuple, groups: int) -> np.ndarray:
    """For every column entry, the flat input element it came from (``numel``: padding),
    laid out (groups, C/groups, kernel..., N, out...) as the columns; built only when an
    input gradient is asked for."""
    n, c = in_shape[:2]
    spatial, kernel = in_shape[2:], weight_shape[2:]
    dims = len(spatial)
    out = tuple(conv_out_size(*a) for a in zip(spatial, kernel, stride, padding, dilation))
    plane, valid = _plane(spatial, kernel, out, stride, padding, dilation)
    hw = prod(spatial)
    cg = c // groups
    chan = np.arange(c, dtype=np.int64).reshape((groups, cg) + (1,) * (2 * dims + 1))
    batch = np.arange(n, dtype=np.int64).reshape((1, 1) + (1,) * dims + (n,) + (1,) * dims)
    plane_b = plane.reshape((1, 1) + kernel + (1,) + out)
    valid_b = valid.reshape(plane_b.shape)
    index = np.where(valid_b, (batch * c + chan) * hw + plane_b, n * c * hw)
    index = np.ascontiguousarray(index, dtype=np.int64).reshape(-1)
    index.setflags(write=False)
    return index


def _full(v, n: int) -> tuple:
    """A saved stride/padding/dilation for every dim (torch saves ``[1]`` as given)."""
    return tuple(v) * n if len(v) == 1 else tuple(v)


def _plan(input_shape, weight_shape, stride, padding, dilation, groups) -> ConvPlan:
    n = len(input_shape) - 2
    return conv_plan(tuple(input_shape), tuple(weight_shape), _full(stride, n),
                     _full(padding, n), _full(dilation, n), int(groups))


# -- forward ----------------------------------------------------------------------------------
def gather_columns(be, x, plan) -> object:
    """im2col on the backend: ``(groups, rows, cols)``, one slice per kernel tap."""
    dims = len(plan.out_spatial)
    xt = be.transpose(x, (1, 0) + tuple(range(2, 2 + dims)))  # channels first
    if any(plan.padding):
        sizes = tuple(s + 2 * p for s, p in zip(xt.shape[2:], plan.padding))
        xp = be.full(tuple(xt.shape[:2]) + sizes, 0, x.dtype)
        be.setitem(xp, _ALL2 + tuple(slice(p, p + s) for p, s in zip(plan.padding,
                                                                      xt.shape[2:])), xt)
        xt = xp
    taps = [be.getitem(xt, _ALL2 + tap) for tap in plan.taps]
    return be.reshape(be.stack(taps, 1), (plan.groups, plan.rows, plan.cols))


_ALL2 = (slice(None), slice(None))


def _conv_forward(be, input, weight, bias, stride, padding, dilation, transposed,
                  output_padding, groups, bias_sym_sizes_opt):
    fast = None if transposed else getattr(be, "convolution", None)
    if fast is not None:  # a numeric backend's one-call kernel; None: it declines
        out = fast(input, weight, bias, stride, padding, dilation, groups)
        if out is not None:
            return out
    plan = _plan(input.shape, weight.shape, stride, padding, dilation, groups)
    cols = gather_columns(be, input, plan)
    o, g = plan.out_channels, plan.groups
    if g == 1:
        out = be.matmul(be.reshape(weight, (o, plan.rows)), be.reshape(cols, (plan.rows,
                                                                              plan.cols)))
    else:
        out = be.matmul(be.reshape(weight, (g, o // g, plan.rows)), cols)
        out = be.reshape(out, (o, plan.cols))
    if bias is not None:
        out = be.add(out, be.reshape(bias, (o, 1)))
    n = input.shape[0]
    out = be.reshape(out, (o, n) + plan.out_spatial)
    return be.copy(be.transpose(out, (1, 0) + tuple(range(2, 2 + len(plan.out_spatial)))))


# -- backward (differentiable tensor ops) -----------------------------------------------------
def _grad_columns(grad, plan):
    """grad (N, O, out...) as (groups, O/groups, N * prod(out)), the product's layout."""
    n, o = grad.shape[0], grad.shape[1]
    g2 = grad.reshape(n, o, -1).permute(1, 0, 2)
    return g2.reshape(plan.groups, o // plan.groups, plan.cols)


def columns_of(x, plan):
    """im2col of the tensor ``x`` in differentiable ops (slices, stack; constant_pad_nd)."""
    from .shape import list_spec

    dims = len(plan.out_spatial)
    xt = x.permute((1, 0) + tuple(range(2, 2 + dims)))
    if any(plan.padding):
        pad = tuple(p for q in reversed(plan.padding) for p in (q, q))
        xt = _apply("constant_pad_nd", (xt,), {"pad": pad, "value": 0})
    taps = [_tl.getitem(xt, _ALL2 + tap) for tap in plan.taps]
    cols = taps[0].unsqueeze(1) if len(taps) == 1 else \
        _tl.apply(list_spec("stack", len(taps)), tuple(taps), {"dim": 1})
    return cols.reshape(plan.groups, plan.rows, plan.cols)


def columns_to_image(cols, plan, sizes):
    """col2im: the scatter-add of ``cols`` back onto an input of ``sizes``."""
    extra = 1 if plan.padded else 0
    flat = _apply("index_backward", (cols.reshape(-1),),
                  {"indices": (plan.index,), "input_sizes": (plan.numel + extra,)})
    if extra:
        flat = flat[:plan.numel]
    return flat.reshape(tuple(sizes))


def conv_input_grad(grad, input, weight, stride, padding, dilation, groups):
    plan = _plan(input.shape, weight.shape, stride, padding, dilation, groups)
    g2 = _grad_columns(grad, plan)
    o = plan.out_channels
    if plan.groups == 1:
        cols = weight.reshape(o, plan.rows).t().mm(g2.reshape(o, plan.cols))
    else:
        cols = weight.reshape(plan.groups, o // plan.groups, plan.rows).transpose(1, 2).bmm(g2)
    return columns_to_image(cols, plan, input.shape)


def conv_weight_grad(grad, input, weight, stride, padding, dilation, groups):
    plan = _plan(input.shape, weight.shape, stride, padding, dilation, groups)
    g2 = _grad_columns(grad, plan)
    cols = columns_of(input, plan)
    if plan.groups == 1:
        gw = g2.reshape(plan.out_channels, plan.cols).mm(cols.reshape(plan.rows, plan.cols).t())
    else:
        gw = g2.bmm(cols.transpose(1, 2))
    return gw.reshape(tuple(weight.shape))


def conv_bias_grad(grad):
    return grad.sum([0] + list(range(2, grad.ndim)))


_SAVED = ("input", "weight", "stride", "padding", "dilation", "transposed", "output_padding",
          "groups", "bias_sym_sizes_opt")


def _formula(which):
    """One formula per input, each naming every saved operand (torch saves them all)."""
    def formula(grad, input, weight, stride, padding, dilation, transposed, output_padding,
                groups, bias_sym_sizes_opt):
        if which == "bias":
            return conv_bias_grad(grad)
        fn = conv_input_grad if which == "input" else conv_weight_grad
        return fn(grad, input, weight, stride, padding, dilation, groups)

    return formula


def _conv_tex(names, out, params, shapes):
    """``y[n,o,i,j] = b[o] + Σ_{c,p,q} w[o,c,p,q] · x[n,c, s·i+d·p−pad, …]``, the stride,
    dilation, padding and group layout of this node put in (its readable meaning)."""
    ws, xs = shapes.get("weight"), shapes.get("input")
    if ws is None or xs is None or params.get("transposed") or not 1 <= len(ws) - 2 <= 3:
        return None
    k = len(ws) - 2
    stride = _tex.ints(params.get("stride"), k, (1,))
    padding = _tex.ints(params.get("padding"), k, (0,))
    dilation = _tex.ints(params.get("dilation"), k, (1,))
    groups = int(params.get("groups") or 1)
    o_g, c_g = ws[0] // groups, ws[1]
    taps = [t if size > 1 else None for t, size in zip(_tex.TAP_VARS, ws[2:])]
    outs = list(_tex.OUT_VARS[:k])
    batch = ["n"] if len(xs) == k + 2 else []
    group = "" if groups == 1 else ("o" if o_g == 1 else rf"\lfloor o/{o_g}\rfloor")
    chan = "c" if c_g > 1 else None
    if group:
        cin = group if chan is None else f"{c_g}{group}+c"
    else:
        cin = chan or "0"
    spatial = [_tex.window_index(o, t, s, d, p)
               for o, t, s, d, p in zip(outs, taps, stride, dilation, padding)]
    x, w, y = names["input"], names["weight"], out
    w_at = _tex.index(w, ["o", chan or "0"] + [t or "0" for t in taps])
    x_at = _tex.index(x, batch + [cin] + spatial)
    summed = [(chan, c_g)] + [(t, size) for t, size in zip(taps, ws[2:])]
    summed = [(v, size) for v, size in summed if v is not None]
    sigma = (r"\sum_{" + _tex.bounds([v for v, _ in summed], [n for _, n in summed]) + "} "
             if summed else "")
    bias = _tex.index(names["bias"], ["o"]) + " + " if names.get("bias") else ""
    y_at = _tex.index(y, batch + ["o"] + outs)
    forward = f"{y_at} = {bias}{sigma}{w_at}\\,{x_at}"
    if any(padding):
        forward += rf"\quad(\text{{zero outside }}{x})"
    gy = _tex.index(rf"\bar{{{y}}}", batch + ["o"] + outs)
    rest = ",".join(batch + outs)
    vjps = [rf"\bar{{{x}}}{x_at[len(x):]} \mathrel{{+}}= {w_at}\,{gy}",
            rf"\bar{{{w}}}{w_at[len(w):]} = \sum_{{{rest}}} {gy}\,{x_at}"]
    if names.get("bias"):
        vjps.append(rf"\bar{{{names['bias']}}}[o] = \sum_{{{rest}}} {gy}")
    return forward, r",\quad ".join(vjps)


register(OpSpec(
    "convolution", "ConvolutionBackward0", ("input", "weight", "bias"), _conv_forward,
    {"input": _formula("input"), "weight": _formula("weight"), "bias": _formula("bias")},
    STRUCTURAL, dtype_rule="same", fused_backward="convolution_backward",
    formula_tex=_conv_tex,
    doc="conv1d/conv2d (bias may be None: no edge); im2col gather + matmul."))


# -- constant_pad_nd: padding='same' with an even total pads the input first, as torch -----
def _pad_region(pad, ndim):
    """Slices of the padded tensor that hold the input (pad: last dim first, pairs)."""
    region = [slice(None)] * ndim
    for i in range(len(pad) // 2):
        d = ndim - 1 - i
        region[d] = (pad[2 * i], pad[2 * i + 1])
    return region


def _constant_pad_forward(be, self, pad, value=0):
    region = _pad_region(pad, self.ndim)
    shape = tuple(s if isinstance(r, slice) else s + r[0] + r[1]
                  for s, r in zip(self.shape, region))
    out = be.full(shape, value, self.dtype)
    index = tuple(r if isinstance(r, slice) else slice(r[0], r[0] + s)
                  for s, r in zip(self.shape, region))
    be.setitem(out, index, self)
    return out


def _constant_pad_grad(grad, pad):
    region = _pad_region(pad, grad.ndim)
    index = tuple(r if isinstance(r, slice) else slice(r[0], grad.shape[d] - r[1])
                  for d, r in enumerate(region))
    return _tl.getitem(grad, index)


register(OpSpec(
    "constant_pad_nd", "ConstantPadNdBackward0", ("self",), _constant_pad_forward,
    {"self": lambda grad, pad: _constant_pad_grad(grad, pad)},
    STRUCTURAL, dtype_rule="same", doc="non-negative constant padding (F.pad's 'constant')."))
