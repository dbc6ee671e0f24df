"""Convolution on NumPy arrays: the op's fast kernels for the numpy and cpu backends.

``symgrad/ops/conv.py`` defines the convolution once (its generic lowering, the backward
formulas, the SymPy meaning); ``be.convolution`` (numpy and cpu backends) and the fused
``be.convolution_backward`` (cpu backend; the NumPy oracle runs the formulas, as for every
fused op) compute the same numbers from these functions without the per-tap slices, the
``stack`` and the int64 col2im index of the generic path. The cuda backend follows the
same layout with its own launches.

* im2col writes every tap of every image into ONE contiguous buffer laid out per image,
  ``(N, C, kernel..., out...)``, viewed as ``(N, groups, rows, P)`` (rows = C/groups *
  prod(kernel), P = prod(out)); the NumPy gather is one ``copyto`` from an
  ``as_strided`` view of the (zero-padded) input, the cpu backend passes a Numba loop;
* the forward is ONE batched BLAS product ``W (groups, O/groups, rows) @ cols``, whose
  result ``(N, groups, O/groups, P)`` already *is* the output ``(N, O, out...)`` channels
  first: no transpose, no copy. Per-image products also beat one wide ``(O, rows) @
  (rows, N*P)`` product here: OpenBLAS is slow on a 16-row left operand (LeNet's conv2,
  1 thread: 0.17 ms against 0.44 ms);
* the incoming gradient ``(N, O, out...)`` is already in the layout of the backward
  products: input gradient ``W^T @ grad`` then col2im (a tap loop here, a Numba loop on
  the cpu backend); weight gradient ``cols @ grad^T`` per image summed over the batch,
  with the columns gathered again from the saved input (torch saves the input, not the
  columns); bias gradient a sum.

The cpu backend runs these passes a block of images at a time (``forward_blocked``,
``backward_blocked``): one block's columns (``BLOCK_BYTES``) are written, multiplied and
dropped while in cache, where the whole batch's would go out to memory and back. With
stride 1 and no padding it uses *wide* columns (``forward_wide``, ``backward_wide``): the
positions run over the input's full width, ``q = oh * W + ow`` up to the last output, so
each tap's columns are one contiguous run of the input plane (long copies and adds, where
the plain columns copy rows of OW elements: 8 in LeNet's conv2); the product's columns
with ``ow >= OW`` are no outputs and are dropped, and the gradient is spread with zeros
there.

float32 stays float32. What a kernel does not cover (integers, mixed dtypes, object
arrays, empty batches or outputs, transposed convolutions) it declines by returning None,
and the generic lowering or the formulas run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import product
from math import prod

import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = ["Geometry", "accepts", "backward", "backward_blocked", "block_images",
           "forward", "forward_blocked", "gather", "geometry", "scatter"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True)
class Geometry:
    """One convolution's sizes, every per-dim argument spelled out for every dim."""

    n: int
    c: int
    spatial: tuple[int, ...]
    o: int
    kernel: tuple[int, ...]
    out: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    @property
    def rows(self) -> int:
        """The inner size of the products: C/groups * prod(kernel)."""
        return self.c // self.groups * prod(self.kernel)

    @property
    def positions(self) -> int:
        return prod(self.out)

    @property
    def columns_shape(self) -> tuple[int, ...]:
        return (self.n, self.c) + self.kernel + self.out


def _full(v, dims: int) -> tuple[int, ...]:
    """torch saves ``[1]`` for every dim as given; spell it out."""
    v = tuple(int(a) for a in v)
    return v * dims if len(v) == 1 else v


@lru_cache(maxsize=32)
def _geometry(x_shape, w_shape, stride, padding, dilation, groups) -> Geometry | None:
    dims = len(x_shape) - 2
    stride, padding, dilation = (_full(v, dims) for v in (stride, padding, dilation))
    kernel = tuple(w_shape[2:])
    out = tuple((s + 2 * p - d * (k - 1) - 1) // st + 1
                for s, k, st, p, d in zip(x_shape[2:], kernel, stride, padding, dilation))
    if dims < 1 or x_shape[0] == 0 or min(out) <= 0 or 0 in w_shape:
        return None
    return Geometry(x_shape[0], x_shape[1], tuple(x_shape[2:]), w_shape[0], kernel, out,
                    stride, padding, dilation, int(groups))


def geometry(x_shape, w_shape, stride, padding, dilation, groups) -> Geometry | None:
    """The cached geometry, or None where these kernels do not apply (empty sizes)."""
    return _geometry(tuple(x_shape), tuple(w_shape), tuple(stride), tuple(padding),
                     tuple(dilation), int(groups))


def accepts(*arrays) -> bool:
    """NumPy float arrays of one dtype (None entries skipped): what these kernels take."""
    dt = None
    for a in arrays:
        if a is None:
            continue
        if type(a) is not np.ndarray or a.dtype not in _FLOATS or (dt is not None
                                                                   and a.dtype != dt):
            return False
        dt = a.dtype
    return True


# -- im2col / col2im in NumPy -------------------------------------------------------------------
def gather(x: np.ndarray, geo: Geometry, cols: np.ndarray) -> None:
    """im2col into ``cols`` (N, C, kernel..., out...): one copy from a strided view."""
    if any(geo.padding):
        xp = np.zeros((geo.n, geo.c) + tuple(s + 2 * p for s, p in zip(geo.spatial,
                                                                         geo.padding)),
                      x.dtype)
        xp[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in
                                              zip(geo.padding, geo.spatial))] = x
        x = xp
    st = x.strides
    view = as_strided(x, geo.columns_shape,
                      st[:2] + tuple(s * d for s, d in zip(st[2:], geo.dilation))
                      + tuple(s * k for s, k in zip(st[2:], geo.stride)), writeable=False)
    np.copyto(cols, view)


def scatter(cols: np.ndarray, geo: Geometry) -> np.ndarray:
    """col2im: ``cols`` (N, C, kernel..., out...) added back onto a zero input, one tap at
    a time (each tap's window is one strided slice of the padded input)."""
    padded = tuple(s + 2 * p for s, p in zip(geo.spatial, geo.padding))
    dx = np.zeros((geo.n, geo.c) + padded, cols.dtype)
    all2 = (slice(None), slice(None))
    for tap in product(*(range(k) for k in geo.kernel)):
        window = tuple(slice(i * d, i * d + s * (o - 1) + 1, s) for i, d, s, o in
                       zip(tap, geo.dilation, geo.stride, geo.out))
        dx[all2 + window] += cols[all2 + tap]
    if any(geo.padding):
        dx = np.ascontiguousarray(dx[all2 + tuple(slice(p, p + s) for p, s in
                                                  zip(geo.padding, geo.spatial))])
    return dx


# -- the kernels, parametrised by the backend's gather, scatter and allocator -----------------
Gather = Callable[[np.ndarray, Geometry, np.ndarray], None]
Scatter = Callable[[np.ndarray, Geometry], np.ndarray]
Alloc = Callable[[tuple, np.dtype], np.ndarray]


def forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, geo: Geometry,
            gather_fn: Gather = gather, alloc: Alloc = np.empty) -> np.ndarray:
    """im2col + one batched product; the product's result is the (N, O, out...) output."""
    g = geo.groups
    cols = alloc(geo.columns_shape, x.dtype)
    gather_fn(x, geo, cols)
    out = alloc((geo.n, g, geo.o // g, geo.positions), x.dtype)
    np.matmul(w.reshape(g, geo.o // g, geo.rows), cols.reshape(geo.n, g, geo.rows,
                                                               geo.positions), out=out)
    if b is not None:
        flat = out.reshape(geo.n, geo.o, geo.positions)
        np.add(flat, b.reshape(geo.o, 1), out=flat)
    return out.reshape((geo.n, geo.o) + geo.out)


def backward(grad: np.ndarray, needed, x: np.ndarray, w: np.ndarray, geo: Geometry,
             gather_fn: Gather = gather, scatter_fn: Scatter = scatter,
             alloc: Alloc = np.empty) -> tuple:
    """(input, weight, bias) gradients, None where not needed (the op's three formulas)."""
    g, og, rows, p = geo.groups, geo.o // geo.groups, geo.rows, geo.positions
    g4 = grad.reshape(geo.n, g, og, p)
    gx = gw = gb = None
    if needed[0]:
        dcols = alloc(geo.columns_shape, grad.dtype)
        np.matmul(w.reshape(g, og, rows).transpose(0, 2, 1), g4,
                  out=dcols.reshape(geo.n, g, rows, p))
        gx = scatter_fn(dcols, geo)
    if needed[1]:
        cols = alloc(geo.columns_shape, grad.dtype)
        gather_fn(x, geo, cols)
        per_image = alloc((geo.n, g, rows, og), grad.dtype)
        np.matmul(cols.reshape(geo.n, g, rows, p), g4.transpose(0, 1, 3, 2), out=per_image)
        gw = np.ascontiguousarray(per_image.sum(0).transpose(0, 2, 1)).reshape(w.shape)
    if len(needed) > 2 and needed[2]:
        gb = grad.reshape(geo.n, geo.o, p).sum((0, 2))
    return gx, gw, gb


# -- blocked over images (cpu backend): one block's columns stay in cache --------------------
#: bytes of one block's columns (a block is at least one image), half the L2 size: the whole
#: batch's columns (LeNet's conv1: 3.7 MB) would go out to memory and back on every pass.
BLOCK_BYTES = 1 << 19


def block_images(geo: Geometry, itemsize: int) -> int:
    """Images per block: as many as keep one block's columns within BLOCK_BYTES."""
    per_image = geo.c * prod(geo.kernel) * geo.positions * itemsize
    return max(1, min(geo.n, BLOCK_BYTES // max(per_image, 1)))


@lru_cache(maxsize=64)
def _sub(geo: Geometry, m: int) -> Geometry:
    return replace(geo, n=m)


def _blocks(geo: Geometry, nb: int):
    """(start, stop, the block's geometry) for each block of ``nb`` images."""
    for n0 in range(0, geo.n, nb):
        m = min(nb, geo.n - n0)
        yield n0, n0 + m, _sub(geo, m)


ScatterInto = Callable[[np.ndarray, Geometry, np.ndarray], None]


def forward_blocked(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, geo: Geometry,
                    gather_fn: Gather, alloc: Alloc = np.empty) -> np.ndarray:
    """``forward`` a block of images at a time: the block's columns gathered into one
    reused buffer, the product written straight into the block's rows of the output and
    the bias added there (still in cache)."""
    g, og, rows, p = geo.groups, geo.o // geo.groups, geo.rows, geo.positions
    x = np.ascontiguousarray(x)
    nb = block_images(geo, x.dtype.itemsize)
    per = g * rows * p
    out = alloc((geo.n, g, og, p), x.dtype)
    cols_buf = alloc((nb * per,), x.dtype)
    wg = w.reshape(g, og, rows)
    bias = None if b is None else b.reshape(geo.o, 1)
    for n0, n1, sub in _blocks(geo, nb):
        m = n1 - n0
        cols = cols_buf[:m * per]
        gather_fn(x[n0:n1], sub, cols.reshape(sub.columns_shape))
        block = out[n0:n1]
        np.matmul(wg, cols.reshape(m, g, rows, p), out=block)
        if bias is not None:
            flat = block.reshape(m, geo.o, p)
            np.add(flat, bias, out=flat)
    return out.reshape((geo.n, geo.o) + geo.out)


def backward_blocked(grad: np.ndarray, needed, x: np.ndarray, w: np.ndarray, geo: Geometry,
                     gather_fn: Gather, scatter_into: ScatterInto,
                     alloc: Alloc = np.empty) -> tuple:
    """``backward`` a block of images at a time through one reused column buffer: input
    gradient ``W^T @ grad`` then col2im into the block's rows of dx; weight gradient from
    the block's columns gathered again, its per-image products summed per block and added
    up; bias gradient as products with a ones vector (NumPy's sum over a short last axis
    is several times slower)."""
    g, og, rows, p = geo.groups, geo.o // geo.groups, geo.rows, geo.positions
    grad = np.ascontiguousarray(grad)
    x = np.ascontiguousarray(x)
    dt = grad.dtype
    g4 = grad.reshape(geo.n, g, og, p)
    nb = block_images(geo, dt.itemsize)
    per = g * rows * p
    need_x, need_w = bool(needed[0]), bool(needed[1])
    cols_buf = alloc((nb * per,), dt) if need_x or need_w else None
    gx = alloc((geo.n, geo.c) + geo.spatial, dt) if need_x else None
    gw = part = total = None
    if need_w:
        gw = np.zeros((g, rows, og), dt)
        part = alloc((nb, g, rows, og), dt)
        total = np.empty((g, rows, og), dt)
    wt = w.reshape(g, og, rows).transpose(0, 2, 1)
    for n0, n1, sub in _blocks(geo, nb) if need_x or need_w else ():
        m = n1 - n0
        cols = cols_buf[:m * per].reshape(m, g, rows, p)
        g_block = g4[n0:n1]
        if need_x:
            np.matmul(wt, g_block, out=cols)
            scatter_into(cols.reshape(sub.columns_shape), sub, gx[n0:n1])
        if need_w:
            gather_fn(x[n0:n1], sub, cols.reshape(sub.columns_shape))
            np.matmul(cols, g_block.transpose(0, 1, 3, 2), out=part[:m])
            np.add.reduce(part[:m], axis=0, out=total)
            np.add(gw, total, out=gw)
    if need_w:
        gw = np.ascontiguousarray(gw.transpose(0, 2, 1)).reshape(w.shape)
    gb = None
    if len(needed) > 2 and needed[2]:
        gb = np.matmul(grad.reshape(geo.n * geo.o, p), np.ones(p, dt)).reshape(
            geo.n, geo.o).sum(0)
    return gx, gw, gb


# -- stride 1 without padding: "wide" columns over the input's full width (cpu backend) ---------
def wide_positions(geo: Geometry) -> int:
    """P = (OH-1)*W + OW: the wide columns' positions q = oh*W + ow (ow < W) up to the last
    output (a conv1d: OW)."""
    w = geo.spatial[-1]
    return (prod(geo.out[:-1]) - 1) * w + geo.out[-1]


def forward_wide(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, geo: Geometry,
                 gather_wide: Callable, outputs: Callable,
                 alloc: Alloc = np.empty) -> np.ndarray:
    """``forward_blocked`` on wide columns (stride 1, no padding): every tap's columns are
    one contiguous run of the input (``gather_wide(x_block, geo, cols, clean)``); the
    product's columns that are no outputs are dropped when the block's result is copied
    into the output (the bias added in the same pass)."""
    g, og, rows, pw = geo.groups, geo.o // geo.groups, geo.rows, wide_positions(geo)
    x = np.ascontiguousarray(x)
    dt = x.dtype
    nb = block_images(geo, dt.itemsize)
    per = g * rows * pw
    out = alloc((geo.n, geo.o) + geo.out, dt)
    out4 = out.reshape(geo.n, geo.o, -1, geo.out[-1])
    cols_buf = alloc((nb * per,), dt)
    res_buf = alloc((nb * geo.o * pw,), dt)
    wg = w.reshape(g, og, rows)
    bias = None if b is None else np.ascontiguousarray(b)
    for n0, n1, sub in _blocks(geo, nb):
        m = n1 - n0
        cols = cols_buf[:m * per].reshape(m, g, rows, pw)
        gather_wide(x[n0:n1], sub, cols, False)
        res = res_buf[:m * geo.o * pw].reshape(m, g, og, pw)
        np.matmul(wg, cols, out=res)
        outputs(res.reshape(m, geo.o, pw), bias, out4[n0:n1])
    return out


def backward_wide(grad: np.ndarray, needed, x: np.ndarray, w: np.ndarray, geo: Geometry,
                  gather_wide: Callable, scatter_wide: ScatterInto, spread: Callable,
                  alloc: Alloc = np.empty) -> tuple:
    """``backward_blocked`` on wide columns: the block's gradient is spread into a zeroed
    wide buffer (zeros at the columns that are no outputs); the weight gradient's columns
    are gathered with those columns zeroed too (0 * 0: nothing added, whatever the input
    holds); the input gradient's wide columns ``W^T @ g`` are 0 there when the weight is
    finite (the caller's condition) and are added back as contiguous runs."""
    g, og, rows, pw = geo.groups, geo.o // geo.groups, geo.rows, wide_positions(geo)
    grad = np.ascontiguousarray(grad)
    x = np.ascontiguousarray(x)
    dt = grad.dtype
    nb = block_images(geo, dt.itemsize)
    per = g * rows * pw
    need_x, need_w = bool(needed[0]), bool(needed[1])
    gx = gw = gb = part = total = None
    if need_x or need_w:
        cols_buf = alloc((nb * per,), dt)
        wide_buf = alloc((nb * geo.o * pw,), dt)
        clean = need_w and not bool(np.isfinite(x).all())  # else 0 * x adds nothing
        g4 = grad.reshape(geo.n, geo.o, -1, geo.out[-1])
        wt = w.reshape(g, og, rows).transpose(0, 2, 1)
        if need_x:
            gx = alloc((geo.n, geo.c) + geo.spatial, dt)
        if need_w:
            gw = np.zeros((g, rows, og), dt)
            part = alloc((nb, g, rows, og), dt)
            total = np.empty((g, rows, og), dt)
        for n0, n1, sub in _blocks(geo, nb):
            m = n1 - n0
            cols = cols_buf[:m * per].reshape(m, g, rows, pw)
            wide = wide_buf[:m * geo.o * pw].reshape(m, geo.o, pw)
            spread(g4[n0:n1], wide)
            wide = wide.reshape(m, g, og, pw)
            if need_x:
                np.matmul(wt, wide, out=cols)
                scatter_wide(cols, sub, gx[n0:n1])
            if need_w:
                gather_wide(x[n0:n1], sub, cols, clean)
                np.matmul(cols, wide.transpose(0, 1, 3, 2), out=part[:m])
                np.add.reduce(part[:m], axis=0, out=total)
                np.add(gw, total, out=gw)
        if need_w:
            gw = np.ascontiguousarray(gw.transpose(0, 2, 1)).reshape(w.shape)
    if len(needed) > 2 and needed[2]:
        p = geo.positions
        gb = np.matmul(grad.reshape(geo.n * geo.o, p), np.ones(p, dt)).reshape(
            geo.n, geo.o).sum(0)
    return gx, gw, gb
