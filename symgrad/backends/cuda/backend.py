"""CudaBackend: the kernel interface of ``numpy_backend.py`` on numba.cuda device arrays.

A tensor's data on "cuda" is a :class:`CudaArray`: a block of device memory from the
allocator plus (shape, element strides, element offset), so views (reshape, transpose,
expand, basic indexing) share the block and cost no bytes and no launch. Every op runs
as one or more kernel launches from ``kernels.py`` with no host copy; the only transfers
are ``from_host``/``to_host`` (``Tensor.to``), reading a scalar (``item``), and the
host-side bounds checks the indexing layer performs on index tensors (as PyTorch syncs
for boolean masks).
"""

from __future__ import annotations

import math
import operator

import numpy as np

from ...ops import OPS
from ...ops.elementwise import (
    fused_from_stanza,
    grad_mask_args,
    grad_mask_name,
    grad_masks,
    scalar_kernels,
)
from ..base import view_strides
from ..conv_numpy import geometry as conv_geometry
from ..numpy_backend import NumpyBackend, constant_value
from . import allocator
from . import kernels as K

__all__ = ["CudaArray", "CudaBackend"]

_FLOAT_KINDS = "f"


class _Flags:
    __slots__ = ("c_contiguous", "writeable")

    def __init__(self, c_contiguous: bool, writeable: bool) -> None:
        self.c_contiguous = c_contiguous
        self.writeable = writeable

    @property
    def f_contiguous(self) -> bool:
        return False


def _contig_strides(shape) -> tuple:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class CudaArray:
    """A strided view of a device block: the array type the CUDA backend computes on."""

    __slots__ = ("block", "shape", "estrides", "offset", "dtype", "writeable", "__weakref__")

    def __init__(self, block, shape, estrides, offset: int, dtype, writeable: bool = True):
        self.block = block
        self.shape = tuple(int(s) for s in shape)
        self.estrides = tuple(int(s) for s in estrides)
        self.offset = int(offset)
        self.dtype = np.dtype(dtype)
        self.writeable = writeable

    # numpy-like metadata (what Tensor, apply and the engine read)
    @property
    def buf(self):
        return self.block.data

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return _prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def strides(self) -> tuple:
        return tuple(s * self.dtype.itemsize for s in self.estrides)

    @property
    def is_contiguous(self) -> bool:
        if self.size == 0:
            return True
        expect = 1
        for s, st in zip(reversed(self.shape), reversed(self.estrides)):
            if s != 1 and st != expect:
                return False
            expect *= s
        return True

    @property
    def flags(self) -> _Flags:
        return _Flags(self.is_contiguous, self.writeable)

    @property
    def __cuda_array_interface__(self) -> dict:
        ptr = 0
        iface = getattr(self.buf, "__cuda_array_interface__", None)
        if iface is not None:
            ptr = iface["data"][0] + self.offset * self.itemsize
        return {"shape": self.shape, "strides": self.strides, "typestr": self.dtype.str,
                "data": (ptr, not self.writeable), "version": 3}

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"CudaArray(shape={self.shape}, dtype={self.dtype}, strides={self.estrides})"

    # host reads (each one device->host transfer; used by host-side checks and printing)
    def copy_to_host(self) -> np.ndarray:
        return CudaBackend.to_host(self)

    def __array__(self, dtype=None, copy=None):
        a = CudaBackend.to_host(self)
        return a if dtype is None else a.astype(dtype)

    def item(self):
        return self.copy_to_host().reshape(()).item() if self.size == 1 else \
            self.copy_to_host().item()

    def sum(self):
        return CudaBackend.to_host(CudaBackend.sum(self))[()]

    def min(self):
        return CudaBackend.to_host(CudaBackend.amin(self))[()]

    def max(self):
        return CudaBackend.to_host(CudaBackend.amax(self))[()]

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return CudaBackend.reshape(self, shape)


# -- helpers ------------------------------------------------------------------------------------
def _new(shape, dtype) -> CudaArray:
    shape = tuple(int(s) for s in shape)
    blk = allocator.allocate(_prod(shape), dtype)
    return CudaArray(blk, shape, _contig_strides(shape), 0, dtype)


def _kshape(shape) -> tuple:
    return tuple(shape) if shape else (1,)


def _bstrides(x: CudaArray, out_shape: tuple, ndim: int | None = None) -> tuple:
    """The element strides of x's first ``ndim`` dims (all by default) broadcast to
    ``out_shape`` (0 where x is broadcast)."""
    ndim = x.ndim if ndim is None else ndim
    lead = len(out_shape) - ndim
    out = []
    for d, s in enumerate(out_shape):
        if d < lead:
            out.append(0)
            continue
        xs = x.shape[d - lead]
        out.append(0 if xs == 1 and s != 1 else x.estrides[d - lead])
    return tuple(out)


def _operand(x, out_shape: tuple):
    """A kernel operand over ``out_shape``: flat, strided, or a scalar constant."""
    if not isinstance(x, CudaArray):
        return (K.CONST, x)
    if x.shape == out_shape and x.is_contiguous:
        return (x.buf, x.offset, None)
    st = _bstrides(x, out_shape) if out_shape else (0,)
    return (x.buf, x.offset, st)


def _is_array(x) -> bool:
    return isinstance(x, CudaArray)


def _scalar_py(x):
    if isinstance(x, np.generic):
        return x  # strong NumPy scalar: keeps its dtype in promotion
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return x[()]
    return x


def _result_dtype(*xs) -> np.dtype:
    return np.result_type(*[x.dtype if _is_array(x) else _scalar_py(x) for x in xs])


def _to_device_array(x) -> CudaArray:
    """Host data (numpy array, list) used as an operand: copied to the device."""
    return CudaBackend.from_host(np.asarray(x))


def _coerce(x):
    if _is_array(x) or isinstance(x, (bool, int, float, np.generic)):
        return x
    if hasattr(x, "_data"):  # a Tensor passed as a param
        return x._data
    return _to_device_array(x)


def _ew(fn: str, xs, out_dtype, *, compute_dtype=None) -> CudaArray:
    """Elementwise ``fn`` over broadcast operands (arrays or scalars) into a new array."""
    xs = [_coerce(x) for x in xs]
    shapes = [x.shape for x in xs if _is_array(x)]
    shape = tuple(np.broadcast_shapes(*shapes)) if shapes else ()
    cd = np.dtype(compute_dtype) if compute_dtype is not None else None
    ops = []
    for x in xs:
        if _is_array(x):
            ops.append(_operand(x, shape))
        else:
            v = _scalar_py(x)
            ops.append((K.CONST, cd.type(v) if cd is not None else v))
    out = _new(shape, out_dtype)
    K.elementwise(fn, out.size, _kshape(shape), [(out.buf, 0, None)], ops)
    return out


def _ew_into(fn: str, dst: CudaArray, xs) -> None:
    """``dst[...] = fn(xs...)`` in place (dst may be a strided view)."""
    xs = [_coerce(x) for x in xs]
    shape = dst.shape
    ops = []
    for x in xs:
        if _is_array(x):
            np.broadcast_shapes(x.shape, shape)
            ops.append(_operand(x, shape))
        else:
            v = _scalar_py(x)
            ops.append((K.CONST, dst.dtype.type(v) if not isinstance(v, np.generic) else v))
    if dst.is_contiguous:
        outs = [(dst.buf, dst.offset, None)]
    else:
        outs = [(dst.buf, dst.offset, dst.estrides if dst.ndim else (0,))]
    K.elementwise(fn, dst.size, _kshape(shape), outs, ops)


def _same(*arrays) -> bool:
    first = arrays[0]
    return all(_is_array(a) and a.shape == first.shape and a.dtype == first.dtype
               for a in arrays)


_BOOL = np.dtype(np.bool_)


def _stanza_kernel(kernel: str):
    """``be.<kernel>(*inputs, *params)`` from the op's stanza: one launch of the generated
    device function, in the dtype the op's ``dtype_rule`` gives (torch's promotion)."""
    spec = K._stanza_of(kernel)
    sc, rule = spec.scalar, spec.dtype_rule
    n, names = len(sc.inputs), sc.params
    int_pow = "pow" in sc.calls()

    def method(*args, **kw):
        xs = list(args[:n])
        params = list(args[n:]) + [kw[p] for p in names[len(args) - n:] if p in kw]
        typed = xs[1:] if rule == "where" else xs + params  # where's condition is a mask
        dt = _result_dtype(*typed)
        if rule == "float":
            dt = dt if dt.kind == "f" else np.dtype(np.float64)
        elif rule == "promote_float" and dt.kind != "f":
            dt = np.dtype(np.float64)
        if rule == "same":
            out_dt = xs[0].dtype if _is_array(xs[0]) else dt
        else:
            out_dt = _BOOL if rule in ("bool", "bool_compare") else dt
        fn = kernel
        if int_pow and dt.kind in "iu":
            if any(not _is_array(v) and v < 0 for v in xs[1:] + params):
                raise RuntimeError("Integers to negative integer powers are not allowed.")
            fn = kernel + "@int"
        return _ew(fn, xs + params, out_dt, compute_dtype=None if rule == "same" else dt)

    method.__name__ = kernel
    method.__doc__ = f"{kernel}: ``{sc.forward}`` in one launch (generated from its stanza)."
    return staticmethod(method)


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == target
    except ValueError:
        return False


def _stanza_backward(op: str):
    """``be.<op>_backward(grad, needed, *saved)``: the needed grads of the op's stanza in one
    launch (operands broadcast by strides, as in the forward); None (the tensor-op formulas)
    for other dtypes or a saved operand that does not broadcast to the gradient."""
    spec = OPS[op]
    sc = spec.scalar
    name_of = {**dict(zip(sc.inputs, spec.inputs)), "y": "result"}
    masks = {}
    for mask in grad_masks(op):
        values, params = grad_mask_args(op, mask)
        masks[mask] = ("b_" + grad_mask_name(op, mask),
                       [spec.saved.index(name_of[v]) for v in values],
                       [spec.saved.index(p) for p in params])
    conditions = {spec.saved.index(n) for n, t in zip(spec.inputs, sc.grads)
                  if t is None and n in spec.saved}
    grads = [i for i, t in enumerate(sc.grads) if t is not None]

    def kernel(grad, needed, *saved):
        if not _is_array(grad) or grad.dtype not in _FUSED_FLOATS:
            return None
        mask = tuple(i for i in grads if needed[i])
        if not mask:
            return None
        fn, values, params = masks[mask]
        shape, dt = grad.shape, grad.dtype
        operands = [_operand(grad, shape)]
        for k in values:
            v = saved[k]
            if _is_array(v):
                want = np.dtype(np.bool_) if k in conditions else dt
                if v.dtype != want or not _broadcasts_to(v.shape, shape):
                    return None
                operands.append(_operand(v, shape))
            elif isinstance(v, (bool, int, float)):
                operands.append((K.CONST, dt.type(v)))
            else:
                return None
        for k in params:
            if not isinstance(saved[k], (bool, int, float)):
                return None
            operands.append((K.CONST, dt.type(saved[k])))
        outs = [_new(shape, dt) for _ in mask]
        K.elementwise(fn, grad.size, _kshape(shape), [(o.buf, 0, None) for o in outs], operands)
        result = [None] * len(spec.inputs)
        for i, o in zip(mask, outs):
            result[i] = o
        return tuple(result)

    kernel.__name__ = op + "_backward"
    kernel.__doc__ = f"Fused backward of {op}: its stanza's grads in one launch (generated)."
    return staticmethod(kernel)


_FUSED_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _conv_geometry(x, w, b, stride, padding, dilation, groups):
    """conv_numpy's geometry where the kernels apply: float device arrays of one dtype,
    conv1d/conv2d, non-empty sizes; None declines."""
    for a in (x, w, b):
        if a is not None and (not _is_array(a) or a.dtype not in _FUSED_FLOATS
                              or a.dtype != x.dtype):
            return None
    if x.ndim not in (3, 4):
        return None
    return conv_geometry(x.shape, w.shape, stride, padding, dilation, groups)


def _conv_planes(geo) -> tuple:
    """((H, W, KH, KW, OH, OW), (sh, sw, ph, pw, dh, dw)): a conv1d as height 1."""
    if len(geo.spatial) == 1:
        return ((1,) + geo.spatial + (1,) + geo.kernel + (1,) + geo.out,
                (1, geo.stride[0], 0, geo.padding[0], 1, geo.dilation[0]))
    return (geo.spatial + geo.kernel + geo.out, geo.stride[:1] + geo.stride[1:]
            + geo.padding[:1] + geo.padding[1:] + geo.dilation[:1] + geo.dilation[1:])


def _conv_columns(x, geo) -> CudaArray:
    """im2col of the (strided) input: (N, groups, rows, P), one launch."""
    cols = _new((geo.n, geo.groups, geo.rows, geo.positions), x.dtype)
    st = x.estrides if x.ndim == 4 else x.estrides[:2] + (0,) + x.estrides[2:]
    K.conv_im2col(cols.buf, x.buf, x.offset, st, geo.c, *_conv_planes(geo))
    return cols


def _softmax_rows_backward(grad, dim, y, *, log: bool):
    """softmax's (``log=False``) or log_softmax's backward over ``dim`` of any layout; None
    (the tensor-op formulas) unless grad and the saved result are float arrays alike."""
    if not (_is_array(grad) and _is_array(y) and grad.shape == y.shape
            and grad.dtype == y.dtype and y.dtype in _FUSED_FLOATS):
        return None
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        return None
    if y.ndim == 0:
        return (_ew("zero", [grad], grad.dtype),)
    from ...ops._ints import norm  # a saved dim: validated; negative ones as unsigned 64-bit

    d = norm(dim, y.ndim)
    out = _new(y.shape, y.dtype)
    kept = [i for i in range(y.ndim) if i != d]
    kshape = tuple(y.shape[i] for i in kept) or (1,)

    def kst(x):
        return tuple(x.estrides[i] for i in kept) or (0,)

    K.softmax_rows_backward(log, out.buf, kst(out), out.estrides[d], grad.buf, grad.offset,
                            kst(grad), grad.estrides[d], y.buf, y.offset, kst(y),
                            y.estrides[d], kshape, _prod(kshape), y.shape[d])
    return (out,)


def _t2(x: CudaArray) -> CudaArray:
    """The transpose of a 2-D array: a view."""
    return _view(x, x.shape[::-1], x.estrides[::-1], x.offset)


def _column_major(sizes, strides):
    """``symgrad.ops.linalg.column_major`` on saved sym sizes/strides; None if not 2-D."""
    if not (isinstance(sizes, (tuple, list)) and isinstance(strides, (tuple, list))
            and len(sizes) == 2 and len(strides) == 2):
        return None
    from ...ops.linalg import column_major

    return column_major(tuple(sizes), tuple(strides))


def _norm_axes(axis, ndim) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    n = max(ndim, 1)
    out = []
    for a in axis:
        a = operator.index(a)
        if not -n <= a < n:
            raise np.exceptions.AxisError(a, ndim)
        out.append(a % n)
    return tuple(sorted(set(out))) if ndim else ()


def _reduce_plan(x: CudaArray, axes: tuple):
    kept = [d for d in range(x.ndim) if d not in axes]
    kshape = tuple(x.shape[d] for d in kept)
    kstr = tuple(x.estrides[d] for d in kept)
    rshape = tuple(x.shape[d] for d in axes)
    rstr = tuple(x.estrides[d] for d in axes)
    rows, k = _prod(kshape), _prod(rshape)
    return (kshape or (1,), kstr or (0,), rshape or (1,), rstr or (0,), rows, k)


def _out_shape(x: CudaArray, axes: tuple, keepdims: bool) -> tuple:
    if keepdims:
        return tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    return tuple(s for d, s in enumerate(x.shape) if d not in axes)


def _reduce(op: str, x: CudaArray, axis, keepdims: bool, acc_dtype) -> CudaArray:
    x = _coerce(x)
    axes = _norm_axes(axis, x.ndim)
    kshape, kstr, rshape, rstr, rows, k = _reduce_plan(x, axes)
    if op in ("max", "min") and k == 0 and rows:
        raise ValueError(f"zero-size array to reduction operation "
                         f"{'maximum' if op == 'max' else 'minimum'} which has no identity")
    out = _new(_out_shape(x, axes, keepdims), acc_dtype)
    if x.ndim == 0:
        kshape, kstr, rshape, rstr, rows, k = (1,), (0,), (1,), (0,), 1, 1
    K.reduce_rows(op, out.buf, x.buf, x.offset, kshape, kstr, rshape, rstr, rows, k,
                  allocator.allocate)
    return out


def _view(x: CudaArray, shape, estrides, offset, writeable=None) -> CudaArray:
    return CudaArray(x.block, shape, estrides, offset, x.dtype,
                     x.writeable if writeable is None else writeable)


def _is_adv(item) -> bool:
    return _is_array(item) or isinstance(item, (np.ndarray, list)) or hasattr(item, "_data")


class _Plan:
    """``x[index]`` split into a basic view and the advanced (array) indices on its dims."""

    __slots__ = ("view", "adv")

    def __init__(self, view, adv) -> None:
        self.view = view
        self.adv = adv  # [(view dim, int64 CudaArray)], in order


def _consumed(item) -> int:
    """How many dims of the indexed array an index item uses."""
    if item is None or item is Ellipsis:
        return 0
    if _is_adv(item):
        a = item if _is_array(item) else np.asarray(item)
        return a.ndim if a.dtype == np.bool_ else 1
    return 1


def _index_plan(x: CudaArray, index) -> _Plan:
    if not isinstance(index, tuple):
        index = (index,)
    index = tuple(i._data if hasattr(i, "_data") else i for i in index)
    used = sum(_consumed(i) for i in index)
    if used > x.ndim:
        raise IndexError(f"too many indices for array: array is {x.ndim}-dimensional, but "
                         f"{used} were indexed")
    n_ell = sum(1 for i in index if i is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    expanded = []
    for i in index + (() if n_ell else (Ellipsis,)):
        if i is Ellipsis:
            expanded.extend([slice(None)] * (x.ndim - used))
        else:
            expanded.append(i)
    shape, strides, off = [], [], x.offset
    adv = []
    d = 0
    for item in expanded:
        if item is None:
            shape.append(1)
            strides.append(0)
            continue
        if _is_adv(item):
            a = item if _is_array(item) else np.asarray(item)
            if a.dtype == np.bool_:  # a mask: its nonzeros (a host sync, as in torch)
                host = np.asarray(CudaBackend.to_host(a) if _is_array(a) else a)
                for k, nz in enumerate(np.nonzero(host)):
                    adv.append((len(shape), CudaBackend.from_host(nz.astype(np.int64))))
                    shape.append(x.shape[d + k])
                    strides.append(x.estrides[d + k])
                d += host.ndim
                continue
            if not _is_array(a):
                if a.size and a.dtype.kind not in "iu":
                    raise IndexError("arrays used as indices must be of integer (or boolean) "
                                     "type")
                a = CudaBackend.from_host(a.astype(np.int64))
            elif a.dtype != np.int64:
                a = CudaBackend.cast(a, np.int64)
            adv.append((len(shape), a))
            shape.append(x.shape[d])
            strides.append(x.estrides[d])
            d += 1
            continue
        if isinstance(item, slice):
            start, stop, step = item.indices(x.shape[d])
            n = len(range(start, stop, step))
            off += start * x.estrides[d] if n else 0
            shape.append(n)
            strides.append(x.estrides[d] * step)
            d += 1
            continue
        i = operator.index(item)
        size = x.shape[d]
        if not -size <= i < size:
            raise IndexError(f"index {i} is out of bounds for axis {d} with size {size}")
        off += (i % size) * x.estrides[d]
        d += 1
    view = CudaArray(x.block, shape, strides, off, x.dtype, x.writeable)
    return _Plan(view, adv)


def _adv_layout(plan: _Plan):
    """Result shape of the advanced indexing and, over it, the view's and indices' strides."""
    view, adv = plan.view, plan.adv
    dims = [d for d, _ in adv]
    bshape = tuple(np.broadcast_shapes(*[a.shape for _, a in adv]))
    nb = len(bshape)
    rest = [d for d in range(view.ndim) if d not in dims]
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if adjacent:
        before = [d for d in rest if d < dims[0]]
        after = [d for d in rest if d > dims[-1]]
    else:
        before, after = [], rest
    oshape = tuple(view.shape[d] for d in before) + bshape + tuple(view.shape[d] for d in after)
    nbefore = len(before)
    vstr = (tuple(view.estrides[d] for d in before) + (0,) * nb
            + tuple(view.estrides[d] for d in after))
    specs = []
    for d, a in adv:
        ist = _bstrides(a, bshape) if bshape else ()
        full = (0,) * nbefore + ist + (0,) * len(after)
        specs.append((a.buf, a.offset, full or (0,), view.shape[d], view.estrides[d]))
    return oshape, vstr, specs


class CudaBackend:
    """Kernels on numba.cuda device arrays; same names and semantics as NumpyBackend."""

    name = "cuda"
    device_type = "cuda"

    # -- elementwise kernels and their fused backwards are generated from the op stanzas
    # below the class (``_stanza_kernel``, ``_stanza_backward``) -------------------------------

    # -- fused backward of softmax / log_softmax and the nn ops (addmm, mse_loss) ---------------
    @staticmethod
    def softmax_backward(grad, needed, dim, result):
        """``(g - sum(g*y, dim)) * y``: one launch, a block per row along ``dim``."""
        return _softmax_rows_backward(grad, dim, result, log=False)

    @staticmethod
    def log_softmax_backward(grad, needed, dim, result):
        """``g - exp(y) * sum(g, dim)``: one launch, a block per row along ``dim``."""
        return _softmax_rows_backward(grad, dim, result, log=True)

    @staticmethod
    def addmm_backward(grad, needed, alpha, beta, mat1, mat1_sym_sizes, mat1_sym_strides,
                       mat2, mat2_sym_sizes, mat2_sym_strides):
        """nn.Linear's backward: the three formulas of ``addmm`` straight on the matmul
        kernel (mm's layout rule included), without building tensor ops."""
        if not _is_array(grad) or grad.ndim != 2 or grad.dtype not in _FUSED_FLOATS \
                or type(alpha) not in (int, float) or type(beta) not in (int, float):
            return None
        for m, need in ((mat1, needed[2]), (mat2, needed[1])):
            if m is None:
                if need:
                    return None
            elif not _is_array(m) or m.ndim != 2 or m.dtype != grad.dtype:
                return None
        cm1 = _column_major(mat1_sym_sizes, mat1_sym_strides) if needed[1] else False
        cm2 = _column_major(mat2_sym_sizes, mat2_sym_strides) if needed[2] else False
        if cm1 is None or cm2 is None:
            return None
        mm, t = CudaBackend.matmul, _t2
        g_self = g_mat1 = g_mat2 = None
        if needed[0]:
            g_self = grad if beta == 1 else CudaBackend.mul(grad, beta)
        if needed[1]:
            if cm1:
                g_mat1 = t(mm(mat2, t(grad)))
            else:
                g_mat1 = mm(grad, t(mat2))
            if alpha != 1:
                g_mat1 = CudaBackend.mul(g_mat1, alpha)
        if needed[2]:
            if cm2:
                g_mat2 = t(mm(t(grad), mat1))
            else:
                g_mat2 = mm(t(mat1), grad)
            if alpha != 1:
                g_mat2 = CudaBackend.mul(g_mat2, alpha)
        return (g_self, g_mat1, g_mat2)

    @staticmethod
    def embedding_backward(grad, needed, indices, padding_idx, scale_grad_by_freq, sparse,
                           weight_sym_argsize_0):
        """Declines (None): embedding's tensor-op formula runs on the device."""
        return None

    @staticmethod
    def max_pool2d_with_indices_backward(grad, needed, ceil_mode, dilation, kernel_size,
                                         padding, result1, self, stride):
        """Declines (None): max pooling's tensor-op formula runs on the device."""
        return None

    @staticmethod
    def flash_attention_backward(grad, needed, attn_mask, dropout_p, is_causal, key,
                                 logsumexp, output, query, scale, value):
        """Declines (None): the fused attention node's tensor-op formulas run on the
        device."""
        return None

    @staticmethod
    def native_layer_norm_backward(grad, needed, bias, input, normalized_shape,  # noqa: A002
                                   result1, result2, weight):
        """Declines (None): layer norm's tensor-op formulas run on the device."""
        return None

    @staticmethod
    def mse_loss_backward(grad, needed, reduction, self, target):
        """``(self - target) * (grad * scale)`` and its negation (target's) in one launch."""
        if not _is_array(grad) or grad.dtype not in _FUSED_FLOATS:
            return None
        for x in (self, target):
            if not _is_array(x) or x.dtype != grad.dtype:
                return None
        need_s, need_t = needed[0], needed[1]
        if not (need_s or need_t):
            return (None, None)
        if reduction == 1 and self.size == 0:
            return None  # the formulas' behaviour for a mean over nothing
        scale = 2.0 / self.size if reduction == 1 else 2.0  # 1: torch's Reduction::Mean
        shape = tuple(np.broadcast_shapes(self.shape, target.shape, grad.shape))
        ops = [_operand(self, shape), _operand(target, shape), _operand(grad, shape),
               (K.CONST, grad.dtype.type(scale))]
        if need_s and need_t:
            gs, gt = _new(shape, grad.dtype), _new(shape, grad.dtype)
            K.elementwise("b_mse2", gs.size, _kshape(shape),
                          [(gs.buf, 0, None), (gt.buf, 0, None)], ops)
            return gs, gt
        out = _new(shape, grad.dtype)
        K.elementwise("b_mse" if need_s else "b_mse_neg", out.size, _kshape(shape),
                      [(out.buf, 0, None)], ops)
        return (out, None) if need_s else (None, out)

    # -- convolution: the numpy/cpu layout (backends/conv_numpy.py) on the device ------------
    @staticmethod
    def convolution(input, weight, bias, stride, padding, dilation, groups):  # noqa: A002
        """conv1d/conv2d forward: one im2col launch, one batched matmul whose result is the
        (N, O, out...) output, and the bias add; None declines (the generic lowering)."""
        geo = _conv_geometry(input, weight, bias, stride, padding, dilation, groups)
        if geo is None:
            return None
        g, og = geo.groups, geo.o // geo.groups
        out = CudaBackend.matmul(CudaBackend.reshape(weight, (g, og, geo.rows)),
                                 _conv_columns(input, geo))
        if bias is not None:
            out = CudaBackend.add(CudaBackend.reshape(out, (geo.n, geo.o, geo.positions)),
                                  CudaBackend.reshape(bias, (geo.o, 1)))
        return CudaBackend.reshape(out, (geo.n, geo.o) + geo.out)

    @staticmethod
    def convolution_backward(grad, needed, bias_sym_sizes_opt, dilation, groups, input,  # noqa: A002
                             output_padding, padding, stride, transposed, weight):
        """ConvolutionBackward0's three formulas on device arrays (no graph recorded):
        ``W^T @ grad`` + a col2im launch, per-image ``cols @ grad^T`` summed, a sum."""
        if transposed or not _is_array(grad) or grad.dtype != getattr(input, "dtype", None):
            return None
        geo = _conv_geometry(input, weight, None, stride, padding, dilation, groups)
        if geo is None:
            return None
        be = CudaBackend
        g, og, rows, p = geo.groups, geo.o // geo.groups, geo.rows, geo.positions
        g4 = be.reshape(grad, (geo.n, g, og, p))
        gx = gw = gb = None
        if needed[0]:
            dcols = be.matmul(be.transpose(be.reshape(weight, (g, og, rows)), (0, 2, 1)), g4)
            gx = _new((geo.n, geo.c) + geo.spatial, grad.dtype)
            K.conv_col2im(gx.buf, dcols.buf, *_conv_planes(geo))
        if needed[1]:
            per_image = be.matmul(_conv_columns(input, geo), be.transpose(g4, (0, 1, 3, 2)))
            gw = be.copy(be.transpose(be.sum(per_image, (0,)), (0, 2, 1)))
            gw = be.reshape(gw, weight.shape)
        if len(needed) > 2 and needed[2]:
            gb = be.sum(be.reshape(grad, (geo.n, geo.o, p)), (0, 2))
        return gx, gw, gb

    # -- reductions --------------------------------------------------------------------------------
    @staticmethod
    def sum(x, axis=None, keepdims=False, dtype=None):
        if dtype is not None:
            acc = np.dtype(getattr(dtype, "np", dtype))
        else:
            acc = x.dtype if x.dtype.kind in "fc" else np.dtype(np.int64)
        return _reduce("sum", x, axis, keepdims, acc)

    @staticmethod
    def mean(x, axis=None, keepdims=False):
        return _reduce("mean", x, axis, keepdims, x.dtype)

    @staticmethod
    def amax(x, axis=None, keepdims=False):
        return _reduce("max", x, axis, keepdims, x.dtype)

    @staticmethod
    def amin(x, axis=None, keepdims=False):
        return _reduce("min", x, axis, keepdims, x.dtype)

    @staticmethod
    def _arg(op, x, axis, keepdims):
        if axis is None:
            flat = CudaBackend.reshape(x, (x.size,))
            out = _new(((1,) * x.ndim) if keepdims else (), np.int64)
            if flat.size == 0:
                raise ValueError(f"attempt to get {op} of an empty sequence")
            K.arg_reduce_rows(op, out.buf, flat.buf, flat.offset, (1,), (0,), (flat.size,),
                              flat.estrides, 1, flat.size)
            return out
        axes = _norm_axes(axis, x.ndim)
        kshape, kstr, rshape, rstr, rows, k = _reduce_plan(x, axes)
        if k == 0:
            raise ValueError(f"attempt to get {op} of an empty sequence")
        out = _new(_out_shape(x, axes, keepdims), np.int64)
        if x.ndim == 0:
            kshape, kstr, rshape, rstr, rows, k = (1,), (0,), (1,), (0,), 1, 1
        K.arg_reduce_rows(op, out.buf, x.buf, x.offset, kshape, kstr, rshape, rstr, rows, k)
        return out

    @staticmethod
    def argmax(x, axis=None, keepdims=False):
        return CudaBackend._arg("argmax", x, axis, keepdims)

    @staticmethod
    def argmin(x, axis=None, keepdims=False):
        return CudaBackend._arg("argmin", x, axis, keepdims)

    # -- matmul ------------------------------------------------------------------------------------
    @staticmethod
    def matmul(a, b):
        a, b = _coerce(a), _coerce(b)
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError("matmul: Input operand does not have enough dimensions")
        dt = _result_dtype(a, b)
        if a.dtype != dt:
            a = CudaBackend.cast(a, dt)
        if b.dtype != dt:
            b = CudaBackend.cast(b, dt)
        a2 = _view(a, (1,) + a.shape, (0,) + a.estrides, a.offset) if a.ndim == 1 else a
        b2 = _view(b, b.shape + (1,), b.estrides + (0,), b.offset) if b.ndim == 1 else b
        m, k = a2.shape[-2:]
        k2, n = b2.shape[-2:]
        if k != k2:
            raise ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, "
                             f"with gufunc signature (n?,k),(k,m?)->(n?,m?) (size {k2} is "
                             f"different from {k})")
        bshape = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
        nb = _prod(bshape)
        abst = _bstrides(a2, bshape, a2.ndim - 2)  # the batch dims
        bbst = _bstrides(b2, bshape, b2.ndim - 2)
        out = _new(bshape + (m, n), dt)
        K.matmul(out.buf, a2.buf, a2.offset, a2.estrides[-2], a2.estrides[-1], b2.buf,
                 b2.offset, b2.estrides[-2], b2.estrides[-1], m, n, k, bshape or (1,),
                 abst or (0,), bbst or (0,), nb)
        shape = bshape + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
        return _view(out, shape, _contig_strides(shape), 0) if shape != out.shape else out

    # -- movement (views: no launch) ---------------------------------------------------------------
    @staticmethod
    def reshape(x, shape):
        x = _coerce(x)
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        shape = [int(s) for s in shape]
        if -1 in shape:
            known = _prod([s for s in shape if s != -1])
            shape[shape.index(-1)] = x.size // known if known else 0
        shape = tuple(shape)
        if _prod(shape) != x.size:
            raise ValueError(f"cannot reshape array of size {x.size} into shape {shape}")
        if x.is_contiguous:
            return _view(x, shape, _contig_strides(shape), x.offset)
        strides = view_strides(x.shape, x.estrides, shape)
        if strides is not None:  # the strides allow a view (as numpy's reshape)
            return _view(x, shape, strides, x.offset)
        x = CudaBackend.copy(x)
        return _view(x, shape, _contig_strides(shape), x.offset)

    @staticmethod
    def transpose(x, axes):
        axes = tuple(int(a) % max(x.ndim, 1) for a in axes) if x.ndim else ()
        return _view(x, tuple(x.shape[a] for a in axes), tuple(x.estrides[a] for a in axes),
                     x.offset)

    @staticmethod
    def diagonal(x, offset, dim1, dim2):
        """torch.diagonal as a strided view (the numpy backend's diagonal_view)."""
        x = _coerce(x)
        n1, n2 = x.shape[dim1], x.shape[dim2]
        s1, s2 = x.estrides[dim1], x.estrides[dim2]
        if offset >= 0:
            n, start = max(0, min(n1, n2 - offset)), offset * s2
        else:
            n, start = max(0, min(n1 + offset, n2)), -offset * s1
        keep = [k for k in range(x.ndim) if k not in (dim1, dim2)]
        return _view(x, tuple(x.shape[k] for k in keep) + (n,),
                     tuple(x.estrides[k] for k in keep) + (s1 + s2,),
                     x.offset + (start if n else 0))

    @staticmethod
    def broadcast_to(x, shape):
        x = _coerce(x)
        shape = tuple(int(s) for s in shape)
        if tuple(np.broadcast_shapes(x.shape, shape)) != shape:
            raise ValueError(f"operands could not be broadcast together with remapped shapes "
                             f"{x.shape} and requested shape {shape}")
        st = _bstrides(x, shape)
        writeable = x.writeable and all(s != 0 or n == 1 for s, n in zip(st, shape)) \
            and len(shape) == x.ndim
        return _view(x, shape, st, x.offset, writeable=writeable and shape == x.shape)

    @staticmethod
    def getitem(x, index):
        plan = _index_plan(_coerce(x), index)
        if not plan.adv:
            return plan.view
        oshape, vstr, specs = _adv_layout(plan)
        view = plan.view
        out = _new(oshape, view.dtype)
        K.gather(out.size, _kshape(oshape), out.buf, 0, view.buf, view.offset,
                 vstr or (0,), specs, K.error_flag())
        _CudaState.index_launched = True
        return out

    @staticmethod
    def setitem(x, index, value):
        plan = _index_plan(x, index)
        if plan.adv:
            CudaBackend.index_put(x, index, value, False)
            return
        CudaBackend.copy_(plan.view, value)

    @staticmethod
    def index_put(x, index, values, accumulate=False):
        """``x[index] = values`` (``+=`` with repeats adding up, atomically); returns x."""
        plan = _index_plan(x, index)
        if not plan.adv:
            if accumulate:
                CudaBackend.add_(plan.view, values)
            else:
                CudaBackend.copy_(plan.view, values)
            return x
        oshape, vstr, specs = _adv_layout(plan)
        view = plan.view
        values = _coerce(values)
        if not _is_array(values):
            values = CudaBackend.full((), values, view.dtype)
        if values.dtype != view.dtype:
            values = CudaBackend.cast(values, view.dtype)
        if tuple(np.broadcast_shapes(values.shape, oshape)) != oshape:
            raise ValueError(f"shape mismatch: value array of shape {values.shape} could not "
                             f"be broadcast to indexing result of shape {oshape}")
        vst = _bstrides(values, oshape) if oshape else (0,)
        n = _prod(oshape)
        K.scatter(n, _kshape(oshape), view.buf, view.offset, vstr or (0,), values.buf,
                  values.offset, vst or (0,), specs, K.error_flag(), accumulate)
        _CudaState.index_launched = True
        return x

    @staticmethod
    def cast(x, np_dtype):
        x = _coerce(x)
        dt = np.dtype(getattr(np_dtype, "np", np_dtype))
        if x.dtype == dt:
            return x
        fn = "to_bool" if dt == np.bool_ else "identity"
        return _ew(fn, [x], dt)

    @staticmethod
    def copy(x):
        x = _coerce(x)
        return _ew("identity", [x], x.dtype)

    @staticmethod
    def concatenate(xs, axis):
        xs = [_coerce(x) for x in xs]
        first = xs[0]
        ax = axis % first.ndim
        dt = _result_dtype(*xs)
        total = sum(x.shape[ax] for x in xs)
        shape = first.shape[:ax] + (total,) + first.shape[ax + 1:]
        for x in xs:
            if x.ndim != first.ndim or x.shape[:ax] != first.shape[:ax] \
                    or x.shape[ax + 1:] != first.shape[ax + 1:]:
                raise ValueError("all the input array dimensions except for the concatenation "
                                 "axis must match exactly")
        out = _new(shape, dt)
        pos = 0
        for x in xs:
            n = x.shape[ax]
            if n:
                dst = _view(out, x.shape, out.estrides, pos * out.estrides[ax])
                _ew_into("identity", dst, [x])
            pos += n
        return out

    @staticmethod
    def stack(xs, axis):
        xs = [_coerce(x) for x in xs]
        nd = xs[0].ndim + 1
        ax = axis % nd
        ys = [_view(x, x.shape[:ax] + (1,) + x.shape[ax:],
                    x.estrides[:ax] + (0,) + x.estrides[ax:], x.offset) for x in xs]
        if any(x.shape != xs[0].shape for x in xs):
            raise ValueError("all input arrays must have the same shape")
        return CudaBackend.concatenate(ys, ax)

    # -- creation ----------------------------------------------------------------------------------
    @staticmethod
    def full(shape, value, np_dtype):
        dt = np.dtype(getattr(np_dtype, "np", np_dtype))
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        out = _new(shape, dt)
        K.elementwise("identity", out.size, _kshape(out.shape), [(out.buf, 0, None)],
                      [(K.CONST, dt.type(value))])
        return out

    @staticmethod
    def empty(shape, np_dtype):
        if isinstance(shape, (int, np.integer)):
            shape = (shape,)
        return _new(shape, np.dtype(getattr(np_dtype, "np", np_dtype)))

    @staticmethod
    def arange(start, end, step, np_dtype):
        dt = np.dtype(getattr(np_dtype, "np", np_dtype))
        n = max(0, math.ceil((end - start) / step))
        out = _new((n,), dt)
        K.arange(out.buf, n, dt.type(start) if dt.kind != "b" else start,
                 dt.type(step) if dt.kind != "b" else step)
        return out

    @staticmethod
    def random(shape, np_dtype, normal: bool, seed: int, offset: int = 0):
        """Uniform [0, 1) or standard-normal numbers made on the device (no host copy)."""
        dt = np.dtype(getattr(np_dtype, "np", np_dtype))
        out = _new(shape, dt)
        K.random(out.buf, out.size, int(seed), int(offset), bool(normal))
        return out

    # -- host <-> device ---------------------------------------------------------------------------
    @staticmethod
    def from_host(x):
        if _is_array(x):
            return x
        a = np.asarray(x)
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)  # only when needed: it would make a 0-d array 1-d
        out = _new(a.shape, a.dtype)
        if a.size:
            out.buf.copy_to_device(a.reshape(-1))
            K.stats["h2d"] += 1
        return out

    @staticmethod
    def to_host(x):
        if not _is_array(x):
            return np.asarray(x)
        _check_errors()
        if x.size == 0:
            return np.empty(x.shape, x.dtype)
        if not x.is_contiguous:
            x = CudaBackend.copy(x)
        host = x.buf[x.offset:x.offset + x.size].copy_to_host()
        K.stats["d2h"] += 1
        return host.reshape(x.shape)

    #: why the profiler shows no device time (None on a GPU, where CUDA events time ops)
    device_timing_note = ("timed CUDA events do not work under the numba.cuda simulator"
                          if K.SIM else None)

    @staticmethod
    def device_timer():
        """Started CUDA events for the profiler; None under the simulator."""
        return None if K.SIM else _EventTimer()

    @staticmethod
    def synchronize() -> None:
        from numba import cuda

        cuda.synchronize()
        _check_errors()

    # -- in place ----------------------------------------------------------------------------------
    @staticmethod
    def fill_(x, value):
        _ew_into("identity", x, [x.dtype.type(value)])

    @staticmethod
    def copy_(dst, src):
        src = _coerce(src)
        _ew_into("identity" if dst.dtype != np.bool_ else "to_bool", dst, [src])

    constant = staticmethod(constant_value)

    @staticmethod
    def add_scaled_(dst, src, alpha):
        _ew_into("add", dst, [dst, CudaBackend.mul(src, dst.dtype.type(alpha))])

    @staticmethod
    def shares_memory(a, b) -> bool:
        return _is_array(a) and _is_array(b) and a.block is b.block

    # -- issue 21 tensor functions: scans and sorting along one axis --------------------------
    @staticmethod
    def cumsum(x, axis):
        """Running sum along ``axis`` on the device (one thread per row, in order)."""
        return _scan(x, axis, prod=False)

    @staticmethod
    def cumprod(x, axis):
        """Running product along ``axis`` on the device (one thread per row, in order)."""
        return _scan(x, axis, prod=True)

    @staticmethod
    def sort(x, axis, descending=False):
        """(values, int64 indices) along ``axis``: stable, NaN largest, ties in their order
        in both directions (as the NumPy reference), on the device: a bitonic network on
        (value, position) pairs, in shared memory for rows of up to ``K.SORT_MAX`` (1024)
        elements, in a padded global scratch for longer ones."""
        x = _coerce(x)
        axis = axis % x.ndim
        vals, idxs = _new(x.shape, x.dtype), _new(x.shape, np.int64)
        if x.size:
            kshape, kst = _rows_along(x, axis)
            K.sort_rows(bool(descending), vals.buf, idxs.buf, kst(vals), vals.estrides[axis],
                        x.buf, x.offset, kst(x), x.estrides[axis], kshape, _prod(kshape),
                        x.shape[axis], allocator.allocate)
        return vals, idxs


def _rows_along(x: CudaArray, axis: int):
    """The kept dims' shape (rows = its product) when working along ``axis``, and a function
    giving an array's strides over them (scan and sort kernels take one row per thread or
    block)."""
    kept = [i for i in range(x.ndim) if i != axis]
    kshape = tuple(x.shape[i] for i in kept) or (1,)

    def kst(a: CudaArray) -> tuple:
        return tuple(a.estrides[i] for i in kept) or (0,)

    return kshape, kst


def _scan(x, axis: int, prod: bool) -> CudaArray:
    """cumsum / cumprod along ``axis`` in NumPy's result dtype (ints and bools in int64)."""
    x = _coerce(x)
    dt = (np.cumprod if prod else np.cumsum)(np.zeros(1, x.dtype)).dtype
    if x.dtype != dt:
        x = CudaBackend.cast(x, dt)
    if x.ndim == 0:
        return CudaBackend.copy(CudaBackend.reshape(x, (1,)))
    axis = axis % x.ndim
    out = _new(x.shape, dt)
    if x.size:
        kshape, kst = _rows_along(x, axis)
        K.scan_rows(prod, out.buf, kst(out), out.estrides[axis], x.buf, x.offset, kst(x),
                    x.estrides[axis], kshape, _prod(kshape), x.shape[axis])
    return out


def _stanza_inplace(kernel: str):
    def method(dst, src):
        _ew_into(kernel, dst, [dst, src])

    method.__name__ = kernel + "_"
    method.__doc__ = f"``dst = {kernel}(dst, src)`` in place, one launch."
    return staticmethod(method)


for _kernel in scalar_kernels():
    setattr(CudaBackend, _kernel, _stanza_kernel(_kernel))
    if hasattr(NumpyBackend, _kernel + "_"):  # the in-place forms the reference has
        setattr(CudaBackend, _kernel + "_", _stanza_inplace(_kernel))
for _op in fused_from_stanza():  # the fused backward rules OpSpec.fused_backward names
    setattr(CudaBackend, _op + "_backward", _stanza_backward(_op))

class _EventTimer:
    """A pair of CUDA events: recorded at creation and at ``elapsed_ns``."""

    __slots__ = ("_start", "_stop")

    def __init__(self) -> None:
        from numba import cuda

        self._start, self._stop = cuda.event(), cuda.event()
        self._start.record()

    def elapsed_ns(self) -> int:
        from numba import cuda

        self._stop.record()
        self._stop.synchronize()
        return int(cuda.event_elapsed_time(self._start, self._stop) * 1e6)


class _CudaState:
    index_launched = False


def _check_errors() -> None:
    """Report an out-of-range index seen by a kernel (CUDA reports these at the next sync)."""
    if not _CudaState.index_launched:
        return
    _CudaState.index_launched = False
    err = K.error_flag()
    flag = err.copy_to_host()
    K.stats["d2h"] += 1
    if flag[0]:
        K.elementwise("identity", 1, (1,), [(err, 0, None)], [(K.CONST, np.int32(0))])
        raise IndexError("index out of range in a CUDA indexing kernel (reported at the next "
                         "synchronization, as CUDA reports device-side asserts)")
