"""``symgrad.testing``: gradient checks for your own tests and CI.

- ``assert_gradients_match(fn, *inputs)``: the symbolic verifier on the graph ``fn`` builds;
  an AssertionError carries the verifier's table.
- ``gradcheck`` / ``gradgradcheck``: PyTorch's finite-difference checks, same signature
  (re-exported from ``symgrad.autograd``, where they live).
- ``check_function(MyFunction, *inputs)``: a custom ``autograd.Function``'s backward.
- ``@gradient_check(inputs=...)``: marks functions that ``symgrad check`` discovers.
- The pytest plugin (``symgrad.testing.plugin``, auto-loaded) adds the ``symgrad_check``
  fixture, the ``@pytest.mark.symgrad`` marker and ``--symgrad-report``.
"""

from ..autograd.gradcheck import GradcheckError, gradcheck, gradgradcheck
from .checks import assert_gradients_match, check_function, gradient_check

__all__ = ["assert_gradients_match", "check_function", "gradient_check", "gradcheck",
           "gradgradcheck", "GradcheckError"]
