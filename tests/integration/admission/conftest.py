"""The admission webhook, started once per session next to the shared control plane.

Any integration test (admission's, the operator's) that needs the webhook registered asks for the
`webhook` fixture; it starts `nodegate webhook serve` through the dev cluster's own `start_webhook`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from gate.devcluster.cluster import DevCluster


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
