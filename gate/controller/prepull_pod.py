"""The prepull pod: a node's round images pulled while the node still serves (`gate.lifecycle.prepull`
decides which; `gate.controller.prepull` creates and deletes them)."""

from __future__ import annotations

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.controller.pods import AGENT_COMMAND, PAYLOAD_DIR, label_value, owner_reference, tolerations
from gate.controller.settings import OperatorSettings
from gate.lifecycle.prepull import Candidate

PREPULL_GATE_ANNOTATION = f"{keys.GROUP}/prepull-gate"
PREPULL_NODE_ANNOTATION = f"{keys.GROUP}/prepull-node"


def prepull_pod(gate: NodeGate, candidate: Candidate, settings: OperatorSettings) -> Obj:
    """The pod that pulls a node's round images while the node still serves (`gate.lifecycle.prepull`).

    Pinned to its node like a stage pod (`nodeName`: no scheduler, a cordon does not stop it) and
    tolerating what stage pods tolerate, but it changes nothing: not privileged, no host namespace or
    path, no service account token, no resources of its own (the namespace's LimitRange defaults, as
    for a stage step that states none: small, and with no priority class it never preempts a workload;
    a kubelet that does not admit it fails it, and the round goes on without it). Each image is an init container
    that exits at once, the agent's the last container: the kubelet pulls each image just before its
    container starts, so a pod that succeeded left every image on the node. A package image holds `cp`
    and `/nodegate-package` (its contract, docs/images.md): its container copies the payload into an
    emptyDir, as the stage pod's does; the agent's prints its version.

    It names its gate and node in annotations of its own, not the stage pods' (`GATE_NAME_ANNOTATION`):
    nothing that reads a node's stage pods sees it (`gate.controller.index`)."""
    node = candidate.node
    containers: list[Obj] = []
    pull_secrets: dict[str, Obj] = {}
    for package, image in sorted(candidate.images.packages.items()):
        containers.append({
            "name": f"pull-{package}", "image": image.image, "imagePullPolicy": image.pull_policy,
            "command": ["cp", "-a", "/nodegate-package/.", PAYLOAD_DIR + "/"],
            "volumeMounts": [{"name": "payload", "mountPath": PAYLOAD_DIR}],
        })
        pkg = gate.spec.packages.get(package)
        if pkg is not None:
            pull_secrets.update({s.name: {"name": s.name} for s in pkg.image_pull_secrets})
    containers.append({"name": "pull-agent", "image": candidate.images.agent, "command": list(AGENT_COMMAND),
                       "args": ["version", "--client"]})
    spec: Obj = {
        "nodeName": node,
        "restartPolicy": "Never",
        "serviceAccountName": settings.package_service_account,
        "automountServiceAccountToken": False,
        "tolerations": tolerations(gate),
        "initContainers": containers[:-1],
        "containers": containers[-1:],
        "volumes": [{"name": "payload", "emptyDir": {}}],
        "terminationGracePeriodSeconds": 0,
    }
    if pull_secrets:
        spec["imagePullSecrets"] = list(pull_secrets.values())
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": candidate.pod, "namespace": settings.namespace,
            "labels": {keys.MANAGED_BY_LABEL: keys.MANAGER, keys.STAGE_GATE_LABEL: label_value(gate.name),
                       keys.STAGE_NODE_LABEL: label_value(node), keys.STAGE_KIND_LABEL: keys.PREPULL_KIND},
            "annotations": {PREPULL_GATE_ANNOTATION: gate.name, PREPULL_NODE_ANNOTATION: node},
            "ownerReferences": [owner_reference(gate)],
        },
        "spec": spec,
    }


def prepull_owner(pod: Obj) -> tuple[str, str] | None:
    """The (gate, node) of a prepull pod, None when the pod is not one."""
    meta = pod.get("metadata") or {}
    if (meta.get("labels") or {}).get(keys.STAGE_KIND_LABEL) != keys.PREPULL_KIND:
        return None
    ann = meta.get("annotations") or {}
    gate, node = ann.get(PREPULL_GATE_ANNOTATION), ann.get(PREPULL_NODE_ANNOTATION)
    return (gate, node) if gate and node else None
