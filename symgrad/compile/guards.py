"""What a compiled step is specialised to, checked on every call.

The signature (the cache key) covers fn's arguments and the grad mode; the leaves and the
optimizer state are checked by identity of their arrays when the entry gathers them (an
array replaced since the last call is re-checked by shape and dtype). ``Constants`` are
the Python values the trace may have baked into the code: attributes of the modules whose
forward ran, the globals and closure cells fn (and those forwards, and the Python helpers
they call) read, and the values they read out of containers and objects by a constant path
(``FLAGS["fail"]``, ``cfg.lr``, ``self.cfg["k"]``: found in the functions' bytecode, see
``_paths``); a change retraces.
"""

from __future__ import annotations

import dis
import operator
import sys
import types
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

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
            # a non-leaf argument (a graph from outside fn) is its own signature: eager's
            # backward goes on into that graph, the compiled one could not
            parts.append((d.shape, d.dtype.str, a._requires_grad if a._grad_fn is None else 2,
                          kind))
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


#: a container read whole (``FLAGS[name]`` with a key known only at run time) is guarded by
#: equality when it holds at most this many scalars
_CONTAINER_MAX = 64
#: how many Python functions (fn's helpers, reached through globals, closures and paths)
#: are scanned for reads at most
_FUNCTIONS_MAX = 64
_LIBRARIES = {"symgrad", "numpy", "numba", "sympy", "torch", "scipy"}
_NOTHING = object()


def _library(f) -> bool:
    """Library code or module (symgrad's own, NumPy, the standard library ...): its reads
    are not the user's flags, and scanning it would cost time at every trace."""
    name = f.__name__ if isinstance(f, types.ModuleType) else getattr(f, "__module__", None)
    root = (name or "").partition(".")[0]
    filename = getattr(getattr(f, "__code__", None), "co_filename", "")
    return (root in _LIBRARIES or root in sys.stdlib_module_names
            or "site-packages" in filename or "dist-packages" in filename)


def _paths(f, bound: bool) -> list:
    """The constant paths ``f``'s bytecode reads: (root, steps), root ``("g", name)`` a
    global, ``("c", cell)`` a closure cell, ``("s",)`` its first argument (``bound``: a
    method or a module's forward); steps ``("attr", name)`` or ``("item", constant)``.
    Nested code (comprehensions, lambdas) is scanned for globals only."""
    out: list = []
    code = f.__code__
    cells = dict(zip(code.co_freevars, f.__closure__ or ()))
    first = code.co_varnames[0] if bound and code.co_argcount else None
    todo = [(code, True)]
    while todo:
        c, top = todo.pop()
        todo.extend((k, False) for k in c.co_consts if isinstance(k, types.CodeType))
        chain, key = None, _NOTHING
        for ins in dis.get_instructions(c):
            op = ins.opname
            root = None
            if op in ("LOAD_GLOBAL", "LOAD_NAME"):
                root = ("g", ins.argval)
            elif op in ("LOAD_DEREF", "LOAD_CLASSDEREF") and top and ins.argval in cells:
                root = ("c", cells[ins.argval])
            elif op == "LOAD_FAST" and top and first is not None and ins.argval == first:
                root = ("s",)
            if root is not None:
                if chain:
                    out.append(chain)
                chain, key = (root, []), _NOTHING
                continue
            if chain is None:
                continue
            if op in ("LOAD_ATTR", "LOAD_METHOD") and key is _NOTHING:
                chain[1].append(("attr", ins.argval))
                continue
            if op == "LOAD_CONST" and key is _NOTHING and type(ins.argval) in _SCALARS:
                key = ins.argval
                continue
            if key is not _NOTHING and (op == "BINARY_SUBSCR" or (
                    op == "BINARY_OP" and ins.argrepr == "[]")):
                chain[1].append(("item", key))
                key = _NOTHING
                continue
            out.append(chain)
            chain, key = None, _NOTHING
        if chain:
            out.append(chain)
    return out


def _step(x, step):
    """One step of a path without running user code: an attribute from the object's own
    ``__dict__`` (or its class's, for a class), an item of a plain dict, list or tuple;
    _NOTHING where the path cannot be followed that way."""
    kind, key = step
    if kind == "attr":
        d = getattr(x, "__dict__", None)
        if isinstance(d, (dict, types.MappingProxyType)) and key in d:
            return d[key]
        for k in x.__mro__ if isinstance(x, type) else type(x).__mro__:
            v = k.__dict__.get(key, _NOTHING)
            if v is _NOTHING:
                continue
            if isinstance(x, type):
                return _NOTHING if isinstance(v, property) else v
            if isinstance(v, types.FunctionType):
                return types.MethodType(v, x)  # a method: scanned, never a guarded value
            if isinstance(v, types.MemberDescriptorType):  # __slots__: no user code
                try:
                    return v.__get__(x, type(x))
                except AttributeError:
                    return _NOTHING
            return _NOTHING if isinstance(v, property) else v
        return _NOTHING
    if type(x) in (dict, list, tuple):
        try:
            return x[key]
        except (KeyError, IndexError, TypeError):
            return _NOTHING
    return _NOTHING


def _scalars(x) -> bool:
    """A small dict, list or tuple of guardable values (guarded whole, by equality)."""
    if type(x) is dict:
        return len(x) <= _CONTAINER_MAX and all(
            _guardable(k) and _guardable(v) for k, v in x.items())
    if type(x) in (list, tuple):
        return len(x) <= _CONTAINER_MAX and all(_guardable(v) for v in x)
    return False


def _label(root_name: str, steps) -> str:
    return root_name + "".join(f".{k}" if kind == "attr" else f"[{k!r}]"
                               for kind, k in steps)


_PLAIN = (dict, list, tuple)


def _getter(root, steps):
    """A function giving the value at the path now (_NOTHING if it cannot be followed):
    the common steps (an item of a plain container, an attribute in an instance or module
    ``__dict__``) inline, the rest through ``_step``."""
    kind, ref = root
    walk = tuple((k == "item", key) for k, key in steps)

    def follow(x):
        for item, key in walk:
            if item:
                if type(x) not in _PLAIN:
                    return _NOTHING
                try:
                    x = x[key]
                except (LookupError, TypeError):
                    return _NOTHING
                continue
            d = getattr(x, "__dict__", None)
            if type(d) is dict and key in d:
                x = d[key]
                continue
            x = _step(x, ("attr", key))
            if x is _NOTHING:
                return x
        return x

    if kind == "g":
        glob, name = ref

        def get():
            try:
                return follow(glob[name])
            except KeyError:  # the global was deleted
                return _NOTHING
    elif kind == "c":
        def get():
            try:
                return follow(ref.cell_contents)
            except ValueError:  # the cell was emptied
                return _NOTHING
    else:
        def get():
            x = ref()
            return _NOTHING if x is None else follow(x)

    return get


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
        functions = [(fn, None)] + [(getattr(type(m), "forward", None), m) for m in modules]
        for m, names in reads:
            keys = sorted(k for k in names if k in m.__dict__ and _guardable(m.__dict__[k]))
            if keys:
                get = operator.itemgetter(*keys)
                self._modules.append((weakref.ref(m), get, get(m.__dict__), type(m).__name__))
        self._paths: list = []  # (getter, value as traced, label)
        #: paths read through a property (user code: not run by a guard), baked in
        self.unguarded: list = []
        seen_paths: set = set()
        by_dict: dict[int, tuple] = {}
        cells: list = []
        seen_functions: set = set()
        k = 0
        while k < len(functions) and k < _FUNCTIONS_MAX:
            f, owner = functions[k]
            k += 1
            f = getattr(f, "__func__", f)
            code, glob = getattr(f, "__code__", None), getattr(f, "__globals__", None)
            if code is None or glob is None or id(f) in seen_functions or (
                    k > 1 and _library(f)):
                continue
            seen_functions.add(id(f))
            names = by_dict.setdefault(id(glob), (glob, set()))[1]
            names.update(n for n in _global_names(code) if n in glob and _guardable(glob[n]))
            for cell in f.__closure__ or ():
                try:
                    value = cell.cell_contents
                except ValueError:  # not assigned yet
                    continue
                if _guardable(value) and all(cell is not c for c in cells):
                    cells.append(cell)
                elif isinstance(value, (types.FunctionType, types.MethodType)):
                    functions.append((value, getattr(value, "__self__", None)))
            try:
                paths = _paths(f, owner is not None)
            except Exception:  # unusual bytecode: its reads stay unguarded
                continue
            for root, steps in paths:
                self._add_path(root, steps, glob, owner, functions, seen_paths)
        for glob, names in by_dict.values():
            if names:
                keys = sorted(names)
                get = operator.itemgetter(*keys)
                self._dicts.append((glob, get, get(glob), ", ".join(keys)))
        if cells:
            self._cells.append((tuple(cells), tuple(c.cell_contents for c in cells)))
        self._want_p = [w for _, w, _ in self._paths]
        self._want_m = [w for _, _, w, _ in self._modules]
        self._want_d = [w for _, _, w, _ in self._dicts]
        self._want_c = [w for _, w in self._cells]
        #: anything to check at all (most steps read no Python constant: no cost per call)
        self.active = bool(self._modules or self._dicts or self._cells or self._paths)

    def _add_path(self, root, steps, glob, owner, functions, seen) -> None:
        """Guard the values a read path meets (a scalar, or a small container of scalars
        where the path ends), and queue the Python functions it reaches for scanning."""
        if root[0] == "g":
            ref, name = (glob, root[1]), root[1]
            x = glob.get(name, _NOTHING)
            if x is _NOTHING or isinstance(x, types.ModuleType) and _library(x):
                return  # a builtin, or a library's module (math.pi is no flag of the user's)
        elif root[0] == "c":
            ref, name = root[1], "a variable fn closes over"
            try:
                x = ref.cell_contents
            except ValueError:
                return
        else:
            if owner is None:
                return
            try:
                ref = weakref.ref(owner)
            except TypeError:  # not weakly referable: not held by the step
                return
            name, x = "self", owner
        for depth in range(len(steps) + 1):
            if depth:
                prev, x = x, _step(x, steps[depth - 1])
                if x is _NOTHING:
                    kind, key = steps[depth - 1]
                    if kind == "attr" and not isinstance(prev, type) and isinstance(
                            getattr(type(prev), key, None), property):
                        self.unguarded.append(_label(name, steps[:depth]))
                    return
            if isinstance(x, (types.FunctionType, types.MethodType)):
                functions.append((x, getattr(x, "__self__", None)))
                return
            scalar = depth and (_guardable(x) or isinstance(x, np.generic)) and not (
                root[0] == "s" and depth == 1)
            whole = depth == len(steps) and _scalars(x)
            if scalar or whole:
                key = (root[0], id(ref[0]) if root[0] == "g" else id(ref), name,
                       tuple(steps[:depth]))
                if key not in seen:
                    seen.add(key)
                    want = x if scalar else type(x)(x)
                    self._paths.append((_getter((root[0], ref), tuple(steps[:depth])), want,
                                        _label(name, steps[:depth])))
                return

    def changed(self) -> str | None:
        """None while every constant is as traced, else which changed (one comprehension
        per kind on the hot path; the detailed scan only when something differs)."""
        try:
            if ([get() for get, _, _ in self._paths] == self._want_p
                    and [get(ref().__dict__) for ref, get, _, _ in self._modules] == self._want_m
                    and [get(d) for d, get, _, _ in self._dicts] == self._want_d
                    and [tuple([c.cell_contents for c in cells]) for cells, _ in self._cells]
                    == self._want_c):
                return None
        except (AttributeError, KeyError, ValueError):  # a module freed, a name deleted
            pass
        return self._which()

    def _which(self) -> str:
        for get, want, label in self._paths:
            if get() != want:
                return f"a value read by the step changed ({label})"
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
