"""The demo's story rests on two facts about its manifests (the pool sizes and where the failure lands),
and its summary states only what the cluster shows."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from gate.api.nodegate import NodeGate
from gate.api.policy import DeploymentPolicy
from gate.cli.demo_evidence import Evidence, PodLedger, summary_lines
from gate.cli.demo_settings import DEMO_LABEL, FAILING_POOL, POOL_LABEL, failing_node, manifest, pool_sizes
from gate.cli.errors import CliError
from gate.rollout import NodeSnapshot, simulate


def test_sixty_nodes_make_a_small_canary_and_two_even_pools() -> None:
    assert pool_sizes(60) == {"canary": 4, "pool-a": 28, "pool-b": 28}
    assert pool_sizes(12) == {"canary": 2, "pool-a": 5, "pool-b": 5}
    with pytest.raises(CliError):
        pool_sizes(5)


@pytest.mark.parametrize("nodes", [12, 60, 200])
def test_the_planted_failure_lands_in_the_second_batch_of_its_pool(nodes: int) -> None:
    gate = NodeGate.model_validate(manifest("gate.yaml"))
    policy = DeploymentPolicy.model_validate(manifest("policy.yaml"))
    snapshots = [NodeSnapshot(f"{pool}-{i}", {DEMO_LABEL: "true", POOL_LABEL: pool})
                 for pool, count in pool_sizes(nodes).items() for i in range(count)]
    pool = [s.name for s in snapshots if s.labels[POOL_LABEL] == FAILING_POOL]
    bad = failing_node(pool)

    [batches] = [c.batches for c in simulate(gate, policy, snapshots).compartments if c.name == FAILING_POOL]
    assert bad in batches[1].nodes, "the first batch must succeed and the second fail"
    assert all(len(c.batches) > 1 for c in simulate(gate, policy, snapshots).compartments if c.matched)


def test_the_bad_spec_differs_from_the_good_one_only_in_the_image_tag() -> None:
    bad, good = manifest("bad-gate.yaml"), manifest("gate.yaml")
    image = bad["spec"]["packages"]["sysctl-tuning"]["image"]
    assert image == good["spec"]["packages"]["sysctl-tuning"]["image"] + ":2.0.0"
    assert bad["metadata"]["name"] == good["metadata"]["name"]


# -- the summary states what the cluster shows, and only that --------------------------------------

WANTED = {"sysctl-tuning": "1.0.0", "grub-cmdline": "1.0.0"}
ALL_STEPS = frozenset({"Cordoned", "Drained", "Interrupting", "Rebooted", "Uncordoned", "Complete"})


def _report(nodes: list[str], complete: int, failed: tuple[object, ...] = ()) -> SimpleNamespace:
    return SimpleNamespace(summary="Ready" if complete == len(nodes) else "Degraded", complete=complete,
                           matched=len(nodes), failed=failed, compartments=("canary", "pool-a", "pool-b"),
                           node_states={n: "complete" for n in nodes})


def _evidence(**changes: Any) -> Evidence:
    nodes = ["canary-0", "pool-a-0", "pool-b-0"]
    ev = Evidence(node_reasons={n: ALL_STEPS for n in nodes}, installed={n: dict(WANTED) for n in nodes},
                  cordoned=(), gate_reasons={"BatchSucceeded": 3, "BatchFailed": 1, "CompartmentStopped": 1,
                                             "Resumed": 1},
                  gate_warnings=(("BatchFailed", "Compartment pool-b: batch 2 failed (0/1 nodes)"),
                                 ("Resumed", "A person resumed the rollout")),
                  pods={"stages": 4, "interrupt": 3, "post-interrupt": 3},
                  steps={"apply": 7, "interrupt": 3, "post-interrupt": 6}, steps_failed=1, wanted=WANTED)
    return replace(ev, **changes)


def test_a_summary_of_a_clean_finish_states_each_step_as_counted() -> None:
    ev = _evidence()
    lines = summary_lines(_report(sorted(ev.node_reasons), 3), ev, "pool-b-0")
    assert lines[:7] == [
        "NodeGate host-tuning: Ready, 3 of 3 nodes complete.",
        "4 batches across 3 compartments, 1 failed (the gate's Events).",
        "Every node (3) was cordoned, drained, rebooted (a new boot ID) and uncordoned, by the operator's "
        "Events on the nodes.",
        "Cordoned now: none.",
        "3 of 3 nodes record all 2 packages installed at the gate's versions in their state annotation "
        "(grub-cmdline 1.0.0, sysctl-tuning 1.0.0).",
        "10 stage pods ran 16 steps (7 apply, 3 interrupt, 6 post-interrupt check); 1 failed (a watch of the "
        "stage pods).",
        "3 interrupt steps for 3 nodes: the packages' interrupts were merged into one reboot per node.",
    ]
    assert "The planted failure on pool-b-0 stopped pool-b after 1 failed batch; a rerun and a resume " \
           "finished it." in lines
    assert any("Resumed" in line and "A person resumed the rollout" in line for line in lines)


def test_staging_and_undo_pods_are_told_apart_from_the_windows_stage_pods() -> None:
    ev = _evidence(pods={"stages": 4, "interrupt": 3, "post-interrupt": 3, "staging": 4, "unstage": 1})
    lines = summary_lines(_report(sorted(ev.node_reasons), 3), ev, "pool-b-0")
    assert "10 stage pods ran 16 steps (7 apply, 3 interrupt, 6 post-interrupt check); 1 failed (a watch of the " \
           "stage pods)." in lines
    assert "4 staging pods ran the serving steps on nodes still serving, before their cordon; 1 undo pods took " \
           "back what was staged for a node not interrupted." in lines
    assert not any("staging pods" in line for line in summary_lines(_report(sorted(ev.node_reasons), 3),
                                                                      _evidence(), "pool-b-0"))
    # Nodes whose stages were staged whole ran no container for them in the window: said, counted by Event.
    whole = _evidence(node_reasons={**ev.node_reasons, "pool-a-0": ALL_STEPS | {"StagedWhole"}})
    lines = summary_lines(_report(sorted(whole.node_reasons), 3), whole, "pool-b-0")
    assert "On 1 of 3 nodes stages staged whole ran no container in the window (Event StagedWhole): their " \
           "checks after the reboot took them over." in lines
    assert not any("staged whole" in line for line in summary_lines(_report(sorted(ev.node_reasons), 3), ev,
                                                                      "pool-b-0"))


def test_a_summary_claims_nothing_the_cluster_does_not_show() -> None:
    ev = _evidence(node_reasons={"canary-0": ALL_STEPS, "pool-a-0": ALL_STEPS - {"Rebooted"},
                                 "pool-b-0": ALL_STEPS - {"Uncordoned"}},
                   installed={"canary-0": dict(WANTED), "pool-a-0": {"sysctl-tuning": "1.0.0"}, "pool-b-0": {}},
                   cordoned=("pool-b-0",), pods={}, steps={}, gate_reasons={"BatchSucceeded": 2})
    lines = summary_lines(_report(sorted(ev.node_reasons), 1), ev, "pool-b-0")
    text = "\n".join(lines)
    assert "Every node" not in text and "merged into one reboot" not in text and "finished it" not in text
    assert ("The operator's Events on the nodes: 3 of 3 cordoned, 3 of 3 drained, 2 of 3 rebooted (a new boot "
            "ID), 2 of 3 uncordoned.") in lines
    assert "Cordoned now: pool-b-0." in lines
    assert lines[4].startswith("1 of 3 nodes record all 2 packages")
    assert "The watch of the operator's namespace saw no stage pod: no count of steps run." in lines
    assert "The planted failure on pool-b-0: 0 CompartmentStopped and 0 Resumed Events; pool-b-0 is complete." \
        in lines


def test_inside_the_demo_ctrl_c_is_heard_even_when_inherited_ignored_and_sigterm_counts_as_one() -> None:
    import signal

    from gate.cli.demo import interruptible

    term = signal.getsignal(signal.SIGTERM)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a `&` job of a script starts
    try:
        with interruptible():
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # given back as it was
        assert signal.getsignal(signal.SIGTERM) == term
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_command_the_demo_runs_that_met_ctrl_c_stops_the_demo_rather_than_failing_it() -> None:
    from gate.cli.demo import Narrator, _run_command
    from gate.cli.demo_settings import DemoError

    say = Narrator(quick=True)
    with pytest.raises(KeyboardInterrupt):
        _run_command(lambda argv: 130, ["rerun", "g"], say)
    with pytest.raises(DemoError, match="exited 2"):
        _run_command(lambda argv: 2, ["rerun", "g"], say)


def test_the_pod_ledger_keeps_each_of_the_gates_pods_as_last_seen_and_counts_the_steps_that_ran() -> None:
    from tests.unit.cli.builders import stage_pod

    packages = {"sysctl-tuning": {"version": "1.0.0", "image": "example.com/s"},
                "chrony-conf": {"version": "1.0.0", "image": "example.com/c"}}
    steps: list[tuple[str | None, str]] = [("sysctl-tuning", "apply"), ("chrony-conf", "apply")]

    def pod(ends: list[str], rv: int, gate: str = "host-tuning", **kw: Any) -> dict[str, Any]:
        obj = stage_pod(gate, "pool-b-2", steps, ends, packages=packages, **kw)
        obj["metadata"]["resourceVersion"] = str(rv)
        return obj

    ledger = PodLedger()
    ledger.observe("ADDED", pod(["running"], 10))
    ledger.observe("MODIFIED", pod(["done", "failed"], 12))
    ledger.observe("MODIFIED", pod(["done", "running"], 11))  # an older copy (a relist's) changes nothing
    ledger.observe("ADDED", pod(["done"], 13, attempt=1))  # the retry, from the failed step on
    ledger.observe("DELETED", pod(["done"], 14, gate="another-gate"))
    reboot = stage_pod("host-tuning", "pool-b-2", [(None, "interrupt")], ["done"], kind="interrupt",
                       interrupt="reboot", packages=packages)
    ledger.observe("DELETED", reboot)

    assert ledger.counts() == ({"stages": 2, "interrupt": 1}, {"apply": 3, "interrupt": 1}, 1)
