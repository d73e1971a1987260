"""The loader: lookup by name and path, overrides, fresh policies, and exact error messages."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import adaptive_batcher.presets as presets
from adaptive_batcher import SLO, AdaptiveBatcher, PresetError, list_presets, load_preset
from adaptive_batcher.control.types import Bounds
from adaptive_batcher.policies import PID, Static
from adaptive_batcher.presets import BATCHER_KEYS, PolicySpec, load_preset_group
from adaptive_batcher.testing import EchoModel

AVAILABLE = (
    "batch_images, customer_service/chat, customer_service/summaries, image_generation, "
    "offline_moderation, realtime_chat, search, translation, video_review"
)

GOOD = """
[preset]
name = "mine"
description = "a test preset"

[slo]
latency_ms = 100.0
preprocess_ms = 5.0

[policy]
name = "pid"
kp = 0.5
min_samples = 5

[batcher]
max_batch_size = 8
window_ms = 4.0
batch_sizes = [1, 2, 4, 8]
max_queue_size = 100

[bounds]
max_window_ms = 10.0
"""


def write(tmp_path: Path, text: str, name: str = "bad.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def controller_of(batcher: AdaptiveBatcher[Any, Any]) -> Any:
    controller = batcher._core.controller
    assert controller is not None
    return controller


# -- loading by path ----------------------------------------------------------------------------


def test_a_file_loads_by_path_with_defaults_following_the_batcher(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD, "mine.toml")
    preset = load_preset(path)
    assert preset.name == "mine" and preset.description == "a test preset"
    assert preset.source == path.resolve()
    assert preset.slo == SLO(latency_ms=100.0, preprocess_ms=5.0)
    assert preset.policy == PolicySpec("pid", {"kp": 0.5, "min_samples": 5})
    assert dict(preset.batcher) == {
        "max_batch_size": 8,
        "window_ms": 4.0,
        "batch_sizes": (1, 2, 4, 8),
        "max_queue_size": 100,
    }
    # unset bounds follow [batcher]: its cap and its buckets
    assert preset.bounds == Bounds(0.0, 10.0, 1, 8, (1, 2, 4, 8))
    assert load_preset(str(path)) == preset


def test_a_string_with_a_slash_naming_a_file_loads_it(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD, "conf")
    assert load_preset(str(path)).name == "mine"


def test_minimal_file_leaves_everything_else_to_the_batcher(tmp_path: Path) -> None:
    preset = load_preset(write(tmp_path, "[batcher]\n", "minimal.toml"))
    assert preset.name == "minimal" and preset.description == ""
    assert (preset.slo, preset.policy, preset.bounds) == (None, None, None)
    assert dict(preset.batcher) == {}
    assert preset.batcher_kwargs() == {"name": "minimal", "slo": None, "policy": None}


def test_a_single_batcher_file_is_a_group_of_one(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD, "mine.toml")
    assert load_preset_group(path) == {"mine": load_preset(path)}


def test_a_group_file_loads_by_path(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[batchers.a.batcher]\nwindow_ms = 1.0\n[batchers.b.slo]\nlatency_ms = 50.0\n",
        "svc.toml",
    )
    group = load_preset_group(path)
    assert sorted(group) == ["a", "b"]
    assert group["a"].name == "svc/a" and group["a"].batcher["window_ms"] == 1.0
    assert group["b"].slo == SLO(50.0)


def test_names_are_looked_up_in_the_installed_folder_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = tmp_path / "_presets"
    installed.mkdir()
    write(installed, '[preset]\ndescription = "installed copy"\n[batcher]\n', "search.toml")
    monkeypatch.setattr(presets, "PRESET_DIRS", (installed, *presets.PRESET_DIRS[1:]))
    assert load_preset("search").description == "installed copy"
    assert list_presets() == AVAILABLE.split(", ")


# -- building batchers --------------------------------------------------------------------------


def test_batcher_kwargs_make_a_new_policy_each_call() -> None:
    preset = load_preset("realtime_chat")
    first, second = preset.batcher_kwargs(), preset.batcher_kwargs()
    assert isinstance(first["policy"], PID) and isinstance(second["policy"], PID)
    assert first["policy"] is not second["policy"]
    assert first["policy"].max_window_ms == 20.0
    one = AdaptiveBatcher.from_preset("realtime_chat", EchoModel())
    two = AdaptiveBatcher.from_preset("realtime_chat", EchoModel())
    assert controller_of(one).policy is not controller_of(two).policy


def test_batcher_kwargs_are_constructor_arguments() -> None:
    preset = load_preset("search")
    batcher = AdaptiveBatcher(EchoModel(), **preset.batcher_kwargs())
    assert batcher.stats().max_batch_size == 128 and batcher.name == "search"


async def test_overrides_win_and_the_bounds_follow_them() -> None:
    batcher = AdaptiveBatcher.from_preset(
        "realtime_chat", EchoModel(), window_ms=25.0, max_batch_size=8, name="mine", shed_late=False
    )
    stats = batcher.stats()
    assert (stats.window_ms, stats.max_batch_size, stats.name) == (25.0, 8, "mine")
    bounds = controller_of(batcher).bounds
    assert (bounds.max_window_ms, bounds.max_batch_size) == (25.0, 8)
    assert (bounds.min_window_ms, bounds.min_batch_size) == (0.0, 1)
    assert bounds.batch_sizes == (1, 2, 4, 8)  # the preset's 16 is above the new cap: dropped
    assert stats.slo == load_preset("realtime_chat").slo
    await batcher.aclose()


def test_a_cap_override_drops_the_buckets_above_it_unless_buckets_are_overridden() -> None:
    preset = load_preset("realtime_chat")  # batch_sizes [1, 2, 4, 8, 16], cap 16
    assert preset.batcher_kwargs(max_batch_size=8)["batch_sizes"] == (1, 2, 4, 8)
    given = preset.batcher_kwargs(max_batch_size=8, batch_sizes=[2, 8])
    assert (given["batch_sizes"], given["bounds"].batch_sizes) == ([2, 8], (2, 8))
    with pytest.raises(ValueError, match=re.escape("max_batch_size (12) must not exceed")):
        AdaptiveBatcher(EchoModel(), **preset.batcher_kwargs(max_batch_size=12))
    video = load_preset("video_review")  # batch_sizes [16, ..., 256]: none fits a cap of 8
    with pytest.raises(ValueError, match=re.escape("batch_sizes [16, 32, 64, 128, 256] exceed")):
        AdaptiveBatcher(EchoModel(), **video.batcher_kwargs(max_batch_size=8))


async def test_the_bounds_follow_numpy_overrides_too() -> None:
    batcher = AdaptiveBatcher.from_preset(
        "search", EchoModel(), window_ms=np.float32(50.0), max_batch_size=np.int64(8)
    )
    bounds = controller_of(batcher).bounds
    assert (bounds.max_window_ms, bounds.max_batch_size) == (50.0, 8)
    assert bounds.batch_sizes == (1, 8)
    kwargs = load_preset("search").batcher_kwargs(batch_sizes=np.array([1, 4, 16, 128]))
    assert kwargs["bounds"].batch_sizes == (1, 4, 16, 128)
    await batcher.aclose()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_sizes": [4, 2]}, r"batch_sizes must be strictly increasing, got \[4, 2\]"),
        ({"batch_sizes": 8}, "batch_sizes must be a sequence of ints, got int"),
        ({"max_batch_size": 2.5}, "max_batch_size must be an int, got float"),
        ({"window_ms": "5"}, "window_ms must be a number, got str"),
    ],
)
def test_invalid_overrides_are_reported_by_the_constructor(
    overrides: dict[str, Any], message: str
) -> None:
    kwargs = load_preset("search").batcher_kwargs(**overrides)  # never raises itself
    assert kwargs["bounds"] is not None
    with pytest.raises((TypeError, ValueError), match=f"^{message}"):
        AdaptiveBatcher(EchoModel(), **kwargs)


def test_overridden_policy_slo_and_bounds_are_used_as_given() -> None:
    policy, slo, bounds = Static(3.0, 4), SLO(latency_ms=1000.0), Bounds(0.0, 50.0, 1, 16)
    batcher = AdaptiveBatcher.from_preset(
        "realtime_chat", EchoModel(), policy=policy, slo=slo, bounds=bounds
    )
    assert controller_of(batcher).policy is policy
    # the bounds as given, on the preset's buckets (bounds without buckets take the batcher's)
    buckets = load_preset("realtime_chat").batcher["batch_sizes"]
    assert controller_of(batcher).bounds == replace(bounds, batch_sizes=buckets)
    assert batcher.stats().slo is slo


def test_overridden_buckets_replace_the_bounds_buckets() -> None:
    kwargs = load_preset("search").batcher_kwargs(batch_sizes=[1, 4, 16, 128])
    assert kwargs["bounds"].batch_sizes == (1, 4, 16, 128)
    assert kwargs["batch_sizes"] == [1, 4, 16, 128]


def test_invalid_overrides_fail_in_the_constructor() -> None:
    with pytest.raises(ValueError, match=r"^window_ms must be a finite number >= 0, got -1$"):
        AdaptiveBatcher.from_preset("search", EchoModel(), window_ms=-1)


def test_from_preset_loads_a_path(tmp_path: Path) -> None:
    batcher = AdaptiveBatcher.from_preset(write(tmp_path, GOOD, "mine.toml"), EchoModel())
    assert batcher.stats().window_ms == 4.0 and batcher.name == "mine"
    assert controller_of(batcher).policy.kp == 0.5


def test_presets_are_frozen() -> None:
    preset = load_preset("search")
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        preset.batcher["window_ms"] = 1.0  # type: ignore[index]


def test_the_batcher_table_takes_only_constructor_arguments() -> None:
    assert set(BATCHER_KEYS) == {
        "max_batch_size",
        "window_ms",
        "max_concurrent_batches",
        "max_queue_size",
        "batch_sizes",
        "shed_late",
        "control_interval_ms",
        "executor",
    }
    constructor = inspect.signature(AdaptiveBatcher.__init__).parameters
    assert set(BATCHER_KEYS) <= set(constructor)


# -- unknown names ------------------------------------------------------------------------------


def test_an_unknown_name_lists_the_available_ones() -> None:
    with pytest.raises(PresetError) as caught:
        load_preset("nope")
    assert str(caught.value) == f"unknown preset 'nope'; available: {AVAILABLE}"
    assert caught.value.path is None


def test_an_unknown_member_lists_the_available_ones() -> None:
    with pytest.raises(PresetError, match=r"^unknown preset 'customer_service/nope'; available: "):
        load_preset("customer_service/nope")
    with pytest.raises(PresetError, match=r"^unknown preset 'search/chat'; available: "):
        load_preset("search/chat")


def test_a_group_without_a_member_names_its_members() -> None:
    with pytest.raises(PresetError) as caught:
        load_preset("customer_service")
    path = presets.PRESET_DIRS[1] / "customer_service.toml"
    assert str(caught.value) == (
        f"{path}: holds several batchers; load one of: "
        "customer_service/chat, customer_service/summaries (or all with load_preset_group)"
    )


def test_a_group_lookup_of_one_member_is_refused() -> None:
    with pytest.raises(PresetError, match="names one batcher; pass the group 'customer_service'"):
        load_preset_group("customer_service/chat")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(PresetError) as caught:
        load_preset(missing)
    assert str(caught.value) == f"{missing}: no such preset file"
    with pytest.raises(PresetError, match="no such preset file"):
        load_preset(str(missing))


def test_a_name_must_be_a_string_or_path() -> None:
    with pytest.raises(TypeError, match=r"^preset must be a name or a path, got int$"):
        load_preset(3)  # type: ignore[arg-type]


# -- invalid files: exact messages naming file and key ------------------------------------------


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[polcy]\nname = "pid"\n')
    with pytest.raises(PresetError) as caught:
        load_preset(path)
    assert str(caught.value) == (
        f"{path}: key 'polcy': unknown key; allowed: batcher, batchers, bounds, policy, preset, slo"
    )
    assert (caught.value.path, caught.value.key) == (path, "polcy")


def test_unknown_policy_name(tmp_path: Path) -> None:
    path = write(tmp_path, '[policy]\nname = "fancy"\n')
    with pytest.raises(PresetError) as caught:
        load_preset(path)
    assert str(caught.value) == (
        f"{path}: key 'policy.name': name must be one of 'aimd', 'bandit_thompson', 'bandit_ucb', "
        "'pid', 'static', got 'fancy'"
    )


def test_negative_window(tmp_path: Path) -> None:
    path = write(tmp_path, "[batcher]\nwindow_ms = -5\n")
    with pytest.raises(PresetError) as caught:
        load_preset(path)
    assert str(caught.value) == (
        f"{path}: key 'batcher.window_ms': window_ms must be a finite number >= 0, got -5"
    )


def test_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, '[slo]\nlatency_ms = "200"\n')
    with pytest.raises(PresetError) as caught:
        load_preset(path)
    assert (
        str(caught.value) == f"{path}: key 'slo.latency_ms': latency_ms must be a number, got str"
    )


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[slo]\np99_ms = 200.0\n", "slo.p99_ms"),
        ("[slo]\nlatency_ms = 200.0\np99_ms = 200.0\n", "slo.p99_ms"),
        ("[batchers.chat.slo]\np99_ms = 300.0\n", "batchers.chat.slo.p99_ms"),
    ],
)
def test_the_old_slo_key_is_refused_with_its_new_name(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PresetError) as caught:
        load_preset_group(path)
    assert str(caught.value) == (
        f"{path}: key '{key}': renamed 'latency_ms'; write latency_ms = ... instead"
    )
    assert caught.value.key == key


def test_invalid_member_of_a_group_is_named_by_its_full_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[batchers.chat.policy]\nname = "aimd"\nbackoff = 1.5\n')
    with pytest.raises(PresetError) as caught:
        load_preset_group(path)
    assert str(caught.value) == (
        f"{path}: key 'batchers.chat.policy.backoff': AIMD.backoff must be in (0, 1), got 1.5"
    )


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ("[batcher]\nname = 'x'\n", "batcher.name", "unknown key; allowed: batch_sizes, "),
        (
            "[batcher]\nmax_batch_size = true\n",
            "batcher.max_batch_size",
            "must be an int, got bool",
        ),
        (
            "[batcher]\nmax_batch_size = 0\n",
            "batcher.max_batch_size",
            "max_batch_size must be >= 1",
        ),
        (
            "[batcher]\nbatch_sizes = [4, 2]\n",
            "batcher.batch_sizes",
            "strictly increasing, got [4, 2]",
        ),
        (
            "[batcher]\nbatch_sizes = [1, 2]\n",
            "batcher.batch_sizes",
            "must not exceed the largest",
        ),
        (
            "[batcher]\nexecutor = 'gpu'\n",
            "batcher.executor",
            "executor must be one of 'adaptive', 'async', 'auto', 'cuda', 'inline', 'thread', "
            "got 'gpu'",
        ),
        ("[batcher]\nshed_late = 1\n", "batcher.shed_late", "shed_late must be a bool, got int"),
        (
            "[batcher]\ncontrol_interval_ms = 0\n",
            "batcher.control_interval_ms",
            "must be a finite number > 0",
        ),
        ("slo = 3\n", "slo", "must be a table, got int"),
        ("[slo]\npercentile = 90.0\n", "slo.latency_ms", "missing"),
        (
            "[slo]\nlatency_ms = 100.0\npercentile = 100\n",
            "slo.percentile",
            "SLO.percentile must be in [1, 100), got 100.0",
        ),
        (
            "[slo]\nlatency_ms = 100.0\nmargin = 1.5\n",
            "slo.margin",
            "SLO.margin must be in (0, 1], got 1.5",
        ),
        (
            "[slo]\nlatency_ms = 100.0\npreprocess_ms = 100.0\n",
            "slo",
            "SLO.preprocess_ms (100.0) must be below latency_ms (100.0)",
        ),
        (
            "[slo]\nlatency_ms = 50.0\npreprocess_ms = 45.0\n",
            "slo",
            "SLO.preprocess_ms (45.0) must be below target_ms = margin * latency_ms "
            "(0.8 * 50.0 = 40): it leaves -5 ms for the batcher",
        ),
        (
            "[slo]\nlatency_ms = inf\n",
            "slo.latency_ms",
            "latency_ms must be a finite number > 0, got inf",
        ),
        ("[policy]\nkp = 1.0\n", "policy.name", "missing; choose one of aimd, bandit_thompson"),
        (
            "[policy]\nname = 'static'\nkp = 1.0\n",
            "policy.kp",
            "unknown key; allowed: max_batch_size, name, window_ms",
        ),
        (
            "[policy]\nname = 'pid'\nki = -1.0\n",
            "policy.ki",
            "ki must be a finite number >= 0, got -1.0",
        ),
        (
            "[policy]\nname = 'bandit_ucb'\ndiscount = 2.0\n",
            "policy.discount",
            "DiscountedUCB.discount must be in (0, 1], got 2.0",
        ),
        (
            "[policy]\nname = 'bandit_ucb'\nfractions = []\n",
            "policy.fractions",
            "DiscountedUCB.fractions must not be empty",
        ),
        (
            "[policy]\nname = 'bandit_thompson'\nfractions = [0.5, 'x']\n",
            "policy.fractions",
            "DiscountedThompson.fractions must be a number, got str",
        ),
        (
            "[policy]\nname = 'bandit_thompson'\nfractions = [0.5, 2.0]\n",
            "policy.fractions",
            "must be in [0, 1], got [0.5, 2.0]",
        ),
        (
            "[bounds]\nmin_window_ms = 50.0\nmax_window_ms = 10.0\n",
            "bounds",
            "Bounds need 0 <= min_window_ms <= max_window_ms, got 50.0..10.0",
        ),
        (
            "[bounds]\nmin_batch_size = 64\n",
            "bounds.min_batch_size",
            "Bounds need 1 <= min_batch_size <= max_batch_size, got 64..32",
        ),
        (
            "[bounds]\nmax_batch_size = 64\n",
            "bounds.max_batch_size",
            "bounds.max_batch_size (64) exceeds max_batch_size (32), the hard cap",
        ),
        (
            "[batcher]\nwindow_ms = 50.0\n[bounds]\nmax_window_ms = 20.0\n",
            "batcher.window_ms",
            "window_ms (50) must lie within the bounds' window range [0, 20]",
        ),
        (
            "[bounds]\nwidth = 3\n",
            "bounds.width",
            "unknown key; allowed: batch_sizes, max_batch_size",
        ),
        ("[preset]\nname = 3\n", "preset.name", "name must be a str, got int"),
        ("[preset]\nowner = 'me'\n", "preset.owner", "unknown key; allowed: description, name"),
        (
            "[slo]\nlatency_ms = 1.0\n[batchers.a.slo]\nlatency_ms = 1.0\n",
            "slo",
            "not allowed next to [batchers]",
        ),
        ("batchers = {}\n", "batchers", "must hold at least one batcher"),
        (
            "[batchers.a]\nfoo = 1\n",
            "batchers.a.foo",
            "unknown key; allowed: batcher, bounds, description",
        ),
        (
            "[batchers.'a b'.slo]\nlatency_ms = 1.0\n",
            "batchers.a b",
            "member names use letters, digits",
        ),
        (
            "[batchers.a.batcher]\nwindow_ms = 'x'\n",
            "batchers.a.batcher.window_ms",
            "window_ms must be a number, got str",
        ),
    ],
)
def test_invalid_files_name_file_and_key(tmp_path: Path, text: str, key: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PresetError) as caught:
        load_preset_group(path)
    error = caught.value
    assert str(error).startswith(f"{path}: key '{key}': ")
    assert message in str(error)
    assert (error.path, error.key) == (path, key)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[slo\n")
    with pytest.raises(PresetError, match="invalid TOML") as caught:
        load_preset(path)
    assert str(caught.value).startswith(f"{path}: invalid TOML: ")


def test_a_directory_is_not_a_preset_file(tmp_path: Path) -> None:
    for folder in (tmp_path / "dir.toml", tmp_path / "presets"):
        folder.mkdir()
        for given in (folder, os.fspath(folder)):
            with pytest.raises(PresetError) as caught:
                load_preset(given)
            assert str(caught.value) == f"{folder}: is a directory, not a preset file"
            assert caught.value.path == folder
    with pytest.raises(PresetError) as caught:
        load_preset_group(os.fspath(tmp_path / "presets"))
    assert str(caught.value) == f"{tmp_path / 'presets'}: is a directory, not a preset file"


def test_an_empty_file_is_refused(tmp_path: Path) -> None:
    for text in ("", "# nothing yet\n\n"):
        path = write(tmp_path, text, "empty.toml")
        with pytest.raises(PresetError) as caught:
            load_preset(path)
        assert str(caught.value) == (
            f"{path}: holds no settings; give at least one of "
            "[slo], [policy], [batcher], [bounds] or [batchers]"
        )
        assert (caught.value.path, caught.value.key) == (path, None)


def test_a_file_with_only_its_name_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '[preset]\nname = "bare"\ndescription = "nothing else"\n')
    with pytest.raises(PresetError, match=r": holds no settings; give at least one of \[slo\]"):
        load_preset(path)


def test_a_group_member_without_settings_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '[batchers.a.slo]\nlatency_ms = 50.0\n[batchers.b]\ndescription = "x"\n')
    with pytest.raises(PresetError) as caught:
        load_preset_group(path)
    assert str(caught.value) == (
        f"{path}: key 'batchers.b': holds no settings; give at least one of "
        "[slo], [policy], [batcher] or [bounds]"
    )
    assert (caught.value.path, caught.value.key) == (path, "batchers.b")


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[preset]\ndescription = "caf\u00e9"\n'.encode("latin-1"))
    with pytest.raises(PresetError) as caught:
        load_preset(path)
    assert str(caught.value) == (
        f"{path}: not UTF-8 text (byte 0xe9 at offset 27); TOML files must be UTF-8"
    )
    assert caught.value.path == path
    assert isinstance(caught.value.__cause__, UnicodeDecodeError)
