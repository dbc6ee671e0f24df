"""The symbolic verifier: SymPy differentiates a recorded graph and checks the engine.

``verify(root)`` replays the graph that produced ``root`` on the SymPy backend and
compares the engine's gradients with exact symbolic ones (exact mode), checks every
node's backward against its op's symbolic Jacobian (local mode), and adds central
finite differences as a third opinion. ``audit_rules()`` proves every registered
op's backward formula equal to the derivative of its forward. See docs/verifier.md.
"""

from __future__ import annotations

from .graph import FreedGraphError
from .report import MIME_TYPE, Report
from .verify import DEFAULT_TOLERANCES, EXACT_BUDGET, EXACT_BUDGETS, VerifierBudgetError, verify

__all__ = ["verify", "Report", "FreedGraphError", "audit_rules", "capture_torch", "MIME_TYPE",
           "EXACT_BUDGET", "EXACT_BUDGETS", "DEFAULT_TOLERANCES", "VerifierBudgetError"]


def audit_rules(*args, **kwargs):
    """Prove every registered op's backward rule (see :mod:`symgrad.symbolic.audit`)."""
    from .audit import audit_rules as _audit

    return _audit(*args, **kwargs)


def capture_torch(*args, **kwargs):
    """Record a PyTorch forward with its values (a TorchFunctionMode) for ``verify``."""
    from .torch_graph import capture_torch as _capture

    return _capture(*args, **kwargs)
