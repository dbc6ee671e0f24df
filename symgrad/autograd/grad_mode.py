"""Grad modes (thread-local, as in PyTorch): context managers that also decorate."""

from __future__ import annotations

import functools
import threading

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled",
           "is_inference_mode_enabled"]


class _State(threading.local):
    def __init__(self) -> None:
        self.enabled = True
        self.inference = False


_state = _State()


def is_grad_enabled() -> bool:
    return _state.enabled


def is_inference_mode_enabled() -> bool:
    return _state.inference


class _GradMode:
    """Sets a mode on enter and restores the previous one on exit; also a decorator.

    ``@no_grad`` and ``@no_grad()`` both work, as in PyTorch 2.x.
    """

    def __new__(cls, *args):
        if len(args) == 1 and callable(args[0]) and cls in (no_grad, enable_grad):
            return cls()(args[0])
        return super().__new__(cls)

    def __init__(self, *args) -> None:
        self._args = args

    def _mode(self) -> tuple[bool, bool]:
        raise NotImplementedError

    def __enter__(self):
        self._prev = (_state.enabled, _state.inference)
        _state.enabled, _state.inference = self._mode()
        return self

    def __exit__(self, *exc) -> None:
        _state.enabled, _state.inference = self._prev

    def __call__(self, fn):
        mode_cls, args = type(self), self._args

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            with mode_cls(*args) if mode_cls is not set_grad_enabled else _Scoped(*args):
                return fn(*a, **kw)

        return wrapper


class no_grad(_GradMode):
    """Ops inside record no graph; their outputs do not require grad."""

    def _mode(self):
        return False, _state.inference


class enable_grad(_GradMode):
    def _mode(self):
        return True, _state.inference


class _Scoped(_GradMode):
    def _mode(self):
        return bool(self._args[0]), _state.inference


class set_grad_enabled(_GradMode):
    """``set_grad_enabled(False)`` takes effect at once (like torch) and is also a context."""

    def __init__(self, mode: bool) -> None:
        self._args = (mode,)
        self._prev = (_state.enabled, _state.inference)
        _state.enabled = bool(mode)

    def __enter__(self):
        return self


class inference_mode(_GradMode):
    """Like no_grad; symgrad has no separate inference tensors (documented difference)."""

    def __init__(self, mode: bool = True) -> None:
        self._args = (mode,)

    def _mode(self):
        if self._args[0]:
            return False, True
        return _state.enabled, False
