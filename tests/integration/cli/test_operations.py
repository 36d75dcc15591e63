"""The operations NodeWright users expect, on a real control plane: a whole gate reset, node requests on
several nodes or a selector, `package logs --tail`, and `nodegate version` naming the running operator."""

from __future__ import annotations

import json

from gate import __version__
from gate.api import keys
from gate.devcluster.stages import failing_stage, slow_stage
from gate.kube.client import EVENTS, KWOK_STAGES, POLICIES
from gate.rollout import order_key
from tests.integration.cli.conftest import Cli
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/tool", "retries": 0}
SUMMARY = {"package": "tool", "version": "1.0.0", "stage": "apply", "ok": False, "failedStep": "install",
           "exitCode": 3, "message": "no space left on device"}


def _applies(step_log: StepLog, gate: str, node: str) -> int:
    return len([r for r in step_log.of(gate, node) if r.stage == "apply"])


async def _annotations(sc: Scenario, node: str) -> dict[str, str]:
    return dict((await sc.node(node))["metadata"].get("annotations") or {})


async def _reset_requested(sc: Scenario, nodes: list[str]) -> list[str]:
    return [n for n in nodes if keys.reset_annotation(sc.name) in await _annotations(sc, n)]


async def test_node_requests_take_several_nodes_or_a_label_selector(scenario: Scenario, cli: Cli,
                                                                   step_log: StepLog) -> None:
    g = scenario.name
    gpu = await scenario.add_nodes(2, {"pool": "gpu"})
    [cpu] = await scenario.add_nodes(1, {"pool": "cpu"}, start=10)
    await scenario.apply_gate({"tool": PKG})
    await scenario.wait_ready()
    selector = f"test={g},pool=gpu"

    # A name that does not exist among several: one line, and nothing is written to the others.
    assert await cli.fails("node", "ignore", gpu[0], f"{g}-nope") == f"error: no node named {g}-nope"
    none = f"test={g},pool=tpu"
    assert await cli.fails("node", "ignore", "-l", none) == f"error: no node matches -l {none}"
    assert await cli.fails("node", "ignore") == "error: name at least one node, or give -l SELECTOR"
    assert await cli.fails("node", "ignore", cpu, "-l", selector) == "error: name nodes or give -l SELECTOR, not both"
    dry = (await cli.ok("node", "ignore", "-l", selector, "--dry-run")).lines
    assert [line.split(":")[0] for line in dry] == [f"node/{n}" for n in sorted(gpu)]
    assert all(line.endswith("(server dry run: nothing was changed)") for line in dry)
    for node in [*gpu, cpu]:
        assert keys.IGNORE_LABEL not in (await scenario.node(node))["metadata"]["labels"]

    out = (await cli.ok("node", "ignore", gpu[0], cpu)).lines
    assert sorted(out) == sorted([f"node/{n}: labelled {keys.IGNORE_LABEL}=true. Every NodeGate leaves it alone "
                                  "from now on (a round running there stops once its stage pod ends)."
                                  for n in (gpu[0], cpu)])
    both = (await cli.ok("node", "ignore", "-l", selector)).lines
    assert f"node/{gpu[0]} is already ignored; nothing changed." in both
    assert any(line.startswith(f"node/{gpu[1]}: labelled") for line in both)
    unignored = (await cli.ok("node", "unignore", "-l", f"test={g}")).lines
    assert len(unignored) == 3 and all(": removed the label" in line for line in unignored)
    for node in [*gpu, cpu]:
        await scenario.wait_node(node, "complete")
    applied = {n: _applies(step_log, g, n) for n in [*gpu, cpu]}

    await cli.ok("node", "reset", "-l", selector, "--gate", g, "--dry-run")
    assert await _reset_requested(scenario, gpu) == []
    reset = (await cli.ok("node", "reset", "-l", selector)).lines
    assert sorted(line.split(":")[0] for line in reset) == [f"node/{n}" for n in sorted(gpu)]

    async def ran_again() -> bool:
        statuses = [await scenario.node_status(n) for n in gpu]
        return all(_applies(step_log, g, n) == applied[n] + 1 for n in gpu) and statuses == ["complete"] * 2

    await wait_for(ran_again, what="both gpu nodes running the gate again from scratch")
    assert _applies(step_log, g, cpu) == applied[cpu]  # the selector left it alone


async def test_reset_runs_a_whole_gate_again_and_resumes_its_stopped_compartment(
        scenario: Scenario, cli: Cli, step_log: StepLog) -> None:
    g = scenario.name
    policy = f"{g}-policy"
    nodes = await scenario.add_nodes(2, {"tier": "main"})
    bad, good = sorted(nodes, key=order_key)
    await scenario.kube.apply({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": policy},
        "spec": {"compartments": [
            {"name": "main", "selector": {"matchLabels": {"tier": "main"}}, "budget": {"count": 2},
             "strategy": {"fixed": {"initialBatch": 2, "failureThreshold": 1}}}]}}, field_manager="test", force=True)
    try:
        await scenario.inject(failing_stage("fail", nodes=[bad], package="tool", stage="apply",
                                            message=json.dumps(SUMMARY)))
        await scenario.apply_gate({"tool": PKG}, deploymentPolicy=policy)

        async def stopped() -> bool:
            comps = ((await scenario.gate()).get("status") or {}).get("compartments") or []
            return any(c["name"] == "main" and c.get("state") == "stopped" for c in comps)

        await wait_for(stopped, what="compartment main stopped")
        await scenario.wait_node(good, "complete")

        # package logs --tail: the failed stage's Job and the agent's summary, as without it.
        tailed = (await cli.ok("package", "logs", bad, "tool", "--tail", "5")).out
        assert f"NodeGate {g}, node {bad}, package tool, stage apply: failed" in tailed
        assert "The agent's summary: step install exited 3: no space left on device" in tailed
        assert await cli.fails("package", "logs", bad, "tool", "--tail", "-1") == (
            "error: --tail wants a number of lines, 0 or more (got -1)")

        # Without a terminal to ask on, it wants --yes; a dry run says what it would do and does nothing.
        refused = await cli.fails("reset", g)
        assert refused == (f"error: nodegate reset changes every node of NodeGate {g}: confirm with --yes "
                           "(or see what it does with --dry-run)")
        dry = (await cli.ok("reset", g, "--dry-run")).lines
        assert dry[0] == (f"NodeGate {g}: reset 2 nodes ({', '.join(sorted(nodes))}): the operator forgets what {g} "
                          "installed on each and runs it there again from scratch, in the gate's rollout order, "
                          "under its budgets and windows. Batches start small again, and stopped compartment main "
                          "resume.")
        assert dry[1].endswith("(server dry run: nothing was changed)")
        assert await _reset_requested(scenario, nodes) == []
        assert keys.RESTART_ANNOTATION not in (await scenario.gate())["metadata"].get("annotations", {})
        assert await stopped()

        before = {n: _applies(step_log, g, n) for n in nodes}
        for stage in scenario.stages:  # the node is fixed
            await scenario.kube.delete(KWOK_STAGES, stage)
        done = (await cli.ok("reset", g, "--yes")).lines
        assert done[-1] == (f"NodeGate {g}: requested the reset (annotation {keys.reset_annotation(g)} on 2 nodes "
                            f"and annotation {keys.RESTART_ANNOTATION} on the gate).")

        async def ran_again() -> bool:
            return all(_applies(step_log, g, n) == before[n] + 1 for n in nodes)

        await wait_for(ran_again, what="every node of the gate running it again")
        await scenario.wait_ready()
        assert not await stopped()
        assert await _reset_requested(scenario, nodes) == []
        # The operator acted on the restart request once and took it away, saying so in an Event.
        assert keys.RESTART_ANNOTATION not in (await scenario.gate())["metadata"].get("annotations", {})
        events, _ = await scenario.kube.list(EVENTS, "default", field_selector=f"regarding.name={g}")
        assert "Restarted" in [e.get("reason") for e in events]
    finally:
        await scenario.cleanup()
        await scenario.kube.delete(POLICIES, policy)


async def test_reset_of_a_gate_that_never_ran_changes_nothing(scenario: Scenario, cli: Cli) -> None:
    g = scenario.name
    await scenario.add_nodes(1)
    await scenario.apply_gate({"tool": PKG}, paused=True)
    await scenario.wait_condition("Paused")
    assert (await cli.ok("reset", g, "--yes")).out == (
        f"NodeGate {g} has not run on any node and no compartment is stopped; nothing to reset.\n")
    assert await cli.fails("reset", f"{g}-missing", "--yes") == (
        f"error: no NodeGate named {g}-missing (`kubectl get ng` lists them)")


async def test_version_names_the_cli_and_the_operator_that_leads(cli: Cli, operator: int) -> None:
    lines = (await cli.ok("version")).lines
    assert lines[0] == f"nodegate {__version__}"
    assert lines[1].startswith(f"operator {__version__} (leader ")
    assert ", Lease nodegate-system/nodegate-operator" in lines[1]
    assert (await cli.ok("version", "--client")).lines == [f"nodegate {__version__}"]
    elsewhere = await cli("version", "--namespace", "default")
    assert elsewhere.code == 1 and elsewhere.lines == [
        f"nodegate {__version__}", "operator: not found (no Lease default/nodegate-operator; is the operator "
        "installed there? --namespace and --lease name another)"]


async def test_status_and_package_logs_name_the_step_a_stage_pod_runs_now(scenario: Scenario, cli: Cli) -> None:
    g = scenario.name
    [node] = await scenario.add_nodes(1)
    # Both packages' applies are steps of one stage pod, in dependency order (ties by name): first, second.
    # The second runs long enough to be seen running (the gate's deletion at the end waits for it).
    await scenario.inject(slow_stage("slow", nodes=[node], package="second", stage="apply", seconds=30))
    await scenario.apply_gate({"first": PKG, "second": PKG})

    async def second_running() -> bool:
        return "running stages: second apply" in (await cli.ok("status", g)).out

    await wait_for(second_running, what="the status naming the second step of the stage pod")
    second = (await cli.ok("package", "logs", node, "second")).lines
    assert second[0].startswith("Stage pod nodegate-system/ng-")
    assert second[0].endswith(f": NodeGate {g}, node {node}, package second, stage apply: running")
    assert second[1].startswith("The pod runs the stages of round ")
    assert second[1].endswith("this is step 2 of 2, container apply-second.")
    first = (await cli.ok("package", "logs", node, "first", "--gate", g)).lines
    assert first[0] == second[0].replace("package second, stage apply: running", "package first, stage apply: "
                                         "succeeded")
    assert first[1].endswith("this is step 1 of 2, container apply-first.")
    assert first[-1].startswith(f"The agent writes the full log of every run on the node itself, under "
                                f"/var/log/nodegate/{g}/first/1.0.0/")
    assert (await cli.ok("package", "logs", node, "first", "--stage", "config")).out.startswith(
        f"No stage pod of first config is left on node {node}")
    assert (await cli.ok("package", "logs", node, "second", "--gate", "another-gate")).out.startswith(
        f"No stage pod of second is left on node {node}")
