"""Freeze a live autograd graph into plain JSON (schema ``symgrad.graph/1``).

The payload is what every view draws from: the static SVG, the Inspector widget, the
JupyterLab renderer (which validates it against ``graph.schema.json``, the one schema
file). Freezing matters because a notebook is saved long after the graph is freed: the
JSON holds the grad_fn chain, what each node saved (shapes, dtypes, value previews and
"same object as ``d``"), the local formula in LaTeX and the verifier's verdicts, and
nothing that needs the kernel. Symgrad graphs and torch graphs are read the same way
(``name()``, ``next_functions``, ``variable``, ``_saved_*``).
"""

from __future__ import annotations

import json
import math
import re
import weakref
from collections.abc import Iterable, Mapping
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

__all__ = ["GRAPH_MIME", "REPORT_MIME", "SCHEMA_ID", "graph_json", "load_schema", "graph",
           "GraphView", "Namer", "preview"]

GRAPH_MIME = "application/vnd.symgrad.graph+json"
REPORT_MIME = "application/vnd.symgrad.report+json"
SCHEMA_ID = "symgrad.graph/1"

#: Above this many nodes the payload is cut (``truncated`` says how many were left out);
#: the views stay usable and the notebook file stays small.
MAX_NODES = 2000


@lru_cache(maxsize=1)
def load_schema() -> dict:
    """The JSON schema of the graph payload (``symgrad/jupyter/graph.schema.json``)."""
    text = resources.files("symgrad.jupyter").joinpath("graph.schema.json").read_text("utf-8")
    return json.loads(text)


# -- values ----------------------------------------------------------------------------------

def _deref(ref: Any) -> Any:
    """A node's input reference: a weakref (normal) or the object itself (``record()``)."""
    return ref() if isinstance(ref, weakref.ReferenceType) else ref


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _is_tensor(x: Any) -> bool:
    from ..tensor import Tensor

    if isinstance(x, Tensor):
        return True
    return _is_torch(x) and hasattr(x, "grad_fn") and hasattr(x, "shape")


def _array(t: Any) -> np.ndarray | None:
    """Host values of a symgrad or torch tensor, without touching autograd."""
    try:
        from ..tensor import Tensor

        if isinstance(t, Tensor):
            return np.asarray(t.detach().cpu()._data)
        return t.detach().cpu().numpy()
    except Exception:  # noqa: BLE001 - a preview must never break the view
        return None


def _dtype_name(t: Any) -> str | None:
    d = getattr(t, "dtype", None)
    if d is None:
        return None
    name = getattr(d, "name", None)
    if isinstance(name, str):
        return name
    return str(d).replace("torch.", "")


def _shape(t: Any) -> list[int] | None:
    s = getattr(t, "shape", None)
    return None if s is None else [int(v) for v in s]


def _fmt(v: Any) -> str:
    """One number as text: ``5.``, ``0.25``, ``1e+300``, ``nan``, ``inf``, ``-inf``."""
    if isinstance(v, (bool, np.bool_)):
        return "True" if v else "False"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    try:
        v = float(v)
    except (TypeError, ValueError, OverflowError):
        return str(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v.is_integer() and abs(v) < 1e15:
        return f"{v:.0f}."
    return f"{v:.4g}"


def preview(a: Any, max_items: int = 6) -> str:
    """One line of values: ``5.``, ``[1., 2., 3.]``, ``[0.1, 0.2, …, 0.9] (100 values)``."""
    if a is None:
        return ""
    if _is_tensor(a):
        a = _array(a)
        if a is None:
            return "?"
    a = np.asarray(a)
    if a.ndim == 0:
        return _fmt(a.item())
    flat = a.ravel()
    if flat.size <= max_items:
        body = ", ".join(_fmt(v) for v in flat.tolist())
        return f"[{body}]" if a.ndim == 1 else f"[{body}] (shape {list(a.shape)})"
    half = max_items // 2
    head = ", ".join(_fmt(v) for v in flat[:half].tolist())
    tail = ", ".join(_fmt(v) for v in flat[-half:].tolist())
    return f"[{head}, …, {tail}] ({flat.size} values, shape {list(a.shape)})"


# -- names -----------------------------------------------------------------------------------

class Namer:
    """Display names for tensors: the graph's leaves as every view names them
    (``symgrad._naming``: ``tensor.name``, ``names``, the owning module's path, a
    ``namespace`` variable, else ``t0``), other tensors by the variable holding them.

    ``names`` is the caller's explicit ``{name: tensor}`` (or a namespace such as
    ``locals()``); ``namespace`` maps variable names to objects (a notebook's
    ``user_ns``); private names (``_``, ``_3``) are ignored. Two different tensors that
    would get the same name are told apart as ``d`` and ``d'``, as the verifier does.
    """

    def __init__(self, names: Mapping[str, Any] | None = None,
                 namespace: Mapping[str, Any] | None = None) -> None:
        from .._naming import _IPYTHON_NAMES, _maps

        self.names = names
        self.namespace = namespace
        self._by_id: dict[int, str] = {}
        self._keep: list[Any] = []  # keeps ids stable while the Namer lives
        for m in _maps(names) + _maps(namespace):
            for key, value in list(m.items()):
                if not isinstance(key, str) or key.startswith("_") or key in _IPYTHON_NAMES:
                    continue
                if _is_tensor(value) and id(value) not in self._by_id:
                    self._by_id[id(value)] = key
                    self._keep.append(value)
        self._assigned: dict[int, str] = {}
        self._leaves: set[int] = set()
        self._generated: set[int] = set()  # leaves named t0, t1 ...: no name a user knows
        self._taken: set[str] = set()
        self._counter = 0

    def name_leaves(self, roots: Any) -> None:
        """Name the leaves behind ``roots`` first, in the graph's fixed order, with the
        one naming function the verifier uses: a row and its leaf share one name."""
        from .._naming import leaf_order, name_leaves

        tensors = leaf_order(roots)
        got = name_leaves(roots, self.names, self.namespace, generated=self._generated)
        for t in tensors:
            name = got[id(t)]
            self._assigned[id(t)] = name
            self._leaves.add(id(t))
            self._taken.add(name)
            self._keep.append(t)

    def leaf_names(self) -> dict[str, Any]:
        """``{name: tensor}`` of the leaves named by :meth:`name_leaves`: what to pass as
        ``names=`` to the verifier so its rows carry exactly these names."""
        return {self._assigned[id(t)]: t for t in self._keep if id(t) in self._leaves}

    def variable(self, t: Any) -> str | None:
        """The name the user knows this object by: a variable holding exactly it, or,
        for a leaf of the graph, its leaf name (``fc1.weight``; not a generated ``t0``)."""
        got = self._by_id.get(id(t))
        if got is None and id(t) in self._leaves and id(t) not in self._generated:
            got = self._assigned[id(t)]
        return got

    def name(self, t: Any) -> str:
        key = id(t)
        got = self._assigned.get(key)
        if got is not None:
            return got
        base = getattr(t, "name", None) if not _is_torch(t) else None
        if not isinstance(base, str) or not base:
            base = self._by_id.get(key)
        if base is None:
            while f"t{self._counter}" in self._taken:
                self._counter += 1
            base = f"t{self._counter}"
            self._counter += 1
        name = base
        while name in self._taken:
            name += "'"
        self._taken.add(name)
        self._assigned[key] = name
        self._keep.append(t)
        return name


# -- LaTeX of a node's local formula ---------------------------------------------------------

_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&",
                  "#": r"\#", "^": r"\^{}", "_": r"\_", "%": r"\%", "~": r"\~{}"}


def latex_name(name: str) -> str:
    """A user name as LaTeX: ``w1`` -> ``w_{1}``; anything odd becomes escaped ``\\text{}``.

    The result contains no raw ``<``/``>``/``&`` HTML meaning beyond what an HTML escape of
    the whole LaTeX string (done by every HTML view) neutralises.
    """
    m = re.fullmatch(r"([A-Za-z])([0-9]*)('*)", name)
    if m:
        base, digits, primes = m.groups()
        return base + (f"_{{{digits}}}" if digits else "") + primes
    m = re.fullmatch(r"([A-Za-z][A-Za-z]+)([0-9]*)('*)", name)
    if m:
        base, digits, primes = m.groups()
        return r"\mathrm{" + base + "}" + (f"_{{{digits}}}" if digits else "") + primes
    return r"\text{" + "".join(_LATEX_SPECIAL.get(c, c) for c in name) + "}"


def _plain_float(v: float) -> bool:
    """A float SymPy shows well as a rational (finite, not extreme)."""
    return math.isfinite(v) and (v == 0 or 1e-6 <= abs(v) < 1e15)


def latex_number(v: float) -> str:
    """A number as LaTeX: ``\\mathrm{nan}``, ``\\infty``, ``1 \\cdot 10^{300}``, ``0.25``."""
    if math.isnan(v):
        return r"\mathrm{nan}"
    if math.isinf(v):
        return r"\infty" if v > 0 else r"-\infty"
    text = _fmt(v)
    if "e" in text:
        mant, exp = text.split("e")
        return rf"{mant} \cdot 10^{{{int(exp)}}}"
    return text


def _sympy_number(sp: Any, v: Any, placeholder: str, subs: dict[str, str]) -> Any:
    """A Python scalar operand for a formula: exact for ordinary values; nan, +-inf and
    extreme magnitudes become a positive placeholder symbol (times -1 when negative) that
    the LaTeX shows as the number, so ``x * nan`` reads ``\\mathrm{nan} x``, not ``NaN``."""
    if not isinstance(v, float) or _plain_float(v):
        return _nsimplify(v) if isinstance(v, float) else v
    sym = sp.Symbol(placeholder, positive=True)
    subs[placeholder] = latex_number(abs(v) if not math.isnan(v) else v)
    return -sym if v < 0 else sym


@lru_cache(maxsize=1024)
def _nsimplify(v: float) -> Any:
    """``sympy.nsimplify(v)``, once per value: it searches for a closed form (~25 ms), and
    a loop's constant (``y * 1.001``) appears at every node of the graph."""
    import sympy as sp

    return sp.nsimplify(v)


@lru_cache(maxsize=256)
def _sympy_params(fn: Any, n_inputs: int) -> tuple[str, ...]:
    """The keyword parameters of an op's SymPy meaning after ``sp`` and its inputs."""
    import inspect

    try:
        return tuple(inspect.signature(fn).parameters)[1 + n_inputs:]
    except (TypeError, ValueError):
        return ()


#: At most this many distinct SymPy derivations per graph (a node's formula and derivative
#: from its op's meaning, or a custom Function's traced forward): each costs milliseconds to
#: tens of milliseconds, so a big graph of distinct formulas would take minutes to draw.
#: Nodes whose formula repeats one already derived (same op, same scalar operands and
#: arguments: a loop's body) cost nothing and are never cut. Past the budget a node gets no
#: formula, and the payload's ``formulas_omitted`` counts them (the views say so).
FORMULA_BUDGET = 200

#: Raw LaTeX of op meanings, by what decides it: (spec, its meaning, scalar operands, saved
#: arguments) -> (placeholder texts of scalar operands, formula, per-input derivatives) or
#: None. Names are substituted afterwards, so one entry serves every node of a loop.
_LATEX_CACHE: dict[Any, Any] = {}
_LATEX_CACHE_MAX = 4096


class _Budget:
    """What :func:`graph_json` may still spend on SymPy derivations, and what it skipped."""

    __slots__ = ("left", "derived", "omitted", "done")

    def __init__(self, left: int) -> None:
        self.left = left
        self.derived = 0
        self.omitted = 0
        self.done: dict[Any, tuple[str | None, str | None]] = {}  # finished lines, by key

    def take(self) -> bool:
        if self.left <= 0:
            self.omitted += 1
            return False
        self.left -= 1
        self.derived += 1
        return True


def _value_key(v: Any) -> Any:
    """A hashable key telling apart values SymPy treats differently (1, 1.0, True; -0.0;
    nan)."""
    return (type(v), repr(v))


_OMITTED = object()


def _local_latex(node: Any, spec: Any, input_names: list[str | None],
                 out_name: str, budget: _Budget | None = None) -> Any:
    """``(formula, derivative)`` LaTeX: from the op's SymPy meaning, or a VJP template.

    The SymPy work is cached by what decides it (the op, its scalar operands and saved
    arguments), with the names as placeholders, so a loop's nodes share one derivation.
    Returns ``_OMITTED`` when it would need a new derivation past ``budget``."""
    if spec is None:
        return None, None
    if not callable(spec.sympy):
        return None, None  # a structural op without its own formula_tex
    refs = getattr(node, "_input_refs", ())
    scalars: list[Any] = []  # per input: a Python scalar operand, or _SYMBOL
    for i in range(len(spec.inputs)):
        ref = refs[i] if i < len(refs) else None
        if ref is not None and not isinstance(ref, weakref.ReferenceType) and \
                not _is_tensor(ref):  # a Python scalar operand
            scalars.append(ref)
        else:
            scalars.append(_SYMBOL)
    saved = getattr(node, "_saved", {}) or {}
    kwargs: dict[str, Any] = {}
    for p in _sympy_params(spec.sympy, len(spec.inputs)):
        value = saved.get(p)
        if isinstance(value, (int, float, bool)) and not isinstance(value, np.ndarray):
            kwargs[p] = value
    key: Any = (spec, spec.sympy, tuple(name in spec.grads for name in spec.inputs),
                tuple(None if v is _SYMBOL else _value_key(v) for v in scalars),
                tuple((p, _value_key(v)) for p, v in kwargs.items()))
    try:
        raw = _LATEX_CACHE.get(key, _OMITTED)
    except TypeError:  # an unhashable meaning or operand: derive every time
        key, raw = None, _OMITTED
    shown_of: dict[int, str] = {}
    for i, input_name in enumerate(spec.inputs):
        if scalars[i] is _SYMBOL:
            shown_of[i] = input_names[i] if i < len(input_names) and input_names[i] \
                else input_name
    done_key = (key, tuple(shown_of.values()), out_name) if key is not None else None
    if budget is not None and done_key is not None:
        got = budget.done.get(done_key)
        if got is not None:
            return got
    if raw is _OMITTED:
        if budget is not None and not budget.take():
            return _OMITTED
        raw = _derive_latex(spec, scalars, kwargs)
        if key is not None:
            if len(_LATEX_CACHE) >= _LATEX_CACHE_MAX:
                _LATEX_CACHE.pop(next(iter(_LATEX_CACHE)))
            _LATEX_CACHE[key] = raw
    if raw is None:
        return None, None
    num_subs, expr_tex, grads = raw
    subs = dict(num_subs)
    for i, shown in shown_of.items():
        subs[_symbol_name(i)] = latex_name(shown)

    def tex(out: str) -> str:
        for ph in sorted(subs, key=len, reverse=True):
            out = out.replace(ph, subs[ph])
        return out

    out_tex = latex_name(out_name)
    formula = f"{out_tex} = {tex(expr_tex)}"
    parts = [rf"\frac{{\partial {out_tex}}}{{\partial {latex_name(shown_of[i])}}} = {tex(d)}"
             for i, d in grads]
    got = formula, (r",\quad ".join(parts) if parts else None)
    if budget is not None and done_key is not None:
        budget.done[done_key] = got
    return got


_SYMBOL = object()  # an input that is a tensor (a symbol in the formula)


def _symbol_name(i: int) -> str:
    return "XSYMQ" + "".join(chr(65 + int(c)) for c in str(i))


def _derive_latex(spec: Any, scalars: list[Any], kwargs: dict[str, Any]) -> Any:
    """The SymPy part of :func:`_local_latex`: ``(num_subs, formula, [(input, derivative)])``
    as raw LaTeX with placeholder symbols for the inputs, or None."""
    try:
        import sympy as sp
    except ImportError:  # pragma: no cover - sympy is a dependency
        return None
    args: list[Any] = []
    symbols: list[tuple[int, Any]] = []
    subs: dict[str, str] = {}  # placeholder symbol name -> its LaTeX
    for i, v in enumerate(scalars):
        if v is not _SYMBOL:
            args.append(_sympy_number(sp, v, f"XNUMQ{chr(65 + len(subs))}", subs))
            continue
        sym = sp.Symbol(_symbol_name(i), real=True)
        args.append(sym)
        symbols.append((i, sym))
    kw = {}
    for p, value in kwargs.items():
        if isinstance(value, float) and not _plain_float(value):
            # nan, inf and extreme magnitudes: a symbol shown as the number (SymPy's
            # own forms are \text{NaN}, or 300 digits for nsimplify(1e300))
            value = _sympy_number(sp, value, f"XNUMQ{chr(65 + len(subs))}", subs)
        kw[p] = value
    try:
        expr = spec.sympy(sp, *args, **kw)
        grads = [(i, sp.latex(sp.diff(expr, sym))) for i, sym in symbols
                 if spec.inputs[i] in spec.grads]
        return tuple(subs.items()), sp.latex(expr), grads
    except Exception:  # noqa: BLE001 - no formula is better than a broken panel
        return None


# -- the walk --------------------------------------------------------------------------------

def _is_node(x: Any) -> bool:
    return callable(getattr(x, "name", None)) and hasattr(x, "next_functions")


def _type_name(x: Any) -> str:
    from ..tensor import _type_name as type_name  # one wording for argument errors

    return type_name(x)


def _as_roots(root: Any) -> list[Any]:
    roots = list(root) if isinstance(root, (list, tuple)) else [root]
    for r in roots:
        if not (_is_tensor(r) or _is_node(r)):
            raise TypeError("the graph's root must be a symgrad or torch tensor, a grad_fn "
                            f"node, or a list of them, not {_type_name(r)}")
    return roots


def _check_names(names: Any) -> None:
    if names is not None and not isinstance(names, (Mapping, Namer)):
        raise TypeError("names must be a mapping of variable name -> tensor (a dict such as "
                        f"locals() or {{'w': w}}) or None, not {_type_name(names)}")


def _node_output(node: Any, t: Any | None) -> tuple[list[int] | None, str | None]:
    meta = getattr(node, "_out_meta", None)
    if meta:
        shape, dtype = meta[0]
        return [int(s) for s in shape], getattr(dtype, "name", str(dtype))
    if t is not None:
        return _shape(t), _dtype_name(t)
    try:  # torch: the metadata of the gradient the node receives = its output's
        m = node._input_metadata[0]
        return [int(v) for v in m.shape], str(m.dtype).replace("torch.", "")
    except Exception:  # noqa: BLE001
        return None, None


def _saved_rows(node: Any, namer: Namer, own_output: Any | None) -> list[dict]:
    """Rows for the node's ``_saved_*`` operands, read without unpacking side effects."""
    from ..autograd import node as node_mod

    rows: list[dict] = []
    if getattr(type(node), "_forward_cls", None) is not None:  # a custom Function's ctx
        return _custom_saved_rows(node, namer)
    saved = getattr(node, "_saved", None)
    spec = getattr(type(node), "_spec", None)
    if isinstance(saved, dict) and spec is not None:
        freed = getattr(node_mod, "_FREED", None)
        wrapped = getattr(node_mod, "_WrappedScalar", ())
        saved_cls = getattr(node_mod, "SavedTensor", ())
        for name in spec.saved:
            value = saved.get(name)
            row: dict[str, Any] = {"name": name, "attr": f"_saved_{name}"}
            if value is freed and freed is not None:
                row["kind"] = "freed"
                row["preview"] = "freed by backward (use retain_graph=True)"
                t = _recorded_input(node, spec, name)
                if t is not None:  # the node still holds the input (symgrad.record())
                    _tensor_fields(row, t, namer)
            elif isinstance(value, saved_cls):
                t = value.tensor
                if t is None:
                    try:
                        t = value.unpack(node)
                    except Exception:  # noqa: BLE001
                        t = None
                is_output = getattr(value, "output_nr", -1) >= 0
                row["kind"] = "tensor"
                row["is_output"] = is_output
                row["same_object_as"] = None
                if t is not None:
                    _tensor_fields(row, t, namer if not is_output else None)
                    if getattr(t, "_storage", None) is not None and \
                            t._storage.version != value.version:
                        row["preview"] += (f" (modified in place: version "
                                           f"{t._storage.version}, saved at {value.version})")
            elif isinstance(value, wrapped):
                row["kind"] = "scalar"
                row["shape"] = []
                row["dtype"] = getattr(value.dtype, "name", None)
                row["preview"] = _fmt(value.value)
            else:
                _plain_fields(row, value)
            rows.append(row)
        return rows
    # torch nodes and anything else exposing _saved_* attributes
    try:
        attrs = sorted(a for a in dir(node) if a.startswith("_saved_"))
    except Exception:  # noqa: BLE001
        attrs = []
    for attr in attrs:
        row = {"name": attr[7:], "attr": attr}
        try:
            value = getattr(node, attr)
        except RuntimeError:
            row["kind"] = "freed"
            row["preview"] = "freed by backward (use retain_graph=True)"
            rows.append(row)
            continue
        except Exception:  # noqa: BLE001
            continue
        if _is_tensor(value):
            row["kind"] = "tensor"
            _tensor_fields(row, value, namer)
            row["is_output"] = attr == "_saved_result"
        else:
            _plain_fields(row, value)
        rows.append(row)
    return rows


def _custom_saved_rows(node: Any, namer: Namer) -> list[dict]:
    """Rows for a custom Function's node (its ``ctx``), symgrad's or torch's.

    Named as the user reads them: ``saved_tensors[i]`` for each ``save_for_backward``
    entry (torch has no ``_saved_*`` attribute for these), then each tensor the forward
    stored on ``ctx`` by its attribute name (``ctx.w`` -> ``w``), as ``vars(grad_fn)``
    lists them in torch.
    """
    from ..autograd import node as node_mod

    rows: list[dict] = []
    saved = getattr(node, "_saved", None)
    if isinstance(saved, tuple):  # symgrad: SavedTensor, None or the freed marker each
        freed = getattr(node_mod, "_FREED", None)
        saved_cls = getattr(node_mod, "SavedTensor", ())
        arg_of = getattr(node, "_saved_args", ())
        refs = getattr(node, "_input_refs", ())
        for i, value in enumerate(saved):
            name = f"saved_tensors[{i}]"
            row: dict[str, Any] = {"name": name, "attr": name}
            if value is None:
                _plain_fields(row, None)
            elif value is freed:
                row["kind"] = "freed"
                row["preview"] = "freed by backward (use retain_graph=True)"
                j = arg_of[i] if i < len(arg_of) else None
                t = _deref(refs[j]) if j is not None and j < len(refs) else None
                if _is_tensor(t):  # a saved input the node still holds (symgrad.record())
                    _tensor_fields(row, t, namer)
            elif isinstance(value, saved_cls):
                is_output = getattr(value, "output_nr", -1) >= 0
                t = value.tensor
                if t is None:
                    try:
                        t = value.unpack(node)
                    except Exception:  # noqa: BLE001
                        t = None
                row["kind"], row["is_output"], row["same_object_as"] = "tensor", is_output, None
                if t is not None:
                    _tensor_fields(row, t, namer if not is_output else None)
                    version = getattr(getattr(t, "_storage", None), "version", value.version)
                    if version != value.version:
                        row["preview"] += (f" (modified in place: version {version}, "
                                           f"saved at {value.version})")
            else:
                _plain_fields(row, value)
            rows.append(row)
    elif _is_torch(node):
        try:
            tensors = node.saved_tensors
        except RuntimeError:
            rows.append({"name": "saved_tensors", "attr": "saved_tensors", "kind": "freed",
                         "preview": "freed by backward (use retain_graph=True)"})
            tensors = ()
        except Exception:  # noqa: BLE001
            tensors = ()
        for i, t in enumerate(tensors):
            name = f"saved_tensors[{i}]"
            row = {"name": name, "attr": name}
            if _is_tensor(t):
                is_output = getattr(t, "grad_fn", None) is node
                row["kind"], row["is_output"], row["same_object_as"] = "tensor", is_output, None
                _tensor_fields(row, t, namer if not is_output else None)
            else:
                _plain_fields(row, t)
            rows.append(row)
    try:
        attrs = sorted(vars(node).items())
    except TypeError:
        attrs = []
    for name, value in attrs:  # ctx.w = w: only tensors (the ctx's own fields are not)
        if _is_tensor(value):
            row = {"name": name, "attr": name, "kind": "tensor", "is_output": False}
            _tensor_fields(row, value, namer)
            rows.append(row)
    return rows


def _tensor_fields(row: dict, t, namer) -> None:
    """Shape, dtype and preview of a saved tensor; which user variable it is (unless namer
    is None, as for a saved output, which is never the user's object)."""
    row["shape"] = _shape(t)
    row["dtype"] = _dtype_name(t)
    row["preview"] = preview(t)
    if namer is not None:
        row["same_object_as"] = _same_object(t, namer)


def _plain_fields(row: dict, value) -> None:
    """A saved non-tensor: None, size/stride metadata, a number, or anything else."""
    if value is None:
        row["kind"], row["preview"] = "none", "None"
    elif row["name"].endswith(("_sym_sizes", "_sym_strides", "_sym_numel")):
        row["kind"], row["preview"] = "meta", _short_repr(value)
    elif isinstance(value, (int, float, bool, np.number)):
        row["kind"], row["preview"] = "scalar", _fmt(value)
    else:
        row["kind"], row["preview"] = "value", _short_repr(value)


def _recorded_input(node: Any, spec: Any, name: str) -> Any:
    """The input tensor a freed saved operand was, while the node can still reach it."""
    if name not in spec.inputs:
        return None
    refs = getattr(node, "_input_refs", ())
    i = spec.inputs.index(name)
    ref = refs[i] if i < len(refs) else None
    t = _deref(ref)
    return t if _is_tensor(t) else None


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _same_object(t: Any, namer: Namer) -> str | None:
    var = namer.variable(t)
    if var is not None:
        return namer.name(t)
    name = getattr(t, "name", None) if not _is_torch(t) else None
    return name if isinstance(name, str) and name else None


def _tensor_label(t: Any | None, namer: Namer) -> str | None:
    """The name of a tensor the user can refer to (a variable or ``.name``), else None."""
    if t is None:
        return None
    if namer.variable(t) is not None or (not _is_torch(t) and getattr(t, "name", None)):
        return namer.name(t)
    return None


def _kind_of(node: Any) -> str:
    return "accumulate" if hasattr(node, "variable") and \
        node.name().endswith("AccumulateGrad") else "op"


def graph_json(root: Any, names: Mapping[str, Any] | None = None, report: Any = None, *,
               max_nodes: int = MAX_NODES, formulas: bool = True,
               node_map: dict[int, str] | None = None,
               namespace: Mapping[str, Any] | None = None,
               formula_budget: int = FORMULA_BUDGET) -> dict:
    """Freeze the graph behind ``root`` (a tensor, a grad_fn node, or a list of them).

    Leaves are named as the verifier names them (``symgrad._naming``): ``tensor.name``,
    ``names`` (``{"w": w}``, or ``locals()``), the owning module's path (``fc1.weight``),
    a variable of ``namespace`` (a notebook's ``user_ns``; default: the calling frame's
    variables), else ``t0``; saved operands and outputs by the variable holding them.
    ``report`` is a verifier Report (or its
    ``to_json()`` dict) whose per-leaf and per-node results fill the agreement table and
    the node checks. The result is plain JSON valid against :func:`load_schema`.
    ``node_map``, when given, receives ``id(node) -> node id`` (valid while the graph lives).
    ``formula_budget`` bounds the distinct SymPy derivations of node formulas (see
    :data:`FORMULA_BUDGET`); nodes past it get none and ``formulas_omitted`` counts them.
    """
    _check_names(names)
    roots = _as_roots(root)
    if isinstance(names, Namer):
        namer = names
    else:
        if names is None and namespace is None:
            from .._naming import caller_namespace

            namespace = caller_namespace()
        namer = Namer(names, namespace)
    if not namer._leaves:
        namer.name_leaves(roots)
    node_ids: dict[int, str] = {}
    nodes: list[dict] = []
    edges: list[dict] = []
    leaves: list[dict] = []
    root_ids: list[str] = []
    root_names: list[str] = []
    keep: list[Any] = []  # objects whose id() keys node_ids
    outputs: dict[int, Any] = {}  # id(node) -> a live output tensor, from the namespace
    source = "torch" if any(_is_torch(r) for r in roots) else "symgrad"

    for obj in list(getattr(namer, "_keep", [])):
        fn = getattr(obj, "grad_fn", None)
        if fn is not None and id(fn) not in outputs:
            outputs[id(fn)] = obj

    def new_id() -> str:
        return f"n{len(nodes)}"

    def leaf_node(t: Any, kind: str) -> str:
        key = id(t)
        if key in node_ids:
            return node_ids[key]
        nid = new_id()
        node_ids[key] = nid
        keep.append(t)
        name = namer.name(t)
        nodes.append({
            "id": nid, "kind": kind,
            "label": name, "name": "AccumulateGrad" if kind == "accumulate" else name,
            "shape": _shape(t), "dtype": _dtype_name(t), "variable": name,
            "saved": [], "formula": None, "derivative": None, "check": {"status": "none"},
        })
        leaf = {"id": nid, "name": name, "shape": _shape(t), "dtype": _dtype_name(t),
                "preview": preview(t)}
        g = getattr(t, "_grad", None) if not _is_torch(t) else t.grad
        leaf["grad_preview"] = preview(g) if g is not None else None
        if getattr(t, "requires_grad", False):
            leaves.append(leaf)
        return nid

    truncated = 0
    budget = _Budget(formula_budget)
    calls: dict[str, Any] = {}  # op node id -> its node's nn.Module call entry
    unseen: set[str] = set()  # torch nodes no capture saw made

    def visit(fn: Any, out_tensor: Any | None) -> str:
        """Add fn and everything below it (iteratively); return fn's id."""
        nonlocal truncated
        stack: list[tuple[Any, Any]] = [(fn, out_tensor)]
        pending: list[Any] = []
        while stack:
            cur, out_t = stack.pop()
            if id(cur) in node_ids:
                continue
            if len(nodes) >= max_nodes:
                truncated += 1
                continue
            if _kind_of(cur) == "accumulate":
                var = cur.variable
                nid = leaf_node(var, "accumulate")
                node_ids[id(cur)] = nid
                keep.append(cur)
                continue
            nid = new_id()
            node_ids[id(cur)] = nid
            keep.append(cur)
            if out_t is None:
                out_t = outputs.get(id(cur))
            shape, dtype = _node_output(cur, out_t)
            if source == "symgrad":
                calls[nid] = getattr(cur, "_module_call", None)
            else:
                seen, calls[nid] = _torch_module_call(cur)
                if not seen:
                    unseen.add(nid)
            entry = {
                "id": nid, "kind": "op", "label": cur.name(), "name": cur.name(),
                "shape": shape, "dtype": dtype,
                "variable": _tensor_label(out_t, namer),
                "saved": _saved_rows(cur, namer, out_t), "formula": None, "derivative": None,
                "check": {"status": "none"},
            }
            nodes.append(entry)
            pending.append(cur)
            for nxt, _nr in reversed(getattr(cur, "next_functions", ()) or ()):
                if nxt is not None and id(nxt) not in node_ids:
                    stack.append((nxt, None))
        # edges and None nodes, once every reachable node has an id
        for cur in pending:
            cid = node_ids[id(cur)]
            refs = getattr(cur, "_input_refs", ())
            for i, (nxt, nr) in enumerate(getattr(cur, "next_functions", ()) or ()):
                if nxt is None:
                    nid = new_id()
                    ref = refs[i] if i < len(refs) else None
                    const = _deref(ref)
                    if _is_tensor(const):
                        var = namer.name(const)
                    elif const is not None:
                        var = _fmt(const) if isinstance(const, (int, float)) else None
                    else:
                        var = None
                    nodes.append({
                        "id": nid, "kind": "none", "label": "None", "name": "None",
                        "shape": _shape(const) if _is_tensor(const) else None,
                        "dtype": _dtype_name(const) if _is_tensor(const) else None,
                        "variable": var, "saved": [], "formula": None, "derivative": None,
                        "check": {"status": "none"},
                    })
                    edges.append({"from": cid, "to": nid, "input": i, "output_nr": int(nr)})
                elif id(nxt) in node_ids:
                    edges.append({"from": cid, "to": node_ids[id(nxt)], "input": i,
                                  "output_nr": int(nr)})
            if formulas:
                _add_formula(cur, nodes[int(cid[1:])], namer, budget)
        return node_ids.get(id(fn), "")

    for r in roots:
        if _is_tensor(r):
            fn = r.grad_fn
            if fn is None:
                nid = leaf_node(r, "leaf")
                root_names.append(namer.name(r))
            else:
                nid = visit(fn, r)
                root_names.append(_tensor_label(r, namer) or "root")
        else:  # a grad_fn node
            nid = visit(r, None)
            root_names.append("root")
        if nid and nid not in root_ids:
            root_ids.append(nid)

    payload: dict[str, Any] = {
        "schema": SCHEMA_ID, "source": source, "nodes": nodes, "edges": edges,
        "roots": root_ids, "root_names": root_names, "leaves": leaves, "agreement": None,
        "truncated": truncated,
    }
    if budget.omitted:
        payload["formulas_omitted"] = budget.omitted
    _order(payload)
    if unseen:
        _inherit_torch_calls(payload, calls, unseen)
    add_modules(payload, calls, [t for t in keep if _is_tensor(t)], node_ids)
    if node_map is not None:
        node_map.update(node_ids)
    if report is not None:
        apply_report(payload, report, node_ids)
    else:
        module_verdicts(payload)
    return payload


def _add_formula(node: Any, entry: dict, namer: Namer, budget: _Budget | None = None) -> None:
    spec = getattr(type(node), "_spec", None)
    if spec is None:
        if getattr(type(node), "_forward_cls", None) is not None and \
                (budget is None or budget.take()):
            _add_custom_formula(node, entry, namer)
        return
    refs = getattr(node, "_input_refs", ())
    input_names: list[str | None] = []
    for ref in refs:
        t = _deref(ref)
        if _is_tensor(t) and (namer.variable(t) or getattr(t, "name", None)):
            input_names.append(namer.name(t))
        else:
            input_names.append(None)
    out_name = entry.get("variable") or "y"
    try:
        if spec.formula_tex is not None:
            got = _op_formula(node, spec, input_names, out_name, entry.get("shape"))
            entry["formula"], entry["derivative"] = got or (None, None)
        else:
            got = _local_latex(node, spec, input_names, out_name, budget)
            if got is not _OMITTED:
                entry["formula"], entry["derivative"] = got
    except Exception:  # noqa: BLE001 - a formula is a nicety, never an error
        entry["formula"], entry["derivative"] = None, None


def _op_formula(node: Any, spec: Any, input_names: list[str | None], out_name: str,
                out_shape: list[int] | None) -> tuple[str, str | None] | None:
    """The op's own readable line (``OpSpec.formula_tex``), fed this node's names, saved
    arguments and shapes: conv and pool lines show the node's stride, padding ..."""
    from ..autograd import node as node_mod

    refs = getattr(node, "_input_refs", ())
    saved = getattr(node, "_saved", None) or {}
    saved_cls = getattr(node_mod, "SavedTensor", ())
    wrapped = getattr(node_mod, "_WrappedScalar", ())
    freed = getattr(node_mod, "_FREED", None)
    names: dict[str, str | None] = {}
    shapes: dict[str, Any] = {"result": tuple(out_shape) if out_shape is not None else None}
    for i, name in enumerate(spec.inputs):
        ref = refs[i] if i < len(refs) else None
        t = _deref(ref)
        if ref is None:
            names[name] = None  # no input there (conv without bias)
        elif isinstance(ref, (int, float)) and not isinstance(ref, bool):
            names[name] = latex_number(float(ref))
        else:
            shown = input_names[i] if i < len(input_names) and input_names[i] else name
            names[name] = latex_name(shown)
        if _is_tensor(t):
            shapes[name] = tuple(_shape(t) or ())
    params: dict[str, Any] = {}
    for name in spec.saved:
        value = saved.get(name)
        if isinstance(value, saved_cls):
            t = value.tensor
            if t is None:
                try:
                    t = value.unpack(node)
                except Exception:  # noqa: BLE001
                    t = None
            if t is not None and name in spec.inputs:
                shapes.setdefault(name, tuple(_shape(t) or ()))
        elif isinstance(value, wrapped):
            params[name] = value.value
        elif value is not freed:
            params[name] = value
            base = name.removesuffix("_sym_sizes")
            if base != name and base in spec.inputs and value is not None:
                shapes.setdefault(base, tuple(int(v) for v in value))
    got = spec.formula_tex(names, latex_name(out_name), params, shapes)
    if got is None:
        return None
    forward, vjp = got
    return forward, vjp


def _add_custom_formula(node: Any, entry: dict, namer: Namer) -> None:
    """A custom ``autograd.Function`` (symgrad or torch) without a ``sympy`` method: its
    forward traced on symbols named after its inputs, as LaTeX beside the node."""
    def name_of(t: Any) -> str | None:
        return namer.name(t) if _is_tensor(t) and (
            namer.variable(t) or getattr(t, "name", None)) else None

    try:
        from ..symbolic.custom import traced_latex

        entry["formula"], entry["derivative"] = traced_latex(
            node, name_of, entry.get("variable") or "y", latex_name)
    except Exception:  # noqa: BLE001 - a formula is a nicety, never an error
        entry["formula"], entry["derivative"] = None, None


def _order(payload: dict) -> None:
    """``order``: position in a topological order from the roots (0 = a root)."""
    children: dict[str, list[str]] = {n["id"]: [] for n in payload["nodes"]}
    indeg: dict[str, int] = {n["id"]: 0 for n in payload["nodes"]}
    for e in payload["edges"]:
        children[e["from"]].append(e["to"])
        indeg[e["to"]] += 1
    ready = [n["id"] for n in payload["nodes"] if indeg[n["id"]] == 0]
    order: dict[str, int] = {}
    while ready:
        nid = ready.pop(0)
        order[nid] = len(order)
        for c in children[nid]:
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    for n in payload["nodes"]:
        n["order"] = order.get(n["id"], len(order))


# -- modules ---------------------------------------------------------------------------------

#: Above this many nodes a graph is first drawn collapsed to its top-level modules.
COLLAPSE_ABOVE = 60


def _torch_module_call(fn: Any) -> tuple[bool, Any]:
    """``(seen, entry)``: a torch node's module call entry, recorded by
    ``symgrad.capture_torch()`` only (torch's grad_fn nodes do not know the module that
    made them)."""
    import sys

    mod = sys.modules.get("symgrad.symbolic.torch_graph")  # loaded when a capture ran
    return mod.captured_module_call(fn) if mod is not None else (False, None)


def _inherit_torch_calls(payload: dict, calls: dict[str, Any], unseen: set[str]) -> None:
    """A torch node the capture never saw returned (the ``t()`` inside ``F.linear``'s
    ``addmm``) belongs to the module call of its consumers when they all share one."""
    consumers: dict[str, list[str]] = {}
    for e in payload["edges"]:
        consumers.setdefault(e["to"], []).append(e["from"])
    for n in sorted(payload["nodes"], key=lambda n: n.get("order", 0)):  # roots first
        nid = n["id"]
        if nid not in unseen:
            continue
        got = {id(calls.get(c)): calls.get(c) for c in consumers.get(nid, ())}
        if len(got) == 1:
            calls[nid] = next(iter(got.values()))


def _signature(type_name: str, ops: list[str], children: list[tuple[str, str]]) -> str:
    """A structural hash: the class, the op names made directly inside (as a multiset, so
    two blocks agree whatever order the graph walk met their nodes in), and the children's
    names and signatures in registration order."""
    import hashlib

    text = json.dumps([type_name, sorted(ops), children], separators=(",", ":"))
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def add_modules(payload: dict, calls: Mapping[str, Any], tensors: Iterable[Any] = (),
                node_ids: Mapping[int, str] | None = None) -> dict:
    """Fill every node's ``module`` and the payload's ``modules``, ``folds`` and
    ``collapsed`` (in place).

    ``calls`` maps op node ids to their node's ``_module_call`` entry. An op node belongs
    to the innermost module call that made it; an AccumulateGrad node to the module that
    owns its parameter; a None input to the node that consumes it. Torch's nodes know no
    module: a torch graph has module calls only where ``symgrad.capture_torch()`` recorded
    its forward, else every node gets ``""`` and the lists are empty.
    """
    from .._module_paths import ModulePaths

    names = ModulePaths(calls.values())
    module_of: dict[str, str] = {}
    for nid, entry in calls.items():
        module_of[nid] = names.of_entry(entry) if entry is not None else ""
    if names.params and node_ids is not None:
        for t in tensors:
            owner = names.params.get(id(t))
            nid = node_ids.get(id(t))
            if owner is not None and nid is not None:
                module_of.setdefault(nid, owner)
    by_id = {n["id"]: n for n in payload["nodes"]}
    for e in payload["edges"]:
        if e["to"] not in module_of and e["from"] in module_of \
                and by_id[e["to"]]["kind"] == "none":
            module_of[e["to"]] = module_of[e["from"]]
    for n in payload["nodes"]:
        n["module"] = module_of.get(n["id"], "")

    # every module holding a node, with its enclosing modules, in named_modules() order
    used = {p for p in module_of.values() if p}
    listed: set[str] = set()
    for p in used:
        parts = p.split(".")
        for k in range(1, len(parts) + 1):
            prefix = ".".join(parts[:k])
            if prefix in names.modules:
                listed.add(prefix)
    rank = {p: i for i, p in enumerate(names.modules)}
    paths = sorted(listed, key=lambda p: rank.get(p, len(rank)))

    def parent_of(p: str) -> str | None:
        while "." in p:
            p = p.rsplit(".", 1)[0]
            if p in listed:
                return p
        return None

    order = {n["id"]: n.get("order", 0) for n in payload["nodes"]}
    inside: dict[str, list[str]] = {p: [] for p in paths}
    direct_ops: dict[str, list[str]] = {p: [] for p in paths}
    for nid in sorted(module_of, key=lambda i: -order.get(i, 0)):  # forward order
        p = module_of[nid]
        if p in direct_ops and by_id[nid]["kind"] == "op":
            direct_ops[p].append(by_id[nid]["label"])
        while p:
            if p in inside:
                inside[p].append(nid)
            p = p.rsplit(".", 1)[0] if "." in p else ""
    children: dict[str | None, list[str]] = {}
    for p in paths:
        children.setdefault(parent_of(p), []).append(p)
    sig: dict[str, str] = {}
    for p in sorted(paths, key=lambda p: -p.count(".")):  # children before parents
        kids = [(k.rsplit(".", 1)[-1], sig[k]) for k in children.get(p, [])]
        sig[p] = _signature(type(names.modules[p]).__name__, direct_ops[p], kids)

    modules = []
    for p in paths:
        depth, q = 1, parent_of(p)
        while q is not None:
            depth, q = depth + 1, parent_of(q)
        modules.append({"path": p, "type": type(names.modules[p]).__name__,
                        "parent": parent_of(p), "depth": depth, "nodes": inside[p],
                        "verdict": "unchecked", "first_bad": None, "signature": sig[p]})
    folds = []
    for parent, kids in children.items():
        run: list[str] = []
        for k in kids + [None]:
            if run and (k is None or sig[k] != sig[run[0]]):
                if len(run) >= 2:
                    folds.append({"label": f"{type(names.modules[run[0]]).__name__} \u00d7 "
                                           f"{len(run)}",
                                  "parent": parent, "members": run})
                run = []
            if k is not None:
                run.append(k)
    payload["modules"] = modules
    payload["folds"] = folds
    payload["collapsed"] = top_level_collapse(payload)
    return payload


def top_level_collapse(payload: dict) -> list[str]:
    """What a big graph first shows: its top-level modules collapsed (``[]`` for a graph
    of at most :data:`COLLAPSE_ABOVE` nodes, or one without modules)."""
    if len(payload["nodes"]) <= COLLAPSE_ABOVE:
        return []
    return [m["path"] for m in payload.get("modules") or [] if m["parent"] is None]


def focus_payload(payload: dict, path: str) -> dict:
    """``payload`` cut to the nodes made inside module ``path`` (and its submodules): the
    module shown on its own, as the top of its own tree (``focus`` says which)."""
    mods = {m["path"]: m for m in payload.get("modules") or []}
    if path not in mods:
        known = ", ".join(repr(p) for p in mods) or "none (no node was made in a module)"
        raise ValueError(f"focus={path!r} is not a module of this graph; its modules: "
                         f"{known}")
    keep = set(mods[path]["nodes"])
    nodes = [n for n in payload["nodes"] if n["id"] in keep]
    edges = [e for e in payload["edges"] if e["from"] in keep and e["to"] in keep]
    fed = {e["to"] for e in edges}
    base = mods[path]["depth"] - 1
    inside = [dict(m, depth=m["depth"] - base,
                   parent=None if m["path"] == path else m["parent"])
              for m in payload["modules"]
              if m["path"] == path or m["path"].startswith(path + ".")]
    out = dict(payload, nodes=nodes, edges=edges, modules=inside, focus=path,
               roots=[n["id"] for n in nodes if n["id"] not in fed],
               leaves=[lf for lf in payload["leaves"] if lf["id"] in keep],
               folds=[f for f in payload.get("folds") or [] if f["members"][0] in
                      {m["path"] for m in inside} and f["members"][0] != path])
    out.pop("root_names", None)
    out.pop("layout", None)
    if out.get("agreement"):
        agreement = dict(out["agreement"])
        agreement["rows"] = [dict(r, node=r.get("node") if r.get("node") in keep else None)
                             for r in agreement.get("rows") or []]
        if agreement.get("first_bad_node") not in keep:
            agreement["first_bad_node"] = None
        out["agreement"] = agreement
    out["collapsed"] = []
    return out


def collapse_payload(payload: dict, collapse: Any) -> dict:
    """``payload`` with ``collapsed`` set from ``collapse``: True = the top-level modules,
    False = none, an int d = the modules at depth d (1 = top level), a path or a list of
    paths = those modules; None keeps the payload's default."""
    if collapse is None:
        return payload
    mods = payload.get("modules") or []
    if collapse is True:
        chosen = [m["path"] for m in mods if m["parent"] is None]
    elif collapse is False:
        chosen = []
    elif isinstance(collapse, int):
        if collapse < 1:
            raise ValueError(f"collapse={collapse}: a depth counts from 1 (the top-level "
                             "modules)")
        chosen = [m["path"] for m in mods if m["depth"] == collapse]
    elif isinstance(collapse, (str, list, tuple)):
        chosen = [collapse] if isinstance(collapse, str) else list(collapse)
        known = {m["path"] for m in mods}
        unknown = [p for p in chosen if p not in known]
        if unknown:
            raise ValueError(f"collapse names no module of this graph: {unknown}; its "
                             f"modules: {sorted(known)}")
    else:
        raise TypeError("collapse must be True, False, a depth (int), a module path or a "
                        f"list of paths, not {_type_name(collapse)}")
    return dict(payload, collapsed=chosen)


def module_verdicts(payload: dict) -> dict:
    """Each module's ``verdict`` from the node checks inside it (in place): ``bad`` when
    a node inside disagrees (check ``fail``), ``ok`` when some were checked, all agree and
    none's check broke down (``error``), else ``unchecked``. ``first_bad``: the node
    marked first bad when inside, else the earliest failing node in forward order."""
    by_id = {n["id"]: n for n in payload["nodes"]}
    for m in payload.get("modules") or []:
        statuses = [by_id[i]["check"]["status"] for i in m["nodes"] if i in by_id]
        fails = [i for i in m["nodes"] if i in by_id and by_id[i]["check"]["status"] == "fail"]
        if fails:
            m["verdict"] = "bad"
            marked = [i for i in fails if by_id[i].get("first_bad")]
            m["first_bad"] = marked[0] if marked else \
                max(fails, key=lambda i: by_id[i].get("order", 0))
        else:
            m["verdict"] = "ok" if "pass" in statuses and "error" not in statuses \
                else "unchecked"
            m["first_bad"] = None
    return payload


# -- the verifier's report -------------------------------------------------------------------

def _report_dict(report: Any) -> dict:
    if isinstance(report, Mapping):
        return dict(report)
    to_json = getattr(report, "to_json", None)
    if to_json is not None:
        data = to_json()
        return json.loads(data) if isinstance(data, str) else dict(data)
    raise TypeError(f"expected a symgrad Report or its to_json() dict, got {type(report)}")


_STATUS = {"ok": "pass", "pass": "pass", "passed": "pass", "mismatch": "fail", "fail": "fail",
           "failed": "fail", "error": "error", "unsupported": "skipped", "skipped": "skipped",
           "timeout": "skipped", "not run": "none", "not checked": "none", "none": "none",
           "non-finite": "error", "could not evaluate": "error", "changed in place": "error",
           "backward raised": "error"}


def _status(value: Any) -> str:
    if value is True:
        return "pass"
    if value is False:
        return "fail"
    if isinstance(value, str):
        return _STATUS.get(value.lower(), "none")
    return "none"


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if np.isfinite(f) else None


def _at(value: Any, index: Any, shape: Any) -> str | None:
    """``20.`` or ``0.25 at [1, 0]``: the verifier reports values at the worst element."""
    if value is None:
        return None
    text = _fmt(value) if isinstance(value, (int, float)) else str(value)
    if shape and index:
        text += f" at {list(index)}"
    return text


def _first_tol(d: Any) -> tuple[float | None, float | None]:
    if isinstance(d, Mapping) and d:
        tol = d.get("float32") or next(iter(d.values()))
        if isinstance(tol, Mapping):
            return _num(tol.get("rtol")), _num(tol.get("atol"))
    return None, None


#: report statuses that are neither agreement nor disagreement: the agreement's ``verdict``
#: is the report's line that starts with the status (``non-finite: arose in: ...``)
VERDICT_STATUSES = ("non-finite", "could not evaluate", "changed in place", "backward raised")


def _verdict(data: Mapping) -> str | None:
    status = data.get("status")
    if status not in VERDICT_STATUSES:
        return None
    return next((str(n) for n in data.get("notes") or [] if str(n).startswith(status)),
                str(status))


#: the verifier's note when it checked at the values kept when the graph was recorded
#: (the leaves named before it were written in place since, e.g. by ``opt.step()``)
RECORDED_NOTE = ("changed in place after the graph was recorded; checked at the values "
                 "recorded then")
_CHANGED_LEAF = re.compile(r"\s*(.+?) \((?:version [^)]*|its \.data replaced)\)(?:,|$)")


def _recorded_verdict(data: Mapping) -> str | None:
    """A report checked at the recorded values (its leaves changed in place since) is not a
    plain agreement: one line that says at which values it holds, naming the leaves."""
    ok = data.get("ok")
    if not isinstance(ok, bool):
        return None
    for note in data.get("notes") or []:
        head, sep, _ = str(note).partition(" " + RECORDED_NOTE)
        if sep:
            names = _CHANGED_LEAF.findall(head) or [head]
            return (f"checked at the values recorded before {', '.join(names)} changed in "
                    f"place: gradients {'agree' if ok else 'disagree'} there")
    return None


def apply_report(payload: dict, report: Any, node_map: Mapping[int, str] | None = None,
                 local: Any = None) -> dict:
    """Fill ``agreement`` and per-node ``check`` from a verifier Report (in place).

    ``node_map`` (``id(node or leaf tensor) -> node id``, from :func:`graph_json`) ties
    the report's rows to this payload's nodes and leaves by identity (each leaf row holds
    its tensor); without it (a JSON report) leaf rows are matched by name and node rows
    by grad_fn name in reverse topological order. ``local``: a second report whose per-node
    rows fill the node checks (when the first one ran no local checks).
    """
    data = _report_dict(report)
    leaf_by_name = {lf["name"]: lf["id"] for lf in payload["leaves"]}
    name_by_id = {lf["id"]: lf["name"] for lf in payload["leaves"]}
    objs = getattr(report, "leaves", None)
    json_rows = data.get("leaves") or []
    linked = node_map is not None and isinstance(objs, list) and len(objs) == len(json_rows)
    rows = []
    for k, row in enumerate(json_rows):
        name = str(row.get("name", "?"))
        tensor = getattr(objs[k], "tensor", None) if linked else None
        if tensor is not None:  # one truth per leaf: the row's own tensor picks its node
            nid = node_map.get(id(tensor))
            nid = nid if nid in name_by_id else None
        else:  # a JSON report (or a row without its tensor): the names both sides share
            nid = leaf_by_name.get(name)
        if nid is not None:
            name = name_by_id[nid]
        shape, worst = row.get("shape"), row.get("worst_index")
        zeros = int(row.get("exact_zeros") or 0)
        rows.append({
            "leaf": name,
            "node": nid,
            "engine": _at(row.get("engine_value"), worst, shape),
            "symbolic": _at(row.get("symbolic_value"), worst, shape),
            "symbolic_latex": row.get("symbolic_latex"),
            "finite_diff": _at(row.get("fd_value"), worst, shape),
            "max_abs_err": _num(row.get("max_abs_err")),
            "max_rel_err": _num(row.get("max_rel_err")),
            # only where there are some (an older labextension knows no such field)
            **({"exact_zeros": zeros} if zeros else {}),
            "fd_max_abs_err": _num(row.get("fd_max_abs_err")),
            "status": _status(row.get("status")),
        })
    by_id = {n["id"]: n for n in payload["nodes"]}
    first_bad = None
    node_source = report
    node_data = data
    if local is not None and all(r.get("status") == "not run" for r in data.get("nodes") or []):
        node_source, node_data = local, _report_dict(local)
    targets = _match_nodes(payload, node_source, node_data, node_map)
    for row, target in zip(node_data.get("nodes") or [], targets):
        if target is None:
            continue
        status = _status(row.get("status"))
        msg = "; ".join(x for x in (str(row.get("status") or ""), row.get("formula") or "",
                                    row.get("detail") or "") if x)
        target["check"] = {
            "status": status,
            "max_abs_err": _num(row.get("max_abs_err")),
            "max_rel_err": _num(row.get("max_rel_err")),
            "message": msg or None,
            "sampled": None,
        }
    fb = node_data.get("first_bad_node")
    if fb is not None:
        for row, target in zip(node_data.get("nodes") or [], targets):
            if row.get("id") == fb and target is not None:
                first_bad = target["id"]
    if first_bad is None:  # the first failing node in forward order
        for target in targets:
            if target is not None and target["check"]["status"] in ("fail", "error"):
                first_bad = target["id"]
                break
    for n in by_id.values():
        n.pop("first_bad", None)
    if first_bad is not None:
        by_id[first_bad]["first_bad"] = True
    rtol, atol = _first_tol(data.get("tolerances"))
    notes = list(data.get("notes") or []) + [f"skipped: {x}" for x in data.get("skipped") or []]
    ok = data.get("ok")
    verdict = _verdict(data)
    if verdict is not None:  # neither agreement nor disagreement
        ok = None
    else:  # agreement or disagreement, but at the values recorded before an in-place write
        verdict = _recorded_verdict(data)
    module_verdicts(payload)
    payload["agreement"] = {
        "ok": ok if isinstance(ok, bool) else None,
        "verdict": verdict,
        "mode": data.get("mode"),
        "rtol": rtol,
        "atol": atol,
        "first_bad_node": first_bad,
        "message": "; ".join(notes) or None,
        "rows": rows,
    }
    return payload


def _match_nodes(payload: dict, report: Any, data: dict,
                 node_map: Mapping[int, str] | None) -> list[dict | None]:
    by_id = {n["id"]: n for n in payload["nodes"]}
    rows = data.get("nodes") or []
    objs = getattr(report, "nodes", None)
    if node_map is not None and isinstance(objs, list) and len(objs) == len(rows):
        out = []
        for r in objs:
            nid = node_map.get(id(getattr(r, "node", None)))
            out.append(by_id.get(nid) if nid is not None else None)
        return out
    # JSON only: the verifier lists nodes in forward order; ours run from the roots
    pools: dict[str, list[dict]] = {}
    for n in sorted(payload["nodes"], key=lambda n: -n.get("order", 0)):
        if n["kind"] == "op":
            pools.setdefault(n["label"], []).append(n)
    out = []
    for r in rows:
        pool = pools.get(str(r.get("name")), [])
        out.append(pool.pop(0) if pool else None)
    return out


def _join(v: Any) -> str | None:
    if not v:
        return None
    if isinstance(v, str):
        return v
    if isinstance(v, Iterable):
        return "; ".join(str(x) for x in v)
    return str(v)


# -- symgrad.graph(root) ---------------------------------------------------------------------

class GraphView:
    """What ``symgrad.graph(root)`` returns: displays as the graph MIME bundle.

    The bundle carries the JSON (for the JupyterLab renderer), a static SVG in
    ``text/html`` (VS Code, nbviewer, GitHub) and a ``text/plain`` outline.
    """

    def __init__(self, root: Any = None, names: Mapping[str, Any] | None = None,
                 report: Any = None, *, payload: dict | None = None,
                 namespace: Mapping[str, Any] | None = None, collapse: Any = None,
                 focus: str | None = None) -> None:
        payload = payload if payload is not None else \
            graph_json(root, names, report, namespace=namespace)
        if focus is not None:
            payload = focus_payload(payload, focus)
        self.payload = collapse_payload(payload, collapse)

    def to_json(self) -> dict:
        return self.payload

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return mimebundle(self.payload)

    def _repr_html_(self) -> str:
        from .svg import render_html

        return render_html(self.payload)

    def __repr__(self) -> str:
        return text_outline(self.payload)


def graph(root: Any, names: Mapping[str, Any] | None = None, report: Any = None, *,
          namespace: Mapping[str, Any] | None = None, collapse: Any = None,
          focus: str | None = None) -> GraphView:
    """The graph behind ``root`` as a displayable object (JSON + SVG + text); leaves are
    named as :func:`graph_json` says (by default from the calling frame's variables).

    Nodes made inside ``nn.Module`` calls are drawn in boxes per module, each with its
    verdict from ``report`` (✓ agrees, ✗ a node inside disagrees, or not checked), so a
    wrong rule is found from the top box down. ``collapse``: which modules are drawn as
    one box: None (default) collapses a graph above 60 nodes to its top-level modules,
    True always, False never, an int d the modules at depth d (1 = top level), or a path
    / list of paths; repeated blocks that are all collapsed fold into one box
    ``Block × N``. ``focus="h.0.attn"`` shows that module's nodes on their own.
    """
    return GraphView(root, names, report, namespace=namespace, collapse=collapse,
                     focus=focus)


def with_layout(payload: dict, selected: str | None = None) -> dict:
    """A shallow copy of ``payload`` with its ``layout`` (computed now, for what is first
    drawn with ``selected`` kept out of collapsed chains): the positions the static SVG and
    the labextension both draw (layout.py)."""
    from .layout import payload_layout

    return dict(payload, layout=payload_layout(payload, selected))


def mimebundle(payload: dict) -> dict:
    from .svg import render_html

    payload = with_layout(payload)
    return {GRAPH_MIME: payload, "text/html": render_html(payload),
            "text/plain": text_outline(payload)}


def text_outline(payload: dict) -> str:
    """The grad_fn chain as indented text (torch-like names), for plain-text front ends."""
    by_id = {n["id"]: n for n in payload["nodes"]}
    children: dict[str, list[dict]] = {}
    for e in payload["edges"]:
        children.setdefault(e["from"], []).append(e)
    lines = []
    ok = (payload.get("agreement") or {}).get("ok")
    head = f"symgrad graph: {sum(n['kind'] == 'op' for n in payload['nodes'])} op nodes, " \
           f"{len(payload['leaves'])} leaves"
    verdict = (payload.get("agreement") or {}).get("verdict")
    if verdict:
        head += f", {verdict}"
    elif ok is not None:
        head += ", gradients agree" if ok else ", GRADIENTS DISAGREE"
    lines.append(head)
    tops = [m for m in payload.get("modules") or [] if m["parent"] is None]
    if tops:  # the module boxes' verdicts, for a plain-text front end
        marks = {"ok": "\u2713", "bad": "\u2717", "unchecked": "not checked"}
        lines.append("modules: " + ", ".join(f"{m['path']}: {m['type']} {marks[m['verdict']]}"
                                             for m in tops))
    seen: set[str] = set()
    stack = [(rid, 0) for rid in reversed(payload["roots"])]
    while stack and len(lines) < 200:
        nid, depth = stack.pop()
        n = by_id[nid]
        desc = n["label"]
        if n["kind"] == "accumulate":
            desc = f"AccumulateGrad ({n['label']})"
        if n.get("shape") is not None and n["kind"] != "none":
            desc += f" {n['shape']}"
        status = n["check"]["status"]
        if status != "none":
            desc += f" [{status}]"
        if nid in seen:
            lines.append("  " * depth + desc + " (see above)")
            continue
        seen.add(nid)
        lines.append("  " * depth + desc)
        for e in reversed(children.get(nid, [])):
            stack.append((e["to"], depth + 1))
    if len(lines) >= 200:
        lines.append("…")
    return "\n".join(lines)
