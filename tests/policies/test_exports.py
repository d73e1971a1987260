"""The policies package exports what it lists."""

from __future__ import annotations

import adaptive_batcher.policies as policies


def test_all_names_resolve_and_include_the_policies() -> None:
    assert {"AIMD", "Bandit", "DiscountedThompson", "DiscountedUCB", "Policy", "Static"} <= set(
        policies.__all__
    )
    for name in policies.__all__:
        assert getattr(policies, name) is not None


def test_every_concrete_policy_satisfies_the_protocol() -> None:
    for policy in (
        policies.Static(),
        policies.AIMD(),
        policies.DiscountedUCB(),
        policies.DiscountedThompson(),
    ):
        assert isinstance(policy, policies.Policy)
        assert isinstance(policy.name, str) and policy.name
