"""NodeGate's safety invariants, judged from the outside: a pure checker, events in, violations out.

The checker reads what any observer of the cluster can read — Nodes, the stage Jobs in the operator's
namespace, NodeGates and DeploymentPolicies — and never the operator's memory or logs. It computes
compartments and ceilings itself from the gate and policy *specs* and the node labels (with the pure
`gate.rollout` functions that define what a compartment is), and judges every change it is fed.
`gate.testing.watcher` feeds it from watches of its own; unit tests feed it recorded sequences.

Definitions (G a gate, N a node, "disrupted" and "running" below):

* N is **disrupted by G** while G's state on N says `in-progress` (the planner reserves budget from
  the moment it picks a node) or N is unschedulable with `nodegate.io/cordoned-by: G` (a cordon
  NodeGate holds, such as a failed node left cordoned).
* A stage **Job is running** from its creation until it is seen Complete or Failed, or deleted.

1. `over-ceiling`: whenever a node *becomes* disrupted by G in compartment C, the nodes disrupted by G
   in C number at most C's ceiling: `budget.ceiling(matched)`, matched being the nodes G selects in C
   (not labelled ignore) plus those it still disrupts there. Lowering a budget below what is already
   disrupted is not a violation by itself; starting another node while above it is. The removal of a
   deleted G is judged the same way, its matched nodes being those that hold G's state.
2. `uncordoned-during-stage`: when N goes from unschedulable to schedulable while it carried
   `cordoned-by: G`, no stage Job of G on N (package stage, interrupt or post-interrupt check) is
   running.
3. `interrupt-uncordoned`: when an interrupt Job (a reboot, a service restart) is created on N, N is
   unschedulable.
4. `taint-lifted-early`: when N loses the readiness taint, every readinessTaint gate that selects N
   (and is not being deleted) is `complete` in the same version of N.
5. `duplicate-stage`: two Jobs of one stage — the same gate, node, package, version, stage and
   generation (`--version`, `--generation` of the agent); for interrupt Jobs, the same Job name, i.e.
   the same step of the same round — are created only as a **retry**: the later Job J2 is a retry of
   the last earlier one J1 when J1 had failed before J2 was created, or when a person asked for a
   rerun on N (`nodegate rerun` / `nodegate node reset`: the annotation `rerun.G` or `reset.G` on the
   node) after J1 was created and before J2 was. A stage retried inside its Job (the package's
   `retries`, the Job's backoffLimit) creates pods, not Jobs, and is not a second creation. A running
   Job deleted by hand and created again is a duplicate: the stage really runs twice.
6. `left-cordoned` / `left-tainted` (after convergence, `check_converged`): no node is unschedulable
   with `cordoned-by`; no node carries the readiness taint unless a readinessTaint gate selecting it
   is not complete there.

Order. Nodes and Jobs arrive on separate watches, so the checker needs them merged in the order
etcd applied them: it relies on resourceVersions being etcd revisions of one etcd, comparable across
kinds (true of the dev cluster: one etcd, no `--etcd-servers-overrides`). Events of one kind must
come in order; `watcher.InvariantWatcher` merges the kinds. NodeGates and DeploymentPolicies are specs
and are applied as they come.

Blind windows. A watch that expires (410 Gone) relists, and what happened between its last event and
the list is known only by its end state (`Relist`). The checker never guesses inside such a window:
a Job that ended in it may have ended at its start, a Job that appeared may have been created at its
end, a node transition in it is judged only when it is a violation whichever the order (an uncordon
while a Job ran throughout the window) — otherwise it is counted as unverified. Over-ceiling is
exact there too: a list is a real state of every node at one revision. A Job created and deleted
inside a window is never seen.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

from pydantic import ValidationError

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.api.state import NodeGateState, StateParseError, load_state
from gate.controller.jobs import GATE_NAME_ANNOTATION, NODE_NAME_ANNOTATION
from gate.kube.objects import job_outcome
from gate.rollout import CompartmentSpec, PolicyMismatch, assign_compartment, compartments_of

Obj = dict[str, Any]
Resource = Literal["nodes", "jobs", "nodegates", "deploymentpolicies"]
ViolationKind = Literal["over-ceiling", "uncordoned-during-stage", "interrupt-uncordoned", "taint-lifted-early",
                        "duplicate-stage", "left-cordoned", "left-tainted"]
VIOLATION_KINDS: tuple[ViolationKind, ...] = (
    "over-ceiling", "uncordoned-during-stage", "interrupt-uncordoned", "taint-lifted-early", "duplicate-stage",
    "left-cordoned", "left-tainted")


@dataclass(frozen=True)
class Violation:
    kind: ViolationKind
    gate: str
    node: str | None  # None when a compartment as a whole is at fault
    rv: int  # the revision at which it was seen
    message: str

    def __str__(self) -> str:
        where = f" node {self.node}" if self.node else ""
        return f"[{self.kind}] gate {self.gate}{where} at rv {self.rv}: {self.message}"


# -- events ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One watch event: the object as it is after the change, at revision `rv`."""

    resource: Resource
    type: Literal["ADDED", "MODIFIED", "DELETED"]
    obj: Obj
    rv: int


@dataclass(frozen=True)
class Relist:
    """The watch of `resource` lost track after revision `since` and listed again at revision `rv`:
    `objects` is every object at `rv`; what happened in between is known only by its end state."""

    resource: Resource
    objects: list[Obj]
    since: int
    rv: int
    initial: bool = False  # the first list of a watcher: a starting state, not a lost window


@dataclass(frozen=True)
class Blind:
    """From `since`+1 to `until` the node watch is blind (its Relist at `until` follows). Fed at
    `since`+1, so Jobs created in that window are not judged against a node state known to be stale."""

    resource: Resource
    since: int
    until: int


Event = Change | Relist | Blind


def resource_version(obj: Obj) -> int:
    raw = (obj.get("metadata") or {}).get("resourceVersion") or "0"
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"resourceVersion {raw!r} is not an etcd revision; the checker needs one etcd") from exc


def slim(resource: Resource, obj: Obj) -> Obj:
    """Only what the checker reads: keeps a journal of a long run small."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
                                 "deletionTimestamp") if k in meta}
    kept["labels"] = dict(meta.get("labels") or {})
    annotations = meta.get("annotations") or {}
    if resource == "nodes":
        kept["annotations"] = {k: v for k, v in annotations.items() if k.startswith(f"{keys.GROUP}/")}
        spec = obj.get("spec") or {}
        taints = [t for t in spec.get("taints") or [] if t.get("key") == keys.READINESS_TAINT_KEY]
        return {"metadata": kept, "spec": {"unschedulable": bool(spec.get("unschedulable")), "taints": taints}}
    kept["annotations"] = dict(annotations)
    if resource == "jobs":
        containers = ((((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or [{}])
        conditions = [{"type": c.get("type"), "status": c.get("status")}
                      for c in (obj.get("status") or {}).get("conditions") or []]
        return {"metadata": kept, "spec": {"template": {"spec": {"containers": [
            {"args": list(containers[0].get("args") or [])}]}}}, "status": {"conditions": conditions}}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": kept,
            "spec": obj.get("spec") or {}}


def dump_event(event: Event) -> str:
    """One line of a journal (JSON); `load_event` reads it back."""
    if isinstance(event, Change):
        data: Obj = {"t": "change", "resource": event.resource, "type": event.type, "rv": event.rv,
                     "obj": event.obj}
    elif isinstance(event, Relist):
        data = {"t": "relist", "resource": event.resource, "since": event.since, "rv": event.rv,
                "objects": event.objects, "initial": event.initial}
    else:
        data = {"t": "blind", "resource": event.resource, "since": event.since, "until": event.until}
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def load_event(line: str) -> Event:
    data = json.loads(line)
    if data["t"] == "change":
        return Change(data["resource"], data["type"], data["obj"], int(data["rv"]))
    if data["t"] == "relist":
        return Relist(data["resource"], list(data["objects"]), int(data["since"]), int(data["rv"]),
                      bool(data.get("initial")))
    return Blind(data["resource"], int(data["since"]), int(data["until"]))


# -- what the checker knows -----------------------------------------------------------------------


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
            tainted=any(t.get("key") == keys.READINESS_TAINT_KEY for t in spec.get("taints") or []),
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

    def disrupted_by(self, gate: str) -> bool:
        return self.status(gate) == "in-progress" or (self.unschedulable and self.cordoned_by == gate)

    def requests(self, gate: str) -> bool:
        return keys.reset_annotation(gate) in self.annotations or keys.rerun_annotation(gate) in self.annotations


def _arg(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args[:-1]):
        if arg == flag:
            return args[i + 1]
    return None


def _finished(obj: Obj) -> tuple[bool, bool]:
    """(ended, failed) from the Job's terminal conditions."""
    outcome = job_outcome(obj)
    return outcome is not None, outcome == "failed"


@dataclass
class JobFacts:
    """One stage Job (one uid) and what is known of its lifetime, as revision bounds."""

    uid: str
    name: str
    gate: str
    node: str
    package: str | None
    stage: str
    version: str | None
    generation: str | None
    interrupt: str | None
    created_lo: int  # created after created_lo - 1 ...
    created_hi: int  # ... and at or before created_hi
    ended_lo: int | None = None  # may have ended from here on (None: still running when last known)
    failed_lo: int | None = None  # may have failed from here on

    @classmethod
    def of(cls, obj: Obj, created_lo: int, created_hi: int) -> JobFacts:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        ann = meta.get("annotations") or {}
        containers = obj["spec"]["template"]["spec"].get("containers") or [{}]
        args = list(containers[0].get("args") or [])
        return cls(
            uid=str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"), name=meta["name"],
            gate=ann.get(GATE_NAME_ANNOTATION, ""), node=ann.get(NODE_NAME_ANNOTATION, ""),
            package=labels.get(keys.STAGE_PACKAGE_LABEL), stage=labels.get(keys.STAGE_KIND_LABEL, ""),
            version=_arg(args, "--version"), generation=_arg(args, "--generation"),
            interrupt=labels.get(keys.INTERRUPT_LABEL), created_lo=created_lo, created_hi=created_hi,
        )

    @property
    def key(self) -> tuple[str | None, ...]:
        """What makes two Jobs the same stage (see the module docstring, invariant 5)."""
        if self.package is None:
            return (self.gate, self.node, self.stage, self.name)
        return (self.gate, self.node, self.package, self.version, self.stage, self.generation)

    def running_throughout(self, lo: int, hi: int) -> bool:
        """Certainly running at every revision from lo to hi."""
        return self.created_hi <= lo and (self.ended_lo is None or self.ended_lo > hi)

    def describe(self) -> str:
        what = f"{self.package} {self.stage}" if self.package else f"{self.stage} ({self.interrupt})"
        return f"Job {self.name} ({what})"


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
        return node.labels.get(keys.IGNORE_LABEL) != "true" and self.gate.spec.node_selector.matches(dict(node.labels))


@dataclass
class Peak:
    disrupted: int = 0
    ceiling: int = 0
    matched: int = 0


@dataclass
class Coverage:
    """How much each invariant was exercised: a check that never ran proves nothing."""

    node_events: int = 0
    job_events: int = 0
    relists: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    disruptions_judged: int = 0  # nodes becoming disrupted, each judged against its ceiling
    uncordons_judged: int = 0
    interrupts_judged: int = 0
    taint_lifts_judged: int = 0
    jobs_seen: int = 0
    unverified: int = 0  # transitions inside blind windows that could not be judged
    peaks: dict[tuple[str, str], Peak] = field(default_factory=dict)

    def summary(self) -> str:
        relists = ", ".join(f"{k} {v}" for k, v in sorted(self.relists.items())) or "none"
        return (f"{self.node_events} node and {self.job_events} job events; {self.disruptions_judged} disruptions, "
                f"{self.uncordons_judged} uncordons, {self.interrupts_judged} interrupts, "
                f"{self.taint_lifts_judged} taint removals and {self.jobs_seen} Jobs judged; "
                f"relists: {relists}; unverified in blind windows: {self.unverified}")


class InvariantChecker:
    """Feed it events in revision order (`feed`); read `violations`, then `finish` and
    `check_converged` at the end of a run."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.coverage = Coverage()
        self.rv = 0
        self.nodes: dict[str, NodeFacts] = {}
        self.jobs: dict[str, JobFacts] = {}  # by uid
        self.gates: dict[str, GateFacts] = {}
        self._policies: dict[str, Obj] = {}
        self._gate_objs: dict[str, Obj] = {}
        self._job_uids: dict[str, str] = {}  # namespace/name -> uid of the current Job of that name
        self._jobs_at: dict[tuple[str, str], list[str]] = defaultdict(list)  # (gate, node) -> uids
        self._members: dict[str, dict[str, tuple[str, bool]]] = defaultdict(dict)  # gate -> node -> (comp, disr.)
        self._counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])  # (gate, comp) -> [m, d]
        self._blind: list[tuple[int, int]] = []  # node watch blind windows (inclusive)
        self._requests: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
        self._problems: list[str] = []  # specs the checker could not use (reported, never silent)
        self._finished = False

    # -- feeding ----------------------------------------------------------------------------------

    def feed(self, event: Event) -> None:
        if isinstance(event, Blind):
            self._blind.append((event.since + 1, event.until))
            return
        if isinstance(event, Relist):
            if not event.initial:
                self.coverage.relists[event.resource] += 1
            self.rv = max(self.rv, event.since + 1 if event.resource == "jobs" else event.rv)
            if event.resource == "nodes":
                self._node_relist(event)
            elif event.resource == "jobs":
                self._job_relist(event)
            else:
                self._spec_relist(event)
            return
        if event.resource in ("nodes", "jobs"):
            self.rv = max(self.rv, event.rv)
        if event.resource == "nodes":
            self.coverage.node_events += 1
            self._node_change(event)
        elif event.resource == "jobs":
            self.coverage.job_events += 1
            self._job_change(event)
        elif event.resource == "nodegates":
            self._gate_change(event.type, event.obj)
        else:
            self._policy_change(event.type, event.obj)

    def feed_all(self, events: Iterable[Event]) -> InvariantChecker:
        for event in events:
            self.feed(event)
        return self

    def _violate(self, kind: ViolationKind, gate: str, node: str | None, message: str, rv: int | None = None) -> None:
        self.violations.append(Violation(kind, gate, node, self.rv if rv is None else rv, message))

    # -- specs ------------------------------------------------------------------------------------

    def _gate_change(self, type_: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if type_ == "DELETED":
            self._gate_objs.pop(name, None)
            self.gates.pop(name, None)
            self._drop_members(name)
            return
        old = self._gate_objs.get(name)
        meta = obj["metadata"]
        if old is not None and (old["metadata"].get("generation"), bool(old["metadata"].get("deletionTimestamp"))) == (
                meta.get("generation"), bool(meta.get("deletionTimestamp"))):
            return  # a status write: nothing the invariants read changed
        self._gate_objs[name] = obj
        self._load_gate(name)

    def _policy_change(self, type_: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if type_ == "DELETED":
            self._policies.pop(name, None)
        else:
            old = self._policies.get(name)
            if old is not None and old["metadata"].get("generation") == obj["metadata"].get("generation"):
                return
            self._policies[name] = obj
        for gate_name, gate in list(self.gates.items()):
            if gate.gate.spec.deployment_policy == name:
                self._load_gate(gate_name)

    def _spec_relist(self, event: Relist) -> None:
        objs = {o["metadata"]["name"]: o for o in event.objects}
        current = self._gate_objs if event.resource == "nodegates" else self._policies
        for name in [n for n in current if n not in objs]:
            (self._gate_change if event.resource == "nodegates" else self._policy_change)(
                "DELETED", current[name])
        for obj in objs.values():
            (self._gate_change if event.resource == "nodegates" else self._policy_change)("MODIFIED", obj)

    def _load_gate(self, name: str) -> None:
        obj = self._gate_objs[name]
        previous = self.gates.get(name)
        first = previous is None or previous.specs is None  # the first time it can be judged
        try:
            gate = NodeGate.model_validate(obj)
        except ValidationError as exc:
            self._problems.append(f"NodeGate {name} does not parse: {str(exc).splitlines()[0]}")
            self.gates.pop(name, None)
            self._drop_members(name)
            return
        specs: tuple[CompartmentSpec, ...] | None = None
        policy = None
        if gate.spec.deployment_policy:
            raw = self._policies.get(gate.spec.deployment_policy)
            if raw is not None:
                try:
                    policy = DeploymentPolicy.model_validate(raw)
                except ValidationError:
                    policy = None
        try:
            specs = compartments_of(gate, policy)
        except PolicyMismatch:
            specs = None  # the operator plans nothing without its policy: nothing to judge yet
        self.gates[name] = GateFacts(gate, specs, {s.name: s for s in specs or ()})
        self._drop_members(name)
        facts = self.gates[name]
        if specs is None:
            return
        touched = set()
        for node in self.nodes.values():
            member = self._member(facts, node)
            if member is not None:
                self._members[name][node.name] = member
                counts = self._counts[(name, member[0])]
                counts[0] += 1
                counts[1] += member[1]
                touched.add(member[0])
        for comp in touched:
            # A gate judged for the first time (just seen, or its policy just arrived) is judged on what
            # it already disrupts; a changed spec is not (a lowered budget cannot undo disruptions in
            # progress; the next start is judged).
            self._judge_ceiling(facts, comp, None, judge=first)

    def _drop_members(self, gate: str) -> None:
        for comp in {c for c, _ in self._members.pop(gate, {}).values()}:
            self._counts.pop((gate, comp), None)

    # -- nodes ------------------------------------------------------------------------------------

    def _member(self, gate: GateFacts, node: NodeFacts) -> tuple[str, bool] | None:
        disrupted = node.disrupted_by(gate.name)
        if gate.specs is None or not (disrupted or gate.selects(node)):
            return None
        return assign_compartment(gate.specs, node.labels), disrupted

    def _update_members(self, name: str, new: NodeFacts | None) -> list[tuple[GateFacts, str, str]]:
        """Recount the node in every gate; returns (gate, compartment, node) where it became disrupted."""
        started = []
        for gate in self.gates.values():
            if gate.specs is None:
                continue
            members = self._members[gate.name]
            old = members.get(name)
            member = self._member(gate, new) if new is not None else None
            if old == member:
                continue
            if old is not None:
                counts = self._counts[(gate.name, old[0])]
                counts[0] -= 1
                counts[1] -= old[1]
                del members[name]
            if member is not None:
                counts = self._counts[(gate.name, member[0])]
                counts[0] += 1
                counts[1] += member[1]
                members[name] = member
                if member[1] and not (old is not None and old[1] and old[0] == member[0]):
                    started.append((gate, member[0], name))
        return started

    def _judge_ceiling(self, gate: GateFacts, comp: str, node: str | None, *, judge: bool = True) -> None:
        matched, disrupted = self._counts[(gate.name, comp)]
        ceiling = gate.by_name[comp].budget.ceiling(matched)
        peak = self.coverage.peaks.setdefault((gate.name, comp), Peak())
        if disrupted > peak.disrupted:
            peak.disrupted, peak.ceiling, peak.matched = disrupted, ceiling, matched
        if node is not None:
            self.coverage.disruptions_judged += 1
        if disrupted <= ceiling or not judge:
            return
        nodes = sorted(n for n, (c, d) in self._members[gate.name].items() if c == comp and d)
        who = f"{node} became disrupted" if node else "already disrupted when the gate was first seen"
        self._violate("over-ceiling", gate.name, node,
                      f"compartment {comp}: {disrupted} nodes disrupted at once, ceiling {ceiling} of {matched} "
                      f"matched ({who}); disrupted: {', '.join(nodes[:20])}")

    def _node_change(self, event: Change) -> None:
        name = event.obj["metadata"]["name"]
        prev = self.nodes.get(name)
        if event.type == "DELETED":
            self.nodes.pop(name, None)
            self._update_members(name, None)
            return
        new = NodeFacts.of(event.obj)
        self.nodes[name] = new
        if prev is not None:
            self._judge_transition(prev, new, event.rv, event.rv)
        self._note_requests(new, event.rv, event.rv)
        for gate, comp, node in self._update_members(name, new):
            self._judge_ceiling(gate, comp, node)

    def _node_relist(self, event: Relist) -> None:
        fresh = {o["metadata"]["name"]: NodeFacts.of(o) for o in event.objects}
        lo, hi = event.since + 1, event.rv
        for name in [n for n in self.nodes if n not in fresh]:
            del self.nodes[name]
            self._update_members(name, None)
        started = []
        for name, new in fresh.items():
            prev = self.nodes.get(name)
            self.nodes[name] = new
            if prev is not None and prev.rv == new.rv:
                continue
            if prev is not None:
                self._judge_transition(prev, new, lo, hi)
            self._note_requests(new, lo, hi)
            started += self._update_members(name, new)
        # The list is a real state of every node at one revision: a ceiling exceeded here was exceeded.
        # One verdict per compartment: the order of the starts inside the window is unknown.
        judged: dict[tuple[str, str], tuple[GateFacts, list[str]]] = {}
        for gate, comp, node in started:
            judged.setdefault((gate.name, comp), (gate, []))[1].append(node)
        for (_, comp), (gate, nodes) in judged.items():
            self.coverage.disruptions_judged += len(nodes) - 1
            self._judge_ceiling(gate, comp, ", ".join(sorted(nodes)))

    def _note_requests(self, node: NodeFacts, lo: int, hi: int) -> None:
        for gate in self.gates:
            if node.requests(gate):
                self._requests[(gate, node.name)].append((lo, hi))

    def _judge_transition(self, prev: NodeFacts, new: NodeFacts, lo: int, hi: int) -> None:
        exact = lo == hi
        if prev.unschedulable and not new.unschedulable and prev.cordoned_by:
            holder = prev.cordoned_by
            self.coverage.uncordons_judged += 1
            running = [j for j in self._jobs_of(holder, new.name) if j.running_throughout(lo, hi)]
            if running:
                self._violate("uncordoned-during-stage", holder, new.name,
                              "uncordoned while " + ", ".join(j.describe() for j in running) + " was running",
                              rv=hi)
            elif not exact and any(j.created_hi <= hi and (j.ended_lo is None or j.ended_lo > lo)
                                   for j in self._jobs_of(holder, new.name)):
                self.coverage.unverified += 1
        if prev.tainted and not new.tainted:
            if not exact:
                self.coverage.unverified += 1
                return
            self.coverage.taint_lifts_judged += 1
            for gate in self.gates.values():
                if not gate.active or not gate.gate.spec.readiness_taint or not gate.selects(new):
                    continue
                status = new.status(gate.name)
                if status != "complete":
                    self._violate("taint-lifted-early", gate.name, new.name,
                                  f"the readiness taint was removed while the gate's status there is "
                                  f"{status or 'absent (never started)'}", rv=hi)

    # -- jobs -------------------------------------------------------------------------------------

    def _jobs_of(self, gate: str, node: str) -> list[JobFacts]:
        return [self.jobs[uid] for uid in self._jobs_at.get((gate, node), ())]

    def _register(self, facts: JobFacts, namespaced_name: str) -> None:
        self.jobs[facts.uid] = facts
        self._job_uids[namespaced_name] = facts.uid
        if facts.gate and facts.node:
            self._jobs_at[(facts.gate, facts.node)].append(facts.uid)
            self.coverage.jobs_seen += 1

    def _job_change(self, event: Change) -> None:
        obj = event.obj
        meta = obj["metadata"]
        nsname = f"{meta.get('namespace')}/{meta['name']}"
        uid = str(meta.get("uid") or nsname)
        facts = self.jobs.get(uid)
        if facts is None:
            facts = JobFacts.of(obj, event.rv, event.rv)
            self._register(facts, nsname)
            if event.type == "ADDED" and facts.gate and facts.stage == "interrupt":
                self._judge_interrupt(facts, event.rv)
        ended, failed = _finished(obj)
        if (ended or event.type == "DELETED") and facts.ended_lo is None:
            facts.ended_lo = event.rv
        if failed and facts.failed_lo is None:
            facts.failed_lo = event.rv
        if event.type == "DELETED":
            self._job_uids.pop(nsname, None)

    def _judge_interrupt(self, facts: JobFacts, rv: int) -> None:
        if any(lo <= rv <= hi for lo, hi in self._blind):
            self.coverage.unverified += 1
            return
        node = self.nodes.get(facts.node)
        if node is None:
            return
        self.coverage.interrupts_judged += 1
        if not node.unschedulable:
            self._violate("interrupt-uncordoned", facts.gate, facts.node,
                          f"{facts.describe()} was created while the node was schedulable", rv=rv)

    def _job_relist(self, event: Relist) -> None:
        lo = event.since + 1
        seen = set()
        for obj in event.objects:
            meta = obj["metadata"]
            nsname = f"{meta.get('namespace')}/{meta['name']}"
            uid = str(meta.get("uid") or nsname)
            seen.add(uid)
            facts = self.jobs.get(uid)
            if facts is None:
                facts = JobFacts.of(obj, lo, resource_version(obj))
                self._register(facts, nsname)
            ended, failed = _finished(obj)
            if ended and facts.ended_lo is None:
                facts.ended_lo = lo
            if failed and facts.failed_lo is None:
                facts.failed_lo = lo
        for uid, facts in self.jobs.items():
            if uid not in seen and facts.ended_lo is None:
                facts.ended_lo = lo  # deleted while we were not watching

    # -- end of a run -----------------------------------------------------------------------------

    def finish(self) -> list[Violation]:
        """Judge invariant 5 on the Jobs seen; returns every violation so far. Call once, at the end."""
        if not self._finished:
            self._finished = True
            self._judge_duplicates()
        return list(self.violations)

    def _judge_duplicates(self) -> None:
        groups: dict[tuple[str | None, ...], list[JobFacts]] = defaultdict(list)
        for facts in self.jobs.values():
            if facts.gate and facts.node:
                groups[facts.key].append(facts)
        for jobs in groups.values():
            jobs.sort(key=lambda j: (j.created_lo, j.created_hi))
            for first, second in pairwise(jobs):
                if first.failed_lo is not None and first.failed_lo <= second.created_hi:
                    continue  # a retry of a failed stage
                asked = self._requests.get((second.gate, second.node), [])
                if any(lo <= second.created_hi and hi >= first.created_lo for lo, hi in asked):
                    continue  # a person asked for it
                self._violate("duplicate-stage", second.gate, second.node,
                              f"{second.describe()} repeats {first.describe()} (same package, version, stage "
                              f"and generation: {first.key[2:]}) without a failure or a rerun request in between",
                              rv=second.created_hi)

    def converged(self) -> bool:
        """Every node a gate selects is complete for it, and no stage Job is running. (Whether the
        generation was reached is the gate's own Ready condition at observedGeneration to say: a spec
        change that asks for nothing new leaves complete nodes at their older generation.)"""
        for gate in self.gates.values():
            if not gate.active:
                continue
            for node in self.nodes.values():
                if gate.selects(node) and node.status(gate.name) != "complete":
                    return False
        return not any(j.ended_lo is None and j.gate in self.gates for j in self.jobs.values())

    def check_converged(self) -> list[Violation]:
        """Invariant 6 on the state the checker holds now (call it once the rollout converged)."""
        found = []
        for node in self.nodes.values():
            if node.unschedulable and node.cordoned_by:
                found.append(Violation("left-cordoned", node.cordoned_by, node.name, self.rv,
                                       "still cordoned by NodeGate after the rollout converged"))
            if node.tainted:
                readiness = [g for g in self.gates.values()
                             if g.active and g.gate.spec.readiness_taint and g.selects(node)]
                if all(node.status(g.name) == "complete" for g in readiness):
                    names = ", ".join(g.name for g in readiness) or "none selects it"
                    found.append(Violation("left-tainted", readiness[0].name if readiness else "-", node.name,
                                           self.rv, f"still carries the readiness taint though every "
                                           f"readinessTaint gate is complete there ({names})"))
        self.violations.extend(found)
        return found

    @property
    def problems(self) -> list[str]:
        return list(self._problems)

    def unfinished(self) -> dict[str, dict[str, int]]:
        """Per gate, how many selected nodes are in which status (for a run that did not converge)."""
        out: dict[str, dict[str, int]] = {}
        for gate in self.gates.values():
            counts: dict[str, int] = defaultdict(int)
            for node in self.nodes.values():
                if gate.selects(node):
                    counts[node.status(gate.name) or "absent"] += 1
            out[gate.name] = dict(counts)
        return out


def replay(lines: Iterable[str]) -> InvariantChecker:
    """A checker fed with a journal (one `dump_event` line per event)."""
    return InvariantChecker().feed_all(load_event(line) for line in lines if line.strip())
