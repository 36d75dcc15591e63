"""Hostile AdmissionReview bodies against a webhook process of its own (bench/fuzz/reviews.py, the
short mode: a few hundred cases; `python3.11 -m bench.fuzz.reviews --cases 10000` is the long mode).

The process answers from the real API server (watch caches, live lookups, SubjectAccessReviews), so
every path a review can take is the one production takes. No answer may be a 5xx, every 200 must be an
AdmissionReview, no admission rule may raise, the process must stay up, and its resident memory must
not run away (figures printed; the bound asserted is loose, a leak per request would cross it).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.fuzz.reviews import Target, fuzz, report, rule_errors, start_target
from gate.devcluster.cluster import DevCluster

CASES = 400


@pytest.fixture(scope="module")
def target(cluster: DevCluster) -> Iterator[Target]:
    running = start_target(cluster)
    yield running
    cluster.stop_process("fuzz-webhook")


def test_hostile_reviews_get_no_5xx_no_crash_and_bounded_memory(target: Target) -> None:
    findings = fuzz(target, CASES, warmup=100, sample_every=100)
    alive = target.alive()
    errors = rule_errors(target.metrics()) if alive else {}
    print("\n" + report(findings, errors, alive))
    assert alive, target.log()[-3000:]
    assert findings.server_errors == [], findings.server_errors[:3]
    assert findings.malformed_answers == [], findings.malformed_answers[:3]
    assert errors.get("rules", 0) == 0, "an admission rule raised: see the process log"
    assert "Traceback" not in target.log(), target.log()[-3000:]
    assert findings.cases == CASES and findings.verdicts["allowed"] and findings.verdicts["denied"]
    growth_mib = (findings.rss_kib[-1][1] - findings.rss_kib[0][1]) / 1024
    assert growth_mib < 64, f"RSS grew {growth_mib:.1f} MiB over {CASES} requests"
