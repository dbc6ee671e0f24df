"""2-D pooling: max (with indices), average and adaptive average.

Each window's elements are gathered with one ``be.getitem`` of the flattened input and an
index array computed here in NumPy (every entry in range by construction), then reduced
on the backend: so the forward runs unchanged on every backend and, replayed on SymPy, is
the op's exact meaning (``STRUCTURAL``). Max pooling takes the value *at* the argmax, so
ties go where torch sends the gradient: to the first maximum of the window, the index it
returns. The backward formulas scatter-add (``index_backward``) into the input, in
differentiable tensor ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod

import numpy as np

from .. import _tensor_layer as _tl
from . import _tex
from .registry import OPS, register
from .spec import STRUCTURAL, OpSpec


def _apply(name, inputs, params):
    return _tl.apply(OPS[name], inputs, params)


@dataclass(frozen=True)
class PoolPlan:
    """Where each output's window reads, for every plane (N*C of them)."""

    out: tuple[int, int]
    window: int  # taps per window (padded windows repeat or read the appended zero)
    numel: int
    padded: bool  # does ``index`` read element ``numel`` (an appended zero)?
    index: np.ndarray  # int64 (planes * prod(out) * window,)
    plane: np.ndarray | None  # max pooling: (windows, taps) in-plane offset of each tap
    divisor: int | np.ndarray | None  # average pooling: per output (prod(out),) or one int


def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _grid(spatial, taps):
    """Plane offsets (out_h, out_w, k_h * k_w) and validity from per-dim tap positions."""
    (ph, oh), (pw, ow) = taps  # positions (out, k) and inside-the-input masks
    h, w = spatial
    plane = ph[:, None, :, None] * w + pw[None, :, None, :]
    valid = oh[:, None, :, None] & ow[None, :, None, :]
    n_out = (ph.shape[0], pw.shape[0])
    return plane.reshape(n_out + (-1,)), valid.reshape(n_out + (-1,))


def _strided_taps(size, out, k, s, p, d):
    pos = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    return pos, (pos >= 0) & (pos < size)


def _expand_planes(plane, valid, planes, hw, fill):
    """The index over all planes; invalid taps read ``fill`` (an int or per-tap array)."""
    base = (np.arange(planes, dtype=np.int64) * hw).reshape(planes, 1, 1, 1)
    index = np.where(valid[None], base + plane[None], fill)
    index = np.ascontiguousarray(index, dtype=np.int64).reshape(-1)
    index.setflags(write=False)
    return index


@lru_cache(maxsize=16)
def max_pool_plan(shape, kernel, stride, padding, dilation, ceil_mode) -> PoolPlan:
    spatial = shape[-2:]
    planes = prod(shape[:-2])
    out = tuple(pool_out_size(*a, ceil_mode) for a in zip(spatial, kernel, stride, padding,
                                                          dilation))
    taps = [_strided_taps(*a) for a in zip(spatial, out, kernel, stride, padding, dilation)]
    plane, valid = _grid(spatial, taps)
    # a tap outside the input repeats the window's first element inside it: the maximum
    # and the first index of it are unchanged (torch's padding is at most half a window)
    first = np.take_along_axis(plane, np.argmax(valid, axis=-1)[..., None], -1)
    plane = np.where(valid, plane, first)
    # every index in range whatever the arguments (the checks leave no all-padding window)
    plane = np.clip(plane, 0, max(prod(spatial) - 1, 0))
    hw = prod(spatial)
    index = _expand_planes(plane, np.ones_like(valid), planes, hw, 0)
    flat_plane = np.ascontiguousarray(np.broadcast_to(plane, (planes,) + plane.shape))
    flat_plane = flat_plane.reshape(-1, plane.shape[-1])
    flat_plane.setflags(write=False)
    return PoolPlan(out, plane.shape[-1], planes * hw, False, index, flat_plane, None)


@lru_cache(maxsize=16)
def avg_pool_plan(shape, kernel, stride, padding, ceil_mode, count_include_pad,
                  divisor_override) -> PoolPlan:
    spatial = shape[-2:]
    planes = prod(shape[:-2])
    out = tuple(pool_out_size(*a, 1, ceil_mode) for a in zip(spatial, kernel, stride, padding))
    taps = [_strided_taps(*a, 1) for a in zip(spatial, out, kernel, stride, padding)]
    plane, valid = _grid(spatial, taps)
    hw = prod(spatial)
    if divisor_override:
        divisor = int(divisor_override)
    else:
        sizes = []
        for size, o, k, s, p in zip(spatial, out, kernel, stride, padding):
            start = np.arange(o) * s - p
            end = np.minimum(start + k, size + p)
            pool = end - start
            inside = np.minimum(end, size) - np.maximum(start, 0)
            sizes.append(pool if count_include_pad else inside)
        div = (sizes[0][:, None] * sizes[1][None, :]).reshape(-1)
        div = np.where(div > 0, div, 1)  # an empty window sums to 0 (torch writes 0)
        divisor = int(div[0]) if (div == div[0]).all() else div.astype(np.int64)
    index = _expand_planes(plane, valid, planes, hw, planes * hw)
    return PoolPlan(out, plane.shape[-1], planes * hw, not bool(valid.all()), index, None,
                    divisor)


@lru_cache(maxsize=16)
def adaptive_avg_pool_plan(shape, out) -> PoolPlan:
    spatial = shape[-2:]
    planes = prod(shape[:-2])
    taps, counts = [], []
    for size, o in zip(spatial, out):
        start = (np.arange(o) * size) // o
        end = -((-(np.arange(o) + 1) * size) // o)  # ceil
        k = int((end - start).max()) if o else 1
        pos = start[:, None] + np.arange(k)[None, :]
        taps.append((pos, pos < end[:, None]))
        counts.append(end - start)
    plane, valid = _grid(spatial, taps)
    div = (counts[0][:, None] * counts[1][None, :]).reshape(-1).astype(np.int64)
    divisor = int(div[0]) if div.size and (div == div[0]).all() else div
    index = _expand_planes(plane, valid, planes, prod(spatial), planes * prod(spatial))
    return PoolPlan(tuple(out), plane.shape[-1], planes * prod(spatial),
                    not bool(valid.all()), index, None, divisor)


# -- forward: gather the windows, reduce each ------------------------------------------------
def _windows(be, x, plan):
    flat = be.reshape(x, (plan.numel,))
    if plan.padded:
        flat = be.concatenate([flat, be.full((1,), 0, x.dtype)], 0)
    return be.reshape(be.getitem(flat, (plan.index,)), (-1, plan.window))


def _out_shape(x, plan):
    return tuple(x.shape[:-2]) + plan.out


def _max_pool_forward(be, self, kernel_size, stride, padding, dilation, ceil_mode):
    plan = max_pool_plan(*_max_args(self.shape, kernel_size, stride, padding, dilation,
                                    ceil_mode))
    shape = _out_shape(self, plan)
    fast = getattr(be, "max_pool_windows", None)
    if fast is not None:  # a numeric backend's one-pass kernel; None: it declines
        n_out = prod(plan.out)
        out = fast(self, plan.plane[:n_out], n_out)  # one plane's offsets: all planes' same
        if out is not None:
            return be.reshape(out[0], shape), be.reshape(out[1], shape)
    taps = _windows(be, self, plan)
    rows = np.arange(plan.index.size // plan.window, dtype=np.int64)
    first = be.argmax(taps, 1, False)  # the first maximum of each window (NaN: the first NaN)
    values = be.getitem(taps, (rows, first))
    indices = be.getitem(be.from_host(plan.plane), (rows, first))
    return be.reshape(values, shape), be.reshape(indices, shape)


def _avg_pool_forward(be, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                      divisor_override):
    plan = avg_pool_plan(*_avg_args(self.shape, kernel_size, stride, padding, ceil_mode,
                                    count_include_pad, divisor_override))
    return _mean_of_windows(be, self, plan)


def _adaptive_forward(be, self, output_size):
    plan = adaptive_avg_pool_plan(tuple(self.shape), tuple(output_size))
    return _mean_of_windows(be, self, plan)


def _mean_of_windows(be, x, plan):
    sums = be.sum(_windows(be, x, plan), (1,), False)
    div = plan.divisor
    if not isinstance(div, int):  # one divisor per output position, the same for each plane
        sums = be.reshape(sums, (-1, div.size))
        div = be.cast(be.from_host(div), x.dtype)
    return be.reshape(be.div(sums, div), _out_shape(x, plan))


# -- the saved arguments as the kernels read them -------------------------------------------
def _pair(v):
    return (v[0], v[0]) if len(v) == 1 else tuple(v)


def _max_args(shape, kernel_size, stride, padding, dilation, ceil_mode):
    k = _pair(kernel_size)
    return (tuple(shape), k, _pair(stride) if len(stride) else k, _pair(padding),
            _pair(dilation), bool(ceil_mode))


def _avg_args(shape, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override):
    k = _pair(kernel_size)
    return (tuple(shape), k, _pair(stride) if len(stride) else k, _pair(padding),
            bool(ceil_mode), bool(count_include_pad), divisor_override)


# -- backward: scatter-add into the input ------------------------------------------------------
def _scatter(values, index, numel, padded, sizes):
    flat = _apply("index_backward", (values.reshape(-1),),
                  {"indices": (index,), "input_sizes": (numel + (1 if padded else 0),)})
    if padded:
        flat = flat[:numel]
    return flat.reshape(tuple(sizes))


def _max_pool_grad(grad, self, result1, kernel_size, stride, padding, dilation, ceil_mode):
    """The gradient goes to the index the forward returned (torch's rule at ties)."""
    sizes = tuple(self.shape)
    hw = sizes[-1] * sizes[-2]
    planes = prod(sizes[:-2])
    be = _tl.backend_for(result1.device.type)
    picked = np.asarray(be.to_host(result1._data), dtype=np.int64).reshape(planes, -1)
    index = (picked + np.arange(planes, dtype=np.int64)[:, None] * hw).reshape(-1)
    return _scatter(grad, index, planes * hw, False, sizes)


def _spread_mean(grad, plan, sizes):
    div = plan.divisor
    if isinstance(div, int):
        g = grad.reshape(-1, 1) / div
    else:
        g = grad.reshape(-1, div.size, 1) / _tl.tensor(div.reshape(-1, 1), device=grad.device)
    g = g.reshape(-1, 1).expand(-1, plan.window)
    return _scatter(g, plan.index, plan.numel, plan.padded, sizes)


def _avg_pool_grad(grad, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                   divisor_override):
    plan = avg_pool_plan(*_avg_args(self.shape, kernel_size, stride, padding, ceil_mode,
                                    count_include_pad, divisor_override))
    return _spread_mean(grad, plan, self.shape)


def _adaptive_grad(grad, self):
    plan = adaptive_avg_pool_plan(tuple(self.shape), tuple(grad.shape[-2:]))
    return _spread_mean(grad, plan, self.shape)


# -- readable meanings (the Inspector's formula line), the node's numbers put in -------------
def _planes(shape) -> list[str]:
    """Index names of the dims before the two pooled ones: ``n,c`` or ``c``."""
    lead = len(shape) - 2 if shape is not None else 2
    return ["n", "c"][2 - lead:] if 0 <= lead <= 2 else [r"\dots"]


def _bar_at(out: str, lead: list[str]) -> str:
    """The output's gradient at one window: ``\\bar{y}[n,c,i,j]``."""
    return _tex.index(r"\bar{" + out + "}", lead + ["i", "j"])


def _window(names, params, shapes, taps=("p", "q")):
    """(x, leading index, x at the window tap, tap bounds, kernel, padding) of a pool."""
    k = _tex.ints(params.get("kernel_size"), 2)
    s = _tex.ints(params.get("stride"), 2, k)
    pad = _tex.ints(params.get("padding"), 2, (0,))
    d = _tex.ints(params.get("dilation"), 2, (1,))
    used = [t if size > 1 else None for t, size in zip(taps, k)]
    lead = _planes(shapes.get("self"))
    at = [_tex.window_index(o, t, st, di, pa)
          for o, t, st, di, pa in zip(("i", "j"), used, s, d, pad)]
    bounds = _tex.bounds([t for t in used if t], [n for t, n in zip(used, k) if t])
    return names["self"], lead, _tex.index(names["self"], lead + at), bounds, k, pad


def _max_pool_tex(names, out, params, shapes):
    """``y[n,c,i,j] = max_{p<kh,q<kw} x[n,c, s·i+d·p−pad, …]`` (padding never wins)."""
    x, lead, x_at, bounds, _k, pad = _window(names, params, shapes)
    y_at = _tex.index(out, lead + ["i", "j"])
    forward = rf"{y_at} = \max_{{{bounds}}} {x_at}" if bounds else f"{y_at} = {x_at}"
    if any(pad):
        forward += r"\quad(\text{padding is skipped})"
    star = _window(names, params, shapes, ("p^*", "q^*"))[2]
    vjp = (rf"\bar{{{x}}}{star[len(x):]} \mathrel{{+}}= "
           rf"{_bar_at(out, lead)}"
           r"\quad(p^*,q^*\text{: the first maximum, saved as indices})")
    return forward, vjp


def _avg_pool_tex(names, out, params, shapes):
    """``y[n,c,i,j] = 1/N Σ_{p<kh,q<kw} x[n,c, s·i+p−pad, …]`` with torch's divisor N."""
    x, lead, x_at, bounds, k, pad = _window(names, params, shapes)
    override = params.get("divisor_override")
    ceil_mode = bool(params.get("ceil_mode"))
    include = bool(params.get("count_include_pad", True))
    if override:
        div, note = str(int(override)), ""
    elif not ceil_mode and (include or not any(pad)):
        div, note = str(k[0] * k[1]), ""
    else:
        where = "padded input" if include else "input"
        div, note = "N_{ij}", rf"\quad(N_{{ij}}\text{{: window positions inside the {where}}})"
    y_at = _tex.index(out, lead + ["i", "j"])
    total = rf"\sum_{{{bounds}}} {x_at}" if bounds else x_at
    forward = rf"{y_at} = \frac{{1}}{{{div}}}{total}{note}"
    if any(pad) and include:
        forward += r"\quad(\text{zero in the padding})"
    vjp = (rf"\bar{{{x}}}{x_at[len(x):]} \mathrel{{+}}= "
           rf"{_bar_at(out, lead)} / {div}")
    return forward, vjp


def _adaptive_range(tap: str, var: str, size: int, out: int) -> str:
    r"""``2i\le p<2i+2`` (even split) or ``floor(H i/h) <= p < ceil(H (i+1)/h)``."""
    if out and size % out == 0:
        k = size // out
        lo = _tex.window_index(var, None, k, 1, 0)
        return f"{tap}={var}" if k == 1 else rf"{lo}\le {tap}<{lo}+{k}"
    return (rf"\lfloor {size}{var}/{out}\rfloor\le {tap}<"
            rf"\lceil {size}({var}+1)/{out}\rceil")


def _adaptive_tex(names, out, params, shapes):
    """``y[n,c,i,j] = mean over p in [⌊Hi/h⌋, ⌈H(i+1)/h⌉), q likewise, of x[n,c,p,q]``."""
    xs, ys = shapes.get("self"), shapes.get("result")
    if xs is None or ys is None or len(xs) < 2 or len(ys) < 2:
        return None
    x, lead = names["self"], _planes(xs)
    ranges = r",\; ".join(_adaptive_range(t, v, xs[d], ys[d])
                           for t, v, d in (("p", "i", -2), ("q", "j", -1)))
    y_at = _tex.index(out, lead + ["i", "j"])
    forward = rf"{y_at} = \operatorname{{mean}}_{{{ranges}}} {_tex.index(x, lead + ['p', 'q'])}"
    vjp = (rf"\bar{{{x}}}{_tex.index('', lead + ['p', 'q'])} \mathrel{{+}}= "
           rf"{_bar_at(out, lead)} / N_{{ij}}"
           r"\quad(\text{every window }(i,j)\text{ holding }(p,q))")
    return forward, vjp


register(OpSpec(
    "max_pool2d_with_indices", "MaxPool2DWithIndicesBackward0", ("self",), _max_pool_forward,
    {"self": _max_pool_grad}, STRUCTURAL, dtype_rule="same", outputs=("result", "result1"),
    formula_tex=_max_pool_tex, fused_backward="max_pool2d_with_indices_backward",
    doc="values and (non-differentiable) in-plane indices of each window's first maximum."))
register(OpSpec(
    "avg_pool2d", "AvgPool2DBackward0", ("self",), _avg_pool_forward,
    {"self": _avg_pool_grad}, STRUCTURAL, dtype_rule="same", formula_tex=_avg_pool_tex))
register(OpSpec(
    "adaptive_avg_pool2d", "AdaptiveAvgPool2DBackward0", ("self",), _adaptive_forward,
    {"self": _adaptive_grad}, STRUCTURAL, dtype_rule="same", formula_tex=_adaptive_tex,
    doc="windows [floor(i*H/out), ceil((i+1)*H/out)); torch records MeanBackward1 at 1x1."))
