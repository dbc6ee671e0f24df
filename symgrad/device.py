"""Devices, named as PyTorch names them (``cpu``, ``cuda``, ``cuda:0``)."""

from __future__ import annotations

__all__ = ["device", "as_device", "default_device", "resolve"]


class device:
    __slots__ = ("type", "index")

    def __init__(self, type: str, index: int | None = None) -> None:  # noqa: A002
        if isinstance(type, device):
            type, index = type.type, type.index
        elif ":" in type:
            type, idx = type.split(":", 1)
            index = int(idx)
        if type not in ("cpu", "cuda"):
            raise RuntimeError(
                "Expected one of cpu, cuda device type at start of device string: " + type)
        self.type = type
        self.index = index

    def __eq__(self, other) -> bool:
        try:
            other = as_device(other)
        except (RuntimeError, TypeError, ValueError):  # not a device: unequal, never an error
            return False
        return self.type == other.type and (self.index or 0) == (other.index or 0)

    def __hash__(self) -> int:
        return hash((self.type, self.index or 0))

    def __repr__(self) -> str:
        idx = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{idx})"

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


CPU = device("cpu")


def as_device(d) -> device:
    if d is None:
        return CPU
    if isinstance(d, device):
        return d
    if isinstance(d, str):
        return CPU if d == "cpu" else device(d)
    if isinstance(d, int):
        return device("cuda", d)
    return device(str(d))


#: The device creation functions use when given none (``symgrad.set_default_device``,
#: which lives in creation.py: checking "cuda" needs symgrad.cuda, which imports this module).
_DEFAULT: device = CPU


def default_device() -> device:
    """What ``symgrad.get_default_device()`` returns: cpu unless set."""
    return _DEFAULT


def resolve(d) -> device:
    """A creation function's ``device=`` argument: None means the default device; a cpu
    tensor's device is plain ``cpu`` whatever index was asked for, as in torch."""
    d = _DEFAULT if d is None else as_device(d)
    return CPU if d.type == "cpu" else d
