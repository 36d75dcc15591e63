"""The node machine's vocabulary: what it reads about a node and what it decides to do there.

The decider (`gate.lifecycle.machine.decide`, and `gate.lifecycle.uninstall.decide_removal` for a
deleted gate) reads a `NodeContext`: the gate, the node (`NodeView`), this gate's state on the node,
its stage pods (`StagePod`, whose containers run `Step`s), the pods on the node (`PodView`) and the
operator's settings (`Timing`). It returns a `Decision`: a new state and the `NodeChange` written with
it in one request, stage pods to create (`PodRequest`) or delete, pods to evict, events
(`EventRequest`), and when to look again. The controller builds the views and performs the decision;
nothing here does I/O.

A stage pod's name is deterministic (`pod_name`): where it starts and the attempt of its first step,
so a crash between creating a pod and recording it never runs a step twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from gate.api import keys
from gate.api.nodegate import Interrupt, NodeGate
from gate.api.policy import Health
from gate.api.state import NodeGateState, Stage
from gate.lifecycle.condition import NodeCondition
from gate.lifecycle.serving import ServingCatalog
from gate.lifecycle.soak import Reading

RunPhase = Literal["pending", "running", "succeeded", "failed"]


# staging and unstage: a round's serving steps before its cordon, and their undo (`gate.lifecycle.staging`).
PodKind = Literal["stages", "interrupt", "post-interrupt", "removal", "staging", "unstage"]
# The kinds of a round's pods, named by the phase each starts in: a pod of the stages (or a removal's
# uninstalls) may hold the interrupt and the checks after it too (`gate.lifecycle.disruption`).
ROUND_KINDS: tuple[PodKind, ...] = ("stages", "removal", "interrupt", "post-interrupt")


@dataclass(frozen=True)
class Step:
    """One stage of one package (or the interrupt, `package` None) as a step of a stage pod.

    `fingerprint` ties the step to the spec it was started for (the version and spec hash, or the
    config hash): a step is recorded only while the spec still asks for exactly it."""

    package: str | None
    stage: Stage
    fingerprint: str = ""
    version: str | None = field(default=None, compare=False)
    previous_version: str | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        """Where its attempts are counted in the state: `package/stage`."""
        return f"{self.package or '-'}/{self.stage}"


@dataclass(frozen=True)
class StagePod:
    """A stage pod as the decider needs it (the controller builds this from the pod)."""

    name: str
    kind: PodKind
    phase: RunPhase  # pending until a container started; running; succeeded or failed once it ended
    steps: tuple[Step, ...] = ()
    done: int = 0  # how many of its steps, from the first, succeeded
    message: str = ""  # why it failed: the failed step's termination message (the agent's summary), or the pod's reason
    waiting_reason: str = ""  # a container's waiting reason (ErrImagePull, ImagePullBackOff, ...)
    waiting_since: datetime | None = None  # since when the pod is stuck in that reason
    created: datetime | None = None
    round: int = 0
    attempt: int = 0  # of its first step
    deadline: float | None = None  # its activeDeadlineSeconds
    # A staging pod's: the node's bootID when its agent ended (its summary), to know a reboot since.
    boot_id: str = ""
    # A staging pod's: the gate generation its agent staged for (`--generation`), None when unknown.
    generation: int | None = None
    deleting: bool = False  # deleted, still stopping (its metadata.deletionTimestamp)
    uid: str = ""  # its metadata.uid and the digest of what it runs: whether it is the operator's
    shape: str = ""  # (`gate.lifecycle.ownership`; the decider only ever sees pods that are)

    @property
    def ended(self) -> bool:
        return self.phase in ("succeeded", "failed")

    @property
    def current_step(self) -> Step | None:
        """The step it is at: the first that has not succeeded (the last, once all have)."""
        return self.steps[min(self.done, len(self.steps) - 1)] if self.steps else None

    @property
    def failed_step(self) -> Step | None:
        """The step it failed in: the first that did not succeed (a pod that failed before any step
        ran, evicted or past its deadline, failed in its first)."""
        if self.phase != "failed" or self.done >= len(self.steps):
            return None
        return self.steps[self.done]


@dataclass(frozen=True)
class PodView:
    namespace: str
    name: str
    labels: Mapping[str, str]
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    daemonset: bool = False
    mirror: bool = False
    empty_dir: bool = False
    deleting: bool = False
    ours: bool = False  # a NodeGate package pod: never evicted

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool
    boot_id: str
    ready: bool
    taints: tuple[tuple[str, str], ...] = ()  # (key, effect)
    conditions: Mapping[str, NodeCondition] = field(default_factory=dict)  # NodeGate's own, by type
    # Every other condition but Ready, by type (node-problem-detector's, DCGM's, ...): the health
    # signals a soak reads (`gate.lifecycle.soak`). Not among what the fleet plans read.
    health_conditions: Mapping[str, NodeCondition] = field(default_factory=dict, compare=False)

    @property
    def cordoned_by(self) -> str | None:
        return self.annotations.get(keys.CORDONED_BY)


@dataclass(frozen=True)
class Timing:
    """Operator settings the decider needs (durations in seconds)."""

    image_pull_grace: float = 120.0  # ErrImagePull/ImagePullBackOff this long -> stage failed
    pending_timeout: float = 600.0  # a stage pod not running after this long -> stage failed
    reboot_timeout: float = 900.0  # no new bootID and Ready after a reboot interrupt -> failed
    # A stage pod still not ended this long past its deadline fails its step: the kubelet ends it at the
    # deadline, but not on a node that is gone or whose kubelet is down.
    deadline_grace: float = 30.0
    poll: float = 5.0  # how often to look again while waiting on pods or drains
    health_poll: float = 15.0  # how often a soaking node's Prometheus query is asked again


@dataclass(frozen=True)
class PodRequest:
    """A stage pod to create; the controller renders the manifest."""

    name: str
    kind: PodKind
    steps: tuple[Step, ...]
    round: int = 0
    attempt: int = 0
    interrupt: Interrupt | None = None  # the interrupt of its interrupt step, when it holds one
    part: Literal["whole", "serving", "undo"] = "whole"  # what of each stage the agent runs (`agent run --part`)
    # Packages whose agent reads the payload its round's staging placed on the host (`agent run --payload-on-host`).
    payload_on_host: frozenset[str] = frozenset()


@dataclass(frozen=True)
class EventRequest:
    target: Literal["gate", "node"]
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class NodeChange:
    """Changes to the Node, written in one request together with the state annotation."""

    unschedulable: bool | None = None
    cordoned_by: str | None = None  # set the annotation to this value
    clear_cordoned_by: bool = False
    add_readiness_taint: bool = False
    remove_readiness_taint: bool = False
    status: keys.NodeStatus | None = None  # the status.<gate> label
    held_by: str | None = None  # a hand-off hold: the held-by annotation, naming the gate that asked
    hand_off_released: str | None = None  # someone uncordoned a held node: drop held-by, record this time

    def empty(self) -> bool:
        return self == NodeChange()


@dataclass
class Decision:
    state: NodeGateState | None = None  # None: leave the annotation as it is
    node: NodeChange = field(default_factory=NodeChange)
    create_pods: list[PodRequest] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    evict: list[tuple[str, str]] = field(default_factory=list)
    events: list[EventRequest] = field(default_factory=list)
    requeue_after: float | None = None
    remove_state: bool = False  # drop the gate's annotation and label (the gate is being deleted)

    @property
    def writes_node(self) -> bool:
        return self.state is not None or not self.node.empty()

    @property
    def records_in_write(self) -> bool:
        """The node write may follow the create of the decision's one stage pod and carry that pod's record
        (`gate.lifecycle.ownership`): one write where there were two. Only a write of the state alone: a
        cordon, a taint or a label must be on the node before any pod of the round runs. Never for a pod that
        holds a reboot: its write records the boot ID the reboot is judged by, which must be there before it
        can happen.
        A crash between the create and the write leaves the pod unrecorded and the ended pods of the step
        before undeleted: the next look decides the same again, and its create adopts the pod it finds."""
        if self.state is None or self.remove_state or not self.node.empty() or len(self.create_pods) != 1:
            return False
        pod = self.create_pods[0]
        return not (pod.interrupt is not None and pod.interrupt.type == "reboot")


@dataclass(frozen=True)
class NodeContext:
    gate: NodeGate
    node: NodeView
    state: NodeGateState
    stage_pods: Mapping[str, StagePod]  # this gate's stage pods on this node, by name
    pods: Sequence[PodView] | None  # pods on the node; None when not loaded (only needed to drain)
    now: datetime
    readiness_clear: bool = True  # every other readinessTaint gate selecting the node is complete
    # The readinessTaint gate selecting the node that asks for a hand-off hold (spec.leaveCordoned):
    # this gate if it asks, else another (`gate.lifecycle.fleet.hold_asked_by`); None: nobody asks.
    hold_asked_by: str | None = None
    timing: Timing = Timing()
    release: bool = True  # removal: a node that uninstalled may be released (its batch was judged)
    health: Health | None = None  # the `health` of the node's compartment (None: no soak)
    reading: Reading | None = None  # the last Prometheus reading for the node, while it soaks
    # The operator pulls a round's images ahead (`gate.lifecycle.prepull`): a round that cordons waits
    # for them first. `prepull_pod` is the node's prepull pod for this round, None while there is none.
    prepull: bool = False
    prepull_pod: StagePod | None = None
    # Stage while serving (`gate.lifecycle.staging`): which packages have serving steps (None: the
    # operator stages nothing), and the node's staging pod for its round, None while there is none.
    serving: ServingCatalog | None = None
    staging_pod: StagePod | None = None


_POD_LABELS: Mapping[str, str] = {"post-interrupt": "post", "post-uninstall": "post"}


def pod_name(gate: str, node: str, round_: int, kind: PodKind, first: Step, attempt: int = 0) -> str:
    """Deterministic: a pod is named by where it starts (its round, kind and first step) and the
    attempt of that step, so a crash between creating a pod and recording it can never run a step
    twice, and a retry (the next attempt) is a new pod."""
    text = f"{gate}\0{node}\0{round_}\0{kind}\0{first.package}\0{first.stage}\0{first.fingerprint}\0{attempt}"
    digest = hashlib.sha256(text.encode()).hexdigest()
    label = _POD_LABELS.get(first.stage, first.stage)
    return f"ng-{label}-{digest[:20]}"


PULL_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
