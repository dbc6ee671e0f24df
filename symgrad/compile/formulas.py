"""The engine's backward of one traced op, on arrays: the generic compile rule.

``op_backward(call, be, dev)`` gives ``run(env, grads)``: what the eager node's ``apply``
does for that op (the backend's one-pass ``fused_backward`` kernel where it has one, else
the op's registered tensor formulas on tensors wrapping the arrays, under no_grad), then
the engine's ``_fit_to_inputs`` (sum back over broadcast dims, cast to the input's dtype).
The CUDA plan (cuda_step.py) runs every op's backward this way; the CPU code generator
(codegen.py) calls it from the generated module for the ops without a NumPy rule of their
own (rules.py), so every op with a backward compiles.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np

from .. import _tensor_layer as _tl
from ..autograd import function as _fn
from ..autograd.grad_mode import no_grad
from ..backends import backend_for
from ..ops.nn import MEAN as _MEAN
from ..ops.nn import NONE as _NONE
from ..tensor import Tensor
from .graph import OpCall, Value

__all__ = ["op_backward"]


def _nll_grad_device(grad, self, target, weight, reduction, ignore_index, total_weight):
    """nll_loss's formula (symgrad/ops/nn.py ``_nll_grad``) without its host read: with
    no class weights, "every target ignored" is ``total_weight == 0``, chosen on the device
    by ``where`` (eager reads the count back to branch on it). Same values: the kept
    case is ``coef * (grad / total_weight)``; the ignored case zeros (``+ 0.0`` maps
    -0. to 0. in both, as the eager branch does in its own)."""
    c = self.shape[-1]
    t = target.reshape(-1, 1) if self.ndim == 2 else target.reshape(1)
    hit = t == _tl.arange(c, device=self.device)
    if 0 <= ignore_index < c:
        hit = hit & (t != ignore_index)
    coef = -hit.to(self.dtype)
    if reduction == _MEAN:
        be, g, tw = backend_for("cuda"), grad._data, total_weight._data
        scaled = _fn.as_array(be.where(be.ne(tw, 0), be.div(g, tw), 0.0))
        return coef * Tensor._wrap(be.cast(scaled, g.dtype), grad.device) + 0.0
    return coef * (grad.unsqueeze(-1) if self.ndim == 2 and reduction == _NONE else grad)


#: backwards of structural ops written on arrays: the backend call eager's formula makes
#: (``grad.t()`` is the t op's transpose; a reshape's inverse is ``be.reshape`` to the
#: input's sizes), without wrapping the arrays in Tensors
_ARRAY_RULES = {
    "t": lambda be, g, shape: be.transpose(g, tuple(range(g.ndim))[::-1]),
    **{name: (lambda be, g, shape: be.reshape(g, shape))
       for name in ("view", "unsqueeze", "squeeze", "squeeze_")},
}


def _device_formula(spec, call: OpCall, input_name: str, dev):
    """A device form of a formula that reads a value into Python, where one is known."""
    if dev.type == "cuda" and spec.name == "nll_loss" and call.params.get("weight") is None \
            and spec.grads.pristine:
        return _nll_grad_device
    return spec.grads[input_name]


#: how a saved operand is read from the env (_saved_plan)
_SLOT, _CONST, _CALL = 0, 1, 2


def _saved_plan(call: OpCall, needs: int) -> dict:
    """name -> (how, what) giving the saved operand as the fused kernel receives it:
    ``(_SLOT, index)`` is ``env[index]``, ``(_CONST, value)`` a value fixed at tracing,
    ``(_CALL, fn)`` is ``fn(env)``. Plain pairs, so the per-call read is one comprehension
    (no closure call per operand)."""
    spec = call.spec
    plan = {}
    for name, how, j in _fn._save_plan(spec, needs):
        if how is _fn._PARAM:
            v = call.params.get(name)
            plan[name] = (_SLOT, v.index) if isinstance(v, Value) else (_CONST, v)
        elif how is _fn._INPUT:
            x = call.inputs[j]
            plan[name] = (_SLOT, x.index) if isinstance(x, Value) else (_CONST, x)
        elif how is _fn._OUTPUT:
            plan[name] = (_SLOT, call.outputs[j].index)
        elif how is _fn._UNUSED:
            plan[name] = (_CONST, None)
        elif how is _fn._SIZES:
            plan[name] = (_CONST, tuple(call.inputs[j].shape))
        elif how is _fn._STRIDES:
            plan[name] = (_CALL, (lambda i: lambda env: tuple(
                s // env[i].itemsize for s in env[i].strides))(call.inputs[j].index))
        else:
            kind, detail = spec.saved_kind(name)
            if kind == "meta" and detail == "_sym_numel":
                x = call.inputs[spec.inputs.index(name[: -len(detail)])]
                plan[name] = (_CONST, int(np.prod(x.shape)))
            elif kind == "output":
                plan[name] = (_SLOT, call.outputs[spec.outputs.index(name)].index)
            else:
                plan[name] = (_CONST, call.params.get(name))
    return plan


def _getter(how: int, what):
    if how == _SLOT:
        return lambda env: env[what]
    if how == _CONST:
        return lambda env: what
    return what


def _keywords(fn) -> frozenset:
    """The keyword-only parameters of a backend's fused backward."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    return frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY)


def op_backward(call: OpCall, be, dev):
    """fn(env, grad arrays per output) -> gradient arrays per input (None where none), as
    the engine's node apply + _fit_to_inputs give them."""
    spec = call.spec
    needed = tuple(isinstance(x, Value) and x.requires_grad for x in call.inputs)
    needs = sum(1 << i for i, n in enumerate(needed) if n)
    plan = _saved_plan(call, needs)
    getters = {name: _getter(how, what) for name, (how, what) in plan.items()}
    kernel = getattr(be, spec.fused_backward, None) if spec.fused_backward else None
    if not spec.grads.pristine:
        kernel = None
    if kernel is not None and "packed" in _keywords(kernel):
        # the attention gradients in one array, as a split backward joins them (no hook
        # sees their strides here): runtime.cat_into then takes them without a copy
        kernel = functools.partial(kernel, packed=True)
    ins = call.inputs
    out0 = call.outputs[0] if call.outputs else None

    formula = {n: _device_formula(spec, call, n, dev) for n in spec.grads}

    def formulas(env, grad):
        with no_grad():
            g = grad if spec.variadic_outputs else Tensor._wrap(grad, dev)
            cache: dict = {}
            res = []
            for i, input_name in enumerate(spec.inputs):
                if not needed[i] or input_name not in spec.grads:
                    res.append(None)
                    continue
                kwargs = {}
                for p in spec.formula_params[input_name]:
                    if p not in cache:
                        v = getters[p](env) if p in getters else call.params.get(p)
                        if isinstance(v, Value):
                            v = env[v.index]
                        if isinstance(v, np.ndarray) or hasattr(v, "__cuda_array_interface__"):
                            v = Tensor._wrap(v, dev)
                        cache[p] = v
                    kwargs[p] = cache[p]
                r = formula[input_name](g, **kwargs)
                res.append(None if r is None else r._data)
            return res

    rule = _ARRAY_RULES.get(spec.name) if spec.grads.pristine else None
    in_shape = tuple(ins[0].shape) if ins and isinstance(ins[0], Value) else None
    variadic = spec.variadic_outputs
    #: the kernel's saved operands in its order, as (how, what) pairs
    saved = [plan[p] for p in spec.saved] if kernel is not None else []
    #: per input: (shape, dtype) its gradient is fitted to, None for a constant
    fit = [(x.shape, x.dtype) if isinstance(x, Value) else None for x in ins]
    ndarray = np.ndarray

    def run(env, grads):
        if rule is not None and grads[0] is not None:
            outs = [_fn.as_array(rule(be, grads[0], in_shape))]
        elif variadic:
            grad = [None if gr is None else Tensor._wrap(gr, dev) for gr in grads]
            outs = formulas(env, grad)
        else:
            grad = grads[0]
            if grad is None:
                grad = be.full(out0.shape, 0, out0.dtype)
            outs = None
            if kernel is not None:
                outs = kernel(grad, needed, *[env[what] if how == _SLOT else what if how ==
                                              _CONST else what(env) for how, what in saved])
                if outs is not None:  # as_array, which keeps an ndarray as it is
                    outs = [o if type(o) is ndarray or o is None else _fn.as_array(o)
                            for o in outs]
            if outs is None:
                outs = formulas(env, grad)
        fitted = []
        for f, g in zip(fit, outs):
            if g is None or f is None:
                fitted.append(None)
                continue
            shape, dtype = f
            if g.shape != shape:
                lead = len(g.shape) - len(shape)
                if lead > 0 and tuple(g.shape[lead:]) == tuple(shape):
                    g = be.sum(g, tuple(range(lead)), False)
                else:
                    with no_grad():
                        g = Tensor._wrap(g, dev).sum_to_size(shape)._data
            if g.dtype != dtype:
                g = be.cast(g, dtype)
            fitted.append(g)
        return fitted
    return run
