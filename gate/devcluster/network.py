"""The dev cluster's network for real nodes: one bridge per state directory, one subnet, one veth per node.

Every address is derived from the state directory, so two dev clusters on one machine (a developer's
and a test session's) get different bridges and subnets and never meet. The layout, for the cluster
whose index is `k` (0-63, a hash of the state directory):

* bridge `ngbr<k>` with the gateway `10.213.<k>.1/24`: the address at which nodes reach this machine's
  API server and image registry;
* node `i` at `10.213.<k>.<10 + i>`, with its pods in `10.214.<k>.<64 i>/26` (at most four real nodes
  per cluster, which two cores cannot exceed anyway).

Nothing here is routed beyond this machine: the addresses exist only on the bridge and inside the
nodes' own network namespaces.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

MAX_REAL_NODES = 4
SERVICE_CIDR = "10.96.0.0/16"  # the dev API server's --service-cluster-ip-range
NODE_PREFIX_LEN = 24
POD_PREFIX_LEN = 26


def cluster_index(state_dir: Path) -> int:
    return int(hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest(), 16) % 64


@dataclass(frozen=True)
class ClusterNetwork:
    index: int

    @classmethod
    def of(cls, state_dir: Path) -> ClusterNetwork:
        return cls(cluster_index(state_dir))

    @property
    def bridge(self) -> str:
        return f"ngbr{self.index}"

    @property
    def gateway(self) -> str:
        return f"10.213.{self.index}.1"

    @property
    def subnet(self) -> str:
        return f"10.213.{self.index}.0/{NODE_PREFIX_LEN}"

    def node_ip(self, i: int) -> str:
        self._check(i)
        return f"10.213.{self.index}.{10 + i}"

    def pod_cidr(self, i: int) -> str:
        self._check(i)
        return f"10.214.{self.index}.{64 * i}/{POD_PREFIX_LEN}"

    def host_veth(self, i: int) -> str:
        """The machine's end of node `i`'s veth (the node's end is its eth0)."""
        self._check(i)
        return f"ngv{self.index}n{i}"

    def _check(self, i: int) -> None:
        if not 0 <= i < MAX_REAL_NODES:
            raise ValueError(f"real node index {i} is out of range: at most {MAX_REAL_NODES} real nodes per cluster")


def gateway_ip(state_dir: Path) -> str:
    """The address at which real nodes of the cluster in `state_dir` reach this machine."""
    return ClusterNetwork.of(state_dir).gateway
