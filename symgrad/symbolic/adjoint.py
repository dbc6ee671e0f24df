"""The fast local check of a structural node: the adjoint identity, evaluated numerically.

The rule audit proves once per op that its backward formulas are the derivative of its
meaning; what a node's check at run time must establish is that the engine's backward,
at this node's recorded values and shapes, is the transpose of the meaning's Jacobian
there. For random ``u`` (a cotangent of the outputs) and ``v`` (a tangent of one input)

    <J^T u, v> = <u, J v>

holds up to rounding for the right backward, and fails for a wrong one (a factor off,
a wrong axis, a lost or doubled term) with probability one. The left side is the
engine's backward on ``u``; the right side is the meaning's Jacobian-vector product, got
by a complex-step forward of the op's own forward code (its meaning: the same code that
runs on the SymPy backend) on a NumPy backend whose arrays carry ``x + i h v``: every
linear and bilinear kernel (matmul, convolution, sums, moves, indexing, scans, sorts) is
exact on complex numbers, elementwise kernels get their imaginary part from the
derivative of their stanza's SymPy meaning (lambdified once per kernel), and decisions
(comparisons, argmax, sorting, max) are taken on the real parts, as PyTorch takes them on
the recorded values. ``h = 2**-300``: the second-order terms underflow far below the
float64 rounding of the first-order ones, so ``J v`` is as exact as a float64 forward.

The real part of the same pass is the meaning's value at the recorded inputs: the
forward check (``forward_check``) compares it with the node's recorded output.

Anything this backend cannot follow exactly (a tie at a max or a kink, a derivative
that overflows, a kernel it lacks, float32 or half nodes, whose bounds need the per-
element check) raises :class:`Fallback`, and the node gets the element-by-element
SymPy check of ``local.py`` instead.
"""

from __future__ import annotations

import functools

import numpy as np

from ..backends.numpy_backend import NUMPY_MATH, NumpyBackend
from ._common import (
    BOUND_FACTOR,
    all_finite,
    flat_pair,
    lambdify_numpy,
    memory_order,
    outer_dot,
    random_uniform,
)

__all__ = ["Fallback", "ComplexStepBackend", "adjoint_check", "H"]

#: the complex step: second-order terms are h**2 = 2**-600 times the first-order ones
H = 2.0 ** -300


class Fallback(Exception):
    """The complex-step pass cannot give this node's ``J v`` exactly: use the SymPy check."""


def _heaviside(at_zero):
    return lambda x, h0=None: np.where(np.asarray(x) > 0, 1.0,
                                       np.where(np.asarray(x) < 0, 0.0, at_zero))


# NumPy has no erf ufunc (lambdify would pick math.erf, which takes one float)
NP_EXTRA = {"DiracDelta": lambda x, *k: np.zeros_like(np.asarray(x, dtype=float)),
            "Heaviside": _heaviside(0.5), "sign": np.sign, "erf": NUMPY_MATH["erf"]}
NP_H0 = {**NP_EXTRA, "Heaviside": _heaviside(0.0)}
NP_H1 = {**NP_EXTRA, "Heaviside": _heaviside(1.0)}


_STANZAS: dict = {}


def _stanza_of(kernel: str):
    """The op whose stanza kernel is ``kernel`` (None if none): remembered, as the
    backend asks for each kernel name it meets and the registry is long."""
    from ..ops import OPS

    hit = _STANZAS.get(kernel)
    if hit is not None and OPS.get(hit.name) is hit:  # (still the registered one)
        return hit
    hit = next((s for s in OPS.values() if s.kernel == kernel), None)
    if hit is not None:
        _STANZAS[kernel] = hit
    return hit


@functools.cache
def _kernel_partials(kernel: str):
    """For the stanza kernel ``kernel``: one NumPy function per input giving the partial
    derivative of its SymPy meaning, called as ``d(*inputs, *params)``; each carries
    ``ties`` (elements where the one-sided derivatives differ) or None."""
    import sympy

    from ..ops.scalar import build, sympy_namespace

    scalar = _stanza_of(kernel).scalar
    xs = list(sympy.symbols(f"x0:{len(scalar.inputs)}", real=True))
    ps = list(sympy.symbols(f"p0:{len(scalar.params)}", real=True))
    f = build(kernel + "_cs_meaning", scalar.inputs + scalar.params,
              scalar.meaning or scalar.forward, sympy_namespace(sympy))(*xs, *ps)
    f = sympy.sympify(f)
    out = []
    for x in xs:
        d = sympy.diff(f, x)
        if d.has(sympy.Pow):
            d = sympy.powsimp(d)
        fn = lambdify_numpy(xs + ps, d, NP_EXTRA)
        fn.ties = None
        if d.has(sympy.Heaviside) or d.has(sympy.Piecewise) or d.has(sympy.DiracDelta):
            f0 = lambdify_numpy(xs + ps, d, NP_H0)
            f1 = lambdify_numpy(xs + ps, d, NP_H1)
            fn.ties = (lambda *a, f0=f0, f1=f1: np.asarray(f0(*a)) != np.asarray(f1(*a))) \
                if not d.has(sympy.Piecewise) else _piecewise_ties(f, x, xs + ps)
        out.append(fn)
    return out


def _piecewise_ties(f, x, args):
    """Elements on a branch boundary of a Piecewise meaning (``where(x > 0, ...)`` at
    x = 0): its conditions' two sides evaluated at the values, equal there."""
    import sympy

    conds = [c for c in f.atoms(sympy.Piecewise) for _, c in c.args
             if c not in (sympy.true, True)]
    sides = []
    for c in conds:
        if isinstance(c, sympy.core.relational.Relational):
            sides.append(lambdify_numpy(args, c.lhs - c.rhs, NP_EXTRA))
    if not sides:
        return None

    def ties(*a):
        hit = False
        for s in sides:
            hit = hit | (np.asarray(s(*a)) == 0)
        return hit

    return ties


#: kernels exact on complex numbers as NumPy computes them (the operators)
_ANALYTIC = {"add", "sub", "mul", "div", "neg"}


def _re(a):
    return a.real if isinstance(a, np.ndarray) and a.dtype.kind == "c" else (
        a.real if isinstance(a, complex) else a)


def _im(a):
    if isinstance(a, np.ndarray) and a.dtype.kind == "c":
        return a.imag
    if isinstance(a, complex):
        return a.imag
    return None


def _cplx(a):
    return isinstance(a, complex) or (isinstance(a, np.ndarray) and a.dtype.kind == "c")


def _as_c(dtype):
    return np.complex128 if np.dtype(dtype).kind in "fc" else dtype


class ComplexStepBackend:
    """NumPy kernels on ``x + i h v``: the meaning's value (real part) and ``J v`` (the
    imaginary part over ``h``), in float64."""

    name = "numpy"
    device_type = "cpu"

    def __getattr__(self, name):
        stanza = _stanza_of(name)
        if stanza is not None and stanza.scalar is not None:
            fn = self._elementwise(name, stanza)
            setattr(self, name, fn)
            return fn
        return getattr(NumpyBackend, name)

    @staticmethod
    def as_constant(x):
        """A value through which no gradient flows in the meaning (embedding's padding
        row): its recorded value, with no tangent."""
        x = np.asarray(x)
        return x.real.astype(np.complex128) if x.dtype.kind == "c" else x

    # -- elementwise kernels ---------------------------------------------------------------
    def _elementwise(self, name, stanza):
        plain = getattr(NumpyBackend, name)
        scalar = stanza.scalar
        n_in = len(scalar.inputs)
        analytic = name in _ANALYTIC

        def kernel(*args, **kw):
            ins = list(args[:n_in])
            if not any(_cplx(a) for a in ins):
                return plain(*args, **kw)
            if analytic:
                with np.errstate(all="ignore"):
                    return plain(*args, **kw)
            params = list(args[n_in:]) + [kw[p] for p in scalar.params[len(args) - n_in:]
                                          if p in kw]
            reals = [_re(a) for a in ins]
            reals = [np.asarray(r, dtype=np.float64) if isinstance(r, np.ndarray)
                     and r.dtype.kind == "f" else r for r in reals]
            with np.errstate(all="ignore"):
                val = np.asarray(plain(*reals, *params))
            if val.dtype.kind not in "fc":  # a comparison: decided on the real parts
                return val
            tan = np.zeros(val.shape)
            partials = _kernel_partials(name)
            for i, a in enumerate(ins):
                t = _im(a)
                if t is None:
                    continue
                nz = t != 0
                if not np.any(nz):
                    continue
                with np.errstate(all="ignore"):
                    d = np.broadcast_to(np.asarray(partials[i](*reals, *params),
                                                   dtype=np.float64), val.shape)
                    nzb = np.broadcast_to(nz, val.shape)
                    if not np.isfinite(d[nzb]).all():
                        raise Fallback(f"{name}: derivative not finite at the values")
                    ties = partials[i].ties
                    if ties is not None and np.any(np.broadcast_to(ties(*reals, *params),
                                                                   val.shape) & nzb):
                        raise Fallback(f"{name}: a tie or kink at the recorded values")
                    tan = tan + np.where(nzb, d, 0.0) * t
            return val.astype(np.float64) + 1j * tan

        kernel.__name__ = name
        return kernel

    # -- allocation and casts: float arrays are complex here -------------------------------
    @staticmethod
    def full(shape, value, np_dtype):
        return np.full(shape, value, dtype=_as_c(np_dtype))

    @staticmethod
    def empty(shape, np_dtype):
        return np.zeros(shape, dtype=_as_c(np_dtype))

    @staticmethod
    def cast(x, np_dtype):
        x = np.asarray(x)
        kind = np.dtype(np_dtype).kind
        if kind in "fc":
            return x.astype(np.complex128)
        return _re(x).astype(np_dtype)

    @staticmethod
    def from_host(x):
        x = np.asarray(x)
        return x.astype(np.complex128) if x.dtype.kind == "f" else x

    @staticmethod
    def to_host(x):
        return x

    # -- in place: a real destination cannot take a tangent ---------------------------------
    @staticmethod
    def _into(dst, src):
        if dst.dtype.kind != "c" and _cplx(src) and np.any(_im(src)):
            raise Fallback("a tangent written into a real array")

    def setitem(self, x, index, value):
        self._into(x, value)
        x[index] = value

    def copy_(self, dst, src):
        self._into(dst, src)
        np.copyto(dst, src, casting="unsafe")

    def index_put(self, x, index, values, accumulate=False):
        self._into(x, values)
        return NumpyBackend.index_put(x, index, values, accumulate)

    def add_(self, dst, src):
        self._into(dst, src)
        np.add(dst, src, out=dst, casting="unsafe")

    def sub_(self, dst, src):
        self._into(dst, src)
        np.subtract(dst, src, out=dst, casting="unsafe")

    def mul_(self, dst, src):
        self._into(dst, src)
        np.multiply(dst, src, out=dst, casting="unsafe")

    def div_(self, dst, src):
        self._into(dst, src)
        with np.errstate(all="ignore"):
            np.true_divide(dst, src, out=dst, casting="unsafe")

    def add_scaled_(self, dst, src, alpha):
        self._into(dst, src)
        np.add(dst, np.multiply(src, alpha), out=dst, casting="unsafe")

    # -- products: real BLAS calls on the parts ----------------------------------------------
    #: {id(z): (z, its real part as recorded, (p, q))} for the moved inputs whose
    #: imaginary part is exactly ``h p q^T`` (an outer-product tangent, as one_pass
    #: writes it): a product with such an operand, the very array, is two
    #: matrix-vector products, not a full one (``x (h p q^T) = h (x p) q^T``)
    outer: dict = {}

    def _outer_of(self, x):
        hit = self.outer.get(id(x))
        return hit if hit is not None and hit[0] is x and x.ndim == 2 else None

    def matmul(self, a, b):
        fa, fb = (self._outer_of(a), self._outer_of(b)) if self.outer else (None, None)
        if fa is not None and np.ndim(b) > 2:  # (batched: the dense product below)
            fa = None
        if fa is not None or fb is not None:
            return self._matmul_outer(a, b, fa, fb)
        ai, bi = _im(a), _im(b)
        ar, br = np.asarray(_re(a)), np.asarray(_re(b))
        if ai is not None and not np.any(ai):
            ai = None
        if bi is not None and b.dtype == np.complex128 and b.ndim >= 2 and \
                b.flags.c_contiguous and ar.dtype == np.float64:
            # b's parts interleaved are one real (k, 2n) matrix: a single product gives
            # a @ b.real and a @ b.imag side by side, i.e. the complex result, with no
            # copy of either part (BLAS takes unit strides only); a zero b.imag costs
            # the product's second half, not a read of b to find out
            out = np.matmul(ar, b.view(np.float64))
            out = out.view(np.complex128)
            if ai is not None:
                out.imag += np.matmul(ai, br)
            return out
        if bi is not None and not np.any(bi):
            bi = None
        val = np.matmul(ar, br)
        if ai is None and bi is None:
            return val.astype(np.complex128) if val.dtype.kind == "f" else val
        tan = np.matmul(ai, br) if ai is not None else 0.0
        if bi is not None:
            tan = tan + np.matmul(ar, bi)
        return val + 1j * tan

    @staticmethod
    def _matmul_outer(a, b, fa, fb):
        """``a @ b`` where ``a`` and/or ``b`` is a moved 2-d input with the tangent
        ``h p q^T`` (``fa``/``fb``): the value from the recorded real parts (any layout,
        as BLAS reads it), each rank-1 tangent term as ``h (p (q^T b))`` or
        ``h ((a p) q^T)``; the same first-order terms as the dense product."""
        ar = fa[1] if fa is not None else np.asarray(_re(a))
        br = fb[1] if fb is not None else np.asarray(_re(b))
        val = np.matmul(ar, br)
        tan = np.zeros(val.shape)
        if fa is not None:  # (h p q^T) b
            p, q = fa[2]
            tan += np.multiply.outer(p * H, q @ br)
        elif (ai := _im(a)) is not None and np.any(ai):
            tan += np.matmul(ai, br)
        if fb is not None:  # a (h p q^T)
            p, q = fb[2]
            tan += np.multiply.outer(np.matmul(ar, p) * H, q)
        elif (bi := _im(b)) is not None and np.any(bi):
            tan += np.matmul(ar, bi)
        out = np.empty(val.shape, dtype=np.complex128)
        out.real = val
        out.imag = tan
        return out

    @staticmethod
    def convolution(input, weight, bias, stride, padding, dilation, groups):  # noqa: A002
        conv = NumpyBackend.convolution
        xr, wr = np.asarray(_re(input)), np.asarray(_re(weight))
        br = None if bias is None else np.asarray(_re(bias))
        val = conv(xr, wr, br, stride, padding, dilation, groups)
        if val is None:
            return None
        tan = np.zeros(val.shape)
        xi, wi = _im(input), _im(weight)
        bi = None if bias is None else _im(bias)
        if xi is not None and np.any(xi):
            t = conv(np.ascontiguousarray(xi), wr, None, stride, padding, dilation, groups)
            if t is None:
                raise Fallback("convolution declined the tangent")
            tan = tan + t
        if wi is not None and np.any(wi):
            t = conv(xr, np.ascontiguousarray(wi), None, stride, padding, dilation, groups)
            if t is None:
                raise Fallback("convolution declined the tangent")
            tan = tan + t
        if bi is not None and np.any(bi):
            tan = tan + bi.reshape((1, -1) + (1,) * (val.ndim - 2))
        return val + 1j * tan

    # -- decisions on the real parts -----------------------------------------------------------
    #: a tie in amax/amin takes the first element (ops returning indices), else splits
    ties_first = False

    def _extreme(self, x, axis, keepdims, larger):
        xr = np.asarray(_re(x))
        m = np.max(xr, axis=axis, keepdims=True) if larger else \
            np.min(xr, axis=axis, keepdims=True)
        xi = _im(x)
        if xi is None:
            out = m
        else:
            if np.isnan(xr).any():
                raise Fallback("max/min over nan")
            tied = xr == m
            if self.ties_first:  # max(dim): the element argmax returns (the first)
                first = np.argmax(tied, axis=axis) if axis is not None else \
                    np.argmax(tied.reshape(-1))
                tied = np.zeros_like(tied)
                if axis is None:
                    tied.reshape(-1)[first] = True
                else:
                    np.put_along_axis(tied, np.expand_dims(first, axis), True, axis=axis)
            count = np.sum(tied, axis=axis, keepdims=True)
            # PyTorch's amax splits a tie evenly: the mean of the tied tangents
            t = np.sum(np.where(tied, xi, 0.0), axis=axis, keepdims=True) / count
            out = m + 1j * t
        if not keepdims:
            out = np.squeeze(out, axis=axis) if axis is not None else out.reshape(())
        return np.asarray(out)

    def amax(self, x, axis=None, keepdims=False):
        return self._extreme(x, axis, keepdims, True)

    def amin(self, x, axis=None, keepdims=False):
        return self._extreme(x, axis, keepdims, False)

    @staticmethod
    def argmax(x, axis=None, keepdims=False):
        return NumpyBackend.argmax(np.asarray(_re(x)), axis, keepdims)

    @staticmethod
    def argmin(x, axis=None, keepdims=False):
        return NumpyBackend.argmin(np.asarray(_re(x)), axis, keepdims)

    @staticmethod
    def sort(x, axis, descending=False):
        from ..backends.numpy_backend import sort_by_keys

        x = np.asarray(x)
        return sort_by_keys(x, np.asarray(_re(x)), axis, descending)

    @staticmethod
    def where(cond, a, b):
        return np.where(np.asarray(_re(cond)), a, b)

    @staticmethod
    def mean(x, axis=None, keepdims=False):
        x = np.asarray(x)
        return np.asarray(np.mean(x, axis=axis, keepdims=keepdims), dtype=x.dtype)

    @staticmethod
    def sum(x, axis=None, keepdims=False, dtype=None):
        dtype = getattr(dtype, "np", dtype)
        if dtype is not None and np.dtype(dtype).kind in "fc":
            dtype = None if np.asarray(x).dtype.kind == "c" else np.float64
        return np.asarray(np.sum(x, axis=axis, keepdims=keepdims, dtype=dtype))


def _float64_node(g, in_vals) -> bool:
    for x in in_vals:
        if isinstance(x, np.ndarray) and x.dtype.kind == "f" and x.dtype != np.float64:
            return False
    return all(np.dtype(d) == np.float64 for d in g.out_dtypes
               if np.dtype(d).kind == "f")


def _params(g):
    return dict(g.params)


def meaning_outputs(g, be, arrays):
    """The op's forward (its meaning) on backend ``be``: a tuple of outputs."""
    out = g.spec.forward(be, *arrays, **_params(g))
    return tuple(out) if (len(g.spec.outputs) != 1 or g.spec.variadic_outputs) else (out,)


#: ops whose forward only renumbers the elements of their one input (a bijection of
#: positions): J is a permutation matrix, so a right J^T u is the one array the forward
#: maps back onto u bit for bit
PERMUTATIONS = frozenset({
    "view", "t", "transpose", "permute", "unsqueeze", "squeeze", "squeeze_", "squeeze_all",
    "squeeze_dims", "alias", "reshape_alias", "unsafe_view", "clone"})


def _permutation_check(g, in_vals, us, ks, engine, be):
    """The exact check of a permutation op (:data:`PERMUTATIONS`): the meaning applied to
    the engine's ``J^T u`` must give ``u`` back exactly (then ``J^T u = J^-1 u``, the
    adjoint of a permutation). Real arithmetic, no tangents, no bound. None where it does
    not apply or the equality fails (the complex-step pass then decides and names it)."""
    if g.spec.name not in PERMUTATIONS or ks != [0] or len(us) != 1 or us[0] is None:
        return None
    u = np.asarray(us[0])
    if u.dtype != np.float64 or len(g.out_shapes) != 1 or \
            u.shape != tuple(g.out_shapes[0]) or u.size != in_vals[0].size:
        return None
    try:
        with np.errstate(all="ignore"):
            moved = meaning_outputs(g, be, [engine[0]] + list(in_vals[1:]))[0]
            value = [np.asarray(o) if isinstance(o, np.ndarray) else o
                     for o in meaning_outputs(g, be, in_vals)]
    except Exception:  # noqa: BLE001  (the complex-step pass reports what it can)
        return None
    moved = np.asarray(moved)
    if moved.shape != u.shape or not np.array_equal(moved, u):
        return None
    s = float(np.vdot(u, u))  # <u, J J^T u> = <J^T u, J^T u>: both sides, exactly
    return {0: (s, s, 0.0, int(u.size))}, value


def adjoint_check(g, in_vals, us, engine_res, rng, tol_for=None):
    """The adjoint identity of a float64 structural node.

    ``us``: the random cotangents the engine's backward got (one per output), and
    ``engine_res`` its result. One complex-step pass moves every differentiable input at
    once (``<u, J v> = sum_k <J_k^T u, v_k>``); only when that disagrees is each input
    checked on its own, to name it. Returns ``({key: (engine sum <J_k^T u, v_k>, meaning
    <u, J v>, allowed error, elements)}, value)`` with key the input's index (or the tuple
    of all of them for the joint pass that agreed), and ``value`` the meaning's outputs at
    the recorded inputs (float64); or raises :class:`Fallback`."""
    if not _float64_node(g, in_vals):
        raise Fallback("not a float64 node")
    be = ComplexStepBackend()
    be.ties_first = "indices" in g.spec.outputs
    sizes = [int(np.size(x)) for x in in_vals if isinstance(x, np.ndarray)]
    sizes += [int(np.prod(s)) for s in g.out_shapes]
    n_terms = 4 + max(sizes + [1])
    ks = [k for k, r in enumerate(g.inputs)
          if r[0] != "scalar" and g.needs[k] and isinstance(in_vals[k], np.ndarray)
          and in_vals[k].dtype.kind == "f"]
    if not ks:
        raise Fallback("no differentiable float input")
    engine = {}
    for k in ks:
        e = engine_res[k] if k < len(engine_res) else None
        e = np.zeros(in_vals[k].shape) if e is None else np.asarray(e, dtype=np.float64)
        if e.shape != in_vals[k].shape:
            raise Fallback("gradient shape differs")  # the element check names the shape
        if not all_finite(e):
            raise Fallback("non-finite engine gradient")
        engine[k] = e

    exact = _permutation_check(g, in_vals, us, ks, engine, be)
    if exact is not None:
        return exact
    # uniform in [-1, 1): any tangent with a density catches a wrong J^T u almost surely
    # (large ones an outer product a b^T: _common.random_uniform says why that is as
    # strong), laid out as the engine's gradient is, so <J^T u, v> reads each once
    tangents, factors, abs_sums = {}, {}, {}
    for k in ks:
        v, fac = random_uniform(rng, in_vals[k].shape, memory_order(engine[k]), full=False)
        tangents[k], factors[k] = v, fac
        if fac is None:
            av = np.abs(v)
            abs_sums[k] = (av, float(av.sum()))  # |v| and sum |v|, for the bound
        else:
            a, b = np.abs(fac[0]), np.abs(fac[1])
            abs_sums[k] = ((a, b), float(a.sum()) * float(b.sum()))

    def one_pass(keys):
        args = list(in_vals)  # real: only the moved inputs are complex
        be.outer = {}
        for k in keys:
            x = in_vals[k]
            # a transposed 2-d input (a weight through t) with an outer-product tangent
            # keeps its layout: the copy is then a straight one, and products with it
            # read the recorded array itself (_matmul_outer)
            order = "F" if factors[k] is not None and x.ndim == 2 and \
                memory_order(x) == "F" else "C"
            z = np.empty(x.shape, dtype=np.complex128, order=order)
            z.real = x
            if factors[k] is None:
                np.multiply(tangents[k], H, out=z.imag)
            else:  # h a b^T written straight into the imaginary parts
                a, b = factors[k]
                zi = z.imag if z.ndim == 2 else z.imag.reshape(a.size, b.size)  # (a view:
                # z is C-contiguous there)
                np.multiply.outer(a * H, b, out=zi)
                be.outer[id(z)] = (z, in_vals[k], factors[k])
            args[k] = z
        try:
            with np.errstate(all="ignore"):
                outs = meaning_outputs(g, be, args)
        except Fallback:
            raise
        except Exception as exc:  # noqa: BLE001  (a kernel this backend cannot follow)
            raise Fallback(f"{type(exc).__name__}: {exc}") from None
        s_m = mag_m = 0.0
        for nr, u in enumerate(us):
            if u is None or nr >= len(outs):
                continue
            o = np.asarray(outs[nr])
            if o.dtype.kind != "c":
                # a float output the pass made real or integer: the forward code read the
                # dtype (``kind == "f"``) and dropped the tangent
                if o.dtype.kind == "f" or (nr < len(g.out_dtypes)
                                           and np.dtype(g.out_dtypes[nr]).kind == "f"):
                    raise Fallback("the tangent was lost (a real output)")
                continue
            jv = o.imag / H
            if not np.isfinite(jv).all():  # (infinite values with zero tangents are fine)
                raise Fallback("non-finite tangents")
            u = np.broadcast_to(np.asarray(u, dtype=np.float64), jv.shape)
            s_m += float(np.sum(u * jv))
            aj, au = np.abs(jv), np.abs(u)
            mag_m += float(np.sum(au * aj)) + (float(aj.mean()) * float(au.sum())
                                               if aj.size else 0.0)
        s_e = mag_e = 0.0
        n = 0
        for k in keys:
            e, v = engine[k], tangents[k]
            fac = factors[k]
            s_e += float(np.vdot(*flat_pair(e, v))) if fac is None else outer_dot(e, fac)
            if e.size:  # sum |e| |v| + mean |e| sum |v|
                av, sum_av = abs_sums[k]
                ae = np.abs(e)
                ev = float(np.vdot(*flat_pair(ae, av))) if fac is None else outer_dot(ae, av)
                mag_e += ev + float(ae.sum()) / e.size * sum_av
            n += int(e.size)
        allowed = BOUND_FACTOR * float(np.finfo(np.float64).eps) * n_terms * (mag_e + mag_m)
        if getattr(tol_for, "user", False):  # rtol/atol given: they replace the bound
            rtol, atol = tol_for(np.dtype(np.float64))
            allowed = atol * sum(abs_sums[k][1] for k in keys) + \
                rtol * (mag_e + mag_m) / 2
        allowed = max(allowed, float(np.finfo(np.float64).tiny))
        value = [np.asarray(_re(o)) if isinstance(o, np.ndarray) else o for o in outs]
        return (s_e, s_m, allowed, n), value

    joint, value = one_pass(ks)
    s_e, s_m, allowed, _ = joint
    if abs(s_e - s_m) <= allowed or len(ks) == 1:
        return {tuple(ks) if len(ks) > 1 else ks[0]: joint}, value
    return {k: one_pass([k])[0] for k in ks}, value
