"""Images on the node before its turn: which nodes pull their round's images ahead, and how many at once
(pure: no I/O).

On a real node most of a stage pod's start is its image pulls (docs/realnodes.md): pulled after the
cordon, they keep the node out of service for nothing. So the operator pulls a node's images while
the node still serves, in a *prepull pod* of its own: pinned to the node (`nodeName`, as stage pods
are), not privileged, one container per image (each package image, then the agent image, by
digest) that does next to nothing and exits. The kubelet pulls each image before it starts its
container, so once the pod succeeded every image of the round is on the node.

Decisions:

* **Only rounds that cordon.** A round without an interrupt never takes the node out of service, and
  its stage pod pulls what it needs as before: prepulling it would load the registry and buy no
  service time.
* **The trigger is the pick order.** The candidates of a gate are, first, its picked nodes whose
  round waits for its images before the cordon (`gate.lifecycle.machine`), then the next `ahead`
  nodes in pick order that wait in line for a reason that clears by itself (a batch running, the
  budget full, queued, outside the window): the nodes the next batches take. Paused, stopped and
  blocked nodes (a higher-priority gate, protected pods) are not pulled for: their turn may be far.
* **A fleet-wide bound.** At most `limit` prepull pods exist at once that have not ended (pending,
  pulling, failing to pull, or being deleted), over every gate: a 1,000-node rollout does not
  stampede the registry. A pod that ended pulls nothing and costs nothing, so it does not count.
* **Picked nodes first.** The slots go to the candidates in order: every gate's picked nodes, then
  the nodes ahead by their place in their gate's line (the first of each gate, then the second, ...),
  so one gate with a long line does not starve another. A candidate that falls out of the first
  `limit` (a picked node needs its slot) loses its pod; it is pulled again when its turn comes back.
  Without this, nodes ahead whose pulls keep failing could hold every slot while the picked nodes,
  which hold budget, wait for one: a rollout that never moves.
* **A pod's name is its (gate, node, images).** Picking a node does not change it, so the pod pulled
  ahead is the one the picked node's round waits for; a spec change (other images) is another pod.
* **Pods go when no candidate needs them**: the round cordoned (it is past the images), the node left
  the line, the images changed. A succeeded pod is kept while its node is a candidate: it is what the
  round reads before its cordon.
* **No pod for images the node has.** A node reports the images it holds in `status.images` (the
  kubelet lists each under every reference it knows it by: `repository@sha256:...` and its tags). A
  candidate whose every image the node reports under the very reference its container names, none
  of them pulled `Always` (a tag with resolution off, or `:latest`), needs no prepull pod: the kubelet
  would start each container of it without a pull, and so will the round's stage pods. It costs a
  pod's create, its status updates and its delete per node, for nothing. The kubelet reports at most
  50 images (its `nodeStatusMaxImages`), the largest first: an image missing from the list may still
  be on the node, and is pulled ahead as before.
* **A failed pull fails the node before any cordon.** A pod whose container waits in a pull error
  fails the picked node's round once `image_pull_grace` has passed since the pod was created (as a
  stage pod's pull does), with reason ImagePullFailed and the kubelet's message naming the image;
  until then the node's state says so (`pull_failing`), hence the gate's ImagePullFailing condition.
  A pod that ended Failed for another reason (evicted, a container that did not exit 0) does not
  hold the round: the stage pods pull what is missing themselves, as without prepull.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState
from gate.lifecycle.fleet import GatePlan
from gate.lifecycle.images import PodImage, PullPolicy, pod_images
from gate.lifecycle.interrupts import merge
from gate.lifecycle.node import PULL_ERRORS, StagePod
from gate.lifecycle.round import round_work

# The wait reasons that clear by themselves as the rollout goes on (`gate.rollout.planner.WaitReason`).
AHEAD_REASONS = frozenset({"batch-running", "budget-full", "queued", "outside-window"})


@dataclass(frozen=True)
class RoundImages:
    """The images a node's next round pulls: each package's with work left, and the agent's."""

    packages: Mapping[str, PodImage]
    agent: str

    @property
    def key(self) -> str:
        return "\0".join([*(f"{n}={i.image}" for n, i in sorted(self.packages.items())), self.agent])

    def on_node(self, present: Collection[str]) -> bool:
        """Every image is on the node, as its `status.images` names (`present`) say, and none is pulled
        `Always`: the round's containers start without a pull, and a prepull pod would pull nothing."""
        wanted = [(i.image, i.pull_policy) for i in self.packages.values()]
        wanted.append((self.agent, default_pull_policy(self.agent)))
        return all(policy != "Always" and image in present for image, policy in wanted)


def repository(reference: str) -> str:
    """An image reference without its tag or digest (a colon before the last slash is a port)."""
    name = reference.partition("@")[0]
    colon = name.rfind(":")
    return name[:colon] if colon > name.rfind("/") else name


def default_pull_policy(reference: str) -> PullPolicy:
    """The kubelet's pull policy for a container that states none: `Always` for `:latest` or no tag."""
    if "@" in reference:
        return "IfNotPresent"
    tag = reference.rpartition("/")[2].partition(":")[2]
    return "IfNotPresent" if tag and tag != "latest" else "Always"


def _none_known(node: str) -> Collection[str]:
    return frozenset()


@dataclass(frozen=True)
class Lookahead:
    """The operator's prepull settings a gate's plan needs (`candidates`), and the image names each
    node reports (`status.images`, as the operator's cache keeps them: `RoundImages.on_node`)."""

    ahead: int
    agent_image: str
    present: Callable[[str], Collection[str]] = field(default=_none_known, compare=False)


@dataclass(frozen=True)
class Candidate:
    """A node whose round's images should be on it before its turn."""

    gate: str
    node: str
    images: RoundImages
    picked: bool  # its round started and waits for the images before its cordon
    place: int = 0  # its place in its gate's line (0: the first node ahead)

    @property
    def pod(self) -> str:
        return prepull_pod_name(self.gate, self.node, self.images)


@dataclass(frozen=True)
class PrepullPod:
    """A prepull pod as the planner needs it."""

    name: str
    gate: str
    ended: bool = False  # it pulls nothing any more (succeeded: every image is on the node)
    deleting: bool = False


PREPULL_STATES = ("pulling", "pulled", "failing", "failed")


def prepull_state(pod: PrepullPod, view: StagePod) -> str:
    """One of PREPULL_STATES: failing while the kubelet cannot pull an image (it keeps trying),
    pulled once it succeeded, failed once it ended otherwise, pulling before that."""
    if view.waiting_reason in PULL_ERRORS:
        return "failing"
    if view.phase == "succeeded":
        return "pulled"
    if pod.ended or view.phase == "failed":
        return "failed"
    return "pulling"


def prepull_counts(pods: Iterable[tuple[PrepullPod, StagePod]], gates: Iterable[str]) -> dict[str, dict[str, int]]:
    """Per gate of `gates`, how many of its prepull pods are in each state, every state present (at 0
    when none is). Pods of other gates (deleted ones, whose pods the garbage collector takes) and pods
    being deleted are not counted."""
    counts = {g: dict.fromkeys(PREPULL_STATES, 0) for g in gates}
    for pod, view in pods:
        if not pod.deleting and pod.gate in counts:
            counts[pod.gate][prepull_state(pod, view)] += 1
    return counts


@dataclass
class PrepullPlan:
    create: list[Candidate] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)


def prepull_pod_name(gate: str, node: str, images: RoundImages) -> str:
    digest = hashlib.sha256(f"{gate}\0{node}\0{images.key}".encode()).hexdigest()
    return f"ng-prepull-{digest[:20]}"


def needs_cordon(gate: NodeGate, state: NodeGateState) -> bool:
    """The node's next (or current, not yet cordoned) round interrupts it: it will be cordoned."""
    work = round_work(gate, state)
    unfinished = state.interrupt if state.phase not in ("idle", "finish") else None
    return merge([unfinished, *(w.interrupt for w in work.values() if not w.done)]).type != "none"


def round_images(gate: NodeGate, state: NodeGateState, agent_image: str, *, resolve: bool) -> RoundImages | None:
    """The images of the node's round, None while a package's image is not resolved yet (no stage pod
    of it starts then either, `gate.lifecycle.images`)."""
    work = round_work(gate, state)
    packages = [n for n in gate.spec.packages if not work[n].done]
    images, missing = pod_images(gate, packages, resolve=resolve)
    if missing:
        return None
    return RoundImages(images, agent_image)


def awaits_images(gate: NodeGate, state: NodeGateState) -> bool:
    """A picked node's round waits for its images: it has not cordoned yet and will."""
    return state.status == "in-progress" and state.phase == "idle" and needs_cordon(gate, state)


def waits_for_images(gate: NodeGate, state: NodeGateState, node: str, lookahead: Lookahead | None, *,
                     resolve: bool) -> bool:
    """Whether a round just picked may wait for its images before its cordon, as the node reconcile
    judges it (`Prepuller.pod_for`): prepull is on, and the node does not report every image of the
    round, or they are not resolved yet (said to wait: the node reconcile decides then)."""
    if lookahead is None or not awaits_images(gate, state):
        return False
    images = round_images(gate, state, lookahead.agent_image, resolve=resolve)
    return images is None or not images.on_node(lookahead.present(node))


def planned_state(gplan: GatePlan, states: Mapping[str, NodeGateState | None], node: str) -> NodeGateState:
    """A node's state for the gate as its plan leaves it: the plan's update (a pick just made) over the
    state as recorded (`states`; None or missing: none yet)."""
    return planned_state_if_any(gplan, states, node) or NodeGateState()


def planned_state_if_any(gplan: GatePlan, states: Mapping[str, NodeGateState | None],
                         node: str) -> NodeGateState | None:
    """`planned_state`, or None for a node with no state yet (a plan over the whole fleet need not build
    an empty one for each)."""
    update = gplan.updates.get(node)
    if update is not None and update.state is not None:
        return update.state
    return states.get(node)


def picked_nodes(gplan: GatePlan) -> list[str]:
    """The gate's nodes in a round once its plan is written: those in progress and those it picks now."""
    return sorted({*gplan.active, *(n for n, u in gplan.updates.items()
                                    if u.state is not None and u.state.status == "in-progress")})


def candidates(gate: NodeGate, gplan: GatePlan, states: Mapping[str, NodeGateState | None], *, ahead: int,
               agent_image: str, resolve: bool) -> list[Candidate]:
    """The gate's candidates, from its plan: its picked nodes that wait for their images, then the
    next `ahead` nodes in its line. `states`: each node's state for the gate as recorded (None: none
    yet); the plan's updates (picks just made) take precedence."""

    def state_of(node: str) -> NodeGateState:
        return planned_state(gplan, states, node)

    out: list[Candidate] = []
    picked = picked_nodes(gplan)
    for node in picked:
        state = state_of(node)
        if state.rollback is not None and not state.rollback.done:
            continue  # a roll-back's images are its revision's; its round does not wait for them
        if awaits_images(gate, state):
            images = round_images(gate, state, agent_image, resolve=resolve)
            if images is not None:
                out.append(Candidate(gate.name, node, images, picked=True))
    if gplan.rollout is None or gate.spec.paused:
        return out
    place = 0
    for node, wait in gplan.rollout.waits.items():  # each compartment's nodes in pick order
        if place >= ahead:
            break
        if wait.reason not in AHEAD_REASONS or node in picked:
            continue
        state = state_of(node)
        if state.status == "failed" or not needs_cordon(gate, state):
            continue
        images = round_images(gate, state, agent_image, resolve=resolve)
        if images is not None:
            out.append(Candidate(gate.name, node, images, picked=False, place=place))
            place += 1
    return out


def plan_prepulls(by_gate: Mapping[str, Sequence[Candidate]], pods: Sequence[PrepullPod], limit: int) -> PrepullPlan:
    """Which prepull pods to create and delete, over every gate. `by_gate`: each gate's candidates, for
    the gates whose candidates are known (a gate not planned yet since the operator started keeps its
    pods, which count against the bound); `pods`: every prepull pod that exists; `limit`: at most this
    many that have not ended exist at once."""
    plan = PrepullPlan()
    existing = {p.name: p for p in pods}
    wanted = sorted((c for cands in by_gate.values() for c in cands),
                    key=lambda c: (not c.picked, c.place, c.gate, c.node))
    needed = [c for c in wanted if not (c.pod in existing and existing[c.pod].ended)]
    slots = {c.pod for c in needed[:max(0, limit)]}
    keep = {c.pod for c in wanted if c.pod in slots or (c.pod in existing and existing[c.pod].ended)}
    for pod in pods:
        if pod.deleting or pod.gate not in by_gate or pod.name in keep:
            continue
        plan.delete.append(pod.name)
    pulling = sum(1 for p in pods if not p.ended)  # being deleted counts until it is gone
    room = limit - pulling
    for cand in needed[:max(0, limit)]:
        if room <= 0:
            break
        if cand.pod in existing:
            continue  # there already (one being deleted is made again once it is gone)
        plan.create.append(cand)
        room -= 1
    return plan


__all__ = ["AHEAD_REASONS", "Candidate", "Lookahead", "PrepullPlan", "PrepullPod", "RoundImages",
           "awaits_images", "candidates", "default_pull_policy", "needs_cordon", "picked_nodes", "plan_prepulls",
           "planned_state", "prepull_pod_name", "repository", "round_images", "waits_for_images"]
