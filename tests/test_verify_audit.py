"""audit_rules(): every registered backward rule is proved equal to SymPy's derivative."""

from __future__ import annotations

import pytest

from symgrad.ops import OPS
from symgrad.symbolic import audit_rules

#: Ops whose rule cannot be *proved* on symbolic tensors, with the reason. Each must still
#: be "checked numerically" (rule equal to SymPy's derivative at the example point).
NOT_PROVABLE = {
    "where": "the rule builds tensor(0.0, device=grad.device); creation knows only cpu/cuda",
    "pow_tensor": "the rule builds a scalar tensor with where(); creation knows only cpu/cuda",
    "copy_slices": "the rule builds its boolean keep-mask as a cpu tensor",
    "index_put": "the rule builds its boolean keep-mask as a cpu tensor",
}
#: Ops with no example at all: device copies need a CUDA device to record.
NO_EXAMPLE = {
    "to_cpu": "a device copy: recorded only when moving from a CUDA device",
    "to_cuda": "a device copy: needs a CUDA device",
}


@pytest.fixture(scope="module")
def audit():
    return {r.op: r for r in audit_rules()}


def test_audit_covers_every_differentiable_op(audit):
    assert set(audit) == {n for n, s in OPS.items() if s.differentiable}


def test_every_rule_is_proved_except_the_named_ones(audit):
    problems = []
    for op, r in sorted(audit.items()):
        if op in NO_EXAMPLE:
            assert r.status in ("no example", "proved", "checked numerically"), r
            continue
        want = ("proved", "checked numerically") if op in NOT_PROVABLE else ("proved",)
        if r.status not in want:
            problems.append(f"{op}: {r.status} ({r.detail})")
    assert not problems, "\n".join(problems)


def test_a_wrong_rule_fails_the_audit(monkeypatch):
    monkeypatch.setitem(OPS["mul"].grads, "other", lambda grad, self: grad * self * 1.001)
    (r,) = audit_rules(["mul"])
    assert r.status == "failed" and "other" in r.detail
    monkeypatch.setitem(OPS["softmax"].grads, "self",
                        lambda grad, dim, result: grad * result)
    (r,) = audit_rules(["softmax"])
    assert r.status == "failed"
