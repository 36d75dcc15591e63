"""The host's per-package history: pure transitions, the upgrade's previous version, atomic storage."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.agent.errors import HostError, UsageError
from gate.agent.history import (
    MAX_RUNS,
    History,
    OverlayFile,
    load_history,
    save_history,
    upgrade_versions,
    with_overlay,
    with_stage_result,
    with_step_done,
)


def h(**kw: object) -> History:
    return History(gate="g", package="p", **kw)  # type: ignore[arg-type]


def test_a_successful_apply_installs_its_version_and_remembers_the_one_before() -> None:
    after = with_stage_result(h(installed="1.0.0"), "apply", "2.0.0", 1, True, None, "t")
    assert (after.installed, after.previous) == ("2.0.0", "1.0.0")


def test_rerunning_apply_of_the_installed_version_keeps_the_previous_one() -> None:
    after = with_stage_result(h(installed="2.0.0", previous="1.0.0"), "apply", "2.0.0", 2, True, None, "t")
    assert (after.installed, after.previous) == ("2.0.0", "1.0.0")


def test_a_failed_stage_is_recorded_but_installs_nothing() -> None:
    after = with_stage_result(h(installed="1.0.0"), "upgrade", "2.0.0", 1, False, "upgrade/move", "t")
    assert after.installed == "1.0.0"
    assert (after.runs[-1].ok, after.runs[-1].failed_step) == (False, "upgrade/move")


def test_a_successful_uninstall_forgets_steps_and_overlay_so_a_reinstall_runs_everything() -> None:
    before = with_overlay(with_step_done(h(installed="1.0.0"), "apply", "slow", "1.0.0", 1, "t"),
                          [OverlayFile(path="/etc/x", sha256="0" * 64)])
    after = with_stage_result(before, "uninstall", "1.0.0", 1, True, None, "t")
    assert (after.installed, after.previous, after.steps, after.overlay) == (None, "1.0.0", {}, [])


def test_other_stages_leave_the_installed_version_alone() -> None:
    for stage in ("config", "post-interrupt"):
        after = with_stage_result(h(installed="1.0.0"), stage, "1.0.0", 1, True, None, "t")  # type: ignore[arg-type]
        assert (after.installed, after.previous) == ("1.0.0", None)


def test_only_the_last_runs_are_kept() -> None:
    history = h()
    for generation in range(MAX_RUNS + 7):
        history = with_stage_result(history, "config", "1.0.0", generation, True, None, "t")
    assert len(history.runs) == MAX_RUNS and history.runs[-1].generation == MAX_RUNS + 6


def test_upgrade_comes_from_the_hosts_installed_version_over_the_operators_idea() -> None:
    previous, warning = upgrade_versions(h(installed="1.0.0"), "2.0.0", "0.9.0")
    assert previous == "1.0.0"
    assert warning == "the host records 1.0.0 as the previous version, not 0.9.0; using 1.0.0"
    assert upgrade_versions(h(installed="1.0.0"), "2.0.0", "1.0.0") == ("1.0.0", None)


def test_a_retried_upgrade_that_already_succeeded_still_comes_from_the_same_version() -> None:
    assert upgrade_versions(h(installed="2.0.0", previous="1.0.0"), "2.0.0", None) == ("1.0.0", None)


def test_without_a_host_record_the_given_previous_version_is_used() -> None:
    assert upgrade_versions(h(), "2.0.0", "1.5.0") == ("1.5.0", None)


def test_an_upgrade_with_no_known_previous_version_is_refused() -> None:
    with pytest.raises(UsageError, match="no previous version is recorded on the host and none was given"):
        upgrade_versions(h(), "2.0.0", None)


def test_history_survives_a_round_trip_and_a_missing_file_is_an_empty_history(tmp_path: Path) -> None:
    path = tmp_path / "state" / "history.json"
    assert load_history(path, "g", "p") == h()
    history = with_step_done(with_stage_result(h(), "apply", "1.0.0", 4, True, None, "t"), "apply", "s", "1.0.0",
                             4, "t")
    save_history(path, history)
    assert load_history(path, "g", "p") == history
    assert not list(path.parent.glob(".*.tmp"))
    assert '"installed": "1.0.0"' in path.read_text()


def test_a_corrupt_history_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    path.write_text("{not json")
    with pytest.raises(HostError, match=r"is not a valid NodeGate history .*move it away"):
        load_history(path, "g", "p")
