"""Stage while serving (`gate.lifecycle.staging`, wired by `gate.controller.staging`), on kwok nodes against
the real API server: a node's serving steps run in a staging pod before its cordon, and it is cordoned only
once that pod succeeded; the fleet-wide bound on staging and undo pods holds; a staging that fails fails
its node uncordoned (StagingFailed) and is undone; a stopped compartment undoes the staging of a node
staged ahead and never interrupted.

The session's operator runs with `--staging-concurrency 2 --staging-ahead 1` (conftest.OPERATOR_FLAGS: the
default, 10, bounded smaller).
The operator knows which packages stage from the catalog (`grub-cmdline` at the catalog's version stages
its apply whole). kwok runs staging and undo pods as any stage pod (`gate.devcluster.stages`): their
steps run one after another, then they succeed. An independent watch records every staging and undo pod
and every node, each change with its etcd revision, so "before" is the API server's order.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from gate.api import keys
from gate.api.common import Obj
from gate.controller.pods import GATE_NAME_ANNOTATION
from gate.devcluster.stages import failing_stage
from gate.kube.cache import WatchCache
from gate.kube.client import EVENTS, NODES, PODS, KubeClient
from gate.rollout import order_key
from tests.integration.operator.conftest import NAMESPACE, Scenario, wait_for
from tests.integration.operator.test_rollback import _policy

GRUB = {"version": "1.0.0", "image": "registry.example.com/grub-cmdline",
        "interrupt": {"type": "service", "services": ["svc"]}}
LIMIT = 2  # conftest.OPERATOR_FLAGS --staging-concurrency
SELECTOR = f"{keys.STAGE_KIND_LABEL} in (staging,unstage)"


@dataclass
class Watched:
    """Staging and undo pods and nodes as an independent watch saw them."""

    gate: str = ""
    live: set[str] = field(default_factory=set)  # staging and undo pods that exist and have not ended
    most: int = 0
    created: dict[str, int] = field(default_factory=dict)  # node -> revision its first staging pod was seen at
    staged: dict[str, int] = field(default_factory=dict)  # node -> revision its staging pod succeeded at
    undone: dict[str, int] = field(default_factory=dict)  # node -> revision its undo pod succeeded at
    cordoned: dict[str, int] = field(default_factory=dict)
    picked: dict[str, int] = field(default_factory=dict)

    def on_pod(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        if (meta.get("annotations") or {}).get(GATE_NAME_ANNOTATION) not in (None, self.gate):
            return
        name, node, rv = meta["name"], pod["spec"].get("nodeName", ""), int(meta["resourceVersion"])
        pod_kind = (meta.get("labels") or {}).get(keys.STAGE_KIND_LABEL)
        phase = (pod.get("status") or {}).get("phase")
        if kind == "DELETED" or phase in ("Succeeded", "Failed"):
            self.live.discard(name)
        else:
            self.live.add(name)
        self.most = max(self.most, len(self.live))
        if pod_kind == "staging":
            self.created.setdefault(node, rv)
            if phase == "Succeeded":
                self.staged.setdefault(node, rv)
        elif pod_kind == "unstage" and phase == "Succeeded":
            self.undone.setdefault(node, rv)

    def on_node(self, kind: str, node: Obj) -> None:
        name, rv = node["metadata"]["name"], int(node["metadata"]["resourceVersion"])
        if (node.get("spec") or {}).get("unschedulable"):
            self.cordoned.setdefault(name, rv)
        if self.gate and (node["metadata"].get("labels") or {}).get(keys.status_label(self.gate)) == "in-progress":
            self.picked.setdefault(name, rv)


@pytest.fixture
async def watched(kube: KubeClient) -> AsyncIterator[Watched]:
    seen = Watched()
    pods = WatchCache(kube, PODS, namespace=NAMESPACE, label_selector=SELECTOR)
    nodes = WatchCache(kube, NODES)
    pods.subscribe(seen.on_pod)
    nodes.subscribe(seen.on_node)
    await pods.start()
    await nodes.start()
    yield seen
    await pods.stop()
    await nodes.stop()


async def test_staged_before_the_cordon_bounded_and_undone_when_the_compartment_stops(
        scenario: Scenario, watched: Watched, kube: KubeClient) -> None:
    nodes = sorted(await scenario.add_nodes(5), key=order_key)  # in pick order (one node a batch)
    watched.gate = scenario.name
    first, bad, ahead, last = nodes[:2], nodes[2], nodes[3], nodes[4]
    # The staging pod of `bad` fails its serving step (its undo pod runs the same step, and succeeds).
    failing = failing_stage("staging-fails", nodes=[bad], package="grub-cmdline", stage="apply")
    failing["spec"]["selector"]["matchExpressions"].append(
        {"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "In", "values": ["staging"]})
    await scenario.inject(failing)
    policy = f"{scenario.name}-p"
    await _policy(scenario, policy, {"default": {"budget": {"count": 1},
                                                 "strategy": {"fixed": {"initialBatch": 1, "failureThreshold": 1}}}})
    await scenario.apply_gate({"grub-cmdline": GRUB}, deploymentPolicy=policy)
    await scenario.wait_node(bad, "failed", timeout=180)

    # Staged first, cordoned after: each node that went through its round.
    for node in first:
        await scenario.wait_node(node, "complete", timeout=60)
        assert node in watched.staged, f"{node} was never staged"
        assert node in watched.cordoned, f"{node} was never cordoned"
        assert watched.staged[node] < watched.cordoned[node], f"{node} was cordoned before its staging succeeded"
        assert not (await scenario.node(node))["spec"].get("unschedulable")
        # grub-cmdline's apply was staged whole: recorded at the cordon, no container for it in the window.
        events, _ = await kube.list(EVENTS, "default", field_selector=f"regarding.name={node}")
        assert any(e.get("reason") == "StagedWhole" and "grub-cmdline apply" in e.get("note", "") for e in events), \
            [(e.get("reason"), e.get("note")) for e in events]
    # Ahead of its turn: some node's staging pod existed before the node was picked.
    assert any(watched.created[n] < watched.picked.get(n, 1 << 62) for n in nodes if n in watched.created), \
        (watched.created, watched.picked)
    assert 0 < watched.most <= LIMIT, watched.most  # staging and undo pods at once, fleet-wide

    # A staging that failed fails its node before any cordon, and what it staged is undone.
    failure = (await scenario.state(bad))["failure"]
    assert failure["reason"] == "StagingFailed" and failure["stage"] == "staging", failure
    assert bad not in watched.cordoned

    # The failure stopped the compartment: `ahead`, staged while it waited, is undone, never cordoned, and
    # `last` (beyond the lookahead) was never staged.
    async def undone() -> bool:
        return bad in watched.undone and ahead in watched.undone

    await wait_for(undone, timeout=60, what="the failed and the staged-ahead nodes' stagings undone")
    assert ahead in watched.staged and watched.staged[ahead] < watched.undone[ahead]
    assert ahead not in watched.cordoned and last not in watched.cordoned
    assert last not in watched.created
    assert (await scenario.node_status(ahead)) != "complete"

    async def swept() -> bool:  # taken over by their rounds, or undone: no staging or undo pod is left
        items, _ = await kube.list(PODS, NAMESPACE, label_selector=SELECTOR)
        return not [p for p in items if (p["metadata"].get("annotations") or {}).get(GATE_NAME_ANNOTATION)
                    == scenario.name]

    await wait_for(swept, timeout=60, what="staging and undo pods deleted")
    # Every staging and undo pod was the operator's, signed as it ran: none was refused as not its own.
    refused, _ = await kube.list(EVENTS, "default", field_selector=f"regarding.name={scenario.name},reason=PodNotOurs")
    assert not refused, [e.get("note") for e in refused]

    # Deleted, the gate goes: nothing staged is left for its finalizer (`gate_may_go`) to wait on.
    await scenario.delete_gate(timeout=90)
