"""kwok Stages: how the simulated nodes behave, as Stage objects in the dev cluster.

kwok plays the kubelet of every simulated node. The dev cluster runs kwok with the Stage CRD enabled,
so the behaviour below lives in the cluster as `kwok.x-k8s.io/v1alpha1 Stage` objects and tests can
add their own at run time (a stage failing on one node, a slow drain) without restarting anything.

Precedence: when several stages match an object kwok picks one at random *by weight*, skipping
weight-0 stages whenever a positive weight matches. Every stage here has weight 0, and every
injected stage has weight 1, so an injected stage always wins over the default behaviour.
"""

from __future__ import annotations

from typing import Any

from gate.api import keys

Stage = dict[str, Any]

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
INJECTED_LABEL = "nodegate.dev/injected"

_NODE_READY_TEMPLATE = """\
{{ $now := Now }}
{{ $since := or .metadata.creationTimestamp $now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
addresses:
{{ with NodeIP }}
- address: {{ . | Quote }}
  type: InternalIP
{{ end }}
{{ with NodeName }}
- address: {{ . | Quote }}
  type: Hostname
{{ end }}
allocatable:
  cpu: "64"
  memory: 512Gi
  pods: "110"
  nvidia.com/gpu: "8"
capacity:
  cpu: "64"
  memory: 512Gi
  pods: "110"
  nvidia.com/gpu: "8"
{{ $info := .status.nodeInfo }}
nodeInfo:
  architecture: amd64
  bootID: {{ or $info.bootID uuidv4 | Quote }}
  containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
  kernelVersion: {{ or $info.kernelVersion "6.8.0-kwok" | Quote }}
  kubeProxyVersion: ""
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
  machineID: {{ or $info.machineID uuidv4 | Quote }}
  operatingSystem: linux
  osImage: {{ or $info.osImage "Simulated Linux" | Quote }}
  systemUUID: {{ or $info.systemUUID uuidv4 | Quote }}
phase: Running
"""

_POD_RUNNING_TEMPLATE = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: PodScheduled
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
      startedAt: {{ $now | Quote }}
{{ end }}
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
{{ end }}
{{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ . | Quote }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


def _terminated_template(phase: str, exit_code: int, reason: str, message: str) -> str:
    """Status of a pod whose containers all ended: Succeeded or Failed with a termination message."""
    return f"""\
{{{{ $now := Now }}}}
conditions:
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "False"
  type: Ready
  reason: PodCompleted
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "False"
  type: ContainersReady
  reason: PodCompleted
containerStatuses:
{{{{ range .spec.containers }}}}
- image: {{{{ .image | Quote }}}}
  name: {{{{ .name | Quote }}}}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: {exit_code}
      finishedAt: {{{{ $now | Quote }}}}
      reason: {reason}
      message: {message!r}
      startedAt: {{{{ $now | Quote }}}}
{{{{ end }}}}
phase: {phase}
"""


def _stage(name: str, kind: str, exprs: list[dict[str, Any]], nxt: dict[str, Any] | None = None, *,
           steps: list[dict[str, Any]] | None = None, weight: int = 0, delay_ms: int = 0,
           labels: dict[str, str] | None = None) -> Stage:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": exprs},
        "weight": weight,
    }
    if nxt is not None:
        spec["next"] = nxt
    if steps is not None:
        spec["steps"] = steps
    if delay_ms:
        spec["delay"] = {"durationMilliseconds": delay_ms}
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": name, "labels": labels or {"app.kubernetes.io/part-of": "nodegate-dev"}},
        "spec": spec,
    }


def _not_deleting() -> dict[str, Any]:
    return {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}


def _running() -> list[dict[str, Any]]:
    return [
        _not_deleting(),
        {"key": ".status.phase", "operator": "In", "values": ["Running"]},
    ]


def default_stages(job_seconds: float = 1.0) -> list[Stage]:
    """The kubelet of a simulated node: nodes Ready, pods Running, Job pods Succeeded, deletes done.

    `job_seconds` is how long a Job's pod runs before it succeeds: the simulated time of a package
    stage. Reboot interrupts also give the node a new bootID, as a real reboot would.
    """
    job_ms = int(job_seconds * 1000)
    return [
        _stage(
            "node-ready",
            "Node",
            [{"key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
              "operator": "NotIn", "values": ["True"]}],
            {"statusTemplate": _NODE_READY_TEMPLATE},
            delay_ms=200,
        ),
        _stage(
            "pod-running",
            "Pod",
            [_not_deleting(), {"key": ".status.phase", "operator": "DoesNotExist"}],
            {"statusTemplate": _POD_RUNNING_TEMPLATE},
        ),
        _stage(
            "pod-running-pending",
            "Pod",
            [_not_deleting(), {"key": ".status.phase", "operator": "In", "values": ["Pending"]}],
            {"statusTemplate": _POD_RUNNING_TEMPLATE},
        ),
        _stage(
            "job-pod-succeeded",
            "Pod",
            [*_running(), {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]}],
            {"statusTemplate": _terminated_template("Succeeded", 0, "Completed", "")},
            delay_ms=job_ms,
        ),
        _stage(
            "pod-delete",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            {"delete": True},
        ),
    ]


def reboot_stage(job_seconds: float = 1.0) -> Stage:
    """A reboot interrupt's pod reboots its node: NotReady with a new bootID, then Ready again.

    Weight 1 so it wins over `job-pod-succeeded` for these pods; the node-ready stage brings the
    node back shortly after.
    """
    node_patch = """\
apiVersion: v1
kind: Node
metadata:
  name: {{ .spec.nodeName | Quote }}
status:
  nodeInfo:
    bootID: {{ uuidv4 | Quote }}
  conditions:
  - type: Ready
    status: "False"
    reason: NodeRebooting
    message: simulated reboot by a NodeGate interrupt
    lastHeartbeatTime: {{ Now | Quote }}
    lastTransitionTime: {{ Now | Quote }}
"""
    return _stage(
        "nodegate-reboot",
        "Pod",
        [*_running(),
         {"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "In", "values": ["interrupt"]},
         {"key": f'.metadata.labels["{keys.INTERRUPT_LABEL}"]', "operator": "In", "values": ["reboot"]}],
        steps=[
            {"apply": {"template": node_patch, "subresource": "status", "type": "merge"}},
            {"patch": {"subresource": "status", "root": "status", "type": "merge",
                       "template": _terminated_template("Succeeded", 0, "Completed", "")}},
        ],
        weight=1,
        delay_ms=int(job_seconds * 1000),
    )


def _package_pods(nodes: list[str], package: str | None, stage: str | None) -> list[dict[str, Any]]:
    """Selector of the running stage-Job pods on `nodes`, of one package and one stage when given."""
    exprs: list[dict[str, Any]] = [*_running(), {"key": ".spec.nodeName", "operator": "In", "values": nodes}]
    if package:
        exprs.append({"key": f'.metadata.labels["{keys.STAGE_PACKAGE_LABEL}"]', "operator": "In", "values": [package]})
    if stage:
        exprs.append({"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "In", "values": [stage]})
    return exprs


def failing_stage(name: str, *, nodes: list[str], package: str | None = None, stage: str | None = None,
                  message: str = "injected failure", exit_code: int = 1, delay_ms: int = 0) -> Stage:
    """A test's injected failure: matching package pods on `nodes` fail instead of succeeding."""
    return _stage(
        name,
        "Pod",
        _package_pods(nodes, package, stage),
        {"statusTemplate": _terminated_template("Failed", exit_code, "Error", message)},
        weight=1,
        delay_ms=delay_ms,
        labels={INJECTED_LABEL: "true"},
    )


def slow_stage(name: str, *, nodes: list[str], package: str | None = None, stage: str | None = None,
               seconds: float) -> Stage:
    """A test's injected slowness: matching package pods on `nodes` succeed, but only after `seconds`
    (a stage that is still running when the test acts mid-rollout)."""
    return _stage(
        name,
        "Pod",
        _package_pods(nodes, package, stage),
        {"statusTemplate": _terminated_template("Succeeded", 0, "Completed", "")},
        weight=1,
        delay_ms=int(seconds * 1000),
        labels={INJECTED_LABEL: "true"},
    )
