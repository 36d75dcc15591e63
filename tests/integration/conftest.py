"""Integration tier: markers, and the admission webhook shared by the admission and operator tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from gate.devcluster.cluster import DevCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/integration/" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@dataclass(frozen=True)
class Webhook:
    port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


@pytest.fixture(scope="session")
def webhook(cluster: DevCluster) -> Iterator[Webhook]:
    from gate.devcluster.services import start_webhook, webhook_port

    start_webhook(cluster, progress=lambda message: None)
    port = webhook_port(cluster)
    assert port is not None
    yield Webhook(port)
