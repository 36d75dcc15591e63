"""Images on the node before its turn (`gate.lifecycle.prepull`) and the round's wait for them
(`gate.lifecycle.machine`), decided without I/O."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gate.api import keys
from gate.api.state import NodeGateState
from gate.lifecycle.fleet import plan_gate
from gate.lifecycle.images import PodImage
from gate.lifecycle.machine import cordon_at_pick, decide
from gate.lifecycle.node import NodeContext, StagePod, Timing
from gate.lifecycle.prepull import (
    Candidate,
    Lookahead,
    PrepullPod,
    RoundImages,
    candidates,
    default_pull_policy,
    needs_cordon,
    plan_prepulls,
    prepull_counts,
    repository,
    round_images,
    waits_for_images,
)
from gate.lifecycle.reconcile import plan_reconcile
from gate.lifecycle.serving import Serving, ServingCatalog
from gate.lifecycle.staging import StagingAhead
from tests.unit.lifecycle.test_fleet import fleet_node
from tests.unit.lifecycle.test_machine import NOW, PKG, ctx, gate, node, started

REBOOT_PKG = {**PKG, "interrupt": {"type": "reboot"}}
AGENT = "registry.example/nodegate@sha256:" + "a" * 64
IMAGES = RoundImages({"k": PodImage("example.com/pkg:1.0.0", "Always")}, AGENT)


def cand(gate_name: str, node: str, *, picked: bool = False, place: int = 0) -> Candidate:
    return Candidate(gate_name, node, IMAGES, picked=picked, place=place)


def pod(c: Candidate, *, ended: bool = False, deleting: bool = False) -> PrepullPod:
    return PrepullPod(c.pod, c.gate, ended=ended, deleting=deleting)


# -- which rounds, which images -----------------------------------------------------------------

def test_only_rounds_that_cordon_pull_ahead() -> None:
    assert needs_cordon(gate({"k": REBOOT_PKG}), NodeGateState())
    assert not needs_cordon(gate({"k": PKG}), NodeGateState())


def test_round_images_are_the_packages_with_work_and_the_agent_pinned_by_digest() -> None:
    g = gate({"k": REBOOT_PKG, "pinned": {**PKG, "image": "example.com/p@sha256:" + "b" * 64}})
    images = round_images(g, NodeGateState(), AGENT, resolve=True)
    assert images is None  # `k` has a tag and no digest record yet: nothing pulls it, as no stage pod would
    images = round_images(g, NodeGateState(), AGENT, resolve=False)
    assert images is not None and images.agent == AGENT
    assert images.packages["pinned"] == PodImage("example.com/p@sha256:" + "b" * 64, "IfNotPresent")
    assert set(images.packages) == {"k", "pinned"}


def test_a_node_that_reports_every_image_by_its_reference_needs_no_prepull() -> None:
    pinned = "example.com/p@sha256:" + "b" * 64
    images = RoundImages({"p": PodImage(pinned, "IfNotPresent")}, AGENT)
    assert images.on_node({pinned, AGENT, "example.com/other:1"})
    assert not images.on_node({pinned})  # the agent's image is not there
    assert not images.on_node({"example.com/p:1.0.0", AGENT})  # a tag says nothing of the digest
    # A tag pulled Always (resolution off) is asked of the registry again by every container: pulled ahead.
    assert not IMAGES.on_node({"example.com/pkg:1.0.0", AGENT})
    tagged_agent = RoundImages({"p": PodImage(pinned, "IfNotPresent")}, "ghcr.io/nodegate/nodegate:0.9.0")
    assert tagged_agent.on_node({pinned, "ghcr.io/nodegate/nodegate:0.9.0"})
    latest_agent = RoundImages({"p": PodImage(pinned, "IfNotPresent")}, "ghcr.io/nodegate/nodegate:latest")
    assert not latest_agent.on_node({pinned, "ghcr.io/nodegate/nodegate:latest"})
    assert [default_pull_policy(r) for r in ("a/b:1", "a/b", "a/b:latest", "host:5000/b", pinned)] == [
        "IfNotPresent", "Always", "Always", "Always", "IfNotPresent"]
    assert [repository(r) for r in ("host:5000/team/b:1", "host:5000/team/b", pinned)] == [
        "host:5000/team/b", "host:5000/team/b", "example.com/p"]


def test_the_pod_name_follows_the_images_not_the_pick() -> None:
    other = RoundImages({"k": PodImage("example.com/pkg:1.1.0", "Always")}, AGENT)
    assert cand("g", "n1").pod == cand("g", "n1", picked=True).pod
    assert cand("g", "n1").pod != Candidate("g", "n1", other, picked=False).pod
    assert cand("g", "n1").pod != cand("g", "n2").pod and cand("g", "n1").pod.startswith("ng-prepull-")


def test_candidates_are_the_picked_nodes_then_the_next_in_pick_order() -> None:
    g = gate({"k": REBOOT_PKG}, interruptionBudget={"count": 2})
    fleet = [fleet_node(f"n{i}") for i in range(8)]
    gplan = plan_gate(g, None, fleet, gates=[g], now=NOW)
    found = candidates(g, gplan, {}, ahead=3, agent_image=AGENT, resolve=False)
    picked = [c.node for c in found if c.picked]
    ahead = [c for c in found if not c.picked]
    assert sorted(picked) == sorted(gplan.active) and len(picked) == 2
    # The next three in line, in the planner's pick order, numbered by place.
    line = [n for n, w in gplan.rollout.waits.items() if w.reason == "queued"]  # type: ignore[union-attr]
    assert [c.node for c in ahead] == line[:3] and [c.place for c in ahead] == [0, 1, 2]


def test_no_candidates_when_rounds_do_not_cordon_or_the_gate_is_paused() -> None:
    fleet = [fleet_node(f"n{i}") for i in range(4)]
    plain = gate({"k": PKG}, interruptionBudget={"count": 1})
    assert candidates(plain, plan_gate(plain, None, fleet, gates=[plain], now=NOW), {}, ahead=5,
                      agent_image=AGENT, resolve=False) == []
    paused = gate({"k": REBOOT_PKG}, interruptionBudget={"count": 1}, paused=True)
    assert candidates(paused, plan_gate(paused, None, fleet, gates=[paused], now=NOW), {}, ahead=5,
                      agent_image=AGENT, resolve=False) == []


def test_a_picked_node_past_its_cordon_is_no_candidate() -> None:
    g = gate({"k": REBOOT_PKG}, interruptionBudget={"count": 1})
    state = started(g).model_copy(update={"phase": "drain"})
    gplan = plan_gate(g, None, [fleet_node("n1", state=state)], gates=[g], now=NOW)
    assert candidates(g, gplan, {"n1": state}, ahead=5, agent_image=AGENT, resolve=False) == []


# -- the fleet-wide bound -------------------------------------------------------------------------

def test_the_bound_counts_every_pod_that_has_not_ended_over_all_gates() -> None:
    a = [cand("a", f"n{i}", place=i) for i in range(5)]
    b = [cand("b", f"m{i}", place=i) for i in range(5)]
    plan = plan_prepulls({"a": a, "b": b}, [pod(a[0]), pod(b[0], ended=True)], limit=3)
    # a0 pulls (1 of 3); b0 ended. Two more, alternating by place: b1 and a1 (place 1), gate a first.
    assert [c.pod for c in plan.create] == [a[1].pod, b[1].pod] and plan.delete == []


def test_picked_nodes_take_slots_first_and_displace_nodes_ahead() -> None:
    ahead = [cand("a", f"n{i}", place=i) for i in range(2)]
    picked = cand("b", "p", picked=True)
    plan = plan_prepulls({"a": ahead, "b": [picked]}, [pod(ahead[0]), pod(ahead[1])], limit=2)
    # The picked node holds budget while it waits: the last node ahead gives up its slot. The picked
    # node's pod comes once that one is gone (a pod being deleted still counts).
    assert plan.delete == [ahead[1].pod] and plan.create == []
    later = plan_prepulls({"a": ahead, "b": [picked]}, [pod(ahead[0])], limit=2)
    assert [c.pod for c in later.create] == [picked.pod]


def test_pods_nobody_needs_go_but_a_gate_not_planned_yet_keeps_its_own() -> None:
    done = cand("a", "n1")
    plan = plan_prepulls({"a": []}, [pod(done, ended=True), PrepullPod("ng-prepull-x", "unplanned")], limit=5)
    assert plan.delete == [done.pod]


def test_a_succeeded_pod_is_kept_while_its_node_waits() -> None:
    c = cand("a", "n1", picked=True)
    plan = plan_prepulls({"a": [c]}, [pod(c, ended=True)], limit=1)
    assert plan.delete == [] and plan.create == []


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 9), st.booleans()), max_size=30, unique=True),
       st.sets(st.integers(0, 29)), st.sets(st.integers(0, 29)), st.integers(0, 6))
def test_never_more_than_the_limit_pull_at_once(raw: list[tuple[str, int, bool]], exist: set[int],
                                                ended: set[int], limit: int) -> None:
    """Whatever exists, creating what the plan says never brings the pods that have not ended above
    the limit (it may be above it already: pods being deleted, a lower limit after a restart)."""
    by_gate: dict[str, list[Candidate]] = {}
    for i, (g, n, picked) in enumerate(raw):
        by_gate.setdefault(g, []).append(cand(g, f"n{n}", picked=picked, place=i))
    flat = [c for cs in by_gate.values() for c in cs]
    pods = [pod(c, ended=i in ended) for i, c in enumerate(flat) if i in exist]
    plan = plan_prepulls(by_gate, pods, limit)
    pulling = sum(1 for p in pods if not p.ended)
    assert len(plan.create) <= max(0, limit - pulling)
    assert not {c.pod for c in plan.create} & {p.name for p in pods}
    assert not set(plan.delete) & {c.pod for c in plan.create}


# -- the round waits for its images before the cordon -----------------------------------------------

def _prepull(phase: Any = "pending", **kw: Any) -> StagePod:
    return StagePod("ng-prepull-x", "stages", phase, created=NOW - timedelta(seconds=5), **kw)


def test_the_cordon_waits_for_the_images() -> None:
    g = gate({"k": REBOOT_PKG})
    for pod_view in (None, _prepull("pending"), _prepull("running")):
        c = ctx(g, started(g))
        c = c.__class__(**{**c.__dict__, "prepull": True, "prepull_pod": pod_view})
        d = decide(c)
        assert not d.node.unschedulable and (d.state is None or d.state.phase == "idle")
        assert d.requeue_after is not None and not d.create_pods


def test_the_cordon_comes_once_the_prepull_pod_ended() -> None:
    g = gate({"k": REBOOT_PKG})
    c = ctx(g, started(g))
    d = decide(c.__class__(**{**c.__dict__, "prepull": True, "prepull_pod": _prepull("succeeded")}))
    assert d.node.unschedulable is True and d.state is not None and d.state.phase == "wait-pods"


def test_a_failing_pull_is_said_then_fails_the_node_uncordoned() -> None:
    g = gate({"k": REBOOT_PKG})
    failing = _prepull(waiting_reason="ImagePullBackOff",
                       message='Back-off pulling image "example.com/pkg:1.0.0"')
    c = ctx(g, started(g))
    d = decide(c.__class__(**{**c.__dict__, "prepull": True, "prepull_pod": failing}))
    assert d.state is not None and d.state.status == "in-progress"
    assert d.state.pull_failing is not None and "example.com/pkg:1.0.0" in d.state.pull_failing
    assert not d.node.unschedulable
    late = c.__class__(**{**c.__dict__, "prepull": True, "prepull_pod": failing,
                          "now": NOW + timedelta(seconds=Timing(image_pull_grace=60).image_pull_grace)})
    d = decide(late)
    assert d.state is not None and d.state.status == "failed" and d.node.unschedulable is None
    assert d.state.failure is not None and d.state.failure.reason == "ImagePullFailed"
    assert d.state.failure.stage == "prepull" and "example.com/pkg:1.0.0" in d.state.failure.message
    assert not d.state.cordoned


def test_without_prepull_or_without_a_cordon_nothing_waits() -> None:
    g = gate({"k": REBOOT_PKG})
    assert decide(ctx(g, started(g))).node.unschedulable is True
    plain = gate({"k": PKG})
    c = ctx(plain, started(plain))
    d = decide(c.__class__(**{**c.__dict__, "prepull": True, "prepull_pod": None}))
    assert [r.kind for r in d.create_pods] == ["stages"]


def test_the_gate_reconcile_plan_names_its_candidates_only_with_prepull_on() -> None:
    g = gate({"k": REBOOT_PKG}, interruptionBudget={"count": 1})
    fleet = [fleet_node(f"n{i}") for i in range(4)]
    args: dict[str, Any] = {"status": {}, "gates": [g], "now": NOW, "resolve_digests": False, "packages_in_use": ()}
    assert plan_reconcile(g, None, fleet, **args).prepull is None
    found = plan_reconcile(g, None, fleet, prepull=Lookahead(2, AGENT), **args).prepull
    assert found is not None and [c.picked for c in found] == [True, False, False]
    assert {c.images.agent for c in found} == {AGENT}


def test_a_pick_that_would_only_cordon_carries_the_cordon_in_its_write_and_a_restart_resumes_at_wait_pods() -> None:
    """The first look of a round that waits for nothing before its cordon rides in the pick's write
    (`cordon_at_pick`): in progress at wait-pods, cordoned with `cordoned-by`, the Cordoned Event. A
    round that waits for its images or its staging, one without an interrupt, and a node someone else
    cordoned keep what the node reconcile does."""
    g = gate({"k": {**REBOOT_PKG, "image": "example.com/pkg@sha256:" + "b" * 64}}, interruptionBudget={"count": 4})
    images = round_images(g, NodeGateState(), AGENT, resolve=False)
    assert images is not None
    names = {i.image for i in images.packages.values()} | {AGENT}
    fleet = [fleet_node("warm"), fleet_node("cold"), fleet_node("theirs", unschedulable=True,
                                                                 annotations={"example.com/cordon": "ops"})]
    args: dict[str, Any] = {"status": {}, "gates": [g], "now": NOW, "resolve_digests": False, "packages_in_use": ()}
    lookahead = Lookahead(2, AGENT, lambda n: names if n != "cold" else set())
    plan = plan_reconcile(g, None, fleet, prepull=lookahead, **args)
    warm, cold, theirs = plan.updates["warm"], plan.updates["cold"], plan.updates["theirs"]
    assert warm.state is not None and warm.state.status == "in-progress" and warm.state.phase == "wait-pods"
    assert warm.state.cordoned and warm.state.interrupt is not None and warm.state.interrupted == ["k"]
    assert (warm.change.status, warm.change.unschedulable, warm.change.cordoned_by) == ("in-progress", True, "g")
    assert [e.reason for e in warm.events] == ["Cordoned"]
    assert cold.state is not None and cold.state.phase == "idle" and cold.change.unschedulable is None
    assert [c.node for c in plan.prepull or [] if c.picked] == ["cold"]  # the folded pick waits for no pull
    # Someone else's cordon is left as it is, and the round does not count it as its own.
    assert theirs.state is not None and theirs.state.phase == "wait-pods" and not theirs.state.cordoned
    assert theirs.change.unschedulable is None and theirs.change.cordoned_by is None and theirs.events == []

    # A restart after the write: the node reconcile resumes at wait-pods, drains, starts the stages, and
    # writes no second cordon.
    after = decide(NodeContext(gate=g, node=node(name="warm", unschedulable=True,
                                                  annotations={keys.CORDONED_BY: "g"}),
                               state=warm.state, stage_pods={}, pods=[], now=NOW, prepull=False))
    assert after.node.unschedulable is None and [e.reason for e in after.events] == ["Drained"]
    assert [r.kind for r in after.create_pods] == ["stages"]

    # Prepull off: nothing waits for images. Staging to do, a paused gate or no interrupt: no fold.
    assert plan_reconcile(g, None, fleet, **args).updates["cold"].state.phase == "wait-pods"  # type: ignore[union-attr]
    staged = plan_reconcile(g, None, fleet, staging=StagingAhead(ServingCatalog(
        {"k": Serving("1.0.0", {"apply": ("write",)})}), 1), **args)
    assert staged.updates["warm"].state.phase == "idle"  # type: ignore[union-attr]
    assert staged.updates["warm"].change.unschedulable is None
    plain = gate({"k": PKG}, interruptionBudget={"count": 4})
    assert {u.state.phase for u in plan_reconcile(plain, None, fleet, **args).updates.values()
            if u.state is not None} == {"idle"}
    picked = started(g)
    paused = gate({"k": REBOOT_PKG}, paused=True)
    assert cordon_at_pick(paused, node(), picked, NOW, images_wait=False, serving=None) is None
    # Images not resolved yet (a tag, digests resolved): said to wait, the node reconcile decides then.
    tagged = gate({"k": REBOOT_PKG})
    assert waits_for_images(tagged, started(tagged), "warm", Lookahead(2, AGENT, lambda _: names), resolve=True)
    assert not waits_for_images(g, picked, "warm", Lookahead(2, AGENT, lambda _: names), resolve=False)
    assert not waits_for_images(g, picked, "cold", None, resolve=False)  # prepull off: nothing is pulled ahead


# -- what the metrics count -------------------------------------------------------------------------

def test_prepull_pods_are_counted_per_gate_and_state_with_every_state_present() -> None:
    pods = [
        (PrepullPod("a1", "a"), _prepull()),
        (PrepullPod("a2", "a"), _prepull(waiting_reason="ImagePullBackOff")),
        (PrepullPod("a3", "a", ended=True), _prepull("succeeded")),
        (PrepullPod("a4", "a", ended=True), _prepull("failed")),
        (PrepullPod("a5", "a", deleting=True), _prepull()),  # on its way out: not counted
        (PrepullPod("b1", "b"), _prepull("running")),
        (PrepullPod("gone1", "gone"), _prepull()),  # a deleted gate's pod, until the collector takes it
    ]
    counts = prepull_counts(pods, ["a", "b", "idle"])
    assert counts == {
        "a": {"pulling": 1, "pulled": 1, "failing": 1, "failed": 1},
        "b": {"pulling": 1, "pulled": 0, "failing": 0, "failed": 0},
        "idle": {"pulling": 0, "pulled": 0, "failing": 0, "failed": 0},
    }
