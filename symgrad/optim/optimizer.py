"""Optimizer base: param groups, per-parameter state, zero_grad and state dicts (torch's API).

Steps update parameters in place on their backend arrays, outside any graph (as torch's
``@torch.no_grad()`` steps do), and bump each parameter's version counter so a graph that
saved the old values refuses to backpropagate through them.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Iterable
from copy import deepcopy
from typing import Any

from ..tensor import Tensor

__all__ = ["Optimizer", "required", "check_flags", "bump_step"]


class _Required:
    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


def check_flags(differentiable: bool) -> None:
    """torch's implementation switches: ``foreach``, ``fused`` and ``capturable`` are kept in
    the param groups (as torch shows them) and change nothing here, since symgrad has one
    code path with the same arithmetic; a differentiable step is not implemented."""
    if differentiable:
        raise NotImplementedError("differentiable=True (a step recorded in the autograd graph) "
                                  "is not supported by symgrad's optimizers")


class Optimizer:
    """Holds ``param_groups`` (dicts with ``params`` and hyperparameters) and ``state``."""

    def __init__(self, params: Iterable, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.state: defaultdict[Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Tensors or dicts, but got {type(params).__name__}")
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        params = [p[1] if isinstance(p, tuple) else p for p in params]
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is "
                                f"{type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        group["params"] = params
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            group.setdefault(name, default)
        if len({id(p) for p in params}) != len(params):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; in "
                          "future, this will cause an error; see "
                          "github.com/pytorch/pytorch/issues/40967 for more information",
                          stacklevel=3)
        existing = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in existing for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        from ..nn.modules import _zero_grad

        for group in self.param_groups:
            for p in group["params"]:
                _zero_grad(p, set_to_none)

    def step(self, closure=None):
        raise NotImplementedError

    @staticmethod
    def _loss_of(closure):
        """``step(closure)``: re-evaluate the loss with grad mode on, as torch's optimizers do."""
        if closure is None:
            return None
        from ..autograd.grad_mode import enable_grad

        with enable_grad():
            return closure()

    # -- state dicts: parameters are referred to by their index over all groups -----------
    def state_dict(self) -> dict[str, Any]:
        index: dict[int, int] = {}
        groups = []
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            ids = []
            for p in g["params"]:
                index.setdefault(id(p), len(index))
                ids.append(index[id(p)])
            packed["params"] = ids
            groups.append(packed)
        state = {}
        for g in self.param_groups:
            for p in g["params"]:
                if p in self.state:
                    state[index[id(p)]] = {k: _detached(v) for k, v in self.state[p].items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = deepcopy(state_dict)
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        pairs = zip(groups, self.param_groups, strict=True)
        if any(len(a["params"]) != len(b["params"]) for a, b in pairs):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        by_index = {}
        for saved, own in zip(groups, self.param_groups, strict=True):
            for i, p in zip(saved["params"], own["params"], strict=True):
                by_index[i] = p
        self.state = defaultdict(dict)
        for i, st in state_dict["state"].items():
            p = by_index[int(i)]
            self.state[p] = {k: _moved(k, v, p) for k, v in st.items()}
        for saved, own in zip(groups, self.param_groups, strict=True):
            for k, v in saved.items():
                if k != "params":
                    own[k] = v

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __repr__(self) -> str:
        out = type(self).__name__ + " ("
        for i, group in enumerate(self.param_groups):
            out += f"\nParameter Group {i}"
            for key in sorted(group):
                if key != "params":
                    out += f"\n    {key}: {group[key]}"
        return out + "\n)"


def bump_step(step_t: Tensor) -> float:
    """``state["step"] += 1`` on the step tensor's own device (the CPU, as torch keeps it
    when not capturable, whatever the parameter's device); returns the new count."""
    from ..backends import backend_for

    be = backend_for(step_t._device.type)
    be.add_(step_t._data, 1)
    step_t._storage.version += 1
    return float(be.to_host(step_t._data))


def _detached(v):
    return v.detach() if isinstance(v, Tensor) else v


def _moved(key, v, p: Tensor):
    """A loaded state value placed as torch does: ``step`` stays where it is (the CPU);
    every other tensor, 0-dim ones (NAdam's ``mu_product``, ASGD's ``eta``) and those in
    lists (LBFGS's history) included, follows the parameter's device and, when the
    parameter is floating, its dtype."""
    if isinstance(v, Tensor):
        if key == "step":
            return v
        if p.dtype.is_floating_point:
            v = v.to(p.dtype)
        return v.to(p.device)
    if isinstance(v, dict):
        return {k: _moved(k, u, p) for k, u in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_moved(None, u, p) for u in v)
    return v
