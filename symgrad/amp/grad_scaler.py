"""``GradScaler``: torch's dynamic loss scaling, step for step.

The scale is kept as a float32 number, as torch keeps it in a float32 tensor; scaling,
unscaling, the skipped step on non-finite gradients and the growth/backoff schedule follow
``torch.amp.GradScaler``. A scaler for "cuda" where CUDA is not available is disabled with
torch's warning and passes everything through (``scale`` returns its argument, ``step``
calls ``optimizer.step``), which is what a CPU-only machine does with torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from enum import Enum
from typing import Any

import numpy as np

from .. import cuda as _cuda

__all__ = ["GradScaler"]


class _Stage(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _f32(x: float) -> float:
    return float(np.float32(x))


class GradScaler:
    """Scales the loss so small float16 gradients do not flush to zero (see module doc)."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = device
        self._enabled = enabled
        if enabled and device == "cuda" and not _cuda.is_available():
            warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  "
                          "Disabling.", UserWarning, stacklevel=2)
            self._enabled = False
        if self._enabled:
            if not growth_factor > 1.0:
                raise AssertionError("The growth factor must be > 1.0.")
            if not backoff_factor < 1.0:
                raise AssertionError("The backoff factor must be < 1.0.")
            self._init_scale = init_scale
            self._scale: float | None = None
            self._growth_factor = growth_factor
            self._backoff_factor = backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker: int | None = None
            self._per_optimizer: dict[int, dict[str, Any]] = {}

    # -- scaling ------------------------------------------------------------------------
    def _lazy_init(self) -> None:
        if self._scale is None:
            self._scale = _f32(self._init_scale)
            self._growth_tracker = self._init_growth_tracker

    def scale(self, outputs: Any) -> Any:
        """``outputs`` multiplied by the scale (tensors, or lists/tuples of them)."""
        if not self._enabled:
            return outputs
        self._lazy_init()
        factor = self._scale

        def apply(value: Any) -> Any:
            if isinstance(value, (list, tuple)):
                scaled = [apply(v) for v in value]
                return type(value)(scaled) if isinstance(value, tuple) else scaled
            if isinstance(value, Iterable) and not hasattr(value, "grad_fn"):
                return map(apply, value)
            if not hasattr(value, "grad_fn"):
                raise ValueError("outputs must be a Tensor or an iterable of Tensors")
            return value * factor

        return apply(outputs)

    def _state(self, optimizer: Any) -> dict[str, Any]:
        return self._per_optimizer.setdefault(
            id(optimizer), {"stage": _Stage.READY, "found_inf": None})

    def unscale_(self, optimizer: Any) -> None:
        """Divides ``optimizer``'s gradients by the scale, noting whether any is not finite."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        state = self._state(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError(
                "unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = _f32(1.0 / float(np.float64(self._scale)))
        found_inf = False
        checked = False
        from ..autograd import no_grad

        with no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None:
                        continue
                    checked = True
                    if not bool(np.isfinite(g.detach().cpu().numpy()).all()):
                        found_inf = True
                    g.mul_(inv_scale)
        state["found_inf"] = found_inf if checked else None
        state["stage"] = _Stage.UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step()`` unless the unscaled gradients hold an inf or NaN."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError(
                "Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._state(optimizer)
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        if state["found_inf"] is None:
            raise AssertionError("No inf checks were recorded for this optimizer.")
        retval = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = _Stage.STEPPED
        return retval

    def update(self, new_scale: Any = None) -> None:
        """Backs the scale off after a skipped step, grows it after ``growth_interval`` good
        ones (or sets ``new_scale``); then a new iteration begins."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("update")
        if new_scale is not None:
            value = new_scale.item() if hasattr(new_scale, "item") else new_scale
            if not isinstance(value, float):
                raise AssertionError(
                    "new_scale should be a float or a 1-element torch.cuda.FloatTensor or "
                    "torch.FloatTensor with requires_grad=False.")
            self._scale = _f32(value)
        else:
            found = [s["found_inf"] for s in self._per_optimizer.values()
                     if s["found_inf"] is not None]
            if not found:
                raise AssertionError("No inf checks were recorded prior to update.")
            if any(found):
                self._scale = _f32(np.float32(self._scale) * np.float32(self._backoff_factor))
                self._growth_tracker = 0
            else:
                self._growth_tracker += 1
                if self._growth_tracker == self._growth_interval:
                    self._scale = _f32(np.float32(self._scale) * np.float32(self._growth_factor))
                    self._growth_tracker = 0
        self._per_optimizer = {}

    def _check_scale_growth_tracker(self, funcname: str) -> None:
        fix = "This may indicate your script did not use scaler.scale(loss or outputs) earlier " \
              "in the iteration."
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  " + fix)
        if self._growth_tracker is None:
            raise AssertionError(f"Attempted {funcname} but _growth_tracker is None.  " + fix)

    # -- state ----------------------------------------------------------------------------
    def get_scale(self) -> float:
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def is_enabled(self) -> bool:
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker if self._growth_tracker is not None
                else self._init_growth_tracker}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._init_scale = state_dict["scale"]
        if self._scale is not None:
            self._scale = _f32(state_dict["scale"])
        self._growth_factor = state_dict["growth_factor"]
        self._backoff_factor = state_dict["backoff_factor"]
        self._growth_interval = state_dict["growth_interval"]
        self._init_growth_tracker = state_dict["_growth_tracker"]
        if self._growth_tracker is not None:
            self._growth_tracker = state_dict["_growth_tracker"]
