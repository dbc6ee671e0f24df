"""``symgrad.backends.cudnn``: torch.backends.cudnn's switches (no cuDNN here: they are kept
and change nothing; see symgrad/backends/_flags.py)."""

from __future__ import annotations

enabled = True
benchmark = False
benchmark_limit = 10
deterministic = False
allow_tf32 = True


def is_available() -> bool:
    """False: symgrad's GPU kernels are numba.cuda's, not cuDNN's."""
    return False


def version() -> None:
    return None
