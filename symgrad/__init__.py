"""symgrad: a PyTorch-shaped autograd engine whose gradients you can see and prove.

``import symgrad as sg`` gives torch-like tensors, autograd and (lazily) the SymPy
verifier. Importing stays light: SymPy, symengine, numba.cuda and ipywidgets load on
first use.
"""

from __future__ import annotations

from . import accelerator, amp, autograd, backends, cuda, func, nn, ops, optim, utils
from ._random import Generator
from .amp import autocast
from .autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled

# torch's attribute paths to submodules that their packages do not import (the packages sit
# below what these import): torch.cuda.amp, torch.backends.cudnn / .cuda.matmul / .mps ...
from .backends import cuda as _backends_cuda  # noqa: F401
from .backends import cudnn as _backends_cudnn  # noqa: F401
from .backends import mkldnn as _backends_mkldnn  # noqa: F401
from .backends import mps as _backends_mps  # noqa: F401
from .backends import openmp as _backends_openmp  # noqa: F401
from .compile import compile  # noqa: A004  (torch.compile's name, as torch shadows it)
from .creation import (
    arange,
    empty,
    empty_like,
    eye,
    from_numpy,
    full,
    full_like,
    get_default_device,
    linspace,
    manual_seed,
    ones,
    ones_like,
    rand,
    randint,
    randn,
    set_default_device,
    zeros,
    zeros_like,
)
from .cuda import amp as _cuda_amp  # noqa: F401
from .device import device
from .dtypes import bool_ as bool  # noqa: A001
from .dtypes import (
    dtype,
    float16,
    float32,
    float64,
    get_default_dtype,
    int8,
    int16,
    int32,
    int64,
    promote_types,
    set_default_dtype,
    uint8,
)
from .func import vmap
from .functional import (
    abs,
    abs_,
    add,
    addcmul,
    allclose,
    arctan2,
    argmax,
    argmin,
    atan2,
    baddbmm,
    bmm,
    cat,
    clamp,
    clamp_,
    clamp_max,
    clamp_max_,
    clamp_min,
    clamp_min_,
    clip_,
    clone,
    cos,
    cos_,
    div,
    dot,
    eq,
    equal,
    erf,
    erf_,
    exp,
    exp_,
    expand,
    expm1,
    expm1_,
    flatten,
    ge,
    gt,
    hypot,
    isclose,
    le,
    log,
    log1p,
    log1p_,
    log2,
    log2_,
    log10,
    log10_,
    log_,
    log_softmax,
    logical_not,
    logsumexp,
    lt,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    mm,
    mul,
    mv,
    narrow,
    ne,
    neg,
    neg_,
    negative_,
    permute,
    pow,
    prod,
    reciprocal,
    reciprocal_,
    relu,
    relu_,
    reshape,
    select,
    sigmoid,
    sigmoid_,
    sign,
    sin,
    sin_,
    softmax,
    sqrt,
    sqrt_,
    squeeze,
    stack,
    sub,
    sum,
    t,
    tanh,
    tanh_,
    transpose,
    unsqueeze,
    view,
    where,
)
from .functional import all_ as all  # noqa: A004 - torch.all
from .functional import any_ as any  # noqa: A004 - torch.any
from .memory import max_memory_allocated, memory_allocated, reset_peak_memory_stats
from .serialization import load, save
from .tensor import (
    BoolTensor,
    ByteTensor,
    CharTensor,
    DoubleTensor,
    FloatTensor,
    HalfTensor,
    IntTensor,
    LongTensor,
    ShortTensor,
    Size,
    Tensor,
    tensor,
)

float = float32  # noqa: A001
double = float64
long = int64
half = float16
short = int16

__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:
    """``%load_ext symgrad``: the ``%symgrad``/``%%symgrad`` magics and rich grad_fn display."""
    from .jupyter import load_ipython_extension as _load

    _load(ipython)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where JupyterLab finds the prebuilt renderer (built from labextension/)."""
    return [{"src": "labextension", "dest": "symgrad"}]


def graph(root, names=None, report=None, *, collapse=None, focus=None):
    """The graph behind ``root``, displayable as JSON + static SVG + text (notebooks).

    Nodes are grouped by the ``nn.Module`` call that made them, each box with its verdict
    from ``report``; ``collapse`` (None: a big graph shows its top-level modules; True,
    False, a depth, or paths) and ``focus`` (a module path shown on its own): see
    :func:`symgrad.jupyter.graph.graph`."""
    from .jupyter.graph import graph as _graph

    return _graph(root, names, report, collapse=collapse, focus=focus)


from .autograd.record import record  # noqa: E402  (core autograd; no SymPy)


def verify(root, gradient=None, **kwargs):
    """Check the gradients of ``root`` against SymPy (lazy: SymPy loads on first use).

    See :func:`symgrad.symbolic.verify` for the keywords (names, mode, order, rtol,
    atol, sample, seed, timeout, backend) and docs/verifier.md.
    """
    from .symbolic import verify as _verify

    _refuse_bfloat16(root)
    return _verify(root, gradient, **kwargs)


def _refuse_bfloat16(root) -> None:
    """The verifier's rounding bounds read NumPy's float dtypes, and bfloat16 (an ml_dtypes
    extension dtype) is not one of them: rather than a false alarm, say so."""
    from . import dtypes as _dtypes

    if not isinstance(root, Tensor) or _dtypes._BFLOAT16 is None:  # no bfloat16 tensor yet
        return
    _bf16 = _dtypes._BFLOAT16
    seen, stack = set(), [root.grad_fn]
    found = root.dtype is _bf16
    while stack and not found:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        metas = list(getattr(node, "_out_meta", None) or ()) + \
            [m for m in (getattr(node, "_input_meta", None) or ()) if m is not None]
        # (this module's ``any`` is torch.any: a plain loop instead)
        found = var is not None and var.dtype is _bf16
        for m in metas:
            found = found or m[1] is _bf16
        stack.extend(fn for fn, _ in getattr(node, "next_functions", ()))
    if found:
        raise NotImplementedError(
            "symgrad.verify does not check graphs with bfloat16 tensors yet (its rounding "
            "bounds cover float16, float32 and float64): verify the same computation in "
            "float32 (model.float(), x.float())")


def capture_torch():
    """``with symgrad.capture_torch():`` records a PyTorch forward with its values, so
    ``symgrad.verify(torch_loss)`` can read operands torch itself never saved."""
    from .symbolic import capture_torch as _capture

    return _capture()


__all__ = [
    "Tensor", "Size", "tensor", "dtype", "device", "float32", "float64", "int64", "bool",
    "float", "double", "long", "autograd", "cuda", "ops", "utils",
    "no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled",
    "zeros", "ones", "full", "empty", "zeros_like", "ones_like", "full_like", "empty_like",
    "eye", "arange", "linspace", "rand", "randn", "randint", "from_numpy", "manual_seed",
    "add", "addcmul", "sub", "mul", "div", "neg", "pow", "exp", "log", "sin", "cos", "tanh",
    "sigmoid", "log1p", "expm1", "erf", "atan2", "arctan2", "hypot",
    "relu", "sqrt", "abs", "sign", "reciprocal", "sum", "mean", "matmul", "mm", "mv", "dot",
    "t", "transpose", "permute", "reshape", "view", "flatten", "squeeze", "unsqueeze",
    "expand", "clone", "where", "eq", "ne", "gt", "ge", "lt", "le", "logical_not",
    "bmm", "baddbmm", "cat", "stack", "max", "min", "argmax", "argmin", "maximum", "minimum",
    "clamp",
    "clamp_min", "clamp_max", "softmax", "log_softmax", "logsumexp", "select", "narrow",
    "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats",
    "nn", "optim", "save", "load",
    "verify", "record", "capture_torch",
    "FloatTensor", "DoubleTensor", "LongTensor", "BoolTensor", "equal", "allclose", "isclose",
    "set_default_dtype", "get_default_dtype", "set_default_device", "get_default_device",
    "neg_", "negative_", "reciprocal_", "exp_", "log_", "sin_", "cos_", "tanh_", "sigmoid_",
    "sqrt_", "relu_", "abs_", "log1p_", "expm1_", "erf_", "clamp_", "clip_", "clamp_min_",
    "clamp_max_",
    "func", "vmap", "Generator", "compile", "accelerator", "amp", "autocast", "backends",
    "all", "any", "prod", "log2", "log2_", "log10", "log10_",
]

# -- convolution and pooling (issue 21): the functions torch also has at top level
from .nn._conv_functional import conv1d, conv2d  # noqa: E402
from .nn._conv_functional import max_pool2d_values as max_pool2d  # noqa: E402

__all__ += ["conv1d", "conv2d", "max_pool2d"]

# -- tensor functions and normalisation (issue 21) ---------------------------------------------
from . import linalg  # noqa: E402
from .tensor_functions import (  # noqa: E402
    argsort,
    chunk,
    cumprod,
    cumsum,
    diagonal,
    einsum,
    flip,
    gather,
    index_add,
    index_select,
    masked_fill,
    multinomial,
    norm,
    outer,
    roll,
    scatter,
    scatter_add,
    sort,
    split,
    std,
    take_along_dim,
    tensor_split,
    tile,
    topk,
    tril,
    triu,
    unbind,
    unique,
    var,
)

__all__ += ["linalg", "gather", "scatter", "scatter_add", "take_along_dim", "index_select",
            "index_add", "masked_fill", "cumsum", "cumprod", "flip", "var", "std", "norm",
            "sort", "argsort", "topk", "tril", "triu", "roll", "tile", "outer", "einsum",
            "split", "chunk", "unbind", "tensor_split", "diagonal", "unique", "multinomial"]

# -- half precision and the narrow integers (issue 31) ------------------------------------------
__all__ += ["float16", "half", "bfloat16", "int32", "int", "int16", "short", "int8", "uint8",
            "promote_types", "HalfTensor", "BFloat16Tensor", "IntTensor", "ShortTensor",
            "CharTensor", "ByteTensor"]
int = int32  # noqa: A001 - torch.int (bound last: this module's code above uses the builtin)


def __getattr__(name: str):
    """``bfloat16`` and ``BFloat16Tensor`` on first use: they import ml_dtypes, whose dtype
    registration would cost every ``import symgrad`` 30-50 ms."""
    if name == "bfloat16":
        from .dtypes import _bfloat16

        return _bfloat16()
    if name == "BFloat16Tensor":
        import sys

        return sys.modules[__name__ + ".tensor"].BFloat16Tensor  # (``tensor`` is the function)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
