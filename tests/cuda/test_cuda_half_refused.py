"""float16/bfloat16 have no CUDA kernels in symgrad: every way onto the device says so."""

from __future__ import annotations

import pytest

import symgrad as sg


@pytest.mark.parametrize("make", [
    lambda: sg.ones(2, dtype=sg.float16).cuda(),
    lambda: sg.zeros(2, dtype=sg.bfloat16, device="cuda"),
    lambda: sg.rand(2, dtype=sg.float16, device="cuda"),
    lambda: sg.tensor([1.0], dtype=sg.bfloat16, device="cuda"),
    lambda: sg.ones(2, device="cuda").half(),
    lambda: sg.ones(2, device="cuda").to(sg.bfloat16),
])
def test_half_dtypes_are_refused_on_cuda_with_a_clear_error(make):
    with pytest.raises(TypeError, match=r"CUDA backend does not support (b?float16) tensors: "
                                        r"keep .* on the CPU, or cast them with \.float\(\)"):
        make()


def test_the_narrow_integers_work_on_cuda():
    t = sg.ones(3, dtype=sg.int32, device="cuda") + 2
    assert t.dtype is sg.int32 and t.cpu().tolist() == [3, 3, 3]
