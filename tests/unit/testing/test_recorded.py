"""The checker on journals recorded by the watcher during real rollouts, as they are and mutated.

`data/rollout-30-nodes.jsonl.gz`: an undisturbed chaos-harness rollout (30 nodes in three
compartments, drains under a PodDisruptionBudget, a reboot per node, readiness-tainted nodes joining
late) on the dev cluster; `data/rollout-30-nodes-disturbed.jsonl.gz`: the same rollout while two
operator replicas were frozen past their lease six times, one failed over, and kube-apiserver and etcd
were restarted (so its watches relisted). Recorded with `python -m bench.chaos.run --nodes 30
--kills 0 --leader-pauses 6 --job-seconds 0.5 --journal-dir DIR` while stages still ran as Jobs, and
converted once to the stage pods they now are: per node, a `stages` pod (apply kernel-params, apply
node-agent, config node-agent), the reboot's `interrupt` pod and a `post-interrupt` pod (both checks),
each created with the phase's first Job, its steps terminating as their Jobs completed, Succeeded with
the last and deleted with the last; node, gate and policy events are as recorded.

Each mutation plants one thing the operator must never do into the legal recording; the checker must
name it, and only it.
"""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gate.api import keys
from gate.api.common import Obj
from gate.testing.events import Change, Event, Relist, load_event
from gate.testing.findings import Violation
from gate.testing.invariants import InvariantChecker

DATA = Path(__file__).parent / "data"


def recording(name: str) -> list[Event]:
    with gzip.open(DATA / f"{name}.jsonl.gz", "rt") as lines:
        return [load_event(line) for line in lines if line.strip()]


def judge(events: list[Event]) -> tuple[InvariantChecker, list[Violation]]:
    checker = InvariantChecker().feed_all(events)
    return checker, checker.finish() + checker.check_converged()


def spread(events: list[Event]) -> list[Event]:
    """Every revision doubled, so a planted event can go between two recorded ones."""
    out: list[Event] = []
    for e in events:
        if isinstance(e, Change):
            out.append(Change(e.resource, e.type, e.obj, e.rv * 2))
        elif isinstance(e, Relist):
            out.append(Relist(e.resource, e.objects, e.since * 2, e.rv * 2, e.initial))
        else:
            out.append(e)
    return out


def gate_name(events: list[Event]) -> str:
    for e in events:
        if isinstance(e, Change) and e.resource == "nodegates":
            return str(e.obj["metadata"]["name"])
    raise AssertionError("no gate in the recording")


def state_of(obj: Obj, gate: str) -> Obj:
    raw = (obj["metadata"].get("annotations") or {}).get(keys.state_annotation(gate))
    return json.loads(raw) if raw else {}


def with_state(obj: Obj, gate: str, **fields: Any) -> Obj:
    obj = copy.deepcopy(obj)
    state = {**state_of(obj, gate), **fields}
    obj["metadata"]["annotations"][keys.state_annotation(gate)] = json.dumps(state)
    return obj


def first(events: list[Event], match: Callable[[Event], bool]) -> int:
    return next(i for i, e in enumerate(events) if match(e))


def kinds(violations: list[Violation]) -> set[str]:
    return {v.kind for v in violations}


# -- as recorded ----------------------------------------------------------------------------------


def test_a_recorded_rollout_of_30_nodes_is_legal_and_exercised_every_check() -> None:
    checker, violations = judge(recording("rollout-30-nodes"))
    assert violations == []
    assert checker.converged()
    cov = checker.coverage
    assert (cov.disruptions_judged, cov.uncordons_judged, cov.interrupts_judged, cov.taint_lifts_judged) == (
        30, 30, 30, 30)
    assert (cov.pods_seen, cov.steps_seen) == (90, 180)  # three pods per node: stages, reboot, checks
    assert {comp: (p.disrupted, p.ceiling) for (_, comp), p in cov.peaks.items()} == {
        "canary": (1, 1), "pool-a": (2, 2), "__default__": (2, 2)}  # the budgets were used, never exceeded


def test_a_recorded_rollout_disturbed_by_frozen_leaders_and_restarts_is_legal_across_its_relists() -> None:
    checker, violations = judge(recording("rollout-30-nodes-disturbed"))
    assert violations == []
    assert checker.converged()
    assert checker.coverage.relists["nodes"] >= 1 and checker.coverage.relists["pods"] >= 1
    assert checker.coverage.uncordons_judged == 30


# -- mutated: one thing the operator must never do ------------------------------------------------


def test_a_stage_pod_planted_again_in_the_recording_is_a_duplicate() -> None:
    events = recording("rollout-30-nodes")
    i = first(events, lambda e: isinstance(e, Change) and e.resource == "pods" and e.type == "ADDED"
              and e.obj["metadata"]["labels"].get(keys.STAGE_KIND_LABEL) == "stages")
    pod = events[i]
    assert isinstance(pod, Change)
    again = copy.deepcopy(pod.obj)
    again["metadata"].update(name=again["metadata"]["name"] + "-again", uid="planted")
    last = max(e.rv for e in events if isinstance(e, Change | Relist))
    again["metadata"]["resourceVersion"] = str(last + 1)
    _, violations = judge([*events, Change("pods", "ADDED", again, last + 1)])
    # each of its three steps ran to its end in the recorded pod: each is a duplicate
    assert [v.kind for v in violations] == ["duplicate-stage"] * 3
    assert {v.node for v in violations} == {pod.obj["metadata"]["annotations"]["nodegate.io/node-name"]}
    assert all("after it succeeded there" in v.message for v in violations)


def test_a_retry_planted_after_a_step_failed_in_the_recording_is_legal_and_one_from_the_first_step_is_not() -> None:
    events = spread(recording("rollout-30-nodes"))
    i = first(events, lambda e: isinstance(e, Change) and e.resource == "pods" and e.type == "MODIFIED"
              and e.obj["metadata"]["labels"].get(keys.STAGE_KIND_LABEL) == "stages"
              and [c["name"] for c in e.obj["status"]["initContainerStatuses"]]
              == ["payload-kernel-params", "apply-kernel-params", "payload-node-agent"])  # the first step done
    seen = events[i]
    assert isinstance(seen, Change)
    failed = copy.deepcopy(seen.obj)  # as if its second step (apply node-agent) had failed here
    failed["status"]["phase"] = "Failed"
    failed["status"]["initContainerStatuses"].append(
        {"name": "apply-node-agent", "state": {"terminated": {"exitCode": 1}}})
    uid = failed["metadata"]["uid"]
    kept = [*events[:i], Change("pods", "MODIFIED", failed, seen.rv + 1)]
    for e in events[i + 1:]:
        if not (isinstance(e, Change) and e.resource == "pods" and e.obj["metadata"]["uid"] == uid):
            kept.append(e)
        elif e.type == "DELETED":  # deleted as it failed
            kept.append(Change("pods", "DELETED", {**e.obj, "status": failed["status"]}, e.rv))
    steps = json.loads(failed["metadata"]["annotations"]["nodegate.io/steps"])
    for name, start in (("retry", 1), ("restart", 0)):  # at the failed step; from the first, done, step
        retry = copy.deepcopy(failed)
        retry["metadata"].update(name=f"{failed['metadata']['name']}-{name}", uid=name,
                                 resourceVersion=str(seen.rv + 3))
        retry["metadata"]["annotations"]["nodegate.io/steps"] = json.dumps(steps[start:])
        retry["status"] = {"phase": "Pending"}
        ended = copy.deepcopy(retry)
        ended["metadata"]["resourceVersion"] = str(seen.rv + 5)
        ended["status"] = {"phase": "Succeeded"}
        planted = [*kept[: i + 1], Change("pods", "ADDED", retry, seen.rv + 3),
                   Change("pods", "MODIFIED", ended, seen.rv + 5), *kept[i + 1:]]
        _, violations = judge(planted)
        if start == 1:
            assert violations == []
        else:
            [v] = violations
            assert v.kind == "duplicate-stage" and "step kernel-params apply" in v.message


def test_a_recording_whose_post_interrupt_checks_never_end_shows_the_uncordon_under_them() -> None:
    events = recording("rollout-30-nodes")
    i = first(events, lambda e: isinstance(e, Change) and e.resource == "pods" and e.type == "ADDED"
              and e.obj["metadata"]["labels"].get(keys.STAGE_KIND_LABEL) == "post-interrupt")
    post = events[i]
    assert isinstance(post, Change)
    uid, node = post.obj["metadata"]["uid"], post.obj["metadata"]["annotations"]["nodegate.io/node-name"]
    # as if the operator had uncordoned without waiting for the check: it never ended before the uncordon
    kept = [e for e in events if not (isinstance(e, Change) and e.resource == "pods" and e.type != "ADDED"
                                      and e.obj["metadata"]["uid"] == uid)]
    checker = InvariantChecker().feed_all(kept)
    violations = checker.finish()
    assert [(v.kind, v.node) for v in violations] == [("uncordoned-during-stage", node)]
    assert not checker.converged()  # the check still runs, as far as the recording now says


def _first_taint_removal(events: list[Event]) -> int:
    tainted: set[str] = set()
    for i, e in enumerate(events):
        if isinstance(e, Change) and e.resource == "nodes":
            name = e.obj["metadata"]["name"]
            if e.obj["spec"]["taints"]:
                tainted.add(name)
            elif name in tainted:
                return i
    raise AssertionError("no taint removal in the recording")


def test_a_readiness_taint_lifted_before_completion_in_the_recording_is_caught() -> None:
    events = recording("rollout-30-nodes")
    gate = gate_name(events)
    i = _first_taint_removal(events)
    lifted = events[i]
    assert isinstance(lifted, Change)
    name = lifted.obj["metadata"]["name"]
    events[i] = Change("nodes", lifted.type, with_state(lifted.obj, gate, status="waiting"), lifted.rv)
    _, violations = judge(events)
    assert {(v.kind, v.node) for v in violations} == {("taint-lifted-early", name)}


def test_a_whole_compartment_started_at_once_in_the_recording_is_over_its_ceiling() -> None:
    events = spread(recording("rollout-30-nodes"))
    gate = gate_name(events)
    pool_a = {e.obj["metadata"]["name"]: e.obj for e in events if isinstance(e, Change) and e.resource == "nodes"
              and e.obj["metadata"]["labels"].get("nodegate.dev/chaos-pool") == "a"}
    i = first(events, lambda e: isinstance(e, Change) and e.resource == "nodes"
              and e.obj["metadata"]["name"] in pool_a
              and state_of(e.obj, gate).get("status") == "in-progress")
    start = events[i]
    assert isinstance(start, Change)
    planted: list[Event] = []
    for name, obj in pool_a.items():
        if name != start.obj["metadata"]["name"]:
            picked = with_state(obj, gate, status="in-progress", batch=1)
            picked["metadata"]["resourceVersion"] = str(start.rv + 1)
            planted.append(Change("nodes", "MODIFIED", picked, start.rv + 1))
    checker = InvariantChecker().feed_all([*events[: i + 1], *planted])
    violations = checker.finish()
    assert violations and kinds(violations) == {"over-ceiling"}
    assert all("compartment pool-a" in v.message for v in violations)
    assert checker.coverage.peaks[(gate, "pool-a")].disrupted == len(pool_a)
