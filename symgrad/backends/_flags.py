"""Settable switches with torch.backends' names (``cudnn.benchmark``,
``cuda.matmul.allow_tf32`` ...), so training scripts that set them run unchanged.

symgrad has no cuDNN, cuBLAS math modes, MPS or oneDNN: the switches keep what a script
sets and change no computation (docs/differences.md). Unknown names raise torch's
``AttributeError: Unknown attribute NAME``, so a misspelt flag is not silently accepted.
"""

from __future__ import annotations

from typing import Any


class Flags:
    """A fixed set of named switches with defaults."""

    def __init__(self, **defaults: Any) -> None:
        object.__setattr__(self, "_values", dict(defaults))

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"Unknown attribute {name}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._values:
            raise AttributeError(f"Unknown attribute {name}")
        self._values[name] = value

    def __repr__(self) -> str:
        return "Flags(" + ", ".join(f"{k}={v!r}" for k, v in self._values.items()) + ")"
