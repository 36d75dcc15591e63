"""What the invariant checker knows of each object, read the way any observer of the cluster can.

`NodeFacts` is a Node as the invariants see it (cordoned, by whom, held for hand-off, tainted, each
gate's status label and state); `PodFacts` a stage pod (its gate, node, round and kind, when it was
created, whether it still runs) with its `StepFacts` (each step's package, stage, version and
generation, as its annotation and agent container say, and whether it succeeded); `GateFacts` a
NodeGate or its policy as far as compartments and ceilings go. None of it reads the operator's
types or memory: the checker checks the operator.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState, StateParseError, load_state
from gate.controller.pods import GATE_NAME_ANNOTATION, NODE_NAME_ANNOTATION, ROUND_ANNOTATION, STEPS_ANNOTATION
from gate.kube.objects import container_statuses, pod_outcome
from gate.lifecycle import taint
from gate.rollout import CompartmentSpec
from gate.testing.events import resource_version


@dataclass(frozen=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool
    tainted: bool  # carries the readiness taint
    states: Mapping[str, NodeGateState | None]  # by gate; None when the annotation does not parse
    rv: int

    @classmethod
    def of(cls, obj: Obj) -> NodeFacts:
        meta = obj.get("metadata") or {}
        annotations = dict(meta.get("annotations") or {})
        states: dict[str, NodeGateState | None] = {}
        for key, raw in annotations.items():
            gate = keys.gate_of_state_annotation(key)
            if gate is None:
                continue
            try:
                states[gate] = load_state(raw)
            except StateParseError:
                states[gate] = None
        spec = obj.get("spec") or {}
        return cls(
            name=meta["name"], labels=dict(meta.get("labels") or {}), annotations=annotations,
            unschedulable=bool(spec.get("unschedulable")),
            tainted=taint.has_readiness_taint(spec.get("taints") or []),
            states=states, rv=resource_version(obj),
        )

    @property
    def cordoned_by(self) -> str | None:
        return self.annotations.get(keys.CORDONED_BY) or None

    def status(self, gate: str) -> str | None:
        """The gate's status recorded on the node; "unreadable" for a state that does not parse."""
        if gate not in self.states:
            return None
        state = self.states[gate]
        return "unreadable" if state is None else state.status

    @property
    def held_for_hand_off(self) -> bool:
        return self.unschedulable and keys.HELD_BY in self.annotations

    def disrupted_by(self, gate: str) -> bool:
        if self.held_for_hand_off:
            return False
        return self.status(gate) == "in-progress" or (self.unschedulable and self.cordoned_by == gate)

    def requests(self, gate: str) -> bool:
        return keys.reset_annotation(gate) in self.annotations or keys.rerun_annotation(gate) in self.annotations


def _arg(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args[:-1]):
        if arg == flag:
            return args[i + 1]
    return None


def outcome(obj: Obj) -> tuple[bool, bool, set[str]]:
    """(ended, failed, the containers seen terminated with exit code 0) of a stage pod.

    Ended: its phase is Succeeded or Failed, or a container of it ended non-zero (restartPolicy Never:
    none after it runs), or every step's container ended with 0. The kubelet writes the containers'
    ends first and the terminal phase only once it stopped the pod's sandbox; nothing runs in between."""
    succeeded, failed = set(), pod_outcome(obj) == "failed"
    for cs in container_statuses(obj):
        term = (cs.get("state") or {}).get("terminated")
        if term is not None:
            if term.get("exitCode") == 0:
                succeeded.add(str(cs.get("name")))
            else:
                failed = True  # restartPolicy Never: the pod's later steps never run
    steps = {step.container for step in _steps(obj)}
    return pod_outcome(obj) is not None or failed or (bool(steps) and steps <= succeeded), failed, succeeded


@dataclass(frozen=True)
class StepFacts:
    """One step of a stage pod: a package's stage (or the interrupt, `package` None) in its container."""

    package: str | None
    stage: str
    container: str
    version: str | None
    generation: str | None


def _steps(obj: Obj) -> tuple[StepFacts, ...]:
    """The steps of a pod from its `nodegate.io/steps` annotation, versions and generations from the
    args of their containers; none for a pod without a readable annotation."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    args = {c.get("name"): list(c.get("args") or []) for c in [*(spec.get("initContainers") or []),
                                                               *(spec.get("containers") or [])]}
    try:
        wire = json.loads((meta.get("annotations") or {}).get(STEPS_ANNOTATION) or "[]")
        listed = [(package, str(stage), str(container)) for package, stage, _, container in wire]
    except (ValueError, TypeError):
        return ()
    return tuple(StepFacts(package, stage, container, _arg(args.get(container, []), "--version"),
                           _arg(args.get(container, []), "--generation")) for package, stage, container in listed)


@dataclass
class PodFacts:
    """One stage pod (one uid), its steps, and what is known of its lifetime, as revision bounds."""

    uid: str
    name: str
    gate: str
    node: str
    kind: str
    interrupt: str | None
    round: str | None
    steps: tuple[StepFacts, ...]
    created_lo: int  # created after created_lo - 1 ...
    created_hi: int  # ... and at or before created_hi
    ended_lo: int | None = None  # may have ended from here on (None: still running when last known)
    failed_lo: int | None = None  # may have failed from here on
    succeeded: set[str] = field(default_factory=set)  # containers seen terminated with exit code 0

    @classmethod
    def of(cls, obj: Obj, created_lo: int, created_hi: int) -> PodFacts:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        ann = meta.get("annotations") or {}
        return cls(
            uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"), name=meta["name"],
            gate=ann.get(GATE_NAME_ANNOTATION, ""), node=ann.get(NODE_NAME_ANNOTATION, ""),
            kind=labels.get(keys.STAGE_KIND_LABEL, ""), interrupt=labels.get(keys.INTERRUPT_LABEL),
            round=ann.get(ROUND_ANNOTATION), steps=_steps(obj), created_lo=created_lo, created_hi=created_hi,
        )

    def key(self, step: StepFacts) -> tuple[str | None, ...]:
        """What makes two steps the same stage (see the module docstring, invariant 5)."""
        if step.package is None:
            return (self.gate, self.node, step.stage, f"round {self.round}" if self.round else self.name)
        return (self.gate, self.node, step.package, step.version, step.stage, step.generation)

    def running_throughout(self, lo: int, hi: int) -> bool:
        """Certainly running at every revision from lo to hi."""
        return self.created_hi <= lo and (self.ended_lo is None or self.ended_lo > hi)

    def describe(self, step: StepFacts | None = None) -> str:
        if step is not None:
            what = f"{step.package} {step.stage}" if step.package else f"{step.stage} ({self.interrupt})"
            return f"pod {self.name} step {what}"
        if self.kind == "interrupt":
            return f"pod {self.name} (interrupt {self.interrupt})"
        steps = ", ".join(f"{s.package} {s.stage}" for s in self.steps)
        return f"pod {self.name} ({self.kind}: {steps})"


@dataclass
class GateFacts:
    gate: NodeGate
    specs: tuple[CompartmentSpec, ...] | None  # None: its policy is missing or does not parse
    by_name: dict[str, CompartmentSpec]

    @property
    def name(self) -> str:
        return self.gate.name

    @property
    def active(self) -> bool:
        return not self.gate.metadata.deletion_timestamp

    def selects(self, node: NodeFacts) -> bool:
        if not self.active:
            # Being deleted: the removal's nodes are those holding the gate's state, opted out or not,
            # whatever the selector says (gate.lifecycle.removal).
            return self.name in node.states
        return node.labels.get(keys.IGNORE_LABEL) != "true" and self.gate.spec.node_selector.matches(node.labels)
