"""torch calls symgrad has no op for, inside a traced torch forward: their meaning from
torch itself, run at numbers.

A torch ``Function``'s forward is traced on stand-ins whose torch calls run symgrad's op of
the same name. For the rest of torch's surface (``x.new_zeros``, ``x.round()``,
``torch.movedim``, ``index_put_``, ``nonzero``, ...) the call is run by torch itself, on
numbers, and its meaning is exact in one of four ways:

* every operand is a constant (no symbol): the result is that constant;
* the result is integer or boolean (``nonzero``, ``argsort``, ``isnan``, ``bucketize``), or
  the function is piecewise constant (``round``, ``floor``, ``sign`` ...), or it reads only
  the operand's shape and dtype (``new_zeros``, ``zeros_like``): decided at the recorded
  values, as branches are, and noted in the report;
* the result is affine in the symbolic operands (a rearrangement such as ``movedim``,
  ``rot90``, ``take``, ``index_put``, ``diag_embed``, or a linear map such as ``trace``,
  ``diff``, ``addmm`` with constant matrices): its coefficients are read from torch at zero
  and the unit vectors and the map is confirmed at the recorded values and at a random
  point; the meaning is that affine expression in the symbols;
* otherwise (``lgamma``, ``digamma``, anything nonlinear torch alone knows): the call has no
  meaning on symbols, the trace stops with the line that made it, and the verifier checks
  the Function by finite differences with that note.
"""

from __future__ import annotations

import numpy as np

__all__ = ["torch_by_values", "PIECEWISE_CONSTANT", "SHAPE_ONLY", "AFFINE_LIMIT",
           "UNTRACEABLE"]

#: torch functions whose value is constant between jumps: their derivative is 0 wherever it
#: exists, so their value at the recorded point is their meaning near it.
PIECEWISE_CONSTANT = frozenset({
    "round", "floor", "ceil", "trunc", "fix", "sign", "sgn", "heaviside", "floor_divide",
    "signbit", "histc", "bincount", "count_nonzero", "frexp", "angle", "isclose", "isnan",
    "isinf", "isfinite", "isposinf", "isneginf", "isreal", "logical_and", "logical_or",
    "logical_xor", "logical_not", "eq", "ne", "lt", "le", "gt", "ge", "greater",
    "greater_equal", "less", "less_equal", "not_equal", "bitwise_and", "bitwise_or",
    "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "gcd", "lcm"})
#: torch functions that read only the operand's shape, dtype and device (``self``).
SHAPE_ONLY = frozenset({
    "new", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided",
    "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like",
    "randint_like", "is_same_size", "is_nonzero", "dim_order", "get_device", "storage_offset",
    "is_complex", "is_conj", "is_neg", "is_inference", "ndimension", "output_nr"})
#: Largest number of symbolic elements whose affine map is read from torch.
AFFINE_LIMIT = 512

#: torch.Tensor methods the traced stand-in cannot give a meaning, by reason (documented in
#: docs/differences.md; tests/test_trace_surface.py checks both stay in step).
UNTRACEABLE = {
    "nonlinear special functions symgrad has no op for (finite differences instead)": (
        "lgamma", "lgamma_", "digamma", "digamma_", "polygamma", "polygamma_", "mvlgamma",
        "mvlgamma_", "i0", "i0_", "igamma", "igamma_", "igammac", "igammac_", "erfinv",
        "erfinv_", "renorm", "renorm_", "cov", "corrcoef", "quantile", "nanquantile"),
    "linear algebra whose meaning is an algorithm (decompositions, inverses)": (
        "det", "logdet", "slogdet", "inverse", "pinverse", "cholesky", "cholesky_inverse",
        "lu", "qr", "svd", "eig", "symeig", "geqrf", "orgqr", "ormqr", "lstsq", "matrix_exp"),
    "results whose shape depends on equalities or bins of the values": (
        "unique", "unique_consecutive", "histogram"),
    "reductions into indices by max, min or product (index_reduce; scatter_reduce traces "
    "with sum and mean)": ("index_reduce", "index_reduce_"),
    "random numbers: no fixed meaning to prove (they run, on symgrad's generator)": (
        "bernoulli", "bernoulli_", "cauchy_", "exponential_", "geometric_", "log_normal_",
        "normal_", "random_", "uniform_", "multinomial", "apply_", "map_", "map2_"),
    "spectral transforms (complex results)": ("stft", "istft"),
    "sparse, quantized, complex and storage layouts (no dense real meaning)": (
        "to_sparse", "to_sparse_coo", "to_sparse_csr", "to_sparse_csc", "to_sparse_bsr",
        "to_sparse_bsc", "to_mkldnn", "to_padded_tensor", "sparse_mask",
        "sparse_resize_", "sparse_resize_and_clear_", "coalesce", "indices", "values",
        "crow_indices", "col_indices", "ccol_indices", "row_indices", "smm", "sspaddmm",
        "dequantize", "int_repr", "q_per_channel_axis", "q_per_channel_scales",
        "q_per_channel_zero_points", "q_scale", "q_zero_point", "qscheme", "cdouble", "cfloat",
        "chalf", "imag", "storage", "untyped_storage", "storage_type", "data_ptr",
        "const_data_ptr", "pin_memory", "record_stream",
        "resize_as_sparse_"),
}


def _torch():
    import torch

    return torch


def _from_numpy(a):
    """torch.from_numpy itself (the trace patches torch's creation functions)."""
    torch = _torch()
    f = torch.from_numpy
    return getattr(f, "__wrapped__", f)(np.ascontiguousarray(a))


_HOST: list = []  # per call: the stand-ins' class and constructor (trace.py's ``_HOST``)


def _stand_in():
    return _HOST[-1].cls


def _be():
    from .trace_fold import _ACTIVE

    return _ACTIVE[-1]


def _sym_data(a):
    """The object array of a stand-in that holds symbols, else None."""
    from .trace_fold import has_symbols

    if isinstance(a, _stand_in()):
        d = a._sgt._data
        if isinstance(d, np.ndarray) and d.dtype == object and has_symbols(d):
            return d
    return None


def _torch_dtype(sg_dtype):
    torch = _torch()
    return getattr(torch, str(sg_dtype).rsplit(".", 1)[-1], torch.float64)


def _as_torch_const(a):
    """A symbol-free stand-in as a torch tensor of its numbers and dtype."""
    d = a._sgt._data
    if d.dtype == object:
        d = np.asarray([float(v) for v in d.flat], dtype=np.float64).reshape(d.shape)
    return _from_numpy(np.array(d)).to(_torch_dtype(a._sgt.dtype))


def _map_args(x, f):
    """``x`` with every stand-in ``s`` replaced by ``f(s)`` (inside lists, tuples, dicts)."""
    if isinstance(x, _stand_in()):
        return f(x)
    if isinstance(x, dict):
        return {k: _map_args(v, f) for k, v in x.items()}
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return type(x)(_map_args(u, f) for u in x)
    return x


def _stand_ins(x, out):
    if isinstance(x, _stand_in()):
        out.append(x)
    elif isinstance(x, dict):
        for v in x.values():
            _stand_ins(v, out)
    elif isinstance(x, (list, tuple)):
        for u in x:
            _stand_ins(u, out)
    return out


def _callable(name, func, method):
    torch = _torch()
    if func is not None and callable(func) and getattr(func, "__name__", "") != "__get__":
        return func
    attr = getattr(torch.Tensor, name, None)
    if method and attr is not None:
        if callable(attr):
            return attr
        return lambda t: getattr(t, name)  # a property (x.H, x.mT)
    for ns in (torch, torch.nn.functional, torch.special, torch.linalg):
        f = getattr(ns, name, None)
        if callable(f):
            return f
    return None


def _tensors(r, out):
    torch = _torch()
    if isinstance(r, torch.Tensor):
        out.append(r)
    elif isinstance(r, (list, tuple)):
        for u in r:
            _tensors(u, out)
    return out


def _rebuild(r, it):
    """``r`` with its torch tensors replaced, in order, by the next items of ``it``."""
    torch = _torch()
    if isinstance(r, torch.Tensor):
        return next(it)
    if hasattr(r, "_fields"):
        return type(r)(*(_rebuild(u, it) for u in r))
    if isinstance(r, (list, tuple)):
        return type(r)(_rebuild(u, it) for u in r)
    return r


def _const_stand_in(t):
    return _HOST[-1].const(t)


def _note(decided, what: str) -> None:
    if decided is not None and what not in decided:
        decided.append(what)


def torch_by_values(name, func, args, kwargs, method, decided=None, *, host,
                    piecewise: bool = False, structure_only: bool = False):
    """``name(*args, **kwargs)`` run by torch at numbers (see :func:`_by_values`); ``host``:
    the stand-ins' class (``cls``) and ``const(torch_tensor)`` making a constant one."""
    _HOST.append(host)
    try:
        return _by_values(name, func, args, kwargs, method, decided, piecewise=piecewise,
                          structure_only=structure_only)
    finally:
        _HOST.pop()


def _by_values(name, func, args, kwargs, method, decided=None, *,
               piecewise: bool = False, structure_only: bool = False):
    """``name(*args, **kwargs)`` (stand-ins among them) run by torch at numbers, with the
    meaning described in the module docstring; raises TypeError where it has none.
    ``piecewise``: the call is piecewise constant (``div(..., rounding_mode=)``);
    ``structure_only``: only the integer outputs are wanted (the float ones are left as
    torch's numbers for the caller to replace)."""
    torch = _torch()
    fn = _callable(name, func, method)
    if fn is None:
        raise TypeError(f"torch {name!r} has no SymPy meaning here (symbolic values)")
    ins = _stand_ins((args, kwargs), [])
    symbolic = [s for s in ins if _sym_data(s) is not None]
    self_ = args[0] if method and args else None
    inplace = method and name.endswith("_") and not name.endswith("__") and \
        isinstance(self_, _stand_in())

    def call(sub):
        from .trace_fold import _REAL

        a = _map_args(args, sub)
        k = _map_args(kwargs, sub)
        _REAL.append(True)
        try:
            with torch.no_grad():
                return fn(*a, **k)
        finally:
            _REAL.pop()

    if not symbolic:
        r = call(_as_torch_const)
        return _finish(r, [_const_stand_in(t) for t in _tensors(r, [])], inplace, self_)
    be = _be()
    if getattr(be, "valuation", None) is None:
        raise TypeError(f"torch {name!r} on symbols needs the recorded values")
    at = {}
    for s in symbolic:
        d = _sym_data(s)
        at[id(s)] = np.asarray(be.as_constant(d), dtype=object).astype(np.float64)

    def sub_values(s, vals=at):
        if id(s) in vals:
            return _from_numpy(np.array(vals[id(s)])).to(_torch_dtype(s._sgt.dtype))
        return _as_torch_const(s)

    real = call(sub_values)
    outs = _tensors(real, [])
    base = name.rstrip("_") if not name.endswith("__") else name
    only_self = all(s is self_ for s in symbolic)
    structure = all(not (t.dtype.is_floating_point or t.dtype.is_complex) for t in outs)
    if structure or base in PIECEWISE_CONSTANT or (base in SHAPE_ONLY and only_self) or \
            piecewise or structure_only:
        if base not in SHAPE_ONLY:
            _note(decided, name)
        return _finish(real, [_const_stand_in(t) for t in outs], inplace, self_)
    pieces = _affine(name, symbolic, call, at, outs)
    return _finish(real, pieces, inplace, self_)


def _affine(name, symbolic, call, at, real_outs):
    """Stand-ins for ``real_outs``: float outputs as affine maps of the symbols, confirmed
    at the recorded values and a random point; TypeError where the call is not affine."""
    from ..tensor import Tensor

    TorchSym = _stand_in()
    syms = np.concatenate([_sym_data(s).reshape(-1) for s in symbolic])
    shapes = [_sym_data(s).shape for s in symbolic]
    n = syms.size
    no = TypeError(f"torch {name!r} has no SymPy meaning here (symbolic values: torch "
                   "computes it, and it is not piecewise constant or affine in them)")
    if n > AFFINE_LIMIT:
        raise no
    if any(t.dtype.is_complex for t in real_outs):
        raise no
    floats = [k for k, t in enumerate(real_outs) if t.dtype.is_floating_point]

    def run(vec):
        parts, off = {}, 0
        for s, shp in zip(symbolic, shapes):
            m = int(np.prod(shp))
            parts[id(s)] = vec[off:off + m].reshape(shp)
            off += m

        def sub(s):
            if id(s) in parts:
                return _from_numpy(np.array(parts[id(s)], dtype=np.float64)).to(
                    _torch_dtype(s._sgt.dtype))
            return _as_torch_const(s)

        try:
            with np.errstate(all="ignore"):
                outs = _tensors(call(sub), [])
        except Exception as exc:  # noqa: BLE001 - not the map it looked like
            raise no from exc
        if len(outs) != len(real_outs) or any(
                tuple(o.shape) != tuple(t.shape) for o, t in zip(outs, real_outs)):
            raise no
        return np.concatenate([outs[k].detach().double().reshape(-1).numpy() for k in floats]) \
            if floats else np.zeros(0)

    c0 = run(np.zeros(n))
    cols = np.empty((c0.size, n))
    for i in range(n):
        e = np.zeros(n)
        e[i] = 1.0
        with np.errstate(all="ignore"):  # inf - inf: not affine, refused below
            cols[:, i] = run(e) - c0
    if not (np.all(np.isfinite(c0)) and np.all(np.isfinite(cols))):
        raise no
    eps = float(np.finfo(np.float64).eps)
    x0 = np.concatenate([at[id(s)].reshape(-1) for s in symbolic])
    rng = np.random.default_rng(0)
    r = rng.uniform(-2.0, 2.0, size=n)
    d = rng.uniform(-1.0, 1.0, size=n) * 1e-3 * (1.0 + np.abs(x0))  # near the recorded point
    for point in (x0, r, x0 + d, x0 - d):
        want = run(point)
        with np.errstate(all="ignore"):
            got = c0 + cols @ point
        bound = 4 * (n + 1) * eps * (np.abs(c0) + np.abs(cols) @ np.abs(point) + 1e-300)
        if not np.all(np.abs(want - got) <= bound):
            raise no
    be = _be()
    dev = symbolic[0]._sgt._device
    pieces, off = [], 0
    for k, t in enumerate(real_outs):
        if k not in floats:
            pieces.append(_const_stand_in(t))
            continue
        m = int(t.numel())
        out = np.empty(m, dtype=object)
        for row in range(m):
            terms = [_coef(c0[off + row])] if c0[off + row] != 0.0 else []
            nz = np.nonzero(cols[off + row])[0]
            terms += [syms[i] if cols[off + row, i] == 1.0 else _coef(cols[off + row, i]) * syms[i]
                      for i in nz]
            out[row] = be._add_all(terms) if terms else 0.0
        off += m
        pieces.append(TorchSym(Tensor._wrap(out.reshape(tuple(t.shape)), dev)))
    return pieces


def _coef(c: float):
    return int(c) if float(c).is_integer() and abs(c) < 2 ** 53 else float(c)


def _finish(real, pieces, inplace, self_):
    """The call's result with its tensors as stand-ins; an in-place method writes into
    ``self_`` and returns it."""
    res = _rebuild(real, iter(pieces))
    if inplace and pieces:
        new = pieces[0]._sgt._data
        sgt = self_._sgt
        if new.shape != sgt._data.shape:  # unsqueeze_, t_ ...: self takes the new shape
            sgt._data = new.copy()
        elif sgt._data.dtype == object or new.dtype == sgt._data.dtype:
            sgt._data[...] = new
        else:
            sgt._data = new.copy()
        return self_
    return res
