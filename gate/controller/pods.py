"""Stage pods and package ConfigMaps as manifests, and stage pods read back (pure: no I/O).

The phases of a round that fit in one boot run as one bare pod pinned to its node (`nodeName`, so no
scheduler is involved and a cordon does not stop it), owned by the gate, tolerating the readiness taint
and `unschedulable`, privileged with the host's root at /host, in the host's PID and network namespaces.
No Job controller sits in the path: the operator retries a failed step itself, in a new pod of its
own deterministic name (`gate.lifecycle.node.pod_name`). Its steps run one after another, as
NodeWright's stage pods chain a stage and its check: for each package an init container from the
package image copies the payload into an emptyDir, then an agent container (NodeGate's image) runs
each of its stages against the host, in its turn (`gate.controller.steporder` lays them out; several
checks after the interrupt run side by side). The interrupt is a step of NodeGate's image alone
(`agent interrupt`, container `interrupt`); a reboot is always its pod's last step. Each step's
result is its container's termination (exit code, and the agent's summary as the termination
message), read back by
`stage_pod_view`. The pod's annotation `nodegate.io/steps` says which container is which step.

A package's config reaches its steps as an immutable ConfigMap named by its content and the gate's
uid; each agent container gets the digest of that config as an argument (`gate.api.digests`) and
refuses anything else it finds mounted. The spec that carries the digest cannot change after the
pod's creation (the chart's host-access policy), and a ConfigMap found under the name is taken only
when it is exactly the operator's (`config_map_problems`).

Every NodeGate container of these pods (agent, interrupt, prepull) starts in a sealed interpreter:
`AGENT_COMMAND` runs the image's Python in isolated mode on NodeGate's own module, never the image's
entrypoint or console script, so the PYTHON* variables that a gate's env can set, and any directory
that its config lands in, are never read before NodeGate's code runs. A gate's env reaches the agent
container without the names NodeGate never passes (`gate.api.environment`: LD_PRELOAD would load a
library into the interpreter itself), even when a write got past admission; the agent gets the names
the gate gave in `--gate-env` and refuses those the package does not declare (`gate.agent.gate_env`).

The node's facts (`gate.api.facts`) travel as the pod annotation `nodegate.io/node-facts`, projected
by a downwardAPI volume into a file the agent reads: the Downward API cannot read the Node's labels,
an annotation of the pod it can. They are the operator's, per node and per stage, so they belong on
the pod, not in the package's ConfigMap (shared by every node).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from gate.api import keys
from gate.api.common import Obj, parse_duration
from gate.api.digests import text_config_digest
from gate.api.environment import never_passed
from gate.api.facts import FACTS_ANNOTATION, OperatorFacts, RolloutPlace, operator_facts
from gate.api.nodegate import Interrupt, NodeGate, Package
from gate.api.state import NodeGateState, config_hash
from gate.controller.podshape import (
    BASIS_FIELD,
    BUILT_FIELD,
    SHAPE_FIELD,
    SIGNATURE_ANNOTATION,
    built_digest,
    digest_since,
    recorded_shape,
)
from gate.controller.settings import OperatorSettings
from gate.controller.steporder import (
    TURNS_VOLUME,
    in_turn,
    layout,
    payload_container,
    side_by_side,
)
from gate.kube.cache import slim
from gate.kube.objects import container_states, container_statuses, created_at, parse_time, pod_ended, stuck_wait
from gate.lifecycle.images import PodImage, pod_images, request_packages
from gate.lifecycle.node import PodKind, PodRequest, RunPhase, StagePod, Step

PAYLOAD_DIR = "/nodegate-payload"
CONFIG_DIR = "/nodegate-config"
FACTS_DIR = "/nodegate-facts"
FACTS_FILE = "facts.json"
HOST_ROOT = "/host"
TERMINATION_LOG = "/dev/termination-log"
GATE_NAME_ANNOTATION = f"{keys.GROUP}/gate-name"
NODE_NAME_ANNOTATION = f"{keys.GROUP}/node-name"
STEPS_ANNOTATION = f"{keys.GROUP}/steps"
ROUND_ANNOTATION = f"{keys.GROUP}/round"
ATTEMPT_ANNOTATION = f"{keys.GROUP}/attempt"
GENERATION_ANNOTATION = f"{keys.GROUP}/generation"  # a staging pod's: the gate generation it stages for
POD_KINDS: tuple[PodKind, ...] = ("stages", "interrupt", "post-interrupt", "removal", "staging", "unstage")
# Staging and undo pods (`gate.controller.staging`): no node's state records them; each carries the operator's
# signature of what it runs (`SIGNATURE_ANNOTATION`).
STAGING_KINDS = frozenset({"staging", "unstage"})
# NodeGate's image keeps its virtualenv at /opt/nodegate (Dockerfile). -I: isolated mode (no PYTHON*
# variable, no user site, not the current directory on sys.path); -u and -B stand in for the image's
# PYTHONUNBUFFERED and PYTHONDONTWRITEBYTECODE, which isolated mode ignores like the rest.
AGENT_COMMAND: tuple[str, ...] = ("/opt/nodegate/bin/python", "-I", "-u", "-B", "-m", "gate")


def label_value(text: str) -> str:
    """A label value for any name: itself when it fits in 63 characters, else a stable hash."""
    if len(text) <= 63:
        return text
    return text[:52].rstrip("-.") + "-" + hashlib.sha256(text.encode()).hexdigest()[:10]


def config_map_name(gate: NodeGate, package: str, pkg: Package) -> str:
    """Content-addressed and immutable: a stage always sees exactly the config it was started for.

    The gate's uid is part of the name: a gate deleted and created again under its name never meets
    the ConfigMaps of the old one that garbage collection has not removed yet (they would not be
    its own, `config_map_problems`), and nobody can create one ahead before the gate exists."""
    key = f"{gate.metadata.uid or ''}\0{gate.name}\0{package}\0{config_hash(pkg)}"
    return f"ng-config-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def owner_reference(gate: NodeGate) -> Obj:
    # A cluster-scoped owner of namespaced objects: garbage collection removes them with the gate.
    return {"apiVersion": keys.API_VERSION, "kind": "NodeGate", "name": gate.name,
            "uid": gate.metadata.uid or "", "controller": True, "blockOwnerDeletion": False}


def config_map(gate: NodeGate, package: str, settings: OperatorSettings) -> Obj:
    pkg = gate.spec.packages[package]
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(gate, package, pkg), "namespace": settings.namespace,
            "labels": {keys.MANAGED_BY_LABEL: keys.MANAGER, keys.STAGE_GATE_LABEL: label_value(gate.name),
                       keys.STAGE_PACKAGE_LABEL: package},
            "annotations": {GATE_NAME_ANNOTATION: gate.name},
            "ownerReferences": [owner_reference(gate)],
        },
        "immutable": True,
        "data": dict(pkg.config),
    }


def config_map_problems(existing: Obj, wanted: Obj) -> list[str]:
    """Why a ConfigMap found under the name of `wanted` (a create answered 409) is not NodeGate's
    rendering of it; empty when it is. Someone with write access to the namespace may have created
    it ahead, or replaced it, so it is taken only when it holds exactly the wanted data, cannot
    change (immutable), and is labelled and owned as the operator makes it."""
    problems = []
    data, binary = existing.get("data") or {}, existing.get("binaryData") or {}
    want = wanted.get("data") or {}
    differ = sorted(k for k in {*data, *want} if data.get(k) != want.get(k))
    if differ:
        problems.append(f"its data differs in key(s) {', '.join(differ)}")
    if binary:
        problems.append(f"it has binaryData key(s) {', '.join(sorted(binary))}")
    if existing.get("immutable") is not True:
        problems.append("it is not immutable")
    meta, want_meta = existing.get("metadata") or {}, wanted.get("metadata") or {}
    if (meta.get("labels") or {}).get(keys.MANAGED_BY_LABEL) != keys.MANAGER:
        problems.append(f"it is not labelled {keys.MANAGED_BY_LABEL}={keys.MANAGER}")
    [owner] = want_meta["ownerReferences"]
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    if [(o.get("kind"), o.get("uid")) for o in owners] != [(owner["kind"], owner["uid"])]:
        problems.append(f"its controller is not NodeGate {owner['name']} (uid {owner['uid']})")
    return problems


def facts_of(name: str, node: Obj, state: NodeGateState | None) -> OperatorFacts:
    """The facts of node `name` for its stage pods: its labels and annotations as last seen (`node`, empty
    when the cache lost it), and the place in the rollout its state (the stage's round) records."""
    meta = node.get("metadata") or {}
    place = RolloutPlace(compartment=state.compartment, batch=state.batch, round=state.round) if state else None
    return operator_facts(name, meta.get("labels") or {}, meta.get("annotations") or {}, place)


def _seconds(duration: str) -> int:
    return max(1, int(parse_duration(duration).total_seconds()))


def container_name(step: Step) -> str:
    """A step's container: `<stage>-<package>` (a package name is at most 43 characters, so this
    fits a container name's 63), `interrupt` for the interrupt."""
    return step.stage if step.package is None else f"{step.stage}-{step.package}"


def _wire_step(step: Step) -> list[str | None]:
    return [step.package, step.stage, step.fingerprint, container_name(step)]


def tolerations(gate: NodeGate) -> list[Obj]:
    return [
        {"key": keys.READINESS_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        *(t.to_wire() for t in gate.spec.additional_tolerations),
    ]


def _package_step(gate: NodeGate, node: str, step: Step, image: str, part: str = "whole",
                  payload_on_host: bool = False, payload_image: str | None = None) -> Obj:
    """The agent container of one package stage, reading the payload (or, `payload_on_host`, the host's copy of
    it: `payload_from_host`, `PodRequest.payload_on_host`), config and facts its package's volumes hold.
    `payload_image` is the package's image as the pod names it: the agent records it with the copy it lays on
    the host, and holds a copy it reads there against it."""
    assert step.package is not None
    pkg = gate.spec.packages[step.package]
    payload = ["--payload-on-host"] if payload_on_host else ["--payload", PAYLOAD_DIR]
    if payload_image:
        payload += ["--payload-image", payload_image]
    args = ["agent", "run", "--stage", step.stage, "--package", step.package,
            "--version", pkg.version, "--gate", gate.name,
            "--generation", str(gate.metadata.generation or 0),
            "--root", HOST_ROOT, *payload, "--config-dir", CONFIG_DIR,
            # What the agent holds the mounted ConfigMap against; the spec cannot change once created.
            "--config-digest", text_config_digest(pkg.config),
            "--node-facts", f"{FACTS_DIR}/{FACTS_FILE}", "--termination-log", TERMINATION_LOG,
            "--timeout", str(_seconds(pkg.timeout)),
            # The gate's env names, so the agent can tell them from the image's and the kubelet's.
            "--gate-env", ",".join(e.name for e in pkg.env)]
    env: list[Obj] = [
        {"name": "NODEGATE_GATE", "value": gate.name},
        {"name": "NODEGATE_STAGE", "value": step.stage},
        {"name": "NODEGATE_NODE", "value": node},
    ]
    if part != "whole":  # a staging pod's serving steps, or their undo (gate.lifecycle.staging)
        args += ["--part", part]
    if step.previous_version:
        args += ["--previous-version", step.previous_version]
        env.append({"name": "NODEGATE_PREVIOUS_VERSION", "value": step.previous_version})
    env += [{"name": "NODEGATE_PACKAGE", "value": step.package},
            {"name": "NODEGATE_VERSION", "value": pkg.version},
            *(e.to_wire() for e in pkg.env if not never_passed(e.name))]
    mounts = [{"name": f"config-{step.package}", "mountPath": CONFIG_DIR, "readOnly": True},
              {"name": "facts", "mountPath": FACTS_DIR, "readOnly": True}]
    if not payload_on_host:
        mounts.insert(0, {"name": f"payload-{step.package}", "mountPath": PAYLOAD_DIR})
    container = _agent(container_name(step), args, env, image, mounts)
    if pkg.resources:
        container["resources"] = pkg.resources.to_wire()
    return container


def _agent(name: str, args: list[str], env: list[Obj], image: str, mounts: list[Obj]) -> Obj:
    return {
        "name": name, "image": image, "command": list(AGENT_COMMAND), "args": args, "env": env,
        "volumeMounts": [{"name": "host", "mountPath": HOST_ROOT}, *mounts],
        # Root on purpose, and only here: the agent chroots into the host. NodeGate's image defaults
        # to an unprivileged user for the webhook and the operator.
        "securityContext": {"privileged": True, "runAsUser": 0, "runAsGroup": 0},
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


# The interrupt step's bound: a reboot or a service restart (the agent bounds what it runs itself).
INTERRUPT_DEADLINE = 600


def _interrupt_step(interrupt: Interrupt, settings: OperatorSettings) -> Obj:
    """The interrupt as a step: `agent interrupt` in container `interrupt`. A reboot is its pod's last step;
    a service restart may have the checks after it as the steps that follow."""
    args = ["agent", "interrupt", "--type", interrupt.type, "--root", HOST_ROOT, "--termination-log", TERMINATION_LOG]
    for service in interrupt.services:
        args += ["--service", service]
    # A reboot is asked for once per pod (`gate.agent.reboots`): the pod's own UID, from the kubelet, names it.
    env = [{"name": "NODEGATE_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}] \
        if interrupt.type == "reboot" else []
    return _agent("interrupt", args, env, settings.agent_image, [])


def staging_pod(gate: NodeGate, node: str, name: str, steps: tuple[Step, ...], settings: OperatorSettings,
                facts: OperatorFacts | None = None, images: Mapping[str, PodImage] | None = None) -> Obj:
    """A staging pod (`gate.lifecycle.staging`): the round's serving steps on the serving node, before
    its cordon (`agent run --part serving`). Owned by no gate: the pod is the record of what was staged,
    and a foreground deletion of the gate would take it before its undo ran."""
    pod = stage_pod(gate, node, PodRequest(name, "staging", steps, part="serving"), settings, facts, images)
    del pod["metadata"]["ownerReferences"]
    pod["metadata"]["annotations"][GENERATION_ANNOTATION] = str(gate.metadata.generation or 0)
    return pod


def unstage_pod(staging: Obj, name: str) -> Obj:
    """The undo of a staging pod: the same pod (the staged version's images, config and facts, whatever
    the gate's spec says now) with `--part undo` and kind `unstage`, under `name`. `staging` is the pod as
    the API server returns it (its whole spec), not a slimmed copy of a cache."""
    meta = staging["metadata"]
    spec = json.loads(json.dumps(staging["spec"]))
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        args = container.get("args") or []
        if "--part" in args:
            args[args.index("--part") + 1] = "undo"
    labels = {**(meta.get("labels") or {}), keys.STAGE_KIND_LABEL: "unstage"}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != SIGNATURE_ANNOTATION}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": meta.get("namespace"), "labels": labels,
                         "annotations": annotations},
            "spec": spec}


def payload_from_host(steps: Sequence[Step]) -> frozenset[str]:
    """The packages whose every step in a pod is the check after the interrupt: they read the payload the
    round's stage of their version left on the host (`agent run --payload-on-host`), so the pod holds no
    copy of it, one container fewer each on the node's first boot after its reboot. Every stage copies its
    payload there, and the round ran one of the package's stages before the interrupt (the check after it
    is only for what the round installs or configures), in the window or staged; it is kept until a later
    version's stage prunes it. The check after an uninstall's interrupt does not: the uninstall took it
    off the host."""
    packages = {s.package for s in steps if s.package is not None}
    return frozenset(p for p in packages if all(s.stage == "post-interrupt" for s in steps if s.package == p))


def stage_pod(gate: NodeGate, node: str, request: PodRequest, settings: OperatorSettings,
              facts: OperatorFacts | None = None, images: Mapping[str, PodImage] | None = None) -> Obj:
    """The pod of a round's phases on one node: its steps as containers laid out by
    `gate.controller.steporder` (in turn; several checks after the interrupt side by side), each package's
    payload copied from its image before its steps; `facts`
    default to the node's name alone (see `gate.api.facts`).

    `images` are the packages' images as `gate.lifecycle.images.pod_images` gives them (by digest,
    once resolved); the operator always passes them. Left out, each image is the spec's, as with
    resolution turned off (a tag pulled Always)."""
    if images is None:
        images = pod_images(gate, request_packages(request), resolve=False)[0]
    labels = {
        keys.MANAGED_BY_LABEL: keys.MANAGER,
        keys.STAGE_GATE_LABEL: label_value(gate.name),
        keys.STAGE_NODE_LABEL: label_value(node),
        keys.STAGE_KIND_LABEL: request.kind,
    }
    annotations = {
        GATE_NAME_ANNOTATION: gate.name, NODE_NAME_ANNOTATION: node,
        STEPS_ANNOTATION: json.dumps([_wire_step(s) for s in request.steps], separators=(",", ":")),
        ROUND_ANNOTATION: str(request.round), ATTEMPT_ANNOTATION: str(request.attempt),
    }
    volumes: list[Obj] = [{"name": "host", "hostPath": {"path": "/", "type": "Directory"}}]
    containers: list[Obj] = []
    pull_secrets: dict[str, Obj] = {}
    deadline = 0
    grace: int | None = None
    if request.interrupt is not None:
        labels[keys.INTERRUPT_LABEL] = request.interrupt.type
    stages: dict[str, list[str]] = {}
    on_host = payload_from_host(request.steps) | request.payload_on_host
    turns = in_turn(request.steps, reboot=request.interrupt is not None and request.interrupt.type == "reboot")
    if turns:
        labels[keys.IN_TURN_LABEL] = "true"
        volumes.append({"name": TURNS_VOLUME, "emptyDir": {}})
    for step in request.steps:
        if step.package is None:  # the interrupt: a step of NodeGate's image alone
            assert request.interrupt is not None, "an interrupt step needs the request's interrupt"
            containers.append(_interrupt_step(request.interrupt, settings))
            deadline += INTERRUPT_DEADLINE
            continue
        pkg = gate.spec.packages[step.package]
        if step.package not in stages:
            stages[step.package] = []
            if step.package not in on_host:
                volumes.append({"name": f"payload-{step.package}", "emptyDir": {}})
            volumes.append({"name": f"config-{step.package}", "configMap": {
                "name": config_map_name(gate, step.package, pkg), "optional": True}})
            if step.package not in on_host:
                image = images[step.package]
                containers.append({
                    "name": payload_container(step.package), "image": image.image,
                    "imagePullPolicy": image.pull_policy,
                    "command": ["cp", "-a", "/nodegate-package/.", PAYLOAD_DIR + "/"],
                    "volumeMounts": [{"name": f"payload-{step.package}", "mountPath": PAYLOAD_DIR}],
                })
                pull_secrets.update({s.name: {"name": s.name} for s in pkg.image_pull_secrets})
            if pkg.graceful_shutdown is not None:
                seconds = math.ceil(parse_duration(pkg.graceful_shutdown).total_seconds())
                grace = max(grace or 0, seconds)
        stages[step.package].append(step.stage)
        containers.append(_package_step(gate, node, step, settings.agent_image, request.part,
                                        step.package in on_host, images[step.package].image))
        deadline += _seconds(pkg.timeout)
    if stages:
        volumes.append({"name": "facts", "downwardAPI": {"items": [
            {"path": FACTS_FILE, "fieldRef": {"fieldPath": f"metadata.annotations['{FACTS_ANNOTATION}']"}},
        ]}})
        annotations[FACTS_ANNOTATION] = (facts or OperatorFacts(node=node)).dump()
        labels.update({f"{keys.POD_PACKAGE_PREFIX}{name}": ".".join(s) for name, s in stages.items()})
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
        # No <SERVICE>_HOST/_PORT variables: a Service in the namespace is nobody's input to a package.
        "enableServiceLinks": False,
        "tolerations": tolerations(gate),
        **layout(containers, request.steps, turns),
        "volumes": volumes,
        # Each step is bounded by its package's `timeout` (the agent's --timeout); the pod by all of
        # them together, for what the agent cannot bound (a payload copy, an image pull).
        "activeDeadlineSeconds": deadline,
    }
    if pull_secrets:
        pod_spec["imagePullSecrets"] = list(pull_secrets.values())
    if grace is not None:
        # SIGTERM reaches the agent, which passes it on to the running step (gate.agent.process); the
        # kubelet kills what is left once this has passed. Unset: Kubernetes' default of 30 s.
        pod_spec["terminationGracePeriodSeconds"] = grace
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": request.name, "namespace": settings.namespace, "labels": labels,
                     "annotations": annotations, "ownerReferences": [owner_reference(gate)]},
        "spec": pod_spec,
    }


def pod_steps(pod: Obj) -> tuple[Step, ...]:
    """The steps a stage pod runs, from its annotation (none when it is not one of ours or unreadable)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(STEPS_ANNOTATION)
    try:
        wire = json.loads(raw) if raw else []
        return tuple(Step(package, stage, fingerprint) for package, stage, fingerprint, _ in wire)
    except (ValueError, TypeError):
        return ()


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


_POD_STATUS_KEPT = ("phase", "reason", "message", "startTime", "initContainerStatuses", "containerStatuses")


def stage_pod_fields(pod: Obj, previous: Obj | None = None) -> Obj:
    """A stage pod as the operator's cache keeps it: its metadata (less managedFields), its node and
    deadline, how far its containers got, and the digest of what it runs (`gate.controller.podshape`).
    The containers' specs (image, command, mounts, the environment) are most of a stage pod, and the
    operator reads nothing else of them: it built them (`stage_pod`), the steps are in an annotation
    (`gate.kube.cache.WatchCache`'s transform), and the digest says whether they are still what it built.
    `previous` is the cache's copy of the pod before this one, if any: its digest is kept when nothing
    it depends on can have changed since (`gate.controller.podshape.digest_since`)."""
    if SHAPE_FIELD in pod:
        return pod  # slimmed already
    shape, basis = digest_since(pod, previous)
    meta = slim(pod).get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    out = {
        "apiVersion": pod.get("apiVersion", "v1"), "kind": pod.get("kind", "Pod"), "metadata": meta,
        "spec": {k: spec[k] for k in ("nodeName", "activeDeadlineSeconds") if k in spec},
        "status": {k: status[k] for k in _POD_STATUS_KEPT if k in status},
        # What the containers run, as one digest taken before their specs are dropped: whether it is
        # still what the operator built (`gate.lifecycle.ownership`).
        SHAPE_FIELD: shape, BASIS_FIELD: basis,
    }
    if (meta.get("labels") or {}).get(keys.STAGE_KIND_LABEL) in STAGING_KINDS:  # checked by its signature
        kept = previous.get(BUILT_FIELD) if previous is not None and previous.get(BASIS_FIELD) == basis else None
        out[BUILT_FIELD] = kept or built_digest(pod)
    return out


def stage_pod_ended(pod: Obj) -> bool:
    """Nothing runs in the stage pod any more, and nothing will: its phase is terminal, or every one of
    its steps ended well, or one of its containers failed (restartPolicy Never: none after it runs).

    The kubelet writes its containers' ends first, and the terminal phase only once it stopped the
    pod's sandbox (kubelet status manager: "Delay transitioning a pod to a terminal status unless the
    pod is actually terminal"), a second or two later on a busy node. The operator moves the node on
    at the first: the step results are in the containers' terminations already, and the host is idle.
    """
    return pod_ended(pod) or stage_pod_view(pod).ended


def stage_pod_view(pod: Obj) -> StagePod:
    """What the decider needs of a stage pod: how far its steps got, why it failed, whether it is stuck."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    status = pod.get("status") or {}
    steps = pod_steps(pod)
    statuses = container_statuses(pod)
    by_name = container_states(pod)
    done = 0
    for step in steps:
        term = by_name.get(container_name(step), {}).get("terminated")
        if not term or term.get("exitCode") != 0:
            break
        done += 1
    started = any("running" in state or "terminated" in state for state in by_name.values())
    message = ""
    waiting_reason = ""
    failed = False
    stuck = stuck_wait(pod)
    if stuck is not None:
        waiting_reason = stuck.get("reason", "")
        message = stuck.get("message", "")
    # What failed: a payload copy, or the first step that did not succeed (the steps before it all did; with
    # steps side by side, `side_by_side`, one after it may have failed too, or still run: the first in the
    # steps' order is the pod's failure, whichever the kubelet lists first, and it ends the pod as in a chain).
    step_names = {container_name(step) for step in steps}
    first_left = [container_name(steps[done])] if done < len(steps) else []
    for cs in [*(cs for cs in statuses if cs.get("name") not in step_names),
               *(cs for cs in statuses if cs.get("name") in first_left)]:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode", 0) != 0:
            failed = True
            message = (term.get("message") or term.get("reason") or "").strip()  # the agent's JSON summary
            if not message:
                message = f"container {cs.get('name')} exited with code {term.get('exitCode')}"
            break
    kind = (meta.get("labels") or {}).get(keys.STAGE_KIND_LABEL, "stages")
    boot_id, generation = "", None
    if kind == "staging":
        generation = _int(annotations[GENERATION_ANNOTATION]) if GENERATION_ANNOTATION in annotations else None
        if steps and not failed:  # its last step's summary says the boot it ended on
            last = (by_name.get(container_name(steps[-1]), {}).get("terminated") or {}).get("message") or ""
            boot_id = _summary_boot_id(last)
    pod_phase = status.get("phase")
    phase: RunPhase
    if pod_phase == "Succeeded" or (steps and done == len(steps)):
        phase = "succeeded"
    elif pod_phase == "Failed" or failed:
        phase = "failed"
        if not message:  # ended without a step failing: past its deadline, evicted, its node gone
            message = f"{status.get('reason', 'Failed')}: {status.get('message', '')}".strip(": ")
    elif started:
        phase = "running"
    else:
        phase = "pending"
    return StagePod(
        name=meta.get("name", ""), kind=kind if kind in POD_KINDS else "stages", phase=phase, steps=steps,
        done=done, message=message[:2000], waiting_reason=waiting_reason,
        waiting_since=created_at(pod) if waiting_reason else None, created=created_at(pod),
        round=_int(annotations.get(ROUND_ANNOTATION)), attempt=_int(annotations.get(ATTEMPT_ANNOTATION)),
        deadline=(pod.get("spec") or {}).get("activeDeadlineSeconds"),
        deleting=bool(meta.get("deletionTimestamp")), uid=str(meta.get("uid") or ""),
        shape=recorded_shape(pod), boot_id=boot_id, generation=generation,
    )


def step_runs(pod: Obj, done: str = "succeeded") -> list[tuple[Step, str, float]]:
    """Each started step of a pod about to go, its outcome (`done` when it succeeded, failed, abandoned)
    and its seconds from its container's start to its end: what `nodegate_stage_duration_seconds` observes."""
    view = stage_pod_view(pod)
    states = container_states(pod)
    ordered = not side_by_side(view.steps)
    out = []
    previous_end: datetime | None = None
    for i, step in enumerate(view.steps):
        state = states.get(container_name(step), {})
        timing = state.get("terminated") or state.get("running")
        started = parse_time((timing or {}).get("startedAt"))
        if started is None or (ordered and i > view.done):
            continue  # never started, or (`in_turn`) its turn never came: it ran nothing
        if ordered and previous_end is not None:
            started = max(started, previous_end)  # in its turn: it ran from the end of the step before it
        term = state.get("terminated")
        # Steps side by side (`side_by_side`) may succeed after the first that did not.
        outcome = done if i < view.done or (term and term.get("exitCode") == 0) else (
            "failed" if term else "abandoned")
        ended = parse_time((state.get("terminated") or {}).get("finishedAt")) or datetime.now(UTC)
        out.append((step, outcome, max(0.0, (ended - started).total_seconds())))
        previous_end = ended
    return out


def _summary_boot_id(message: str) -> str:
    """The `bootId` of an agent's JSON summary (a termination message), empty when it has none."""
    try:
        wire = json.loads(message)
    except ValueError:
        return ""
    value = wire.get("bootId") if isinstance(wire, dict) else None
    return value if isinstance(value, str) else ""
