"""The symbolic engine (SymPy or symengine), high-precision evaluation and partials.

Both engines build the same expression trees (Add, Mul, Pow, functions, Piecewise),
so one evaluator walks either by type name and computes with mpmath at ``DPS`` digits.
Partial derivatives take a fast path for the sums of products that structural ops
produce and fall back to the engine's ``diff`` (SymPy's when symengine cannot do it,
e.g. ``Abs`` or ``Max``).
"""

from __future__ import annotations

from collections import ChainMap

import mpmath
import numpy as np

#: Digits used for "exact" evaluation (the issue asks for at least 30).
DPS = 40

_mp = mpmath.mp


def pick_engine(backend: str = "auto"):
    """The module used to build expressions: symengine when installed (``auto``)."""
    if backend not in ("auto", "sympy", "symengine"):
        raise ValueError(f"backend must be 'auto', 'sympy' or 'symengine', not {backend!r}")
    if backend in ("auto", "symengine"):
        try:
            import symengine

            return symengine, "symengine"
        except ImportError:
            if backend == "symengine":
                raise ImportError("backend='symengine' needs the symengine package "
                                  "(pip install 'symgrad[fast]')") from None
    import sympy

    return sympy, "sympy"


def make_symbol(engine_name: str, name: str):
    if engine_name == "symengine":
        import symengine

        return symengine.Symbol(name)
    import sympy

    return sympy.Symbol(name, real=True)


def to_sympy(expr, sym_map: dict):
    """An engine expression as SymPy, with our real symbols restored."""
    import sympy

    if isinstance(expr, sympy.Basic):
        return expr
    if isinstance(expr, (int, float)):
        return sympy.sympify(expr)
    e = sympy.sympify(expr)
    if sym_map:
        e = e.xreplace({s: sym_map[s.name] for s in e.free_symbols if s.name in sym_map})
    return e


def is_atom(v) -> bool:
    if isinstance(v, (int, float, bool, np.number, np.bool_)):
        return True
    return bool(getattr(v, "is_Symbol", False) or getattr(v, "is_Number", False))


def is_symbol(v) -> bool:
    return bool(getattr(v, "is_Symbol", False))


def free_symbols(e):
    if isinstance(e, (int, float, bool, np.number, np.bool_)):
        return set()
    return e.free_symbols


# -- evaluation -------------------------------------------------------------------------
class Evaluator:
    """Evaluate engine expressions with mpmath at the given symbol values."""

    def __init__(self, values: dict) -> None:
        self.values = values  # symbol -> mpf
        self._names = None

    def __call__(self, e):
        return self.ev(e)

    def ev(self, e):
        if isinstance(e, (bool, np.bool_)):
            return bool(e)
        if isinstance(e, (int, np.integer)):
            return _mp.mpf(int(e))
        if isinstance(e, (float, np.floating)):
            return _mp.mpf(float(e))
        v = self.values.get(e)
        if v is not None:
            return v
        name = type(e).__name__
        fn = _DISPATCH.get(name)
        if fn is not None:
            return fn(self, e)
        if getattr(e, "is_Number", False):
            return _number(e)
        return self._fallback(e)

    def _symbol(self, e):
        v = self.values.get(e)
        if v is None:
            if self._names is None:
                self._names = {getattr(k, "name", None): v for k, v in self.values.items()}
            v = self._names[e.name]
        return v

    def _fallback(self, e):
        import sympy

        if not isinstance(e, sympy.Basic):  # a symengine wrapper of a SymPy function
            s = sympy.sympify(e)
            if type(s).__name__ in _DISPATCH:
                return self.ev(s)
        else:
            s = e
        # the symbols' values exactly (a 40-digit decimal of a recorded double is a hair
        # off it, which flips a comparison with the double itself)
        prec = max(_mp.prec, 53)
        subs = {x: sympy.Float._new(_mp.mpf(self._symbol(x))._mpf_, prec)
                for x in s.free_symbols}
        r = s.xreplace(subs).evalf(DPS)
        if not r.is_number:
            raise ValueError(f"cannot evaluate {e}")
        try:
            return _mp.mpf(str(r))
        except ValueError:
            return _mp.nan


class DecisionEvaluator(Evaluator):
    """Values for branch decisions: the engine's *recorded* value of every atom.

    An intermediate symbol's high-precision value can differ from the value the engine
    recorded for it (a mean that the engine rounded onto a clamp bound is, exactly, a hair
    off it), and the engine's backward took its branch at the recorded value. So
    decisions read ``recorded`` (symbol -> mpf of the recorded float) first and fall back
    to ``values`` (the high-precision ones) for symbols that have no recorded value.
    ``round`` (``numpy.float32`` for a float32 node, else None) rounds the numbers of the
    meaning (clamp bounds, scalars) to the node's dtype, as the engine's kernel compares
    a float32 element with float32(bound).
    """

    _NUMS = ("Float", "RealDouble", "RealMPFR")

    def __init__(self, recorded: dict, values: dict) -> None:
        super().__init__(ChainMap(recorded, values))
        self.round = None

    def ev(self, e):
        if self.round is not None and (isinstance(e, (float, np.floating))
                                       or type(e).__name__ in self._NUMS):
            return _mp.mpf(float(self.round(float(e))))
        return super().ev(e)


def _number(e):
    name = type(e).__name__
    if name in ("Integer", "Zero", "One", "NegativeOne"):
        return _mp.mpf(int(e))
    if name in ("Rational", "Half"):
        p, q = e.p, e.q if hasattr(e, "p") else (None, None)
        return _mp.mpf(int(p)) / int(q)
    if name in ("Float",):
        return _mp.mpf(e._mpf_) if hasattr(e, "_mpf_") else _mp.mpf(str(e))
    if name in ("RealDouble",):
        return _mp.mpf(float(e))
    try:
        return _mp.mpf(str(e))
    except Exception:
        return _mp.mpf(float(e))


def _rational(ev, e):
    try:
        return _mp.mpf(int(e.p)) / int(e.q)
    except AttributeError:
        num, den = str(e).split("/")
        return _mp.mpf(int(num)) / int(den)


def _add(ev, e):
    s = _mp.mpf(0)
    for a in e.args:
        s += ev.ev(a)
    return s


def _mul(ev, e):
    s = _mp.mpf(1)
    for a in e.args:
        s *= ev.ev(a)
    return s


def _pow(ev, e):
    b, x = e.args
    if type(b).__name__ == "Exp1":
        return _mp.exp(ev.ev(x))
    bv = ev.ev(b)
    if getattr(x, "is_Integer", False):
        n = int(x)
        if bv == 0 and n < 0:  # 1/0: inf, as the engine's float division gives
            return _mp.inf
        return bv ** n
    xv = ev.ev(x)
    if bv < 0 and xv != int(xv):
        return _mp.nan
    if bv == 0 and xv < 0:
        return _mp.inf
    return bv ** xv


def _f(fn):
    return lambda ev, e: fn(ev.ev(e.args[0]))


def _sign(x):
    return _mp.mpf(0) if x == 0 else (_mp.mpf(1) if x > 0 else _mp.mpf(-1))


def _log(x):
    return _mp.log(x) if x > 0 else (_mp.mpf("-inf") if x == 0 else _mp.nan)


def _piecewise(ev, e):
    args = e.args
    if args and type(args[0]).__name__ == "ExprCondPair":
        pairs = [(a.args[0], a.args[1]) for a in args]
    else:
        pairs = [(args[i], args[i + 1]) for i in range(0, len(args), 2)]
    for val, cond in pairs:
        if ev.ev(cond):
            return ev.ev(val)
    return _mp.nan


def _rel(op):
    def f(ev, e):
        a, b = ev.ev(e.args[0]), ev.ev(e.args[1])
        return op(a, b)

    return f


_DISPATCH = {
    "Symbol": lambda ev, e: ev._symbol(e),
    "Dummy": lambda ev, e: ev._symbol(e),
    "Integer": lambda ev, e: _mp.mpf(int(e)),
    "Zero": lambda ev, e: _mp.mpf(0),
    "One": lambda ev, e: _mp.mpf(1),
    "NegativeOne": lambda ev, e: _mp.mpf(-1),
    "Half": lambda ev, e: _mp.mpf(1) / 2,
    "Rational": _rational,
    "Float": lambda ev, e: _number(e),
    "RealDouble": lambda ev, e: _mp.mpf(float(e)),
    "RealMPFR": lambda ev, e: _mp.mpf(str(e)),
    "Exp1": lambda ev, e: _mp.e,
    "Pi": lambda ev, e: _mp.pi,
    "Infinity": lambda ev, e: _mp.inf,
    "NegativeInfinity": lambda ev, e: -_mp.inf,
    "NaN": lambda ev, e: _mp.nan,
    "Add": _add,
    "Mul": _mul,
    "Pow": _pow,
    "exp": _f(_mp.exp),
    "log": _f(_log),
    "sin": _f(_mp.sin),
    "cos": _f(_mp.cos),
    "tan": _f(_mp.tan),
    "tanh": _f(_mp.tanh),
    "sinh": _f(_mp.sinh),
    "cosh": _f(_mp.cosh),
    "atan": _f(_mp.atan),
    "asin": _f(_mp.asin),
    "acos": _f(_mp.acos),
    "erf": _f(_mp.erf),
    "Abs": _f(abs),
    "sign": _f(_sign),
    # derivatives of sign/Heaviside: 0 everywhere, as PyTorch's sign backward is 0
    "DiracDelta": lambda ev, e: _mp.mpf(0),
    "Heaviside": lambda ev, e: (lambda x: _mp.mpf(1) if x > 0 else (
        _mp.mpf(0) if x < 0 else _mp.mpf(1) / 2))(ev.ev(e.args[0])),
    "Max": lambda ev, e: max(ev.ev(a) for a in e.args),
    "Min": lambda ev, e: min(ev.ev(a) for a in e.args),
    "Piecewise": _piecewise,
    "BooleanTrue": lambda ev, e: True,
    "BooleanFalse": lambda ev, e: False,
    "BooleanAtom": lambda ev, e: bool(e == e.__class__(True)) if False else str(e) == "True",
    "StrictGreaterThan": _rel(lambda a, b: a > b),
    "GreaterThan": _rel(lambda a, b: a >= b),
    "StrictLessThan": _rel(lambda a, b: a < b),
    "LessThan": _rel(lambda a, b: a <= b),
    "Equality": _rel(lambda a, b: a == b),
    "Unequality": _rel(lambda a, b: a != b),
    "And": lambda ev, e: all(ev.ev(a) for a in e.args),
    "Or": lambda ev, e: any(ev.ev(a) for a in e.args),
    "Not": lambda ev, e: not ev.ev(e.args[0]),
}


def abs_value(ev, e):
    """The magnitude of the terms of ``e``: ``e`` evaluated with every sum replaced by the
    sum of its terms' absolute values (products and integer powers of those). A rounding
    error bound scales with it, so a difference of large terms (softmax's
    ``y - y**2`` near 1) is not mistaken for a small value."""
    name = type(e).__name__
    if name == "Add":
        return sum((abs_value(ev, a) for a in e.args), _mp.mpf(0))
    if name == "Mul":
        out = _mp.mpf(1)
        for a in e.args:
            out *= abs_value(ev, a)
        return out
    if name == "Pow" and getattr(e.args[1], "is_Integer", False):
        n = int(e.args[1])
        b = abs_value(ev, e.args[0])
        if n < 0:
            b = abs(ev.ev(e.args[0]))  # 1/x: the value itself sets the scale
            return _mp.inf if b == 0 else b ** n
        return b ** n
    v = ev.ev(e)
    return abs(v) if v == v else _mp.mpf(0)


# -- partial derivatives ----------------------------------------------------------------
def partials(e, engine_name: str) -> dict:
    """``{symbol: d e / d symbol}`` for every free symbol of ``e``."""
    if is_atom(e):
        return {e: 1} if is_symbol(e) else {}
    name = type(e).__name__
    if name == "Add":
        out: dict = {}
        for t in e.args:
            for s, p in _term_partials(t, engine_name).items():
                out[s] = p if s not in out else out[s] + p
        return out
    return _term_partials(e, engine_name)


def _term_partials(t, engine_name):
    if is_atom(t):
        return {t: 1} if is_symbol(t) else {}
    if type(t).__name__ == "Mul":
        args = t.args
        syms = [a for a in args if is_symbol(a)]
        others = [a for a in args if not is_symbol(a)]
        if len(set(syms)) == len(syms) and all(not free_symbols(a) for a in others):
            out = {}
            for i, a in enumerate(args):
                if is_symbol(a):
                    rest = args[:i] + args[i + 1:]
                    out[a] = rest[0] if len(rest) == 1 else _mul_all(rest, engine_name)
            return out
    return {s: diff(t, s, engine_name) for s in free_symbols(t)}


def _mul_all(args, engine_name):
    if engine_name == "symengine":
        import symengine

        return symengine.Mul(*args)
    import sympy

    return sympy.Mul(*args)


def diff(e, s, engine_name):
    """``de/ds``; symengine defers to SymPy where it leaves a ``Derivative``."""
    if type(e).__name__ == "Pow" and e.args[0] == s and s not in free_symbols(e.args[1]) \
            and free_symbols(e.args[1]):
        b, x = e.args  # SymPy writes x**y*y/x, which is 0/0 at x = 0
        return x * b ** (x - 1)
    d = e.diff(s)
    if engine_name == "symengine" and "Derivative" in str(type(d).__name__) or (
            engine_name == "symengine" and _has_derivative(d)):
        import symengine
        import sympy

        ss = sympy.Symbol(s.name, real=True)
        se_ = sympy.sympify(e).xreplace({x: sympy.Symbol(x.name, real=True)
                                          for x in sympy.sympify(e).free_symbols})
        d = symengine.sympify(sympy.diff(se_, ss))
    return d


def _has_derivative(d) -> bool:
    if type(d).__name__ in ("Derivative", "Subs"):
        return True
    return any(_has_derivative(a) for a in getattr(d, "args", ()))


# -- branches decided at the values -------------------------------------------------------
#: Ops whose ties split the gradient evenly (PyTorch's maximum/minimum). Elsewhere (clamp
#: and its variants) the first argument as written wins a tie: the clamped value passes
#: its gradient at the bounds, as PyTorch's clamp does.
SPLIT_TIES = {"maximum", "minimum"}


class DecidingEngine:
    """The engine module with ``Max``/``Min``/``Piecewise`` decided at the symbols' values.

    An elementwise SymPy meaning built through this proxy is the branch PyTorch's kernel
    takes at the recorded values, so its derivative is PyTorch's one-sided one there.
    """

    def __init__(self, engine, valuation, split_ties: bool) -> None:
        self._engine = engine
        self._value = valuation
        self._split = split_ties
        self.__name__ = getattr(engine, "__name__", "engine")

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def _pick(self, args, larger):
        vals = [self._value(a) for a in args]
        best = max(vals) if larger else min(vals)
        tied = [a for a, v in zip(args, vals) if v == best]
        if len(tied) == 1 or not self._split:
            return tied[0]
        return self._engine.Add(*tied) / len(tied)

    def Max(self, *args):  # noqa: N802  (SymPy's name)
        return self._pick(args, True)

    def Min(self, *args):  # noqa: N802
        return self._pick(args, False)

    def Abs(self, x):  # noqa: N802
        """|x| as the branch at x's value: x, -x, or 0 where x is 0 (abs'(0) = 0)."""
        v = self._value(x)
        if v != v:  # nan: no branch to take
            return self._engine.Abs(x)
        return x if v > 0 else (-x if v < 0 else self._engine.Integer(0))

    def sign(self, x):
        v = self._value(x)
        if v != v:
            return self._engine.sign(x)
        return self._engine.Integer(1 if v > 0 else (-1 if v < 0 else 0))

    def Piecewise(self, *pairs):  # noqa: N802
        for expr, cond in pairs:
            if cond is True or str(cond) == "True" or bool(self._value(cond)):
                return expr
        return self._engine.nan
