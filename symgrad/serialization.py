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
    """Read what :func:`save` wrote; ``map_location`` moves every tensor to that device."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            data = fh.read()
        f = io.BytesIO(data)
    obj = _WeightsUnpickler(f).load() if weights_only else pickle.load(f)
    if map_location is not None:
        obj = _move(obj, map_location)
    return obj


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
