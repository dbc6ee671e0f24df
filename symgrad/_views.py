"""PyTorch's rule for the views of a multi-output op (split, chunk, unbind).

Writing in place into one piece would have to rebase the single node all pieces share,
so torch refuses it whenever autograd would record the write, with the words below. Each
piece is remembered weakly (with the grad mode it was made in and whether its base
required grad); a view of a piece is recognised through its graph (a chain of view nodes
ending at the multi-output node).
"""

from __future__ import annotations

import re
import weakref
from typing import Any

from .autograd.grad_mode import _state

__all__ = ["mark_multi_output_views", "check_multi_output_view"]

#: id(piece) -> (weakref to the piece, made in grad mode, its base required grad)
_PIECES: dict[int, tuple[Any, bool, bool]] = {}

_MULTI = ("This view is the output of a function that returns multiple views. Such functions "
          "do not allow the output views to be modified inplace. You should replace the "
          "inplace operation by an out-of-place one.")
_NO_GRAD = ("A view was created in no_grad mode and is being modified inplace with grad mode "
            "enabled.")
_NO_GRAD_HINT = (
    "Given that this use case is ambiguous and error-prone, it is forbidden. You can clarify "
    "your code by moving both the view and the inplace either both inside the no_grad block "
    "(if you don't want the inplace to be tracked) or both outside (if you want the inplace "
    "to be tracked).")


def mark_multi_output_views(pieces: tuple, base_requires_grad: bool) -> None:
    """Remember ``pieces`` as the outputs of one multi-output view op."""
    grad_mode = _state.enabled
    for t in pieces:
        key = id(t)
        _PIECES[key] = (weakref.ref(t, lambda _r, k=key: _PIECES.pop(k, None)), grad_mode,
                        base_requires_grad)


def _short(name: str) -> str:
    return re.sub(r"Backward\d*$", "", name)


def _piece_of_graph(t) -> bool:
    """Is ``t`` a piece of a multi-output op, or a view (chain) of one, in the graph?"""
    node = t._grad_fn
    while node is not None:
        spec = getattr(type(node), "_spec", None)
        if spec is None or not spec.view:
            return False
        if spec.variadic_outputs:
            return True
        node = node.next_functions[0][0] if node.next_functions else None
    return False


def check_multi_output_view(t, graph: bool, view_name: str | None = None) -> None:
    """Raise torch's error if writing into ``t`` in place is refused.

    ``graph``: autograd records the write (grad mode on and ``t`` or the value written
    requires grad). ``view_name``: the grad_fn name of the view the write goes through
    (``x[0] = v`` writes into a SelectBackward0 view of ``x``), if not ``t`` itself.
    """
    if not _state.enabled:
        return
    entry = _PIECES.get(id(t)) if _PIECES else None
    if entry is not None and entry[0]() is t:
        _, grad_mode, base_requires_grad = entry
        if not grad_mode:
            if graph or base_requires_grad:
                raise RuntimeError(f"{_NO_GRAD} {_NO_GRAD_HINT}")
            return
        if t._grad_fn is None:
            if graph:
                raise RuntimeError(f"{_NO_GRAD} {_MULTI}")
            return
    elif not (t._grad_fn is not None and _piece_of_graph(t)):
        return
    if view_name is not None:
        raise RuntimeError(f"Output 0 of {_short(view_name)} is a view and is being modified "
                           f"inplace. {_MULTI}")
    raise RuntimeError(f"Output {t._output_nr} of {_short(t._grad_fn.name())} is a view and is "
                       f"being modified inplace. {_MULTI}")
