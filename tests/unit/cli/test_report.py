"""`nodegate status` from a snapshot: counts, nodes in progress, failures and their reasons, waits."""

from __future__ import annotations

from datetime import timedelta

from gate.api import keys
from gate.api.state import failure_message
from gate.cli.report import Snapshot, build_reports
from tests.unit.cli.builders import (
    NOW,
    PKG,
    agent_summary,
    compartment,
    complete,
    failed,
    gate,
    node,
    policy,
    running,
    stage_pod,
)


def _one(snapshot: Snapshot, name: str = "g"):  # type: ignore[no-untyped-def]
    [report] = build_reports(snapshot, NOW, [name])
    return report


def test_counts_sections_and_wait_reasons_of_a_rollout_in_the_middle_of_a_batch() -> None:
    g = gate(interruptionBudget={"count": 2})
    nodes = [
        node("n1", states={"g": complete()}),
        node("n2", states={"g": running()}),
        node("n3", states={"g": failed(message=agent_summary("install", 1, "disk full"))}),
        node("n4"), node("n5"), node("n6"),
        node("ignored", labels={keys.IGNORE_LABEL: "true"}),
        node("elsewhere", labels={"pool": "other"}),
    ]
    report = _one(Snapshot([g], {}, nodes, [stage_pod("g", "n2", [("pkg", "apply")], ["running"])]))

    [c] = report.compartments
    assert (c.name, c.matched, c.complete, c.in_progress, c.failed, c.waiting, c.ceiling) == (
        "__default__", 6, 1, 1, 1, 3, 2)
    [active] = report.active
    assert (active.name, active.phase, active.running, active.seconds) == ("n2", "stages", ("pkg apply",), 42.0)
    assert active.doing == "running stages: pkg apply"
    [bad] = report.failed
    assert (bad.name, bad.where, bad.reason, bad.message) == ("n3", "pkg apply", "StageFailed",
                                                              "step install exited 1: disk full")
    [wait] = report.waits
    assert (wait.reason, wait.nodes) == ("batch-running", ("n4", "n5", "n6"))
    assert wait.message == "waits for batch 1 of __default__ to finish"
    assert report.notes == () and (report.matched, report.complete) == (6, 1)
    assert "ignored" not in report.node_states and "elsewhere" not in report.node_states


def test_a_stopped_compartment_says_so_names_the_resume_command_and_keeps_its_failed_node() -> None:
    p = policy("p", compartment("main", "main", {"count": 2}, {"fixed": {"initialBatch": 1, "failureThreshold": 1}}))
    status = {"observedGeneration": 1, "status": "Degraded",
              "conditions": [{"type": "Degraded", "status": "True", "reason": "CompartmentStopped",
                              "message": "1 nodes failed; compartments stopped: main"}],
              "compartments": [{"name": "main", "matched": 3, "ceiling": 2, "inProgress": 1, "complete": 1,
                                "failed": 1, "batch": 3, "batchSize": 1, "consecutiveFailures": 1,
                                "state": "stopped"}]}
    g = gate(deploymentPolicy="p", status=status)
    nodes = [node("m1", labels={"tier": "main"}, states={"g": complete(1, "main")}),
             node("m2", labels={"tier": "main"}, states={"g": failed(2, cordoned=True, message="boom")},
                  unschedulable=True),
             node("m3", labels={"tier": "main"})]
    report = _one(Snapshot([g], {"p": p}, nodes))

    [main] = report.compartments  # the policy's empty __default__ is left out
    assert (main.name, main.state, main.complete, main.failed, main.waiting) == ("main", "stopped", 1, 1, 1)
    [bad] = report.failed
    assert bad.cordoned and bad.message == "boom"
    [wait] = report.waits
    assert wait.reason == "stopped" and wait.nodes == ("m3",) and "nodegate resume g" in wait.message
    assert report.summary == "Degraded"
    assert "degraded: 1 nodes failed; compartments stopped: main" in report.notes


def test_a_drain_blocked_by_a_disruption_budget_shows_the_blocking_pod_and_a_drain_timeout_its_message() -> None:
    pdb = "pod default/web-0: Cannot evict pod as it would violate the pod's disruption budget."
    nodes = [node("n1", states={"g": running(phase="drain", drain_blocked_by=pdb)}),
             node("n2", states={"g": failed(reason="DrainTimeout", package=None, stage="drain",
                                            message=f"drain did not finish within 15m; blocked by {pdb}")})]
    report = _one(Snapshot([gate()], {}, nodes))

    assert report.active[0].doing == f"draining (blocked by {pdb})"
    [bad] = report.failed
    assert (bad.where, bad.reason) == ("drain", "DrainTimeout") and bad.message.endswith(pdb)


def test_a_reboot_in_progress_shows_the_interrupt_pod_and_ended_or_foreign_pods_do_not_show() -> None:
    nodes = [node("n1", states={"g": running(phase="interrupt")})]
    pods = [stage_pod("g", "n1", [(None, "interrupt")], ["running"], kind="interrupt", interrupt="reboot"),
            stage_pod("g", "n1", [("pkg", "apply")], ["done"]),
            stage_pod("other", "n1", [("pkg", "config")], ["running"])]
    report = _one(Snapshot([gate()], {}, nodes, pods))

    assert report.active[0].running == ("reboot",)
    assert report.active[0].doing == "interrupting: reboot"


def test_a_stage_pod_shows_the_step_it_runs_now_the_first_whose_container_has_not_terminated() -> None:
    packages = {"a": PKG, "b": PKG}
    nodes = [node(f"n{i}", states={"g": running()}) for i in (1, 2, 3)]
    steps: list[tuple[str | None, str]] = [("a", "apply"), ("a", "config"), ("b", "apply")]
    pods = [stage_pod("g", "n1", steps, ["done", "running"], packages=packages),
            stage_pod("g", "n2", steps, ["done", "done"], packages=packages),  # the next one is starting
            stage_pod("g", "n3", steps, ["done", "failed"], packages=packages)]  # ended: runs nothing
    report = _one(Snapshot([gate(packages=packages)], {}, nodes, pods))

    assert {a.name: a.running for a in report.active} == {"n1": ("a config",), "n2": ("b apply",), "n3": ()}
    assert report.active[0].doing == "running stages: a config"


def test_a_paused_gate_explains_why_nothing_starts() -> None:
    report = _one(Snapshot([gate(paused=True)], {}, [node("n1"), node("n2")]))

    [wait] = report.waits
    assert (wait.reason, wait.message, wait.nodes) == ("paused", "gate g is paused", ("n1", "n2"))
    assert report.paused and report.summary == "Paused"


def test_nodes_the_operator_is_about_to_start_count_as_in_progress_and_say_which_batch() -> None:
    report = _one(Snapshot([gate(status={})], {}, [node("n1"), node("n2"), node("n3")]))

    [c] = report.compartments
    assert c.in_progress == 3 and c.waiting == 0  # no budget: 100% of the nodes in the first batch
    [wait] = report.waits
    assert wait.reason == "starting" and "batch 1" in wait.message
    assert report.notes == ("the operator has not reported on this gate yet (is it running?)",)


def test_the_status_the_crd_defaults_before_the_operator_writes_one_reads_as_not_reported() -> None:
    report = _one(Snapshot([gate(status={"observedGeneration": 0})], {}, [node("n1")]))
    assert report.notes == ("the operator has not reported on this gate yet (is it running?)",)


def test_a_higher_priority_gate_that_is_not_complete_blocks_the_node_and_is_named() -> None:
    first = gate("first", priority=100)
    nodes = [node("n1", states={"first": running()})]
    report = _one(Snapshot([first, gate(priority=200)], {}, nodes))

    [wait] = report.waits
    assert wait.reason == "priority" and "first" in wait.message
    assert report.node_states["n1"] == "blocked"


def test_a_closed_window_is_a_note_and_the_reason_nodes_wait() -> None:
    p = policy("p", windows=[{"days": ["Sat"], "start": "01:00", "end": "05:00", "timeZone": "UTC"}])
    report = _one(Snapshot([gate(deploymentPolicy="p", status={"observedGeneration": 1})], {"p": p}, [node("n1")]))

    assert report.waits[0].reason == "outside-window"
    assert any("maintenance window" in note for note in report.notes)


def test_a_missing_policy_is_reported_and_the_nodes_already_held_still_show() -> None:
    nodes = [node("n1", states={"g": failed(message="boom")}), node("n2")]
    report = _one(Snapshot([gate(deploymentPolicy="gone")], {}, nodes))

    assert report.notes[0].startswith("DeploymentPolicy gone does not exist")
    assert [f.name for f in report.failed] == ["n1"] and report.compartments == ()


def test_an_operator_behind_the_spec_and_an_unreadable_state_are_reported() -> None:
    g = gate(generation=3, status={"observedGeneration": 2})
    report = _one(Snapshot([g], {}, [node("n1", states={"g": "{not json"})]))

    assert "the operator has not acted on generation 3 yet (last seen: 2)" in report.notes
    [bad] = report.failed
    assert bad.reason == "StateCorrupt" and "nodegate node reset n1" in bad.message


def test_reports_come_in_the_order_asked_and_an_object_that_does_not_parse_is_named() -> None:
    broken = gate("broken")
    broken["spec"]["priority"] = 0  # below the minimum: the model refuses it
    reports = build_reports(Snapshot([gate("b"), gate("a"), broken], {}, []), NOW)

    assert [r.name for r in reports] == ["a", "b", "broken"]
    assert reports[2].notes[0].startswith("the object does not parse")
    assert [r.name for r in build_reports(Snapshot([gate("b"), gate("a")], {}, []), NOW, ["b"])] == ["b"]


def test_the_time_in_a_phase_is_measured_from_phase_since() -> None:
    nodes = [node("n1", states={"g": running(since=timedelta(minutes=3))})]
    assert _one(Snapshot([gate()], {}, nodes)).active[0].seconds == 180.0


def test_failure_message_reads_the_agents_summary_and_leaves_anything_else_alone() -> None:
    assert failure_message(agent_summary("reserve", 2, "no memory")) == "step reserve exited 2: no memory"
    assert failure_message('{"ok": false, "exitCode": 1, "message": ""}') == "exited 1"
    assert failure_message('{"failedStep": "x", "exitCode": null, "message": "gone"}') == "step x failed: gone"
    assert failure_message("BackoffLimitExceeded: Job has reached the specified backoff limit") == (
        "BackoffLimitExceeded: Job has reached the specified backoff limit")
    assert failure_message("{truncated") == "{truncated"
    long = "\n".join(f"line {i}" for i in range(100))
    assert failure_message(agent_summary("s", 1, long)) == "step s exited 1: line 99"


def test_image_signatures_that_hold_or_only_warn_are_shown() -> None:
    """`nodegate status` shows a gate held by the image signature policy (its Degraded message names the
    package, image, digest and rule) and, in warn mode, the failure it lets run."""
    held_message = (f"package pkg: image r.example/pkg:1.0.0 (digest sha256:{'1' * 64}, rule team): "
                    "SignatureMissing. No node of this gate is cordoned and no stage pod starts until its images "
                    "verify")
    held = {"observedGeneration": 1, "status": "Degraded", "conditions": [
        {"type": "ImagesVerified", "status": "False", "reason": "SignatureMissing", "message": held_message},
        {"type": "Degraded", "status": "True", "reason": "SignatureMissing", "message": held_message}]}
    report = _one(Snapshot([gate(status=held)], {}, [node("n1")]))
    assert f"degraded: {held_message}" in report.notes and report.summary == "Degraded"
    warn = {"observedGeneration": 1, "status": "Ready", "conditions": [
        {"type": "ImagesVerified", "status": "True", "reason": "SignatureMissing",
         "message": "warn mode: package pkg: image r.example/pkg:1.0.0 ... The images run anyway"}]}
    report = _one(Snapshot([gate(status=warn)], {}, [node("n1")]))
    assert any(n.startswith("image signatures (SignatureMissing): warn mode: package pkg") for n in report.notes)
    verified = {"observedGeneration": 1, "status": "Ready", "conditions": [
        {"type": "ImagesVerified", "status": "True", "reason": "Verified", "message": "1 package image(s) verified"}]}
    assert not any("image signatures" in n for n in _one(Snapshot([gate(status=verified)], {}, [node("n1")])).notes)
