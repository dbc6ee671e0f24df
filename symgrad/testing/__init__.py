"""``symgrad.testing``: gradient checks for your own tests and CI.

- ``assert_gradients_match(fn, *inputs)``: the symbolic verifier on the graph ``fn`` builds;
  an AssertionError carries the verifier's table.
- ``gradcheck`` / ``gradgradcheck``: PyTorch's finite-difference checks, same signature
  (re-exported from ``symgrad.autograd``, where they live).
- ``check_function(MyFunction, *inputs)``: a custom ``autograd.Function``'s backward.
- ``assert_function_correct(MyFunction, *inputs)``: proves a custom Function's backward (and
  its double backward when it has one) against the exact derivative of its own forward,
  traced on symbols; the failure names the input and element whose gradient is wrong.
- ``@gradient_check(inputs=...)``: marks functions that ``symgrad check`` discovers.
- The pytest plugin (``symgrad.testing.plugin``, auto-loaded) adds the ``symgrad_check``
  fixture, the ``@pytest.mark.symgrad`` marker and ``--symgrad-report``.
"""

from ..autograd.gradcheck import GradcheckError, gradcheck, gradgradcheck
from .checks import (
    assert_function_correct,
    assert_gradients_match,
    check_function,
    gradient_check,
)

__all__ = ["assert_gradients_match", "assert_function_correct", "check_function",
           "gradient_check", "gradcheck", "gradgradcheck", "GradcheckError"]
