"""A straight-line ``apply`` generated per op for the common call: every tensor shares one
floating dtype and device, Python numbers elsewhere, one output that is not a view.

``function.apply`` is general: it loops over the inputs, promotes and casts dtypes, handles
several outputs and views, and ``_record`` loops again to build the node. Per op that is
~2 µs of Python where PyTorch's whole call costs ~1.9 µs. The function generated here does
the same work for the common call with the loops unrolled for the op's arity and the dtype
rule settled when it is built; any other call (a leading number, mixed dtypes, integer
tensors, an unusual input, anomaly mode) goes to the general path unchanged, so both give
the same tensors and the same nodes (tests/test_eager_fast_path.py compares them).
"""

from __future__ import annotations

import os
import re
import sys
import warnings

import numpy as np

from ..backends import small_kernel
from ..ops.scalar import define

#: dtype rules whose result, when every tensor has one floating dtype d, is d with no cast
#: (function._result_dtype; Python numbers never promote a floating tensor)
FAST_RULES = frozenset(("promote", "same", "float", "promote_float", "same_required"))


#: The module name of the generated lines. NumPy's floating-point warnings raised while
#: they run (overflow in a multiply, inf * 0 ...) are turned into exceptions by the filter
#: below, caught by the line (a try costs nothing until it catches) and said again by
#: :func:`fp_warning` at the user's line, naming the op: ``mul: overflow encountered in
#: multiply`` instead of NumPy's location inside generated code.
FAST_MODULE = "symgrad._fast"
_FILTER_MODULE = re.escape(FAST_MODULE) + r"\Z"
#: the ``warnings.filters`` list the filter was last seen in: ``catch_warnings`` (pytest
#: wraps every test and the collection in one) swaps the list, dropping a filter added
#: inside it, so each line checks the list is the one seen (one identity test)
_SEEN: list = [None]


def fp_filter() -> None:
    """Make sure the filter turning NumPy's warnings in FAST_MODULE into exceptions is in
    ``warnings.filters`` (front, when missing)."""
    filters = warnings.filters
    if not any(f[0] == "error" and f[2] is RuntimeWarning and f[3] is not None
               and f[3].pattern == _FILTER_MODULE for f in filters):
        warnings.filterwarnings("error", category=RuntimeWarning, module=_FILTER_MODULE)
    _SEEN[0] = warnings.filters

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_frame():
    """The innermost frame outside symgrad (its files and its generated code)."""
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith(("<symgrad", _PACKAGE))):
        f = f.f_back
    return f


def warn_at_user(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """``warnings.warn`` attributed to the user's line (see :func:`user_frame`)."""
    f = user_frame()
    if f is None:
        warnings.warn(message, category, stacklevel=2)
        return
    g = f.f_globals
    warnings.warn_explicit(message, category, f.f_code.co_filename, f.f_lineno,
                           module=g.get("__name__", "<string>"),
                           registry=g.setdefault("__warningregistry__", {}), module_globals=g)


def fp_warning(spec, exc: RuntimeWarning, be, arrays: tuple, params: dict):
    """The op again with NumPy's warnings off (the same values), and NumPy's warning said
    at the user's line with the op's name."""
    with np.errstate(all="ignore"):
        out = spec.forward(be, *arrays, **params)
    warn_at_user(f"{spec.name}: {exc}", type(exc))
    return out


def eligible(spec) -> bool:
    return len(spec.outputs) == 1 and not spec.view and spec.dtype_rule in FAST_RULES


def source(spec, saved_display) -> str:
    """The text of ``fast(inputs, params)`` for ``spec``'s arity; ``saved_display(spec,
    needs)`` gives the save plan as a dict display (function._saved_display)."""
    n = len(spec.inputs)
    xs = ", ".join(f"x{i}" for i in range(n)) + ("," if n == 1 else "")
    lines = [
        "def fast(inputs, params=None):",
        "    if fn_module._profiler is not None:",
        "        return fn_module._profiler._record_op(spec, inputs, params)",
        "    try:",
        f"        {xs} = inputs",
        "    except ValueError:",
        "        return general(spec, inputs, params)",
        "    if not isinstance(x0, Tensor):",
        "        return general(spec, inputs, params)",
        "    a0 = x0._data",
        "    d = a0.dtype",
        "    dev = x0._device",
        "    rg = x0._requires_grad",
    ]
    for i in range(1, n):
        lines += [
            f"    if isinstance(x{i}, Tensor):",
            f"        t{i} = True",
            f"        a{i} = x{i}._data",
            f"        if a{i}.dtype is not d or x{i}._device is not dev:",
            "            return general(spec, inputs, params)",
            f"        if x{i}._requires_grad:",
            "            rg = True",
            f"    elif type(x{i}) is float or type(x{i}) is int:",
            f"        t{i} = False",
            f"        a{i} = x{i}",
            "    else:",
            "        return general(spec, inputs, params)",
        ]
    arrays = ", ".join(f"a{i}" for i in range(n))
    # an elementwise op's default forward only calls the backend's stanza kernel; add's
    # and sub's do so at their default alpha (``kernel_params``)
    kernel = getattr(spec.forward, "backend_kernel", None)
    small = kernel is not None and small_kernel(kernel) is not None
    plain = "not params" if not getattr(spec.forward, "kernel_params", None) \
        else "params == kernel_params"
    lines += [
        "    dt = DT_OF[d]",
        "    if not dt.is_floating_point or dt.compute is not None:",
        "        return general(spec, inputs, params)",
        "    if warnings_module.filters is not fp_seen[0]:",
        "        fp_filter()",
        "    try:",
        "        be = BACKENDS[DEVICE_DEFAULT[dev.type]]",
        "    except KeyError:",
        "        return general(spec, inputs, params)",
        "    if params is None:",
        "        params = {}",
        "    try:",
        *([f"        if {plain} and spec.forward is stanza_forward:",
           *(["            if be is small_be and a0.size < limits.PARALLEL_MIN:",
              f"                out = small_fn({arrays})",
              "            else:",
              f"                out = be.{kernel}({arrays})"] if small else
             [f"            out = be.{kernel}({arrays})"]),
           "        else:",
           f"            out = spec.forward(be, {arrays}, **params)"] if kernel else
          [f"        out = spec.forward(be, {arrays}, **params)"]),
        "    except ValueError as exc:",
        "        raise shape_error(spec, inputs, exc) from None",
        "    except RuntimeWarning as exc:",  # NumPy's overflow/invalid, raised (FAST_MODULE)
        f"        out = fp_warning(spec, exc, be, ({arrays},), params)",
        "    if type(out) is not ndarray:",
        "        out = as_array(out)",
        "    if out.dtype is not d and out.dtype != d:",
        "        out = be.cast(out, dt.np)",
        # Tensor._wrap written out (tests/test_eager_fast_path.py compares every slot)
        "    result = new(Tensor)",
        "    result._data = out",
        # memory.new_storage written out
        "    storage = new(Storage)",
        "    storage.nbytes = nbytes = out.nbytes",
        "    storage.device_type = kind = dev.type",
        "    storage.version = 0",
        "    now = live[kind] = live[kind] + nbytes",
        "    if now > peak[kind]:",
        "        peak[kind] = now",
        "    result._storage = storage",
        "    result._device = dev",
        "    result._retains_grad = False",
        "    result._grad = result._accumulator = result._backward_hooks = result.name = \\",
        "        result._weak = None",
        "    result._output_nr = 0",
    ]
    no_graph = ["result._requires_grad = False", "result._grad_fn = None"]
    if spec.grad_fn is None:
        return "\n".join(lines + ["    " + x for x in no_graph] + ["    return result", ""])
    lines += [
        "    if not rg or not state.enabled:",
        *["        " + x for x in no_graph],
        "        return result",
        "    if anomaly.enabled:",
        *["        " + x for x in no_graph],
        "        record(spec, inputs, params, (result,))",
        "        return result",
        # Node.__init__ written out
        "    node = new(node_cls)",
        "    node._sequence_nr = next_sequence()",
        "    node._module_call = module_calls.top",
        "    node._metadata = node._pre_hooks = node._hooks = node._tensor_hooks = \\",
        "        node._retained = None",
        "    needs = 0",
    ]
    for i in range(n):
        tensor = "" if i == 0 else f"t{i} and "
        lines += [
            f"    if {tensor}x{i}._requires_grad:",
            f"        fn = x{i}._grad_fn",
            "        if fn is not None:",
            f"            e{i} = (fn, x{i}._output_nr)",
            "        else:",
            f"            ref = x{i}._accumulator",
            "            acc = ref() if ref is not None else None",
            f"            e{i} = (acc if acc is not None else accumulator_of(x{i}), 0)",
            f"        needs |= {1 << i}",
            "    else:",
            f"        e{i} = NO_EDGE",
        ]
    edges = ", ".join(f"e{i}" for i in range(n)) + ("," if n == 1 else "")
    strong = ", ".join(f"x{i}" for i in range(n)) + ("," if n == 1 else "")
    weak = ", ".join(["w0"] + [f"w{i}" for i in range(1, n)]) + ("," if n == 1 else "")
    differs = " or ".join(["a0.shape != shape"]
                          + [f"(t{i} and a{i}.shape != shape)" for i in range(1, n)])
    metas = ", ".join(["(a0.shape, dt)"] + [f"(a{i}.shape, dt) if t{i} else None"
                                             for i in range(1, n)]) + ("," if n == 1 else "")
    lines += [
        f"    node.next_functions = ({edges})",
        "    if recording:",
        f"        node._input_refs = ({strong})",
        "        keep(node, inputs)",
        "    else:",
        *_weak_refs(n),
        f"        node._input_refs = ({weak})",
        "    shape = out.shape",
        f"    node._input_meta = ({metas}) if {differs} else None",
        "    node._out_meta = ((shape, dt),)",
        "    node._freed = False",
        "    node._params = params",
        *_inline_savers(spec, n, saved_display),
        "    result._grad_fn = node",
        "    result._requires_grad = True",
        "    return result",
        "",
    ]
    return "\n".join(lines)


def method_source(spec, saved_display, params: str) -> str:
    """The straight line as a binary Tensor method ``fast(x0, x1)`` (``a + b``): one Python
    call and one tuple fewer than ``functional.add``'s route. ``params`` is the display
    of the op's parameters at their defaults (``{'alpha': 1}``); anything off the line, and
    a call while a profiler or tracer is set, goes to ``fallback`` (the functional form)."""
    if len(spec.inputs) != 2:
        raise ValueError("method_source is for binary ops")
    head = source(spec, saved_display).split("\n")
    start = head.index("    if not isinstance(x0, Tensor):")
    lines = ["def fast(x0, x1):",
             "    if fn_module._profiler is not None:",
             "        return fallback(x0, x1)",
             f"    params = {params}"] + head[start:]
    text = "\n".join(lines).replace("    if params is None:\n        params = {}\n", "")
    text = text.replace("general(spec, inputs, params)", "fallback(x0, x1)")
    return re.sub(r"\binputs\b", "(x0, x1)", text)


def _weak_refs(n: int) -> list[str]:
    """``w<i>``: input i's weak reference to itself (made once per tensor, ``_weak``), or the
    number itself."""
    lines = []
    for i in range(n):
        pad = "        " if i == 0 else "            "
        if i:
            lines += [f"        w{i} = x{i}", f"        if t{i}:"]
        lines += [f"{pad}w{i} = x{i}._weak", f"{pad}if w{i} is None:",
                  f"{pad}    w{i} = x{i}._weak = wref(x{i})"]
    return lines


def _inline_savers(spec, n: int, saved_display) -> list[str]:
    """``node._saved = {...}``: the save plan of each set of inputs needing a gradient
    written inline for ops of one or two inputs (a call less), the saver call otherwise."""
    call = ["saver = savers.get(needs)",
            "node._saved = (saver or make_saver(spec, needs))(inputs, params, (result,))"]
    if n > 2:
        return ["    " + line for line in call]
    branches = []
    for needs in range(1, 1 << n):
        display = saved_display(spec, needs).replace("outputs[0]", "result")
        for j in range(n):  # whether x_j is a tensor is known: t_j (x0 always is)
            display = display.replace(f"isinstance(inputs[{j}], Tensor)",
                                      f"t{j}" if j else "True")
            display = display.replace(f"inputs[{j}]", f"x{j}")
        display = display.replace(" if True else save_number(x0)", "")
        if "outputs" not in display and "inputs" not in display:
            branches.append((needs, display))
    if not branches:
        return ["    " + line for line in call]
    if n == 1:  # needs is 1
        return [f"    node._saved = {branches[0][1]}"]
    lines = []
    for k, (needs, display) in enumerate(branches):
        last = k == len(branches) - 1 and len(branches) == (1 << n) - 1
        test = "else" if last else f"{'if' if k == 0 else 'elif'} needs == {needs}"
        lines += [f"    {test}:", f"        node._saved = {display}"]
    if len(branches) < (1 << n) - 1:
        lines += ["    else:"] + ["        " + line for line in call]
    return lines


def _op_namespace(spec, namespace: dict) -> dict:
    """``namespace`` (function._entry_namespace) plus what one op's line reads."""
    kernel = getattr(spec.forward, "backend_kernel", None)
    small_be, small_fn, limits = (kernel and small_kernel(kernel)) or (None, None, None)
    return {**namespace, "__name__": FAST_MODULE, "fp_warning": fp_warning,
            "fp_filter": fp_filter, "fp_seen": _SEEN, "warnings_module": warnings,
            "spec": spec, "stanza_forward": spec.forward,
            "kernel_params": getattr(spec.forward, "kernel_params", None),
            "savers": spec.__dict__.setdefault("_savers", {}),
            "small_be": small_be, "small_fn": small_fn, "limits": limits}


def build_method(spec, namespace: dict, params: str, fallback):
    """``method_source``'s function for ``spec``, named and documented as ``fallback``."""
    glb = define(method_source(spec, namespace["saved_display"], params),
                 f"<symgrad fast method {spec.name}>",
                 {**_op_namespace(spec, namespace), "fallback": fallback})
    fast = glb["fast"]
    fast.__name__, fast.__qualname__, fast.__doc__ = \
        fallback.__name__, fallback.__qualname__, fallback.__doc__
    return fast


def build(spec, namespace: dict):
    """``fast`` for ``spec``, or None when the op's calls never fit the straight line."""
    if not eligible(spec):
        return None
    return define(source(spec, namespace["saved_display"]), f"<symgrad fast apply {spec.name}>",
                  _op_namespace(spec, namespace))["fast"]
