"""``symgrad.save`` / ``symgrad.load``: tensors, modules' and optimizers' state dicts, by pickle.

Like ``torch.load`` since 2.6, ``load`` defaults to ``weights_only=True``: it unpickles only
tensors, Parameters, dtypes, NumPy arrays and plain containers, so a checkpoint from an
untrusted source cannot run code. Pass ``weights_only=False`` for arbitrary objects
(only for files you trust).
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import numpy as np

__all__ = ["save", "load"]

_ALLOWED = {
    ("symgrad.tensor", "_rebuild"),
    ("symgrad.nn.parameter", "_rebuild_parameter"),
    ("symgrad.dtypes", "as_dtype"),
    ("collections", "OrderedDict"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.dtypes", "Float32DType"),
    ("numpy.dtypes", "Float64DType"),
    ("numpy.dtypes", "Int64DType"),
    ("numpy.dtypes", "BoolDType"),
    ("numpy.dtypes", "Float16DType"),
    ("numpy.dtypes", "Int32DType"),
    ("numpy.dtypes", "Int16DType"),
    ("numpy.dtypes", "Int8DType"),
    ("numpy.dtypes", "UInt8DType"),
    ("ml_dtypes", "bfloat16"),  # the scalar type of bfloat16 arrays (a type, runs no code)
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("builtins", "complex"),
}


class _WeightsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"Weights only load failed: unsupported global {module}.{name}. Load with "
            "weights_only=False only if you trust the source of this file.")


def save(obj: Any, f, pickle_protocol: int = pickle.DEFAULT_PROTOCOL) -> None:
    """Write ``obj`` (a tensor, a state dict, nested containers of them) to a path or file."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            pickle.dump(obj, fh, protocol=pickle_protocol)
    else:
        pickle.dump(obj, f, protocol=pickle_protocol)


def load(f, map_location=None, *, weights_only: bool = True) -> Any:
    """Read what :func:`save` wrote, or a checkpoint ``torch.save`` wrote (its zip format:
    tensors, Parameters and plain containers, never code); ``map_location`` moves every
    tensor to that device."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            data = fh.read()
        f = io.BytesIO(data)
    start = f.tell()
    if f.read(4) == b"PK\x03\x04":  # a zip archive: torch.save's format since torch 1.6
        f.seek(start)
        obj = _load_torch_zip(f)
    else:
        f.seek(start)
        obj = _WeightsUnpickler(f).load() if weights_only else pickle.load(f)
    if map_location is not None:
        obj = _move(obj, map_location)
    return obj


#: torch storage classes -> the NumPy dtype of their bytes and the dtype symgrad keeps
#: (torch's own dtype: every one of these has a symgrad dtype)
_TORCH_STORAGES = {
    "FloatStorage": ("<f4", "float32"), "DoubleStorage": ("<f8", "float64"),
    "LongStorage": ("<i8", "int64"), "BoolStorage": ("?", "bool"),
    "IntStorage": ("<i4", "int32"), "ShortStorage": ("<i2", "int16"),
    "CharStorage": ("i1", "int8"), "ByteStorage": ("u1", "uint8"),
    "HalfStorage": ("<f2", "float16"), "BFloat16Storage": ("<u2", "bfloat16"),
}
#: torch dtypes a checkpoint may hold as values (``{"dtype": torch.float16}``)
_TORCH_DTYPES = frozenset(("float32", "float64", "float16", "bfloat16", "int64", "int32",
                           "int16", "int8", "uint8", "bool", "half", "float", "double", "long",
                           "int", "short"))
_TORCH_REBUILDERS = {"_rebuild_tensor_v2", "_rebuild_parameter"}


class _TorchStorage:
    def __init__(self, kind: str, data: bytes) -> None:
        from .dtypes import as_dtype

        code, keep = _TORCH_STORAGES[kind]
        raw = np.frombuffer(data, dtype=np.dtype(code))
        if kind == "BFloat16Storage":  # the same 16 bits as ml_dtypes' bfloat16
            raw = raw.view(as_dtype(keep).np)
        self.array = raw.astype(as_dtype(keep).np)


def _rebuild_tensor(storage: _TorchStorage, offset: int, size, stride, requires_grad=False,
                    backward_hooks=None, metadata=None):
    from .tensor import Tensor

    arr = storage.array
    if len(size) and min(size) == 0:
        values = np.zeros(tuple(size), dtype=arr.dtype)
    else:
        last = offset + sum((n - 1) * st for n, st in zip(size, stride))
        if offset < 0 or last >= len(arr) or min(stride, default=0) < 0:
            raise pickle.UnpicklingError("torch checkpoint: a tensor reaches past its storage")
        values = np.lib.stride_tricks.as_strided(
            arr[offset:], shape=tuple(size), strides=tuple(st * arr.itemsize for st in stride))
    t = Tensor._wrap(np.ascontiguousarray(values).copy())
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_torch_parameter(data, requires_grad, backward_hooks=None):
    from .nn.parameter import Parameter

    return Parameter(data, requires_grad)


class _TorchZipUnpickler(pickle.Unpickler):
    """Reads a ``torch.save`` archive's data.pkl the way ``torch.load(weights_only=True)``
    does: tensors come from the archive's storage records, anything that would run code is
    refused."""

    def __init__(self, file, archive, prefix: str) -> None:
        super().__init__(file)
        self._archive, self._prefix, self._storages = archive, prefix, {}

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_torch_parameter
        if module == "torch" and name in _TORCH_STORAGES:
            return name
        if (module, name) in (("collections", "OrderedDict"), ("builtins", "set"),
                              ("builtins", "frozenset"), ("builtins", "slice")):
            return super().find_class(module, name)
        if module == "torch" and name in _TORCH_DTYPES:  # a dtype kept as a value
            from .dtypes import as_dtype

            return as_dtype(name)
        if module == "torch" and name.endswith("Storage") or module == "torch" and \
                name in ("complex64", "complex128", "uint16", "uint32", "uint64"):
            raise pickle.UnpicklingError(
                f"this torch checkpoint holds torch.{name}, which symgrad cannot read")
        raise pickle.UnpicklingError(
            f"this torch checkpoint holds {module}.{name}, which is not a tensor or a plain "
            "container; symgrad.load reads tensors and state dicts only (load it with torch "
            "and save its state_dict())")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"torch checkpoint: unknown record {pid!r}")
        _, kind, key, _location, _numel = pid
        if kind not in _TORCH_STORAGES:
            raise pickle.UnpicklingError(
                f"this torch checkpoint holds a {kind}, which symgrad cannot read")
        if key not in self._storages:
            data = self._archive.read(f"{self._prefix}data/{key}")
            self._storages[key] = _TorchStorage(kind, data)
        return self._storages[key]


def _load_torch_zip(f) -> Any:
    import zipfile

    try:
        archive = zipfile.ZipFile(f)
        pkl = next(n for n in archive.namelist() if n.endswith("data.pkl") and n.count("/") == 1)
    except (zipfile.BadZipFile, StopIteration):
        raise pickle.UnpicklingError(
            "not a symgrad.save file, nor a torch.save checkpoint (a zip archive without "
            "data.pkl)") from None
    prefix = pkl[: -len("data.pkl")]
    order = archive.read(prefix + "byteorder").decode() if prefix + "byteorder" in \
        archive.namelist() else "little"
    if order != "little":
        raise pickle.UnpicklingError("torch checkpoint written big-endian: not supported")
    with archive.open(pkl) as fh:
        return _TorchZipUnpickler(io.BytesIO(fh.read()), archive, prefix).load()


def _move(obj, device):
    from .nn.parameter import Parameter
    from .tensor import Tensor

    if isinstance(obj, Parameter):
        return Parameter(obj.detach().to(device), obj.requires_grad)
    if isinstance(obj, Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return type(obj)((k, _move(v, device)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move(v, device) for v in obj)
    return obj
