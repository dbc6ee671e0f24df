"""Symbolic tracing of custom Function forwards: the exact meaning of what the user wrote.

A custom ``autograd.Function`` without a ``sympy`` staticmethod is given its meaning by
running its own ``forward`` once on *symbolic tensors*: symgrad tensors on a ``sympy``
device whose data are object arrays of SymPy/symengine expressions, so every symgrad op
in the forward runs on the SymPy backend (the same kernels the verifier's replay uses).
``ctx`` is a stand-in (:class:`TraceCtx`) with the Function ctx's methods.

NumPy inside a forward is followed too: on a symbolic tensor ``.numpy()`` returns a
:class:`SymArray`, an object-array subclass whose ``__array_ufunc__`` maps NumPy's ufuncs
(exp, log, sin, cos, tanh, sqrt, abs, where, maximum, minimum, comparisons, sums,
matmul/dot, ...) onto the SymPy backend's kernels, and ``symgrad.tensor`` /
``from_numpy`` / ``as_tensor`` turn such arrays back into symbolic tensors.

Comparisons (``x > 0``, ``maximum``, ``clamp``, ``where`` conditions) are decided at the
values of the point being checked, as every branch in the verifier is; so is the
data-dependent structure built from them (masks, counts, sort order, computed indices,
integer casts): kernels none of whose operands holds a symbol run numerically
(``trace_fold.py``), so such values stay integers and booleans that index, gather and
scatter, and only the arithmetic on symbols is symbolic. ``decided`` (see
:func:`trace_forward`) collects what was decided, for the report's note. A tensor input
that needs no gradient holds its recorded numbers, and ``.item()`` of it is a Python
number. Torch calls symgrad has no op for run in torch at numbers where that is exact
(``trace_values.py``). A value taken out of a symbolic tensor (``.item()``, ``float(x)``,
an element of ``.numpy()``) and used in Python control flow cannot be decided on symbols:
such a forward raises :class:`TraceError`, which names the line of the user's code that
stopped the trace, and the verifier falls back to finite differences with that note.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import traceback
import types

import numpy as np

from ..backends.sympy_backend import is_number, obj
from .trace_fold import _ACTIVE, _REAL  # the trace's state: its backend; torch at numbers

__all__ = ["TraceError", "TraceCtx", "SymArray", "TorchSym", "symbolic_device", "trace_forward",
           "surrogate_of", "forward_arg_names", "is_torch_function"]


class TraceError(Exception):
    """A forward that cannot run on symbolic tensors, with where it stopped."""

    def __init__(self, cls_name: str, exc: BaseException) -> None:
        self.cls_name = cls_name
        self.reason = f"{type(exc).__name__}: {exc}".strip()
        self.where, self.source = _user_frame(exc)
        super().__init__(self.note())

    def note(self) -> str:
        at = f" at {self.where}" if self.where else ""
        src = f": `{self.source}`" if self.source else ""
        return (f"{self.cls_name}.forward could not be traced on symbols{at}{src} "
                f"({self.reason})")


def _skip_dirs() -> tuple[str, ...]:
    import sys

    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # symgrad/
    for name in ("numpy", "sympy", "symengine", "mpmath", "torch"):
        m = sys.modules.get(name)
        f = getattr(m, "__file__", None)
        if f:
            dirs.append(os.path.dirname(os.path.abspath(f)))
    dirs.append(os.path.dirname(os.path.abspath(contextlib.__file__)))  # the stdlib
    return tuple(d + os.sep for d in dirs)


def _user_frame(exc: BaseException) -> tuple[str, str]:
    """``file:line`` and the source text of the last frame of the user's own code."""
    frames = traceback.extract_tb(exc.__traceback__)
    skip = _skip_dirs()
    user = [f for f in frames if os.path.isfile(f.filename)
            and not os.path.abspath(f.filename).startswith(skip)]
    f = user[-1] if user else (frames[-1] if frames else None)
    if f is None:
        return "", ""
    src = (f.line or linecache.getline(f.filename, f.lineno) or "").strip()
    try:
        name = os.path.relpath(f.filename)
        if name.startswith(".."):
            name = f.filename
    except ValueError:  # another drive
        name = f.filename
    return f"{name}:{f.lineno}", src


def surrogate_of(cls) -> str | None:
    """The Function's declared surrogate gradient (``surrogate_gradient = True`` or a
    string saying what it is, e.g. ``"straight-through estimator"``), else None."""
    v = getattr(cls, "surrogate_gradient", None)
    if not v:
        return None
    return v if isinstance(v, str) else "surrogate gradient"


def forward_arg_names(cls, n_args: int) -> tuple[str, ...]:
    """The forward's parameter names (after ``ctx``), ``argN`` where it takes ``*args``."""
    import inspect

    names = [f"arg{j}" for j in range(n_args)]
    try:
        sig = inspect.signature(cls.forward)
    except (TypeError, ValueError):
        return tuple(names)
    params = list(sig.parameters.values())
    if not _setup_context_style(cls) and params:
        params = params[1:]  # ctx
    for j, p in enumerate(params[:n_args]):
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names[j] = p.name
        else:
            break
    return tuple(names)


def _setup_context_style(cls) -> bool:
    """True when the Function defines ``setup_context`` (forward then takes no ctx)."""
    own = getattr(cls, "setup_context", None)
    for b in cls.__mro__[1:]:
        if b.__name__ in ("Function", "_SingleLevelFunction") and \
                "setup_context" in b.__dict__ and b.__module__.startswith(("symgrad", "torch")):
            return own is not b.setup_context
    return False


class TraceCtx:
    """The ``ctx`` a forward gets while traced: the Function ctx's methods, no graph."""

    def __init__(self, needs_input_grad: tuple) -> None:
        self.needs_input_grad = needs_input_grad
        self.to_save = ()
        self.dirty_tensors = ()
        self.non_differentiable = ()
        self.materialize_grads = True
        self.metadata: dict = {}

    def save_for_backward(self, *tensors) -> None:
        self.to_save = tensors

    def save_for_forward(self, *tensors) -> None:
        self.saved_for_forward = tensors

    def mark_dirty(self, *tensors) -> None:
        self.dirty_tensors = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = bool(value)

    @property
    def saved_tensors(self) -> tuple:
        return tuple(self.to_save)

    saved_variables = saved_tensors


# -- NumPy on symbolic values ---------------------------------------------------------------
#: NumPy ufunc -> SympyBackend kernel
_KERNELS = {"exp": "exp", "log": "log", "sin": "sin", "cos": "cos", "tanh": "tanh",
            "sqrt": "sqrt", "absolute": "abs", "fabs": "abs", "negative": "neg", "add": "add",
            "subtract": "sub", "multiply": "mul", "true_divide": "div", "divide": "div",
            "power": "pow", "float_power": "pow", "maximum": "maximum", "minimum": "minimum",
            "fmax": "maximum", "fmin": "minimum", "greater": "gt", "greater_equal": "ge",
            "less": "lt", "less_equal": "le", "equal": "eq", "not_equal": "ne",
            "matmul": "matmul", "sign": "sign", "reciprocal": "reciprocal",
            "log1p": "log1p", "expm1": "expm1", "arctan2": "atan2", "hypot": "hypot"}
#: NumPy ufunc -> f(engine, *xs) elementwise
_ELEMENTWISE = {
    "tan": lambda sp, x: sp.tan(x), "arctan": lambda sp, x: sp.atan(x),
    "arcsin": lambda sp, x: sp.asin(x), "arccos": lambda sp, x: sp.acos(x),
    "sinh": lambda sp, x: sp.sinh(x), "cosh": lambda sp, x: sp.cosh(x),
    "arctanh": lambda sp, x: sp.atanh(x), "arcsinh": lambda sp, x: sp.asinh(x),
    "log2": lambda sp, x: sp.log(x) / sp.log(2), "log10": lambda sp, x: sp.log(x) / sp.log(10),
    "exp2": lambda sp, x: 2 ** x, "square": lambda sp, x: x * x,
    "cbrt": lambda sp, x: x ** sp.Rational(1, 3), "positive": lambda sp, x: x,
    "conjugate": lambda sp, x: x,
    "arccosh": lambda sp, x: sp.acosh(x), "log1p": lambda sp, x: sp.log(1 + x),
    "expm1": lambda sp, x: sp.exp(x) - 1, "erfc": lambda sp, x: 1 - sp.erf(x),
}
_REDUCE = {"add": "sum", "maximum": "amax", "minimum": "amin", "fmax": "amax", "fmin": "amin"}



def _plain(a):
    return a.view(np.ndarray) if isinstance(a, SymArray) else a


def _wrap_out(r):
    if isinstance(r, np.ndarray):
        return r.view(SymArray) if r.dtype == object else r
    if isinstance(r, (bool, np.bool_)):
        return r
    return np.asarray(r, dtype=object).view(SymArray)


class SymArray(np.ndarray):
    """An object array of expressions whose NumPy ufuncs build SymPy expressions.

    ``.numpy()`` of a symbolic tensor returns one while a forward is traced; ufuncs with a
    SymPy meaning run on the SymPy backend (comparisons decided at the point's values)."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        be = _ACTIVE[-1] if _ACTIVE else None
        name = ufunc.__name__
        args = [_plain(a) for a in inputs]
        out = kwargs.pop("out", None)
        if out is not None:
            raise TypeError(f"np.{name}(..., out=) is not supported on symbolic values")
        if be is None:
            return _wrap_out(getattr(ufunc, method)(*args, **kwargs))
        if method == "__call__":
            kwargs.pop("dtype", None)
            kwargs.pop("casting", None)
            if kwargs:
                raise TypeError(f"np.{name} with {sorted(kwargs)} is not supported on "
                                "symbolic values")
            if name in _KERNELS:
                return _wrap_out(getattr(be, _KERNELS[name])(*args))
            if name in _ELEMENTWISE:
                f, sp = _ELEMENTWISE[name], be.sp
                fn = np.frompyfunc(lambda *xs: f(sp, *xs), len(args), 1)
                return _wrap_out(obj(fn(*[obj(a) for a in args])))
            raise TypeError(f"np.{name} has no SymPy meaning here (symbolic values)")
        if method == "reduce" and name in _REDUCE:
            axis = kwargs.pop("axis", 0)
            keepdims = kwargs.pop("keepdims", False)
            kwargs.pop("dtype", None)
            if kwargs.get("where", True) is True:
                kwargs.pop("where", None)
            if kwargs:
                raise TypeError(f"np.{name}.reduce with {sorted(kwargs)} is not supported on "
                                "symbolic values")
            axis = tuple(axis) if isinstance(axis, list) else axis
            return _wrap_out(getattr(be, _REDUCE[name])(args[0], axis=axis, keepdims=keepdims))
        raise TypeError(f"np.{name}.{method} is not supported on symbolic values")

    def __array_function__(self, func, types, args, kwargs):
        be = _ACTIVE[-1] if _ACTIVE else None
        if be is not None and func in (np.dot, np.matmul) and len(args) == 2 and not kwargs:
            a, b = (_plain(a) for a in args)
            if np.ndim(a) == 0 or np.ndim(b) == 0:
                return _wrap_out(be.mul(a, b))
            return _wrap_out(be.matmul(a, b))
        if be is not None and func is np.clip:
            a, lo, hi = (list(args) + [kwargs.get("a_min"), kwargs.get("a_max")])[:3]
            r = _plain(a)
            if lo is not None:
                r = be.maximum(r, _plain(lo))
            if hi is not None:
                r = be.minimum(r, _plain(hi))
            return _wrap_out(r)
        r = super().__array_function__(func, types, args, kwargs)
        if isinstance(r, tuple):
            return tuple(_wrap_out(x) if isinstance(x, np.ndarray) else x for x in r)
        return _wrap_out(r) if isinstance(r, np.ndarray) else r


# -- the symbolic device --------------------------------------------------------------------
def _is_symbolic_data(data) -> bool:
    if isinstance(data, SymArray):
        return True
    if isinstance(data, np.ndarray):
        return data.dtype == object
    if isinstance(data, (list, tuple)):
        return any(_is_symbolic_data(d) for d in data)
    return hasattr(data, "free_symbols") and not getattr(data, "is_Number", False)


def _as_object(data) -> np.ndarray:
    if isinstance(data, (list, tuple)):
        parts = [_plain(d) if isinstance(d, np.ndarray) else d for d in data]
        return obj(np.array(parts, dtype=object))
    return obj(np.asarray(_plain(data) if isinstance(data, np.ndarray) else data,
                          dtype=object))


@contextlib.contextmanager
def symbolic_device(be):
    """Tensors on a ``sympy`` device run ``be``'s kernels inside this block; creation from
    symbolic data (SymArray, object arrays, expressions) makes such tensors, and
    ``Tensor.numpy()`` / ``item()`` / ``tolist()`` hand out their expressions."""
    import importlib

    from .. import backends, dtypes
    from ..device import device

    tensor_mod = importlib.import_module("symgrad.tensor")
    creation = importlib.import_module("symgrad.creation")
    memory = importlib.import_module("symgrad.memory")
    cuda = importlib.import_module("symgrad.cuda")
    sg = importlib.import_module("symgrad")
    Tensor = tensor_mod.Tensor
    memory._live.setdefault("sympy", 0)
    memory._peak.setdefault("sympy", 0)
    dev = object.__new__(device)
    dev.type, dev.index = "sympy", None
    saved_be = backends._BACKENDS.get("sympy")
    saved_default = backends._DEVICE_DEFAULT.get("sympy")
    backends._BACKENDS["sympy"] = be
    backends._DEVICE_DEFAULT["sympy"] = "sympy"
    key = np.dtype(object)
    saved_dt = tensor_mod._DT_OF.get(key)
    tensor_mod._DT_OF[key] = dtypes.float64
    require = cuda._require_cuda

    def _require(d):
        return d if getattr(d, "type", None) == "sympy" else require(d)

    def _wrap(data):
        return Tensor._wrap(_as_object(data), dev)

    patched: list = []

    def patch(owner, name, new):
        if hasattr(owner, name):
            patched.append((owner, name, getattr(owner, name)))
            setattr(owner, name, new)

    orig_numpy, orig_item, orig_tolist = Tensor.numpy, Tensor.item, Tensor.tolist

    def numpy(self, *a, **k):
        if self._device.type == "sympy":
            return obj(self._data).view(SymArray) if self._data.dtype == object else self._data
        return orig_numpy(self, *a, **k)

    def item(self):
        if self._device.type == "sympy":
            if self._data.size != 1:
                raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be "
                                   "converted to Scalar")
            v = self._data.reshape(-1)[0]
            if is_number(v) and not isinstance(v, (bool, np.bool_)):
                v = float(v)  # a constant: a Python number, as item() gives
                if not self.dtype.is_floating_point:
                    v = int(v)
            return v.item() if isinstance(v, np.generic) else v
        return orig_item(self)

    def tolist(self):
        if self._device.type == "sympy":
            return self._data.tolist()
        return orig_tolist(self)

    def make_creator(orig):
        def create(data, *a, **k):
            if _is_symbolic_data(data):
                return _wrap(data)
            return orig(data, *a, **k)

        create.__wrapped__ = orig
        return create

    device_mod = importlib.import_module("symgrad.device")
    saved_default_device = device_mod._DEFAULT
    device_mod._DEFAULT = dev  # tensors made inside the forward (arange, zeros) join it
    cuda._require_cuda = _require
    patch(Tensor, "numpy", numpy)
    patch(Tensor, "item", item)
    patch(Tensor, "tolist", tolist)
    from .trace_fold import _INT_METHODS, decided_cast, decided_method

    for name in (*_INT_METHODS, "to", "type"):
        if hasattr(Tensor, name):
            patch(Tensor, name, decided_cast(getattr(Tensor, name), name))
    for name in _DECIDE:  # comparisons symgrad computes on the data itself
        if hasattr(Tensor, name):
            patch(Tensor, name, decided_method(getattr(Tensor, name), name))
        for mod in (sg, importlib.import_module("symgrad.functional")):
            if hasattr(mod, name):
                patch(mod, name, decided_method(getattr(mod, name), name))
    for name in ("tensor", "from_numpy", "as_tensor", "asarray"):
        for mod in (sg, creation):
            if hasattr(mod, name):
                patch(mod, name, make_creator(getattr(mod, name)))
    _ACTIVE.append(be)
    try:
        yield dev
    finally:
        _ACTIVE.pop()
        for owner, name, old in reversed(patched):
            setattr(owner, name, old)
        device_mod._DEFAULT = saved_default_device
        cuda._require_cuda = require
        if saved_dt is None:
            tensor_mod._DT_OF.pop(key, None)
        else:
            tensor_mod._DT_OF[key] = saved_dt
        if saved_be is None:
            backends._BACKENDS.pop("sympy", None)
        else:
            backends._BACKENDS["sympy"] = saved_be
        if saved_default is None:
            backends._DEVICE_DEFAULT.pop("sympy", None)
        else:
            backends._DEVICE_DEFAULT["sympy"] = saved_default


def _arg_array(a):
    """A replay input as a trace argument: integer/boolean contents as a numeric array."""
    a = np.asarray(a) if not isinstance(a, np.ndarray) else a
    if a.dtype != object:
        return a.copy() if a.dtype.kind in "biu" else obj(a).copy()
    flat = list(a.flat)
    if flat and all(isinstance(v, (bool, np.bool_)) for v in flat):
        return a.astype(bool)
    if flat and all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                    for v in flat):
        return a.astype(np.int64)
    return a.copy()


def trace_forward(cls, args, be, tensor_positions, decided: list | None = None) -> tuple:
    """Run ``cls.forward`` once on symbolic tensors; the outputs' object arrays (None for a
    non-tensor output). ``args``: per forward argument, an array (tensor arguments, at
    ``tensor_positions``) or the value itself. A ``torch.autograd.Function`` gets
    :class:`TorchSym` stand-ins for its tensor arguments. Raises :class:`TraceError`.
    ``decided`` (a list) receives what was decided at the recorded values (comparisons,
    sort order, torch calls run at numbers): data-dependent structure, like branches."""
    from ..autograd.grad_mode import no_grad
    from ..tensor import Tensor
    from .trace_fold import FoldingBackend

    pos = set(tensor_positions)
    torch_cls = is_torch_function(cls)
    decided = decided if decided is not None else []
    be = FoldingBackend(be._be if isinstance(be, FoldingBackend) else be, decided)
    with symbolic_device(be) as dev, \
            (_torch_symbolic(dev, decided) if torch_cls else contextlib.nullcontext()):
        targs = [Tensor._wrap(_arg_array(a), dev) if j in pos else a
                 for j, a in enumerate(args)]
        if torch_cls:
            targs = [TorchSym(a) if j in pos else a for j, a in enumerate(targs)]
        ctx = TraceCtx(tuple(j in pos for j in range(len(args))))
        try:
            with no_grad(), (_torch_no_grad() if torch_cls else contextlib.nullcontext()):
                if _setup_context_style(cls):
                    out = cls.forward(*targs)
                    cls.setup_context(ctx, tuple(targs), out)
                else:
                    out = cls.forward(ctx, *targs)
        except Exception as exc:  # noqa: BLE001 - any failure stops the trace
            raise TraceError(cls.__name__, exc) from exc
    outs = out if isinstance(out, tuple) else (out,)
    result = []
    for o in outs:
        if isinstance(o, TorchSym):
            o = o._sgt
        if isinstance(o, Tensor):
            result.append(obj(np.asarray(_plain(o._data))).copy())
        elif torch_cls and type(o).__module__.startswith("torch") and hasattr(o, "detach"):
            result.append(obj(np.asarray(o.detach().cpu().numpy())).copy())  # a constant
        else:
            result.append(None)
    return tuple(result)


def _torch_no_grad():
    import torch

    return torch.no_grad()


# -- torch forwards on symbolic values --------------------------------------------------------
# A ``torch.autograd.Function``'s forward gets :class:`TorchSym` stand-ins for its tensor
# arguments: each wraps a symbolic symgrad tensor (the same sympy device as above), and
# torch calls on it -- ``torch.exp(x)`` through the ``__torch_function__`` protocol,
# ``x.sum(dim=1)`` and ``x * y`` through its own methods -- run the symgrad op of the same
# name (symgrad is PyTorch-shaped), so a torch forward means what the same symgrad forward
# means. ``.numpy()`` gives a :class:`SymArray` and ``torch.from_numpy`` / ``torch.tensor``
# of one gives a stand-in back, so NumPy inside a torch forward is followed too.

_TORCH_DEV: list = []  # the symbolic device of the innermost torch trace
_DECIDED: list = []  # per trace: the torch calls decided at the recorded values

#: torch names -> the symgrad name with the same meaning
_TORCH_ALIAS = {"clip": "clamp", "absolute": "abs", "multiply": "mul", "subtract": "sub",
                "divide": "div", "true_divide": "div", "greater": "gt", "greater_equal": "ge",
                "less": "lt", "less_equal": "le", "not_equal": "ne", "negative": "neg",
                "arctan": "atan", "arcsin": "asin", "arccos": "acos", "arctanh": "atanh",
                "arcsinh": "asinh", "hardtanh": "clamp", "concat": "cat", "concatenate": "cat",
                "arccosh": "acosh", "fmax": "maximum", "fmin": "minimum"}
#: torch elementwise functions symgrad has no op for -> the NumPy-name meaning above
_TORCH_ELEMENTWISE = {"tan": "tan", "atan": "arctan", "asin": "arcsin", "acos": "arccos",
                      "sinh": "sinh", "cosh": "cosh", "atanh": "arctanh", "asinh": "arcsinh",
                      "log1p": "log1p", "expm1": "expm1", "log2": "log2", "log10": "log10",
                      "exp2": "exp2", "square": "square", "acosh": "arccosh",
                      "arccosh": "arccosh", "erfc": "erfc"}


def _engine_map(x, f):
    """``f(engine, element)`` on every element of a symbolic tensor."""
    from ..tensor import Tensor

    sp = _ACTIVE[-1].sp
    data = np.asarray(_plain(x._data))
    fn = np.frompyfunc(lambda e: f(sp, e), 1, 1)
    return Tensor._wrap(obj(fn(obj(data))), x._device)


def _erf(x):
    return _engine_map(x, lambda sp, e: sp.erf(e))


def _gelu(x, approximate="none"):
    if approximate == "tanh":
        return _engine_map(x, lambda sp, e: e / 2 * (1 + sp.tanh(
            sp.sqrt(2 / sp.pi) * (e + sp.Rational(44715, 1000000) * e ** 3))))
    return _engine_map(x, lambda sp, e: e / 2 * (1 + sp.erf(e / sp.sqrt(2))))


def _softplus(x, beta=1.0, threshold=20.0):
    import symgrad as sg

    return sg.where(x * beta > threshold, x, ((x * beta).exp() + 1).log() / beta)


def _amax(x, dim=None, keepdim=False, *, name="max"):
    if dim is None or dim == () or dim == []:
        return getattr(x, name)()
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    nd = x.dim()
    for d in sorted((d % nd for d in dims), reverse=True):
        x = getattr(x, name)(dim=d, keepdim=keepdim).values
    return x


_TORCH_EXTRA = {
    "erf": _erf,
    "gelu": _gelu,
    "softplus": _softplus,
    "silu": lambda x, inplace=False: x * x.sigmoid(),
    "leaky_relu": lambda x, negative_slope=0.01, inplace=False: __import__("symgrad").where(
        x > 0, x, x * negative_slope),
    "rsqrt": lambda x: x.sqrt().reciprocal(),
    "amax": _amax,
    "amin": lambda x, dim=None, keepdim=False: _amax(x, dim, keepdim, name="min"),
    "contiguous": lambda x, *a, **k: x,
    "expand_as": lambda x, other: x.expand(*other.shape),
    "type_as": lambda x, other: x.to(other.dtype),
    "view_as": lambda x, other: x.reshape(tuple(other.shape)),
    "reshape_as": lambda x, other: x.reshape(tuple(other.shape)),
}
def _sg():
    import symgrad

    return symgrad


def _normalize(x, p=2.0, dim=1, eps=1e-12, out=None):
    return x / x.norm(p=p, dim=dim, keepdim=True).clamp_min(eps)


def _glu(x, dim=-1):
    a, b = x.chunk(2, dim=dim)
    return a * b.sigmoid()


def _selu(x, inplace=False):
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return scale * _sg().where(x > 0, x, alpha * (x.exp() - 1))


def _shrink(x, lambd=0.5, soft=False):
    sg = _sg()
    if not soft:
        return sg.where(x.abs() > lambd, x, x * 0)
    return sg.where(x > lambd, x - lambd, sg.where(x < -lambd, x + lambd, x * 0))


def _by_index(name):
    """A value-dependent selection (cummax, median(dim), kthvalue, mode): its indices
    decided at the recorded values by torch, its values the elements they pick."""
    def f(x, *args, **kwargs):
        from .trace_values import torch_by_values

        r = torch_by_values(name, None, (_to_torch(x),) + tuple(_to_torch(a) for a in args),
                            {k: _to_torch(v) for k, v in kwargs.items()}, True,
                            _DECIDED[-1] if _DECIDED else None, structure_only=True,
                            host=_HOST)
        if not isinstance(r, tuple):  # median() of all elements: the lower middle one
            if name not in ("median", "nanmedian"):
                raise TypeError(f"torch {name!r} on symbols: only its form with dim is "
                                "traced")
            return _median_all(x)
        idx = r.indices._sgt
        dim = kwargs.get("dim", args[-1] if name in ("cummax", "cummin", "mode") and args
                         else (args[1] if len(args) > 1 else (args[0] if args else -1)))
        if name in ("median", "nanmedian", "mode"):
            dim = kwargs.get("dim", args[0] if args else -1)
        keep = kwargs.get("keepdim", False) or name in ("cummax", "cummin")
        i = idx if keep else idx.unsqueeze(dim)
        vals = x.take_along_dim(i, dim)
        return type(r)((vals if keep else vals.squeeze(dim), idx))

    return f


def _decided(name, x, *args, **kwargs):
    """torch's ``name`` of ``x`` at the recorded values: a constant (piecewise constant)."""
    from .trace_values import torch_by_values

    return _to_sg(torch_by_values(name, None, (_to_torch(x),) + args, kwargs, True,
                                  _DECIDED[-1] if _DECIDED else None, piecewise=True,
                               host=_HOST))


def _matrix_power(x, n):
    if n < 0:
        raise TypeError("matrix_power with a negative exponent (an inverse) has no SymPy "
                        "meaning here")
    out = _sg().eye(x.shape[-1], dtype=x.dtype).expand(*x.shape)
    for _ in range(n):
        out = out @ x
    return out


def _median_all(x, name="median"):
    flat = x.reshape(-1)
    return flat.sort().values[(flat.numel() - 1) // 2]


_TORCH_EXTRA.update({
    "frac": lambda x: x - _decided("trunc", x),
    "fmod": lambda x, y: x - _decided("trunc", x / y) * y,
    "remainder": lambda x, y: x - _decided("floor", x / y) * y,
    "copysign": lambda x, y: x.abs() * _sg().where(
        _decided("signbit", y if hasattr(y, "_data") else _sg().tensor(float(y))), -1.0, 1.0),
    "ldexp": lambda x, e: x * 2.0 ** e,
    "sinc": lambda x: _sg().where(x == 0, x * 0 + 1, (x * np.pi).sin() / (x * np.pi)),
    "logit": lambda x, eps=None: (lambda z: (z / (1 - z)).log())(
        x if eps is None else x.clamp(eps, 1 - eps)),
    "prelu": lambda x, w: _sg().where(x > 0, x, w * x),
    "dist": lambda x, y, p=2: (x - y).norm(p=p),
    "logcumsumexp": lambda x, dim: x.exp().cumsum(dim).log(),
    "nanmean": lambda x, dim=None, keepdim=False, **k: x.mean() if dim is None else
    x.mean(dim, keepdim=keepdim),
    "msort": lambda x: x.sort(dim=0).values,
    "aminmax": lambda x, *, dim=None, keepdim=False: __import__(
        "torch").return_types.aminmax((_amax(x, dim, keepdim, name="min"),
                                       _amax(x, dim, keepdim))),
    "requires_grad_": lambda x, requires_grad=True: x,  # no graph inside a traced forward
    "matrix_power": lambda x, n: _matrix_power(x, n),
    "cdist": lambda a, b, p=2.0, **k: (((a.unsqueeze(-2) - b.unsqueeze(-3)).abs() ** p).sum(
        -1)) ** (1.0 / p),
    "cpu": lambda x, *a, **k: x,
    "addcdiv": lambda x, t1, t2, *, value=1: x + value * t1 / t2,
    "logaddexp": lambda a, b: (a.exp() + b.exp()).log(),
    "logaddexp2": lambda a, b: (2 ** a + 2 ** b).log() / np.log(2.0),
    "float_power": lambda x, e: x.double() ** e,
    "xlogy": lambda x, y: _sg().where(x == 0, x * 0, x * y.log()),
    "hardshrink": lambda x, lambd=0.5: _shrink(x, lambd),
    "softshrink": lambda x, lambd=0.5: _shrink(x, lambd, soft=True),
    "tanhshrink": lambda x: x - x.tanh(),
    "mish": lambda x, inplace=False: x * _softplus(x).tanh(),
    "selu": _selu,
    "celu": lambda x, alpha=1.0, inplace=False: _sg().where(x > 0, x, alpha * (
        (x / alpha).exp() - 1)),
    "relu6": lambda x, inplace=False: x.clamp(0, 6),
    "hardswish": lambda x, inplace=False: x * (x + 3).clamp(0, 6) / 6,
    "hardsigmoid": lambda x, inplace=False: (x / 6 + 0.5).clamp(0, 1),
    "softsign": lambda x: x / (1 + x.abs()),
    "normalize": _normalize,
    "glu": _glu,
    "log_sigmoid": lambda x: _sg().nn.functional.logsigmoid(x),
    "_threshold": lambda x, threshold, value, inplace=False: _sg().where(
        x > threshold, x, x * 0 + value),
    "threshold": lambda x, threshold, value, inplace=False: _sg().where(
        x > threshold, x, x * 0 + value),
    **{n: _by_index(n) for n in ("cummax", "cummin", "median", "nanmedian", "kthvalue",
                                 "mode")},
})
for _n, _u in _TORCH_ELEMENTWISE.items():
    _TORCH_EXTRA.setdefault(_n, (lambda u: lambda x: _engine_map(
        x, lambda sp, e: _ELEMENTWISE[u](sp, e)))(_u))


def _to_sg(a):
    """torch-side values as symgrad-side ones (stand-ins unwrapped, tensors on the
    symbolic device, torch dtypes as symgrad's)."""
    import torch

    from ..tensor import Tensor

    if isinstance(a, TorchSym):
        return a._sgt
    if isinstance(a, torch.Tensor):
        return Tensor._wrap(_arg_array(a.detach().cpu().numpy()), _TORCH_DEV[-1])
    if isinstance(a, torch.dtype):
        from .. import dtypes

        n = str(a).rsplit(".", 1)[-1]
        return getattr(dtypes, n, None) or getattr(dtypes, n + "_")
    if isinstance(a, torch.Size):
        return tuple(int(s) for s in a)
    if isinstance(a, SymArray):
        return Tensor._wrap(_as_object(a), _TORCH_DEV[-1])
    if isinstance(a, (list, tuple)) and not hasattr(a, "_fields"):
        return type(a)(_to_sg(u) for u in a)
    return a


def _to_torch(r):
    from .. import dtypes
    from ..tensor import Tensor

    if isinstance(r, Tensor):
        return TorchSym(r)
    if isinstance(r, dtypes.dtype):  # x.dtype: torch's (torch.tensor(c, dtype=x.dtype))
        import torch

        return getattr(torch, str(r).rsplit(".", 1)[-1], r)
    if hasattr(r, "_fields"):
        return type(r)(*(_to_torch(u) for u in r))
    if type(r).__name__ == "Size" and type(r).__module__.startswith("symgrad"):
        import torch

        return torch.Size(r)  # x.new(x.shape): a shape, not data
    if isinstance(r, (list, tuple)):
        return type(r)(_to_torch(u) for u in r)
    return r


#: comparisons symgrad computes in NumPy on the data (not through a backend kernel): on
#: symbols they are decided at the recorded values by torch
_DECIDE = frozenset({"isclose", "allclose", "equal", "isnan", "isinf", "isfinite",
                     "isposinf", "isneginf", "isreal", "signbit"})


def _holds_symbols(t) -> bool:
    from .trace_fold import has_symbols

    return has_symbols(t._data)


def _torch_call(name, args, kwargs, method, func=None):
    """A torch function or method ``name`` on stand-ins, run as symgrad's; one symgrad
    lacks is run by torch at numbers where that has an exact meaning (trace_values.py)."""
    import symgrad as sg
    from symgrad.nn import functional as F

    from ..tensor import Tensor

    orig_name, orig_args, orig_kwargs = name, args, kwargs
    name = _TORCH_ALIAS.get(name, name)
    args = _to_sg(tuple(args))
    if kwargs.get("out") is not None:
        raise TypeError(f"torch {name}(..., out=) is not supported on symbolic values")
    kwargs = {k: _to_sg(v) for k, v in kwargs.items() if k not in ("device", "out")}
    if name in ("div", "divide", "true_divide") and kwargs.get("rounding_mode") is not None:
        from .trace_values import torch_by_values  # floor/trunc division: piecewise constant

        return torch_by_values(orig_name, func, orig_args, orig_kwargs, method,
                               _DECIDED[-1] if _DECIDED else None, piecewise=True,
                               host=_HOST)
    if name == "to":  # a device among to()'s arguments: the trace's device stays
        args = tuple(a for a in args if not isinstance(a, str) and
                     type(a).__name__ != "device")
    if name in _TORCH_EXTRA:
        return _to_torch(_TORCH_EXTRA[name](*args, **kwargs))
    first = args[0] if args else None
    if name in _DECIDE and any(isinstance(a, Tensor) and _holds_symbols(a) for a in args):
        from .trace_values import torch_by_values  # a comparison: decided at the values

        return torch_by_values(orig_name, func, orig_args, orig_kwargs, method,
                               _DECIDED[-1] if _DECIDED else None, piecewise=True,
                               host=_HOST)
    if method and (name.endswith("_") or name == "__setitem__") and orig_args and \
            not isinstance(orig_args[0], TorchSym):
        raise TypeError(f"torch {orig_name}: writes symbolic values into a torch tensor made "
                        "outside the traced forward (it cannot hold them)")
    if method and name.endswith("_") and not name.endswith("__") and \
            isinstance(first, Tensor) and not hasattr(Tensor, name) and (
            hasattr(Tensor, _TORCH_ALIAS.get(name[:-1], name[:-1]))
            or _TORCH_ALIAS.get(name[:-1], name[:-1]) in _TORCH_EXTRA):
        # an in-place method symgrad has only out of place: computed, written into self
        r = _to_sg(_torch_call(name[:-1], orig_args, orig_kwargs, True, None))
        if tuple(r.shape) != tuple(first.shape):  # unsqueeze_, t_ ...: self's new shape
            first._data = np.array(r._data, copy=True)
        else:
            first.copy_(r.to(first.dtype) if r.dtype != first.dtype else r)
        return orig_args[0]
    first = args[0] if args else None
    if method and isinstance(first, Tensor) and hasattr(Tensor, name):
        return _to_torch(getattr(first, name)(*args[1:], **kwargs))
    for ns in (sg, F):
        f = getattr(ns, name, None)
        if callable(f) and not isinstance(f, type):
            return _to_torch(f(*args, **kwargs))
    if isinstance(first, Tensor) and hasattr(Tensor, name):
        return _to_torch(getattr(first, name)(*args[1:], **kwargs))
    from .trace_values import torch_by_values

    return torch_by_values(orig_name, func, orig_args, orig_kwargs, method,
                           _DECIDED[-1] if _DECIDED else None, host=_HOST)


class TorchSym:
    """A torch-tensor stand-in over a symbolic symgrad tensor (a torch forward's argument
    while it is traced): torch functions and tensor methods on it run symgrad's ops of the
    same name on the SymPy backend."""

    __slots__ = ("_sgt",)

    def __init__(self, t) -> None:
        self._sgt = t

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        import torch

        name = getattr(func, "__name__", None) or str(func)
        method = getattr(torch.Tensor, name, None) is func or str(
            getattr(func, "__qualname__", "")).startswith(("TensorBase.", "Tensor."))
        if name == "__get__":  # a property read through torch (x.shape on a real tensor)
            raise TypeError(f"torch {func} has no SymPy meaning here (symbolic values)")
        return _torch_call(name, args, kwargs or {}, method, func)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        import torch

        from ..tensor import Tensor

        if name in _TORCH_EXTRA or name in _TORCH_ALIAS or callable(
                getattr(Tensor, name, None)) or (not hasattr(Tensor, name) and callable(
                getattr(torch.Tensor, name, None))):
            def method(*args, **kwargs):
                return _torch_call(name, (self,) + args, kwargs, True)

            method.__name__ = name
            return method
        if name == "device":
            return torch.device("cpu")
        if not hasattr(Tensor, name) and hasattr(torch.Tensor, name):  # x.H, x.mH ...
            return _torch_call(name, (self,), {}, True)
        return _to_torch(getattr(self._sgt, name))

    def __repr__(self) -> str:
        return f"TorchSym({np.asarray(_plain(self._sgt._data))!r})"

    def __bool__(self) -> bool:
        return bool(self._sgt)

    def __float__(self) -> float:
        return float(self._sgt)

    def __int__(self) -> int:
        return int(self._sgt)

    def __index__(self) -> int:
        return self._sgt.__index__()

    def __len__(self) -> int:
        return len(self._sgt)

    def __setitem__(self, index, value) -> None:
        self._sgt[_to_sg(index)] = _to_sg(value)

    def __iter__(self):
        return (_to_torch(u) for u in self._sgt)

    def __array__(self, dtype=None, copy=None):
        a = obj(np.asarray(_plain(self._sgt._data)))
        return a if dtype is None else a.astype(dtype)

    __hash__ = object.__hash__


#: what trace_values.py needs of the stand-ins (it does not import this module)
_HOST = types.SimpleNamespace(cls=TorchSym,
                              const=lambda t: _to_torch(_to_sg(t.detach())))


def _operator(name):
    def op(self, *args):
        return _torch_call(name, (self,) + args, {}, True)

    op.__name__ = name
    return op


for _n in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv",
           "pow", "rpow", "matmul", "rmatmul", "neg", "pos", "abs", "gt", "ge", "lt", "le",
           "eq", "ne", "getitem", "and", "or", "xor", "invert", "mod"):
    setattr(TorchSym, f"__{_n}__", _operator(f"__{_n}__"))


def is_torch_function(cls) -> bool:
    """Whether ``cls`` is a ``torch.autograd.Function`` subclass (torch already loaded)."""
    import sys

    torch = sys.modules.get("torch")
    fn = getattr(getattr(torch, "autograd", None), "Function", None)
    return isinstance(fn, type) and isinstance(cls, type) and issubclass(cls, fn)


@contextlib.contextmanager
def _torch_symbolic(dev, decided: list):
    """torch creation from symbolic data (``torch.from_numpy(np.exp(x.numpy()))``) gives a
    stand-in inside this block."""
    import torch

    from ..tensor import Tensor

    patched = []

    def make(orig):
        def create(data, *a, **k):
            if _REAL:
                return orig(data, *a, **k)
            if isinstance(data, TorchSym):
                return data
            if _is_symbolic_data(data):
                return TorchSym(Tensor._wrap(_as_object(data), dev))
            return _to_torch(_to_sg(orig(data, *a, **k)))

        create.__wrapped__ = orig
        return create

    def make_const(orig):
        def create(*a, **k):
            if _REAL or any(isinstance(u, TorchSym) for u in list(a) + list(k.values())):
                return orig(*a, **k)  # through __torch_function__
            return _to_torch(_to_sg(orig(*a, **k)))

        create.__wrapped__ = orig
        return create

    for name in ("tensor", "from_numpy", "as_tensor", "asarray"):
        if hasattr(torch, name):
            patched.append((name, getattr(torch, name)))
            setattr(torch, name, make(getattr(torch, name)))
    # every tensor made inside the forward is a stand-in: writing expressions into it works
    for name in ("zeros", "ones", "full", "empty", "eye", "arange", "linspace", "logspace",
                 "zeros_like", "ones_like", "full_like", "empty_like", "rand", "randn",
                 "randint", "rand_like", "randn_like", "tril_indices", "triu_indices"):
        if hasattr(torch, name):
            patched.append((name, getattr(torch, name)))
            setattr(torch, name, make_const(getattr(torch, name)))
    _TORCH_DEV.append(dev)
    _DECIDED.append(decided)
    try:
        yield
    finally:
        _DECIDED.pop()
        _TORCH_DEV.pop()
        for name, old in reversed(patched):
            setattr(torch, name, old)
