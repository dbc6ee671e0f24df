"""``audit_rules()``: prove every registered backward rule against SymPy's derivative.

For each differentiable op in ``OPS`` (iterated at call time, so ops added later are
audited too) a small example is recorded through the public API. Its inputs become
positive real SymPy symbols; the forward is replayed on the SymPy backend; the op's own
backward formulas are run on *symbolic tensors* (object arrays on a ``sympy`` device,
so the formulas' tensor ops dispatch to the SymPy backend) with a symbolic cotangent;
and ``simplify(rule - sum_o g_o d f_o / d x)`` must be 0 for every element.

Branches (comparisons, max winners) are decided at the example's values, so a proof
holds on the region around that point. Status per op: ``proved``, ``checked
numerically`` (simplify could not reach 0 but the difference vanishes at random points),
``failed``, or ``no example`` / ``error`` with the reason.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from ..backends.sympy_backend import SympyBackend, obj

__all__ = ["audit_rules", "RuleAudit", "EXAMPLES"]


@dataclass
class RuleAudit:
    op: str
    grad_fn: str
    status: str  # proved | checked numerically | failed | no example | error
    detail: str = ""

    def __repr__(self) -> str:
        return f"RuleAudit({self.op!r}, {self.status!r})"


def _leaf(shape, seed=0, lo=0.5, hi=1.5):
    import symgrad as sg

    rng = np.random.default_rng(seed + 17 * len(shape))
    return sg.tensor(rng.uniform(lo, hi, shape), dtype=sg.float64, requires_grad=True)


def _ex_index(x):
    import symgrad as sg

    return x.reshape(6)[sg.tensor([0, 2, 0, 5])]


def _setitem(kind):
    def ex(x, y):
        import symgrad as sg

        z = x * 1.0
        if kind == "copy_slices":
            z[0:1] = y[0:1]
        elif kind == "setitem_copy":
            z[...] = y
        else:
            z[sg.tensor([0, 1])] = y[0:2]
        return z

    return ex


def _ex_view_written(x, y):
    """``z[0].mul_(y[0])``: z[0]'s grad_fn becomes AsStridedBackward0 of the new z."""
    z = x * 1.0
    v = z[0]
    v.mul_(y[0])
    return v


def _ex_compare_(name: str, tensor_other: bool):
    """``x.gt_(y)`` / ``x.gt_(1.0)`` on a non-leaf copy of ``x``."""
    return lambda x, y: getattr(x * 1.0, f"{name}_")(y if tensor_other else 1.0)


#: One small example per op: ``fn(x, y) -> output`` on two 2x3 float64 leaves (values in
#: [0.5, 1.5], matching the positive symbols), or a custom builder.
EXAMPLES = {
    "add": lambda x, y: x.add(y, alpha=2),
    "sub": lambda x, y: x.sub(y, alpha=3),
    "rsub": lambda x, y: 2 - x,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "neg": lambda x, y: -x,
    "reciprocal": lambda x, y: x.reciprocal(),
    "pow": lambda x, y: x ** 3,
    "pow_tensor": lambda x, y: x ** y,
    "pow_scalar_base": lambda x, y: 2.0 ** x,
    "exp": lambda x, y: x.exp(),
    "log": lambda x, y: x.log(),
    "sin": lambda x, y: x.sin(),
    "cos": lambda x, y: x.cos(),
    "tanh": lambda x, y: x.tanh(),
    "sigmoid": lambda x, y: x.sigmoid(),
    "sqrt": lambda x, y: x.sqrt(),
    "relu": lambda x, y: x.relu(),
    "abs": lambda x, y: x.abs(),
    "sign": lambda x, y: x.sign(),
    "log1p": lambda x, y: x.log1p(),
    "log2": lambda x, y: x.log2(),
    "log10": lambda x, y: x.log10(),
    "expm1": lambda x, y: x.expm1(),
    "erf": lambda x, y: x.erf(),
    "silu": lambda x, y: _sg().nn.functional.silu(x),
    "softplus": lambda x, y: _sg().nn.functional.softplus(x, beta=2.0),
    "atan2": lambda x, y: x.atan2(y),
    "gelu": lambda x, y: _sg().nn.functional.gelu(x),
    "gelu_tanh": lambda x, y: _sg().nn.functional.gelu(x, approximate="tanh"),
    "leaky_relu": lambda x, y: _sg().nn.functional.leaky_relu(x - 1.0, 0.2),
    "elu": lambda x, y: _sg().nn.functional.elu(x - 1.0, 0.7),
    "logsigmoid": lambda x, y: _sg().nn.functional.logsigmoid(x),
    "hardtanh": lambda x, y: _sg().nn.functional.hardtanh(x, 0.6, 1.3),
    "hypot": lambda x, y: x.hypot(y),
    "where": lambda x, y: _sg().where(x > 1.0, x, y),
    "addcmul": lambda x, y: _sg().addcmul(x, y, x, value=0.5),
    "select": lambda x, y: x[1],
    "slice": lambda x, y: x[:, 1:3],
    "index": lambda x, y: _ex_index(x),
    "mm": lambda x, y: x @ y.t(),
    "mv": lambda x, y: x @ y[0],
    "dot": lambda x, y: x[0] @ y[0],
    "bmm": lambda x, y: _sg().bmm(x.reshape(1, 2, 3), y.reshape(1, 3, 2)),
    "max": lambda x, y: x.max(),
    "max_dim": lambda x, y: x.max(1)[0],
    "min": lambda x, y: x.min(),
    "min_dim": lambda x, y: x.min(0)[0],
    "maximum": lambda x, y: _sg().maximum(x, y),
    "minimum": lambda x, y: _sg().minimum(x, y),
    "clamp": lambda x, y: x.clamp(0.8, 1.2),
    "view": lambda x, y: x.view(3, 2),
    "t": lambda x, y: x.t(),
    "transpose": lambda x, y: x.transpose(0, 1),
    "permute": lambda x, y: x.permute(1, 0),
    "expand": lambda x, y: x[0:1].expand(4, 3),
    "unsqueeze": lambda x, y: x.unsqueeze(1),
    "squeeze": lambda x, y: x[0:1].squeeze(0),
    "squeeze_all": lambda x, y: x[0:1].squeeze(),
    "squeeze_dims": lambda x, y: x[0:1].squeeze((0,)),
    "clone": lambda x, y: x.clone(),
    "to_copy": lambda x, y: x.float(),
    "sum": lambda x, y: x.sum(),
    "sum_dim": lambda x, y: x.sum(1, keepdim=True),
    "mean": lambda x, y: x.mean(),
    "mean_dim": lambda x, y: x.mean(0),
    "cat": lambda x, y: _sg().cat([x, y], 0),
    "split": lambda x, y: _sg().split(x * y, 2, 1)[0],
    "split_with_sizes": lambda x, y: x.split([1, 2], -1)[1],
    "unbind": lambda x, y: (x * y).unbind(1)[2],
    "unsafe_split": lambda x, y: (x * y).unsafe_chunk(2, 1)[1],
    "unsafe_split_with_sizes": lambda x, y: _sg().unsafe_split_with_sizes(x * y, [2, 1], 1)[0],
    "stack": lambda x, y: _sg().stack([x, y], 1),
    "softmax": lambda x, y: _sg().softmax(x, dim=1),
    "log_softmax": lambda x, y: _sg().log_softmax(x, dim=0),
    "logsumexp": lambda x, y: x.logsumexp(1),
    "copy_slices": _setitem("copy_slices"),
    "as_strided_region": _ex_view_written,
    "setitem_copy": _setitem("setitem_copy"),
    "index_put": _setitem("index_put"),
    "addmm": lambda x, y: _nnf().linear(x, y, y[0, :2]),
    "mse_loss": lambda x, y: _nnf().mse_loss(x, y),
    "binary_cross_entropy_with_logits":
        lambda x, y: _nnf().binary_cross_entropy_with_logits(x, y - 0.5),
    "nll_loss": lambda x, y: _nnf().nll_loss(x, _sg().tensor([0, 2])),
    "nll_loss2d": lambda x, y: _nnf().nll_loss(x.reshape(1, 2, 3, 1),
                                               _sg().tensor([[[0], [1], [1]]])),
    "smooth_l1_loss": lambda x, y: _nnf().smooth_l1_loss(x, y * 1.2, beta=0.3),
    "huber_loss": lambda x, y: _nnf().huber_loss(x, y * 1.2, delta=0.3),
    "binary_cross_entropy": lambda x, y: _nnf().binary_cross_entropy(x * 0.5, y * 0.5),
    "xlogy": lambda x, y: _sg_ops("xlogy", (x, y), {}),
    "mul_scalar": lambda x, y: _sg_ops("mul_scalar", (x,), {"other": 0.75}),
    "div_scalar": lambda x, y: _sg_ops("div_scalar", (x,), {"other": 3}),
    "masked_fill": lambda x, y: _sg_ops("masked_fill", (x,), {"mask": x > 1.0, "value": 0.0}),
    "masked_fill_tensor": lambda x, y: x.masked_fill(x > 1.0, y[0, 1]),
    "diagonal": lambda x, y: (x * y).diagonal(1),
    "safe_softmax": lambda x, y: _sg_ops("safe_softmax", (x * y,), {"dim": 1}),
    "baddbmm": lambda x, y: _sg().baddbmm(x[:, :2].reshape(1, 2, 2), x.reshape(1, 2, 3),
                                         y.reshape(1, 3, 2), beta=0.5, alpha=2),
    "diagonal_backward": lambda x, y: _sg_ops("diagonal_backward", (x.t() * 1,), {
        "input_sizes": (2, 3, 3), "offset": 1, "dim1": 0, "dim2": 2}),
    "unsafe_view": lambda x, y: (x.t() * 1.0).reshape(6),
    "reshape_alias": lambda x, y: x[:, 0:2].reshape(2, 2, 1),
    "alias": lambda x, y: x[...],
    "squeeze_": lambda x, y: x[0] @ y.t(),
    "clamp_min": lambda x, y: _sg().clamp_min(x, 0.9),
    "clamp_max": lambda x, y: _sg().clamp_max(x, 1.1),
    "clamp_tensor": lambda x, y: _sg().clamp(x, min=y * 0.9, max=y * 1.1),
    "clamp_tensor_min": lambda x, y: _sg().clamp(x, min=y),
    "clamp_tensor_max": lambda x, y: _sg().clamp(x, max=y),
    "zero_": lambda x, y: (x * 1.0).zero_(),
    "fill_": lambda x, y: (x * 1.0).fill_(2.0),
    "fill_tensor_": lambda x, y: (x * 1.0).fill_(y[0, 0]),
    "clamp_min_tensor": lambda x, y: x.clamp_min(y),
    "clamp_max_tensor": lambda x, y: x.clamp_max(y),
    # in-place comparisons and random initialisers: a zero gradient into `self` (torch)
    **{f"{c}{k}": _ex_compare_(c, k == "_tensor_")
       for c in ("eq", "ne", "gt", "ge", "lt", "le") for k in ("_", "_tensor_")},
    "uniform_": lambda x, y: (x * 1.0).uniform_(),
    "normal_": lambda x, y: (x * 1.0).normal_(),
    "random_": lambda x, y: (x * 1.0).random_(),
    "random_to_": lambda x, y: (x * 1.0).random_(5),
    "random_from_to_": lambda x, y: (x * 1.0).random_(1, 5),
    "bernoulli_": lambda x, y: (x * 1.0).bernoulli_(0.5),
    "bernoulli_tensor_": lambda x, y: (x * 1.0).bernoulli_(y * 0 + 0.5),
    "exponential_": lambda x, y: (x * 1.0).exponential_(),
    "log_normal_": lambda x, y: (x * 1.0).log_normal_(),
    "cauchy_": lambda x, y: (x * 1.0).cauchy_(),
    "geometric_": lambda x, y: (x * 1.0).geometric_(0.5),
    "copy_": lambda x, y: (x * 1.0).copy_(y),
    "select_backward": lambda x, y: _ix("select_backward", x[0],
                                        {"input_sizes": (2, 3), "dim": 0, "index": 1}),
    "slice_backward": lambda x, y: _ix("slice_backward", x[:, 0:2],
                                       {"input_sizes": (2, 3), "dim": 1, "start": 0, "end": 2,
                                        "step": 1}),
    # -- tensor functions and normalisation (issue 21)
    "gather": lambda x, y: x.gather(1, _sg().tensor([[0, 2], [1, 1]])),
    "scatter": lambda x, y: x.scatter(1, _sg().tensor([[2, 0]]), y[:1, :2]),
    "scatter_value": lambda x, y: x.scatter(1, _sg().tensor([[2, 0]]), 0.5),
    "scatter_add": lambda x, y: x.scatter_add(1, _sg().tensor([[2, 2]]), y[:1, :2]),
    "index_select": lambda x, y: x.index_select(1, _sg().tensor([2, 0, 2])),
    "index_add": lambda x, y: x.index_add(1, _sg().tensor([2, 2]), y[:, :2], alpha=2),
    "cumsum": lambda x, y: x.cumsum(1),
    "cumprod": lambda x, y: x.cumprod(1),
    "prod": lambda x, y: x.prod(),
    "prod_dim": lambda x, y: x.prod(1, keepdim=True),
    "flip": lambda x, y: x.flip(0, 1),
    "var": lambda x, y: x.var(1),
    "std": lambda x, y: x.std(0, correction=0),
    "linalg_vector_norm": lambda x, y: x.norm(dim=1),
    # (small: SymPy's simplify of 1/sqrt(var + eps) grows fast with the normalised size)
    "native_layer_norm": lambda x, y: _nnf().layer_norm(x[:, :2], (2,), y[0, :2], y[1, :2]),
    "native_batch_norm": lambda x, y: _nnf().batch_norm(x[:, :1], None, None, y[0, :1],
                                                        y[1, :1], training=True),
    "embedding": lambda x, y: _nnf().embedding(_sg().tensor([[1, 0], [1, 1]]), x),
    "sort": lambda x, y: x.sort(1, descending=True)[0],
    "topk": lambda x, y: x.topk(2, dim=1)[0],
    "tril": lambda x, y: x.tril(1),
    "triu": lambda x, y: x.triu(),
    "roll": lambda x, y: x.roll(1, 1),
    "repeat": lambda x, y: x.repeat(2, 1, 2),
    "index_backward": lambda x, y: _ix("index_backward", x[0],
                                       {"indices": (_sg().tensor([0, 2, 0]),),
                                        "input_sizes": (4,)}),
}


def _sg_ops(name, inputs, params):
    """Apply a registered op that has no public function of its own (aten overloads)."""
    from ..autograd.function import apply
    from ..ops import OPS

    return apply(OPS[name], inputs, params)


def _ix(name, t, params):
    from ..ops.indexing import _apply

    return _apply(name, (t,), params)


def _sg():
    import symgrad

    return symgrad


def _nnf():
    from ..nn import functional

    return functional


def _find_node(root, spec_name):
    from ..autograd.node import AccumulateGrad

    stack, seen = [root.grad_fn], set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen or isinstance(n, AccumulateGrad):
            continue
        seen.add(id(n))
        spec = getattr(type(n), "_spec", None)
        if spec is not None and spec.name == spec_name:
            return n
        stack.extend(m for m, _ in n.next_functions)
    return None


@contextlib.contextmanager
def _symbolic_tensors(valuation=None):
    """Tensors whose data are object arrays on a ``sympy`` device, for running formulas."""
    import importlib

    import sympy

    from .. import backends
    from ..device import device

    tensor_mod = importlib.import_module("symgrad.tensor")
    memory = importlib.import_module("symgrad.memory")
    memory._live.setdefault("sympy", 0)  # object-array storages are counted apart
    memory._peak.setdefault("sympy", 0)

    dev = object.__new__(device)
    dev.type, dev.index = "sympy", None
    had_be = "sympy" in backends._BACKENDS
    backends._BACKENDS["sympy"] = SympyBackend(sympy, valuation=valuation)
    backends._DEVICE_DEFAULT["sympy"] = "sympy"
    key = np.dtype(object)
    had_dt = key in tensor_mod._DT_OF
    from .. import dtypes

    tensor_mod._DT_OF[key] = dtypes.float64
    cuda = importlib.import_module("symgrad.cuda")
    require = cuda._require_cuda

    def _require(d):  # creation on the sympy device goes to the SymPy backend's kernels
        return d if getattr(d, "type", None) == "sympy" else require(d)

    cuda._require_cuda = _require
    try:
        yield dev
    finally:
        cuda._require_cuda = require
        if not had_dt:
            tensor_mod._DT_OF.pop(key, None)
        if not had_be:
            backends._BACKENDS.pop("sympy", None)
            backends._DEVICE_DEFAULT.pop("sympy", None)


def _wrap(dev, arr):
    from ..tensor import Tensor

    return Tensor._wrap(obj(np.asarray(arr, dtype=object)), dev)


def audit_rules(ops=None) -> list[RuleAudit]:
    """Audit the backward rules of ``ops`` (default: every differentiable op in OPS)."""
    from ..ops import OPS

    names = sorted(n for n, s in OPS.items() if s.differentiable) if ops is None else list(ops)
    return [_audit_one(OPS[n]) for n in names]


def _audit_one(spec) -> RuleAudit:
    import symgrad as sg

    ex = EXAMPLES.get(spec.name)
    if ex is None:
        return RuleAudit(spec.name, spec.grad_fn, "no example",
                         "add an entry to symgrad.symbolic.audit.EXAMPLES")
    try:
        x, y = _leaf((2, 3), 1), _leaf((2, 3), 2)
        out = ex(x, y)
        node = _find_node(out, spec.name)
        if node is None:
            return RuleAudit(spec.name, spec.grad_fn, "no example",
                             "the example did not record this op")
        with sg.no_grad():
            return _prove(spec, node)
    except Exception as exc:  # report, never crash the audit
        return RuleAudit(spec.name, spec.grad_fn, "error", f"{type(exc).__name__}: {exc}")


def _prove(spec, node) -> RuleAudit:
    import sympy

    from ..ops.spec import STRUCTURAL
    from ._engine import Evaluator
    from .exact import elementwise
    from .graph import walk_symgrad

    # the node's recorded inputs, via the verifier's own graph reader
    graph = walk_symgrad(_alias_root(node))
    g = graph.nodes[-1]
    vals = graph.node_inputs(g)
    values: dict = {}
    sym_in = []
    diff_syms: dict = {}
    for k, (r, v) in enumerate(zip(g.inputs, vals)):
        if r[0] != "scalar" and np.asarray(v).dtype.kind == "f":
            arr = np.empty(np.shape(v), dtype=object)
            flat = np.asarray(v, dtype=np.float64).reshape(-1)
            for i, idx in enumerate(np.ndindex(*np.shape(v))):
                s = sympy.Symbol(f"x{k}_{i}", positive=True)
                arr[idx] = s
                values[s] = flat[i]
            sym_in.append(arr)
            diff_syms[k] = arr
        else:
            sym_in.append(v)
    import mpmath

    ev = Evaluator({s: mpmath.mpf(float(v)) for s, v in values.items()})
    be = SympyBackend(sympy, valuation=ev)
    if callable(spec.sympy):
        outs = (elementwise(spec.sympy, sympy, sym_in, g.params),)
    elif spec.sympy == STRUCTURAL:
        outs = g.forward_numeric(be, sym_in)
    else:
        return RuleAudit(spec.name, spec.grad_fn, "error", "no SymPy meaning")
    outs = [obj(o) for o in outs]
    n_diff = len(outs) if spec.variadic_outputs else spec.differentiable_outputs
    # one symbolic cotangent per element of each output that carries a gradient (all the
    # pieces of a split; output 0 elsewhere, whose formula gets ``grad``)
    Gs = []
    for o_nr in range(len(outs) if spec.variadic_outputs else 1):
        Gk = np.empty(outs[o_nr].shape, dtype=object)
        for i, idx in enumerate(np.ndindex(*outs[o_nr].shape)):
            Gk[idx] = sympy.Symbol(f"g_{i}" if o_nr == 0 else f"g{o_nr}_{i}", real=True)
        Gs.append(Gk)
    G = Gs[0]
    results = []
    with _symbolic_tensors(ev) as dev:
        saved_cache = {}

        def on_dev(v):
            """Saved cpu tensors (conditions, indices) moved onto the sympy device."""
            from ..tensor import Tensor

            if isinstance(v, Tensor) and v.device.type != "sympy":
                return Tensor._wrap(np.asarray(v._data), dev)
            if isinstance(v, tuple):
                return tuple(on_dev(u) for u in v)
            if isinstance(v, list):
                return [on_dev(u) for u in v]
            return v

        def saved(p):
            if p in saved_cache:
                return saved_cache[p]
            kind, detail = spec.saved_kind(p)
            if kind == "input":
                k = spec.inputs.index(p)
                v = sym_in[k]
                val = _wrap(dev, v) if isinstance(v, np.ndarray) and v.dtype == object else (
                    node._unpack_saved(p) if k not in diff_syms else v)
            elif kind == "output":
                val = _wrap(dev, outs[spec.outputs.index(p)]) if spec.outputs.index(p) < \
                    n_diff else node._unpack_saved(p)
            else:
                val = node._unpack_saved(p)
            val = on_dev(val)
            saved_cache[p] = val
            return val

        G_t = [_wrap(dev, Gk) for Gk in Gs] if spec.variadic_outputs else _wrap(dev, G)
        for k, name in enumerate(spec.inputs):
            if k not in diff_syms or name not in spec.grads:
                continue
            kwargs = {p: saved(p) for p in spec.formula_params[name]}
            try:
                R = spec.grads[name](G_t, **kwargs)
            except Exception as exc:  # the formula cannot run on symbolic tensors
                return _numeric_check(spec, node, outs, diff_syms, values, Gs, exc)
            if R is None:
                return RuleAudit(spec.name, spec.grad_fn, "failed", f"no gradient for {name}")
            shape = np.shape(sym_in[k])
            if tuple(R.shape) != tuple(shape):
                R = R.sum_to_size(shape)
            results.append((name, obj(R._data), k))
    status, detail = "proved", ""
    for name, R, k in results:
        X = diff_syms[k]
        for idx in np.ndindex(*X.shape):
            s = X[idx]
            truth = _vjp(sympy, Gs, outs, s)
            d = _decide(sympy.sympify(R[idx]) - truth, values)
            if d == 0 or sympy.simplify(d) == 0:
                continue
            if _vanishes_numerically(d, values, np.concatenate([g.reshape(-1) for g in Gs])):
                status, detail = "checked numerically", f"d/d{name}: simplify did not reach 0"
                continue
            return RuleAudit(spec.name, spec.grad_fn, "failed",
                             f"d/d{name}{list(idx)}: rule - derivative = {sympy.sstr(d)[:200]}")
    return RuleAudit(spec.name, spec.grad_fn, status, detail)


def _vjp(sympy, Gs, outs, s):
    """sum over outputs o and elements i of g_o[i] * d out_o[i] / d s."""
    return sympy.Add(*[Gk[o] * sympy.diff(out[o], s) for Gk, out in zip(Gs, outs)
                       for o in np.ndindex(*out.shape)
                       if s in getattr(out[o], "free_symbols", ())])


def _decide(e, values):
    """Fix every branch of ``e`` (Heaviside, Max/Min, Piecewise, Abs, sign) at the point.

    The proof then holds on the region around the example's values (kinks excluded), as
    the rule's own comparisons are decided there too.
    """
    import sympy

    def val(a):
        return float(a.xreplace({s: sympy.Float(v) for s, v in values.items()}).evalf())

    def rewrite(x):
        if x.is_Atom:
            return x
        args = [rewrite(a) for a in x.args]
        f = x.func
        if f is sympy.Heaviside:
            v = val(args[0])
            return sympy.Integer(1) if v > 0 else (
                sympy.Integer(0) if v < 0 else sympy.Rational(1, 2))
        if f in (sympy.Max, sympy.Min):
            vs = [val(a) for a in args]
            best = max(vs) if f is sympy.Max else min(vs)
            return args[vs.index(best)]
        if f is sympy.Abs:
            return args[0] if val(args[0]) >= 0 else -args[0]
        if f is sympy.sign:
            v = val(args[0])
            return sympy.Integer(1 if v > 0 else (-1 if v < 0 else 0))
        if f is sympy.DiracDelta:
            return sympy.Integer(0)
        if f is sympy.Piecewise:
            for pair in x.args:
                c = pair.cond
                if c is sympy.true or bool(c.xreplace({s: sympy.Float(v)
                                                       for s, v in values.items()})):
                    return rewrite(pair.expr)
        return f(*args) if args != list(x.args) else x

    return rewrite(e)


def _numeric_check(spec, node, outs, diff_syms, values, Gs, why) -> RuleAudit:
    """The rule on float64 tensors at the example point against SymPy's derivative there."""
    import sympy

    from .. import tensor

    rng = np.random.default_rng(3)
    subs = {s: sympy.Float(v) for s, v in values.items()}
    gts = []
    for Gk in Gs:
        gnum = rng.standard_normal(Gk.shape)
        subs.update({Gk[idx]: sympy.Float(float(gnum[idx])) for idx in np.ndindex(*Gk.shape)})
        gts.append(tensor(gnum))
    cache: dict = {}
    for k, name in enumerate(spec.inputs):
        if k not in diff_syms or name not in spec.grads:
            continue
        kwargs = {}
        for p in spec.formula_params[name]:
            if p not in cache:
                cache[p] = node._unpack_saved(p)
            kwargs[p] = cache[p]
        dt = _dtype_of(kwargs)
        R = spec.grads[name]([g.to(dt) for g in gts] if spec.variadic_outputs
                             else gts[0].to(dt), **kwargs)
        X = diff_syms[k]
        if tuple(R.shape) != X.shape:
            R = R.sum_to_size(X.shape)
        r = np.asarray(R.detach().numpy(), dtype=np.float64)
        for idx in np.ndindex(*X.shape):
            truth = _vjp(sympy, Gs, outs, X[idx])
            t = float(_decide(sympy.sympify(truth), values).xreplace(subs).evalf())
            if abs(r[idx] - t) > 1e-9 * (1 + abs(t)):
                return RuleAudit(spec.name, spec.grad_fn, "failed",
                                 f"d/d{name}{list(idx)}: rule {r[idx]!r}, derivative {t!r}")
    return RuleAudit(spec.name, spec.grad_fn, "checked numerically",
                     f"rule cannot run on symbolic tensors ({type(why).__name__}: "
                     f"{str(why)[:80]}); equal at the example point")


def _dtype_of(kwargs):
    from ..tensor import Tensor

    for v in kwargs.values():
        if isinstance(v, Tensor) and v.dtype.is_floating_point:
            return v.dtype
    from .. import float64

    return float64


def _alias_root(node):
    """A stand-in root tensor whose grad_fn is ``node`` (for the graph reader)."""
    from ..tensor import Tensor

    shape, dtype = node._out_meta[0]
    t = Tensor._wrap(np.zeros(shape, dtype=dtype.np))
    t._grad_fn = node
    t._output_nr = 0
    t._requires_grad = True
    return t


def _vanishes_numerically(d, values, G) -> bool:
    import sympy

    rng = np.random.default_rng(0)
    for _ in range(3):
        sub = {s: sympy.Float(v * rng.uniform(0.9, 1.1)) for s, v in values.items()}
        sub.update({g: sympy.Float(rng.standard_normal()) for g in G.reshape(-1)})
        r = complex(d.xreplace(sub).evalf())
        if abs(r) > 1e-9:
            return False
    return True


# -- convolution and pooling (issue 21)
EXAMPLES.update({
    "convolution": lambda x, y: _nnf().conv1d(x.unsqueeze(0), y[:, 0:2].reshape(2, 1, 2),
                                              y[:, 2], padding=1, groups=2),
    "constant_pad_nd": lambda x, y: _sg_ops("constant_pad_nd", (x,), {"pad": (1, 2, 0, 1)}),
    "max_pool2d_with_indices": lambda x, y: _nnf().max_pool2d(x.unsqueeze(0), 2, 1, 1),
    "avg_pool2d": lambda x, y: _nnf().avg_pool2d(x.unsqueeze(0), 2, 1, 1, ceil_mode=True,
                                                  count_include_pad=False),
    "adaptive_avg_pool2d": lambda x, y: _nnf().adaptive_avg_pool2d(x.unsqueeze(0), (2, 2)),
})


# -- torch's fused CPU attention node: q, k, v of (1, 1, 2, 3), causal (a -inf score)
EXAMPLES.update({
    "scaled_dot_product_flash_attention_for_cpu": lambda x, y: _nnf().scaled_dot_product_attention(
        x.reshape(1, 1, 2, 3), y.reshape(1, 1, 2, 3), (x * y).reshape(1, 1, 2, 3),
        is_causal=True),
})
