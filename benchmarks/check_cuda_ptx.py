"""Compile every kernel variant of the CUDA backend to PTX, without a GPU.

The simulator tests run the kernels' Python; this checks that numba.cuda can *type and
compile* each of them for a real GPU (sm_90), which the simulator never does. Device memory
is replaced by NumPy arrays and every launch is intercepted and compiled for the argument
types it would get. Needs NVVM (``pip install 'numba-cuda[cu13]'``), no GPU or driver.
Usage: ``python benchmarks/check_cuda_ptx.py`` (exit status 1 if any variant fails).
"""
# ruff: noqa: E402, E501, E702
import os
import sys

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    sys.exit("check_cuda_ptx: unset NUMBA_ENABLE_CUDASIM (this compiles for a real GPU)")

import numba
import numba.cuda.dispatcher as _disp
import numpy as np
from numba import cuda


class _FakeDev:
    compute_capability = (9, 0)


_disp.get_current_device = lambda: _FakeDev()  # device functions compile for sm_90
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from symgrad.backends.cuda import allocator
from symgrad.backends.cuda import backend as BE
from symgrad.backends.cuda import kernels as K

allocator._raw_alloc = lambda n: np.zeros(n, np.uint8)
done, failed = set(), []

def fake_launch(kernel, grid, block, *args):
    K.stats["launches"] += 1
    sig = tuple(numba.typeof(a) for a in args)
    key = (kernel.py_func.__name__, sig)
    if key in done:
        return
    done.add(key)
    try:
        cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
    except Exception as e:
        failed.append((key, repr(e)[:3000]))
K.launch = fake_launch
K._ERR = np.zeros(1, np.int32)

def from_host(x):
    a = np.asarray(x)
    out = BE._new(a.shape, a.dtype)
    out.buf[:] = a.reshape(-1)
    return out
BE.CudaBackend.from_host = staticmethod(from_host)
B = BE.CudaBackend
F32, F64, I64 = np.float32, np.float64, np.int64
for dt in (F32, F64):
    a = B.from_host(np.ones((3, 4), dt)); b = B.from_host(np.ones((4,), dt))
    at = B.transpose(a, (1, 0))
    for name in ("neg exp log sin cos tanh sigmoid sqrt reciprocal abs sign relu logical_not").split():
        getattr(B, name)(a); getattr(B, name)(at)
    for name in "add sub mul div gt ge lt le eq ne maximum minimum logical_or logical_and pow".split():
        getattr(B, name)(a, b); getattr(B, name)(a, 2.0); getattr(B, name)(2, a); getattr(B, name)(a, a)
    B.where(B.gt(a, 0), a, b); B.where(B.gt(a, 0), a, 0.0)
    B.addcmul(a, a, b, 0.5)
    for nm in "exp log sin cos tanh sigmoid sqrt relu abs reciprocal".split():
        getattr(B, nm + "_backward")(a, (True,), a)
    B.neg_backward(a, (True,)); B.sign_backward(a, (True,)); B.pow_backward(a, (True,), 3.0, a)
    B.mul_backward(a, (True, True), a, a); B.div_backward(a, (True, True), a, a); B.div_backward(a, (False, True), a, a)
    B.where_backward(a, (False, True, True), B.gt(a, 0)); B.where_backward(a, (False, True, False), B.gt(a, 0))
    for ax in (None, 1, (0,)):
        B.sum(a, ax); B.mean(a, ax); B.amax(a, ax); B.amin(a, ax); B.argmax(a, ax if ax != (0,) else 0); B.argmin(a, 1)
    big = B.from_host(np.ones(10000, dt)); B.sum(big); B.mean(big); B.amax(big)
    B.sum(a, None, False, np.float64)
    B.matmul(a, B.from_host(np.ones((4, 5), dt))); B.matmul(at, a); B.matmul(b, b)
    B.matmul(B.from_host(np.ones((2, 3, 4), dt)), B.from_host(np.ones((4, 2), dt)))
    B.cast(a, I64); B.cast(a, np.bool_); B.cast(a, F64 if dt == F32 else F32); B.copy(at)
    B.reshape(at, (12,)); B.concatenate([a, a], 0); B.stack([a, a], 1)
    B.full((3,), 1.5, dt); B.random((5,), dt, False, 1); B.random((5,), dt, True, 1)
    idx = B.from_host(np.array([0, 2], I64))
    B.getitem(a, (idx,)); B.getitem(a, (slice(None), idx)); B.getitem(a, (idx, idx))
    B.index_put(a, (idx,), b, True); B.index_put(a, (idx,), b, False); B.index_put(a, (idx, idx), 1.0, True)
    B.fill_(at, 2.0); B.copy_(at, B.transpose(a, (1, 0))); B.add_(a, b); B.sub_(at, 1.0); B.mul_(a, a); B.div_(a, 2)
    B.copy_(a, B.from_host(np.ones((3, 4), I64)))
ia = B.from_host(np.ones((3, 4), I64))
B.sum(ia); B.sum(B.gt(ia, 0)); B.amax(ia, 1); B.argmax(ia, 1); B.pow(ia, 2); B.add(ia, 1); B.matmul(ia, B.transpose(ia, (1, 0)))
B.arange(0, 5, 1, I64); B.arange(0.0, 1.0, 0.25, F32)
B.index_put(ia, (B.from_host(np.array([0, 0], I64)),), 1, True)
B.add_(ia, 1.5); B.amax(B.gt(ia, 0), 1)
print(len(done), "kernel variants compiled;", len(failed), "failed")
for key, err in failed:
    print(key[0], [str(t) for t in key[1]][:6], "\n   ", err[:1500])
sys.exit(1 if failed else 0)
