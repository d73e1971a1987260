"""The public API of adaptive_batcher.profile."""

from __future__ import annotations

import adaptive_batcher.profile as profile


def test_all_lists_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(profile).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("adaptive_batcher.profile")
    }
    constants = {
        "DEFAULT_CV_THRESHOLD", "DEFAULT_WINDOW_FRACTION", "FALLBACK_FRACTION",
        "MONOTONE_TOLERANCE", "SCHEMA", "KneeMethod",
    }  # fmt: skip
    reexported = {"is_out_of_memory"}  # the package's one out-of-memory test (_oom)
    assert set(profile.__all__) == public | constants | reexported
    assert sorted(profile.__all__) == sorted(set(profile.__all__))
    for name in profile.__all__:
        assert getattr(profile, name) is not None


def test_public_callables_are_documented() -> None:
    for name in profile.__all__:
        value = getattr(profile, name)
        if callable(value) and name != "KneeMethod":
            assert value.__doc__, f"{name} has no docstring"


def test_recommend_is_the_function_not_the_submodule() -> None:
    from adaptive_batcher.profile.recommend import recommend

    assert profile.recommend is recommend
