"""``gradcheck`` / ``gradgradcheck``: PyTorch's finite-difference checks, same signature.

Finite differences are the independent opinion here (the SymPy verifier is the other).
The steps, their order and the messages follow ``torch.autograd.gradcheck``: central
differences per input element against one vector-Jacobian product per output element
(computed twice, to catch a non-reentrant backward), then "backward is multiplied by
grad_output", then undefined output gradients. ``fast_mode=True`` compares ``v^T J u``
for random unit vectors ``u``, ``v`` as PyTorch's fast mode does (drawn from symgrad's
own generator, so the numbers in a fast-mode failure differ from torch's). Jacobians in
messages are symgrad tensors laid out as torch's: ``(input numel, output numel)``.

Forward-mode AD and vmap do not exist in symgrad: ``check_forward_ad``,
``check_batched_grad``, ``check_batched_forward_grad`` and ``check_fwd_over_rev`` raise
NotImplementedError when set to True. Inputs are dense real tensors, so ``masked`` has
nothing to act on.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["GradcheckError", "gradcheck", "gradgradcheck"]


class GradcheckError(RuntimeError):
    """Error raised by :func:`gradcheck` and :func:`gradgradcheck`."""


FAILED_NONDET_MSG = """\n
NOTE: If your op relies on non-deterministic operations i.e., it is listed here:
https://pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html
this failure might be expected.

If you are adding a new operator, please file an issue and then use one of the
workarounds. The workaround depends on how your test invokes gradcheck/gradgradcheck.
If the test
- manually invokes gradcheck/gradgradcheck, then call gradcheck/gradgradcheck
  with `nondet_tol=<tol>` as a keyword argument.
- is OpInfo-based (e.g., in test_ops_gradients.py), then modify the OpInfo for the test
  to have `gradcheck_nondet_tol=<tol>`.
- is a Module test (e.g., in common_nn.py), then modify the corresponding
  module_test entry to have `gradcheck_nondet_tol=<tol>`
"""

FAST_FAIL_SLOW_OK_MSG = """
Fast gradcheck failed but element-wise differences are small. This means that the
test might've passed in slow_mode!

If you are adding a new operator, please file an issue and then use one of the
workarounds. The workaround depends on how your test invokes gradcheck/gradgradcheck:

If the test
- manually invokes gradcheck/gradgradcheck, then call gradcheck/gradgradcheck
  with `fast_mode=False` as a keyword argument.
- is OpInfo-based (e.g., in test_ops_gradients.py), then modify the OpInfo for the test
  to have `gradcheck_fast_mode=False`
- is a Module test (e.g., in common_nn.py), then modify the corresponding
  module_test entry to have `gradcheck_fast_mode=False`
""".strip()


def _not_supported(option: str) -> NotImplementedError:
    return NotImplementedError(
        f"symgrad's gradcheck cannot honour {option}=True: symgrad has no "
        f"{'forward-mode AD' if 'forward' in option or 'fwd' in option else 'vmap'}. "
        f"Leave {option} at its default (False).")


def _Tensor():
    from ..tensor import Tensor

    return Tensor


def _as_tuple(x) -> tuple:
    if isinstance(x, tuple):
        return x
    if isinstance(x, list):
        return tuple(x)
    return (x,)


def _is_float_tensor(x) -> bool:
    return isinstance(x, _Tensor()) and x.dtype.is_floating_point


def _diff_inputs(inputs) -> list[int]:
    """Indices of the inputs that require grad (the ones the Jacobians are taken for)."""
    T = _Tensor()
    return [i for i, x in enumerate(inputs) if isinstance(x, T) and x.requires_grad]


def _differentiable_outputs(x) -> tuple:
    return tuple(o for o in _as_tuple(x) if isinstance(o, _Tensor()) and o.requires_grad)


def _wrap(a: np.ndarray):
    """A numpy array as a symgrad tensor (messages print Jacobians as tensors)."""
    from ..device import device

    return _Tensor()._wrap(np.array(a, order="C"), device("cpu"))


def _to_numpy(t) -> np.ndarray:
    return t.detach().cpu()._data


def _check_inputs(inputs: tuple) -> None:
    any_requiring_grad = False
    for idx, inp in enumerate(inputs):
        if isinstance(inp, _Tensor()) and inp.requires_grad:
            if inp.dtype.name != "float64":
                warnings.warn(
                    f"Input #{idx} requires gradient and is not a double precision floating "
                    "point or complex. This check will likely fail if all the inputs are not "
                    "of double precision floating point or complex. ", stacklevel=4)
            data = inp._data
            if not all(st > 0 or sz <= 1 for st, sz in zip(data.strides, data.shape)):
                raise RuntimeError(
                    f"The {idx}th input has a dimension with stride 0. gradcheck only "
                    "supports inputs that are non-overlapping to be able to compute the "
                    "numerical gradients correctly. You should call .contiguous on the input "
                    "before passing it to gradcheck.")
            any_requiring_grad = True
    if not any_requiring_grad:
        raise ValueError("gradcheck expects at least one input tensor to require gradient, "
                         "but none of them have requires_grad=True.")


def _run(func, inputs) -> tuple:
    """``func(*inputs)`` as a tuple of output arrays (copies: the inputs are perturbed)."""
    return tuple(np.array(_to_numpy(o)) if isinstance(o, _Tensor()) else o
                 for o in _as_tuple(func(*inputs)))


def _check_same(a, b, eps, idx=None) -> None:
    on_index = f"on index {idx} " if idx is not None else ""
    if a.shape != b.shape:
        raise AssertionError(
            "Expected `func` to return outputs with the same shape when inputs are perturbed "
            f"{on_index}by {eps}, but got: shapes {_size(a.shape)} and {_size(b.shape)}.")
    if a.dtype != b.dtype:
        from ..dtypes import from_numpy_dtype

        raise AssertionError(
            "Expected `func` to return outputs with the same dtype when inputs are perturbed "
            f"{on_index}by {eps}, but got: dtypes {from_numpy_dtype(a.dtype)} and "
            f"{from_numpy_dtype(b.dtype)}.")


def _size(shape):
    from ..tensor import Size

    return Size(shape)


def _numerical_jacobians(func, inputs, func_out, eps) -> list[list[np.ndarray]]:
    """``[input][output]`` central-difference Jacobians, shaped (input numel, output
    numel), in the output's dtype, for every floating output (as torch computes them)."""
    float_outs = [k for k, o in enumerate(func_out) if _is_float_tensor(o)]
    result = []
    for i in _diff_inputs(inputs):
        x = inputs[i]._data  # perturbed in place (torch perturbs ``.data``)
        cols: list[list[np.ndarray]] = []
        for idx in np.ndindex(*x.shape):
            orig = x[idx].copy()
            x[idx] = orig - x.dtype.type(eps)
            outa = _run(func, inputs)
            x[idx] = orig + x.dtype.type(eps)
            outb = _run(func, inputs)
            x[idx] = orig
            col = []
            for k in float_outs:
                a, b = outa[k], outb[k]
                _check_same(a, b, eps, idx)
                col.append(((b - a) / (2 * eps)).reshape(-1))
            cols.append(col)
        jacs = []
        for n, k in enumerate(float_outs):
            out = func_out[k]._data
            if cols:
                jacs.append(np.stack([c[n] for c in cols]).astype(out.dtype, copy=False))
            else:
                jacs.append(np.zeros((0, out.size), out.dtype))
        result.append(jacs)
    return result


def _vjps(inputs, output, v) -> tuple:
    from .engine import grad

    idx = _diff_inputs(inputs)
    return grad(output, [inputs[i] for i in idx], v, retain_graph=True, allow_unused=True)


def _analytical_jacobian(inputs, output, nondet_tol, check_grad_dtypes,
                         fast_v=None) -> list[np.ndarray]:
    """Per differentiable input, the (input numel, output numel) Jacobian from one
    vector-Jacobian product per output element (one product with ``fast_v`` in fast
    mode), computed twice: a backward that is not reentrant is an error, as in torch."""
    from ..creation import zeros_like

    idx = _diff_inputs(inputs)

    def rows():
        if fast_v is not None:
            v = _wrap(fast_v.reshape(tuple(output.shape)).astype(output._data.dtype))
            return [[g] for g in _vjps(inputs, output, v)]
        per_input: list[list] = [[] for _ in idx]
        for j in range(output.numel()):
            v = zeros_like(output.detach())
            v._data.reshape(-1)[j] = 1
            for r, g in zip(per_input, _vjps(inputs, output, v)):
                r.append(None if g is None else g.detach().clone())
        return per_input

    def stack(per_input):
        jacs, sizes_ok, types_ok = [], True, True
        n_cols = 1 if fast_v is not None else output.numel()
        for i, column_list in zip(idx, per_input):
            inp = inputs[i]
            jac = np.zeros((inp.numel(), n_cols), inp._data.dtype)
            for j, g in enumerate(column_list):
                if g is None:
                    continue
                if tuple(g.shape) != tuple(inp.shape):
                    sizes_ok = False
                elif g.dtype is not inp.dtype:
                    types_ok = False
                if g.numel() == inp.numel():
                    jac[:, j] = _to_numpy(g).reshape(-1)
            jacs.append(jac)
        return jacs, sizes_ok, types_ok

    jacs1, sizes_ok, types_ok = stack(rows())
    jacs2, _, _ = stack(rows())
    reentrant = all(a.size == 0 or np.abs(a - b).max() <= nondet_tol
                    for a, b in zip(jacs1, jacs2))
    if not types_ok and check_grad_dtypes:
        raise GradcheckError("Gradient has dtype mismatch")
    if not sizes_ok:
        raise GradcheckError("Analytical gradient has incorrect size")
    if not reentrant:
        raise GradcheckError(
            "Backward is not reentrant, i.e., running backward with same input and "
            "grad_output multiple times gives different values, although analytical gradient "
            f"matches numerical gradient.The tolerance for nondeterminism was {nondet_tol}."
            + FAILED_NONDET_MSG)
    return jacs1


def _allclose(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> bool:
    dt = np.result_type(a.dtype, b.dtype)
    return bool(np.isclose(a.astype(dt), b.astype(dt), rtol=rtol, atol=atol).all())


def _notallclose_msg(analytical, numerical, output_idx: int, input_idx: int) -> str:
    """torch's wording; Jacobians print as tensors, fast mode's ``v^T J u`` as floats."""
    def show(a):
        return repr(float(a)) if a.ndim == 0 else _wrap(a)

    return (f"Jacobian mismatch for output {output_idx:d} with respect to input "
            f"{input_idx:d},\nnumerical:{show(numerical)}\nanalytical:{show(analytical)}\n")


def _slow_gradcheck(func, func_out, inputs, outputs, eps, rtol, atol, check_grad_dtypes,
                    nondet_tol) -> bool:
    numerical_all = _numerical_jacobians(func, inputs, func_out, eps)
    if not outputs:  # no differentiable output: the numerical gradient must be zero
        if any(np.any(j != 0) for per_input in numerical_all for j in per_input):
            raise GradcheckError("Numerical gradient for function expected to be zero")
        return True
    float_outs = [o for o in func_out if _is_float_tensor(o)]
    keep = [n for n, o in enumerate(float_outs) if o.requires_grad]
    # numerical[i][j]: output i (among those requiring grad), input j
    numerical = [[per_input[n] for per_input in numerical_all] for n in keep]
    for i, o in enumerate(outputs):
        analytical = _analytical_jacobian(inputs, o, nondet_tol, check_grad_dtypes)
        for j, (a, n) in enumerate(zip(analytical, numerical[i])):
            if not _allclose(a, n, rtol, atol):
                raise GradcheckError(_notallclose_msg(a, n, i, j))
    return True


def _unit_vector(numel: int, rng: np.random.Generator) -> np.ndarray:
    vec = rng.random(numel)
    norm = np.linalg.norm(vec)
    return vec / norm if norm else vec


def _fast_gradcheck(func, func_out, inputs, outputs, eps, rtol, atol, check_grad_dtypes,
                    nondet_tol) -> bool:
    """Compare ``v^T J u`` computed both ways, for random non-negative unit ``u``, ``v``."""
    rng = np.random.default_rng(0)  # its own generator: the user's random state is kept
    idx = _diff_inputs(inputs)
    all_u = [_unit_vector(inputs[i].numel(), rng) for i in idx]
    all_v = [_unit_vector(o.numel(), rng) for o in outputs]
    float_outs = [k for k, o in enumerate(func_out) if _is_float_tensor(o)]
    diff_pos = [n for n, k in enumerate(float_outs) if func_out[k].requires_grad]
    # numerical J u per input, per floating output
    numerical_ju = []
    for i, u in zip(idx, all_u):
        x = inputs[i]._data
        orig = x.copy()
        delta = (u * eps).reshape(x.shape).astype(x.dtype)
        x[...] = orig - delta
        outa = _run(func, inputs)
        x[...] = orig + delta
        outb = _run(func, inputs)
        x[...] = orig
        jus = []
        for k in float_outs:
            _check_same(outa[k], outb[k], eps)
            jus.append(((outb[k] - outa[k]) / (2 * eps)).reshape(-1))
        numerical_ju.append(jus)
    if not outputs:
        for jus in numerical_ju:
            for ju in jus:
                if ju.size and np.abs(ju).max() > nondet_tol:
                    raise GradcheckError("Numerical gradient for function expected to be zero")
        return True
    for j, (o, v) in enumerate(zip(outputs, all_v)):
        vj = _analytical_jacobian(inputs, o, nondet_tol, check_grad_dtypes, fast_v=v)
        for i, (u, vj_i) in enumerate(zip(all_u, vj)):
            a = np.asarray((vj_i[:, 0] * u.astype(vj_i.dtype)).sum())
            ju = numerical_ju[i][diff_pos[j]]
            n = np.asarray((v.astype(ju.dtype) * ju).sum())
            updated_atol = atol * float(u.sum()) * float(v.sum())
            if not _allclose(a, n, rtol, updated_atol):
                raise GradcheckError(
                    _notallclose_msg(a, n, j, i)
                    + _slow_mode_error(func, inputs, outputs, i, j, rtol, atol, eps))
    return True


def _slow_mode_error(func, inputs, outputs, input_idx, output_idx, rtol, atol, eps) -> str:
    func_out = _as_tuple(func(*inputs))
    float_outs = [o for o in func_out if _is_float_tensor(o)]
    pos = [n for n, o in enumerate(float_outs) if o.requires_grad][output_idx]
    numerical = _numerical_jacobians(func, inputs, func_out, eps)[input_idx][pos]
    analytical = _analytical_jacobian(inputs, outputs[output_idx], float("inf"),
                                      False)[input_idx]
    max_diff = np.abs(numerical.astype(np.float64) - analytical.astype(np.float64)).max() \
        if numerical.size else 0.0
    msg = ("\nThe above quantities relating the numerical and analytical jacobians are "
           "computed \nin fast mode. See: https://github.com/pytorch/pytorch/issues/53876 for "
           "more background \nabout fast mode. Below, we recompute numerical and analytical "
           "jacobians in slow mode:\n\n"
           f"Numerical:\n {_wrap(numerical)}\n"
           f"Analytical:\n{_wrap(analytical)}\n\n"
           f"The max per-element difference (slow mode) is: {float(max_diff)!r}.\n")
    if _allclose(analytical, numerical, rtol, atol):
        msg += FAST_FAIL_SLOW_OK_MSG
    return msg


def _test_backward_mul_by_grad_output(outputs, inputs) -> bool:
    from ..creation import zeros_like
    from .engine import grad

    diff = [inputs[i] for i in _diff_inputs(inputs)]
    grads = grad(outputs, diff, [zeros_like(o.detach()) for o in outputs], allow_unused=True)
    for gi, di in zip(grads, diff):
        if gi is None:
            continue
        if not np.all(_to_numpy(gi) == 0):
            raise GradcheckError("backward not multiplied by grad_output")
        if gi.dtype is not di.dtype:
            raise GradcheckError("grad is incorrect type")
        if gi.device != di.device:
            raise GradcheckError("grad is incorrect device")
        if tuple(gi.shape) != tuple(di.shape):
            raise GradcheckError("grad is incorrect size")
    return True


def _test_undefined_backward_mode(func, outputs, inputs) -> bool:
    """Backward must cope with outputs that receive no gradient. Every output undefined
    at once is trivially fine here (nothing runs); with several outputs, each one in
    turn gets no gradient while the others get zeros, as torch's UndefinedGrad does."""
    from ..creation import zeros_like
    from .engine import grad

    diff = [inputs[i] for i in _diff_inputs(inputs)]

    def warn_bc_breaking():
        warnings.warn(
            "Backwards compatibility: New undefined gradient support checking feature is "
            "enabled by default, but it may break existing callers of this function. If this "
            "is true for you, you can call this function with \"check_undefined_grad=False\" "
            "to disable the feature", stacklevel=4)

    if len(outputs) <= 1:
        return True
    for undef in range(len(outputs)):
        outs = [o for k, o in enumerate(_differentiable_outputs(func(*inputs))) if k != undef]
        try:
            grads = grad(outs, diff, [zeros_like(o.detach()) for o in outs],
                         allow_unused=True)
        except RuntimeError as e:
            warn_bc_breaking()
            raise GradcheckError(
                "Expected backward function to handle undefined output grads. Please look at "
                "\"Notes about undefined output gradients\" in "
                "\"tools/autograd/derivatives.yaml\"") from e
        for gi in grads:
            if gi is not None and not np.all(_to_numpy(gi) == 0):
                warn_bc_breaking()
                raise GradcheckError(
                    "Expected all input grads to be undefined or zero when all output grads "
                    "are undefined or zero. Please look at \"Notes about undefined output "
                    "gradients\" in \"tools/autograd/derivatives.yaml\"")
    return True


def gradcheck(func: Callable, inputs, *, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, raise_exception: bool = True, nondet_tol: float = 0.0,
              check_undefined_grad: bool = True, check_grad_dtypes: bool = False,
              check_batched_grad: bool = False, check_batched_forward_grad: bool = False,
              check_forward_ad: bool = False, check_backward_ad: bool = True,
              fast_mode: bool = False, masked: bool | None = None) -> bool:
    """Check the engine's gradients of ``func`` at ``inputs`` against finite differences.

    Returns True, or raises GradcheckError (returns False with ``raise_exception=False``)
    naming the first output/input pair whose Jacobians disagree. Use float64 inputs: the
    default tolerances assume them.
    """
    if not (check_forward_ad or check_backward_ad):
        raise AssertionError(
            "Expected at least one of check_forward_ad or check_backward_ad to be True")
    if check_batched_grad and not check_backward_ad:
        raise AssertionError(
            "Setting check_batched_grad=True requires check_backward_ad to be True")
    if check_batched_forward_grad and not check_forward_ad:
        raise AssertionError(
            "Setting check_batched_forward_grad=True requires check_forward_ad to be True")
    for option, value in (("check_forward_ad", check_forward_ad),
                          ("check_batched_grad", check_batched_grad),
                          ("check_batched_forward_grad", check_batched_forward_grad)):
        if value:
            raise _not_supported(option)
    try:
        return _gradcheck_helper(func, inputs, eps, atol, rtol, nondet_tol,
                                 check_undefined_grad, check_grad_dtypes, fast_mode)
    except GradcheckError:
        if raise_exception:
            raise
        return False


def _gradcheck_helper(func, inputs, eps, atol, rtol, nondet_tol, check_undefined_grad,
                      check_grad_dtypes, fast_mode) -> bool:
    from .grad_mode import enable_grad

    inputs = _as_tuple(inputs)
    _check_inputs(inputs)
    with enable_grad():  # as in torch, the check records graphs whatever the grad mode
        func_out = _as_tuple(func(*inputs))
        outputs = _differentiable_outputs(func_out)
        check = _fast_gradcheck if fast_mode else _slow_gradcheck
        check(func, func_out, inputs, outputs, eps, rtol, atol, check_grad_dtypes, nondet_tol)
        if outputs:
            _test_backward_mul_by_grad_output(outputs, inputs)
            if check_undefined_grad:
                _test_undefined_backward_mode(func, outputs, inputs)
    return True


def gradgradcheck(func: Callable, inputs, grad_outputs: Sequence | None = None, *,
                  eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
                  gen_non_contig_grad_outputs: bool = False, raise_exception: bool = True,
                  nondet_tol: float = 0.0, check_undefined_grad: bool = True,
                  check_grad_dtypes: bool = False, check_batched_grad: bool = False,
                  check_fwd_over_rev: bool = False, check_rev_over_rev: bool = True,
                  fast_mode: bool = False, masked: bool = False) -> bool:
    """Check second derivatives: gradcheck of the (create_graph) vector-Jacobian product.

    Without ``grad_outputs``, random ones in [-1, 1) are drawn from symgrad's global
    generator (torch draws from its own, so the values differ).
    ``gen_non_contig_grad_outputs`` changes only memory layout in torch; values here are
    the same either way.
    """
    if not (check_fwd_over_rev or check_rev_over_rev):
        raise AssertionError(
            "Expected at least one of check_fwd_over_rev or check_rev_over_rev to be True")
    if check_undefined_grad and not check_rev_over_rev:
        raise AssertionError(
            "Setting check_undefined_grad=True requires check_rev_over_rev to be True")
    if check_batched_grad and not check_rev_over_rev:
        raise AssertionError(
            "Setting check_batched_grad=True requires check_rev_over_rev to be True")
    for option, value in (("check_fwd_over_rev", check_fwd_over_rev),
                          ("check_batched_grad", check_batched_grad)):
        if value:
            raise _not_supported(option)
    from ..creation import rand
    from .engine import grad

    tupled_inputs = _as_tuple(inputs)
    if grad_outputs is None:
        outputs = _differentiable_outputs(func(*tupled_inputs))
        tupled_grad_outputs = tuple(
            (rand(tuple(x.shape), dtype=x.dtype if x.dtype.is_floating_point else None,
                  device=x.device) * 2 - 1).requires_grad_()
            for x in outputs)
    else:
        tupled_grad_outputs = _as_tuple(grad_outputs)
    num_outputs = len(tupled_grad_outputs)
    T = _Tensor()
    diff_input_idx = {i for i, x in enumerate(tupled_inputs)
                      if isinstance(x, T) and x.requires_grad}

    def new_func(*args):
        input_args = args[:-num_outputs] if num_outputs else args
        outs = _differentiable_outputs(func(*input_args))
        gos = args[-num_outputs:] if num_outputs else ()
        diff_args = tuple(x for i, x in enumerate(input_args) if i in diff_input_idx)
        grads = grad(outs, diff_args, gos, create_graph=True, allow_unused=True)
        return tuple(g for g in grads if g is not None)

    return gradcheck(new_func, tupled_inputs + tupled_grad_outputs, eps=eps, atol=atol,
                     rtol=rtol, raise_exception=raise_exception, nondet_tol=nondet_tol,
                     check_undefined_grad=check_undefined_grad,
                     check_grad_dtypes=check_grad_dtypes, fast_mode=fast_mode,
                     masked=masked)
