"""Images on the node before its turn (`gate.lifecycle.prepull`), on kwok nodes against the real API
server: the fleet-wide bound on prepull pods, no cordon before a node's prepull pod succeeded, and a
pull that fails failing the node with no cordon at all.

The session's operator runs with `--prepull-concurrency 2 --prepull-ahead 3` (conftest.OPERATOR_FLAGS).
An independent watch records every prepull pod and every node of the test, each change with its
etcd revision (resourceVersion), so "before" is the API server's order, not wall time.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from gate.api import keys
from gate.api.common import Obj
from gate.controller.prepull_pod import prepull_owner
from gate.controller.settings import OperatorSettings
from gate.devcluster.services import running_agent_image
from gate.devcluster.stages import failing_stage
from gate.kube.cache import WatchCache
from gate.kube.client import EVENTS, NODES, PODS, KubeClient
from tests.integration.operator.conftest import NAMESPACE, Scenario, wait_for
from tests.integration.operator.test_safety import _PULL_ERROR

PKG = {"version": "1.0.0", "image": "registry.example.com/pkg"}
DRAIN = {**PKG, "interrupt": {"type": "service", "services": ["svc"]}}
LIMIT = 2  # conftest.OPERATOR_FLAGS --prepull-concurrency


@dataclass
class Watched:
    """Prepull pods and nodes as an independent watch saw them."""

    live: set[str] = field(default_factory=set)  # prepull pods that exist and have not ended
    most: int = 0  # the most live at once
    succeeded: dict[str, int] = field(default_factory=dict)  # node -> revision its prepull pod succeeded at
    pods_of: dict[str, set[str]] = field(default_factory=dict)  # node -> its prepull pods' names
    cordoned: dict[str, int] = field(default_factory=dict)  # node -> revision first seen unschedulable
    created: dict[str, int] = field(default_factory=dict)  # node -> revision its first prepull pod was seen at
    picked: dict[str, int] = field(default_factory=dict)  # node -> revision first seen in-progress for `gate`
    rounds: dict[str, list[str]] = field(default_factory=dict)  # node -> its states for `gate`, from its pick on
    gate: str = ""

    def on_pod(self, kind: str, pod: Obj) -> None:
        owner = prepull_owner(pod)
        if owner is None:
            return
        name, node = pod["metadata"]["name"], owner[1]
        self.pods_of.setdefault(node, set()).add(name)
        self.created.setdefault(node, int(pod["metadata"]["resourceVersion"]))
        phase = (pod.get("status") or {}).get("phase")
        if kind == "DELETED" or phase in ("Succeeded", "Failed"):
            self.live.discard(name)
        else:
            self.live.add(name)
        self.most = max(self.most, len(self.live))
        if phase == "Succeeded" and node not in self.succeeded:
            self.succeeded[node] = int(pod["metadata"]["resourceVersion"])

    def on_node(self, kind: str, node: Obj) -> None:
        name = node["metadata"]["name"]
        rv = int(node["metadata"]["resourceVersion"])
        if (node.get("spec") or {}).get("unschedulable") and name not in self.cordoned:
            self.cordoned[name] = rv
        labels = node["metadata"].get("labels") or {}
        if self.gate and labels.get(keys.status_label(self.gate)) == "in-progress":
            self.picked.setdefault(name, rv)
        state = (node["metadata"].get("annotations") or {}).get(keys.state_annotation(self.gate)) if self.gate else None
        if name in self.picked and state is not None and self.rounds.setdefault(name, [""])[-1] != state:
            self.rounds[name].append(state)


@pytest.fixture
async def watched(kube: KubeClient) -> AsyncIterator[Watched]:
    seen = Watched()
    pods = WatchCache(kube, PODS, namespace=NAMESPACE, label_selector=f"{keys.STAGE_KIND_LABEL}={keys.PREPULL_KIND}")
    nodes = WatchCache(kube, NODES)
    pods.subscribe(seen.on_pod)
    nodes.subscribe(seen.on_node)
    await pods.start()
    await nodes.start()
    for pod in pods.items():
        seen.on_pod("ADDED", pod)
    yield seen
    await pods.stop()
    await nodes.stop()


async def test_prepull_is_bounded_and_every_cordon_waits_for_its_images(scenario: Scenario, watched: Watched,
                                                                        kube: KubeClient) -> None:
    nodes = await scenario.add_nodes(6)
    watched.gate = scenario.name
    await scenario.apply_gate({"svc-pkg": DRAIN}, interruptionBudget={"count": 2})
    await scenario.wait_ready(timeout=180)

    assert 0 < watched.most <= LIMIT  # never more prepull pods pulling at once than the bound
    for node in nodes:
        assert node in watched.cordoned, f"{node} was never cordoned"
        assert node in watched.succeeded, f"{node} was cordoned with no prepull pod succeeded"
        assert watched.succeeded[node] < watched.cordoned[node], f"{node} was cordoned before its images were in"
        assert not (await scenario.node(node))["spec"].get("unschedulable")
    # Pulled ahead: nodes further down the line got their pods while they still waited to be picked.
    ahead = [n for n in nodes if watched.created[n] < watched.picked[n]]
    assert ahead, (watched.created, watched.picked)

    async def swept() -> bool:  # the rounds are past their images: no prepull pod is left
        items, _ = await kube.list(PODS, NAMESPACE, label_selector=f"{keys.STAGE_KIND_LABEL}={keys.PREPULL_KIND}")
        return not [p for p in items if (prepull_owner(p) or ("", ""))[0] == scenario.name]

    await wait_for(swept, timeout=30, what="prepull pods deleted")


async def test_a_failed_pull_fails_the_node_before_any_cordon(scenario: Scenario, watched: Watched) -> None:
    good, bad = await scenario.add_nodes(2)
    # The kubelet of `bad` cannot pull: its prepull pod's containers wait in ImagePullBackOff.
    pull_error = failing_stage("prepull-pull", nodes=[bad])
    pull_error["spec"]["selector"]["matchExpressions"] = [
        {"key": ".spec.nodeName", "operator": "In", "values": [bad]},
        {"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "In", "values": [keys.PREPULL_KIND]},
        {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}]
    pull_error["spec"]["next"] = {"statusTemplate": _PULL_ERROR}
    await scenario.inject(pull_error)
    await scenario.apply_gate({"svc-pkg": DRAIN}, interruptionBudget={"count": 2})
    await scenario.wait_node(bad, "failed", timeout=120)
    await scenario.wait_node(good, "complete", timeout=120)

    state = await scenario.state(bad)
    failure = state["failure"]
    assert failure["reason"] == "ImagePullFailed" and failure["stage"] == "prepull"
    assert "ImagePullBackOff" in failure["message"] and "registry.example.com/pkg" in failure["message"]
    assert bad not in watched.cordoned and not state.get("cordoned")
    assert not (await scenario.node(bad))["spec"].get("unschedulable")
    assert not state.get("installed")  # no stage ran on it
    # Said in the metrics too, once for the one pod that could not pull.
    async def counted() -> bool:
        return await _failures(scenario) == 1.0

    await wait_for(counted, what="nodegate_prepull_failures_total at 1")
    assert good in watched.cordoned and watched.succeeded[good] < watched.cordoned[good]


async def _failures(sc: Scenario) -> float | None:
    port = sc.cluster.ports()["operator"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith('nodegate_prepull_failures_total{') and f'gate="{sc.name}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return None


async def test_a_node_that_reports_the_images_gets_no_prepull_pod(scenario: Scenario, watched: Watched,
                                                                  kube: KubeClient) -> None:
    """`status.images` naming every image of the round, by the reference its containers pull: no prepull pod,
    and its cordon waits for none, made in the write of its pick; a node without them still gets its pod first.
    A node a person cordoned, images on it, stays cordoned by them: NodeGate never takes over their cordon."""
    warm, cold, theirs = await scenario.add_nodes(3)
    watched.gate = scenario.name
    pinned = {**DRAIN, "image": "registry.example.com/pkg@sha256:" + "e" * 64}
    # Paused while the node reports its images: the operator's cache keeps the images of the repositories
    # its gates name, so the node's update is read once the gate exists.
    await scenario.apply_gate({"svc-pkg": pinned}, interruptionBudget={"count": 1}, paused=True)
    agent = running_agent_image(scenario.cluster) or OperatorSettings().agent_image
    images = [{"names": [pinned["image"], "registry.example.com/pkg:1.0.0"], "sizeBytes": 1},
              {"names": [agent], "sizeBytes": 1}]
    await kube.patch(NODES, warm, {"status": {"images": images}}, subresource="status")
    await kube.patch(NODES, theirs, {"status": {"images": images}}, subresource="status")
    await kube.patch(NODES, theirs, {"spec": {"unschedulable": True}})
    await scenario.patch_gate({"spec": {"paused": False}})
    await scenario.wait_ready(timeout=180)

    assert warm in watched.cordoned and warm not in watched.pods_of, watched.pods_of
    assert cold in watched.cordoned and watched.succeeded[cold] < watched.cordoned[cold]
    assert (await scenario.state(warm))["status"] == "complete"
    # Its round in 3 node writes: the pick with its cordon (nothing to wait for before it: `cordon_at_pick`),
    # the round's one pod (its stages, the service restart and the check) recorded in the write of its step
    # (`Decision.records_in_write`), the uncordon. The cold node's pick waits for its pull, uncordoned.
    phases = [json.loads(s).get("phase", "") for s in watched.rounds[warm][1:]]
    assert len(phases) == 3 and phases[:2] == ["wait-pods", "stages"], phases
    assert watched.cordoned[warm] == watched.picked[warm] and json.loads(watched.rounds[warm][1])["cordoned"]
    assert watched.cordoned[cold] > watched.picked[cold]
    before, text = watched.rounds[warm][1:3]
    new = set(json.loads(text)["pods"]) - set(json.loads(before).get("pods") or {})
    assert len(new) == 1, text  # the round's pod, recorded in its write
    node_events, _ = await kube.list(EVENTS, "default", field_selector=f"regarding.name={warm}")
    told = [e["reason"] for e in sorted(node_events, key=lambda e: int(e["metadata"]["resourceVersion"]))
            if e.get("reason") in ("Cordoned", "Drained", "Uncordoned", "Complete")]
    assert told == ["Cordoned", "Drained", "Uncordoned", "Complete"], told  # the node's story, as before
    person = await scenario.node(theirs)
    assert person["spec"].get("unschedulable") is True and theirs not in watched.pods_of
    assert keys.CORDONED_BY not in (person["metadata"].get("annotations") or {})
    picked = json.loads(watched.rounds[theirs][1])  # the pick went on to wait-pods, the cordon not the round's
    assert picked["phase"] == "wait-pods" and not picked.get("cordoned")
    assert (await scenario.state(theirs))["status"] == "complete"
    # Every pod of the round read as the operator's all along: none was ever without its record.
    events, _ = await kube.list(EVENTS, "default", field_selector=f"regarding.name={scenario.name}")
    assert not [e for e in events if e.get("reason") == "PodNotOurs"], events
