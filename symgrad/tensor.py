"""Tensor: a backend array, its storage (shared by views), and autograd metadata.

Operators and methods are the functions of :mod:`symgrad.functional` (and
:mod:`symgrad.indexing` for ``[]``), bound in the class body below ("op methods and
operators"), so go-to-definition on ``Tensor.__mul__`` lands there; they call
``autograd.function.apply`` with the op's spec. The in-place twins generated from the
registry are installed right below the class. Everything PyTorch users inspect on a
tensor (grad, grad_fn, is_leaf, requires_grad, _version, repr) behaves as in torch.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import numpy as np

from . import _inplace_views as _iv
from . import _tensor_layer as _tl
from . import dtypes as _dt
from . import functional as _F
from . import indexing as _ix
from . import tensor_functions as _TF
from ._format import format_data
from ._tensor_layer import CPP_NAMES as _CPP_NAMES  # noqa: F401  (imported from here too)
from ._tensor_layer import TORCH_NAMES as _TORCH_NAMES  # noqa: F401
from ._tensor_layer import TensorBase
from ._tensor_layer import type_name as _type_name
from ._tensor_layer import wrap_dim as _wrap_dim  # noqa: F401
from ._views import check_multi_output_view
from .autograd import function as _fn
from .autograd.engine import backward as _backward
from .autograd.function import apply as _apply
from .autograd.grad_mode import _state, no_grad
from .autograd.node import SavedTensor, _add_hook, _HookDict, _saved_tensors_hooks
from .autograd.record import _recording, before_write
from .backends import backend_for as _backend_for
from .device import CPU, as_device, resolve
from .memory import Storage, new_storage
from .ops import OPS as _OPS

__all__ = ["Tensor", "Size", "tensor", "FloatTensor", "DoubleTensor", "LongTensor", "BoolTensor",
           "HalfTensor", "IntTensor", "ShortTensor", "CharTensor",
           "ByteTensor"]

#: In-place ops whose result dtype must be castable to the tensor's (PyTorch's rule).
_ARITH = frozenset(("add", "sub", "mul", "div"))

_DT_OF = _dt._BY_NP  # the one table (bfloat16 joins it when ml_dtypes is loaded)


_new = object.__new__


class Size(tuple):
    """``tensor.shape``: a tuple that prints like ``torch.Size``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"symgrad.Size({list(self)})"

    def numel(self) -> int:
        n = 1
        for s in self:
            n *= s
        return n


class Tensor(TensorBase):
    # _weak: the tensor's weak reference to itself, kept once a node took it as an input
    # (weakref.ref would return that same object; reading the slot is cheaper than the call)
    __slots__ = ("_data", "_storage", "_device", "_requires_grad", "_grad", "_grad_fn",
                 "_output_nr", "_retains_grad", "_accumulator", "_backward_hooks", "name",
                 "_weak", "__weakref__")

    __array_priority__ = 1000  # numpy scalars defer to our reflected operators

    # -- construction --------------------------------------------------------------------
    @classmethod
    def _wrap(cls, data, device=CPU, storage: Storage | None = None) -> Tensor:
        t = _new(cls)
        t._data = data
        t._storage = storage if storage is not None else new_storage(data.nbytes, device.type)
        t._device = device
        t._requires_grad = False
        t._grad = None
        t._grad_fn = None
        t._output_nr = 0
        t._retains_grad = False
        t._accumulator = None
        t._backward_hooks = None
        t.name = t._weak = None
        return t

    @classmethod
    def _alias(cls, t: Tensor, grad_fn=None, output_nr: int = 0) -> Tensor:
        """A new tensor object over the same data and storage (saved outputs)."""
        a = cls._wrap(t._data, t._device, t._storage)
        if grad_fn is not None:
            a._grad_fn = grad_fn
            a._output_nr = output_nr
            a._requires_grad = True
        a.name = t.name
        return a

    @classmethod
    def _alias_of(cls, data, device, storage: Storage, grad_fn, output_nr: int) -> Tensor:
        """A saved output unpacked: a new tensor over its array whose grad_fn is ``grad_fn``."""
        a = cls._wrap(data, device, storage)
        a._grad_fn = grad_fn
        a._output_nr = output_nr
        a._requires_grad = True
        return a

    def __new__(cls, *args, **kwargs) -> Tensor:
        """``Tensor(data)``, ``Tensor(2, 3)``, ``Tensor()``: torch's legacy constructor.

        Data becomes the default float dtype (``Tensor([1, 2])`` is float32), ints give
        sizes (values zero, where torch leaves memory uninitialized), a tensor is aliased
        (AliasBackward0 when it requires grad), and only ``device=`` is a keyword, as in
        torch. ``symgrad.tensor`` stays the way to pick a dtype or ``requires_grad``.
        """
        return _legacy_new(None, args, kwargs)

    def __init__(self, *args, **kwargs) -> None:
        pass  # __new__ did the work (as torch.Tensor's __init__, it takes anything)

    # -- metadata ----------------------------------------------------------------------
    @property
    def shape(self) -> Size:
        return Size(self._data.shape)

    def size(self, dim: int | None = None):
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[_wrap_dim(dim, self._data.ndim)]

    @property
    def dtype(self) -> _dt.dtype:
        return _DT_OF[self._data.dtype]

    @property
    def device(self):
        return self._device

    @property
    def ndim(self) -> int:
        return self._data.ndim

    def dim(self) -> int:
        return self._data.ndim

    def numel(self) -> int:
        return int(self._data.size)

    nelement = numel  # torch's older name, still common in user code

    def element_size(self) -> int:
        return self._data.itemsize

    def stride(self, dim: int | None = None):
        strides = tuple(s // self._data.itemsize for s in self._data.strides)
        return strides if dim is None else strides[_wrap_dim(dim, self._data.ndim)]

    def is_contiguous(self) -> bool:
        return bool(self._data.flags.c_contiguous)

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

    def is_signed(self) -> bool:
        return self.dtype.is_signed

    @property
    def itemsize(self) -> int:
        return self._data.itemsize

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

    @property
    def is_cuda(self) -> bool:
        return self._device.type == "cuda"

    @property
    def _version(self) -> int:
        return self._storage.version

    def __len__(self) -> int:
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    __hash__ = object.__hash__

    # -- autograd metadata -----------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if self._grad_fn is not None:
            if not requires_grad:
                raise RuntimeError(
                    "you can only change requires_grad flags of leaf variables. If you want "
                    "to use a computed variable in a subgraph that doesn't require "
                    "differentiation use var_no_grad = var.detach().")
            return self
        if requires_grad and not self.dtype.is_floating_point:
            raise RuntimeError(
                "only Tensors of floating point and complex dtype can require gradients")
        self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad_fn(self):
        return self._grad_fn

    @property
    def is_leaf(self) -> bool:
        return self._grad_fn is None

    @property
    def grad(self) -> Tensor | None:
        if self._grad_fn is not None and not self._retains_grad and self._grad is None:
            warnings.warn(
                "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. "
                "Its .grad attribute won't be populated during autograd.backward(). If you "
                "indeed want the .grad field to be populated for a non-leaf Tensor, use "
                ".retain_grad() on the non-leaf Tensor. If you access the non-leaf Tensor by "
                "mistake, make sure you access the leaf Tensor instead.", UserWarning,
                stacklevel=2)
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got "
                                f"grad of type {type(value).__name__}")
            if value.shape != self.shape:
                raise RuntimeError("assigned grad has data of a different size")
            if value.dtype is not self.dtype:
                raise RuntimeError("assigned grad has data of a different type")
            if value._device != self._device:
                raise RuntimeError("assigned grad has data located on a different device")
        self._grad = value

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def retain_grad(self) -> None:
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self._grad_fn is None or self._retains_grad:
            return
        node = self._grad_fn
        if node._retained is None:
            node._retained = {}
        node._retained[self._output_nr] = weakref.ref(self)
        self._retains_grad = True

    def register_hook(self, hook):
        """``hook(grad)`` runs when this tensor's gradient is computed; may return a new one."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require "
                               "gradient")
        if self._grad_fn is None:
            if self._backward_hooks is None:
                self._backward_hooks = _HookDict()
            return _add_hook(self._backward_hooks, hook)
        node = self._grad_fn
        if node._tensor_hooks is None:
            node._tensor_hooks = {}
        hooks = node._tensor_hooks.setdefault(self._output_nr, _HookDict())
        return _add_hook(hooks, hook)

    def backward(self, gradient: Tensor | None = None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs=None) -> None:
        _backward(self, gradient, retain_graph, create_graph, inputs=inputs)

    def detach(self) -> Tensor:
        """A tensor sharing this one's data, outside the graph."""
        return Tensor._alias(self)

    def detach_(self) -> Tensor:
        if self._grad_fn is not None and self._grad_fn is not None and self._retains_grad:
            self._retains_grad = False
        self._grad_fn = None
        self._output_nr = 0
        self._requires_grad = False
        return self

    @property
    def data(self) -> Tensor:
        return self.detach()

    @data.setter
    def data(self, value: Tensor) -> None:
        self._data = value._data
        self._storage = value._storage
        self._device = value._device

    # -- conversion ------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        if self._requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                               "tensor.detach().numpy() instead.")
        if self._device.type != "cpu":
            raise TypeError(f"can't convert {self._device} device type tensor to numpy. Use "
                            "Tensor.cpu() to copy the tensor to host memory first.")
        return self._data

    def __array__(self, dtype=None, copy=None):
        a = self.detach().cpu()._data
        return a.astype(dtype) if dtype is not None else a

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be converted "
                               "to Scalar")
        return self.cpu()._data.reshape(()).item()

    def tolist(self):
        return self.cpu()._data.tolist()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __bool__(self) -> bool:
        if self._data.size != 1:
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        return bool(self.item())

    def __index__(self) -> int:
        if self.dtype.category != 1 or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an "
                            "index")
        return int(self.item())

    def to(self, *args, **kwargs) -> Tensor:
        """``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(other)``; copies if needed."""
        dtype = kwargs.pop("dtype", None)
        device = kwargs.pop("device", None)
        copy = kwargs.pop("copy", False)
        for a in args:
            if isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            elif isinstance(a, _dt.dtype) or type(a).__module__.startswith(("torch", "numpy")) \
                    and not isinstance(a, str):
                dtype = _dt.as_dtype(a)
            else:
                device = a
        out = self
        if device is not None and as_device(device) != self._device:
            out = _F.to_device(out, as_device(device))
        if dtype is not None and _dt.as_dtype(dtype) is not out.dtype:
            out = _F.to_dtype(out, _dt.as_dtype(dtype))
        if copy and out is self:
            out = self.clone()
        return out

    def type(self, dtype=None):
        """``t.type()`` is ``'symgrad.FloatTensor'`` (torch: ``'torch.FloatTensor'``);
        ``t.type(LongTensor)``, ``t.type('torch.LongTensor')`` or ``t.type(int64)`` casts."""
        if dtype is None:
            return f"symgrad.{_LEGACY_NAMES[self.dtype.name]}"
        if isinstance(dtype, _LegacyTensorType):
            return self.to(dtype.dtype)
        if isinstance(dtype, str):
            prefix, _, name = dtype.rpartition(".")
            by_name = {v: k for k, v in _LEGACY_NAMES.items()}
            if prefix not in ("torch", "symgrad") or name not in by_name:
                raise ValueError(f"invalid type: {dtype!r}")
            return self.to(_dt.as_dtype(by_name[name]))
        return self.to(dtype)

    def float(self) -> Tensor:
        return self.to(_dt.float32)

    def double(self) -> Tensor:
        return self.to(_dt.float64)

    def long(self) -> Tensor:
        return self.to(_dt.int64)

    def half(self) -> Tensor:
        return self.to(_dt.float16)

    def bfloat16(self) -> Tensor:
        return self.to(_dt._bfloat16())

    def int(self) -> Tensor:
        return self.to(_dt.int32)

    def short(self) -> Tensor:
        return self.to(_dt.int16)

    def char(self) -> Tensor:
        return self.to(_dt.int8)

    def byte(self) -> Tensor:
        return self.to(_dt.uint8)

    def bool(self) -> Tensor:
        return self.to(_dt.bool_)

    def cpu(self) -> Tensor:
        return self.to("cpu")

    def cuda(self, device=None) -> Tensor:
        return self.to(as_device(device if device is not None else "cuda"))

    # -- printing --------------------------------------------------------------------------
    def __repr__(self) -> str:
        a = self.cpu()._data if self._device.type != "cpu" else self._data
        if a.size == 0:
            body = "[]"
            extra = [] if a.shape == (0,) else [f"size={tuple(a.shape)}"]
        else:
            body = format_data(a, indent=7)
            extra = []
        if self._device.type != "cpu":
            extra.append(f"device='{self._device}'")
        d = self.dtype
        default = _dt.default_float()  # torch leaves out the default dtype, whichever it is
        if d not in (default, _dt.int64, _dt.bool_) or (a.size == 0 and d is not default):
            extra.append(f"dtype={d!r}")
        if self._grad_fn is not None:
            extra.append(f"grad_fn=<{self._grad_fn.name()}>")
        elif self._requires_grad:
            extra.append("requires_grad=True")
        return "tensor(" + ", ".join([body] + extra) + ")"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if self._data.ndim == 0 and spec:
            return format(self.item(), spec)
        return repr(self)

    # -- in-place ops (autograd-aware; PyTorch's rules) -----------------------------------
    def _bump(self) -> Tensor:
        self._storage.version += 1
        return self

    def _inplace_add(self, other: Tensor) -> None:
        before_write(self)
        _backend_for(self._device.type).add_(self._data, other._data)
        self._bump()

    def _inplace(self, method: str, op: str, others: tuple = (), params: dict | None = None,
                 kernel: str | None = None, src=None) -> Tensor:
        """Write the registered op ``op(self, *others, **params)`` into ``self``.

        ``kernel(self, src)`` is a backend kernel doing it truly in place when no graph is
        recorded (add_, mul_, fill_ ...); see :meth:`_inplace_run` for the rest.
        """
        spec = _OPS[op]
        params = params or {}

        def compute(s: Tensor) -> Tensor:
            return _apply(spec, (s,) + others, params)

        return self._inplace_run(method, others, compute, kernel, src,
                                 op if op in _ARITH else None, spec.grad_fn is not None)

    def _inplace_run(self, method: str, others: tuple, compute, kernel: str | None = None,
                     src=None, arith: str | None = None, differentiable: bool = True) -> Tensor:
        """Write ``compute(self)`` (an out-of-place op on a tensor standing for ``self``) into
        ``self`` and bump the storage's version: every in-place method comes here.

        Without a graph to record, the op runs on ``self`` (or ``kernel`` runs in place) and
        the result is cast into it. With one, the op runs on a stand-in for ``self`` that
        carries its grad_fn, the result is written into ``self``, and ``self`` is rebased
        onto the new node: the same object, a new grad_fn whose first edge is the old one.
        As in PyTorch, a node that saved ``self`` keeps a clone of the old values (its
        ``_saved_self`` has grad_fn CloneBackward0) and a saved result is ``self`` at its
        new version, so a later in-place change of it fails the backward's version check.
        ``differentiable=False`` (logical_not_ ...): no leaf check and no rebase, as torch.
        """
        if _fn._profiler is not None:
            return _fn._profiler._record_call(
                "symgrad::" + method, "op", (self,) + tuple(others), self._inplace_impl,
                method, others, compute, kernel, src, arith, differentiable, quiet=True)
        return self._inplace_impl(method, others, compute, kernel, src, arith, differentiable)

    def _inplace_impl(self, method, others, compute, kernel, src, arith,
                      differentiable) -> Tensor:
        grad_on = _state.enabled
        if differentiable and grad_on and self._requires_grad and self._grad_fn is None:
            raise RuntimeError("a leaf Variable that requires grad is being used in an "
                               "in-place operation.")
        if not self._data.flags.writeable:
            raise RuntimeError("unsupported operation: more than one element of the written-to "
                               "tensor refers to a single memory location. Please clone() "
                               "the tensor before performing the operation.")
        tensors = [o for o in others if isinstance(o, Tensor)]
        for o in tensors:
            if o._device != self._device:
                raise RuntimeError("Expected all tensors to be on the same device, but found "
                                   f"at least two devices, {o._device} and {self._device}!")
            if o._data.shape == self._data.shape:
                continue
            shape = np.broadcast_shapes(self._data.shape, o._data.shape)
            if shape != self._data.shape:
                raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the "
                                   f"broadcast shape {list(shape)}")
        if arith is not None and (arith == "div" or not self.dtype.is_floating_point
                                  or any(o._data.dtype != self._data.dtype for o in tensors)):
            res = _dt.promote([(self.dtype, self._data.ndim == 0)]
                              + [(o.dtype, o._data.ndim == 0) for o in tensors],
                              [o for o in others if not isinstance(o, Tensor)])
            if arith == "div" and not res.is_floating_point:
                res = _dt.default_float()
            if res.category > self.dtype.category:
                raise RuntimeError(f"result type {_TORCH_NAMES[res.name]} can't be cast to the "
                                   f"desired output type {_TORCH_NAMES[self.dtype.name]}")
        be = _backend_for(self._device.type)
        graph = grad_on and (self._requires_grad or any(o._requires_grad for o in tensors))
        if grad_on and differentiable:
            check_multi_output_view(self, graph)
        if not (differentiable and graph):
            before_write(self)
            # (a half tensor's arithmetic goes through the op: float32, rounded once)
            if kernel is not None and (arith is None or self._data.dtype not in _dt.HALF_NP):
                getattr(be, kernel)(self._data, src)
            else:
                if graph:  # a non-differentiable op on graph tensors records nothing
                    with no_grad():
                        out = compute(self)
                else:
                    out = compute(self)
                self._check_result(method, out)
                be.copy_(self._data, out._data)
            return self._bump()
        return self._inplace_graph(be, method, compute)

    def _check_result(self, method: str, out: Tensor) -> None:
        """torch's errors for a result that cannot be written into ``self``."""
        if out._data.shape != self._data.shape:
            raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the "
                               f"broadcast shape {list(out.shape)}")
        if out.dtype.category > self.dtype.category:
            names = _CPP_NAMES if method.startswith(("clamp", "clip")) else _TORCH_NAMES
            raise RuntimeError(f"result type {_TORCH_NAMES[out.dtype.name]} can't be cast to "
                               f"the desired output type {names[self.dtype.name]}")

    def _inplace_graph(self, be, method, compute) -> Tensor:
        found = _iv.view_base(self, f"in-place {method.rstrip('_')}") \
            if self._grad_fn is not None else None
        if found is not None:
            return self._inplace_view_graph(be, method, compute, *found)
        node = self._grad_fn
        # Under symgrad.record() (the verifier keeps every input) or saved_tensors_hooks
        # (pack sees the tensor at once) the stand-in is a copy of the old values; otherwise
        # a free alias, and only what the node saved is cloned below.
        eager = bool(_recording) or bool(_saved_tensors_hooks)
        stand_in = Tensor._wrap(be.copy(self._data) if eager else self._data,
                                self._device, None if eager else self._storage)
        stand_in._grad_fn = self._grad_fn
        stand_in._output_nr = self._output_nr
        stand_in._requires_grad = self._requires_grad
        stand_in.name = self.name
        out = compute(stand_in)
        self._check_result(method, out)
        new = self._write_inplace(be, out, stand_in, eager)
        if new is None:
            return self
        new._out_meta = ((self._data.shape, self.dtype),)
        if self._retains_grad and node is not None and node._retained:
            node._retained.pop(self._output_nr, None)
            new._retained = {0: weakref.ref(self)}
        self._grad_fn = new
        self._output_nr = 0
        self._requires_grad = True
        if (_iv.VIEWS_OF and id(self) in _iv.VIEWS_OF) or (
                _iv.MADE and id(self._storage) in _iv.MADE):  # its views: rebase them
            _iv.refresh_views(self, be, eager)
        return self

    def _write_inplace(self, be, out, stand_in, eager: bool):
        """Write ``out`` (the op applied to ``stand_in``, standing for the old ``self``) into
        ``self`` and bump its version. The node's saved output becomes ``self`` at the new
        version; a saved old ``self`` becomes a clone (torch's original_self) unless the
        stand-in is a copy already. Returns ``out``'s node."""
        new = out._grad_fn
        saved = getattr(new, "_saved", None) or {}
        outputs = []
        original = None
        for s in saved.values():
            if type(s) is not SavedTensor:
                continue
            if s.output_nr >= 0 and s.data is not None:
                s.data, s.storage, s._tensor = self._data, self._storage, None
                outputs.append(s)
            elif not eager and s._tensor is stand_in:
                if original is None:
                    original = _apply(_OPS["clone"], (stand_in,))
                    refs = list(new._input_refs)
                    refs[0] = weakref.ref(original)  # the verifier reads the old values there
                    new._input_refs = tuple(refs)
                s._tensor, s.version = original, original._storage.version
        before_write(self)
        be.copy_(self._data, out._data)
        self._bump()
        for s in outputs:
            s.version = self._storage.version
        return new

    def _inplace_view_graph(self, be, method, compute, base, region, others) -> Tensor:
        """An in-place op on ``self``, a view (``base[region]``) of the live graph tensor
        ``base``: base's grad_fn becomes CopySlices over its old one and the op applied to
        the old view values; ``self``'s becomes AsStridedBackward0 of the new base."""
        eager = bool(_recording) or bool(_saved_tensors_hooks)
        old_base = _iv.stand_in(base, be, eager)
        stand_in = _apply(_OPS["as_strided_region"], (old_base,), {"_region": region})
        out = compute(stand_in)
        self._check_result(method, out)
        self._write_inplace(be, out, stand_in, eager)
        _iv.record_write(base, old_base, out, (region, None), self, region, others, be,
                         eager)
        return self

    def add_(self, other, alpha=1) -> Tensor:
        src = other._data if isinstance(other, Tensor) else other
        if alpha != 1:  # on the tensor's backend: a CUDA array has no NumPy operators
            src = _backend_for(self._device.type).mul(src, alpha) \
                if isinstance(other, Tensor) else src * alpha
        return self._inplace("add_", "add", (other,), {"alpha": alpha}, "add_", src)

    def sub_(self, other, alpha=1) -> Tensor:
        src = other._data if isinstance(other, Tensor) else other
        if alpha != 1:  # on the tensor's backend: a CUDA array has no NumPy operators
            src = _backend_for(self._device.type).mul(src, alpha) \
                if isinstance(other, Tensor) else src * alpha
        return self._inplace("sub_", "sub", (other,), {"alpha": alpha}, "sub_", src)

    def mul_(self, other) -> Tensor:
        return self._inplace("mul_", "mul", (other,), None, "mul_",
                             other._data if isinstance(other, Tensor) else other)

    def div_(self, other) -> Tensor:
        return self._inplace("div_", "div", (other,), None, "div_",
                             other._data if isinstance(other, Tensor) else other)

    def zero_(self) -> Tensor:
        return self._inplace("zero_", "zero_", (), None, "fill_", 0)

    def fill_(self, value) -> Tensor:
        if isinstance(value, Tensor):
            if value.ndim != 0:
                raise RuntimeError("fill_ only supports 0-dimension value tensor but got "
                                   f"tensor with {value.ndim} dimensions.")
            return self._inplace("fill_", "fill_tensor_", (value,), None, "fill_",
                                 value.detach().cpu()._data.item())
        return self._inplace("fill_", "fill_", (), {"value": value}, "fill_", value)

    def copy_(self, src) -> Tensor:
        if not isinstance(src, Tensor):
            raise TypeError(f"copy_(): argument 'src' must be Tensor, not {type(src).__name__}")
        return self._inplace("copy_", "copy_", (src,), None, "copy_", src._data)

    def __iadd__(self, other):
        return self.add_(other)

    def __isub__(self, other):
        return self.sub_(other)

    def __imul__(self, other):
        return self.mul_(other)

    def __itruediv__(self, other):
        return self.div_(other)

    def __reduce_ex__(self, protocol):
        return (_rebuild, (self.detach().cpu()._data.copy(), self._requires_grad, self.name))

    # -- op methods and operators: the one table --------------------------------------------
    # One line per method (its aliases on the same line): the public functions of
    # functional.py, tensor_functions.py and indexing.py (``[]``), bound as they are, so that
    # ``t.exp()`` calls ``symgrad.exp`` with no Python call in between and help(),
    # inspect.signature and go-to-definition show that function. Those modules sit below
    # this one and never import it (tests/test_tensor_method_table.py); adding a method is a
    # line here. What the op registry generates is attached right below the class
    # (``_attach_registry_methods``): the in-place twins of the elementwise ops (``exp_``,
    # ``gt_`` ...), the random initialisers (``uniform_`` ...), torch's in-place aliases, and
    # the straight lines of ``+ - * /``, whose fallback is the function bound here.
    add = __add__ = __radd__ = _F.add
    sub = subtract = __sub__ = _F.sub
    mul = multiply = __mul__ = __rmul__ = _F.mul
    div = divide = true_divide = __truediv__ = _F.div
    pow = __pow__ = _F.pow  # noqa: A003
    neg = negative = __neg__ = _F.neg
    abs = __abs__ = _F.abs  # noqa: A003
    matmul = __matmul__ = _F.matmul
    gt = greater = __gt__ = _F.gt
    ge = greater_equal = __ge__ = _F.ge
    lt = less = __lt__ = _F.lt
    le = less_equal = __le__ = _F.le
    eq = __eq__ = _F.eq
    ne = not_equal = __ne__ = _F.ne
    logical_or = __or__ = _F.logical_or
    logical_and = __and__ = _F.logical_and
    logical_not = __invert__ = _F.logical_not
    __getitem__ = _ix.getitem
    __setitem__ = _ix.setitem

    def __rsub__(self, other):
        return _F.rsub_scalar(self, other)

    def __rtruediv__(self, other):
        return _F.div(other, self)

    def __rpow__(self, other):
        return _F.pow(other, self)

    def __rmatmul__(self, other):
        return _F.matmul(other, self)

    def __pos__(self):
        return self

    def __iter__(self):
        """Rows along dim 0: ``unbind(0)``, as torch iterates (one UnbindBackward0)."""
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    reciprocal = _F.reciprocal
    exp = _F.exp
    log = _F.log
    sin = _F.sin
    cos = _F.cos
    tanh = _F.tanh
    sigmoid = _F.sigmoid
    log1p = _F.log1p
    log2 = _F.log2
    log10 = _F.log10
    expm1 = _F.expm1
    erf = _F.erf
    atan2 = _F.atan2
    arctan2 = _F.atan2
    hypot = _F.hypot
    relu = _F.relu
    sqrt = _F.sqrt
    sign = _F.sign
    sum = _F.sum  # noqa: A003
    mean = _F.mean
    prod = _F.prod
    reshape = _F.reshape
    view = _F.view
    flatten = _F.flatten
    t = _F.t
    transpose = _F.transpose
    permute = _F.permute
    expand = _F.expand
    unsqueeze = _F.unsqueeze
    squeeze = _F.squeeze
    sum_to_size = _F.sum_to_size
    clone = _F.clone
    contiguous = _F.contiguous
    mm = _F.mm
    mv = _F.mv
    dot = _F.dot
    bmm = _F.bmm
    baddbmm = _F.baddbmm
    max = _F.max  # noqa: A003
    min = _F.min  # noqa: A003
    argmax = _F.argmax
    argmin = _F.argmin
    maximum = _F.maximum
    minimum = _F.minimum
    clamp = clip = _F.clamp
    clamp_min = _F.clamp_min
    clamp_max = _F.clamp_max
    softmax = _F.softmax
    log_softmax = _F.log_softmax
    logsumexp = _F.logsumexp
    select = _F.select
    narrow = _F.narrow
    all = _F.all_  # noqa: A003
    any = _F.any_  # noqa: A003
    addcmul = _F.addcmul
    equal = _F.equal
    isclose = _F.isclose
    allclose = _F.allclose
    mT = property(_F._mT)
    # tensor_functions.py
    gather = _TF.gather
    scatter = _TF.scatter
    scatter_add = _TF.scatter_add
    take_along_dim = _TF.take_along_dim
    index_select = _TF.index_select
    index_add = _TF.index_add
    masked_fill = _TF.masked_fill
    masked_fill_ = _TF.masked_fill_
    cumsum = _TF.cumsum
    cumprod = _TF.cumprod
    flip = _TF.flip
    var = _TF.var
    std = _TF.std
    norm = _TF.norm
    sort = _TF.sort
    argsort = _TF.argsort
    topk = _TF.topk
    tril = _TF.tril
    triu = _TF.triu
    roll = _TF.roll
    repeat = _TF.repeat
    tile = _TF.tile
    outer = _TF.outer
    split = _TF._split_method  # torch names the method's argument split_size
    chunk = _TF.chunk
    unbind = _TF.unbind
    tensor_split = _TF.tensor_split
    diagonal = _TF.diagonal
    unique = _TF.unique
    multinomial = _TF.multinomial
    unsafe_split = _TF._unsafe_split_method  # argument positions counted after self
    unsafe_split_with_sizes = _TF._unsafe_split_with_sizes_method
    unsafe_chunk = _TF._unsafe_chunk_method

    @property
    def T(self):  # noqa: N802
        return _F.permute(self, tuple(range(self.ndim))[::-1])

    def expand_as(self, other):
        return _F.expand(self, other.shape)

    def view_as(self, other):
        return _F.view(self, other.shape)

    def reshape_as(self, other):
        return _F.reshape(self, other.shape)

    def where(self, condition, other):
        return _F.where(condition, self, other)


def _rebuild(data, requires_grad, name):
    t = tensor(data, requires_grad=requires_grad)
    t.name = name
    return t


def _infer_dtype(data: Any) -> _dt.dtype:
    a = np.asarray(data)
    if a.dtype.kind == "b":
        return _dt.bool_
    if a.dtype.kind in "iu":
        return _dt.from_numpy_dtype(a.dtype) if isinstance(data, np.ndarray) else _dt.int64
    if a.dtype.kind == "f" or _dt.is_bfloat16_np(a.dtype):
        # numpy arrays keep their dtype; Python floats become the default dtype (torch)
        if isinstance(data, np.ndarray):
            return _dt.from_numpy_dtype(a.dtype)
        return _dt.default_float()
    raise TypeError(f"Could not infer dtype of {type(data).__name__}")


# -- argument checks shared with the creation functions -------------------------------------

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _check_dtype_arg(fn: str, dtype: Any) -> _dt.dtype | None:
    """``dtype=``: a symgrad dtype or anything :func:`symgrad.dtypes.as_dtype` reads."""
    if dtype is None or isinstance(dtype, _dt.dtype):
        return dtype
    try:
        return _dt.as_dtype(dtype)
    except (TypeError, ValueError):
        pass
    hint = ""
    if isinstance(dtype, (str, np.dtype, type)) or type(dtype).__module__.startswith("torch"):
        hint = (f" ({dtype!r} has no symgrad dtype; use float32, float64, float16, bfloat16, "
                "int64, int32, int16, int8, uint8 or bool)")
    raise TypeError(f"{fn}(): argument 'dtype' must be symgrad.dtype, not "
                    f"{_type_name(dtype)}{hint}")


def _check_device_arg(fn: str, device: Any) -> None:
    if device is None or isinstance(device, (str, int)) and not isinstance(device, bool):
        return
    if hasattr(device, "type") and isinstance(getattr(device, "type", None), str):
        return  # a symgrad or torch device
    raise TypeError(f"{fn}(): argument 'device' must be symgrad.device, not "
                    f"{_type_name(device)}")


def _check_requires_grad_arg(fn: str, requires_grad: Any) -> None:
    if not isinstance(requires_grad, (bool, np.bool_)):
        raise TypeError(f"{fn}(): argument 'requires_grad' must be bool, not "
                        f"{_type_name(requires_grad)}")


def _factory_grad(t: Tensor, requires_grad: bool) -> Tensor:
    """``requires_grad=True`` of a factory function (tensor, zeros ...), as torch words it."""
    if requires_grad:
        if not t.dtype.is_floating_point:
            raise RuntimeError("Only Tensors of floating point and complex dtype can require "
                               "gradients")
        t.requires_grad_(True)
    return t


# -- what torch says about data it cannot make a tensor of ----------------------------------

_NP_KINDS = "biuf"


def _ndarray_error(a: np.ndarray) -> TypeError:
    return TypeError(f"can't convert np.ndarray of type numpy.{a.dtype.type.__name__}. The "
                     "only supported types are: float64, float32, float16, int64, int32, "
                     "int16, int8, uint64, uint32, uint16, uint8, and bool.")


def _is_sequence(x: Any) -> bool:
    """What torch's tensor() walks into: Python sequences and arrays (tensors were turned
    into arrays before: symgrad stacks tensors in a list), never str/bytes at the top."""
    return isinstance(x, (list, tuple, range, np.ndarray, str, bytes)) and not (
        isinstance(x, np.ndarray) and x.ndim == 0)


def _sizes(data: Any) -> list[int]:
    """torch's compute_sizes: follow the first element down."""
    sizes: list[int] = []
    seq = data
    while _is_sequence(seq):
        n = len(seq)
        sizes.append(n)
        if len(sizes) > 64:
            raise ValueError(f"too many dimensions '{type(seq).__name__}'")
        if n == 0:
            break
        seq = seq[0]
    return sizes


def _scalar_dtype(x: Any) -> _dt.dtype:
    """torch's infer_scalar_type, for symgrad's dtypes."""
    if isinstance(x, (bool, np.bool_)):
        return _dt.bool_
    if isinstance(x, (int, np.integer)):
        return _dt.int64
    if isinstance(x, float):
        return _dt.default_float()
    if isinstance(x, np.floating):
        return _dt.from_numpy_dtype(np.dtype(type(x)))
    if isinstance(x, (complex, np.complexfloating)):
        raise TypeError(f"symgrad has no complex dtype: could not make a tensor of "
                        f"{_type_name(x)} {x!r} (supported: float32, float64, int64, bool)")
    if isinstance(x, (str, bytes)):
        raise TypeError(f"new(): invalid data type '{type(x).__name__}'")
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in _NP_KINDS:
            raise _ndarray_error(x)
        return _dt.from_numpy_dtype(x.dtype)
    if _is_sequence(x):
        if len(x) == 0:
            return _dt.default_float()
        found: list[_dt.dtype] = []
        for item in x:
            if item is x:
                raise TypeError("new(): self-referential lists are incompatible")
            found.append(_scalar_dtype(item))
        return _dt.promote([(d, False) for d in found])
    raise RuntimeError(f"Could not infer dtype of {type(x).__name__}")


def _store_check(x: Any, sizes: list[int], dim: int, d: _dt.dtype) -> None:
    """torch's recursive_store, checking only: lengths, nesting and each scalar for ``d``."""
    if dim == len(sizes):
        if isinstance(x, np.ndarray) and x.size == 1:
            x = x.reshape(()).item()
        if d.category == 2:
            if isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)):
                return
            raise TypeError(f"must be real number, not {type(x).__name__}")
        if isinstance(x, (bool, np.bool_)):
            return
        if isinstance(x, (int, np.integer)):
            if d is _dt.int64 and not _INT64_MIN <= int(x) <= _INT64_MAX:
                raise ValueError("Overflow when unpacking long long")
            return
        if isinstance(x, (float, np.floating)):
            if d is _dt.int64 and not _INT64_MIN <= x < 2.0**63:  # nan and inf too
                raise RuntimeError("value cannot be converted to type int64 without overflow")
            return
        raise TypeError(f"'{type(x).__name__}' object cannot be interpreted as an integer")
    if not _is_sequence(x):
        raise TypeError("not a sequence")
    n = sizes[dim]
    if len(x) != n:
        raise ValueError(f"expected sequence of length {n} at dim {dim} (got {len(x)})")
    for item in x:
        _store_check(item, sizes, dim + 1, d)


def _explain(data: Any, d: _dt.dtype | None) -> None:
    """Raise torch's error for ``data`` that NumPy could not read as numbers of ``d``
    (None: inferred); returns only when torch would accept it."""
    sizes = _sizes(data)
    if d is None:
        d = _scalar_dtype(data)
    n = 1
    for s in sizes:
        n *= s
    if n:
        _store_check(data, sizes, 0, d)


def _fill(out: np.ndarray, x: Any, at: tuple = ()) -> None:
    """Store checked data NumPy could not read itself (a one-element array where a number
    belongs, as torch takes a one-element tensor there)."""
    if len(at) == out.ndim:
        out[at] = x.reshape(()).item() if isinstance(x, np.ndarray) else x
        return
    for i, item in enumerate(x):
        _fill(out, item, at + (i,))


def _from_data(data: Any, d: _dt.dtype | None) -> np.ndarray:
    """A new C-contiguous array of Python data (nested sequences and numbers) as dtype ``d``
    (None: inferred as torch does), with torch's errors for anything else."""
    if isinstance(data, (str, bytes)):
        raise TypeError(f"new(): invalid data type '{type(data).__name__}'")
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError):  # ragged, or a sequence NumPy cannot read
        raw = None
    if raw is None or raw.dtype.kind not in _NP_KINDS or raw.dtype.kind == "u":
        # objects (None, big ints, str ...), ragged lists, uint64 from ints >= 2**63
        _explain(data, d)  # raises torch's error, or returns: torch takes it
        if d is None:
            d = _scalar_dtype(data)
        if raw is None or raw.dtype.kind not in _NP_KINDS:
            sizes = _sizes(data)
            out = np.zeros(sizes, dtype=d.np)
            if out.size:
                with np.errstate(over="ignore", invalid="ignore"):
                    _fill(out, data)
            return out
    if d is None:  # Python floats become the default dtype (torch), ints int64
        if raw.dtype.kind == "f" and (isinstance(data, np.generic) or raw.dtype == np.float32):
            d = _dt.from_numpy_dtype(raw.dtype)  # NumPy float scalars keep their dtype
        else:
            d = {"b": _dt.bool_, "i": _dt.int64}.get(raw.dtype.kind) or _dt.default_float()
    elif d is _dt.int64 and raw.dtype.kind == "f" and raw.size:
        with np.errstate(invalid="ignore"):
            bad = ~((raw >= _INT64_MIN) & (raw < 2.0**63))
        if bad.any():
            raise RuntimeError("value cannot be converted to type int64 without overflow")
    elif d.category == 1 and d is not _dt.int64 and raw.size and raw.dtype.kind in "fiu":
        _check_narrow_int(raw, d)
    if raw.dtype == d.np:
        # np.asarray of Python data is a new array already; of a buffer (a torch tensor,
        # array.array) it is a view, which must be copied
        return raw if raw.base is None and raw.flags.c_contiguous else raw.copy(order="C")
    if d is _dt.float32 and raw.dtype.kind in "iu":
        raw = raw.astype(np.float64)  # as torch: a Python int becomes a double first
    with np.errstate(over="ignore", invalid="ignore"):
        return _dt.via_float32(raw, d.np)


def _check_narrow_int(raw: np.ndarray, d: _dt.dtype) -> None:
    """torch's overflow check of Python numbers stored as int32/int16/int8/uint8: a float
    must lie in the dtype's range, an int too (for uint8 from -128: torch lets -1 wrap)."""
    info = np.iinfo(d.np)
    lo = info.min if d.is_signed or raw.dtype.kind == "f" else -(info.max + 1) // 2
    with np.errstate(invalid="ignore"):
        ok = (raw >= lo) & (raw <= info.max)
    if not ok.all():
        raise RuntimeError(f"value cannot be converted to type {d.name} without overflow")


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Copy ``data`` (nested lists, numbers, NumPy arrays, tensors) into a new leaf tensor.

    Data torch refuses gets torch's error: ``None`` or another object (``Could not infer
    dtype of NoneType``), a str (``new(): invalid data type 'str'``), an int beyond int64
    (``Overflow when unpacking long long``), ragged lists (``expected sequence of length 2
    at dim 1 (got 1)``), a NumPy array of objects or strings. Tensors inside a list are
    stacked (symgrad's own convenience; torch takes only one-element tensors there).
    """
    d = _check_dtype_arg("tensor", dtype)
    _check_device_arg("tensor", device)
    _check_requires_grad_arg("tensor", requires_grad)
    if isinstance(data, Tensor):
        data = data.detach().cpu()._data
    elif isinstance(data, (list, tuple)) and _has_tensor(data):
        data = [_to_py(x) for x in data]
    if isinstance(data, np.ndarray):
        if data.dtype.kind not in _NP_KINDS and not _dt.is_bfloat16_np(data.dtype):
            raise _ndarray_error(data)
        if d is None:
            d = _infer_dtype(data)
            if data.dtype == np.uint64 and data.size and data.max() > _INT64_MAX:
                raise ValueError(f"Overflow when unpacking long long: uint64 value "
                                 f"{data.max()} does not fit in int64 (symgrad has no "
                                 "uint64 dtype; pass dtype=symgrad.int64 to wrap it as "
                                 "torch does)")
        with np.errstate(over="ignore", invalid="ignore"):
            arr = np.array(_dt.via_float32(data, d.np), copy=True, order="C")
    else:
        arr = _from_data(data, d)
    dev = resolve(device)
    if dev.type != "cpu":
        t = _F.to_device(Tensor._wrap(arr), dev)
    else:
        t = Tensor._wrap(arr, dev)
    return _factory_grad(t, requires_grad)


def _has_tensor(xs) -> bool:
    """Whether nested lists/tuples hold a Tensor (by the set of element types: a list of a
    million floats is one C-level pass, not a Python generator)."""
    types = set(map(type, xs))
    if any(issubclass(t, Tensor) for t in types):
        return True
    if any(issubclass(t, (list, tuple)) for t in types):
        return any(_has_tensor(x) for x in xs if isinstance(x, (list, tuple)))
    return False


def _to_py(x):
    if isinstance(x, Tensor):
        return x.detach().cpu()._data
    if isinstance(x, (list, tuple)):
        return [_to_py(v) for v in x]
    return x


# -- torch's legacy constructors: Tensor(...), FloatTensor(...) ... -------------------------

_LEGACY_NAMES = _tl.LEGACY_NAMES


def _arg_type(v: Any) -> str:
    """A value's type as torch's overload errors print it (``list``, ``symgrad.dtype``)."""
    mod = type(v).__module__ or ""
    if mod.startswith("symgrad"):
        return "symgrad." + type(v).__name__
    return _type_name(v)


def _new_args_error(args: tuple, kwargs: dict) -> TypeError:
    got = ", ".join([_arg_type(a) for a in args]
                    + [f"{k}={_arg_type(v)}" for k, v in kwargs.items()])
    return TypeError(
        f"new() received an invalid combination of arguments - got ({got}), but expected one "
        "of:\n * (*, symgrad.device device = None)\n * (Tensor other)\n * (tuple of ints "
        "size, *, symgrad.device device = None)\n * (object data, *, symgrad.device device = "
        "None)\n")


def _options(d: _dt.dtype, dev) -> str:
    return (f"TensorOptions(dtype={_CPP_NAMES[d.name]}, device={dev}, layout=Strided, "
            "requires_grad=false (default), pinned_memory=false (default), "
            "memory_format=(nullopt))")


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _legacy_new(dtype: _dt.dtype | None, args: tuple, kwargs: dict) -> Tensor:
    """torch's legacy_tensor_ctor for ``Tensor`` (dtype None: the default float dtype, read
    at call time) and ``FloatTensor``/``DoubleTensor``/``LongTensor``/``BoolTensor``."""
    if kwargs and set(kwargs) != {"device"}:
        raise _new_args_error(args, kwargs)
    device = kwargs.get("device")
    _check_device_arg("new", device)
    d = dtype or _dt.default_float()
    if len(args) == 1 and not _is_int(args[0]):
        data = args[0]
        if isinstance(data, Tensor):
            want = resolve(device) if device is not None else data.device
            if dtype is not None and data.dtype is not dtype or want != data.device:
                raise TypeError(f"expected {_options(d, want)} (got "
                                f"{_options(data.dtype, data.device)})")
            return _apply(_OPS["alias"], (data,))
        if isinstance(data, Size):
            return _legacy_sized(tuple(data), d, device)
        if isinstance(data, (str, bytes)):
            raise TypeError(f"new(): invalid data type '{type(data).__name__}'")
        if not (isinstance(data, (list, tuple, range, np.ndarray))):
            raise TypeError(f"new(): data must be a sequence (got {_type_name(data)})")
        return tensor(data, dtype=d, device=device)
    sizes = []
    for pos, v in enumerate(args, 1):
        if not _is_int(v):
            if pos == 1:
                raise _new_args_error(args, kwargs)
            raise TypeError(f"new(): argument 'size' failed to unpack the object at pos {pos} "
                            f"with error \"type must be tuple of ints,but got "
                            f"{_type_name(v)}\"")
        sizes.append(int(v))
    return _legacy_sized(tuple(sizes) if args else (0,), d, device)


def _legacy_sized(sizes: tuple, d: _dt.dtype, device) -> Tensor:
    for v in sizes:
        if v < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {v}: "
                               f"{list(sizes)}")
    t = Tensor._wrap(np.zeros(sizes, dtype=d.np))
    dev = resolve(device)
    if dev.type != "cpu":
        t = _F.to_device(t, dev)
    return t


class _LegacyTensorType(type):
    """The type of ``FloatTensor`` and its siblings, as ``torch.tensortype``: calling one
    makes a plain Tensor of its dtype, and ``isinstance(t, FloatTensor)`` holds for a cpu
    float32 tensor (torch's answer); they are not subclasses of Tensor (nor in torch)."""

    dtype: _dt.dtype

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, Tensor) and obj.dtype is cls.dtype and obj.device.type == "cpu"

    def __call__(cls, *args, **kwargs) -> Tensor:
        return _legacy_new(cls.dtype, args, kwargs)


def _legacy_type(name: str, d: _dt.dtype) -> _LegacyTensorType:
    return _LegacyTensorType(name, (), {"dtype": d, "__module__": "symgrad", "__slots__": (),
                                        "__doc__": f"``{name}(data)`` / ``{name}(*sizes)``: "
                                                   f"a {d.name} tensor (torch's legacy "
                                                   "constructor)."})


FloatTensor = _legacy_type("FloatTensor", _dt.float32)
DoubleTensor = _legacy_type("DoubleTensor", _dt.float64)
LongTensor = _legacy_type("LongTensor", _dt.int64)
BoolTensor = _legacy_type("BoolTensor", _dt.bool_)
HalfTensor = _legacy_type("HalfTensor", _dt.float16)


def __getattr__(name: str):
    """``BFloat16Tensor``, made on first use (bfloat16 loads ml_dtypes)."""
    if name == "BFloat16Tensor":
        t = globals()["BFloat16Tensor"] = _legacy_type("BFloat16Tensor", _dt._bfloat16())
        return t
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
IntTensor = _legacy_type("IntTensor", _dt.int32)
ShortTensor = _legacy_type("ShortTensor", _dt.int16)
CharTensor = _legacy_type("CharTensor", _dt.int8)
ByteTensor = _legacy_type("ByteTensor", _dt.uint8)


# The layers below (ops' backward formulas, autograd, the op functions) reach the Tensor
# class and its factory through this one registration point; they never import this module.
_tl.provide(Tensor=Tensor, tensor=tensor, DT_OF=_DT_OF, backend_for=_backend_for)


def _attach_registry_methods() -> None:
    """Tensor's methods generated from the op registry (the class body has the rest): the
    in-place twins of the elementwise ops and the random initialisers (functional.py),
    torch's in-place aliases (``multiply_`` is ``mul_``), and ``a + b``, ``a - b``, ``a * b``,
    ``a / b`` (and the reflected ``+`` and ``*``) as their op's straight line
    (autograd/fast_apply.py): one Python call fewer than through functional.py, which takes
    every call off that line. Runs once the class is provided (the lines read it)."""
    for name, method in _F.inplace_methods().items():
        setattr(Tensor, name, method)
    for alias, target in _F._INPLACE_ALIASES.items():
        setattr(Tensor, alias, getattr(Tensor, target))
    for names, op, params, fallback in (
            (("__add__", "__radd__"), "add", "{'alpha': 1}", _F.add),
            (("__sub__",), "sub", "{'alpha': 1}", _F.sub),
            (("__mul__", "__rmul__"), "mul", "{}", _F.mul),
            (("__truediv__",), "div", "{}", _F.div)):
        method = _fn.binary_method(_OPS[op], params, fallback)
        for name in names:
            setattr(Tensor, name, method)


_attach_registry_methods()
