"""`nodegate` commands on a real rollout: what status says, and what pause, resume, rerun, reset and
ignore change (each through the request the operator consumes, each with a dry run that changes nothing)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from gate.api import keys
from gate.devcluster.stages import failing_stage
from gate.kube.client import EVENTS, KWOK_STAGES, NODES, PDBS, PODS, POLICIES
from gate.kube.errors import NotFound
from gate.rollout import order_key
from tests.integration.cli.conftest import Cli
from tests.integration.operator.conftest import Scenario, StepLog, wait_for
from tests.processes import HANG_GUARD, async_group_process, ctrl_c

PKG = {"version": "1.0.0", "image": "registry.example.com/tool", "retries": 0}
SUMMARY = {"package": "tool", "version": "1.0.0", "stage": "apply", "ok": False, "failedStep": "install",
           "exitCode": 3, "message": "/etc/tool.conf: read-only file system"}


async def _compartment_state(sc: Scenario, name: str) -> str | None:
    for c in ((await sc.gate()).get("status") or {}).get("compartments") or []:
        if c["name"] == name:
            return str(c.get("state"))
    return None


async def test_a_failed_batch_is_explained_by_status_and_logs_and_cleared_by_rerun_and_resume(
        scenario: Scenario, cli: Cli) -> None:
    g = scenario.name
    policy = f"{g}-policy"
    await scenario.add_nodes(1, {"tier": "canary"})
    main_nodes = await scenario.add_nodes(4, {"tier": "main"}, start=10)
    first_batch = sorted(main_nodes, key=order_key)[:2]
    bad, good = first_batch
    await scenario.kube.apply({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": policy},
        "spec": {"compartments": [
            {"name": "canary", "selector": {"matchLabels": {"tier": "canary"}}, "budget": {"count": 1}},
            {"name": "main", "selector": {"matchLabels": {"tier": "main"}}, "budget": {"count": 2},
             "strategy": {"fixed": {"initialBatch": 2, "failureThreshold": 1}}},
        ]}}, field_manager="test", force=True)
    try:
        await scenario.inject(failing_stage("fail", nodes=[bad], package="tool", stage="apply",
                                            message=json.dumps(SUMMARY)))
        await scenario.apply_gate({"tool": PKG}, deploymentPolicy=policy)
        await wait_for(lambda: _stopped(scenario), what="compartment main stopped")

        text = (await cli.ok("status", g)).out
        row = next(line for line in text.splitlines() if line.startswith("  main "))
        assert row.split()[-1] == "stopped" and " 1/4 " in row
        assert (f"  main  {bad}  tool apply: StageFailed: step install exited 3: /etc/tool.conf: read-only file "
                "system") in text
        assert f"stopped: compartment main stopped after 1 failed batches in a row; run `nodegate resume {g}`" in text
        data = json.loads((await cli.ok("status", g, "-o", "json")).out)
        assert [(c["name"], c["state"]) for c in data["compartments"]] == [("canary", "complete"), ("main", "stopped")]
        assert data["failed"][0]["node"] == bad and data["failed"][0]["cordoned"] is False

        logs = (await cli.ok("package", "logs", bad, "tool")).out
        assert f"NodeGate {g}, node {bad}, package tool, stage apply: failed" in logs
        assert "The agent's summary: step install exited 3: /etc/tool.conf: read-only file system" in logs
        assert f"/var/log/nodegate/{g}/tool/1.0.0/" in logs
        followed = (await cli.ok("package", "logs", bad, "tool", "--follow")).out  # the pod ended: returns
        assert "The agent's summary: step install exited 3" in followed
        none = (await cli.ok("package", "logs", good, "tool")).out
        assert none.startswith(f"No stage pod of tool is left on node {good}: the operator deletes the pod of every "
                               "stage that succeeded")
        assert "The node's state for NodeGate" not in none  # the good node recorded no failure

        dry = await cli.ok("resume", g, "--compartment", "main", "--dry-run")
        assert dry.out.rstrip().endswith("(server dry run: nothing was changed)")
        dry = await cli.ok("rerun", g, "--node", bad, "--package", "tool", "--dry-run")
        assert "(server dry run: nothing was changed)" in dry.out
        assert keys.RESUME_ANNOTATION not in (await scenario.gate())["metadata"].get("annotations", {})
        assert keys.rerun_annotation(g) not in (await scenario.node(bad))["metadata"].get("annotations", {})
        assert await _compartment_state(scenario, "main") == "stopped"

        for stage in scenario.stages:  # the node is fixed
            await scenario.kube.delete(KWOK_STAGES, stage)
        rerun = await cli.ok("rerun", g, "--node", bad, "--package", "tool")
        assert f"requested a rerun of tool apply for NodeGate {g}" in rerun.out
        resumed = await cli.ok("resume", g, "-c", "main")
        assert "asked the operator to resume stopped compartment main" in resumed.out
        await scenario.wait_ready()
        text = (await cli.ok("status", g)).out
        assert text.startswith(f"NodeGate {g}  Ready  5/5 complete  policy {policy}")
        plan = json.loads((await cli.ok("plan", g, "-o", "json")).out)
        done = sorted(n for c in plan["compartments"] for b in c["batches"] if b["phase"] == "done" for n in b["nodes"])
        assert done == sorted(scenario.nodes)
    finally:
        await scenario.cleanup()
        await scenario.kube.delete(POLICIES, policy)


async def _stopped(sc: Scenario) -> bool:
    return await _compartment_state(sc, "main") == "stopped"


async def test_pause_and_resume_flip_spec_paused_and_a_live_watch_follows_the_rollout(
        scenario: Scenario, cli: Cli) -> None:
    g = scenario.name
    await scenario.add_nodes(3)
    await scenario.apply_gate({"tool": PKG}, paused=True, interruptionBudget={"count": 1})
    await scenario.wait_condition("Paused")

    status = (await cli.ok("status", g)).out
    assert "paused: gate " + g + " is paused" in status
    plan = (await cli.ok("plan", g)).out
    assert [line.split()[2] for line in plan.splitlines() if line.startswith("    batch")] == ["planned"] * 3
    assert (await cli.ok("pause", g)).out == f"NodeGate {g} is already paused; nothing changed.\n"
    await cli.ok("resume", g, "--dry-run")
    assert (await scenario.gate())["spec"]["paused"] is True

    # A watch through a pipe (no terminal): a new plain rendering whenever the rollout moves.
    env = {**os.environ, "KUBECONFIG": str(scenario.cluster.kubeconfig)}
    async with async_group_process(sys.executable, "-m", "gate.cli.main", "status", g, "--watch",
                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env) as watch:
        assert watch.stdout is not None
        before = await _read_until(watch.stdout, f"NodeGate {g}  Paused")
        assert before.startswith("--- ")
        assert (await cli.ok("resume", g)).out == f"NodeGate {g}: set spec.paused=false.\n"
        # The rollout moving made the watch render again: the Ready picture is a new rendering.
        after = await _read_until(watch.stdout, f"NodeGate {g}  Ready  3/3 complete")
        assert after.count("\n--- ") + after.startswith("--- ") >= 1
        ctrl_c(watch.pid)
        _, err = await asyncio.wait_for(watch.communicate(), HANG_GUARD)
        assert watch.returncode == 130, err.decode()
    assert b"Traceback" not in err
    assert (await cli.ok("pause", g)).out.startswith(f"NodeGate {g}: set spec.paused=true.")
    assert (await scenario.gate())["spec"]["paused"] is True


async def _read_until(stream: asyncio.StreamReader, text: str) -> str:
    """Output of `status --watch` up to and including the line that contains `text` (a hang guard only:
    the rollout's pace is the machine's)."""
    seen: list[str] = []
    async with asyncio.timeout(HANG_GUARD):
        while True:
            line = (await stream.readline()).decode()
            assert line, "the watch ended: " + "".join(seen)
            seen.append(line)
            if text in line:
                return "".join(seen)


async def test_status_names_the_disruption_budget_that_made_a_drain_time_out(scenario: Scenario, cli: Cli) -> None:
    g = scenario.name
    [node] = await scenario.add_nodes(1)
    app = f"{g}-db"
    await scenario.kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{app}-0", "namespace": "default",
                                                        "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}],
                 "terminationGracePeriodSeconds": 0}})
    await scenario.kube.create(PDBS, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                      "metadata": {"name": app, "namespace": "default"},
                                      "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": app}}}})
    try:
        await scenario.apply_gate({"tool": {**PKG, "interrupt": {"type": "reboot"}}}, drain={"timeout": "3s"})
        await scenario.wait_node(node, "failed")
        [line] = [x for x in (await cli.ok("status", g)).lines if f"  {node}  " in x]
        assert f"drain: DrainTimeout: drain did not finish within 3s; blocked by pod default/{app}-0: " in line
        assert "disruption budget" in line and line.endswith("(still cordoned by NodeGate)")
    finally:
        await scenario.kube.delete(PDBS, app, "default")
        await scenario.kube.delete(PODS, f"{app}-0", "default", body={"gracePeriodSeconds": 0})


async def _acted_on_pause(sc: Scenario, paused: bool) -> None:
    """The operator planned the gate at its current generation, with spec.paused as given."""
    async def seen() -> bool:
        gate = await sc.gate()
        status = gate.get("status") or {}
        conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
        return status.get("observedGeneration") == gate["metadata"]["generation"] and conds.get("Paused") == str(paused)

    await wait_for(seen, what=f"the operator to act on paused={paused}")


async def _picture(sc: Scenario) -> tuple[dict[str, object], dict[str, tuple[str | None, str | None]]]:
    """The compartment's durable rollout state, and every node's status label and state annotation."""
    [comp] = ((await sc.gate()).get("status") or {}).get("compartments") or []
    kept = {k: comp.get(k) for k in ("state", "batch", "batchSize", "consecutiveFailures", "failed")}
    nodes = {}
    for node in sc.nodes:
        meta = (await sc.node(node))["metadata"]
        nodes[node] = ((meta.get("labels") or {}).get(keys.status_label(sc.name)),
                       (meta.get("annotations") or {}).get(keys.state_annotation(sc.name)))
    return kept, nodes


async def test_pausing_and_unpausing_keep_every_failure_the_stopped_compartment_and_its_batch(
        scenario: Scenario, cli: Cli, step_log: StepLog) -> None:
    g = scenario.name
    policy = f"{g}-policy"
    scenario.policies.append(policy)
    nodes = sorted(await scenario.add_nodes(4), key=order_key)
    await scenario.kube.apply({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": policy},
        "spec": {"default": {"budget": {"count": 2},
                             "strategy": {"fixed": {"initialBatch": 2, "failureThreshold": 1}}}}},
        field_manager="test", force=True)
    await scenario.inject(failing_stage("fail", nodes=nodes, package="tool", stage="apply"))
    await scenario.apply_gate({"tool": PKG}, deploymentPolicy=policy)
    await wait_for(lambda: _compartment_is(scenario, "__default__", "stopped"),
                   what="the compartment stopped")
    before = await _picture(scenario)
    # The first batch (2 nodes) failed; the stop keeps the next batch, number 2, at the halved size 1.
    assert before[0] == {"state": "stopped", "batch": 2, "batchSize": 1, "consecutiveFailures": 1, "failed": 2}
    assert [before[1][n][0] for n in nodes] == ["failed", "failed", "blocked", "blocked"]
    jobs = len(step_log.of(g))

    # Pausing (with the command) and unpausing (a plain spec write): each bumps the generation, and the
    # operator plans the gate at it; neither is a new rollout, so nothing of the picture moves.
    assert (await cli.ok("pause", g)).out.startswith(f"NodeGate {g}: set spec.paused=true.")
    await _acted_on_pause(scenario, True)
    assert await _picture(scenario) == before
    await scenario.patch_gate({"spec": {"paused": False}})
    await _acted_on_pause(scenario, False)
    assert await _picture(scenario) == before
    assert len(step_log.of(g)) == jobs, "a stage ran after a pause or an unpause alone"

    # `nodegate resume` of a paused gate with a stopped compartment: unpauses and resumes it. What it
    # prints holds: the failed nodes stay failed; the next batch (one node) runs, fails and stops it again.
    await cli.ok("pause", g)
    await _acted_on_pause(scenario, True)
    resumed = (await cli.ok("resume", g)).out
    assert "Their failed nodes stay failed" in resumed

    async def stopped_again() -> bool:
        return (await _picture(scenario))[0]["failed"] == 3 and await _compartment_is(scenario, "__default__",
                                                                                      "stopped")

    await wait_for(stopped_again, what="the next batch to fail and stop the compartment again")
    after = await _picture(scenario)
    assert after[0] == {"state": "stopped", "batch": 3, "batchSize": 1, "consecutiveFailures": 1, "failed": 3}
    assert {n: after[1][n] for n in nodes[:2]} == {n: before[1][n] for n in nodes[:2]}
    assert after[1][nodes[3]][0] == "blocked"
    assert {r.node for r in step_log.of(g)[jobs:]} == {nodes[2]}


async def _compartment_is(sc: Scenario, name: str, state: str) -> bool:
    return await _compartment_state(sc, name) == state



async def test_deleting_a_paused_gate_uninstalls_nothing_until_delete_force(
        scenario: Scenario, cli: Cli, step_log: StepLog) -> None:
    g = scenario.name
    nodes = await scenario.add_nodes(2)
    await scenario.apply_gate({"agent": {**PKG, "uninstall": {"enabled": True}}, "keep": PKG})
    await scenario.wait_ready()
    await cli.ok("pause", g)
    await _acted_on_pause(scenario, True)

    out = (await cli.ok("delete", g)).out
    assert f"NodeGate {g}: deleted. It is paused: no uninstall starts while it stays paused" in out

    async def waits_for_a_person() -> bool:
        conds = {c["type"]: c for c in ((await scenario.gate()).get("status") or {}).get("conditions") or []}
        return conds.get("Deleting", {}).get("reason") == "Paused"

    await wait_for(waits_for_a_person, what="the gate to say its removal waits")
    gate = await scenario.gate()
    [cond] = [c for c in gate["status"]["conditions"] if c["type"] == "Deleting"]
    assert cond["status"] == "True" and "2 nodes wait to uninstall its packages" in cond["message"]
    assert gate["status"]["status"] == "Deleting"
    events, _ = await scenario.kube.list(EVENTS, "default", field_selector=f"regarding.name={g}")
    assert "DeletionPaused" in {e["reason"] for e in events}
    assert (await cli.ok("delete", g)).out.startswith(f"NodeGate {g} is already being deleted (paused")
    assert [r for r in step_log.of(g) if r.stage == "uninstall"] == []
    for node in nodes:
        assert keys.state_annotation(g) in (await scenario.node(node))["metadata"]["annotations"]
    _, before = await scenario.kube.list(NODES, label_selector=f"test={g}")  # the etcd revision now

    out = (await cli.ok("delete", g, "--force")).out
    assert out.startswith(f"NodeGate {g}: set spec.paused=false.")

    async def gone() -> bool:
        try:
            await scenario.gate()
            return False
        except NotFound:
            return True

    await wait_for(gone, what="the gate released")
    uninstalls = [r for r in step_log.of(g) if r.stage == "uninstall"]
    assert sorted(r.node for r in uninstalls) == sorted(nodes) and {r.package for r in uninstalls} == {"agent"}
    assert all(r.resource_version > int(before) for r in uninstalls), "an uninstall started while paused"
    for node in nodes:
        meta = (await scenario.node(node))["metadata"]
        ours = [k for k in (*meta.get("annotations", {}), *meta.get("labels", {})) if k.startswith("nodegate.io/")]
        assert ours == [], ours


async def test_status_says_which_nodes_wait_for_their_protected_pods(scenario: Scenario, cli: Cli) -> None:
    g = scenario.name
    nodes = sorted(await scenario.add_nodes(2), key=order_key)
    job = f"{g}-train"
    await scenario.kube.create(PODS, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": job, "namespace": "default",
                                                        "labels": {"workload": "training"}},
        "spec": {"nodeName": nodes[0], "containers": [{"name": "main", "image": "busybox"}],
                 "terminationGracePeriodSeconds": 0}})
    try:
        await scenario.apply_gate({"tool": {**PKG, "interrupt": {"type": "service", "services": ["tool"]}}},
                                  interruptionBudget={"count": 1},
                                  podNonInterruptLabels={"matchLabels": {"workload": "training"}})
        await scenario.wait_node(nodes[1], "complete")
        await scenario.wait_node(nodes[0], "blocked")
        text = (await cli.ok("status", g)).out
        assert f"for its protected pods to finish: default/{job}" in text and nodes[0] in text
        data = json.loads((await cli.ok("status", g, "-o", "json")).out)
        assert json.dumps(data).count("protected-pods") >= 1
        # The live status says the same, and says when the job ended.
        env = {**os.environ, "KUBECONFIG": str(scenario.cluster.kubeconfig)}
        async with async_group_process(sys.executable, "-m", "gate.cli.main", "status", g, "--watch",
                                       stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                       env=env) as watch:
            assert watch.stdout is not None
            await _read_until(watch.stdout, f"for its protected pods to finish: default/{job}")
            await scenario.kube.delete(PODS, job, "default", body={"gracePeriodSeconds": 0})
            await _read_until(watch.stdout, f"NodeGate {g}  Ready  2/2 complete")
            ctrl_c(watch.pid)
            _, err = await asyncio.wait_for(watch.communicate(), HANG_GUARD)
        assert b"Traceback" not in err
    finally:
        await scenario.kube.delete(PODS, job, "default", body={"gracePeriodSeconds": 0})
