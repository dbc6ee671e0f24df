"""``symgrad.linalg``: torch.linalg's functions that symgrad has (vector_norm)."""

from __future__ import annotations

from ..tensor_functions import vector_norm

__all__ = ["vector_norm"]
