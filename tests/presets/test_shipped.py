"""The shipped presets: each loads, builds a batcher carrying its values, fits its scenario,
and serves requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import adaptive_batcher
from adaptive_batcher import SLO, AdaptiveBatcher, Preset, PresetError, list_presets, load_preset
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.policies import AIMD, PID, DiscountedThompson, DiscountedUCB, Static
from adaptive_batcher.presets import POLICIES, load_preset_group
from adaptive_batcher.testing import EchoModel

POLICIES_DIR = Path(__file__).resolve().parents[2] / "policies"
SHIPPED = [
    "batch_images",
    "customer_service/chat",
    "customer_service/summaries",
    "image_generation",
    "offline_moderation",
    "realtime_chat",
    "search",
    "translation",
    "video_review",
]


def controller_of(batcher: AdaptiveBatcher[Any, Any]) -> Any:
    """The batcher's controller (private: the policy instance and bounds have no public view)."""
    controller = batcher._core.controller
    assert controller is not None
    return controller


def test_list_presets_names_every_shipped_file_and_member() -> None:
    assert list_presets() == SHIPPED
    stems = sorted(path.stem for path in POLICIES_DIR.glob("*.toml"))
    assert stems == sorted({name.partition("/")[0] for name in SHIPPED})
    assert not (POLICIES_DIR / ".keep").exists()
    assert (POLICIES_DIR / "README.md").is_file()


def test_public_names_are_exported() -> None:
    for name in ("Preset", "PresetError", "list_presets", "load_preset"):
        assert name in adaptive_batcher.__all__
        assert getattr(adaptive_batcher, name) is not None
    assert issubclass(PresetError, ValueError)


def test_policy_names_are_the_classes_own() -> None:
    assert sorted(POLICIES) == ["aimd", "bandit_thompson", "bandit_ucb", "pid", "static"]
    for name, make in POLICIES.items():
        assert make().name == name


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_preset_loads_complete(name: str) -> None:
    preset = load_preset(name)
    assert preset.name == name
    assert len(preset.description) > 20
    assert preset.source.parent == POLICIES_DIR
    assert preset.source.name == name.partition("/")[0] + ".toml"
    assert isinstance(preset.slo, SLO)
    assert preset.policy is not None and preset.policy.name in POLICIES
    assert isinstance(preset.bounds, Bounds)
    assert preset.bounds.max_batch_size == preset.batcher["max_batch_size"]
    assert "window_ms" in preset.batcher and "max_batch_size" in preset.batcher
    assert hash(preset) == hash(load_preset(name))
    assert preset == load_preset(name)


@pytest.mark.parametrize("name", SHIPPED)
async def test_every_shipped_preset_builds_a_batcher_carrying_its_values(name: str) -> None:
    preset = load_preset(name)
    batcher = AdaptiveBatcher.from_preset(name, EchoModel())
    stats = batcher.stats()
    assert stats.name == name
    assert stats.window_ms == pytest.approx(preset.batcher["window_ms"])
    assert stats.max_batch_size == preset.batcher["max_batch_size"]
    assert stats.max_concurrent_batches == preset.batcher.get("max_concurrent_batches", 1)
    assert stats.slo == preset.slo
    controller = controller_of(batcher)
    assert preset.policy is not None
    assert type(controller.policy) is POLICIES[preset.policy.name]
    for key, value in preset.policy.params.items():
        assert getattr(controller.policy, key) == value
    assert controller.bounds == preset.bounds
    assert controller.interval_s == pytest.approx(preset.batcher["control_interval_ms"] / 1e3)
    await batcher.aclose()


@pytest.mark.parametrize("name", SHIPPED)
async def test_every_shipped_preset_serves_a_full_batch_end_to_end(name: str) -> None:
    model = EchoModel()
    cap = load_preset(name).batcher["max_batch_size"]
    async with AdaptiveBatcher.from_preset(name, model) as batcher:
        # a full cap leaves at once, whatever the window (size-triggered)
        results = await asyncio.wait_for(batcher.submit_many(range(cap)), timeout=5.0)
    assert results == list(range(cap))
    assert sorted(set(model.seen)) == list(range(cap))
    assert max(model.sizes) <= cap


async def test_realtime_chat_batches_what_arrives_within_its_window() -> None:
    model = EchoModel(delay_s=0.001)
    async with AdaptiveBatcher.from_preset("realtime_chat", model) as batcher:
        results = await asyncio.wait_for(batcher.submit_many(["a", "b", "c"]), timeout=2.0)
        second = await asyncio.wait_for(batcher.submit("d"), timeout=2.0)
    assert results == ["a", "b", "c"] and second == "d"
    # three items in one call, padded to the bucket of 4 by repeating the last item
    assert model.batches[0] == ["a", "b", "c", "c"]
    assert model.batches[1] == ["d"]


# -- each preset fits its scenario ---------------------------------------------------------------


def window(preset: Preset) -> float:
    value = preset.batcher["window_ms"]
    assert isinstance(value, float)
    return value


def bounds(preset: Preset) -> Bounds:
    assert preset.bounds is not None
    return preset.bounds


def slo(preset: Preset) -> SLO:
    assert preset.slo is not None
    return preset.slo


def policy_type(preset: Preset) -> type:
    assert preset.policy is not None
    return type(preset.make_policy())


def test_realtime_chat_answers_well_under_300_ms_with_a_short_window_and_sheds_late() -> None:
    preset = load_preset("realtime_chat")
    assert slo(preset).latency_ms <= 250
    assert window(preset) <= 30 and bounds(preset).max_window_ms <= 30
    assert preset.batcher["shed_late"] is True
    assert policy_type(preset) is PID


def test_search_gives_feedback_within_300_ms_with_windows_under_50_ms() -> None:
    preset = load_preset("search")
    assert slo(preset).latency_ms <= 300
    assert window(preset) < 50 and bounds(preset).max_window_ms < 50
    assert policy_type(preset) is DiscountedUCB
    # its arms are fractions of the window planned within the budget, itself within the bounds
    assert preset.policy is not None and max(preset.policy.params["fractions"]) <= 1.0


def test_translation_stays_under_200_ms_end_to_end() -> None:
    preset = load_preset("translation")
    assert slo(preset).latency_ms <= 200
    assert window(preset) + bounds(preset).max_window_ms < slo(preset).batcher_budget_ms
    assert preset.batcher["shed_late"] is True


@pytest.mark.parametrize("name", ["offline_moderation", "batch_images"])
def test_offline_presets_put_throughput_first(name: str) -> None:
    preset = load_preset(name)
    assert slo(preset).latency_ms >= 5000  # loose
    assert window(preset) >= 200 and bounds(preset).min_window_ms >= 200
    assert preset.batcher["max_batch_size"] >= 256


def test_batch_images_is_size_triggered() -> None:
    preset = load_preset("batch_images")
    assert policy_type(preset) is Static
    assert preset.policy is not None
    assert preset.policy.params == {"window_ms": 1000.0, "max_batch_size": 512}
    # 512 items at the ~16k img/s the file cites take ~32 ms to arrive: the cap fills first
    assert window(preset) > 512 / 16_000 * 1e3


def test_offline_moderation_maximises_goodput_over_long_windows() -> None:
    preset = load_preset("offline_moderation")
    assert policy_type(preset) is DiscountedThompson
    # it plays only the wider half of the planned windows: throughput first
    assert preset.policy is not None and min(preset.policy.params["fractions"]) >= 0.5


def test_video_review_uses_500_ms_windows() -> None:
    preset = load_preset("video_review")
    assert window(preset) == 500.0 and bounds(preset).max_window_ms == 500.0
    assert policy_type(preset) is AIMD
    assert preset.policy is not None and preset.policy.params["window_ms"] == 500.0


def test_image_generation_limits_concurrency_first_then_widens_the_window() -> None:
    preset = load_preset("image_generation")
    assert preset.batcher["max_concurrent_batches"] <= 4
    assert preset.batcher["max_batch_size"] <= 8
    assert bounds(preset).max_batch_size <= 8
    assert bounds(preset).max_window_ms > window(preset)
    assert preset.policy is not None and preset.policy.params["max_window_ms"] > window(preset)


async def test_customer_service_yields_two_batchers_with_different_settings() -> None:
    group = load_preset_group("customer_service")
    assert sorted(group) == ["chat", "summaries"]
    chat, summaries = group["chat"], group["summaries"]
    assert (chat.name, summaries.name) == ("customer_service/chat", "customer_service/summaries")
    assert chat == load_preset("customer_service/chat")
    assert chat.description != summaries.description
    assert slo(chat).latency_ms <= 300 < slo(summaries).latency_ms
    assert window(chat) <= 30 and window(summaries) >= 200
    assert chat.batcher["shed_late"] is True and "shed_late" not in summaries.batcher
    assert policy_type(chat) is PID and policy_type(summaries) is AIMD
    interactive = AdaptiveBatcher.from_preset("customer_service/chat", EchoModel())
    background = AdaptiveBatcher.from_preset("customer_service/summaries", EchoModel())
    assert interactive.stats().window_ms != background.stats().window_ms
    assert interactive.stats().max_batch_size != background.stats().max_batch_size
    assert controller_of(interactive).policy is not controller_of(background).policy
    await interactive.aclose()
    await background.aclose()


def test_each_policy_lists_exactly_its_constructor_arguments() -> None:
    """Presets accept a policy's ``parameters``; they must be its constructor's arguments."""
    import inspect

    from adaptive_batcher.policies.bandit import BanditOptions

    for name, cls in POLICIES.items():
        signature = inspect.signature(cls.__init__).parameters
        named = {p for p, v in signature.items() if v.kind is v.KEYWORD_ONLY or p != "self"}
        named = {p for p in named if signature[p].kind is not inspect.Parameter.VAR_KEYWORD}
        if any(v.kind is inspect.Parameter.VAR_KEYWORD for v in signature.values()):
            named |= set(BanditOptions.__annotations__)
        assert set(cls.parameters) == named - {"self"}, name
        assert cls.name == name
