"""The operator's two API clients and the fence between them, built in one place.

* The **work** client: the caches, the reconcilers, the Events. Up to `CONNECTIONS` connections and
  a 30 s timeout, as a rollout's writes need. It carries the leader's `Fence`: a write goes out only
  while this replica leads, judged at the moment it would leave (`gate.kube.fence`).
* The **lease** client: the leader election alone, with one connection of its own, so a renewal
  never waits for a connection that the work holds (the work may hold all of its own for as long
  as its requests take), and with each request's deadline set by the elector from what is left
  before the renew deadline.

Both authenticate as the same identity from the same configuration; only their pools and deadlines
differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from gate.controller.settings import OperatorSettings
from gate.kube.client import KubeClient
from gate.kube.fence import Fence

# One connection: the elector sends one request at a time (get, then replace).
LEASE_CONNECTIONS = 1


@dataclass(frozen=True)
class OperatorClients:
    work: KubeClient
    lease: KubeClient
    fence: Fence

    async def close(self) -> None:
        await self.work.close()
        await self.lease.close()


async def open_clients(settings: OperatorSettings) -> OperatorClients:
    fence = Fence(settings.renew_deadline)
    work = await KubeClient.from_environment(settings.kubeconfig, user_agent="nodegate-operator", fence=fence)
    # Its timeout is only a ceiling: the elector gives every request the time left before the deadline.
    lease = work.sibling(user_agent="nodegate-operator-lease", connections=LEASE_CONNECTIONS,
                         timeout=settings.renew_deadline)
    return OperatorClients(work, lease, fence)


__all__ = ["LEASE_CONNECTIONS", "OperatorClients", "open_clients"]
