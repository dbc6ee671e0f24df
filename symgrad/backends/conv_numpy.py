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

__all__ = ["BlockKernels", "Geometry", "accepts", "backward", "backward_blocked", "block_images",
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


# -- blocked over images: the columns of a block stay in cache (cpu backend) --------------------
#: bytes of one block's columns (a block is at least one image): L2-sized. The whole batch's
#: columns (LeNet's conv1: 3.7 MB) go out to memory and back on every pass, which costs more
#: than the products on these machines; a block's are written, multiplied and dropped in cache.
BLOCK_BYTES = 1 << 18


@dataclass(frozen=True)
class BlockKernels:
    """A backend's passes over one block of images (columns laid out (C, kernel..., images,
    out...), i.e. (groups, rows, images * P)): ``gather(x_block, geo, cols)``,
    ``scatter(cols, geo, dx_block)`` (dx_block overwritten) and ``grad_t(g_block, gt, acc,
    want_bias)`` (gt (O, images, P) = g_block transposed; acc (O, P) float64 += the sums
    over the block's images, for the bias gradient)."""

    gather: Callable
    scatter: Callable
    grad_t: Callable


def block_images(geo: Geometry, itemsize: int) -> int:
    """Images per block: as many as keep one block's columns within BLOCK_BYTES."""
    per_image = geo.c * prod(geo.kernel) * geo.positions * itemsize
    return max(1, min(geo.n, BLOCK_BYTES // max(per_image, 1)))


def _blocks(geo: Geometry, nb: int):
    """(start, stop, the block's geometry) for each block of ``nb`` images."""
    for n0 in range(0, geo.n, nb):
        m = min(nb, geo.n - n0)
        yield n0, n0 + m, replace(geo, n=m)


def forward_blocked(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, geo: Geometry,
                    kern: BlockKernels, alloc: Alloc = np.empty) -> np.ndarray:
    """``forward`` a block of images at a time: gather, one product per group ``W (og, rows)
    @ cols (rows, images * P)``, then the block's (O, images, P) result copied into the
    output transposed, the bias added in the same pass."""
    g, og, rows, p = geo.groups, geo.o // geo.groups, geo.rows, geo.positions
    x = np.ascontiguousarray(x)
    nb = block_images(geo, x.dtype.itemsize)
    out = alloc((geo.n, geo.o, p), x.dtype)
    cols_buf = alloc((g * rows * nb * p,), x.dtype)
    res_buf = alloc((geo.o * nb * p,), x.dtype)
    wg = w.reshape(g, og, rows)
    bias = None if b is None else b.reshape(1, geo.o, 1)
    for n0, n1, sub in _blocks(geo, nb):
        m = n1 - n0
        cols = cols_buf[:g * rows * m * p].reshape(g, rows, m * p)
        kern.gather(x[n0:n1], sub, cols)
        res = res_buf[:geo.o * m * p].reshape(g, og, m * p)
        np.matmul(wg, cols, out=res)
        res_t = res.reshape(geo.o, m, p).transpose(1, 0, 2)
        if bias is None:
            np.copyto(out[n0:n1], res_t)
        else:
            np.add(res_t, bias, out=out[n0:n1])
    return out.reshape((geo.n, geo.o) + geo.out)


def backward_blocked(grad: np.ndarray, needed, x: np.ndarray, w: np.ndarray, geo: Geometry,
                     kern: BlockKernels, alloc: Alloc = np.empty) -> tuple:
    """``backward`` a block of images at a time, each block's gradient transposed once:
    input gradient ``W^T @ g`` then col2im into the block's rows of dx; weight gradient
    ``g @ cols^T`` (the columns gathered again from the saved input) added over the blocks;
    bias gradient summed in float64 along with the transpose."""
    g, og, rows, p = geo.groups, geo.o // geo.groups, geo.rows, geo.positions
    need_x, need_w = bool(needed[0]), bool(needed[1])
    need_b = len(needed) > 2 and bool(needed[2])
    grad = np.ascontiguousarray(grad).reshape(geo.n, geo.o, p)
    x = np.ascontiguousarray(x)
    dt = grad.dtype
    nb = block_images(geo, dt.itemsize)
    gt_buf = alloc((geo.o * nb * p,), dt)
    cols_buf = alloc((g * rows * nb * p,), dt) if need_x or need_w else None
    acc = np.zeros((geo.o, p), np.float64)
    dx = alloc((geo.n, geo.c) + geo.spatial, dt) if need_x else None
    gw = np.zeros((g, og, rows), dt) if need_w else None
    part = np.empty((g, og, rows), dt) if need_w else None
    wg = w.reshape(g, og, rows)
    for n0, n1, sub in _blocks(geo, nb):
        m = n1 - n0
        gt = gt_buf[:geo.o * m * p]
        kern.grad_t(grad[n0:n1], gt.reshape(geo.o, m, p), acc, need_b)
        gt = gt.reshape(g, og, m * p)
        cols = None if cols_buf is None else cols_buf[:g * rows * m * p].reshape(g, rows,
                                                                                 m * p)
        if need_w:
            kern.gather(x[n0:n1], sub, cols)
            np.matmul(gt, cols.transpose(0, 2, 1), out=part)
            np.add(gw, part, out=gw)
        if need_x:
            np.matmul(wg.transpose(0, 2, 1), gt, out=cols)
            kern.scatter(cols, sub, dx[n0:n1])
    gb = acc.sum(1).astype(dt) if need_b else None
    return dx, None if gw is None else gw.reshape(w.shape), gb
