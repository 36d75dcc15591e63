"""The webhook's bounds, read from flags and env: a bound that would let nothing through, or a body
budget that cannot hold one largest body, is refused at start-up, naming the setting."""

from __future__ import annotations

import argparse

import pytest

from gate.admission.settings import WebhookSettings, add_arguments, from_args


def settings(*argv: str, env: dict[str, str] | None = None) -> WebhookSettings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(list(argv)), env or {})


def test_the_defaults_bound_reviews_and_bodies() -> None:
    s = settings()
    assert (s.sar_cache_seconds, s.sar_cache_entries, s.sar_max_in_flight, s.sar_per_request) == (10.0, 10_000, 16, 4)
    assert (s.max_body_bytes, s.max_bodies_bytes) == (3 * 2**20, 16 * 2**20)


def test_flags_win_over_the_environment() -> None:
    s = settings("--sar-max-in-flight", "8", env={"NODEGATE_WEBHOOK_SAR_MAX_IN_FLIGHT": "32",
                                                  "NODEGATE_WEBHOOK_SAR_PER_REQUEST": "2"})
    assert (s.sar_max_in_flight, s.sar_per_request) == (8, 2)


@pytest.mark.parametrize(("flag", "env"), [("--sar-max-in-flight", "NODEGATE_WEBHOOK_SAR_MAX_IN_FLIGHT"),
                                           ("--sar-per-request", "NODEGATE_WEBHOOK_SAR_PER_REQUEST"),
                                           ("--sar-cache-entries", "NODEGATE_WEBHOOK_SAR_CACHE_ENTRIES")])
def test_a_bound_of_zero_is_refused_naming_it(flag: str, env: str) -> None:
    with pytest.raises(ValueError, match=f"{env} \\({flag}\\) must be at least 1, not 0"):
        settings(flag, "0")


def test_a_body_budget_that_cannot_hold_one_largest_body_is_refused() -> None:
    expected = r"NODEGATE_WEBHOOK_MAX_BODIES_BYTES \(\d+\) must hold at least one largest body"
    with pytest.raises(ValueError, match=expected):
        settings("--max-bodies-bytes", str(3 * 2**20))
