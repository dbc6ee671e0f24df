"""The scalar math of an elementwise op, written once as data.

An elementwise stanza gives its forward and its backward as small Python expressions on
one element, over a fixed vocabulary of math functions::

    Scalar(forward="tanh(x)", grad="g * (1 - y * y)")

``x`` is the input, ``y`` the output and ``g`` the incoming gradient; ``forward`` may
bind names first (``"e = exp(-abs(x)); where(x >= 0, 1 / (1 + e), e / (1 + e))"``).
``grad`` is the chain rule on one element (the partial derivative times ``g``), so it is
also the op's tensor-level backward formula, read with tensors for ``g``, ``x`` and ``y``.
``meaning`` is the mathematical forward where ``forward`` is a numerically special form
(sigmoid's overflow-free one); the SymPy meaning is built from it.

Ops of several inputs name them (``inputs=("a", "b")``, in the OpSpec's input order) and
give one ``grad`` per input (None where the input gets no gradient); Python-number
arguments of the op are ``params`` (softplus's ``beta``)::

    Scalar(forward="a * b", grad=("g * b", "g * a"), inputs=("a", "b"))

Each backend turns the expressions into its kernels with its own implementation of the
vocabulary (NumPy ufuncs, ``math`` inside Numba loops, CUDA device functions, SymPy);
``build`` does the compiling for all of them, so nothing here imports a backend.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
from dataclasses import dataclass, field

__all__ = ["FUNCTIONS", "TRANSCENDENTAL", "Scalar", "build", "source"]

#: The vocabulary an expression may call. ``where(c, a, b)`` is a select, ``sign`` follows
#: torch 2.13 (sign(0) = 0 and sign(NaN) = 0), ``maximum`` propagates NaN as torch.maximum does.
FUNCTIONS = ("exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "sign", "where", "maximum",
             "minimum", "log1p", "expm1", "erf", "atan2", "hypot", "pow", "log2", "log10")
#: Functions a backend computes with a libm call (the CPU backend keeps NumPy's SIMD ones).
TRANSCENDENTAL = frozenset({"exp", "log", "sin", "cos", "tanh", "sqrt", "log1p", "expm1", "erf",
                            "atan2", "hypot", "pow", "log2", "log10"})
#: Constants an expression may name: exact in SymPy, the nearest float elsewhere.
CONSTANTS = ("pi",)
#: Expression variable -> the name an OpSpec formula uses for it.
VARIABLES = {"g": "grad", "x": "self", "y": "result"}

_NODES = (ast.Expression, ast.Module, ast.Assign, ast.Expr, ast.Name, ast.Load, ast.Store,
          ast.Constant, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Add, ast.Sub,
          ast.Mult, ast.Div, ast.USub, ast.Gt, ast.GtE, ast.Lt, ast.LtE, ast.Eq, ast.NotEq,
          ast.BitAnd, ast.BitOr)


def _lines(text: str) -> str:
    return "\n".join(part.strip() for part in text.split(";"))


@functools.lru_cache(maxsize=1024)
def _parse(text: str, variables: tuple[str, ...]) -> tuple[tuple[tuple[str, str], ...], str]:
    """Split ``"a = ...; b = ...; expr"`` into bindings and the result; check the vocabulary.
    Cached: every stanza's texts are parsed by each backend's generator."""
    tree = ast.parse(_lines(text))
    *lets, last = tree.body
    if not isinstance(last, ast.Expr) or not all(
            isinstance(s, ast.Assign) and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Name) for s in lets):
        raise ValueError(f"{text!r}: bindings 'name = expr', then one expression")
    known = set(variables) | set(CONSTANTS)
    for stmt in tree.body:
        for node in ast.walk(stmt.value):
            if not isinstance(node, _NODES):
                raise ValueError(f"{text!r}: {type(node).__name__} is outside the language")
            if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name)
                                                or node.func.id not in FUNCTIONS):
                raise ValueError(f"{text!r}: calls {ast.unparse(node.func)}, not in FUNCTIONS")
            if isinstance(node, ast.Name) and node.id not in known and node.id not in FUNCTIONS:
                raise ValueError(f"{text!r}: unknown name {node.id!r}")
        if isinstance(stmt, ast.Assign):
            known.add(stmt.targets[0].id)
    return (tuple((s.targets[0].id, ast.unparse(s.value)) for s in lets),
            ast.unparse(last.value))


@functools.lru_cache(maxsize=1024)
def _names(text: str) -> frozenset[str]:
    return frozenset(n.id for n in ast.walk(ast.parse(_lines(text))) if isinstance(n, ast.Name))


@functools.lru_cache(maxsize=1024)
def _calls(text: str) -> frozenset[str]:
    return frozenset(n.func.id for n in ast.walk(ast.parse(_lines(text)))
                     if isinstance(n, ast.Call))


@dataclass(frozen=True)
class Scalar:
    forward: str
    grad: str | tuple[str | None, ...] | None = None
    meaning: str | None = None
    #: the expression's names of the op's tensor inputs, in the OpSpec's order
    inputs: tuple[str, ...] = ("x",)
    #: the op's Python-number arguments, by the names the op takes them
    params: tuple[str, ...] = ()
    #: unary ops: the saved operand ``grad`` reads: "x", "y" or None (a constant partial)
    operand: str | None = field(init=False)

    def __post_init__(self) -> None:
        for name in self.inputs + self.params:
            if name in ("g", "y") or name in FUNCTIONS or name in CONSTANTS:
                raise ValueError(f"{name!r} is reserved in scalar expressions")
        _parse(self.forward, self.inputs + self.params)
        _parse(self.meaning or self.forward, self.inputs + self.params)
        if self.grad is not None and len(self.grads) != len(self.inputs):
            raise ValueError(f"{self.forward!r}: one grad per input {self.inputs}")
        for text in self.grads:
            if text is not None:
                _parse(text, ("g", "y") + self.inputs + self.params)
        operand = None
        if len(self.inputs) == 1 and self.grads and self.grads[0] is not None:
            used = self.reads(0)
            if len(used) > 1:
                raise ValueError(f"{self.grad!r}: read x or y, not both (one saved operand)")
            operand = used[0] if used else None
        object.__setattr__(self, "operand", operand)

    @property
    def grads(self) -> tuple[str | None, ...]:
        """One partial-times-``g`` expression per input (None: no gradient)."""
        if self.grad is None:
            return ()
        return (self.grad,) if isinstance(self.grad, str) else tuple(self.grad)

    def reads(self, index: int) -> tuple[str, ...]:
        """The values grad ``index`` reads besides ``g``: inputs in order, then ``y``."""
        names = _names(self.grads[index])
        return tuple(v for v in self.inputs + ("y",) if v in names)

    def param_reads(self, index: int) -> tuple[str, ...]:
        names = _names(self.grads[index])
        return tuple(p for p in self.params if p in names)

    @property
    def linear(self) -> bool:
        """The forward only adds and negates (neg): linear in x."""
        tree = ast.parse(_lines(self.forward))
        return not any(isinstance(n, (ast.Call, ast.Mult, ast.Div, ast.Compare))
                       for n in ast.walk(tree))

    @property
    def memory_bound(self) -> bool:
        """The forward is arithmetic and selects only: one pass is limited by memory."""
        return not (_calls(self.forward) & TRANSCENDENTAL) and "/" not in self.forward

    def calls(self, which: str = "forward") -> set[str]:
        """Functions the forward (or, with "grad", any of the grads) calls."""
        if which == "grad":
            return set().union(*(_calls(t) for t in self.grads if t is not None))
        return set(_calls(getattr(self, which)))


def source(name: str, params: tuple[str, ...], text: str, rename: dict | None = None,
           prelude: tuple[tuple[str, str], ...] = (), equality_calls: bool = False,
           fold_constants=None) -> str:
    """The text of ``def name(*params)`` computing expression ``text``; ``prelude`` binds
    names first with code of the caller's own (outside the checked language);
    ``equality_calls`` writes ``a == b`` / ``a != b`` as ``_eq(a, b)`` / ``_ne(a, b)``;
    ``fold_constants`` writes each variable-free part (``sqrt(2) / 2``, ``pi``) as
    ``_constant('<its text>', grad)`` (``"grad"``: the caller's namespace decides how the
    constant is computed), or, given a callable, as the Python float it returns."""
    lets, result = _parse(text, tuple(rename or ()) + params)
    if rename:
        result = _rename(result, rename)
        lets = [(rename.get(n, n), _rename(e, rename)) for n, e in lets]
    if equality_calls:
        result = _equality_calls(result)
        lets = [(n, _equality_calls(e)) for n, e in lets]
    if fold_constants:
        variables = set(params) | {n for n, _ in lets}
        result = _fold_constants(result, variables, fold_constants)
        lets = [(n, _fold_constants(e, variables, fold_constants)) for n, e in lets]
    lets = list(prelude) + list(lets)
    lines = [f"def {name}({', '.join(params)}):"]
    lines += [f"    {n} = {e}" for n, e in lets]
    lines.append(f"    return {result}")
    return "\n".join(lines) + "\n"


class _EqualityCalls(ast.NodeTransformer):
    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            fn = "_eq" if isinstance(node.ops[0], ast.Eq) else "_ne"
            return ast.Call(ast.Name(fn, ast.Load()), [node.left, node.comparators[0]], [])
        return node


def _equality_calls(text: str) -> str:
    """SymPy's ``==`` compares structure (a Python bool); the math needs ``Eq``."""
    return ast.unparse(_EqualityCalls().visit(ast.parse(text, mode="eval")))


class _FoldConstants(ast.NodeTransformer):
    def __init__(self, variables: set, fold) -> None:
        self.variables = variables
        self.fold = fold

    def _constant(self, node) -> bool:
        return not isinstance(node, ast.Constant) and not any(
            isinstance(n, ast.Name) and (n.id in self.variables or (
                n.id in FUNCTIONS and n is node)) for n in ast.walk(node))

    def visit(self, node):
        if isinstance(node, ast.expr) and self._constant(node):
            if callable(self.fold):
                value = float(self.fold(ast.unparse(node)))
                return ast.parse(repr(value), mode="eval").body  # -x parses as a UnaryOp
            return ast.Call(ast.Name("_constant", ast.Load()),
                            [ast.Constant(ast.unparse(node)), ast.Name(self.fold, ast.Load())],
                            [])
        return super().visit(node)


def _fold_constants(text: str, variables: set, fold) -> str:
    tree = _FoldConstants(variables, fold).visit(ast.parse(text, mode="eval"))
    return ast.unparse(tree)


def _rename(text: str, mapping: dict) -> str:
    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in mapping:
            node.id = mapping[node.id]
    return ast.unparse(tree)


def build(name: str, params: tuple[str, ...], text: str, namespace: dict,
          rename: dict | None = None, prelude: tuple[tuple[str, str], ...] = (),
          fold_constants=None):
    """Compile expression ``text`` into a function ``name(*params)`` whose calls resolve in
    ``namespace``. Its source is kept in ``linecache``, so tracebacks and
    ``inspect.getsource`` show the generated line."""
    if name in FUNCTIONS or name in namespace:
        raise ValueError(f"{name!r} would shadow a name the expression calls")
    src = source(name, params, text, rename, prelude, equality_calls="_eq" in namespace,
                 fold_constants=fold_constants)
    return define(src, f"<symgrad scalar {name}>", namespace)[name]


def define(src: str, filename: str, namespace: dict) -> dict:
    """Run generated source in a copy of ``namespace`` and return it; the text is kept in
    ``linecache`` under ``filename``, so tracebacks and ``inspect.getsource`` show it."""
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    glb = dict(namespace)
    exec(compile(src, filename, "exec"), glb)  # noqa: S102 - generated by symgrad
    return glb


def tensor_formula(op: str, scalar: Scalar, namespace: dict, names: tuple[str, ...] = ("self",),
                   index: int = 0, extra: tuple[str, ...] = ()):
    """The OpSpec backward formula ``(grad, <saved>...) -> tensor`` of input ``index``
    from ``scalar.grads[index]``; ``names`` are the OpSpec's input names. ``extra``
    parameters are taken and ignored, so the op saves them (as torch does)."""
    rename = {**VARIABLES, **dict(zip(scalar.inputs, names))}
    params = ("grad",) + tuple(rename[v] for v in scalar.reads(index)) \
        + scalar.param_reads(index) + tuple(extra)
    return LazyFunction(f"{op}_backward_formula_{index}", params, lambda: build(
        f"{op}_backward_formula_{index}", params, scalar.grads[index], namespace,
        rename=rename, fold_constants="grad"))


class LazyFunction:
    """A generated function compiled on its first call, with its signature known before (the
    OpSpec reads a formula's parameters to derive the saved operands): compiling every
    stanza's formulas at import cost ~30 ms of ``import symgrad``."""

    def __init__(self, name: str, params: tuple[str, ...], make) -> None:
        P = inspect.Parameter
        self.__name__ = self.__qualname__ = name
        self.__signature__ = inspect.Signature([P(p, P.POSITIONAL_OR_KEYWORD) for p in params])
        self._make = make
        self._fn = None

    def __call__(lazy, /, *args, **kwargs):  # noqa: N805  (formulas take ``self=``)
        fn = lazy._fn
        if fn is None:
            fn = lazy._fn = lazy._make()
        return fn(*args, **kwargs)

    @property
    def function(self):
        """The compiled function (``inspect.getsource`` shows its generated text)."""
        if self._fn is None:
            self._fn = self._make()
        return self._fn


def sympy_meaning(op: str, scalar: Scalar):
    """The OpSpec SymPy meaning ``(sp, *inputs, **params) -> expression``, for the sympy or
    symengine module."""
    text = scalar.meaning or scalar.forward
    built: dict = {}

    def meaning(sp, *xs, **params):
        fn = built.get(id(sp))
        if fn is None:
            fn = built[id(sp)] = build(f"{op}_meaning", scalar.inputs + scalar.params, text,
                                       sympy_namespace(sp))
        # an op's other recorded arguments (gelu's ``approximate``) are not the math's
        return fn(*xs, **{p: v for p, v in params.items() if p in scalar.params})

    meaning.__name__ = f"{op}_meaning"
    meaning.expression = text
    return meaning


def sympy_namespace(sp) -> dict:
    """The vocabulary in SymPy (or symengine): exact functions and constants, ``where`` as
    a Piecewise."""
    names = {"exp": "exp", "log": "log", "sin": "sin", "cos": "cos", "tanh": "tanh",
             "sqrt": "sqrt", "abs": "Abs", "sign": "sign", "maximum": "Max", "minimum": "Min",
             "erf": "erf", "atan2": "atan2", "pi": "pi"}
    out = {f: getattr(sp, n) for f, n in names.items() if hasattr(sp, n)}
    out["log1p"] = lambda x: sp.log(1 + x)
    out["log2"] = lambda x: sp.log(x) / sp.log(2)
    out["log10"] = lambda x: sp.log(x) / sp.log(10)
    out["expm1"] = lambda x: sp.exp(x) - 1
    out["hypot"] = lambda a, b: sp.sqrt(a * a + b * b)
    out["pow"] = lambda a, b: a ** b
    out["where"] = lambda c, a, b: sp.Piecewise((a, c), (b, True))
    out["_eq"], out["_ne"] = sp.Eq, sp.Ne  # ``==`` on SymPy objects is structural
    return out
