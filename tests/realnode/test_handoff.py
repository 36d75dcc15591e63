"""The onboarding hand-off (spec.leaveCordoned) on a real node: a held node runs no workload pod until a
person releases it with `kubectl uncordon` (issue 38; the kwok tier has the rest of the hand-off,
tests/integration/operator/test_handoff.py).

The node has to join after the gate exists, so that the webhook taints its Node at creation: real-node-0
leaves and joins again (`RealCluster.node_away`: its Node deleted, its kubelet restarted, which registers
a new Node through admission). The workload is a Deployment pinned to the node by its hostname that
tolerates nothing of NodeGate's; its container is the pause image the node already has. The real
scheduler keeps it off the node for the taint, then for the hold; the node's own containerd shows no
container of it until the uncordon, and then the one the kubelet ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from gate.api import keys
from gate.devcluster.realnode import PAUSE_IMAGE, RealNodeError
from gate.kube.client import NODES
from tests.realnode.conftest import RealCluster, first_version_of

pytestmark = pytest.mark.timeout(1800)

Obj = dict[str, Any]
HOSTNAME = "kubernetes.io/hostname"


def handoff_gate(name: str, node: str, image: str, config: dict[str, str]) -> str:
    """A readinessTaint gate over `node` alone that hands it over cordoned: the catalog's shellscript."""
    return yaml.safe_dump({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {HOSTNAME: node}}, "readinessTaint": True, "leaveCordoned": True,
                 "interruptionBudget": {"count": 1},
                 "packages": {"shellscript": {"version": "1.0.0", "image": image, "interrupt": {"type": "none"},
                                              "config": config}}},
    })


def workload(namespace: str, node: str, image: str) -> str:
    labels = {"app": "workload"}
    return yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "workload", "namespace": namespace},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"nodeSelector": {HOSTNAME: node}, "terminationGracePeriodSeconds": 0,
                                       "containers": [{"name": "workload", "image": image,
                                                       "imagePullPolicy": "IfNotPresent"}]}}},
    })


def workload_pod(real: RealCluster, namespace: str) -> Obj | None:
    pods = json.loads(real.kubectl.run("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return live[0] if len(live) == 1 else None


def scheduling(pod: Obj | None) -> str:
    """The scheduler's last word on the pod (its PodScheduled condition's message)."""
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition["type"] == "PodScheduled":
            return str(condition.get("message") or "")
    return ""


def containers_of(real: RealCluster, node: str, namespace: str) -> list[str]:
    """The containers (sandboxes too) of `namespace`'s pods in the node's own containerd."""
    out = real.node_sh(node, f"ctr -n k8s.io containers list -q 'labels.\"io.kubernetes.pod.namespace\"=={namespace}'")
    return out.stdout.split()


def node_obj(real: RealCluster, node: str) -> Obj:
    return dict(json.loads(real.kubectl.run("get", "node", node, "-o", "json").stdout))


def marks_of(node: Obj) -> dict[str, str]:
    return dict(node["metadata"].get("annotations") or {})


def tainted(node: Obj) -> bool:
    return any(t["key"] == keys.READINESS_TAINT_KEY for t in node["spec"].get("taints") or [])


def hand_off_condition(node: Obj) -> bool:
    return any(c["type"] == keys.HAND_OFF_CONDITION for c in (node.get("status") or {}).get("conditions") or [])


def wait_seeing(real: RealCluster, namespace: str, node: str, what: str, ready: Callable[[], bool],
                timeout: float) -> None:
    """`real.wait`, saying on a timeout where the workload pod and the node were."""
    try:
        real.wait(what, ready, timeout, every=2.0)
    except AssertionError as exc:
        pod, obj = workload_pod(real, namespace) or {}, node_obj(real, node)
        raise AssertionError(f"{exc}; the workload pod: {pod.get('status')} on {pod.get('spec', {}).get('nodeName')}; "
                             f"{node}: {obj['spec']}, {marks_of(obj)}") from None


async def test_a_held_real_node_runs_no_workload_pod_until_uncordoned_and_a_later_round_leaves_it_serving(
        real: RealCluster, gate_name: str) -> None:
    node = real.nodes[0]
    namespace = gate_name
    marker, conf = f"/etc/nodegate-handoff-{gate_name}", f"/etc/nodegate-handoff-{gate_name}.conf"
    go = f"{marker}.go"
    # The package's step waits on the node until the test has seen the scheduler refuse the pod for the
    # taint (at most 5 minutes), so that the round cannot end before that.
    config = {"apply.sh": f"i=0; until [ -e {go} ]; do i=$((i + 1)); [ $i -lt 1500 ]; sleep 0.2; done\n"
                          f"echo {gate_name} > {marker}\n",
              "apply-check.sh": f"grep -qx {gate_name} {marker}\n"}
    image = real.images["shellscript"]
    real.kubectl.run("create", "namespace", namespace)
    try:
        async with await real.dev.client() as kube:
            _, since = await kube.list(NODES)
            created = asyncio.create_task(first_version_of(kube, node, since, 300.0))
            with real.node_away(node):
                real.kubectl.apply(handoff_gate(gate_name, node, image, config))
                # The webhook knows the gate before the node comes back (its cache follows what the operator saw).
                real.wait(f"gate {gate_name} observed",
                          lambda: real.gate_status(gate_name).get("observedGeneration") == 1, 60.0)
            joined = await created
        # The kubelet registers with no --register-with-taints: the webhook tainted the Node at creation.
        assert tainted(joined), joined["spec"]
        assert keys.HAND_OFF_RELEASED not in marks_of(joined)

        real.kubectl.apply(workload(namespace, node, f"{real.config(node).registry}/{PAUSE_IMAGE}"))
        # Kept off the node by a taint (the scheduler names no taint key), while the package's step runs.
        def refused_for_taint() -> bool:
            message = scheduling(workload_pod(real, namespace))
            return "untolerated taint" in message and "were unschedulable" not in message
        wait_seeing(real, namespace, node, "the workload pod refused for a taint", refused_for_taint, 180.0)
        pod, obj = workload_pod(real, namespace), node_obj(real, node)
        assert pod is not None and not pod["spec"].get("nodeName"), pod
        assert tainted(obj) and not obj["spec"].get("unschedulable"), obj["spec"]
        real.node_sh(node, f"touch {go}")

        real.wait_complete(gate_name, 600.0)
        assert real.node_file(node, marker) == f"{gate_name}\n", "the package did not run on the node"

        def held() -> bool:
            obj = node_obj(real, node)
            return bool(obj["spec"].get("unschedulable")) and hand_off_condition(obj)
        wait_seeing(real, namespace, node, f"{node} held for hand-off", held, 120.0)
        obj = node_obj(real, node)
        assert not tainted(obj) and marks_of(obj).get(keys.HELD_BY) == gate_name, obj["metadata"]
        assert keys.CORDONED_BY not in marks_of(obj), "the hold is not a round's cordon"

        # The scheduler looked again once the taint was lifted and refused the pod for the cordon alone.
        def refused_for_cordon() -> bool:
            message = scheduling(workload_pod(real, namespace))
            return "were unschedulable" in message
        wait_seeing(real, namespace, node, "the workload pod refused for the cordon", refused_for_cordon, 180.0)
        pod = workload_pod(real, namespace)
        assert pod is not None and not pod["spec"].get("nodeName"), pod
        assert pod["status"].get("phase") == "Pending", pod["status"]
        assert containers_of(real, node, namespace) == [], "the kubelet ran a workload container on a held node"

        # A person releases the node, with the real kubectl.
        real.kubectl.run("uncordon", node)

        def running() -> bool:
            pod = workload_pod(real, namespace)
            return (pod is not None and pod["spec"].get("nodeName") == node
                    and pod["status"].get("phase") == "Running")
        wait_seeing(real, namespace, node, f"the workload pod running on {node}", running, 180.0)
        # The same look into the node's containerd that found nothing before finds it now.
        assert containers_of(real, node, namespace), "no workload container in the node's containerd"

        def released() -> bool:
            obj = node_obj(real, node)
            marks = marks_of(obj)
            return keys.HELD_BY not in marks and keys.HAND_OFF_RELEASED in marks and not hand_off_condition(obj)
        wait_seeing(real, namespace, node, f"{node}'s release noticed", released, 120.0)

        # A later round (a config change) leaves the released node schedulable.
        changed = {**config, "config.sh": f"echo 2 > {conf}\n", "config-check.sh": f"grep -qx 2 {conf}\n"}
        real.kubectl.apply(handoff_gate(gate_name, node, image, changed))

        def rolled() -> bool:  # the node's own record of the round, then the round's uncordon
            obj = node_obj(real, node)
            state = json.loads(marks_of(obj).get(keys.state_annotation(gate_name)) or "{}")
            installed = (state.get("installed") or {}).get("shellscript") or {}
            return (state.get("status") == "complete" and "config.sh" in (installed.get("config") or {})
                    and not obj["spec"].get("unschedulable"))
        wait_seeing(real, namespace, node, "the config change's round complete and the node schedulable", rolled,
                    600.0)
        assert real.node_file(node, conf) == "2\n", "the config change's round did not run on the node"
        obj = node_obj(real, node)
        assert keys.HELD_BY not in marks_of(obj) and keys.HAND_OFF_RELEASED in marks_of(obj), marks_of(obj)
        assert not tainted(obj) and not hand_off_condition(obj)
    finally:
        with contextlib.suppress(AssertionError):
            real.delete_gate(gate_name, 300.0)
        real.kubectl.run("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)
        # Whatever happened, the node is left in service for the tests after this one.
        real.kubectl.run("uncordon", node, check=False)
        real.kubectl.run("taint", "node", node, f"{keys.READINESS_TAINT_KEY}-", check=False)
        with contextlib.suppress(RealNodeError):
            real.node_sh(node, f"rm -f {marker} {conf} {go}", check=False)
