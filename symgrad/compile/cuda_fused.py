"""A fused elementwise run (fwdbwd.py's derivation) as numba.cuda kernels.

The same SymPy-derived loop bodies as the CPU form, derived with ``simd=False`` (on the
GPU a transcendental function is cheap inside the kernel, so forward values and partials
come out of one kernel), under a grid-stride loop, with the scalar vocabulary bound to the
CUDA backend's own device functions (``symgrad.backends.cuda.kernels.CUDA_MATH``, the
ones its stanza kernels use). Arrays stay on the device: the kernels read and write the
backend's device buffers.

``sg.compile`` of a CUDA step (cuda_step.py) runs each run fwdbwd designs with these
kernels (docs/compile.md, "CUDA steps").
"""

from __future__ import annotations

import re

from . import fwdbwd

__all__ = ["module_text", "load", "derive", "forward", "backward", "flat"]

_VOCAB = ("exp", "log", "sin", "cos", "tanh", "sqrt", "sign", "where", "maximum", "log1p",
          "expm1", "erf", "pi")
PRELUDE = ["import numpy as np", "from numba import cuda", "",
           "from symgrad.backends.cuda.kernels import CUDA_MATH", "",
           "m_abs = abs",
           *(f"m_{f} = CUDA_MATH[{f!r}]" for f in _VOCAB), ""]


def _to_cuda(text: str) -> str:
    """A CPU loop of fwdbwd (``@njit``, ``for k in range(a.size)``) as a grid-stride kernel."""
    text = re.sub(r"@njit\(.*\)", "@cuda.jit", text)
    return re.sub(r"for k in (?:p?range)\((\w+)\.size\):",
                  r"for k in range(cuda.grid(1), \1.size, cuda.gridsize(1)):", text)


def module_text(name: str, code: dict) -> str:
    """The module of one run's kernels: ``{name}_<k>`` per loop stage, ``{name}_b``."""
    if any(st[0] != "loop" for st in code["stages"]):
        raise ValueError("derive the run with simd=False for CUDA")
    lines = list(PRELUDE)
    for _, body, _ in code["kernels"]:
        lines += [_to_cuda(body.replace("@@", name)), ""]
    if code["backward"]:
        lines += [_to_cuda(code["backward"]["text"].replace("@@", name)), ""]
    return "\n".join(lines)


def load(name: str, code: dict):
    """Import the kernels' module (a file in the compile cache dir, as the CPU steps')."""
    from .._codefiles import import_text
    from .loader import cache_dir

    return import_text(module_text(name, code), cache_dir(), "symgrad_cudafused")


def derive(group, design: fwdbwd.Design) -> dict:
    """fwdbwd's derivation of ``group`` in its CUDA form (one loop: no ufunc stages)."""
    return fwdbwd.derived(fwdbwd.describe(group, design, False, simd=False))


def _geometry(n: int) -> tuple[int, int]:
    from ..backends.cuda import kernels

    return min(max(1, -(-n // kernels.EW_TPB)), kernels.EW_MAX_BLOCKS), kernels.EW_TPB


def forward(module, name: str, code: dict, buffers: dict) -> None:
    """Launch the forward kernels; ``buffers`` maps the stage parameter names (``in0``,
    ``ex3``, ``p3_0``, ``r1``) to flat device arrays of the run's size."""
    from ..backends.cuda import kernels

    for _, suffix, params in code["stages"]:
        args = [buffers[p] for p in params]
        kernels.launch(getattr(module, name + suffix), *_geometry(args[0].size), *args)


def backward(module, name: str, code: dict, buffers: dict) -> None:
    """Launch ``r_j = sum_s g_s * P[s][j]`` (``e<s>``: the seeds' incoming gradients)."""
    from ..backends.cuda import kernels

    b = code["backward"]
    if b is None:
        return
    args = [buffers[p] for p in b["params"]]
    kernels.launch(getattr(module, name + "_b"), *_geometry(args[0].size), *args)


def flat(a):
    """The 1-D device view of a contiguous CudaArray (no copy) that the kernels take."""
    if not a.is_contiguous:
        raise ValueError("a fused CUDA run takes contiguous arrays")
    return a.buf[a.offset:a.offset + a.size]
