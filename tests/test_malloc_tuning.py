"""The CPU backend's glibc malloc settings (backend._tune_malloc): an eager step's blocks of
64-256 KiB come from a heap whose top is not given back to the system and faulted in again
every step (an eager GPT step: ~220 page faults and ~1 ms of system time a step)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from symgrad.backends.cpu import backend

# A step's worth of arrays: 14 blocks of 256 KiB (3.5 MiB of heap) made and freed, 20 times
# after a warm-up; prints the minor page faults of the 20 steps.
_STEPS = """
import json, resource
import numpy as np
import symgrad
from symgrad.backends.cpu import backend

def step():
    arrays = [np.ones(65536, np.float32) for _ in range(14)]
    del arrays

for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(json.dumps([backend.MALLOC_TUNED,
                  resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before]))
"""

#: 3.5 MiB of 4 KiB pages: what one step faults in when the heap top was trimmed
_PAGES_PER_STEP = 14 * 65536 * 4 // 4096


def _faults(env_value: str | None) -> tuple[bool, int]:
    env = {k: v for k, v in os.environ.items() if k != "SYMGRAD_MALLOPT"}
    if env_value is not None:
        env["SYMGRAD_MALLOPT"] = env_value
    out = subprocess.run([sys.executable, "-c", _STEPS], capture_output=True, text=True,
                         env=env, timeout=120, check=True).stdout
    tuned, faults = json.loads(out.strip().splitlines()[-1])
    return tuned, faults


@pytest.mark.skipif(not backend.MALLOC_TUNED, reason="glibc's malloc only")
def test_heap_top_stays_mapped_between_steps():
    tuned, faults = _faults(None)
    assert tuned
    # fewer than one step's pages over 20 steps: the heap top was not trimmed between steps
    assert faults < _PAGES_PER_STEP, faults
    # the opt-out keeps glibc's adaptive trimming, which faults the heap in again each step
    # (the check above would fail without the settings)
    off, faults_off = _faults("0")
    assert not off
    assert faults_off > 10 * _PAGES_PER_STEP, faults_off
