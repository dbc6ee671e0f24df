"""Tensor: a backend array, its storage (shared by views), and autograd metadata.

Operators and methods are thin: they delegate to :mod:`symgrad.functional`, which calls
``autograd.function.apply`` with the op's spec. Everything PyTorch users inspect on a
tensor (grad, grad_fn, is_leaf, requires_grad, _version, repr) behaves as in torch.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import numpy as np

from . import autograd as _autograd
from . import dtypes as _dt
from ._format import format_data
from .autograd import function as _fn
from .autograd.grad_mode import _state
from .backends import backend_for as _backend_for
from .device import CPU, as_device
from .memory import Storage, new_storage

__all__ = ["Tensor", "Size", "tensor"]

#: In-place ops whose result dtype must be castable to the tensor's (PyTorch's rule).
_ARITH = frozenset(("add", "sub", "mul", "div"))

#: PyTorch's scalar type names, for its error messages.
_TORCH_NAMES = {"float32": "Float", "float64": "Double", "int64": "Long", "bool": "Bool"}

_DT_OF = {np.dtype(np.float32): _dt.float32, np.dtype(np.float64): _dt.float64,
          np.dtype(np.int64): _dt.int64, np.dtype(np.bool_): _dt.bool_}


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


class Tensor:
    __slots__ = ("_data", "_storage", "_device", "_requires_grad", "_grad", "_grad_fn",
                 "_output_nr", "_retains_grad", "_accumulator", "_backward_hooks", "name",
                 "__weakref__")

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
        t.name = None
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

    def __init__(self, *args, **kwargs) -> None:
        raise TypeError("use symgrad.tensor(data) or a creation function to make a Tensor")

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

    def element_size(self) -> int:
        return self._data.itemsize

    def stride(self, dim: int | None = None):
        strides = tuple(s // self._data.itemsize for s in self._data.strides)
        return strides if dim is None else strides[_wrap_dim(dim, self._data.ndim)]

    def is_contiguous(self) -> bool:
        return bool(self._data.flags.c_contiguous)

    def is_floating_point(self) -> bool:
        return self.dtype.is_floating_point

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
        from .autograd.node import _add_hook, _HookDict

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
        _autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)

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
        if self.dtype is not _dt.int64 or self._data.size != 1:
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
            from .functional import to_device

            out = to_device(out, as_device(device))
        if dtype is not None and _dt.as_dtype(dtype) is not out.dtype:
            from .functional import to_dtype

            out = to_dtype(out, _dt.as_dtype(dtype))
        if copy and out is self:
            out = self.clone()
        return out

    def type(self, dtype=None):
        if dtype is None:
            return f"symgrad.{self.dtype.name}"
        return self.to(dtype)

    def float(self) -> Tensor:
        return self.to(_dt.float32)

    def double(self) -> Tensor:
        return self.to(_dt.float64)

    def long(self) -> Tensor:
        return self.to(_dt.int64)

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
        if d not in (_dt.float32, _dt.int64, _dt.bool_) or (a.size == 0 and d is not _dt.float32):
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
        _backend_for(self._device.type).add_(self._data, other._data)
        self._bump()

    def _inplace(self, method: str, op: str, others: tuple = (), params: dict | None = None,
                 kernel: str | None = None, src=None) -> Tensor:
        """Write ``op(self, *others)`` into ``self`` and bump the storage's version.

        Without a graph to record, ``kernel(self, src)`` runs truly in place. With one,
        the op runs out of place through ``apply`` on a stand-in for ``self`` that carries
        its grad_fn (a copy of the old values when the backward needs them, as PyTorch's
        ``original_self``), the result is written into ``self``, and ``self`` is rebased
        onto the new node: the same object, a new grad_fn whose edge is the old one.
        """
        if _fn._profiler is not None:
            return _fn._profiler._record_call("symgrad::" + method, "op", (self,) + others,
                                              self._inplace_impl, op, others, params or {},
                                              kernel, src, quiet=True)
        return self._inplace_impl(op, others, params or {}, kernel, src)

    def _inplace_impl(self, op, others, params, kernel, src) -> Tensor:
        grad_on = _state.enabled
        if grad_on and self._requires_grad and self._grad_fn is None:
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
        if op in _ARITH and (op == "div" or not self.dtype.is_floating_point
                             or any(o._data.dtype != self._data.dtype for o in tensors)):
            res = _dt.promote([(self.dtype, self._data.ndim == 0)]
                              + [(o.dtype, o._data.ndim == 0) for o in tensors],
                              [o for o in others if not isinstance(o, Tensor)])
            if op == "div" and not res.is_floating_point:
                res = _dt.default_float()
            if res.category > self.dtype.category:
                raise RuntimeError(f"result type {_TORCH_NAMES[res.name]} can't be cast to the "
                                   f"desired output type {_TORCH_NAMES[self.dtype.name]}")
        be = _backend_for(self._device.type)
        if not (grad_on and (self._requires_grad or any(o._requires_grad for o in tensors))):
            if kernel is not None:
                getattr(be, kernel)(self._data, src)
            else:
                from .autograd.function import apply
                from .ops import OPS

                be.copy_(self._data, apply(OPS[op], (self,) + others, params)._data)
            return self._bump()
        return self._inplace_graph(be, op, others, params)

    def _inplace_graph(self, be, op, others, params) -> Tensor:
        from .autograd.function import apply
        from .ops import OPS

        node = self._grad_fn
        spec = getattr(type(node), "_spec", None)
        if spec is not None and spec.view and node._input_refs:
            base = node._input_refs[0]
            base = base() if isinstance(base, weakref.ref) else base  # strong under record()
            if base is not None and base._storage is self._storage:
                raise RuntimeError(
                    f"symgrad does not support in-place {op} on a view ({node.name()}) of a "
                    "tensor that requires grad yet: its base's gradient would be wrong. "
                    "Apply the op out of place, or clone() the view first.")
        spec = OPS[op]
        inputs = (self,) + others
        # copy the old values when the backward needs them, or when symgrad.record() keeps
        # every input for the verifier; otherwise the stand-in is a free alias
        from .autograd.record import _recording

        keep = bool(_recording) or any(
            "self" in spec.formula_params.get(name, ())
            for name, x in zip(spec.inputs, inputs)
            if isinstance(x, Tensor) and x._requires_grad)
        stand_in = Tensor._wrap(be.copy(self._data) if keep else self._data,
                                self._device, None if keep else self._storage)
        stand_in._grad_fn = self._grad_fn
        stand_in._output_nr = self._output_nr
        stand_in._requires_grad = self._requires_grad
        stand_in.name = self.name
        out = apply(spec, (stand_in,) + others, params)
        be.copy_(self._data, out._data)
        self._bump()
        new = out._grad_fn
        new._out_meta = ((self._data.shape, self.dtype),)
        if self._retains_grad and node is not None and node._retained:
            node._retained.pop(self._output_nr, None)
            new._retained = {0: weakref.ref(self)}
        self._grad_fn = new
        self._output_nr = 0
        self._requires_grad = True
        return self

    def add_(self, other, alpha=1) -> Tensor:
        src = other._data if isinstance(other, Tensor) else other
        if alpha != 1:
            src = src * alpha
        return self._inplace("add_", "add", (other,), {"alpha": alpha}, "add_", src)

    def sub_(self, other, alpha=1) -> Tensor:
        src = other._data if isinstance(other, Tensor) else other
        if alpha != 1:
            src = src * alpha
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

    def clamp_(self, min=None, max=None) -> Tensor:  # noqa: A002
        """In place ``clamp`` with number bounds (grad_fn ClampBackward1, as in PyTorch)."""
        if min is None and max is None:
            raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
        for bound in (min, max):
            if isinstance(bound, Tensor):
                raise TypeError("symgrad's clamp_ takes number bounds, not tensors")
        return self._inplace("clamp_", "clamp", (), {"min": min, "max": max})

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


def _rebuild(data, requires_grad, name):
    t = tensor(data, requires_grad=requires_grad)
    t.name = name
    return t


def _wrap_dim(dim: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return dim % n


def _infer_dtype(data: Any) -> _dt.dtype:
    a = np.asarray(data)
    if a.dtype.kind == "b":
        return _dt.bool_
    if a.dtype.kind in "iu":
        return _dt.int64
    if a.dtype.kind == "f":
        # numpy arrays keep their dtype; Python floats become the default dtype (torch)
        if isinstance(data, np.ndarray):
            return _dt.from_numpy_dtype(a.dtype)
        return _dt.default_float()
    if a.dtype.kind == "O":
        raise TypeError("Could not infer dtype of a nested sequence with tensors or objects; "
                        "use symgrad.stack")
    raise TypeError(f"Could not infer dtype of {type(data).__name__}")


def tensor(data, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """Copy ``data`` (nested lists, numbers, NumPy arrays, tensors) into a new leaf tensor."""
    if isinstance(data, Tensor):
        data = data.detach().cpu()._data
    elif isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in _flat(data)):
        data = [_to_py(x) for x in data]
    d = _dt.as_dtype(dtype) if dtype is not None else _infer_dtype(data)
    try:
        arr = np.array(data, dtype=d.np, copy=True, order="C")
    except ValueError as exc:
        raise ValueError(f"expected sequence of equal-length lists: {exc}") from None
    dev = as_device(device)
    if dev.type != "cpu":
        from .functional import to_device

        t = to_device(Tensor._wrap(arr), dev)
    else:
        t = Tensor._wrap(arr, dev)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _flat(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x


def _to_py(x):
    if isinstance(x, Tensor):
        return x.detach().cpu()._data
    if isinstance(x, (list, tuple)):
        return [_to_py(v) for v in x]
    return x
