"""``symgrad.optim``: torch's optimizers (update rules, param groups, state) and schedulers."""

from __future__ import annotations

from . import lr_scheduler, swa_utils
from ._adafactor import Adafactor
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adam import Adam, AdamW
from .adamax import Adamax
from .asgd import ASGD
from .lbfgs import LBFGS
from .nadam import NAdam
from .optimizer import Optimizer
from .radam import RAdam
from .rmsprop import RMSprop
from .rprop import Rprop
from .sgd import SGD

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax",
           "NAdam", "RAdam", "ASGD", "Rprop", "Adafactor", "LBFGS", "lr_scheduler",
           "swa_utils"]
