"""Small LaTeX builders for an op's ``formula_tex`` (its readable forward, for the views).

The op files define their formula next to their forward and backward; these helpers only
spell the recurring pieces: a window index ``s·i + d·p − pad`` with the actual numbers put
in and simplified (``i+p-1``, ``2i+p``), index lists, and normalised dims. Pure strings:
nothing here imports SymPy or the Jupyter layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["window_index", "index", "ints", "dim_of", "bounds", "template", "OUT_VARS",
           "TAP_VARS"]

#: index letters of the output positions and of the kernel taps, per spatial dim
OUT_VARS = ("i", "j", "l")
TAP_VARS = ("p", "q", "r")


def _term(coef: int, var: str) -> str:
    if coef == 0:
        return ""
    if coef == 1:
        return var
    if coef == -1:
        return "-" + var
    return f"{coef}{var}"


def window_index(out_var: str, tap_var: str | None, stride: int, dilation: int,
                 padding: int) -> str:
    """``stride·out + dilation·tap − padding`` as LaTeX with the numbers in: ``2i+p-1``."""
    parts = [_term(stride, out_var)]
    if tap_var is not None:
        parts.append(_term(dilation, tap_var))
    text = ""
    for p in parts:
        if not p:
            continue
        text += p if not text or p.startswith("-") else "+" + p
    if padding:
        text += f"-{padding}" if padding > 0 else f"+{-padding}"
    return text or "0"


def index(name: str, idx: Sequence[str]) -> str:
    """``name[a,b,c]`` (brackets read better than subscripts for index arithmetic)."""
    sep = r",\," if any(len(i) > 1 for i in idx) else ","
    return f"{name}[{sep.join(idx)}]"


def ints(v: Any, n: int, default: Sequence[int] | None = None) -> tuple[int, ...]:
    """A saved int-list argument as ``n`` ints (one value repeated; empty -> default)."""
    if v is None or (isinstance(v, (tuple, list)) and not len(v)):
        v = default if default is not None else (0,)
    if isinstance(v, int):
        return (int(v),) * n
    v = tuple(int(x) for x in v)
    return v * n if len(v) == 1 else v


def dim_of(dim: Any, ndim: int) -> int:
    """A saved dim (negative, or torch's unsigned form of it) as 0..ndim-1."""
    d = int(dim)
    if d >= 2 ** 63:
        d -= 2 ** 64
    return d % ndim if ndim else 0


def bounds(taps: Sequence[str], sizes: Sequence[int]) -> str:
    """``p<3,\\,q<3``: the ranges of a window's taps (the sum's or max's subscript)."""
    return r",\,".join(f"{t}<{k}" for t, k in zip(taps, sizes))


def template(forward: str, vjp: str | None = None):
    """A ``formula_tex`` from fixed LaTeX templates (``str.format``): ``{y}`` is the output,
    ``{0}``, ``{1}`` ... the op's inputs in order, ``\\bar{v}`` the gradient flowing into v.
    For ops whose line needs no numbers of the node (matmul, sum, reshape ...)."""

    def formula_tex(names: dict, out: str, params: dict, shapes: dict):
        args = list(names.values())
        if any(a is None for a in args):
            return None
        return forward.format(*args, y=out), (vjp.format(*args, y=out) if vjp else None)

    return formula_tex
