"""The CUDA backend's elementwise kernels come from the op stanzas: every generated forward
kernel equals the NumPy reference, and every generated fused backward (each subset of
needed inputs) equals the op's tensor-op formulas on the CPU, broadcasting included."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from _tolerance import assert_close
from test_scalar_stanzas import PARAMS, SAVED_ONLY, _arrays, _params

import symgrad as sg
from symgrad.backends import get_backend
from symgrad.ops import OPS
from symgrad.ops.elementwise import fused_from_stanza, scalar_kernels

CUDA = sg.device("cuda:0")


def _dev(a):
    return sg.tensor(a, device=CUDA)._data if isinstance(a, np.ndarray) else a


@pytest.mark.parametrize("kernel", scalar_kernels())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cuda_forward_kernels_equal_the_reference(kernel, dtype):
    from symgrad.backends.cuda import CudaBackend

    xs, params = _arrays(kernel, dtype, n=40), _params(kernel)
    want = getattr(get_backend("numpy"), kernel)(*xs, **params)
    got = getattr(CudaBackend, kernel)(*(_dev(x) for x in xs), **params)
    got = CudaBackend.to_host(got)
    assert got.dtype == want.dtype
    # one libm call or a few roundings: the device's libm may differ from NumPy's by an ulp
    assert_close(got, want, terms=4)


@pytest.mark.parametrize("op", fused_from_stanza())
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cuda_fused_backward_equals_the_formulas(op, dtype):
    from symgrad.backends.cuda import CudaBackend

    spec = OPS[op]
    xs = _arrays(spec.kernel or op, dtype, n=40, seed=3)
    params = PARAMS.get(op, [{}])[-1]
    values = dict(zip(spec.inputs, xs)) | params | SAVED_ONLY.get(op, {})
    if "result" in spec.saved:
        values["result"] = getattr(get_backend("numpy"), spec.kernel or op)(*xs, **params)
    saved = {p: values[p] for p in spec.saved}
    g = np.random.default_rng(5).standard_normal(40).astype(dtype)
    grads = [i for i, t in enumerate(spec.scalar.grads) if t is not None]
    for k in range(1, len(grads) + 1):
        for subset in itertools.combinations(grads, k):
            needed = tuple(i in subset for i in range(len(spec.inputs)))
            got = getattr(CudaBackend, spec.fused_backward)(
                _dev(g), needed, *(_dev(saved[p]) for p in spec.saved))
            assert got is not None, (op, needed)
            for i, name in enumerate(spec.inputs):
                if not needed[i] or name not in spec.grads:
                    assert got[i] is None
                    continue
                kw = {p: (sg.tensor(saved[p]) if isinstance(saved[p], np.ndarray) else saved[p])
                      for p in spec.formula_params[name]}
                want = spec.grads[name](sg.tensor(g), **kw).numpy()
                assert_close(CudaBackend.to_host(got[i]), want, terms=6)


def test_cuda_fused_backward_broadcasts_a_saved_operand():
    """``x * w`` with w of shape (4,) against a (3, 4) gradient: the fused kernel reads w
    by strides; the engine then sums w's gradient back to (4,)."""
    rng = np.random.default_rng(0)
    x = sg.tensor(rng.standard_normal((3, 4)), device=CUDA, requires_grad=True)
    w = sg.tensor(rng.standard_normal(4), device=CUDA, requires_grad=True)
    (x * w).sum().backward()
    xc = sg.tensor(x.detach().cpu().numpy(), requires_grad=True)
    wc = sg.tensor(w.detach().cpu().numpy(), requires_grad=True)
    (xc * wc).sum().backward()
    assert_close(x.grad.cpu(), xc.grad)
    assert_close(w.grad.cpu(), wc.grad, terms=3)
