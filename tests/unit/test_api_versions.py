"""Version ranges agree with npm's `semver.satisfies` (and Cargo's rule) on prereleases.

The expected answers were read from npm's semver 7 (`node -e 'require("semver").satisfies(v, r)'`)
for each row; the prerelease rows are the ones the old rule got wrong (issue 33, item 10).
"""

from __future__ import annotations

import pytest
import semver

from gate.api.versions import parse_constraint, satisfies

NPM_ANSWERS = [
    ("2.0.0-rc.1", ">=1.0.0", False),
    ("2.0.0-rc.1", "^1.4", False),
    ("1.3.0-rc.1", "~1.2.3", False),
    ("1.3.0-beta.1", "1.2", False),
    ("1.3.0-rc.1", "^1.2", False),
    ("1.2.4-rc.1", "~1.2.3", False),
    ("1.2.3-rc.2", ">=1.2.3-rc.1", True),
    ("1.2.3-rc.2", "^1.2.3-rc.1", True),
    ("1.2.4-rc.1", "^1.2.3-rc.1", False),
    ("1.2.3", "^1.2.3-rc.1", True),
    ("1.0.0-rc.1", "*", False),
    ("1.2.3-rc.1", "1.2.3-rc.1", True),
    ("1.2.3-rc.1", "1.2.3", False),
    ("1.2.3-rc.1", "<1.2.3", False),
    ("1.2.3-rc.1", ">=1.2.3-rc.0 <1.2.3", True),
    ("2.0.0", ">=1.0.0", True),
    ("1.9.9", "^1.4", True),
    ("1.2.9", "~1.2.3", True),
    ("0.2.0-rc.1", "^0.1", False),
    ("1.2.3-rc.1", ">=1.2.3-alpha <2", True),
    ("1.5.0-rc.1", ">=1.2.3-alpha <2", False),
    ("1.4.0", ">=1.2.0, <2", True),
]


@pytest.mark.parametrize(("version", "constraint", "expected"), NPM_ANSWERS)
def test_a_range_admits_a_version_as_npm_does(version: str, constraint: str, expected: bool) -> None:
    preds = parse_constraint(constraint)
    assert not isinstance(preds, str), preds
    assert satisfies(semver.Version.parse(version), preds) is expected


def test_a_prerelease_is_admitted_only_where_a_comparator_names_one_of_the_same_release() -> None:
    preds = parse_constraint(">=1.2.3-rc.1, <1.3.0")
    assert not isinstance(preds, str)
    assert satisfies(semver.Version.parse("1.2.3-rc.9"), preds)
    assert not satisfies(semver.Version.parse("1.2.5-rc.1"), preds)
    assert satisfies(semver.Version.parse("1.2.5"), preds)


def test_a_not_equal_comparator_does_not_open_a_release_to_its_prereleases() -> None:
    preds = parse_constraint("!=1.2.3-rc.1")
    assert not isinstance(preds, str)
    assert not satisfies(semver.Version.parse("1.2.3-rc.2"), preds)
    assert satisfies(semver.Version.parse("1.2.3"), preds)
