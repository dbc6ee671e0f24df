"""Devices, named as PyTorch names them (``cpu``, ``cuda``, ``cuda:0``)."""

from __future__ import annotations

__all__ = ["device", "as_device"]


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
        other = as_device(other)
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
