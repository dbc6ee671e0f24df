"""The memory trace of tests/test_memory_trace.py on the CUDA device (small layer sizes:
the simulator is slow), byte-exact against the same formula."""

from __future__ import annotations

from tests.test_memory_trace import SMALL, check_memory_trace


def test_memory_trace_on_cuda_is_byte_exact(no_gc):
    check_memory_trace("cuda", SMALL)
