"""Activation functions of ``torch.nn.functional``: elementwise stanzas with torch's numerics.

Each forward and backward is written as torch's CPU kernel computes it (the same branches at
the kinks, the same constants), so values and gradients agree with torch to rounding. The
constants are written from exact ones (``sqrt(2) / 2``, ``2 / sqrt(pi)``): the SymPy
meanings and the rule audit see them exactly.

``gelu`` has two forms chosen by the string ``approximate``: two ops with torch's one
grad_fn name, ``GeluBackward0``, each saving ``approximate`` as torch shows it.
"""

from __future__ import annotations

from .elementwise import elementwise
from .scalar import Scalar

# gelu(x) = x * Phi(x); torch: kAlpha = M_2_SQRTPI * M_SQRT1_2 * 0.5, pdf = kAlpha e^(-x^2/2).
# Halving is written as ``/ 2`` and kKappa as ``44715 / 1000000``: the same floats as torch's
# ``* 0.5`` and ``0.044715``, exact rationals in SymPy (so the audit proves the rules).
_SQRT1_2 = "(sqrt(2) / 2)"
_CDF = f"c = (1 + erf(x * {_SQRT1_2})) / 2"
_PDF = f"p = 2 / sqrt(pi) * {_SQRT1_2} / 2 * exp(-(x * x) / 2)"
elementwise("gelu", "GeluBackward0", Scalar(
    f"x / 2 * (1 + erf(x * {_SQRT1_2}))", f"{_CDF}; {_PDF}; g * (c + x * p)"),
    defaults={"approximate": "none"}, saved_params=("approximate",))

# the tanh form: kBeta = M_SQRT2 * M_2_SQRTPI * 0.5, kKappa = 0.044715
_BETA = "(sqrt(2) * (2 / sqrt(pi)) / 2)"
_KAPPA = "(44715 / 1000000)"
_TANH_INNER = f"t = tanh({_BETA} * (x + {_KAPPA} * (x * x * x)))"
elementwise("gelu_tanh", "GeluBackward0", Scalar(
    f"{_TANH_INNER}; x / 2 * (1 + t)",
    f"{_TANH_INNER}; d = {_BETA} * (1 + 3 * {_KAPPA} * (x * x)); "
    "g * ((1 + t) / 2 + x / 2 * (1 - t * t) * d)"),
    defaults={"approximate": "tanh"}, saved_params=("approximate",))

elementwise("leaky_relu", "LeakyReluBackward0", Scalar(
    "where(x > 0, x, x * negative_slope)", "where(x > 0, g, g * negative_slope)",
    params=("negative_slope",)), defaults={"negative_slope": 0.01})

# elu with torch's scale and input_scale (selu and celu are elu with other constants)
elementwise("elu", "EluBackward0", Scalar(
    "where(x > 0, x * scale, expm1(x * input_scale) * (alpha * scale))",
    "where(x > 0, g * scale, g * input_scale * (alpha * scale) * exp(x * input_scale))",
    params=("alpha", "scale", "input_scale")),
    defaults={"alpha": 1.0, "scale": 1.0, "input_scale": 1.0})

# log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): no overflow in either tail
elementwise("logsigmoid", "LogSigmoidBackward0", Scalar(
    "minimum(x, 0) - log1p(exp(-abs(x)))",
    "e = exp(-abs(x)); g * where(x < 0, 1 - e / (1 + e), e / (1 + e))",
    meaning="-log(1 + exp(-x))"))

# hardtanh passes the gradient strictly inside (min_val, max_val), as torch
elementwise("hardtanh", "HardtanhBackward0", Scalar(
    "minimum(maximum(x, min_val), max_val)",
    "where((x <= min_val) | (x >= max_val), 0.0, g)", params=("min_val", "max_val"),
    meaning="where(x <= min_val, min_val, where(x >= max_val, max_val, x))"),
    defaults={"min_val": -1.0, "max_val": 1.0}, dtype_rule="same")
