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
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from math import prod

import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = ["Geometry", "accepts", "backward", "forward", "gather", "geometry", "scatter"]

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
