"""``symgrad.optim``: SGD and Adam with PyTorch's update rules, param groups and state."""

from __future__ import annotations

from .adam import Adam
from .optimizer import Optimizer
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam"]
