"""Stage Jobs and package ConfigMaps as manifests (pure: building, not sending).

A stage runs as a Job pinned to its node (`nodeName`, so no scheduler is involved and a cordon does
not stop it), tolerating the readiness taint and `unschedulable`, privileged with the host's root at
/host, in the host's PID and network namespaces. An init container from the package image copies the
package payload into an emptyDir; the agent container (NodeGate's image) runs the stage against the
host.

The node's facts (`gate.api.facts`) travel as the pod annotation `nodegate.io/node-facts`, projected
by a downwardAPI volume into a file the agent reads: the Downward API cannot read the Node's labels,
an annotation of the pod it can. They are the operator's, per node and per stage, so they belong on
the pod, not in the package's ConfigMap (shared by every node).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from gate.api import keys
from gate.api.common import parse_duration
from gate.api.facts import FACTS_ANNOTATION, OperatorFacts, RolloutPlace, operator_facts
from gate.api.nodegate import NodeGate, Package
from gate.api.state import NodeGateState, config_hash
from gate.api.versions import image_reference
from gate.controller.settings import OperatorSettings
from gate.kube.objects import created_at, job_failure, job_outcome
from gate.lifecycle.machine import JobPhase, JobRequest, JobView

Obj = dict[str, Any]

PAYLOAD_DIR = "/nodegate-payload"
CONFIG_DIR = "/nodegate-config"
FACTS_DIR = "/nodegate-facts"
FACTS_FILE = "facts.json"
HOST_ROOT = "/host"
TERMINATION_LOG = "/dev/termination-log"
GATE_NAME_ANNOTATION = f"{keys.GROUP}/gate-name"
NODE_NAME_ANNOTATION = f"{keys.GROUP}/node-name"


def label_value(text: str) -> str:
    """A label value for any name: itself when it fits in 63 characters, else a stable hash."""
    if len(text) <= 63:
        return text
    return text[:52].rstrip("-.") + "-" + hashlib.sha256(text.encode()).hexdigest()[:10]


def image_ref(package: Package) -> str:
    """The package image at its version (see `gate.api.versions.image_reference`)."""
    return image_reference(package.image, package.version)


def config_map_name(gate: str, package: str, pkg: Package) -> str:
    """Content-addressed and immutable: a stage always sees exactly the config it was started for."""
    digest = hashlib.sha256(f"{gate}\0{package}\0{config_hash(pkg)}".encode()).hexdigest()[:16]
    return f"ng-config-{digest}"


def owner_reference(gate: NodeGate) -> Obj:
    # A cluster-scoped owner of namespaced objects: garbage collection removes them with the gate.
    return {"apiVersion": keys.API_VERSION, "kind": "NodeGate", "name": gate.name,
            "uid": gate.metadata.uid or "", "controller": True, "blockOwnerDeletion": False}


def config_map(gate: NodeGate, package: str, settings: OperatorSettings) -> Obj:
    pkg = gate.spec.packages[package]
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(gate.name, package, pkg), "namespace": settings.namespace,
            "labels": {keys.MANAGED_BY_LABEL: keys.MANAGER, keys.JOB_GATE_LABEL: label_value(gate.name),
                       keys.JOB_PACKAGE_LABEL: package},
            "annotations": {GATE_NAME_ANNOTATION: gate.name},
            "ownerReferences": [owner_reference(gate)],
        },
        "immutable": True,
        "data": dict(pkg.config),
    }


def facts_of(name: str, node: Obj, state: NodeGateState | None) -> OperatorFacts:
    """The facts of node `name` for its stage pods: its labels and annotations as last seen (`node`, empty
    when the cache lost it), and the place in the rollout its state (the stage's round) records."""
    meta = node.get("metadata") or {}
    place = RolloutPlace(compartment=state.compartment, batch=state.batch, round=state.round) if state else None
    return operator_facts(name, meta.get("labels") or {}, meta.get("annotations") or {}, place)


def _seconds(duration: str) -> int:
    return max(1, int(parse_duration(duration).total_seconds()))


def stage_job(gate: NodeGate, node: str, request: JobRequest, settings: OperatorSettings,
              facts: OperatorFacts | None = None) -> Obj:
    """The Job of one stage; `facts` default to the node's name alone (see `gate.api.facts`)."""
    labels = {
        keys.MANAGED_BY_LABEL: keys.MANAGER,
        keys.JOB_GATE_LABEL: label_value(gate.name),
        keys.JOB_NODE_LABEL: label_value(node),
        keys.JOB_STAGE_LABEL: request.stage,
    }
    annotations = {GATE_NAME_ANNOTATION: gate.name, NODE_NAME_ANNOTATION: node}
    pod_annotations: dict[str, str] = {}
    tolerations: list[Obj] = [
        {"key": keys.READINESS_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        *(t.to_wire() for t in gate.spec.additional_tolerations),
    ]
    volumes: list[Obj] = [{"name": "host", "hostPath": {"path": "/", "type": "Directory"}}]
    mounts: list[Obj] = [{"name": "host", "mountPath": HOST_ROOT}]
    env: list[Obj] = [
        {"name": "NODEGATE_GATE", "value": gate.name},
        {"name": "NODEGATE_STAGE", "value": request.stage},
        {"name": "NODEGATE_NODE", "value": node},
    ]
    init: list[Obj] = []
    pull_secrets: list[Obj] = []
    resources: Obj = {}
    timeout = 600
    retries = 0
    grace: int | None = None
    if request.package is not None:
        pkg = gate.spec.packages[request.package]
        labels[keys.JOB_PACKAGE_LABEL] = request.package
        annotations[f"{keys.GROUP}/version"] = pkg.version
        args = ["agent", "run", "--stage", request.stage, "--package", request.package,
                "--version", pkg.version, "--gate", gate.name,
                "--generation", str(gate.metadata.generation or 0),
                "--root", HOST_ROOT, "--payload", PAYLOAD_DIR, "--config-dir", CONFIG_DIR,
                "--node-facts", f"{FACTS_DIR}/{FACTS_FILE}", "--termination-log", TERMINATION_LOG]
        if request.previous_version:
            args += ["--previous-version", request.previous_version]
            env.append({"name": "NODEGATE_PREVIOUS_VERSION", "value": request.previous_version})
        env += [{"name": "NODEGATE_PACKAGE", "value": request.package},
                {"name": "NODEGATE_VERSION", "value": pkg.version},
                *(e.to_wire() for e in pkg.env)]
        volumes += [{"name": "payload", "emptyDir": {}},
                    {"name": "config", "configMap": {"name": config_map_name(gate.name, request.package, pkg),
                                                     "optional": True}},
                    {"name": "facts", "downwardAPI": {"items": [
                        {"path": FACTS_FILE, "fieldRef": {"fieldPath": f"metadata.annotations['{FACTS_ANNOTATION}']"}},
                    ]}}]
        mounts += [{"name": "payload", "mountPath": PAYLOAD_DIR},
                   {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                   {"name": "facts", "mountPath": FACTS_DIR, "readOnly": True}]
        pod_annotations[FACTS_ANNOTATION] = (facts or OperatorFacts(node=node)).dump()
        init.append({
            "name": "payload", "image": image_ref(pkg),
            "command": ["cp", "-a", "/nodegate-package/.", PAYLOAD_DIR + "/"],
            "volumeMounts": [{"name": "payload", "mountPath": PAYLOAD_DIR}],
        })
        pull_secrets = [{"name": s.name} for s in pkg.image_pull_secrets]
        resources = pkg.resources.to_wire() if pkg.resources else {}
        timeout = _seconds(pkg.timeout)
        retries = pkg.retries
        if pkg.graceful_shutdown is not None:
            grace = math.ceil(parse_duration(pkg.graceful_shutdown).total_seconds())
    else:
        interrupt = request.interrupt
        assert interrupt is not None
        labels[keys.INTERRUPT_LABEL] = interrupt.type
        args = ["agent", "interrupt", "--type", interrupt.type, "--root", HOST_ROOT,
                "--termination-log", TERMINATION_LOG]
        for service in interrupt.services:
            args += ["--service", service]
    container: Obj = {
        "name": "agent", "image": settings.agent_image, "command": ["nodegate"], "args": args,
        "env": env, "volumeMounts": mounts,
        # Root on purpose, and only here: the agent chroots into the host. NodeGate's image defaults
        # to an unprivileged user for the webhook and the operator.
        "securityContext": {"privileged": True, "runAsUser": 0, "runAsGroup": 0},
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if resources:
        container["resources"] = resources
    pod_spec: Obj = {
        "nodeName": node,
        "restartPolicy": "Never",
        # A package changes the host, so its steps see the host's namespaces, not the pod's: its PID
        # namespace (systemctl and reboot reach the host's init, `pidof` sees host daemons) and its
        # network namespace (a `net.*` sysctl, iptables and a stub resolver on 127.0.0.53 are the
        # host's; in a pod network namespace `sysctl -p` would change the pod's copy, and its check
        # would read that copy back and pass while the node kept its old value). The mount
        # namespace stays the pod's: the agent chroots into the host's / mounted at /host.
        "hostPID": True,
        "hostNetwork": True,
        # The host's resolver, as the steps chrooted into the host use it too.
        "dnsPolicy": "Default",
        "serviceAccountName": settings.package_service_account,
        "automountServiceAccountToken": False,
        "tolerations": tolerations,
        "initContainers": init,
        "containers": [container],
        "volumes": volumes,
        # Each attempt gets `timeout`; the Job's own deadline bounds all attempts together.
        "activeDeadlineSeconds": timeout,
    }
    if pull_secrets:
        pod_spec["imagePullSecrets"] = pull_secrets
    if grace is not None:
        # SIGTERM reaches the agent, which passes it on to the running step (gate.agent.process); the
        # kubelet kills what is left once this has passed. Unset: Kubernetes' default of 30 s.
        pod_spec["terminationGracePeriodSeconds"] = grace
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": request.name, "namespace": settings.namespace, "labels": labels,
                     "annotations": annotations, "ownerReferences": [owner_reference(gate)]},
        "spec": {
            "backoffLimit": retries,
            "activeDeadlineSeconds": timeout * (retries + 1) + 60 * retries,
            "ttlSecondsAfterFinished": 7 * 24 * 3600,  # a safety net; the operator deletes finished Jobs
            "template": {"metadata": {"labels": labels, "annotations": {**annotations, **pod_annotations}},
                         "spec": pod_spec},
        },
    }


def job_view(job: Obj, pods: list[Obj]) -> JobView:
    """What the decider needs of a Job and its newest pod: phase, failure message, stuck reason."""
    status = job.get("status") or {}
    phase: JobPhase
    message = ""
    outcome = job_outcome(job)
    if outcome is not None:
        phase = outcome
        message = job_failure(job)
    elif status.get("active"):
        phase = "running"
    else:
        phase = "pending"
    pod = max(pods, key=lambda p: p.get("metadata", {}).get("creationTimestamp", ""), default=None)
    waiting_reason = ""
    waiting_since = None
    settled = True
    if pod is not None:
        pstatus = pod.get("status") or {}
        for cs in [*(pstatus.get("initContainerStatuses") or []), *(pstatus.get("containerStatuses") or [])]:
            state = cs.get("state") or {}
            if "waiting" in state and state["waiting"].get("reason") not in (None, "PodInitializing",
                                                                                "ContainerCreating"):
                waiting_reason = state["waiting"].get("reason", "")
                message = message or state["waiting"].get("message", "")
                break
            term = state.get("terminated")
            if term and term.get("exitCode", 0) != 0 and term.get("message"):
                message = term["message"].strip()  # the agent's JSON summary
        pod_phase = pod.get("status", {}).get("phase")
        if pod_phase == "Pending" and phase == "running":
            phase = "pending"
        elif pod_phase == "Succeeded" and phase in ("running", "pending"):
            # A Job of one completion succeeds with its pod; the Job controller records that up to a
            # second later (it batches pod updates). The stage is done on the host: move on now.
            phase = "succeeded"
            settled = False
        if waiting_reason:
            waiting_since = created_at(pod)
    labels = job.get("metadata", {}).get("labels") or {}
    return JobView(
        name=job["metadata"]["name"], phase=phase, message=message[:2000], waiting_reason=waiting_reason,
        waiting_since=waiting_since, created=created_at(job),
        package=labels.get(keys.JOB_PACKAGE_LABEL), stage=labels.get(keys.JOB_STAGE_LABEL, ""),
        settled=settled,
    )
