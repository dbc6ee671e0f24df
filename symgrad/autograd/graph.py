"""``symgrad.autograd.graph``: hooks on what the graph saves (PyTorch's API).

``saved_tensors_hooks(pack, unpack)`` lets a user trade memory for time or move
activations elsewhere: every tensor a node saves while the context is active is handed
to ``pack``, only its return value is kept, and ``unpack`` turns it back into a tensor
when the backward needs it. ``save_on_cpu`` is the ready-made pair that parks saved
tensors in host memory. Checkpointing (``symgrad.utils.checkpoint``) is built on this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .node import Node, _saved_tensors_hooks

__all__ = ["saved_tensors_hooks", "save_on_cpu", "Node"]


class saved_tensors_hooks:  # noqa: N801  (PyTorch's name)
    """Context manager: ``pack(tensor) -> Any`` on save, ``unpack(packed) -> Tensor`` on use.

    Hooks nest (the innermost pair wins). A saved *output* reaches ``pack`` as a
    grad_fn-free alias of the output, so a ``pack`` that returns its argument creates
    no reference cycle. As in PyTorch, a tensor saved under hooks is not version
    checked: ``pack`` decides what is kept. ``pack`` must not modify its argument.
    The active hooks are process-wide (PyTorch's are per thread).
    """

    def __init__(self, pack_hook: Callable[[Any], Any],
                 unpack_hook: Callable[[Any], Any]) -> None:
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self) -> saved_tensors_hooks:
        _saved_tensors_hooks.append((self.pack_hook, self.unpack_hook))
        return self

    def __exit__(self, *exc) -> None:
        _saved_tensors_hooks.pop()


class save_on_cpu(saved_tensors_hooks):  # noqa: N801
    """Saved tensors are copied to CPU memory on save and back to their device on use."""

    def __init__(self, pin_memory: bool = False) -> None:
        def pack(t):
            return (t.device, t.cpu() if t.device.type != "cpu" else t)

        def unpack(packed):
            device, t = packed
            return t.to(device)

        super().__init__(pack, unpack)
