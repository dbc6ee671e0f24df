"""Custom ``autograd.Function`` nodes in the verifier.

A Function with a ``sympy`` staticmethod is checked through that meaning, elementwise
(one expression per tensor argument, non-tensor arguments unchanged, as
``symgrad.autograd.custom_function`` documents). Without one, exact mode cannot replay
it, and its local check uses central finite differences of its own forward instead
(noted in the report).
"""

from __future__ import annotations

import numpy as np

from ..backends.sympy_backend import obj

__all__ = ["fill_custom", "custom_meaning", "custom_local", "is_custom"]


def is_custom(node) -> bool:
    return getattr(type(node), "_forward_cls", None) is not None and hasattr(
        node, "_tensor_positions")


def _tensor_cls():
    from ..tensor import Tensor

    return Tensor


def fill_custom(g, node) -> None:
    """Set the replay and backward callables of a custom Function node."""
    cls = type(node)._forward_cls
    positions = tuple(node._tensor_positions)
    g.custom = cls
    if cls.sympy is None:
        g.note = ("custom Function without a sympy staticmethod: checked by local finite "
                  "differences")

    def forward_numeric(be, arrays):
        from ..autograd.grad_mode import no_grad
        from ..tensor import tensor

        if be.name != "numpy":
            raise NotImplementedError
        args = [tensor(np.asarray(a)) if j in positions else a for j, a in enumerate(arrays)]
        with no_grad():
            out = cls.apply(*args)
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(np.asarray(o.detach().numpy()) if isinstance(o, _tensor_cls()) else o
                     for o in outs)

    g.forward_numeric = forward_numeric
    g.backward = custom_backward


def custom_backward(graph, g, grads):
    """The Function's own backward on numeric grads, mapped back to its arguments."""
    from ..autograd.grad_mode import no_grad
    from ..tensor import tensor
    from .graph import _finish

    n = g.node
    positions = tuple(n._tensor_positions)
    if getattr(n, "_freed", False):
        n = _rebuild_custom(graph, g, g.custom, positions)
    gts = [None if v is None else tensor(np.asarray(v)) for v in grads]
    mask = tuple(g.needs[j] for j in positions)
    with no_grad():
        outs = n.apply(gts, mask)
    per_arg = [None] * len(g.inputs)
    for i, j in enumerate(positions):
        per_arg[j] = outs[i] if i < len(outs) else None
    return _finish(graph, g, per_arg)


def _rebuild_custom(graph, g, cls, positions):
    from ..autograd.grad_mode import enable_grad
    from ..tensor import tensor

    args = []
    for j, v in enumerate(graph.node_inputs(g)):
        if j in positions:
            t = tensor(np.array(v))
            if g.needs[j]:
                t.requires_grad_(True)
            args.append(t)
        else:
            args.append(v)
    with enable_grad():
        out = cls.apply(*args)
    out = out[0] if isinstance(out, tuple) else out
    g.note = "graph was freed: node rebuilt from the recorded inputs"
    return out.grad_fn


def _positions(g):
    return tuple(j for j, r in enumerate(g.inputs) if r[0] != "scalar")


def custom_meaning(g, engine, arrays):
    """The outputs of a custom Function on object arrays, through its ``sympy``."""
    cls = g.custom
    if cls.sympy is None:
        raise NotImplementedError(f"{g.name}: custom Function without a sympy staticmethod")
    pos = set(_positions(g))
    tensors = [obj(a) for j, a in enumerate(arrays) if j in pos]
    shape = np.broadcast_shapes(*[t.shape for t in tensors]) if tensors else ()
    tensors = [np.broadcast_to(t, shape) for t in tensors]
    n_out = max(1, len(g.out_shapes))
    outs = [np.empty(shape, dtype=object) for _ in range(n_out)]
    to_engine = getattr(engine, "sympify", None) if engine.__name__ == "symengine" else None
    for idx in np.ndindex(*shape):
        it = iter(t[idx] for t in tensors)
        args = [next(it) if j in pos else a for j, a in enumerate(arrays)]
        r = cls.sympy(*args)
        rs = r if isinstance(r, tuple) else (r,)
        for k in range(n_out):
            outs[k][idx] = to_engine(rs[k]) if to_engine is not None else rs[k]
    return tuple(outs)


_TEMPLATES: dict = {}


def custom_local(g, graph, in_vals, v64, engine, engine_name, rng, sample):
    """{arg: (J^T v values, None)}, formula, note — symbolic if possible, else by FD."""
    cls = g.custom
    pos = _positions(g)
    diff_pos = [j for j in pos if g.needs[j] and np.asarray(in_vals[j]).dtype.kind == "f"]
    if cls.sympy is not None:
        import sympy

        from .local import lambdify_numpy

        xs = sympy.symbols(f"x0:{len(in_vals)}", real=True)
        args = [xs[j] if j in pos else in_vals[j] for j in range(len(in_vals))]
        r = cls.sympy(*args)
        rs = list(r) if isinstance(r, tuple) else [r]
        res = {}
        numargs = [np.asarray(in_vals[j], dtype=np.float64) if j in pos else 0.0
                   for j in range(len(in_vals))]
        shape = np.broadcast_shapes(*[np.shape(in_vals[j]) for j in pos])
        formula = f"{cls.__name__}.sympy: result = {sympy.sstr(rs[0])}"
        for j in diff_pos:
            total = np.zeros(shape)
            mag = np.zeros(shape)
            for k, f in enumerate(rs):
                if k >= len(v64) or v64[k] is None:
                    continue
                # full-precision numbers in the generated code (not 15 digits)
                d = lambdify_numpy(xs, sympy.diff(sympy.sympify(f), xs[j]),
                                   {"DiracDelta": lambda x: 0 * x})
                with np.errstate(all="ignore"):
                    term = v64[k] * np.broadcast_to(
                        np.asarray(d(*numargs), dtype=np.float64), shape)
                    total = total + term
                    mag = mag + np.abs(term)
            from .local import _sum_to

            xs_shape = np.shape(in_vals[j])
            terms = 4 * len(rs) + int(np.prod(shape)) // max(int(np.prod(xs_shape)), 1)
            res[j] = (_sum_to(total, xs_shape), None, (_sum_to(mag, xs_shape), terms, None))
        return res, formula, None
    # no SymPy meaning: central differences of <v, forward(x)> at sampled elements
    from ..backends.numpy_backend import NumpyBackend

    be = NumpyBackend()
    res = {}
    base = [np.asarray(a, dtype=np.float64) if j in pos else a for j, a in enumerate(in_vals)]
    for j in diff_pos:
        x = base[j]
        n = x.size
        k = min(n, sample or 16)
        idx = np.arange(n) if k == n else np.sort(rng.choice(n, size=k, replace=False))
        vals = np.empty(len(idx))
        for m, i in enumerate(idx):
            x0 = float(x.reshape(-1)[i])
            h = 1e-6 * max(1.0, abs(x0))
            fs = []
            for sgn in (1.0, -1.0):
                xp = x.copy()
                xp.reshape(-1)[i] = x0 + sgn * h
                args = [xp if jj == j else base[jj] for jj in range(len(base))]
                outs = g.forward_numeric(be, args)
                fs.append(sum(float(np.sum(np.asarray(o, dtype=np.float64) * v))
                              for o, v in zip(outs, v64) if v is not None))
            vals[m] = (fs[0] - fs[1]) / (2 * h)
        res[j] = (vals, None if k == n else idx)
    note = f"{cls.__name__}: no sympy staticmethod, checked by central finite differences"
    return res, f"{cls.__name__}: finite differences (no SymPy meaning)", note
