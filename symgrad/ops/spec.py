"""OpSpec: the one place an op is defined.

Like a row of PyTorch's derivatives.yaml, written as Python: the grad_fn name, the
forward against the backend interface, one backward formula per differentiable input
(in differentiable tensor ops, so ``create_graph=True`` works), and the SymPy meaning.
The saved operands are *derived* from the formulas' parameter names, as PyTorch derives
them: ``grads={"self": lambda grad, other: grad * other}`` saves ``other``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OpSpec", "STRUCTURAL"]

#: ``sympy=STRUCTURAL``: the op only moves, selects or sums elements, so its forward run
#: on the SymPy backend (object arrays) is its exact meaning.
STRUCTURAL = "structural"

#: Saved names that are read from an input tensor's metadata rather than kept as tensors.
_META_SUFFIXES = ("_sym_sizes", "_sym_strides", "_sym_numel")

#: ``builder(spec) -> run(inputs, params=None)``: the op's entry into autograd, set by the
#: layer above (symgrad.autograd.function); ops never import autograd.
entry_builder: Callable[[Any], Callable[..., Any]] | None = None


class GradFormulas(dict):
    """The backward formulas of one op; remembers whether they are still the registered ones.

    A fused backward kernel implements the *registered* formulas, so it may only stand in
    for them while ``pristine``: replacing a formula (a test planting a wrong rule, a user
    experimenting) makes the engine run the formulas themselves. Checked once per node.
    """

    def __init__(self, formulas) -> None:
        super().__init__(formulas)
        self._registered = dict(formulas)
        self.pristine = True

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self._refresh()

    def __delitem__(self, key) -> None:
        super().__delitem__(key)
        self._refresh()

    def _refresh(self) -> None:
        self.pristine = self.keys() == self._registered.keys() and all(
            dict.__getitem__(self, k) is f for k, f in self._registered.items())


@dataclass(eq=False)
class OpSpec:
    name: str
    grad_fn: str | None
    inputs: tuple[str, ...]
    forward: Callable[..., Any]
    grads: dict[str, Callable[..., Any]] = field(default_factory=dict)
    sympy: Callable[..., Any] | str | None = None
    #: promote | promote_float | float | same | bool | int64
    dtype_rule: str = "promote"
    #: the output may alias input 0's storage (reshape, transpose, expand ...)
    view: bool = False
    #: names of the forward's outputs; "result" is output 0
    outputs: tuple[str, ...] = ("result",)
    #: how many leading outputs carry gradients (max(dim) gives values + indices)
    differentiable_outputs: int = 1
    #: the forward returns a tuple whose length its arguments decide (split, chunk, unbind:
    #: PyTorch's one node with several ``output_nr``). Every output carries a gradient; the
    #: formulas take ``grads`` (a list: one gradient per output, None where none arrived,
    #: as torch's split_backward gets them) in place of ``grad``; ``outputs`` is ``()``.
    variadic_outputs: bool = False
    #: inputs that never get a gradient (a where() condition, an index tensor)
    nondifferentiable: tuple[str, ...] = ()
    doc: str = ""
    #: a backend kernel ``be.<name>(grad, needed, *saved)`` doing the whole backward in one
    #: pass (saved operands as arrays/scalars, in ``saved`` order); it returns one array or
    #: None per input, or None to decline. Used only when no graph is being recorded and the
    #: backend has it; otherwise the tensor-op formulas in ``grads`` run (tested equal).
    fused_backward: str | None = None
    #: an elementwise op's scalar math (symgrad.ops.scalar.Scalar): backends generate its
    #: kernels from it, and its backward formula and SymPy meaning come from it
    scalar: Any = None
    #: the backend kernel generated from ``scalar`` (``be.<kernel>``): the op's name by
    #: default; None where the forward calls another op's kernel (``x ** 2`` uses the
    #: ``pow`` kernel of ``pow_tensor``) and ``scalar`` only drives the fused backward
    kernel: str | None = ""
    #: the op's readable meaning for views (the Inspector's formula line), where its SymPy
    #: meaning is STRUCTURAL and says nothing readable: ``formula_tex(names, out, params,
    #: shapes) -> (forward LaTeX, vector-Jacobian products LaTeX or None)`` or None. ``names``
    #: maps each input, in ``inputs`` order, to its LaTeX name (None: no tensor there),
    #: ``out`` is the output's, ``params`` holds the saved non-tensor arguments (stride,
    #: padding ...) and ``shapes`` the shapes of the inputs and of ``"result"``.
    formula_tex: Callable[..., Any] | None = None

    # derived in __post_init__
    formula_params: dict[str, tuple[str, ...]] = field(init=False, repr=False)
    saved: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.kernel == "":
            self.kernel = self.name if self.scalar is not None else None
        self.grads = GradFormulas(self.grads)
        self.formula_params = {}
        first = "grads" if self.variadic_outputs else "grad"
        if self.variadic_outputs:
            self.outputs = ()
        for input_name, formula in self.grads.items():
            if input_name not in self.inputs:
                raise ValueError(f"{self.name}: gradient for unknown input {input_name!r}")
            params = tuple(inspect.signature(formula).parameters)
            if not params or params[0] != first:
                raise ValueError(f"{self.name}: formula for {input_name} must take {first} "
                                 "first")
            self.formula_params[input_name] = params[1:]
        names: set[str] = set()
        for params in self.formula_params.values():
            names.update(params)
        # A leading underscore marks a value a formula needs that PyTorch keeps but does
        # not expose (cat's input sizes, setitem's region): saved, but no ``_saved_*``.
        self.saved = tuple(sorted(n for n in names if not n.startswith("_")))

    @property
    def differentiable(self) -> bool:
        return self.grad_fn is not None

    def _run(self, inputs, params=None):
        """Run the op on tensors (``autograd.function.apply``). The first call installs the
        op's own entry as an instance attribute of the same name, so later calls skip this
        one; deleting ``_run`` from the instance's ``__dict__`` builds it again."""
        run = self.__dict__.get("_run")  # built already (this bound method was kept)
        if run is None:
            run = self.__dict__["_run"] = entry_builder(self)
        return run(inputs, params)

    def saved_kind(self, saved_name: str) -> tuple[str, str | None]:
        """Classify a saved name: input, output, meta (sizes/strides/numel) or param."""
        kinds = self.__dict__.setdefault("_saved_kinds", {})  # memo: asked for every node
        kind = kinds.get(saved_name)
        if kind is None:
            kind = kinds[saved_name] = self._classify_saved(saved_name)
        return kind

    def _classify_saved(self, saved_name: str) -> tuple[str, str | None]:
        if saved_name in self.inputs:
            return "input", saved_name
        if saved_name in self.outputs:
            return "output", saved_name
        for suffix in _META_SUFFIXES:
            if saved_name.endswith(suffix) and saved_name[: -len(suffix)] in self.inputs:
                return "meta", suffix
        return "param", None
