"""Pruning logs: newest runs per version, newest versions per package, never the running version."""

from __future__ import annotations

from datetime import UTC, datetime

from gate.agent.logs import log_name, plan_pruning


def names(*stamps: int) -> list[str]:
    return [log_name(datetime(2030, 1, 1, 0, 0, s, tzinfo=UTC), "apply") for s in stamps]


def test_log_names_sort_by_time() -> None:
    assert names(1, 2, 10) == sorted(names(10, 2, 1))
    assert names(1)[0] == "20300101T000001.000000Z-apply.log"


def test_only_the_newest_runs_of_a_version_are_kept() -> None:
    pruning = plan_pruning({"1.0.0": names(*range(10))}, current="1.0.0", keep_runs=3)
    assert pruning.runs == [("1.0.0", n) for n in sorted(names(*range(7)), reverse=True)]
    assert pruning.versions == []


def test_the_oldest_versions_go_first_but_never_the_one_running_now() -> None:
    listing = {"1.0.0": names(1), "1.1.0": names(5), "1.2.0": names(9), "0.9.0": names(0)}
    pruning = plan_pruning(listing, current="0.9.0", keep_versions=2)
    assert pruning.versions == ["1.0.0", "1.1.0"]


def test_an_empty_version_directory_counts_as_oldest() -> None:
    pruning = plan_pruning({"1.0.0": [], "2.0.0": names(1)}, current="2.0.0", keep_versions=1)
    assert pruning.versions == ["1.0.0"]
