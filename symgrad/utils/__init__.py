"""``symgrad.utils``: training utilities (PyTorch's ``torch.utils`` names)."""

from __future__ import annotations

from . import checkpoint, data, hooks

__all__ = ["checkpoint", "data", "hooks"]
