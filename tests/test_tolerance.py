"""The tolerance helper every float comparison uses (tests/_tolerance.py)."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import SAFETY, assert_close, eps_of, magnitude, tolerance

import symgrad as sg

FLOATS = [np.float32, np.float64]


def _ulps_up(x, n):
    """``x`` moved up by ``n`` ulp (elementwise, in its own dtype)."""
    x = np.asarray(x)
    for _ in range(n):
        x = np.nextafter(x, np.asarray(np.inf, dtype=x.dtype))
    return x


@pytest.mark.parametrize("dtype", FLOATS)
def test_two_ulp_passes_and_a_tenth_of_a_percent_fails(dtype):
    x = np.random.default_rng(0).uniform(0.5, 2.0, size=(5, 7)).astype(dtype)
    assert_close(_ulps_up(x, 2), x)
    assert_close(x, _ulps_up(x, 2))
    with pytest.raises(AssertionError, match="not close"):
        assert_close(x * dtype(1.001), x)
    with pytest.raises(AssertionError, match="not close"):  # even with a long accumulation
        assert_close(x * dtype(1.001), x, terms=100)


def test_bound_formula_and_its_dtype():
    e32, e64 = float(np.finfo(np.float32).eps), float(np.finfo(np.float64).eps)
    x32 = np.array([1.0, -3.0], dtype=np.float32)
    assert tolerance(x32) == SAFETY * e32 * 3.0
    assert tolerance(x32, terms=10, ulps=2) == 2 * 10 * e32 * 3.0
    assert tolerance(x32.astype(np.float64)) == SAFETY * e64 * 3.0
    # the less precise of the two sides decides; dtype= overrides
    assert tolerance(x32.astype(np.float64), actual=x32) == SAFETY * e32 * 3.0
    assert tolerance(x32, dtype=np.float64) == SAFETY * e64 * 3.0
    assert tolerance(x32, scale=100.0) == SAFETY * e32 * 100.0
    assert eps_of(np.arange(3), [True]) is None and tolerance(np.arange(3)) == 0.0
    assert eps_of(1.5) == e64  # a Python float is a float64
    with pytest.raises(ValueError):
        tolerance(x32, terms=0)


def test_bound_scales_with_terms():
    x = np.ones(4, dtype=np.float32)
    off = x + np.float32(40 * np.finfo(np.float32).eps)  # ~40 ulp (at 1.0) off
    with pytest.raises(AssertionError):
        assert_close(off, x)
    with pytest.raises(AssertionError):
        assert_close(off, x, terms=5)  # 4 * 5 = 20 eps < 40 eps
    assert_close(off, x, terms=10)  # 4 * 10 = 40 eps


def test_scale_is_the_blocks_magnitude_or_given():
    # a small element gets the block's absolute slack (norm-wise bound) ...
    e = np.array([1e-6, 1.0], dtype=np.float32)
    assert_close(e + np.array([1e-7, 0], dtype=np.float32), e)
    # ... and a cancelling sum is judged against the magnitude of its terms
    terms = np.array([1e4, 1.0, -1e4], dtype=np.float32)
    with pytest.raises(AssertionError):
        assert_close(np.float32(1.0009765625), np.float32(1.0), terms=3)
    assert_close(np.float32(1.0009765625), np.float32(1.0), terms=3,
                 scale=np.abs(terms).sum())
    # the inputs' magnitude as the scale of a cancelling sum
    x = np.array([2.0, -2.0, 1e-3], dtype=np.float32)
    assert magnitude(np.float32(1e-3), x, None) == 2.0
    assert_close(np.float32(1e-3) + np.float32(1e-7), np.float32(1e-3), terms=3,
                 scale=magnitude(np.float32(1e-3), x))
    assert magnitude(np.array([np.nan, -np.inf, -3.0])) == 3.0 and magnitude() == 0.0
    # an elementwise scale
    assert_close(np.array([1.0, 100.5]), np.array([1.0, 100.0]), scale=np.array([1.0, 1e15]))
    with pytest.raises(AssertionError):
        assert_close(np.array([1.5, 100.0]), np.array([1.0, 100.0]),
                     scale=np.array([1.0, 1e15]))


def test_zeros():
    z = np.zeros(3, dtype=np.float32)
    assert_close(z, z)
    assert_close(-z, z)  # -0.0 == 0.0
    with pytest.raises(AssertionError):  # an all-zero block has no magnitude: exact
        assert_close(z + np.float32(1e-30), z)
    assert_close(z + np.float32(1e-8), z, scale=1.0)  # a cancellation to 0 states its scale


def test_nan_equals_nan_only_where_both_are_nan():
    a = np.array([1.0, np.nan, 3.0], dtype=np.float32)
    assert_close(a, a.copy())
    with pytest.raises(AssertionError, match=r"NaN only in actual at \[\(2,\)\]"):
        assert_close(np.array([1.0, np.nan, np.nan], dtype=np.float32), a)
    with pytest.raises(AssertionError, match=r"only in expected at \[\(1,\)\]"):
        assert_close(np.array([1.0, 2.0, 3.0], dtype=np.float32), a)
    # NaNs do not count towards the scale
    assert_close(np.array([np.nan, 2.0]), np.array([np.nan, 2.0 + 1e-16]))


def test_infinities_must_match_in_place_and_sign():
    a = np.array([1.0, np.inf, -np.inf])
    assert_close(a, a.copy())
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_close(np.array([1.0, -np.inf, -np.inf]), a)
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_close(np.array([1.0, 1e308, -np.inf]), a)
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_close(np.array([np.inf, np.inf, -np.inf]), a)


def test_shape_mismatch_fails_clearly_without_broadcasting():
    with pytest.raises(AssertionError, match=r"shape mismatch: actual \(3,\) vs expected "
                                             r"\(1, 3\)"):
        assert_close(np.zeros(3), np.zeros((1, 3)))
    with pytest.raises(AssertionError, match="shape mismatch"):
        assert_close(np.zeros(3), 0.0)
    with pytest.raises(AssertionError, match="shape mismatch"):
        assert_close(np.zeros((2, 3)), np.zeros((3, 2)))


def test_integers_and_bools_compare_exactly():
    assert_close(np.arange(4), [0, 1, 2, 3])
    with pytest.raises(AssertionError, match="exact"):
        assert_close(np.arange(4), [0, 1, 2, 4], terms=1000)
    assert_close(np.array([True, False]), [True, False])
    with pytest.raises(AssertionError, match="exact"):
        assert_close(np.array([True, False]), [True, True])
    # a float result against integer expectations is a float comparison in the float's dtype
    assert_close(np.array([2.0, 4.0], dtype=np.float32), [2, 4])


def test_scalars_and_tensors_of_both_libraries(torch):
    assert_close(0.1 + 0.2, 0.3)
    with pytest.raises(AssertionError):
        assert_close(0.1 + 0.2, 0.3001)
    t = sg.tensor([1.0, 2.0], requires_grad=True) * 3
    assert_close(t, [3.0, 6.0])
    assert_close(t.sum(), 9.0)
    tt = torch.tensor([1.0, 2.0], requires_grad=True) * 3
    assert_close(t, tt)
    assert_close(tt, np.array([3.0, 6.0], dtype=np.float32))
    with pytest.raises(AssertionError, match="my context: not close"):
        assert_close(t, tt * 1.01, msg="my context")
