"""Every op, defined once. Importing this package fills ``OPS``."""

from . import elementwise, linalg, movement, nn, reduce  # noqa: F401  (registration)
from . import indexing, minmax, shape, softmax  # noqa: F401  (the complete op set)
from . import inplace  # noqa: F401  (zero_, fill_, copy_)
from .registry import OPS, check_complete, register
from .spec import STRUCTURAL, OpSpec

__all__ = ["OPS", "OpSpec", "STRUCTURAL", "check_complete", "register"]
