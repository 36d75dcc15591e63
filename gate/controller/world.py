"""What the operator's parts read: the watch caches, the stage pod index, the parsed objects, and the
work queue they add keys to.

controller-runtime's reconcilers share a manager's cache and client, and read through them; this is
that cache side for NodeGate's reconcilers (`gate.controller.gates`, `gate.controller.nodes`) and the
executor. It parses each object once per resourceVersion (a gate, a node's fleet view), so that a
5,000-node plan does not parse 5,000 nodes again on every look.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.controller.index import StageIndex
from gate.controller.pods import stage_pod_view
from gate.controller.queue import WorkQueue
from gate.controller.settings import OperatorSettings
from gate.controller.triggers import GateKey, WorkKey
from gate.controller.views import fleet_node
from gate.kube.cache import WatchCache
from gate.kube.client import NODEGATES, NODES, PODS, POLICIES, KubeClient
from gate.kube.objects import pod_ended
from gate.lifecycle.fleet import FleetNode, disabled
from gate.lifecycle.machine import StagePod

log = logging.getLogger("nodegate.operator")

GATE_DEBOUNCE = 0.3


class World:
    def __init__(self, settings: OperatorSettings, client: KubeClient) -> None:
        self.settings = settings
        self.gates = WatchCache(client, NODEGATES)
        self.policies = WatchCache(client, POLICIES)
        self.nodes = WatchCache(client, NODES)
        selector = f"{keys.MANAGED_BY_LABEL}={keys.MANAGER}"
        self.pods = WatchCache(client, PODS, namespace=settings.namespace, label_selector=selector)
        self.index = StageIndex()
        self.queue: WorkQueue[WorkKey] = WorkQueue()
        self.fleet_memo: dict[str, tuple[str, FleetNode]] = {}
        self.gate_memo: dict[str, tuple[str, NodeGate]] = {}
        self.gate_seen: dict[str, tuple[Any, bool]] = {}
        self.gate_cost: dict[str, float] = {}  # seconds the last reconcile of each gate took
        self.removal_release: dict[str, frozenset[str]] = {}  # per deleted gate: nodes it may release

    @property
    def caches(self) -> tuple[WatchCache, ...]:
        return (self.gates, self.policies, self.nodes, self.pods)

    def gate_later(self, gate: str) -> None:
        # Debounce node events into gate reconciles, and never spend more than about a third of the
        # time planning: a 5,000-node plan takes a while, and it only needs to be recent, not instant.
        delay = max(GATE_DEBOUNCE, 2 * self.gate_cost.get(gate, 0.0))
        self.queue.add_after(GateKey(gate), delay)

    def forget_gate(self, name: str) -> None:
        for memo in (self.gate_memo, self.gate_seen, self.gate_cost, self.removal_release):
            memo.pop(name, None)

    def gate(self, name: str) -> NodeGate | None:
        obj = self.gates.get(name)
        if obj is None:
            return None
        rv = obj["metadata"].get("resourceVersion", "")
        memo = self.gate_memo.get(name)
        if memo is not None and memo[0] == rv:
            return memo[1]
        try:
            gate = NodeGate.model_validate(obj)
        except ValidationError as exc:
            log.error("NodeGate does not parse; gate=%s error=%s", name, str(exc).splitlines()[0])
            return None
        self.gate_memo[name] = (rv, gate)
        return gate

    def all_gates(self) -> list[NodeGate]:
        out = []
        for obj in self.gates.items():
            gate = self.gate(obj["metadata"]["name"])
            if gate is not None and not gate.metadata.deletion_timestamp and not disabled(gate):
                out.append(gate)  # a disabled gate holds no node back, and no other gate waits for it
        return out

    def fleet(self) -> list[FleetNode]:
        out = []
        for obj in self.nodes.items():
            name = obj["metadata"]["name"]
            rv = obj["metadata"].get("resourceVersion", "")
            memo = self.fleet_memo.get(name)
            if memo is None or memo[0] != rv:
                memo = (rv, fleet_node(obj))
                self.fleet_memo[name] = memo
            out.append(memo[1])
        return out

    def busy_nodes(self, gate: str) -> set[str]:
        """Nodes where a stage pod of `gate` has not ended."""
        busy = set()
        for node, names in self.index.nodes_with_pods(gate):
            for name in names:
                pod = self.pods.get(name, self.settings.namespace)
                if pod is not None and not pod_ended(pod):
                    busy.add(node)
                    break
        return busy

    def stage_pods_of(self, gate: str, node: str) -> dict[str, StagePod]:
        views = {}
        for name in self.index.pods_of(gate, node):
            pod = self.pods.get(name, self.settings.namespace)
            if pod is not None:
                views[name] = stage_pod_view(pod)
        return views
