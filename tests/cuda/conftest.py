"""CUDA tests: run under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba
is imported, so in its own pytest run: ``make test`` has a line for it) or on a real GPU
(``SYMGRAD_TEST_CUDA=1``). The main test run, simulator-free, does not collect them."""

from __future__ import annotations

import os

import pytest

_ON = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("SYMGRAD_TEST_CUDA") == "1"

if not _ON:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def counters():
    """Kernel launches and host<->device transfers, counted at numba's own entry points."""
    from tests.cuda._count import Counter

    with Counter() as c:
        yield c
