"""``symgrad.func``: torch.func's function transforms, built on symgrad's reverse mode.

``grad``, ``grad_and_value``, ``vjp``, ``jacrev``, ``jacfwd``, ``hessian``, ``jvp`` and
``vmap`` with torch.func's signatures, argument checks, messages and return structures
(pytrees of tuples, lists and dicts). How they differ inside, and why:

- symgrad has no functorch levels. A transform differentiates with respect to fresh
  leaves (detached copies of the arguments it differentiates; a view when the argument
  already requires grad, so that an enclosing ``grad`` or the user's own graph sees it)
  and always builds the graph of its result (``create_graph=True``). Results whose graph
  reaches no tensor from outside the transform are detached, so ``grad(f)(x)`` is a plain
  tensor as in torch, while ``grad(grad(f))`` and closures over tensors that require grad
  stay differentiable.
- symgrad has no forward-mode AD: ``jacfwd`` computes the same Jacobian row by row in
  reverse mode, and ``jvp`` uses the double-backward trick (as
  ``torch.autograd.functional.jvp`` does).
- ``vmap`` has no batched tensors: it calls the function once per batch element (slices
  along ``in_dims``) and stacks the results along ``out_dims``. Values and gradients
  equal torch's; time grows with the batch size, and an error inside the function names
  one element's shapes rather than the batched ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .autograd.grad_mode import enable_grad, is_grad_enabled

__all__ = ["grad", "grad_and_value", "vjp", "jacrev", "jacfwd", "hessian", "jvp", "vmap"]


def _Tensor():
    from .tensor import Tensor

    return Tensor


# -- pytrees: tuples, lists and dicts of leaves ----------------------------------------------

class _Spec:
    """The structure of a pytree: ``kind`` is None for a leaf, else tuple/list/dict."""

    __slots__ = ("kind", "keys", "children", "num_leaves")

    def __init__(self, kind, keys, children) -> None:
        self.kind = kind
        self.keys = keys
        self.children = children
        self.num_leaves = 1 if kind is None else sum(c.num_leaves for c in children)

    def __eq__(self, other) -> bool:
        return (isinstance(other, _Spec) and self.kind is other.kind
                and self.keys == other.keys and self.children == other.children)

    def __repr__(self) -> str:
        if self.kind is None:
            return "*"
        inner = ", ".join(repr(c) if self.kind is not dict else f"{k!r}: {c!r}"
                          for k, c in zip(self.keys or [None] * len(self.children),
                                          self.children))
        return {tuple: f"({inner}{',' if len(self.children) == 1 else ''})",
                list: f"[{inner}]", dict: f"{{{inner}}}"}[self.kind]


_LEAF = _Spec(None, None, ())


def _flatten(tree) -> tuple[list, _Spec]:
    if isinstance(tree, (tuple, list)) and not hasattr(tree, "_fields"):
        leaves, children = [], []
        for x in tree:
            lv, spec = _flatten(x)
            leaves += lv
            children.append(spec)
        return leaves, _Spec(type(tree) if type(tree) in (tuple, list) else tuple, None,
                             tuple(children))
    if isinstance(tree, dict):
        leaves, children = [], []
        for x in tree.values():
            lv, spec = _flatten(x)
            leaves += lv
            children.append(spec)
        return leaves, _Spec(dict, tuple(tree.keys()), tuple(children))
    return [tree], _LEAF


def _unflatten(leaves, spec: _Spec):
    it = iter(leaves)

    def build(s):
        if s.kind is None:
            return next(it)
        items = [build(c) for c in s.children]
        if s.kind is dict:
            return dict(zip(s.keys, items))
        return s.kind(items)

    return build(spec)


def _tree_map(fn, tree):
    leaves, spec = _flatten(tree)
    return _unflatten([fn(x) for x in leaves], spec)


def _broadcast_to_and_flatten(prefix, spec: _Spec) -> list | None:
    """``prefix`` (an int/None or a tree matching the top of ``spec``) per leaf of spec."""
    if spec.kind is None or not isinstance(prefix, (tuple, list, dict)):
        if isinstance(prefix, (tuple, list, dict)):
            return None
        return [prefix] * spec.num_leaves
    if spec.kind is dict:
        if not isinstance(prefix, dict) or set(prefix) != set(spec.keys):
            return None
        parts = [_broadcast_to_and_flatten(prefix[k], c) for k, c in zip(spec.keys,
                                                                           spec.children)]
    else:
        if not isinstance(prefix, (tuple, list)) or len(prefix) != len(spec.children):
            return None
        parts = [_broadcast_to_and_flatten(p, c) for p, c in zip(prefix, spec.children)]
    if any(p is None for p in parts):
        return None
    return [x for p in parts for x in p]


# -- argnums (torch's checks and wording) ----------------------------------------------------

def _validate_and_wrap_argnum(argnum, num_args: int) -> int:
    if not isinstance(argnum, int):
        raise RuntimeError(f"argnum must be int, got: {type(argnum)}")
    if 0 <= argnum < num_args:
        return argnum
    if -num_args <= argnum < 0:
        return argnum + num_args
    raise RuntimeError(f"Got argnum={argnum}, but only {num_args} positional inputs")


def _slice_argnums(args: tuple, argnums, as_tuple: bool = True):
    if not isinstance(argnums, (int, tuple)):
        raise RuntimeError(f"argnums must be int or Tuple[int, ...], got: {type(argnums)}")
    if isinstance(argnums, int):
        argnums = _validate_and_wrap_argnum(argnums, len(args))
        return (args[argnums],) if as_tuple else args[argnums]
    argnums = tuple(_validate_and_wrap_argnum(a, len(args)) for a in argnums)
    if len(argnums) == 0:
        raise RuntimeError("argnums must be non-empty")
    if len(set(argnums)) != len(argnums):
        raise RuntimeError(f"argnums elements must be unique, got {argnums}")
    return tuple(args[i] for i in argnums)


def _replace_args(old_args: tuple, new_diff, argnums) -> tuple:
    """``old_args`` with the differentiated ones (as ``_slice_argnums`` gave) replaced."""
    if isinstance(argnums, int):
        k = _validate_and_wrap_argnum(argnums, len(old_args))
        return tuple(new_diff if i == k else a for i, a in enumerate(old_args))
    ks = [_validate_and_wrap_argnum(a, len(old_args)) for a in argnums]
    return tuple(new_diff[ks.index(i)] if i in ks else a for i, a in enumerate(old_args))


# -- one transform level ---------------------------------------------------------------------

class _Level:
    """The fresh leaves one transform differentiates with respect to, and the test that
    says whether a result depends on anything else (then it keeps its graph)."""

    def __init__(self) -> None:
        self.outer_grad = is_grad_enabled()
        self.internal: set[int] = set()
        self._keep: list = []  # the fresh leaves stay alive while their ids are in use

    def differentiable(self, x):
        T = _Tensor()
        if not isinstance(x, T):
            raise ValueError(f"Thing passed to transform API must be Tensor, got {type(x)}")
        if not x.dtype.is_floating_point:
            raise RuntimeError("only Tensors of floating point dtype can require gradients")
        if x.requires_grad:
            return x.view_as(x)  # stays connected to the enclosing level / user graph
        leaf = x.detach().requires_grad_()
        self.internal.add(id(leaf))
        self._keep.append(leaf)
        return leaf

    def _reaches_outside(self, t) -> bool:
        from .autograd.node import AccumulateGrad

        if not t.requires_grad:
            return False
        if t.grad_fn is None:
            return id(t) not in self.internal
        seen, stack = set(), [t.grad_fn]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, AccumulateGrad):
                if id(node.variable) not in self.internal:
                    return True
                continue
            stack.extend(n for n, _ in node.next_functions if n is not None)
        return False

    def undo(self, tree):
        """Detach the results that only this level's leaves make differentiable."""
        T = _Tensor()

        def one(x):
            if isinstance(x, T) and x.requires_grad and not (
                    self.outer_grad and self._reaches_outside(x)):
                return x.detach()
            return x

        return _tree_map(one, tree)


def _autograd_grad(outputs, inputs, grad_outputs=None, retain_graph: bool = True):
    """Gradients of the outputs that require grad (create_graph), zeros where none flows.
    The graph is retained: an enclosing transform may differentiate through it again
    (functorch's levels keep it usable; without them, freeing it would break nesting)."""
    from .autograd import grad as _grad
    from .creation import zeros_like

    if grad_outputs is None:
        pairs = [(o, None) for o in outputs if o.requires_grad]
    else:
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o.requires_grad]
    if not pairs:
        return tuple(zeros_like(x) for x in inputs)
    outs = [o for o, _ in pairs]
    gos = [g for _, g in pairs]
    result = _grad(outs, list(inputs), gos, retain_graph=retain_graph, create_graph=True,
                   allow_unused=True)
    return tuple(zeros_like(x) if g is None else g for g, x in zip(result, inputs))


def _check_aux(output, has_aux: bool, api: str):
    if not has_aux:
        return output, None
    if not (isinstance(output, tuple) and len(output) == 2):
        raise RuntimeError(f"{api}: output of function f should be a tuple: (output, aux) if "
                           "has_aux is True")
    return output


def _set_name(wrapper, func, transform: str):
    """The wrapper carries ``func``'s name and docstring, as torch's transforms do."""
    try:
        functools.update_wrapper(wrapper, func)
    except (AttributeError, TypeError):
        pass
    return wrapper


# -- grad ------------------------------------------------------------------------------------

def grad_and_value(func: Callable, argnums: int | tuple[int, ...] = 0,
                   has_aux: bool = False) -> Callable:
    """``(gradient, value)`` of a scalar ``func`` with respect to ``args[argnums]``
    (``((gradient), (value, aux))`` with ``has_aux=True``)."""

    def wrapper(*args, **kwargs):
        level = _Level()
        with enable_grad():
            diff_args = _slice_argnums(args, argnums, as_tuple=False)
            flat, spec = _flatten(diff_args)
            wrapped = [level.differentiable(x) for x in flat]
            args = _replace_args(args, _unflatten(wrapped, spec), argnums)
            output = func(*args, **kwargs)
            output, aux = _check_aux(output, has_aux, "grad_and_value(f)(*args)")
            if not isinstance(output, _Tensor()):
                raise RuntimeError("grad_and_value(f)(*args): Expected f(*args) to return a "
                                   f"Tensor, got {type(output)}")
            if output.dim() != 0:
                raise RuntimeError(
                    "grad_and_value(f)(*args): Expected f(*args) to return a scalar Tensor, "
                    f"got tensor with {output.dim()} dims. Maybe you wanted to use the vjp or "
                    "jacrev APIs instead?")
            grads = _autograd_grad((output,), wrapped)
            grad_input = level.undo(_unflatten(list(grads), spec))
            output = level.undo(output)
            if has_aux:
                return grad_input, (output, level.undo(aux))
            return grad_input, output

    return _set_name(wrapper, func, "grad_and_value")


def grad(func: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False) -> Callable:
    """The gradient of a scalar ``func`` with respect to ``args[argnums]`` (same structure
    as those arguments; ``(gradient, aux)`` with ``has_aux=True``)."""
    gv = grad_and_value(func, argnums, has_aux)

    def wrapper(*args, **kwargs):
        g, value = gv(*args, **kwargs)
        if has_aux:
            return g, value[1]
        return g

    return _set_name(wrapper, func, "grad")


# -- vjp, jacrev, jacfwd, hessian, jvp -------------------------------------------------------

def vjp(func: Callable, *primals, has_aux: bool = False):
    """``(func(*primals), vjp_fn[, aux])``; ``vjp_fn(cotangents)`` gives a tuple with one
    vector-Jacobian product per primal, and may be called repeatedly."""
    level = _Level()
    with enable_grad():
        flat_primals, primals_spec = _flatten(primals)
        wrapped = [level.differentiable(x) for x in flat_primals]
        primals_out = func(*_unflatten(wrapped, primals_spec))
        primals_out, aux = _check_aux(primals_out, has_aux, "vjp(f, *primals)")
        flat_out, out_spec = _flatten(primals_out)
        _check_tensor_outputs(flat_out, "vjp(f, *primals)")
        for o in flat_out:
            if not o.dtype.is_floating_point:
                raise RuntimeError("vjp(f, ...): All outputs of f must be floating-point or "
                                   f"complex Tensors, got Tensor with dtype {o.dtype}")
        results = level.undo(primals_out)

    def vjp_fn(cotangents, retain_graph: bool = True, create_graph: bool | None = None):
        flat_ct, ct_spec = _flatten(cotangents)
        if ct_spec != out_spec:
            raise RuntimeError(
                "Expected pytree structure of cotangents to be the same as pytree structure "
                f"of outputs to the function. cotangents: {ct_spec!r}, primal output: "
                f"{out_spec!r}")
        inner = _Level()
        inner.internal, inner._keep = level.internal, level._keep
        inner.outer_grad = is_grad_enabled() if create_graph is None else create_graph
        with enable_grad():
            result = _autograd_grad(flat_out, wrapped, flat_ct, retain_graph=retain_graph)
        return inner.undo(_unflatten(list(result), primals_spec))

    if has_aux:
        return results, vjp_fn, level.undo(aux)
    return results, vjp_fn


def _check_tensor_outputs(flat_out, api: str) -> None:
    if not flat_out:
        raise RuntimeError(f"{api}: Expected f to be a function that has non-empty output "
                           f"(got output = {flat_out})")
    T = _Tensor()
    for o in flat_out:
        if not isinstance(o, T):
            raise RuntimeError(f"{api}: expected f(*primals) to return only tensors, got "
                               f"unsupported type {type(o)}")


def _jacobian_rows(out, wrapped):
    """d out / d each wrapped leaf: one create_graph backward per element of ``out``."""
    from .creation import zeros_like
    from .functional import stack

    flat = out.reshape(-1)
    rows: list[list] = [[] for _ in wrapped]
    for j in range(out.numel()):
        for r, g in zip(rows, _autograd_grad((flat[j],), wrapped, retain_graph=True)):
            r.append(g)
    return [(stack(r) if r else zeros_like(w).reshape(0, *w.shape))
            .reshape(tuple(out.shape) + tuple(w.shape)) for r, w in zip(rows, wrapped)]


def jacrev(func: Callable, argnums: int | tuple[int, ...] = 0, *, has_aux: bool = False,
           chunk_size: int | None = None, _preallocate_and_copy: bool = False) -> Callable:
    """The Jacobian of ``func`` with respect to ``args[argnums]``, by reverse mode (one
    backward per output element; ``chunk_size`` only batches that work in torch)."""
    if not (chunk_size is None or chunk_size > 0):
        raise ValueError("jacrev: `chunk_size` should be greater than 0.")
    return _jacobian_transform(func, argnums, has_aux, "jacrev")


def jacfwd(func: Callable, argnums: int | tuple[int, ...] = 0, has_aux: bool = False, *,
           randomness: str = "error") -> Callable:
    """The Jacobian of ``func`` with respect to ``args[argnums]``, as torch.func.jacfwd
    returns it; computed in reverse mode (symgrad has no forward-mode AD)."""
    _check_randomness(randomness)
    return _jacobian_transform(func, argnums, has_aux, "jacfwd")


def _jacobian_transform(func, argnums, has_aux, name):
    def wrapper(*args, **kwargs):
        level = _Level()
        with enable_grad():
            diff_args = _slice_argnums(args, argnums, as_tuple=False)
            flat, spec = _flatten(diff_args)
            wrapped = [level.differentiable(x) for x in flat]
            args = _replace_args(args, _unflatten(wrapped, spec), argnums)
            output = func(*args, **kwargs)
            output, aux = _check_aux(output, has_aux, "vjp(f, *primals)")
            flat_out, out_spec = _flatten(output)
            _check_tensor_outputs(flat_out, "vjp(f, *primals)")
            jac = [_unflatten(_jacobian_rows(o, wrapped), spec) for o in flat_out]
            result = level.undo(_unflatten(jac, out_spec))
            if has_aux:
                return result, level.undo(aux)
            return result

    return _set_name(wrapper, func, name)


def hessian(func: Callable, argnums: int | tuple[int, ...] = 0) -> Callable:
    """The Hessian of a scalar ``func``: ``jacfwd(jacrev(func, argnums), argnums)``."""
    return jacfwd(jacrev(func, argnums), argnums)


def jvp(func: Callable, primals, tangents, *, strict: bool = False, has_aux: bool = False):
    """``(func(*primals), J @ tangents[, aux])`` by the double-backward trick."""
    from .creation import zeros_like

    api = "jvp(f, primals, tangents)"
    if not isinstance(primals, tuple):
        raise RuntimeError(f"{api}: Expected primals to be a tuple. E.g. it should be valid to "
                           "call f(*primals).")
    flat_primals, primals_spec = _flatten(primals)
    flat_tangents, tangents_spec = _flatten(tangents)
    if primals_spec != tangents_spec:
        raise RuntimeError(
            f"{api}: Expected primals and tangents to have the same python structure. For "
            "example, if primals is a tuple of 3 tensors, tangents also must be. Got primals "
            f"with structure {primals_spec!r} and tangents with structure {tangents_spec!r}")
    T = _Tensor()
    for name, flat in (("primals", flat_primals), ("tangents", flat_tangents)):
        if not flat:
            raise RuntimeError(f"{api}: Expected {name} to contain at least one Tensor.")
        for x in flat:
            if not isinstance(x, T):
                raise RuntimeError(f"{api}: Expected {name} to only contain Tensors, got "
                                   f"{type(x)}")
    level = _Level()
    with enable_grad():
        wrapped = [level.differentiable(x) for x in flat_primals]
        output = func(*_unflatten(wrapped, primals_spec))
        output, aux = _check_aux(output, has_aux, api)
        flat_out, out_spec = _flatten(output)
        if not flat_out:
            raise RuntimeError(f"{api}: Expected f to be a function that has non-empty output "
                               f"(got output = {flat_out})")
        for o in flat_out:
            if not isinstance(o, T):
                raise RuntimeError(f"{api}: expected f(*args) to return only tensors, got "
                                   f"unsupported type {type(o)}")
            if strict and not o.requires_grad:
                raise RuntimeError("jvp(f, primals, tangents, strict=True): The output of f is "
                                   "independent of the inputs. This is not allowed with "
                                   "strict=True.")
        dummies = [zeros_like(o, requires_grad=True) for o in flat_out]
        vjps = _autograd_grad(flat_out, wrapped, dummies, retain_graph=True)
        jvps = _autograd_grad([g for g in vjps], dummies, flat_tangents, retain_graph=True)
        primals_out = level.undo(_unflatten(flat_out, out_spec))
        tangents_out = level.undo(_unflatten(list(jvps), out_spec))
    if has_aux:
        return primals_out, tangents_out, level.undo(aux)
    return primals_out, tangents_out


# -- vmap ------------------------------------------------------------------------------------

def _get_name(func) -> str:
    if hasattr(func, "__name__"):
        return func.__name__
    if isinstance(func, functools.partial):
        return f"functools.partial({_get_name(func.func)}, ...)"
    return repr(func)


def _check_randomness(randomness: str) -> None:
    if randomness not in ("error", "different", "same"):
        raise RuntimeError("Only allowed values for randomness are 'error', 'different', or "
                           f"'same'. Got {randomness}")


_RANDOM_IN_ERROR_MODE = (
    "vmap: called random operation while in randomness error mode. Please either use the "
    "'same' or 'different' randomness flags on vmap or perform the randomness operation out "
    "of vmap")


def vmap(func: Callable, in_dims: Any = 0, out_dims: Any = 0, randomness: str = "error", *,
         chunk_size: int | None = None) -> Callable:
    """torch.func.vmap's interface, implemented as a loop: ``func`` runs once per batch
    element on inputs sliced along ``in_dims`` and the results are stacked along
    ``out_dims`` (differentiably). ``randomness='error'`` raises when ``func`` drew random
    numbers, ``'same'`` replays the generator's state for every element, ``'different'``
    lets each draw its own. ``chunk_size`` only changes how torch batches the work."""
    _check_randomness(randomness)
    if not (chunk_size is None or chunk_size > 0):
        raise ValueError(f"vmap: chunk_size should be None or greater than 0. (got {chunk_size})")
    name = _get_name(func)

    def wrapper(*args, **kwargs):
        T = _Tensor()
        if not isinstance(in_dims, (int, tuple)) or isinstance(in_dims, bool):
            raise ValueError(
                f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): expected `in_dims` to be int "
                "or a (potentially nested) tuple matching the structure of inputs, got: "
                f"{type(in_dims)}.")
        if len(args) == 0:
            raise ValueError(
                f"vmap({name})(<inputs>): got no inputs. Maybe you forgot to add inputs, or "
                "you are trying to vmap over a function with no inputs. The latter is "
                "unsupported.")
        flat_args, args_spec = _flatten(args)
        flat_in_dims = _broadcast_to_and_flatten(in_dims, args_spec)
        if flat_in_dims is None:
            raise ValueError(
                f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): in_dims is not compatible "
                "with the structure of `inputs`. in_dims has structure "
                f"{_flatten(in_dims)[1]!r} but inputs has structure {args_spec!r}.")
        for i, (arg, in_dim) in enumerate(zip(flat_args, flat_in_dims)):
            if not isinstance(in_dim, int) and in_dim is not None:
                raise ValueError(
                    f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): Got in_dim={in_dim} for "
                    "an input but in_dim must be either an integer dimension or None.")
            if isinstance(in_dim, int) and not isinstance(arg, T):
                raise ValueError(
                    f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): Got in_dim={in_dim} for "
                    f"an input but the input is of type {type(arg)}. We cannot vmap over "
                    "non-Tensor arguments, please use None as the respective in_dim")
            if in_dim is not None and (in_dim < -arg.dim() or in_dim >= arg.dim()):
                raise ValueError(
                    f"vmap({name}, in_dims={in_dims}, ...)(<inputs>): Got in_dim={in_dim} for "
                    f"some input, but that input is a Tensor of dimensionality {arg.dim()} so "
                    f"expected in_dim to satisfy -{arg.dim()} <= in_dim < {arg.dim()}.")
            if in_dim is not None and in_dim < 0:
                flat_in_dims[i] = in_dim % arg.dim()
        sizes = [arg.size(d) for d, arg in zip(flat_in_dims, flat_args) if d is not None]
        if not sizes:
            raise ValueError("vmap: Expected at least one Tensor to vmap over")
        if any(s != sizes[0] for s in sizes):
            raise ValueError("vmap: Expected all tensors to have the same size in the mapped "
                             f"dimension, got sizes {sizes} for the mapped dimension")
        from .creation import default_generator

        gen = default_generator().bit_generator
        start_state = gen.state
        outputs = []
        for b in range(sizes[0]):
            if randomness == "same":
                gen.state = start_state
            sliced = [a if d is None else a.select(d, b)
                      for a, d in zip(flat_args, flat_in_dims)]
            outputs.append(func(*_unflatten(sliced, args_spec), **kwargs))
            if randomness == "error" and gen.state != start_state:
                raise RuntimeError(_RANDOM_IN_ERROR_MODE)
        return _stack_outputs(outputs, out_dims, name, sizes[0])

    return _set_name(wrapper, func, "vmap")


def _stack_outputs(outputs: list, out_dims, name: str, batch_size: int):
    from .functional import stack

    T = _Tensor()
    flat0, spec = _flatten(outputs[0])

    def incompatible():
        raise ValueError(
            f"vmap({name}, ..., out_dims={out_dims})(<inputs>): out_dims is not compatible "
            f"with the structure of `outputs`. out_dims has structure "
            f"{_flatten(out_dims)[1]!r} but outputs has structure {spec!r}.")

    for d in _flatten(out_dims)[0]:
        if not (d is None or (isinstance(d, int) and not isinstance(d, bool))):
            raise ValueError(
                f"vmap({name}, ..., out_dims={out_dims}): `out_dims` must be an int, None or a "
                "python collection of ints representing where in the outputs the vmapped "
                "dimension should appear.")
    if isinstance(outputs[0], T):
        if isinstance(out_dims, tuple) and len(out_dims) == 1:
            flat_out_dims = list(out_dims)
        elif isinstance(out_dims, int) or out_dims is None:
            flat_out_dims = [out_dims]
        else:
            incompatible()
    else:
        flat_out_dims = _broadcast_to_and_flatten(out_dims, spec)
        if flat_out_dims is None:
            incompatible()
    flats = [_flatten(o)[0] for o in outputs]
    result = []
    for k, out_dim in enumerate(flat_out_dims):
        items = [f[k] for f in flats]
        if out_dim is None:
            result.append(items[0])
            continue
        if not isinstance(items[0], T):
            raise ValueError(
                f"vmap({name}, ...): `{name}` must only return Tensors, got type "
                f"{type(items[0])}. Did you mean to set out_dims= to None for output?")
        ndim = items[0].dim() + 1
        if not -ndim <= out_dim < ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of "
                             f"[{-ndim}, {ndim - 1}], but got {out_dim})")
        result.append(stack(items, dim=out_dim % ndim))
    return _unflatten(result, spec)
