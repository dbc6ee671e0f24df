"""``apply``: run one registered op and, when grad mode needs it, record its node.

This is the hot path of every forward op, so it does only what is needed: promote
dtypes, call the backend kernel, wrap the output, and (only if an input requires grad
and grad mode is on) build the node, save the operands its formulas name, and keep
weak references to all inputs for the verifier.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import numpy as np

from .. import _tensor_layer as _tl
from .. import memory as _memory
from ..backends import _BACKENDS, _DEVICE_DEFAULT, backend_for, upcast_halves
from ..dtypes import HALF_NP, bool_, default_float, float64, int64, promote
from ..memory import Storage
from ..ops import spec as _spec_module
from ..ops.scalar import define
from . import fast_apply as _fast_apply
from . import node as _node_module
from .anomaly_mode import _anomaly
from .grad_mode import _state, no_grad
from .node import FREED_MESSAGE, Node, SavedTensor, _WrappedScalar, node_class_for
from .node import _accumulator_of as accumulator_of
from .record import _recording, before_write, keep

__all__ = ["apply", "edge_of", "Function", "FunctionCtx", "BackwardCFunction",
           "once_differentiable"]

_tensor_cls = None

#: ``note_view(view)``, provided by symgrad._inplace_views (which sits above autograd):
#: remembers a view of a graph tensor so that a later write into its base rebases it.
_note_view = None

#: The active ``profiler.profile`` or compile tracer (None when not set): each op's entry
#: tests it once.
_profiler = None


def _T():
    global _tensor_cls, _DT_OF
    if _tensor_cls is None:  # tensor.py plugs the class in (autograd never imports it)
        _tensor_cls, _DT_OF = _tl.Tensor, _tl.DT_OF
    return _tensor_cls


#: NumPy dtype -> symgrad dtype (tensor.py's table, bound with the Tensor class)
_DT_OF: dict = {}


def edge_of(t) -> tuple:
    """The (node, output_nr) edge through which gradient flows into ``t``."""
    if t._grad_fn is not None:
        return (t._grad_fn, t._output_nr)
    if t._requires_grad:
        return (accumulator_of(t), 0)
    return (None, 0)


def _result_dtype(rule, tensors, scalars, params):
    if rule == "same":
        return tensors[0].dtype
    if rule == "float":
        d = tensors[0].dtype
        return d if d.is_floating_point else default_float()
    pairs = [(t.dtype, t._data.ndim == 0) for t in tensors]
    if rule in ("promote", "promote_float", "bool_compare", "where"):
        if rule == "where":
            pairs = pairs[1:]
        d = promote(pairs, scalars)
        if rule == "promote_float" and not d.is_floating_point:
            return default_float()
        return d
    if rule == "bool":
        return bool_
    if rule == "sum":
        d = params.get("dtype") or tensors[0].dtype
        return d if d.is_floating_point else int64
    if rule == "float_only":
        d = tensors[0].dtype
        if not d.is_floating_point:
            raise RuntimeError(
                "mean(): could not infer output dtype. Input dtype must be either a floating "
                f"point or complex dtype. Got: {_tl.TORCH_NAMES[d.name]}")
        return d
    if rule == "same_required":
        d0 = tensors[0].dtype
        for t in tensors[1:]:
            if t.dtype is not d0:
                raise RuntimeError("expected m1 and m2 to have the same dtype, but got: "
                                   f"{_tl.CPP_NAMES[d0.name]} != {_tl.CPP_NAMES[t.dtype.name]}")
        return d0
    if rule == "param":
        return params["dtype"]
    raise ValueError(f"unknown dtype rule {rule!r}")


_NP_SCALARS = frozenset((np.float32, np.float64, np.int64, np.bool_))

#: dtype rules whose result is the inputs' common dtype when they all share it (no casts)
_SAME_DTYPE_RULES = {"promote": True, "same": True, "bool_compare": True,
                     "promote_float": False, "float": False, "same_required": True}


def apply(spec, inputs, params=None):
    """Run ``spec`` on ``inputs`` (tensors or Python scalars, in ``spec.inputs`` order)."""
    return spec._run(inputs, params)


def _entry_namespace(spec) -> dict:
    """What the generated straight lines (fast_apply.py) read."""
    _T()
    return {
        "Tensor": _tensor_cls, "DT_OF": _DT_OF, "BACKENDS": _BACKENDS,
        "DEVICE_DEFAULT": _DEVICE_DEFAULT, "ndarray": np.ndarray, "as_array": as_array,
        "shape_error": _shape_error, "new": object.__new__, "Storage": Storage,
        "live": _memory._live, "peak": _memory._peak,
        "state": _state, "fn_module": sys.modules[__name__],
        "anomaly": _anomaly, "record": _record, "recording": _recording, "keep": keep,
        "node_cls": spec.__dict__.get("_node_cls") or _node_cls(spec)
        if spec.grad_fn is not None else None,
        "accumulator_of": accumulator_of, "NO_EDGE": _NO_EDGE, "wref": weakref.ref,
        "next_sequence": _node_module._sequence.__next__,
        "module_calls": _node_module._module_calls,
        "make_saver": _saver, "saved_display": _saved_display, **_saver_namespace(spec),
        "general": _apply_general}


def _build_entry(spec):
    """The op's entry (``OpSpec._run``): its straight-line apply (fast_apply.py) or the
    general one; either hands the call to the profiler or tracer when one is set."""
    if _view_eligible(spec):
        return _view_entry(spec)
    fast = _fast_apply.build(spec, _entry_namespace(spec))
    if fast is not None:
        return fast

    def run(inputs, params=None):
        if _profiler is not None:
            return _profiler._record_op(spec, inputs, params)
        return _apply_general(spec, inputs, params)

    return run


def binary_method(spec, params: str, fallback):
    """``Tensor.__add__`` and the like: ``spec``'s straight line called as ``a + b`` with
    its parameters at their defaults (``params``, a dict display); any other call goes to
    ``fallback(a, b)``, the functional form (tensor.py installs these)."""
    return _fast_apply.build_method(spec, _entry_namespace(spec), params, fallback)


_spec_module.entry_builder = _build_entry


def _view_eligible(spec) -> bool:
    return (spec.view and len(spec.inputs) == 1 and len(spec.outputs) == 1
            and not spec.variadic_outputs and spec.dtype_rule == "same")


def _view_entry(spec):
    """The entry of a one-input view op (view, t, transpose, expand, unsqueeze ...): the
    common call (a NumPy-backed tensor, an array result of the same dtype) as one straight
    line, the node built inline as ``_record`` builds it; anything else goes to
    ``_apply_general``. A training step makes a hundred or more of these (attention's
    head split, Linear's weight transpose, their backwards), so the generic loops showed.
    tests/test_eager_fast_path.py compares both paths."""
    Tensor = _T()
    node_cls = spec.__dict__.get("_node_cls") or _node_cls(spec) \
        if spec.grad_fn is not None else None
    new, ndarray, wref = object.__new__, np.ndarray, weakref.ref
    backends, device_default, dt_of = _BACKENDS, _DEVICE_DEFAULT, _DT_OF
    new_storage = _memory.new_storage
    next_sequence, module_calls = _node_module._sequence.__next__, _node_module._module_calls
    savers = spec.__dict__.setdefault("_savers", {})
    state, anomaly = _state, _anomaly

    def run(inputs, params=None):
        if _profiler is not None:
            return _profiler._record_op(spec, inputs, params)
        try:
            x, = inputs
        except ValueError:
            return _apply_general(spec, inputs, params)
        if type(x) is not Tensor and not isinstance(x, Tensor):
            return _apply_general(spec, inputs, params)
        a = x._data
        dev = x._device
        if type(a) is not ndarray:
            return _apply_general(spec, inputs, params)
        try:
            be = backends[device_default[dev.type]]
        except KeyError:
            return _apply_general(spec, inputs, params)
        if params is None:
            params = {}
        try:
            out = spec.forward(be, a, **params)  # read at call time: tests replace it
        except ValueError as exc:
            raise _shape_error(spec, inputs, exc) from None
        if type(out) is not ndarray or out.dtype is not a.dtype:
            return _apply_general(spec, inputs, params)  # views are pure: run it again
        base = out.base
        shares = base is not None and (base is a or base is a.base)
        result = new(Tensor)  # Tensor._wrap written out (the view's storage is the input's)
        result._data = out
        result._storage = x._storage if shares else new_storage(out.nbytes, dev.type)
        result._device = dev
        result._requires_grad = result._retains_grad = False
        result._grad = result._grad_fn = result._accumulator = result._backward_hooks = \
            result.name = result._weak = None
        result._output_nr = 0
        if not x._requires_grad or not state.enabled or node_cls is None:
            return result
        if anomaly.enabled:
            _record(spec, inputs, params, (result,))
        else:
            node = new(node_cls)  # Node.__init__ and _record written out for one input
            node._sequence_nr = next_sequence()
            node._module_call = module_calls.top
            node._metadata = node._pre_hooks = node._hooks = node._tensor_hooks = \
                node._retained = None
            fn = x._grad_fn
            if fn is not None:
                node.next_functions = ((fn, x._output_nr),)
            else:
                ref = x._accumulator
                acc = ref() if ref is not None else None
                node.next_functions = ((acc if acc is not None else accumulator_of(x), 0),)
            if _recording:
                node._input_refs = (x,)
                keep(node, inputs)
            else:
                w = x._weak
                if w is None:
                    w = x._weak = wref(x)
                node._input_refs = (w,)
            shape = out.shape
            dt = dt_of[a.dtype]
            node._input_meta = ((a.shape, dt),) if a.shape != shape else None
            node._out_meta = ((shape, dt),)
            node._freed = False
            node._params = params
            saver = savers.get(1)
            node._saved = (saver or _saver(spec, 1))(inputs, params, (result,))
            result._grad_fn = node
            result._requires_grad = True
        if shares and _note_view is not None:  # a later write into its base rebases it
            _note_view(result)
        return result

    return run


def _apply_general(spec, inputs, params):
    """``apply`` for every call: promotion and casts, several outputs, views."""
    Tensor = _tensor_cls or _T()
    if params is None:
        params = {}
    # one pass over the inputs: arrays, requires_grad, and whether all share one dtype
    first = None
    requires_grad = has_scalar = mixed = False
    arrays = []
    for x in inputs:
        if isinstance(x, Tensor):
            a = x._data
            if first is None:
                first, np_dtype = x, a.dtype
            else:
                if x._device is not first._device and x._device != first._device:
                    raise RuntimeError(
                        "Expected all tensors to be on the same device, but found at least "
                        f"two devices, {x._device} and {first._device}!")
                if a.dtype is not np_dtype and a.dtype != np_dtype:
                    mixed = True
            if x._requires_grad:
                requires_grad = True
            arrays.append(a)
        else:
            has_scalar = True
            arrays.append(x)
    device = first._device
    rule = spec.dtype_rule
    try:  # backend_for, inlined
        be = _BACKENDS[_DEVICE_DEFAULT[device.type]]
    except KeyError:
        be = backend_for(device.type)
    dtype = None
    int_ok = _SAME_DTYPE_RULES.get(rule)
    if int_ok is not None and not mixed:
        # fast path: every tensor has one dtype d, so promotion gives d and nothing is cast
        d = _DT_OF[np_dtype]
        if d.is_floating_point or (int_ok and (not has_scalar or rule == "same")):
            dtype = bool_ if rule == "bool_compare" else d
    elif rule == "sum" and not params.get("dtype"):
        d = _DT_OF[np_dtype]  # _result_dtype's "sum" rule without a dtype argument; no casts
        dtype = d if d.is_floating_point else None
    if dtype is None:
        dtype, arrays = _promote_and_cast(spec, inputs, params, be, Tensor)
    half = None
    if not spec.view and (mixed or np_dtype.itemsize == 2 and np_dtype in HALF_NP):
        for a in arrays:
            if type(a) is np.ndarray and a.dtype in HALF_NP:
                half = a.dtype
                arrays = upcast_halves(arrays, be)
                if spec.name in _HALF_SCALAR_OPS:
                    arrays, params = _half_scalars(arrays, params, half)
                break
    try:
        out = spec.forward(be, *arrays, **params)
    except ValueError as exc:
        raise _shape_error(spec, inputs, exc) from None
    if len(spec.outputs) == 1:  # the common case, without the loop below
        if type(out) is not np.ndarray:
            out = as_array(out)
        np_out = dtype.np
        if out.dtype is not np_out and out.dtype != np_out and rule != "bool_compare":
            out = be.cast(out, np_out)
        shares = spec.view and _is_view_of(out, first._data, be)
        result = Tensor._wrap(out, device, first._storage if shares else None)
        if requires_grad and _state.enabled and spec.grad_fn is not None:
            _record(spec, inputs, params, (result,))
            if shares and _note_view is not None:  # a later write into its base rebases it
                _note_view(result)
        return result
    wrapped = []
    for k, o in enumerate(out):
        o = as_array(o)
        if k == 0 and o.dtype != dtype.np and rule != "bool_compare":
            o = be.cast(o, dtype.np)
        elif k and half is not None and o.dtype == np.float32:
            o = be.cast(o, half)  # a second float output (var_mean's mean) of half inputs
        storage = first._storage if (spec.view and _is_view_of(o, first._data, be)) else None
        wrapped.append(Tensor._wrap(o, device, storage))
    if requires_grad and _state.enabled and spec.grad_fn is not None and wrapped:
        _record(spec, inputs, params, wrapped)  # (unbind of an empty dim has no outputs)
    return tuple(wrapped)


#: ops whose Python-number operands (and ``alpha``) torch rounds to a half tensor's dtype
#: before computing in float32 (mul/div and the rest read them as float32)
_HALF_SCALAR_OPS = frozenset(("add", "sub", "rsub", "pow", "pow_scalar_base", "gt", "lt",
                              "ge", "le", "eq", "ne"))


def _half_scalars(arrays: list, params: dict, half) -> tuple[list, dict]:
    """torch's add/sub/pow/comparisons on float16/bfloat16: ``x + 0.3`` adds half(0.3) (the
    wrapped scalar takes the tensor's dtype), ``x ** 1.3`` raises to half(1.3), ``x > 0.3``
    compares with half(0.3), and ``alpha`` is a half number too."""
    def rounded(v):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(np.asarray(v, dtype=np.float64).astype(half))
        return v
    arrays = [rounded(a) for a in arrays]
    params = {k: rounded(v) if k in ("alpha", "other", "exponent", "self") else v
              for k, v in params.items()}
    return arrays, params


def as_array(out):
    """A backend result as an array: a NumPy ufunc on 0-d arrays returns a scalar, and a
    CUDA array is kept as it is."""
    if type(out) is not np.ndarray and (type(out) in _NP_SCALARS or not hasattr(
            out, "__cuda_array_interface__")):
        return np.asarray(out)
    return out


def _is_view_of(out, data, be) -> bool:
    """Does a view op's result use ``data``'s memory? For NumPy arrays ``base`` says so at
    once (NumPy points every view at the array that owns the memory)."""
    if type(out) is np.ndarray and type(data) is np.ndarray:
        base = out.base
        return base is not None and (base is data or base is data.base)
    return be.shares_memory(out, data)


def _promote_and_cast(spec, inputs, params, be, Tensor):
    """The general dtype path: promotion over tensors and scalars, then casts."""
    tensors = [x for x in inputs if isinstance(x, Tensor)]
    scalars = [x for x in inputs if not isinstance(x, Tensor)]
    dtype = _result_dtype(spec.dtype_rule, tensors, scalars, params)
    compute = dtype
    if spec.dtype_rule == "bool_compare":
        compute = promote([(t.dtype, t._data.ndim == 0) for t in tensors], scalars)
    elif spec.dtype_rule in ("bool", "same", "param", "same_required", "float_only", "sum"):
        compute = None
    arrays = []
    for x in inputs:
        if isinstance(x, Tensor):
            a = x._data
            if compute is not None and a.dtype != compute.np and \
                    not (spec.dtype_rule == "where" and x is inputs[0]):
                a = be.cast(a, compute.np)
            arrays.append(a)
        else:
            arrays.append(x)
    return dtype, arrays


_NO_EDGE = (None, 0)


def _record(spec, inputs, params, outputs) -> None:
    Tensor = _tensor_cls or _T()
    node = (spec.__dict__.get("_node_cls") or _node_cls(spec))()
    next_functions = []
    refs = []
    strong = bool(_recording)
    wref = weakref.ref
    out0 = outputs[0]._data
    out_shape, out_dtype = out0.shape, out0.dtype
    reshaped = False  # does some tensor input differ from output 0 in shape or dtype?
    needs = 0  # bit i: input i gets a gradient
    bit = 1
    for x in inputs:
        if isinstance(x, Tensor):
            if x._requires_grad:
                fn = x._grad_fn
                if fn is not None:
                    next_functions.append((fn, x._output_nr))
                else:
                    ref = x._accumulator  # accumulator_of, inlined for a live one
                    acc = ref() if ref is not None else None
                    next_functions.append((acc if acc is not None else accumulator_of(x), 0))
                needs |= bit
            else:
                next_functions.append(_NO_EDGE)
            refs.append(x if strong else wref(x))  # strong under record()
            a = x._data
            if not reshaped and (a.shape != out_shape or a.dtype is not out_dtype):
                reshaped = True
        else:
            next_functions.append(_NO_EDGE)
            refs.append(x)
        bit <<= 1
    node.next_functions = tuple(next_functions)
    node._input_refs = tuple(refs)
    if strong:  # the arrays of its leaves, copied if later written in place
        keep(node, inputs)
    # Input (shape, dtype)s, by which the engine sums broadcast gradients back and casts
    # them; None when every tensor input is shaped like output 0 (nothing to undo).
    node._input_meta = tuple([(x._data.shape, _DT_OF[x._data.dtype])
                              if isinstance(x, Tensor) else None for x in inputs]) \
        if reshaped else None
    n_diff = len(outputs) if spec.variadic_outputs else spec.differentiable_outputs
    if n_diff == 1:
        node._out_meta = ((out_shape, _DT_OF[out_dtype]),)
    else:
        node._out_meta = tuple([(o._data.shape, o.dtype) for o in outputs[:n_diff]])
    node._freed = False
    node._params = params  # the verifier replays the forward from these
    if _anomaly.enabled:
        from .anomaly_mode import forward_stack

        node.metadata["traceback_"] = forward_stack()
    savers = spec.__dict__.get("_savers")
    saver = savers.get(needs) if savers is not None else None
    node._saved = (saver or _saver(spec, needs))(inputs, params, outputs)
    for k in range(n_diff):
        o = outputs[k]
        o._grad_fn = node
        o._output_nr = k
        o._requires_grad = True


def _saved_display(spec, needs: int) -> str:
    """The save plan of ``spec`` when the inputs in ``needs`` get a gradient, as one dict
    display over ``inputs``, ``params`` and ``outputs`` (the saver's body; fast_apply.py
    writes it inline for the commonest calls)."""
    items = []
    for name, how, j in _save_plan(spec, needs):
        if how is _PARAM:
            value = f"params.get({name!r})"
        elif how is _INPUT:
            value = (f"SavedTensor(inputs[{j}], False) if isinstance(inputs[{j}], Tensor) "
                     f"else save_number(inputs[{j}])")
        elif how is _OUTPUT:
            value = f"SavedTensor(outputs[{j}], True, {j})"
        elif how is _UNUSED:
            value = "None"  # no needed formula uses it: reads back as None, as in torch
        elif how is _SIZES:
            value = f"inputs[{j}]._data.shape"
        elif how is _STRIDES:
            value = f"strides_of(inputs[{j}]._data)"
        else:
            value = f"save(spec, {name!r}, inputs, params, outputs)"
        items.append(f"{name!r}: {value}")
    return "{" + ", ".join(items) + "}"


def _saver_namespace(spec) -> dict:
    return {"spec": spec, "SavedTensor": SavedTensor, "Tensor": _T(), "save": _save,
            "save_number": _save_number, "strides_of": _strides_of}


def _saver(spec, needs: int):
    """``saver(inputs, params, outputs) -> dict`` of the op's saved operands when the
    inputs in ``needs`` get a gradient: the save plan written out as one dict display."""
    src = f"def saver(inputs, params, outputs):\n    return {_saved_display(spec, needs)}\n"
    saver = define(src, f"<symgrad saver {spec.name} {needs}>", _saver_namespace(spec))["saver"]
    spec.__dict__.setdefault("_savers", {})[needs] = saver
    return saver


def _save_number(x):
    """An optional tensor input left out (layer_norm's weight=None) reads back None."""
    return None if x is None else _WrappedScalar(x, _scalar_dtype(x))


def _strides_of(a) -> tuple:
    return tuple([s // a.itemsize for s in a.strides])


def _node_cls(spec):
    cls = spec.__dict__["_node_cls"] = node_class_for(spec)
    return cls


# how _record saves a name (see _save_plan)
_PARAM, _INPUT, _OUTPUT, _UNUSED, _SIZES, _STRIDES, _OTHER = (
    "param", "input", "output", "unused", "sizes", "strides", "other")


def _save_plan(spec, needs: int) -> tuple:
    """Per op and per set of inputs that get a gradient (bit i: input i), once: each
    name to save, how, and its input or output index. The formulas of the inputs that
    get a gradient name what is saved (as derivatives.yaml does); the op's other saved
    tensors read back as None, its other numbers and sizes are kept."""
    used: list[str] = []
    for i, input_name in enumerate(spec.inputs):
        if needs >> i & 1:
            used += [p for p in spec.formula_params.get(input_name, ()) if p not in used]
    steps = []
    for name in used + [p for p in spec.saved if p not in used]:
        kind, detail = spec.saved_kind(name)
        if kind == "meta" and detail in ("_sym_sizes", "_sym_strides"):
            steps.append((name, _SIZES if detail == "_sym_sizes" else _STRIDES,
                           spec.inputs.index(name[: -len(detail)])))
        elif kind == "param":
            steps.append((name, _PARAM, -1))
        elif kind in ("input", "output") and name not in used:
            steps.append((name, _UNUSED, -1))
        elif kind == "input":
            steps.append((name, _INPUT, spec.inputs.index(name)))
        elif kind == "output" and spec.outputs.index(name) < spec.differentiable_outputs:
            steps.append((name, _OUTPUT, spec.outputs.index(name)))
        else:  # numel, outputs without gradient
            steps.append((name, _OTHER, -1))
    return tuple(steps)


def _save(spec, name, inputs, params, outputs):
    kind, detail = spec.saved_kind(name)
    if kind == "input":
        x = inputs[spec.inputs.index(name)]
        if isinstance(x, _T()):
            return SavedTensor(x, is_output=False)
        return _WrappedScalar(x, _scalar_dtype(x))
    if kind == "output":
        k = spec.outputs.index(name)
        if k < spec.differentiable_outputs:
            return SavedTensor(outputs[k], is_output=True, output_nr=k)
        return SavedTensor(outputs[k], is_output=False)
    if kind == "meta":
        x = inputs[spec.inputs.index(name[: -len(detail)])]
        data = x._data
        if detail == "_sym_sizes":
            return tuple(data.shape)
        if detail == "_sym_numel":
            return int(data.size)
        return tuple(s // data.itemsize for s in data.strides)
    return params.get(name)


def _scalar_dtype(x):
    if isinstance(x, bool):
        return bool_
    if isinstance(x, int):
        return int64
    return float64


def _shape_error(spec, inputs, exc: ValueError) -> Exception:
    shapes = [tuple(x.shape) for x in inputs if isinstance(x, _T())]
    if len(shapes) == 2 and "broadcast" in str(exc):
        a, b = shapes
        for i in range(1, max(len(a), len(b)) + 1):
            da = a[-i] if i <= len(a) else 1
            db = b[-i] if i <= len(b) else 1
            if da != db and da != 1 and db != 1:
                return RuntimeError(
                    f"The size of tensor a ({da}) must match the size of tensor b ({db}) "
                    f"at non-singleton dimension {max(len(a), len(b)) - i}")
    return RuntimeError(f"{spec.name}: {exc} (input shapes {shapes})")


# -- custom Functions ------------------------------------------------------------------------
# ``symgrad.autograd.Function``, here where PyTorch users look for it (torch.autograd.function)
# and where the repr of a custom node says its class lives.
# ``symgrad.autograd.Function``: user-defined ops with their own backward (PyTorch's API).
#
# A subclass writes ``forward(ctx, *args)`` and ``backward(ctx, *grad_outputs)`` as
# staticmethods and is called through ``Cls.apply(*args)``. As in PyTorch the ctx *is*
# the grad_fn: a node of the class ``<Cls>Backward`` made once per Function subclass, so
# ``y.grad_fn`` prints ``<symgrad.autograd.function.ExpBackward object at 0x...>``, and the
# tensor shows ``grad_fn=<ExpBackward>``.
#
# An optional ``sympy`` staticmethod gives the forward's exact meaning for the verifier:
# it is called with one SymPy expression per tensor argument (an element of it) and the
# non-tensor arguments unchanged, and returns the output's expression for that element
# (a tuple of them when forward returns several tensors). Example::
#
#     class Exp(Function):
#         @staticmethod
#         def forward(ctx, x):
#             y = x.exp()
#             ctx.save_for_backward(y)
#             return y
#
#         @staticmethod
#         def backward(ctx, grad):
#             (y,) = ctx.saved_tensors
#             return grad * y
#
#         @staticmethod
#         def sympy(x):
#             import sympy
#             return sympy.exp(x)

_MODULE = "symgrad.autograd.function"


class FunctionCtx:
    """What ``forward`` and ``backward`` receive as ``ctx`` (the node itself, as in PyTorch).

    Non-tensor state can be stored as attributes (``ctx.k = 3``). Store tensors with
    ``save_for_backward`` instead: they are version checked and freed with the graph,
    and a saved output does not form a reference cycle.
    """

    def save_for_backward(self, *tensors) -> None:
        """Keep ``tensors`` (or None) for ``backward``; read them back as ``saved_tensors``."""
        Tensor = _tl.Tensor
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError("save_for_backward can only save variables, but argument "
                                f"{tensors.index(t)} is of type {type(t).__name__}")
        self.to_save = tensors

    def save_for_forward(self, *tensors) -> None:
        self.saved_for_forward = tensors

    def mark_dirty(self, *tensors) -> None:
        """Declare inputs that ``forward`` modified in place (they are returned as outputs)."""
        self.dirty_tensors = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        """Declare outputs that get no gradient (indices, masks); they do not require grad."""
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        """With False, ``backward`` sees None (not zeros) for outputs that got no gradient."""
        self.materialize_grads = bool(value)


class BackwardCFunction(Node, FunctionCtx):
    """The grad_fn (and ctx) of one ``Function.apply`` call."""

    _forward_cls: Any = None

    def __init__(self) -> None:
        Node.__init__(self)
        self.to_save = ()
        self.dirty_tensors = ()
        self.non_differentiable = ()
        self.materialize_grads = True
        self.needs_input_grad: tuple[bool, ...] = ()
        self._saved = None  # SavedTensor per ctx.save_for_backward entry, after forward
        # per saved entry: the forward argument index it is (or None), so that a viewer
        # can still show a freed saved input from the recorded inputs
        self._saved_args: tuple = ()
        self._freed = False
        self._tensor_positions: tuple[int, ...] = ()  # edge i <- forward argument j
        # per forward argument: a weakref to a tensor (the tensor itself under
        # symgrad.record()), or the non-tensor value; the verifier reads these
        self._input_refs: tuple = ()
        self._input_meta: tuple = ()  # per edge: (shape, dtype), used to check gradients
        # per forward output: (shape, dtype) as OpNode has it, or None for a non-tensor
        self._out_meta: tuple = ()
        self._out_device = None

    def __repr__(self) -> str:
        return f"<{_MODULE}.{type(self).__name__} object at {hex(id(self))}>"

    def _num_outputs(self) -> int:
        return len(self._out_meta)

    @property
    def saved_tensors(self) -> tuple:
        """The tensors given to ``save_for_backward``, version checked."""
        if self._freed:
            raise RuntimeError(FREED_MESSAGE)
        if self._saved is None:  # still inside forward
            return tuple(self.to_save)
        return tuple(None if s is None else s.unpack(self) for s in self._saved)

    saved_variables = saved_tensors

    def _release(self) -> None:
        if not self._freed:
            if self._saved is not None:  # one marker per entry: viewers still list them
                self._saved = tuple(None if s is None else _node_module._FREED
                                    for s in self._saved)
            self.to_save = ()
            self._freed = True

    def apply(self, grad_outputs: list, needed: tuple[bool, ...]) -> list:
        cls = self._forward_cls
        grads = list(grad_outputs)
        if self.materialize_grads:
            for i, g in enumerate(grads):
                if g is None and self._out_meta[i] is not None:
                    shape, dtype = self._out_meta[i]
                    grads[i] = _tl.zeros(shape, dtype=dtype, device=self._out_device)
        mode = _state.enabled
        try:
            result = cls.backward(self, *grads)
        finally:
            _state.enabled = mode  # a backward may not leave the engine's grad mode changed
        return self._check_grads(result)

    def _check_grads(self, result) -> list:
        Tensor = _tl.Tensor
        name = type(self).__name__
        if not isinstance(result, tuple):
            result = (result,)
        n_args = len(self._input_refs)
        if len(result) > n_args and all(r is None for r in result[n_args:]):
            result = result[:n_args]
        if len(result) != n_args:
            raise RuntimeError(f"function {name} returned an incorrect number of gradients "
                               f"(expected {n_args}, got {len(result)})")
        positions = set(self._tensor_positions)
        for j, g in enumerate(result):
            if g is not None and j not in positions:
                raise RuntimeError(f"function {name} returned a gradient different than None at "
                                   f"position {j + 1}, but the corresponding forward input was "
                                   "not a Variable")
        outs = []
        for i, j in enumerate(self._tensor_positions):
            g = result[j]
            if g is not None:
                if not isinstance(g, Tensor):
                    raise TypeError(f"function {name} returned a gradient of type "
                                    f"{type(g).__name__} at position {j + 1}; expected a Tensor "
                                    "or None")
                shape = self._input_meta[i][0]
                if tuple(g.shape) != tuple(shape) and not _expandable(shape, g.shape):
                    raise RuntimeError(f"Function {name} returned an invalid gradient at index "
                                       f"{i} - got {list(g.shape)} but expected shape "
                                       f"compatible with {list(shape)}")
            outs.append(g)
        return outs


def _expandable(shape, grad_shape) -> bool:
    """True if ``shape`` broadcasts to ``grad_shape`` (the engine then sums the gradient)."""
    if len(shape) > len(grad_shape):
        return False
    for s, g in zip(reversed(shape), reversed(grad_shape)):
        if s != g and s != 1:
            return False
    return True


class FunctionMeta(type):
    """Makes ``<Name>Backward``, the node class of each Function subclass."""

    def __init__(cls, name, bases, attrs) -> None:
        backward_cls = type(f"{name}Backward", (BackwardCFunction,),
                            {"_forward_cls": cls, "__module__": _MODULE})
        cls._backward_cls = backward_cls
        super().__init__(name, bases, attrs)


class Function(metaclass=FunctionMeta):
    """Base class of user-defined differentiable ops; call them as ``Cls.apply(*args)``.

    ``forward(ctx, *args)`` runs with grad mode off; ``backward(ctx, *grads)`` returns one
    gradient (or None) per forward argument. ``setup_context(ctx, inputs, output)`` may be
    used instead of a ``ctx`` argument to forward, as in PyTorch 2.
    """

    def __init__(self, *args, **kwargs) -> None:
        import warnings

        warnings.warn(f"{type(self)} should not be instantiated. Methods on autograd functions "
                      "are all static, so you should invoke them on the class itself. "
                      "Instantiating an autograd function will raise an error in a future "
                      "version.", DeprecationWarning, stacklevel=2)

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom "
                                  "autograd.Function.")

    @staticmethod
    def setup_context(ctx, inputs, output):
        raise NotImplementedError("setup_context is not implemented.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement either the backward or vjp method for "
                                  "your custom autograd.Function to use it with backward mode "
                                  "AD.")

    vjp = backward

    #: Optional: the forward's SymPy meaning, elementwise (see the module docstring).
    sympy = None

    @classmethod
    def apply(cls, *args, **kwargs):
        if _profiler is not None:
            return _profiler._record_call(cls.__name__, "function", args, _apply,
                                              cls, args, kwargs)
        return _apply(cls, args, kwargs)


def _apply(cls, args, kwargs):
    Tensor = _tl.Tensor
    grad_on = _state.enabled
    positions = tuple(j for j, a in enumerate(args) if isinstance(a, Tensor))
    needs = tuple(isinstance(a, Tensor) and a._requires_grad and grad_on for a in args)
    ctx = cls._backward_cls()
    ctx.needs_input_grad = needs
    custom_setup = cls.setup_context is not Function.setup_context
    with no_grad():
        if custom_setup:
            output = cls.forward(*args, **kwargs)
            cls.setup_context(ctx, args, output)
        else:
            output = cls.forward(ctx, *args, **kwargs)
    is_tuple = isinstance(output, tuple)
    outputs = output if is_tuple else (output,)
    if not any(needs):
        return output  # nothing to record; dirty inputs were still changed in place
    ctx.next_functions = tuple(edge_of(args[j]) if args[j]._requires_grad else (None, 0)
                               for j in positions)
    ctx._tensor_positions = positions
    strong = bool(_recording)  # symgrad.record(): keep the inputs for the verifier
    ctx._input_refs = tuple((a if strong else weakref.ref(a)) if isinstance(a, Tensor) else a
                            for a in args)
    if strong:
        keep(ctx, args)
    ctx._input_meta = tuple((args[j]._data.shape, args[j].dtype) for j in positions)
    if _anomaly.enabled:
        from .anomaly_mode import forward_stack

        ctx.metadata["traceback_"] = forward_stack()
    dirty = {id(t) for t in ctx.dirty_tensors}
    non_diff = {id(t) for t in ctx.non_differentiable}
    input_ids = {id(args[j]) for j in positions}
    wrapped = []
    out_meta = []
    for k, o in enumerate(outputs):
        if not isinstance(o, Tensor):
            wrapped.append(o)
            out_meta.append(None)
            continue
        if id(o) in dirty:
            if o._requires_grad and o._grad_fn is None:
                raise RuntimeError("a leaf Variable that requires grad has been used in an "
                                   "in-place operation.")
            before_write(o, lost=True)  # forward wrote it already: no copy to keep
            o._bump()
        elif id(o) in input_ids:  # an input returned unchanged: a new tensor object, as torch
            o = Tensor._alias(o)
        out_meta.append((o._data.shape, o.dtype))
        ctx._out_device = o._device
        if id(outputs[k]) not in non_diff and o.dtype.is_floating_point:
            o._grad_fn = ctx
            o._output_nr = k
            o._requires_grad = True
        wrapped.append(o)
    ctx._out_meta = tuple(out_meta)
    saved = []
    out_index = {id(o): k for k, o in enumerate(outputs) if isinstance(o, Tensor)}
    for t in ctx.to_save:
        if t is None:
            saved.append(None)
        elif id(t) in out_index and wrapped[out_index[id(t)]]._grad_fn is ctx:
            saved.append(SavedTensor(wrapped[out_index[id(t)]], is_output=True,
                                     output_nr=out_index[id(t)]))
        else:
            saved.append(SavedTensor(t, is_output=False))
    ctx._saved = tuple(saved)
    arg_index = {id(args[j]): j for j in positions}
    ctx._saved_args = tuple(None if t is None else arg_index.get(id(t)) for t in ctx.to_save)
    ctx.to_save = ()
    return tuple(wrapped) if is_tuple else wrapped[0]


def once_differentiable(fn):
    """Decorator for ``backward``: run it without recording a graph (no double backward)."""
    import functools

    @functools.wraps(fn)
    def wrapper(ctx, *args):
        with no_grad():
            return fn(ctx, *args)

    return wrapper


_node_module._fn_module = sys.modules[__name__]  # node.py reads _profiler through it
_tl.provide(apply=apply)  # ops' backward formulas build index ops through it
