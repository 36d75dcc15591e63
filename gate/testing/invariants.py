"""NodeGate's safety invariants, judged from the outside: a pure checker, events in, violations out.

The checker reads what any observer of the cluster can read — Nodes, the stage pods in the operator's
namespace (label `app.kubernetes.io/managed-by: nodegate`), NodeGates and DeploymentPolicies — and
never the operator's memory or logs. It computes compartments and ceilings itself from the gate and
policy *specs* and the node labels (with the pure `gate.rollout` functions that define what a
compartment is), and judges every change it is fed. `gate.testing.watcher` feeds it from watches of
its own; unit tests feed it recorded sequences. What it is fed is `gate.testing.events`, what it knows
of each object `gate.testing.facts`, what it reports `gate.testing.findings`.

It counts every pod that carries the stage pod labels, whether or not the operator made it: the
operator reads only the pods it recorded (`gate.lifecycle.ownership`), but what runs on a host runs
there all the same, so a planted pod that runs a step twice or under an uncordon is a finding here.

Definitions (G a gate, N a node, "disrupted", "running" and "step" below):

* N is **disrupted by G** while G's state on N says `in-progress` (the planner reserves budget from
  the moment it picks a node) or N is unschedulable with `nodegate.io/cordoned-by: G` (a cordon
  NodeGate holds, such as a failed node left cordoned), unless N is **held for hand-off**:
  unschedulable with `nodegate.io/held-by` (spec.leaveCordoned), out of service for its validator,
  so a round on it takes nothing from the budget.
* A stage **pod is running** from its creation until it is seen with phase Succeeded or Failed, with
  every step's container terminated with exit code 0 or one container terminated non-zero (the
  kubelet writes the terminal phase only later, once it stopped the sandbox), or deleted. A pod runs
  the phases of a node's round that fit in one boot (its label `nodegate.io/stage` names the phase it
  starts in: `stages`, `interrupt`, `post-interrupt`, `removal`), its steps one after another.
* A **step** is one stage of one package in a pod, as its annotation `nodegate.io/steps` lists them
  (package, stage, container), with the version and generation its agent container is started with
  (`--version`, `--generation`); the interrupt is a step of package none. A step shares its
  pod's lifetime. It **succeeded** when its container was seen terminated with exit code 0; a pod
  **failed** when it was seen in phase Failed or with a container terminated non-zero.

1. `over-ceiling`: whenever a node *becomes* disrupted by G in compartment C, the nodes disrupted by G
   in C number at most C's ceiling: `budget.ceiling(matched)`, matched being the nodes G selects in C
   (not labelled ignore) plus those it still disrupts there. Lowering a budget below what is already
   disrupted is not a violation by itself; starting another node while above it is. The removal of a
   deleted G is judged the same way, its matched nodes being those that hold G's state.
2. `uncordoned-during-stage`: when N goes from unschedulable to schedulable while it carried
   `cordoned-by: G`, no stage pod of G on N (package stages, interrupt or post-interrupt checks) is
   running.
3. `interrupt-uncordoned`: when a pod that holds an interrupt step (its label `nodegate.io/interrupt`:
   a reboot, a service restart) is created on N, N is unschedulable.
4. `taint-lifted-early`: when N loses the readiness taint, every readinessTaint gate that selects N
   (and is not being deleted) is `complete` in the same version of N.
5. `duplicate-stage`: judged per step. Two steps of one stage — the same gate, node, package,
   version, stage and generation; for the interrupt, the same round (`nodegate.io/round`) — run only
   as a **retry**: the later step S2 (in pod P2) is a retry of the last earlier one S1 (in pod P1)
   when P1 had failed before P2 was created and S1 had not succeeded in it (P1 failed at S1, or at an
   earlier step, so S1 never ran to its end), or when a person asked for a rerun on N (`nodegate
   rerun` / `nodegate node reset`: the annotation `rerun.G` or `reset.G` on the node) after P1 was
   created and before P2 was. So a retry pod starting at the failed step is legal; a step that
   succeeded appearing again in a later pod, or twice in one pod, is a duplicate: it really runs
   twice on the host. So is a running pod deleted by hand and created again. One more case is legal:
   the package went elsewhere on N in between (a step of it at another version, or its uninstall,
   succeeded in a pod created after P1 and before P2): a roll-back took the change away, and a
   rollout resumed afterwards makes it again. Staging and unstage pods (kinds `staging`, `unstage`:
   a round's serving steps run before its cordon, and their undo) hold no steps of a stage here: the
   agent records on the host what it staged, the stage in the window skips it, and staging again after
   an undo is the same work made again.
6. `left-cordoned` / `left-tainted` (after convergence, `check_converged`): no node is unschedulable
   with `cordoned-by`; no node carries the readiness taint unless a readinessTaint gate selecting it
   is not complete there. A hold for hand-off has no `cordoned-by`: it outlives rounds and
   convergence by design, until someone uncordons the node.
7. `hold-unasked`: when N gets `held-by: G`, N loses the readiness taint in that very version (one
   write: never a schedulable moment between), G is a readinessTaint gate with leaveCordoned that
   selects N, and N carries no `hand-off-released` (a released node is never held again).

Order. Nodes and pods arrive on separate watches, so the checker needs them merged in the order
etcd applied them: it relies on resourceVersions being etcd revisions of one etcd, comparable across
kinds (true of the dev cluster: one etcd, no `--etcd-servers-overrides`). Events of one kind must
come in order; `watcher.InvariantWatcher` merges the kinds. NodeGates and DeploymentPolicies are specs
and are applied as they come.

Blind windows. A watch that expires (410 Gone) relists, and what happened between its last event and
the list is known only by its end state (`Relist`). The checker never guesses inside such a window:
a pod that ended in it may have ended at its start, a pod that appeared may have been created at its
end, a node transition in it is judged only when it is a violation whichever the order (an uncordon
while a pod ran throughout the window) — otherwise it is counted as unverified. Over-ceiling is
exact there too: a list is a real state of every node at one revision. A pod created and deleted
inside a window is never seen.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from itertools import pairwise

from pydantic import ValidationError

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.rollout import CompartmentSpec, PolicyMismatch, assign_compartment, compartments_of
from gate.testing.events import Blind, Change, Event, Relist, load_event, resource_version
from gate.testing.facts import GateFacts, NodeFacts, PodFacts, StepFacts, outcome
from gate.testing.findings import Coverage, Peak, Violation, ViolationKind

STAGING_KINDS = frozenset({"staging", "unstage"})  # pods outside invariant 5 (gate.lifecycle.staging)


class InvariantChecker:
    """Feed it events in revision order (`feed`); read `violations`, then `finish` and
    `check_converged` at the end of a run."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.coverage = Coverage()
        self.rv = 0
        self.nodes: dict[str, NodeFacts] = {}
        self.pods: dict[str, PodFacts] = {}  # by uid
        self.gates: dict[str, GateFacts] = {}
        self._policies: dict[str, Obj] = {}
        self._gate_objs: dict[str, Obj] = {}
        self._pod_uids: dict[str, str] = {}  # namespace/name -> uid of the current pod of that name
        self._pods_at: dict[tuple[str, str], list[str]] = defaultdict(list)  # (gate, node) -> uids
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
            self.rv = max(self.rv, event.since + 1 if event.resource == "pods" else event.rv)
            if event.resource == "nodes":
                self._node_relist(event)
            elif event.resource == "pods":
                self._pod_relist(event)
            else:
                self._spec_relist(event)
            return
        if event.resource in ("nodes", "pods"):
            self.rv = max(self.rv, event.rv)
        if event.resource == "nodes":
            self.coverage.node_events += 1
            self._node_change(event)
        elif event.resource == "pods":
            self.coverage.pod_events += 1
            self._pod_change(event)
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
            running = [j for j in self._pods_of(holder, new.name) if j.running_throughout(lo, hi)]
            if running:
                self._violate("uncordoned-during-stage", holder, new.name,
                              "uncordoned while " + ", ".join(j.describe() for j in running) + " was running",
                              rv=hi)
            elif not exact and any(j.created_hi <= hi and (j.ended_lo is None or j.ended_lo > lo)
                                   for j in self._pods_of(holder, new.name)):
                self.coverage.unverified += 1
        self._judge_hold(prev, new, exact, hi)
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

    def _judge_hold(self, prev: NodeFacts, new: NodeFacts, exact: bool, rv: int) -> None:
        """Invariant 7: a hold for hand-off appears only where and as spec.leaveCordoned says."""
        holder = new.annotations.get(keys.HELD_BY)
        if holder is None or keys.HELD_BY in prev.annotations:
            return
        if not exact:
            self.coverage.unverified += 1
            return
        why = None
        gate = self.gates.get(holder)
        if keys.HAND_OFF_RELEASED in prev.annotations:
            why = "the node was released from a hold once already"
        elif not (prev.tainted and not new.tainted and new.unschedulable):
            why = "the hold did not come in the write that lifted the readiness taint"
        elif gate is None or not gate.gate.spec.readiness_taint or not gate.gate.spec.leave_cordoned \
                or not gate.selects(new):
            why = "the gate it names does not ask for a hand-off on this node"
        if why is not None:
            self._violate("hold-unasked", holder, new.name, why, rv=rv)

    # -- pods -------------------------------------------------------------------------------------

    def _pods_of(self, gate: str, node: str) -> list[PodFacts]:
        return [self.pods[uid] for uid in self._pods_at.get((gate, node), ())]

    def _register(self, facts: PodFacts, namespaced_name: str) -> None:
        self.pods[facts.uid] = facts
        self._pod_uids[namespaced_name] = facts.uid
        if facts.gate and facts.node:
            self._pods_at[(facts.gate, facts.node)].append(facts.uid)
            self.coverage.pods_seen += 1
            self.coverage.steps_seen += len(facts.steps)

    def _observe(self, facts: PodFacts, obj: Obj, rv: int, *, deleted: bool = False) -> None:
        ended, failed, succeeded = outcome(obj)
        facts.succeeded |= succeeded
        if (ended or deleted) and facts.ended_lo is None:
            facts.ended_lo = rv
        if failed and facts.failed_lo is None:
            facts.failed_lo = rv

    def _pod_change(self, event: Change) -> None:
        obj = event.obj
        meta = obj["metadata"]
        nsname = f"{meta.get('namespace')}/{meta['name']}"
        uid = str(meta.get("uid") or nsname)
        facts = self.pods.get(uid)
        if facts is None:
            facts = PodFacts.of(obj, event.rv, event.rv)
            self._register(facts, nsname)
            if event.type == "ADDED" and facts.gate and facts.interrupt:
                self._judge_interrupt(facts, event.rv)
        self._observe(facts, obj, event.rv, deleted=event.type == "DELETED")
        if event.type == "DELETED":
            self._pod_uids.pop(nsname, None)

    def _judge_interrupt(self, facts: PodFacts, rv: int) -> None:
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

    def _pod_relist(self, event: Relist) -> None:
        lo = event.since + 1
        seen = set()
        for obj in event.objects:
            meta = obj["metadata"]
            nsname = f"{meta.get('namespace')}/{meta['name']}"
            uid = str(meta.get("uid") or nsname)
            seen.add(uid)
            facts = self.pods.get(uid)
            if facts is None:
                facts = PodFacts.of(obj, lo, resource_version(obj))
                self._register(facts, nsname)
            self._observe(facts, obj, lo)
        for uid, facts in self.pods.items():
            if uid not in seen and facts.ended_lo is None:
                facts.ended_lo = lo  # deleted while we were not watching

    # -- end of a run -----------------------------------------------------------------------------

    def finish(self) -> list[Violation]:
        """Judge invariant 5 on the pods seen; returns every violation so far. Call once, at the end."""
        if not self._finished:
            self._finished = True
            self._judge_duplicates()
        return list(self.violations)

    def _judge_duplicates(self) -> None:
        groups: dict[tuple[str | None, ...], list[tuple[PodFacts, int, StepFacts]]] = defaultdict(list)
        for pod in self.pods.values():
            if pod.gate and pod.node and pod.kind not in STAGING_KINDS:
                for i, step in enumerate(pod.steps):
                    groups[pod.key(step)].append((pod, i, step))
        moved = self._package_moves()
        for steps in groups.values():
            steps.sort(key=lambda o: (o[0].created_lo, o[0].created_hi, o[1]))
            for (p1, _, s1), (p2, _, s2) in pairwise(steps):
                asked = self._requests.get((p2.gate, p2.node), [])
                if p1 is p2:
                    why = "twice in one pod"
                elif p1.failed_lo is not None and p1.failed_lo <= p2.created_hi and s1.container not in p1.succeeded:
                    continue  # a retry of a step that failed, or never ran because an earlier one failed
                elif any(lo <= p2.created_hi and hi >= p1.created_lo for lo, hi in asked):
                    continue  # a person asked for it
                elif s1.package is not None and any(
                        p1.created_hi < lo and hi < p2.created_lo and (version != s1.version or stage == "uninstall")
                        for lo, hi, version, stage in moved.get((p2.gate, p2.node, s1.package), [])):
                    continue  # the package went elsewhere in between (a roll-back): this makes the change again
                elif s1.container in p1.succeeded:
                    why = "after it succeeded there, without a rerun request"
                else:
                    why = "without a failure or a rerun request in between"
                self._violate("duplicate-stage", p2.gate, p2.node,
                              f"{p2.describe(s2)} repeats {p1.describe(s1)} (same "
                              f"{'package, version, stage and generation' if s2.package else 'stage and round'}: "
                              f"{p2.key(s2)[2:]}) {why}", rv=p2.created_hi)

    def _package_moves(self) -> dict[tuple[str | None, str | None, str], list[tuple[int, int, str | None, str]]]:
        """(gate, node, package) -> the steps of it that succeeded: their pods' creation bounds, version, stage."""
        out: dict[tuple[str | None, str | None, str], list[tuple[int, int, str | None, str]]] = defaultdict(list)
        for pod in self.pods.values():
            for step in pod.steps if pod.kind not in STAGING_KINDS else ():
                if step.package is not None and step.container in pod.succeeded:
                    out[(pod.gate, pod.node, step.package)].append(
                        (pod.created_lo, pod.created_hi, step.version, step.stage))
        return out

    def converged(self) -> bool:
        """Every node a gate selects is complete for it, and no stage pod is running. (Whether the
        generation was reached is the gate's own Ready condition at observedGeneration to say: a spec
        change that asks for nothing new leaves complete nodes at their older generation.)"""
        for gate in self.gates.values():
            if not gate.active:
                continue
            for node in self.nodes.values():
                if gate.selects(node) and node.status(gate.name) != "complete":
                    return False
        return not any(p.ended_lo is None and p.gate in self.gates for p in self.pods.values())

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
