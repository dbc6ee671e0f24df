"""``symgrad.utils.hooks``: hook handles and the machinery of Module backward hooks.

Ported from ``torch.utils.hooks`` so a module's full backward hooks fire with the same
arguments, at the same time and with the same graph as torch's: the module's tensor inputs
and outputs pass through an identity ``BackwardHookFunction`` (grad_fn
``BackwardHookFunctionBackward``); the output node captures ``grad_output``, the input node
calls the user hooks with ``(module, grad_input, grad_output)`` and lets them replace
``grad_input``.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

from ..autograd.custom_function import Function
from ..autograd.grad_mode import is_grad_enabled

__all__ = ["RemovableHandle", "BackwardHook", "BackwardHookFunction"]


class RemovableHandle:
    """What ``register_*_hook`` returns: ``.remove()`` (or ``with``) unregisters the hook.

    Weakly refers to the hook dict (and to ``extra_dict``, e.g. the with-kwargs flags), so a
    handle never keeps a module alive.
    """

    next_id: int = 0

    def __init__(self, hooks_dict: Any, *, extra_dict: Any = None) -> None:
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.id = RemovableHandle.next_id
        RemovableHandle.next_id += 1
        self.extra_dict_ref: tuple = ()
        if isinstance(extra_dict, dict):
            self.extra_dict_ref = (weakref.ref(extra_dict),)
        elif isinstance(extra_dict, list):
            self.extra_dict_ref = tuple(weakref.ref(d) for d in extra_dict)

    def remove(self) -> None:
        hooks_dict = self.hooks_dict_ref()
        if hooks_dict is not None and self.id in hooks_dict:
            del hooks_dict[self.id]
        for ref in self.extra_dict_ref:
            extra = ref()
            if extra is not None and self.id in extra:
                del extra[self.id]

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


class BackwardHookFunction(Function):
    """Identity on tensors; its node is where module backward hooks attach (as torch's)."""

    @staticmethod
    def forward(ctx, *args):
        ctx.mark_non_differentiable(*[a for a in args if not a.requires_grad])
        return args

    @staticmethod
    def backward(ctx, *args):
        return args


class BackwardHook:
    """Links the gradients captured at a module's outputs to those at its inputs."""

    def __init__(self, module, user_hooks: list, user_pre_hooks: list) -> None:
        self.user_hooks = user_hooks
        self.user_pre_hooks = user_pre_hooks
        self.module = module
        self.grad_outputs = None
        self.n_outputs = -1
        self.output_tensors_index = None
        self.n_inputs = -1
        self.input_tensors_index = None

    @staticmethod
    def _pack_with_none(indices, values, size: int) -> tuple:
        res: list = [None] * size
        for idx, val in zip(indices, values, strict=True):
            res[idx] = val
        return tuple(res)

    @staticmethod
    def _unpack_none(indices, values) -> tuple:
        return tuple(values[idx] for idx in indices)

    def _set_user_hook(self, grad_fn) -> None:
        def hook(grad_input, _):
            if self.grad_outputs is None:  # gradient reached the inputs but not via outputs
                return None
            res = self._pack_with_none(self.input_tensors_index, grad_input, self.n_inputs)
            for user_hook in self.user_hooks:
                out = user_hook(self.module, res, self.grad_outputs)
                if out is None:
                    continue
                if len(out) != len(res):
                    raise RuntimeError("Backward hook returned an invalid number of "
                                       f"grad_input, got {len(out)}, but expected {len(res)}")
                res = out
            self.grad_outputs = None
            return self._unpack_none(self.input_tensors_index, res)

        grad_fn.register_hook(hook)

    def _apply_on_tensors(self, fn, args):
        from ..tensor import Tensor

        tensors_idx, tensors = [], []
        requires_grad = False
        for i, arg in enumerate(args):
            if isinstance(arg, Tensor):
                tensors_idx.append(i)
                tensors.append(arg)
                requires_grad |= arg.requires_grad
        if not (requires_grad and is_grad_enabled()):
            return args, None
        new_tensors = BackwardHookFunction.apply(*tensors)
        if len(new_tensors) == 0:
            raise RuntimeError("Cannot set Module backward hook for a Module with no input "
                               "Tensors.")
        grad_fns = [t.grad_fn for t in new_tensors if t.grad_fn is not None
                    and t.grad_fn.name() == "BackwardHookFunctionBackward"]
        if not grad_fns:
            raise RuntimeError("Error while setting up backward hooks. Please open an issue "
                               "with a code sample to reproduce this.")
        fn(grad_fns[0])
        arg_list = list(args)
        for idx, val in zip(tensors_idx, new_tensors, strict=True):
            arg_list[idx] = val
        out = tuple(arg_list) if type(args) is tuple else type(args)(*arg_list)
        return out, tensors_idx

    def setup_input_hook(self, args):
        res, input_idx = self._apply_on_tensors(self._set_user_hook, args)
        self.n_inputs = len(args)
        self.input_tensors_index = input_idx
        return res

    def setup_output_hook(self, args):
        def fn(grad_fn) -> None:
            def hook(_, grad_output):
                self.grad_outputs = self._pack_with_none(self.output_tensors_index,
                                                         grad_output, self.n_outputs)
                if self.user_pre_hooks:
                    expected_len = len(self.grad_outputs)
                    for user_pre_hook in self.user_pre_hooks:
                        new = user_pre_hook(self.module, self.grad_outputs)
                        if new is None:
                            continue
                        if len(new) != expected_len:
                            raise RuntimeError("Backward pre hook returned an invalid number "
                                               f"of grad_output, got {len(new)}, but "
                                               f"expected {expected_len}")
                        self.grad_outputs = new
                local_grad_outputs = self.grad_outputs
                if self.input_tensors_index is None:  # no input requires grad
                    warnings.warn(
                        "Full backward hook is firing when gradients are computed with respect "
                        "to module outputs since no inputs require gradients. See "
                        "https://docs.pytorch.org/docs/main/generated/torch.nn.Module.html"
                        "#torch.nn.Module.register_full_backward_hook for more details.",
                        stacklevel=5)
                    grad_inputs = self._pack_with_none([], [], self.n_inputs)
                    for user_hook in self.user_hooks:
                        res = user_hook(self.module, grad_inputs, self.grad_outputs)
                        if res is not None and not (isinstance(res, tuple)
                                                    and all(el is None for el in res)):
                            raise RuntimeError("Backward hook for Modules where no input "
                                               "requires gradient should always return None "
                                               "or None for all gradients.")
                    self.grad_outputs = None
                if local_grad_outputs is not None:
                    return tuple(local_grad_outputs[i] for i in self.output_tensors_index)
                return None

            grad_fn.register_hook(hook)

        is_tuple = isinstance(args, tuple)
        if not is_tuple:
            args = (args,)
        res, output_idx = self._apply_on_tensors(fn, args)
        self.n_outputs = len(args)
        self.output_tensors_index = output_idx
        return res if is_tuple else res[0]
