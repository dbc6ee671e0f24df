"""The default CPU backend: Numba-compiled kernels behind the NumPy reference interface.

Importing this package does not import Numba; the first kernel call does (see
``load_kernels``). ``symgrad.backends.set_cpu_backend("numpy")`` switches back to the
plain reference backend; the environment variable ``SYMGRAD_CPU_BACKEND=numpy`` makes it
the default at start-up.
"""

from .backend import FUSED_MIN, PARALLEL_MIN, CpuBackend, empty_pool, load_kernels, threading_layer

__all__ = ["CpuBackend", "FUSED_MIN", "PARALLEL_MIN", "empty_pool", "load_kernels",
           "threading_layer"]
