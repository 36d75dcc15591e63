"""The security tier: admission under fault, fuzzing and access control on the real control plane.

It shares the session's control plane, webhook and operator with the integration tier (the fixtures
are the same functions: both processes are started once). Every test isolates itself by name.
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import webhook
from tests.integration.operator.conftest import operator, scenario, step_log

__all__ = ["operator", "scenario", "step_log", "webhook"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/security/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
