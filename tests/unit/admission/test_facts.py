"""Reading what a node's state annotation says is installed, whatever a person wrote into it."""

from __future__ import annotations

import json

import pytest

from gate.admission.facts import installed_packages


@pytest.mark.parametrize(("annotation", "installed"), [
    (None, set()),
    ("", set()),
    (json.dumps({"v": 1, "installed": {"tuned": {"version": "1.0.0"}}}), {"tuned"}),
    (json.dumps({"v": 1}), set()),
    ("{not json", None),
    ("[]", None),
    (json.dumps({"installed": ["tuned"]}), None),
    ("[" * 5000, None),  # deeper than json.loads goes: a RecursionError, not a ValueError
    ('{"installed":' * 5000, None),
])
def test_unreadable_annotations_count_as_everything_installed(annotation: str | None,
                                                               installed: set[str] | None) -> None:
    assert installed_packages(annotation) == installed
