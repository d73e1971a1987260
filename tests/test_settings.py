"""One rule, one message: a setting means the same in the runtime, the simulator and presets."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from adaptive_batcher import AdaptiveBatcher, PresetError, load_preset
from adaptive_batcher.control import Bounds
from adaptive_batcher.core.settings import BatcherSettings
from adaptive_batcher.policies import Static
from adaptive_batcher.sim.simulator import SimConfig
from adaptive_batcher.slo import SLO

BOUNDS_ABOVE_CAP = re.escape("bounds.max_batch_size (64) exceeds max_batch_size (8), the hard cap")


def test_bounds_above_the_hard_cap_are_refused_everywhere_with_one_message(
    tmp_path: Path,
) -> None:
    # the example: the controller would believe 64 while the engine ran at 8
    kwargs = {"max_batch_size": 8, "bounds": Bounds(max_batch_size=64)}
    with pytest.raises(ValueError, match=BOUNDS_ABOVE_CAP):
        AdaptiveBatcher(lambda b: b, policy=Static(max_batch_size=64), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=BOUNDS_ABOVE_CAP):
        SimConfig(policy=Static(max_batch_size=64), **kwargs)  # type: ignore[arg-type]
    preset = tmp_path / "p.toml"
    preset.write_text("[batcher]\nmax_batch_size = 8\n[bounds]\nmax_batch_size = 64\n")
    with pytest.raises(PresetError, match=BOUNDS_ABOVE_CAP) as caught:
        load_preset(preset)
    assert caught.value.key == "bounds.max_batch_size"


BUCKET_ABOVE_CAP = re.escape("batch_sizes [16] exceed max_batch_size (8), the hard cap")
CAP_ABOVE_BUCKETS = re.escape(
    "max_batch_size (8) must not exceed the largest of batch_sizes (4): a full batch would "
    "have no bucket to pad to"
)


@pytest.mark.parametrize(
    ("buckets", "message"), [([1, 16], BUCKET_ABOVE_CAP), ([1, 4], CAP_ABOVE_BUCKETS)]
)
def test_the_largest_bucket_must_be_the_cap_everywhere(
    tmp_path: Path, buckets: list[int], message: str
) -> None:
    # cap 8 with buckets [1, 16] padded every batch of 2..8 up to 16, past the cap (Triton
    # refuses preferred_batch_size > max_batch_size); cap 8 with buckets [1, 4] would leave a
    # full batch without a bucket, and the message says so
    kwargs = {"max_batch_size": 8, "batch_sizes": buckets}
    with pytest.raises(ValueError, match=message):
        AdaptiveBatcher(lambda b: b, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        SimConfig(**kwargs)  # type: ignore[arg-type]
    preset = tmp_path / "p.toml"
    preset.write_text(f"[batcher]\nmax_batch_size = 8\nbatch_sizes = {buckets}\n")
    with pytest.raises(PresetError, match=message) as caught:
        load_preset(preset)
    assert caught.value.key == "batcher.batch_sizes"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"window_ms": 150.0, "bounds": Bounds(max_window_ms=100.0, max_batch_size=16)},
            "window_ms \\(150\\) must lie within the bounds' window range \\[0, 100\\]",
        ),
        (
            {"batch_sizes": [8, 16], "bounds": Bounds(max_batch_size=16, batch_sizes=(4, 16))},
            "bounds.batch_sizes \\[4\\] are not among batch_sizes \\[8, 16\\]",
        ),
        ({"shed_late": True}, "shed_late=True needs an slo"),
        ({"guards": 5}, "guards must be a sequence of guard factories, got int"),
        ({"window_origin": "worker"}, "window_origin must be one of 'arrival', 'slot_free'"),
        ({"service_profile": [("a", "b")]}, "service_profile rows must be"),
        (
            {"service_profile": [(1, 1e305)]},
            re.escape("median_ms: number in (0, 1e+08]), got (1, 1e+305)"),
        ),
    ],
)
def test_contradicting_settings_are_refused_at_construction(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        BatcherSettings(max_batch_size=16, **kwargs)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match=message):
        SimConfig(max_batch_size=16, **kwargs)  # type: ignore[arg-type]


def test_a_missing_profile_file_names_the_setting(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(FileNotFoundError, match="service_profile: no such file"):
        AdaptiveBatcher(lambda b: b, slo=SLO(latency_ms=50), service_profile=missing)


def test_default_bounds_follow_the_batcher() -> None:
    assert BatcherSettings(max_batch_size=64, window_ms=250.0).controller_bounds == Bounds(
        0.0, 250.0, 1, 64
    )
    with_buckets = BatcherSettings(max_batch_size=16, batch_sizes=(4, 8, 16))
    assert with_buckets.controller_bounds.batch_sizes == (4, 8, 16)
    given = BatcherSettings(
        max_batch_size=16, batch_sizes=(4, 8, 16), bounds=Bounds(0.0, 20.0, 1, 8)
    )
    assert given.controller_bounds == Bounds(0.0, 20.0, 1, 8, (4, 8, 16))


def test_the_default_window_range_reaches_the_slos_budget() -> None:
    """A 50 ms decode step under a 200 ms SLO is cheapest at a 100 ms window: the default range
    stopped at 100 ms whatever the SLO, so the controller could not wait longer (issue 27:
    1.9x the cost oracle's device time on the llama_1b decode table)."""
    slow = BatcherSettings(max_batch_size=64, slo=SLO(latency_ms=1000.0))
    assert slow.controller_bounds.max_window_ms == 800.0  # the target, 0.8 x 1000 ms
    fast = BatcherSettings(max_batch_size=64, slo=SLO(latency_ms=50.0))
    assert fast.controller_bounds.max_window_ms == 100.0
    given = BatcherSettings(slo=SLO(latency_ms=1000.0), bounds=Bounds(0.0, 20.0, 1, 8))
    assert given.controller_bounds.max_window_ms == 20.0


def test_set_slo_moves_the_default_window_range_only() -> None:
    from adaptive_batcher.core.batcher_core import BatcherCore

    core: BatcherCore[int] = BatcherCore(BatcherSettings(max_batch_size=8, slo=SLO(50.0)))
    core.set_slo(SLO(latency_ms=500.0, preprocess_ms=100.0))
    assert core.bounds.max_window_ms == 300.0  # 0.8 x 500 - 100
    assert core.controller is not None and core.controller.bounds.max_window_ms == 300.0
    bounded = BatcherSettings(max_batch_size=8, slo=SLO(50.0), bounds=Bounds(0.0, 30.0, 1, 8))
    core = BatcherCore(bounded)
    core.set_slo(SLO(latency_ms=500.0))
    assert core.bounds.max_window_ms == 30.0


def test_settings_survive_dataclasses_replace() -> None:
    from dataclasses import replace

    config = SimConfig(max_batch_size=64, window_ms=5.0)
    assert replace(config, deadline_ms=20.0).batch_sizes is None
    bucketed = SimConfig(max_batch_size=64, batch_sizes=[16, 64])
    assert replace(bucketed, window_ms=1.0).buckets == (16, 64)


async def test_removing_the_slo_is_refused_while_shedding_late_everywhere() -> None:
    # the constructor refuses shed_late=True without an slo; set_slo(None) at run time left
    # shedding on with nothing to shed against
    message = re.escape("shed_late=True needs an slo: shedding is relative to the SLO")
    slo = SLO(latency_ms=50)
    async with AdaptiveBatcher(lambda b: b, slo=slo, shed_late=True) as batcher:
        with pytest.raises(ValueError, match=message):
            batcher.set_slo(None)
        assert batcher.slo == slo  # unchanged
        batcher.set_slo(SLO(latency_ms=80))  # another SLO is fine
        assert await batcher.submit(1) == 1
    with pytest.raises(ValueError, match="SimConfig.slo_changes entries: " + message):
        SimConfig(slo=slo, shed_late=True, slo_changes=((1.0, None),))  # type: ignore[arg-type]
    async with AdaptiveBatcher(lambda b: b, slo=slo) as unshed:
        unshed.set_slo(None)  # without shedding, removing the SLO is allowed
        assert unshed.slo is None


def test_the_settings_read_no_file_the_shells_do(tmp_path: Path) -> None:
    """Before: BatcherSettings read the profile file while it was being built (the spine
    importing the profiler); now the shells read it, and the sans-IO core refuses a path."""
    from adaptive_batcher.core.batcher_core import BatcherCore
    from adaptive_batcher.profile import ProfileResult, ProfileRow, write_profile

    path = tmp_path / "profile.json"
    rows = (ProfileRow(1, 2.0, 2.5, 500.0), ProfileRow(8, 4.0, 5.0, 2000.0))
    write_profile(path, ProfileResult(rows, None, "cpu", "mlp", 5))
    settings = BatcherSettings(slo=SLO(latency_ms=50), service_profile=path)
    assert settings.service_profile == path  # kept as given
    with pytest.raises(TypeError, match="is a file the settings do not read: read it first"):
        BatcherCore(settings)
    assert SimConfig(service_profile=path).service_profile == ((1, 2.0), (8, 4.0))
    with pytest.raises(FileNotFoundError, match="service_profile: no such file"):
        SimConfig(service_profile=tmp_path / "nope.json")


async def test_the_batcher_takes_a_settings_object() -> None:
    settings = BatcherSettings(max_batch_size=8, window_ms=0.0, slo=SLO(latency_ms=50))
    async with AdaptiveBatcher(lambda b: b, settings=settings) as batcher:
        assert await batcher.submit(1) == 1
        stats = batcher.stats()
        assert (stats.max_batch_size, stats.window_ms, stats.slo) == (8, 0.0, SLO(50))
        assert stats.policy is not None  # the SLO's default controller
    replayed = SimConfig(max_batch_size=4, window_origin="slot_free", name="x")
    assert AdaptiveBatcher(lambda b: b, settings=replayed)._core.settings is replayed


def test_a_setting_given_twice_is_refused() -> None:
    settings = BatcherSettings(max_batch_size=8)
    message = "max_batch_size, slo: give each setting in settings or as an argument, not both"
    with pytest.raises(TypeError, match=re.escape(message)):
        AdaptiveBatcher(lambda b: b, settings=settings, max_batch_size=8, slo=None)
    with pytest.raises(TypeError, match="settings must be a BatcherSettings or None, got dict"):
        AdaptiveBatcher(lambda b: b, settings={"max_batch_size": 8})  # type: ignore[arg-type]
    # the arguments that are not settings go with it
    batcher = AdaptiveBatcher(lambda b: b, settings=settings, name="x", executor="inline")
    assert batcher.name == "x"


def test_a_profile_file_in_the_settings_is_read_by_the_batcher(tmp_path: Path) -> None:
    from adaptive_batcher.profile import ProfileResult, ProfileRow, write_profile

    path = tmp_path / "profile.json"
    write_profile(path, ProfileResult((ProfileRow(4, 3.0, 3.5, 1333.0),), None, "cpu", "m", 5))
    settings = BatcherSettings(slo=SLO(latency_ms=50), service_profile=path)
    batcher = AdaptiveBatcher(lambda b: b, settings=settings)
    assert batcher._core.settings.service_profile == ((4, 3.0),)


def test_every_setting_is_an_argument_of_the_batcher() -> None:
    """The settings ``settings=`` replaces are exactly the constructor's setting arguments, so
    a setting added to BatcherSettings cannot be given twice unnoticed."""
    import inspect

    from adaptive_batcher.runtime.batcher import SETTING_ARGUMENTS

    parameters = inspect.signature(AdaptiveBatcher).parameters
    assert set(parameters) >= SETTING_ARGUMENTS
    only_in_settings = {f.name for f in fields(BatcherSettings)} - SETTING_ARGUMENTS
    assert only_in_settings == {"window_origin", "window_slack"}


def test_the_window_slack_reaches_the_controller_and_is_checked() -> None:
    slo = SLO(latency_ms=50)
    plain = AdaptiveBatcher(lambda b: b, settings=BatcherSettings(slo=slo, window_slack=1.0))
    assert plain._core.controller is not None
    assert plain._core.controller.tail_slack.max_scale == 1.0
    default = AdaptiveBatcher(lambda b: b, slo=slo)
    assert default._core.controller is not None
    assert default._core.controller.tail_slack.max_scale == 1.25
    for bad in (0.99, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="window_slack must be a finite number >= 1"):
            BatcherSettings(window_slack=bad)
    for wrong in ("1.1", True, None):
        with pytest.raises(TypeError, match="window_slack"):
            BatcherSettings(window_slack=wrong)  # type: ignore[arg-type]
