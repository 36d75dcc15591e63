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

# Every init container of a pod ended well (`$now` is the template's time).
_INIT_CONTAINERS_DONE = """\
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
""" + _INIT_CONTAINERS_DONE + """\
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
{{ end }}
{{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ . | Quote }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""


def _terminated_template(phase: str, exit_code: int, reason: str, message: str, *, init: bool = False) -> str:
    """Status of a pod whose containers all ended: Succeeded or Failed with a termination message.
    With `init`, its init containers are written too, each ended with exit code 0 before them (a pod
    that goes from nothing to its end in one update: a prepull pod on a simulated node)."""
    inits = _INIT_CONTAINERS_DONE if init else ""
    return f"""\
{{{{ $now := Now }}}}
{inits}conditions:
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


# A stage pod's steps run one after another, as the kubelet runs init containers: each status update
# finishes the running init container and starts the next. A payload copy (`payload-<package>`) takes
# no simulated time: it finishes in the update that would start it, so only package steps cost a
# delay. Once every init container finished, the pod's container runs (phase Running).
_STAGE_POD_STEP_TEMPLATE = """\
{{ $now := Now }}
{{ $root := . }}
{{ $n := 0 }}{{ with .spec.initContainers }}{{ $n = len . }}{{ end }}
{{ $cur := -1 }}
{{ with .status }}{{ range $i, $s := .initContainerStatuses }}{{ if and (lt $cur 0) $s.state.running }}{{ $cur = $i }}{{ end }}{{ end }}{{ end }}
{{ $next := $n }}
{{ range $i, $c := .spec.initContainers }}{{ if and (gt $i $cur) (eq $next $n) (not (hasPrefix "payload-" $c.name)) }}{{ $next = $i }}{{ end }}{{ end }}
initContainerStatuses:
{{ range $i, $c := .spec.initContainers }}
- image: {{ $c.image | Quote }}
  name: {{ $c.name | Quote }}
  restartCount: 0
{{ if lt $i $next }}
  ready: true
  started: false
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ else if eq $i $next }}
  ready: false
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ else }}
  ready: false
  started: false
  state:
    waiting:
      reason: PodInitializing
{{ end }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  restartCount: 0
{{ if eq $next $n }}
  ready: true
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ else }}
  ready: false
  started: false
  state:
    waiting:
      reason: PodInitializing
{{ end }}
{{ end }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: {{ if eq $next $n }}"True"{{ else }}"False"{{ end }}
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: {{ if eq $next $n }}"True"{{ else }}"False"{{ end }}
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: {{ if eq $next $n }}"True"{{ else }}"False"{{ end }}
  type: ContainersReady
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: PodScheduled
{{ with NodeIPWith .spec.nodeName }}
hostIP: {{ . | Quote }}
{{ end }}
{{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
podIP: {{ . | Quote }}
{{ end }}
phase: {{ if eq $next $n }}Running{{ else }}Pending{{ end }}
startTime: {{ or $root.status.startTime $now | Quote }}
"""


def _step_failed_template(exit_code: int, message: str) -> str:
    """The running step of a stage pod (init container or the pod's container) fails: the pod Failed,
    the steps after it never started."""
    def statuses(field: str) -> str:
        return f"""\
{field}:
{{{{ range .status.{field} }}}}
- image: {{{{ .image | Quote }}}}
  name: {{{{ .name | Quote }}}}
  restartCount: 0
  ready: false
  started: false
{{{{ if .state.running }}}}
  state:
    terminated:
      exitCode: {exit_code}
      reason: Error
      message: {message!r}
      startedAt: {{{{ .state.running.startedAt | Quote }}}}
      finishedAt: {{{{ $now | Quote }}}}
{{{{ else }}}}
  state:{{{{ YAML .state 2 }}}}
{{{{ end }}}}
{{{{ end }}}}
"""
    return f"""\
{{{{ $now := Now }}}}
{statuses("initContainerStatuses")}{statuses("containerStatuses")}conditions:
- lastTransitionTime: {{{{ $now | Quote }}}}
  status: "False"
  type: Ready
  reason: PodFailed
phase: Failed
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


def _stage_pod(*more: dict[str, Any]) -> list[dict[str, Any]]:
    """A NodeGate stage pod (the operator's label, not a prepull pod's), not being deleted, and `more`."""
    return [_not_deleting(), {"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "Exists"},
            {"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "NotIn", "values": [keys.PREPULL_KIND]},
            *more]


def _running_step() -> str:
    """The name of the running step of a stage pod: its running init container, or its container; the
    first running of a pod whose steps run in turn (they all run, the first in the steps' order has its
    turn, `_IN_TURN_STEP_TEMPLATE`); every running check of checks side by side."""
    return (f'(.metadata.labels["{keys.IN_TURN_LABEL}"] // "") as $turn'
            " | [(.status.initContainerStatuses // [])[], (.status.containerStatuses // [])[]]"
            ' | map(select(.state.running)) | if $turn == "true" then .[:1] else . end | .[].name')


def default_stages(job_seconds: float = 1.0) -> list[Stage]:
    """The kubelet of a simulated node: nodes Ready, pods Running, stage pods' steps one after
    another then Succeeded, deletes done.

    `job_seconds` is how long each package step of a stage pod runs: the simulated time of a package
    stage. Reboot interrupts also give the node a new bootID, as a real reboot would.
    """
    job_ms = int(job_seconds * 1000)
    not_ours = {"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "DoesNotExist"}
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
            [_not_deleting(), not_ours, {"key": ".status.phase", "operator": "DoesNotExist"}],
            {"statusTemplate": _POD_RUNNING_TEMPLATE},
        ),
        _stage(
            "pod-running-pending",
            "Pod",
            [_not_deleting(), not_ours, {"key": ".status.phase", "operator": "In", "values": ["Pending"]}],
            {"statusTemplate": _POD_RUNNING_TEMPLATE},
        ),
        _stage(
            # Other Jobs' pods (a chart's hook, say) succeed as before.
            "job-pod-succeeded",
            "Pod",
            [*_running(), {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]}],
            {"statusTemplate": _terminated_template("Succeeded", 0, "Completed", "")},
            delay_ms=job_ms,
        ),
        _stage(
            "prepull-pod-pulled",
            "Pod",
            [_not_deleting(), {"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "In",
                               "values": [keys.PREPULL_KIND]},
             {"key": ".status.phase", "operator": "NotIn", "values": ["Succeeded", "Failed"]}],
            # A prepull pod's containers only make the kubelet pull their images, then exit. A simulated
            # node has none to pull: its prepull pod succeeds as soon as it is seen. A test that wants a
            # pull to fail injects a stage of its own, of greater weight (test_prepull.py).
            {"statusTemplate": _terminated_template("Succeeded", 0, "Completed", "", init=True)},
        ),
        _stage(
            "stage-pod-start",
            "Pod",
            _stage_pod({"key": ".status.initContainerStatuses", "operator": "DoesNotExist"},
                       {"key": ".status.phase", "operator": "NotIn", "values": ["Running", "Succeeded", "Failed"]}),
            {"statusTemplate": _STAGE_POD_STEP_TEMPLATE},
        ),
        _stage(
            "stage-pod-step",
            "Pod",
            _stage_pod({"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                       {"key": ".status.initContainerStatuses.[].state.running", "operator": "Exists"}),
            {"statusTemplate": _STAGE_POD_STEP_TEMPLATE},
            delay_ms=job_ms,
        ),
        _stage(
            "stage-pod-succeeded",
            "Pod",
            _stage_pod({"key": ".status.phase", "operator": "In", "values": ["Running"]},
                       {"key": f'.metadata.labels["{keys.IN_TURN_LABEL}"]', "operator": "DoesNotExist"}),
            {"statusTemplate": _terminated_template("Succeeded", 0, "Completed", "")},
            delay_ms=job_ms,
        ),
        _stage(
            "stage-pod-in-turn-step",
            "Pod",
            _stage_pod({"key": ".status.phase", "operator": "In", "values": ["Running"]},
                       {"key": f'.metadata.labels["{keys.IN_TURN_LABEL}"]', "operator": "In", "values": ["true"]}),
            {"statusTemplate": _IN_TURN_STEP_TEMPLATE},
            delay_ms=job_ms,
        ),
        _stage(
            # A pod that ended is removed by the API server itself when deleted (its grace period is
            # forced to 0, pkg/registry/core/pod/strategy.go): kwok deleting it again would only earn
            # a 404. A pod still running waits for its "kubelet", as a real one does. kwok deletes by name,
            # without the real kubelet's uid precondition, once per event that matches: its own delete
            # (grace 0) first writes the pod with deletionGracePeriodSeconds 0, and the delete that event
            # started could land on a new pod of the same name (a stage pod made again as soon as the old
            # one went: test_operator_trust saw it twice in a row). A pod at grace 0 the API server
            # removes itself, so that event is not acted on.
            "pod-delete",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"},
             {"key": ".metadata.deletionGracePeriodSeconds == 0", "operator": "NotIn", "values": ["true"]},
             {"key": ".status.phase", "operator": "NotIn", "values": ["Succeeded", "Failed"]}],
            {"delete": True},
        ),
    ]


def reboot_stage(job_seconds: float = 1.0) -> Stage:
    """A stage pod that holds a reboot (its interrupt label) reboots its node when its reboot step runs:
    NotReady with a new bootID, then Ready again. The reboot is the pod's last step, its container: the
    pod is Running only once every step before it (its init containers) ended well, so the node reboots
    then and only then, whatever the pod's kind (the stages' pod that ends with the reboot, or a reboot
    pod of its own; a pod that ends with a reboot keeps its steps in a chain, gate.controller.steporder).

    Weight 1 so it wins over `stage-pod-succeeded` for these pods; the node-ready stage brings the
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
        _stage_pod({"key": ".status.phase", "operator": "In", "values": ["Running"]},
                   {"key": f'.metadata.labels["{keys.INTERRUPT_LABEL}"]', "operator": "In", "values": ["reboot"]}),
        steps=[
            {"apply": {"template": node_patch, "subresource": "status", "type": "merge"}},
            {"patch": {"subresource": "status", "root": "status", "type": "merge",
                       "template": _terminated_template("Succeeded", 0, "Completed", "")}},
        ],
        weight=1,
        delay_ms=int(job_seconds * 1000),
    )


# A running pod whose steps run in turn (gate.controller.steporder.in_turn): its containers all started
# together, and the first still running in the steps' order has its turn. Each update ends that one
# well (the next one's turn comes); the pod succeeds once the last did. The kubelet lists a pod's
# containers by name, kwok as the templates above wrote them: in the pod's order.
_IN_TURN_STEP_TEMPLATE = """\
{{ $now := Now }}
{{ $cur := -1 }}{{ $more := false }}
{{ range $i, $s := .status.containerStatuses }}{{ if $s.state.running }}{{ if lt $cur 0 }}{{ $cur = $i }}{{ else }}{{ $more = true }}{{ end }}{{ end }}{{ end }}
containerStatuses:
{{ range $i, $s := .status.containerStatuses }}
- image: {{ $s.image | Quote }}
  name: {{ $s.name | Quote }}
  restartCount: 0
{{ if eq $i $cur }}
  ready: false
  started: false
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $s.state.running.startedAt | Quote }}
      finishedAt: {{ $now | Quote }}
{{ else }}
  ready: {{ if $s.state.running }}true{{ else }}false{{ end }}
  started: {{ if $s.state.running }}true{{ else }}false{{ end }}
  state:{{ YAML $s.state 2 }}
{{ end }}
{{ end }}
phase: {{ if $more }}Running{{ else }}Succeeded{{ end }}
"""

# The running step ends well: the next starts (an init container's, or in turn), or the pod succeeds (its
# container's).
_STEP_DONE_TEMPLATE = ('{{ if eq .status.phase "Running" }}\n'
                       f'{{{{ if index .metadata.labels "{keys.IN_TURN_LABEL}" }}}}\n'
                       + _IN_TURN_STEP_TEMPLATE + "{{ else }}\n"
                       + _terminated_template("Succeeded", 0, "Completed", "") + "{{ end }}\n"
                       + "{{ else }}\n" + _STAGE_POD_STEP_TEMPLATE + "{{ end }}\n")

_STEP_STAGES = ("uninstall", "upgrade", "apply", "config", "post-interrupt", "post-uninstall")


def _package_pods(nodes: list[str], package: str | None, stage: str | None) -> list[dict[str, Any]]:
    """Selector of the stage pods on `nodes` whose running step is of one package (and one stage, when
    given): steps are containers named `<stage>-<package>` (gate.controller.pods)."""
    exprs: list[dict[str, Any]] = [_not_deleting(), {"key": ".spec.nodeName", "operator": "In", "values": nodes}]
    if package:
        steps = [f"{stage}-{package}"] if stage else [f"{s}-{package}" for s in _STEP_STAGES]
        exprs.append({"key": _running_step(), "operator": "In", "values": steps})
    elif stage == "interrupt":  # the interrupt step, in whichever pod holds it (container `interrupt`)
        exprs.append({"key": _running_step(), "operator": "In", "values": ["interrupt"]})
    elif stage:
        exprs.append({"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "In", "values": [stage]})
        exprs.append({"key": ".status.phase", "operator": "In", "values": ["Running", "Pending"]})
    else:
        exprs.append({"key": _running_step(), "operator": "Exists"})
    return exprs


def failing_stage(name: str, *, nodes: list[str], package: str | None = None, stage: str | None = None,
                  message: str = "injected failure", exit_code: int = 1, delay_ms: int = 0,
                  in_the_round: bool = False) -> Stage:
    """A test's injected failure: the matching step of stage pods on `nodes` fails instead of
    succeeding (the pod fails with it; the steps after it never run). `in_the_round`: only in a round's
    pods, not in a staging or undo pod, as for a failure of a step that is not a serving step (a staging
    pod's container for such a stage runs none of its steps: it only places the payload)."""
    selector = _package_pods(nodes, package, stage)
    if in_the_round:
        selector.append({"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "NotIn",
                         "values": ["staging", "unstage"]})
    return _stage(
        name,
        "Pod",
        selector,
        {"statusTemplate": _step_failed_template(exit_code, message)},
        weight=1,
        delay_ms=delay_ms,
        labels={INJECTED_LABEL: "true"},
    )


def slow_stage(name: str, *, nodes: list[str], package: str | None = None, stage: str | None = None,
               seconds: float) -> Stage:
    """A test's injected slowness: the matching step of stage pods on `nodes` succeeds, but only
    after `seconds` (a stage that is still running when the test acts mid-rollout)."""
    return _stage(
        name,
        "Pod",
        _package_pods(nodes, package, stage),
        {"statusTemplate": _STEP_DONE_TEMPLATE},
        weight=1,
        delay_ms=int(seconds * 1000),
        labels={INJECTED_LABEL: "true"},
    )


def node_down_stage(name: str, *, nodes: list[str]) -> Stage:
    """A test's injected outage: `nodes`, once NotReady, stay NotReady. The default node-ready stage
    would bring a simulated node back at once; this one wins over it (weight 1) and does nothing, so
    the Node keeps whatever else is written to its status meanwhile."""
    return _stage(
        name,
        "Node",
        [{"key": ".metadata.name", "operator": "In", "values": nodes},
         {"key": '.status.conditions.[] | select( .type == "Ready" ) | .status', "operator": "NotIn",
          "values": ["True"]}],
        {},
        weight=1,
        labels={INJECTED_LABEL: "true"},
    )
