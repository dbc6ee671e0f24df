"""cat and stack: ops over a list of tensors.

The registry holds one spec per op (two inputs); calls with n tensors use a spec made for
n inputs on first use (``cat_spec(n)``), so each input keeps its own edge and formula,
as PyTorch's CatBackward0 has one next_function per tensor.
"""

from __future__ import annotations

from .. import _tensor_layer as _tl
from ._ints import norm, u64
from .registry import register
from .spec import STRUCTURAL, OpSpec

_SPECS: dict[tuple[str, int], OpSpec] = {}


def _cat_fwd(be, *tensors, dim, _sizes):
    kept = [t for t, s in zip(tensors, _sizes) if s is not None] or list(tensors)
    return be.concatenate(kept, norm(dim, kept[0].ndim))


def _cat_grad(i):
    def formula(grad, dim, _sizes):
        if _sizes[i] is None:  # a skipped 1-D empty input (PyTorch's legacy rule)
            return _tl.zeros((0,), dtype=grad.dtype, device=grad.device)
        from .indexing import slice_

        start = sum(s for s in _sizes[:i] if s is not None)
        return slice_(grad, dim, start, start + _sizes[i], 1)

    return formula


def _stack_fwd(be, *tensors, dim):
    return be.stack(list(tensors), norm(dim, tensors[0].ndim + 1))


def _stack_grad(i):
    def formula(grad, dim):
        from .indexing import select

        return select(grad, u64(norm(dim, grad.ndim)), i)

    return formula


def _make(kind: str, n: int) -> OpSpec:
    names = tuple(f"tensors{i}" for i in range(n))
    if kind == "cat":
        spec = OpSpec("cat" if n == 2 else f"cat[{n}]", "CatBackward0", names, _cat_fwd,
                      {nm: _cat_grad(i) for i, nm in enumerate(names)}, STRUCTURAL,
                      dtype_rule="promote",
                      doc="torch.cat; ``_sizes``: each input's size along dim (None: skipped).")
    else:
        spec = OpSpec("stack" if n == 2 else f"stack[{n}]", "StackBackward0", names, _stack_fwd,
                      {nm: _stack_grad(i) for i, nm in enumerate(names)}, STRUCTURAL,
                      dtype_rule="promote", doc="torch.stack")
    return spec


def list_spec(kind: str, n: int) -> OpSpec:
    """The cat/stack spec for ``n`` input tensors."""
    spec = _SPECS.get((kind, n))
    if spec is None:
        spec = _SPECS[(kind, n)] = register(_make(kind, n)) if n == 2 else _make(kind, n)
    return spec


list_spec("cat", 2)
list_spec("stack", 2)
