"""What the operator's parts read: the watch caches, the stage pod index, the parsed objects, and the
work queue they add keys to.

controller-runtime's reconcilers share a manager's cache and client, and read through them; this is
that cache side for NodeGate's reconcilers (`gate.controller.gates`, `gate.controller.nodes`) and their
appliers. It parses each object once per resourceVersion (a gate, a node's fleet view), so that a
5,000-node plan does not parse 5,000 nodes again on every look.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.api.state import NodeGateState, PodRecord
from gate.controller.index import StageIndex
from gate.controller.pods import stage_pod_ended, stage_pod_fields, stage_pod_view
from gate.controller.queue import WorkQueue
from gate.controller.settings import OperatorSettings
from gate.controller.signing import Signer
from gate.controller.triggers import GateKey, GateSeen, WorkKey
from gate.controller.views import fleet_node, node_fields
from gate.controller.workloads import WorkloadIndex, workload_fields
from gate.kube.cache import WatchCache
from gate.kube.client import NODEGATES, NODES, PODS, POLICIES, KubeClient
from gate.lifecycle.fleet import FleetNode, Replan, disabled, replan
from gate.lifecycle.ownership import Recognised, recognise
from gate.lifecycle.prepull import repository
from gate.rollout.history import Revision

log = logging.getLogger("nodegate.operator")

GATE_DEBOUNCE = 0.3
GATE_SOON = 2.0  # the plan of a change that starts no node: the status figures lag by this much at most
# A plan waits at least this many times as long as the last one took, and one that starts no node twice
# that: at most about a fifth of the time goes to planning. It matters only for large fleets: a plan of
# 1,000 nodes takes about 0.08 s and the floors above hold; one of 5,000 nodes about 0.35 s (its writes
# included), so a node that may start waits up to 1.4 s for it and the figures lag up to 2.8 s.
GATE_COST_FACTOR = 4.0


class World:
    def __init__(self, settings: OperatorSettings, client: KubeClient) -> None:
        self.settings = settings
        self.gates = WatchCache(client, NODEGATES)
        self.policies = WatchCache(client, POLICIES)
        self._repositories: tuple[tuple[str, ...], frozenset[str]] | None = None  # (gate versions, repositories)
        self.nodes = WatchCache(client, NODES, transform=lambda node: node_fields(node, self.image_repositories()))
        selector = f"{keys.MANAGED_BY_LABEL}={keys.MANAGER}"
        self.pods = WatchCache(client, PODS, namespace=settings.namespace, label_selector=selector,
                               transform=self._stage_pod_fields)
        self.index = StageIndex()
        # Every pod of the cluster, slimmed, for the pods running on each node (gate.controller.workloads), but
        # NodeGate's own: they protect no node, and each of their events would be read twice, here and above.
        self.workloads = WatchCache(client, PODS, label_selector=f"{keys.MANAGED_BY_LABEL}!={keys.MANAGER}",
                                    transform=workload_fields)
        self.workload_index = WorkloadIndex(settings.namespace)
        self.queue: WorkQueue[WorkKey] = WorkQueue()
        self.fleet_memo: dict[str, tuple[str, FleetNode]] = {}
        self.node_seen: dict[str, FleetNode] = {}  # each node as its last watch event showed it
        self.gate_memo: dict[str, tuple[str, NodeGate]] = {}
        self.policy_memo: dict[str, tuple[str, DeploymentPolicy]] = {}
        self.gate_seen: dict[str, GateSeen] = {}
        self.gate_cost: dict[str, float] = {}  # seconds the last reconcile of each gate took
        self.removal_release: dict[str, frozenset[str]] = {}  # per deleted gate: nodes it may release
        # Per gate: its history (its own signed ControllerRevisions) as the history reconcile last read and wrote
        # it (`gate.controller.history`); absent until then. Roll-backs go back to a revision of it.
        self.revisions: dict[str, list[Revision]] = {}
        # Checks and signs the node records (`gate.controller.signing`); set when this replica first leads.
        self.signer: Signer | None = None
        # Bumped when a gate comes or goes: whose records check depends on the gates' uids, so the
        # parsed fleet views (`fleet_memo`, by resourceVersion) of before are parsed again.
        self.trust_epoch = 0
        self.reported: set[tuple[str, str, str]] = set()  # (gate, node, record digest) reported not ours
        self.pods_reported: set[tuple[str, str, str]] = set()  # (gate, pod uid, shape) reported not ours

    def image_repositories(self) -> frozenset[str]:
        """The repositories of the images a round pulls (the agent's, every gate's packages'): the names of
        a node's images the node cache keeps (`node_fields`), for the prepuller to see which nodes have a
        round's images already. A node cached before its gate existed learns them at its next write."""
        gates = self.gates.items()
        seen = tuple(g["metadata"].get("resourceVersion", "") for g in gates)
        if self._repositories is not None and self._repositories[0] == seen:
            return self._repositories[1]  # asked at every node event: the gates seldom change
        repos = {repository(self.settings.agent_image)}
        for gate in gates:
            for package in ((gate.get("spec") or {}).get("packages") or {}).values():
                if isinstance(package, dict) and isinstance(package.get("image"), str):
                    repos.add(repository(package["image"]))
        self._repositories = (seen, frozenset(repos))
        return self._repositories[1]

    def _stage_pod_fields(self, pod: Obj) -> Obj:
        """The stage pod cache's transform: a pod's shape digest is taken again only when its copy in the
        cache (the one before this event's) says it may have changed: not for the kubelet's status updates."""
        meta = pod.get("metadata") or {}
        return stage_pod_fields(pod, self.pods.get(str(meta.get("name") or ""), meta.get("namespace")))

    @property
    def caches(self) -> tuple[WatchCache, ...]:
        return (self.gates, self.policies, self.nodes, self.pods, self.workloads)

    def gate_later(self, gate: str, *, soon: bool = False) -> None:
        # Debounce node events into gate reconciles, and never spend more than about a fifth of the
        # time planning: a 5,000-node plan takes a while, and it only needs to be recent, not instant.
        # A change that starts no node (`soon`) waits longer: during a rollout such changes come
        # several a second (picks, cordons), and a plan of the whole fleet for each would cost more
        # CPU than all the rest of the operator.
        cost = GATE_COST_FACTOR * self.gate_cost.get(gate, 0.0)
        delay = max(GATE_SOON, 2 * cost) if soon else max(GATE_DEBOUNCE, cost)
        self.queue.add_after(GateKey(gate), delay)

    def forget_gate(self, name: str) -> None:
        for memo in (self.gate_memo, self.gate_seen, self.gate_cost, self.removal_release, self.revisions):
            memo.pop(name, None)
        self.reported = {r for r in self.reported if r[0] != name}
        self.pods_reported = {r for r in self.pods_reported if r[0] != name}

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

    def policy_of(self, gate: NodeGate) -> tuple[bool, DeploymentPolicy | None]:
        """The DeploymentPolicy the gate names, parsed once per version: (True, None) when it names
        none, (False, None) when it is missing or does not parse (the gate's plan reports which)."""
        name = gate.spec.deployment_policy
        if not name:
            return True, None
        obj = self.policies.get(name)
        if obj is None:
            return False, None
        rv = obj["metadata"].get("resourceVersion", "")
        memo = self.policy_memo.get(name)
        if memo is not None and memo[0] == rv:
            return True, memo[1]
        try:
            policy = DeploymentPolicy.model_validate(obj)
        except ValidationError:
            return False, None
        self.policy_memo[name] = (rv, policy)
        return True, policy

    def all_gates(self) -> list[NodeGate]:
        out = []
        for obj in self.gates.items():
            gate = self.gate(obj["metadata"]["name"])
            if gate is not None and not gate.metadata.deletion_timestamp and not disabled(gate):
                out.append(gate)  # a disabled gate holds no node back, and no other gate waits for it
        return out

    def fleet(self) -> list[FleetNode]:
        return [self.fleet_node(obj) for obj in self.nodes.items()]

    def fleet_node(self, obj: Any) -> FleetNode:
        """The node as the planners see it, its records checked (`gate.controller.views.node_records`):
        every part of the operator reads nodes through here, never through `views.fleet_node` alone."""
        name = obj["metadata"]["name"]
        version = f'{obj["metadata"].get("resourceVersion", "")}/{self.trust_epoch}'
        memo = self.fleet_memo.get(name)
        if memo is None or memo[0] != version:
            memo = (version, fleet_node(obj, self.check))
            self.fleet_memo[name] = memo
        return memo[1]

    def check(self, gate: str, node: Any, state: NodeGateState) -> str | None:
        """`gate.controller.views.RecordCheck`. Before the key is loaded no record is the operator's:
        nothing reads the fleet then (the key is loaded before the caches start)."""
        if self.signer is None:
            return "the operator has not loaded its signing key yet"
        return self.signer.check(gate, node, state)

    def gate_uid(self, name: str) -> str | None:
        obj = self.gates.get(name)
        return None if obj is None else obj["metadata"].get("uid")

    def node_replans(self, kind: str, obj: Any) -> Replan:
        """A node event: whether and how soon it calls for plans of the fleet (`gate.lifecycle.fleet.replan`).
        The node's fleet view is parsed here once, for the next plan to find."""
        name = obj["metadata"]["name"]
        # Against the node as its previous *event* showed it, not as the fleet memo holds it: that
        # may already hold this very version, taken in from the operator's own write (`observe`).
        before = self.node_seen.pop(name, None)
        if kind == "DELETED":
            self.fleet_memo.pop(name, None)
            return "now"
        after = self.node_seen[name] = self.fleet_node(obj)
        return replan(before, after)

    def rounds_on(self, node: str) -> frozenset[str]:
        """The gates in a round on the node, as its last watch event showed it (`node_replans`)."""
        seen = self.node_seen.get(node)
        if seen is None:
            return frozenset()
        return frozenset(gate for gate, state in seen.states.items()
                         if isinstance(state, NodeGateState) and state.status == "in-progress")

    def in_progress(self, gate: str, node: str) -> bool:
        """The gate's state on the node says a round is in progress."""
        obj = self.nodes.get(node)
        if obj is None:
            return False
        state = self.fleet_node(obj).states.get(gate)
        return isinstance(state, NodeGateState) and state.status == "in-progress"

    def protected_pods(self, gate: NodeGate, fleet: list[FleetNode]) -> dict[str, tuple[str, ...]]:
        """Per node not started for `gate` (not in a round, not finished), the pods matching its
        podNonInterruptLabels that run there: what keeps the planner from picking the node. Only those
        nodes are looked at, so a rollout's cost shrinks as it goes."""
        selector = gate.spec.pod_non_interrupt_labels
        if selector is None or selector.is_empty():
            return {}
        candidates = []
        for node in fleet:
            progress = node.progresses.get(gate.name)
            if progress is None or progress.waiting:
                candidates.append(node.view.name)
        return self.workload_index.matching(selector, candidates)

    def busy_nodes(self, gate: str) -> set[str]:
        """Nodes where a stage pod of `gate` has not ended."""
        busy = set()
        for node, names in self.index.nodes_with_pods(gate):
            for name in names:
                pod = self.pods.get(name, self.settings.namespace)
                if pod is not None and not stage_pod_ended(pod):
                    busy.add(node)
                    break
        return busy

    def stage_pods_of(self, gate: str, node: str, recorded: Mapping[str, PodRecord]) -> Recognised:
        """The gate's stage pods on the node, split by `recorded` (the node's signed state's `pods`) into
        the operator's, which the decider reads, and the foreign ones (`gate.lifecycle.ownership`)."""
        views = {}
        for name in self.index.pods_of(gate, node):
            pod = self.pods.get(name, self.settings.namespace)
            if pod is not None:
                views[name] = stage_pod_view(pod)
        return recognise(views, recorded)
