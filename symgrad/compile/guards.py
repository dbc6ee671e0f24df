"""What a compiled step is specialised to, checked on every call.

The signature (the cache key) covers fn's arguments and the grad mode; the leaves and the
optimizer state are checked by identity of their arrays when the entry gathers them (an
array replaced since the last call is re-checked by shape and dtype). ``Constants`` are
the Python values the trace may have baked into the code: attributes of the modules whose
forward ran, and the globals and closure cells fn (and those forwards) read; a change
retraces.
"""

from __future__ import annotations

import operator
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from ..autograd.grad_mode import _state
from ..tensor import Tensor

__all__ = ["signature", "Constants"]

_SCALARS = (int, float, bool, str, type(None))


def signature(args: tuple) -> tuple[Any, str | None]:
    """(cache key, None) for these arguments, or (None, why they cannot be compiled)."""
    parts: list = [_state.enabled, _state.inference]
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            kind = a._device.type
            if kind not in ("cpu", "cuda"):
                return None, f"{kind} tensors (compiled: cpu, cuda)"
            d = a._data
            parts.append((d.shape, d.dtype.str, a._requires_grad, kind))
        elif type(a) in _SCALARS:
            parts.append((type(a), a))
        else:
            return None, f"argument {i} is a {type(a).__name__} (tensors and Python scalars " \
                         "only)"
    return tuple(parts), None


def _guardable(x) -> bool:
    """A Python value code generation may have baked in (numbers, strings, flags, tuples of
    them); tensors, modules and other objects are not values of the trace."""
    if type(x) in _SCALARS:
        return True
    return type(x) is tuple and all(_guardable(y) for y in x)


def _global_names(code: types.CodeType) -> set:
    """The global (or builtin) names a function's code and its nested code read."""
    names, todo = set(), [code]
    while todo:
        c = todo.pop()
        names.update(c.co_names)
        todo.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


class Constants:
    """The Python constants a trace read, compared on every call (itemgetters over the
    owners' dicts: well under a microsecond per owner). ``modules``: those whose forward
    ran (the globals their ``forward`` reads are guarded); ``reads``: (module, attribute
    names) of the scalar instance attributes read during the trace. Modules are held
    weakly."""

    def __init__(self, fn: Callable, modules: Iterable, reads: Iterable = ()) -> None:
        self._modules: list = []  # (weakref to module, getter, values, name)
        self._dicts: list = []  # (globals dict, getter, values, names)
        self._cells: list = []  # (cells, values)
        functions = [fn] + [getattr(type(m), "forward", None) for m in modules]
        for m, names in reads:
            keys = sorted(k for k in names if k in m.__dict__ and _guardable(m.__dict__[k]))
            if keys:
                get = operator.itemgetter(*keys)
                self._modules.append((weakref.ref(m), get, get(m.__dict__), type(m).__name__))
        by_dict: dict[int, tuple] = {}
        cells: list = []
        for f in functions:
            f = getattr(f, "__func__", f)
            code, glob = getattr(f, "__code__", None), getattr(f, "__globals__", None)
            if code is None or glob is None:
                continue
            names = by_dict.setdefault(id(glob), (glob, set()))[1]
            names.update(n for n in _global_names(code) if n in glob and _guardable(glob[n]))
            for cell in f.__closure__ or ():
                try:
                    value = cell.cell_contents
                except ValueError:  # not assigned yet
                    continue
                if _guardable(value) and all(cell is not c for c in cells):
                    cells.append(cell)
        for glob, names in by_dict.values():
            if names:
                keys = sorted(names)
                get = operator.itemgetter(*keys)
                self._dicts.append((glob, get, get(glob), ", ".join(keys)))
        if cells:
            self._cells.append((tuple(cells), tuple(c.cell_contents for c in cells)))
        self._want_m = [w for _, _, w, _ in self._modules]
        self._want_d = [w for _, _, w, _ in self._dicts]
        self._want_c = [w for _, w in self._cells]
        #: anything to check at all (most steps read no Python constant: no cost per call)
        self.active = bool(self._modules or self._dicts or self._cells)

    def changed(self) -> str | None:
        """None while every constant is as traced, else which changed (one comprehension
        per kind on the hot path; the detailed scan only when something differs)."""
        try:
            if ([get(ref().__dict__) for ref, get, _, _ in self._modules] == self._want_m
                    and [get(d) for d, get, _, _ in self._dicts] == self._want_d
                    and [tuple([c.cell_contents for c in cells]) for cells, _ in self._cells]
                    == self._want_c):
                return None
        except (AttributeError, KeyError, ValueError):  # a module freed, a name deleted
            pass
        return self._which()

    def _which(self) -> str:
        for ref, get, want, name in self._modules:
            m = ref()
            try:
                if m is None or get(m.__dict__) != want:
                    return f"an attribute of module {name} changed"
            except KeyError:
                return f"an attribute of module {name} was deleted"
        for glob, get, want, names in self._dicts:
            try:
                if get(glob) != want:
                    return f"a global read by the step changed ({names})"
            except KeyError:
                return f"a global read by the step was deleted ({names})"
        return "a variable fn closes over changed"
