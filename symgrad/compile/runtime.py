"""Helpers the generated step modules call: NumPy only, no Tensor or Node in sight.

They are the array forms of the few backward formulas that are more than one expression
(nll_loss's scatter, broadcast reductions) and the vocabulary of the scalar stanzas
(``symgrad/ops/scalar.py``) on whole arrays, so a stanza's ``grad`` text runs unchanged.
"""

from __future__ import annotations

import math

import numpy as np

from ..backends.attention_numpy import PACKED as _PACKED

__all__ = ["sum_to", "nll_grad", "as_out", "flat", "cat_into", "scalar_names", "view_grad",
           "view_grad_ok", "MATH", "update_table"]


def sum_to(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a broadcast gradient back to ``shape`` (the engine's sum_to_size)."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, s in enumerate(shape)
                                      if s == 1 and g.shape[i + lead] != 1)
    out = g.sum(axis=axes, keepdims=True) if axes else g
    return out.reshape(shape)


def cat_into(out: np.ndarray, axis: int, parts: tuple) -> np.ndarray:
    """``np.concatenate([a.reshape(shape) for a, shape in parts], axis)`` written into
    ``out``: each array goes straight into its slice of ``out``, viewed in the array's own
    shape where that needs no copy (a split's backward gets its pieces as transposed views:
    the reshape would copy each, then the concatenate again). Pieces all C-contiguous (the
    attention backward's dq, dk, dv seen through their heads' transpose) reshape as views
    and go in with one concatenate: a row copy per piece, no per-piece slicing."""
    joined = _joined_in_place(out, axis, parts)
    if joined is not None:
        return joined
    for a, _ in parts:
        if not a.flags.c_contiguous:
            break
    else:
        if parts:
            return np.concatenate([a.reshape(shape) for a, shape in parts], axis, out=out)
    start = 0
    lead = (slice(None),) * axis
    for a, shape in parts:
        dst = out[lead + (slice(start, start + shape[axis]),)]
        start += shape[axis]
        if a.shape != dst.shape:
            try:
                dst = dst.reshape(a.shape, copy=False)
            except ValueError:  # the slice cannot be viewed so: reshape the piece
                a = a.reshape(shape)
        np.copyto(dst, a)
    return out


def _joined_in_place(out: np.ndarray, axis: int, parts: tuple) -> np.ndarray | None:
    """The pieces' common memory viewed as the concatenation when every piece already lies
    where the concatenation puts it in an array of attention_numpy.packed_grads (the
    attention backward's dq, dk, dv: one fresh (B, L, 3, H, E) array), else None. ``out``
    (a buffer of the step's own) then stays unused: the caller takes the returned array.

    A piece lies in its place when it has the shape and strides of its slice of the
    concatenation (viewed in the piece's shape) and starts at that slice's address. Those
    strides, and the step between slice starts, follow from the shapes and the itemsize
    alone (the concatenation is C-contiguous), so they are kept per shapes (_SLICES);
    addresses come from _address (a Numba read of the pointer)."""
    if not parts:
        return None
    base = parts[0][0].base
    if base is None or _PACKED.get(id(base)) is not base or base.dtype != out.dtype or \
            base.size != out.size or not base.size or not base.flags.c_contiguous:
        return None
    global _address
    if _address is None:
        from ._address import address as _address
    whole = out.shape
    at = _address(base)
    start = 0
    for a, shape in parts:
        if a.base is not base or type(a) is not np.ndarray:
            return None
        key = (whole, base.itemsize, axis, shape, a.shape)
        got = _SLICES.get(key)
        if got is None:
            got = _slice_layout(base, whole, axis, shape, a.shape)
            if len(_SLICES) > 64:
                _SLICES.clear()
            _SLICES[key] = got
        if not got or a.strides != got[0] or _address(a) != at + start * got[1]:
            return None
        start += shape[axis]
    return base.reshape(whole) if start == whole[axis] else None


def _slice_layout(base: np.ndarray, whole: tuple, axis: int, shape: tuple,
                  seen: tuple) -> tuple:
    """(strides of the concatenation's slice for a piece of ``shape`` viewed in the piece's
    own shape ``seen``, bytes from one slice start to the next along ``axis``), or () where
    that view needs a copy."""
    w = base.reshape(whole)
    try:
        view = w[(slice(None),) * axis + (slice(0, shape[axis]),)].reshape(seen, copy=False)
    except ValueError:
        return ()
    return view.strides, w.strides[axis]


#: _address.address once a step first asks (it compiles with Numba)
_address = None
#: _slice_layout per (concatenation's shape, itemsize, axis, piece shape, piece's own shape)
_SLICES: dict = {}


def nll_grad(g: np.ndarray, x_shape: tuple, dtype, target: np.ndarray, reduction: int,
             ignore_index: int, total_weight: np.ndarray) -> np.ndarray:
    """d nll_loss / d input for a 2-D input without class weights (torch's kernel)."""
    n, c = x_shape
    keep = target != ignore_index
    rows = np.nonzero(keep)[0]
    out = np.zeros(x_shape, dtype)
    if reduction == 0:
        out[rows, target[rows]] = -g[rows]
        return out
    if reduction == 1:
        if not rows.size:
            return out
        g = g / total_weight
    out[rows, target[rows]] = -g
    return out


def flat(x: np.ndarray) -> np.ndarray:
    """A gradient as the 1-D contiguous array a fused kernel reads: a broadcast scalar (the
    backward of ``sum``) stays one element, which the kernel reads at every index."""
    if x.ndim and not any(x.strides):
        return x[(0,) * x.ndim].reshape(1)
    return np.ascontiguousarray(x).reshape(-1)


def view_grad(forward, be, shape: tuple, dtype, g: np.ndarray, params: dict) -> np.ndarray:
    """The gradient of a view op (slice, select, basic indexing ...): zeros of the input's
    shape with ``g`` added into the view the op's own forward takes of them."""
    out = np.zeros(shape, dtype)
    forward(be, out, **params)[...] += g
    return out


def view_grad_ok(forward, be, shape: tuple, params: dict) -> bool:
    """Does ``forward`` take a writable view without repeated elements (so ``view_grad``
    is its gradient)? Probed once, at generation, on an array of distinct numbers."""
    probe = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    try:
        v = forward(be, probe, **params)
    except Exception:
        return False
    return (isinstance(v, np.ndarray) and v.flags.writeable and v.size > 0
            and np.shares_memory(v, probe) and np.unique(v).size == v.size)


def as_out(x, dtype) -> np.ndarray:
    """A generic forward's result as the array eager's ``apply`` would have wrapped."""
    x = np.asarray(x)
    return x if x.dtype == dtype else x.astype(dtype)


def _sign(x):
    return np.sign(x)


#: symgrad/ops/scalar.py's vocabulary on arrays (NumPy ufuncs keep float32 as float32)
MATH = {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
        "sqrt": np.sqrt, "abs": np.abs, "sign": _sign, "where": np.where,
        "maximum": np.maximum, "log1p": np.log1p, "expm1": np.expm1,
        "erf": np.vectorize(math.erf, otypes=[float]), "pi": math.pi,
        "minimum": np.minimum, "pow": np.power, "atan2": np.arctan2, "hypot": np.hypot}


def scalar_names(scalar) -> set:
    """Every free name a stanza's forward and grad texts read (vocabulary and constants),
    so a stanza using one this module lacks is not compiled from its text."""
    import ast

    names: set = set()
    for text in (scalar.forward,) + tuple(t for t in scalar.grads if t):
        tree = ast.parse("\n".join(part.strip() for part in text.split(";")))
        bound = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets}
        names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - bound
    return names - set(scalar.inputs) - set(scalar.params) - {"g", "y"}


def update_table(rows: tuple, steps: bool) -> np.ndarray:
    """The table of fuse.UPDATE_KERNELS' group loops: per parameter, the data address of
    each of its arrays (parameter, gradient, state), then its size. The loops write through
    these addresses, so every array is checked here to be what they assume: C-contiguous,
    writable, the parameter's size and dtype (Adam's step last: float32, one element).
    The caller keeps the arrays alive while it uses the table."""
    out = np.empty((len(rows), len(rows[0]) + 1), np.int64)
    for i, row in enumerate(rows):
        p = row[0]
        for j, a in enumerate(row):
            step = steps and j == len(row) - 1
            ok = a.dtype == np.float32 and a.size == 1 if step else \
                a.dtype == p.dtype and a.size == p.size
            if not (ok and a.flags.c_contiguous and a.flags.writeable):
                raise ValueError(f"an optimizer update's array {j} of parameter {i} does not "
                                 "fit the update loop (a sg.compile bug)")
            out[i, j] = a.ctypes.data
        out[i, -1] = p.size
    return out
