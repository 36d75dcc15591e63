"""Only the operator's own records drive it (issue 27, part 1, defence in depth): records are signed.

Behind the node-keys policy, for when it is missing or a holder of `bypass` is abused: here the
admin, who holds `bypass`, plays that identity and writes node records through the real API server.
A record the operator did not write (unsigned, or signed for another node) is reported once in a
Warning Event on the gate naming the node and counted, and never acted on: the node counts as having
no record, so the package still runs there. An operator restart keeps its key, and its records stay
valid; with the key lost, the records on the nodes are adopted once (trust on first use).
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.api.state import NodeGateState, load_state, rollout_hash
from gate.controller.rbac import state_key_secret
from gate.devcluster.cluster import DevCluster
from gate.devcluster.services import start_operator
from gate.kube.client import EVENTS, NODES, SECRETS, KubeClient
from tests.integration.operator.conftest import NAMESPACE, OPERATOR_FLAGS, Scenario, StepLog, wait_for
from tests.security.helpers import operator_metrics, samples

PKG = {"version": "1.0.0", "image": "registry.example.com/cve-fix"}


async def _events(kube: KubeClient, gate: str, reason: str) -> list[dict[str, Any]]:
    events, _ = await kube.list(EVENTS, "default", field_selector=f"regarding.name={gate},reason={reason}")
    return events


def _record(node: dict[str, Any], gate: str) -> str:
    return str(node["metadata"]["annotations"][keys.state_annotation(gate)])


async def _restart_operator(cluster: DevCluster) -> None:
    cluster.stop_process("operator", sig=signal.SIGKILL)
    await asyncio.sleep(0.5)
    await asyncio.to_thread(start_operator, cluster, lambda m: None, extra=OPERATOR_FLAGS)


async def test_forged_and_copied_records_are_reported_once_and_the_package_still_runs_there(
        kube: KubeClient, scenario: Scenario, step_log: StepLog, cluster: DevCluster) -> None:
    done = await scenario.add_nodes(1)
    await scenario.apply_gate({"cve-fix": PKG}, interruptionBudget={"percent": 100})
    await scenario.wait_ready()
    [source] = done
    source_steps = len(step_log.of(scenario.name, source))
    signed = _record(await scenario.node(source), scenario.name)
    assert load_state(signed).sig, "the operator signs the records it writes"
    gate = NodeGate.model_validate(await scenario.patch_gate({"spec": {"paused": True}}))
    await scenario.wait_condition("Paused")
    forged_node, copied_node = await scenario.add_nodes(2, start=1)
    # A CVE fix marked complete, with the live gate's hashes, as the attacker wrote it; and the
    # operator's own signed record of another node, copied.
    forged = NodeGateState(status="complete", round=1, batch=1, generation=gate.metadata.generation or 0,
                           rollout_hash=rollout_hash(gate),
                           installed=load_state(signed).installed).dump()
    for node, value in ((forged_node, forged), (copied_node, signed)):
        await kube.patch(NODES, node, {"metadata": {"annotations": {keys.state_annotation(scenario.name): value}}})

    async def reported() -> bool:
        notes = [e["note"] for e in await _events(kube, scenario.name, "RecordNotOurs")]
        return any(forged_node in n and "no signature" in n for n in notes) and \
            any(copied_node in n and "does not match" in n for n in notes)

    await wait_for(reported, what="both records reported not the operator's")
    status = (await scenario.gate())["status"]["nodes"]
    assert status["complete"] == 1, f"a record the operator did not write counted complete: {status}"
    await scenario.patch_gate({"spec": {"paused": False}})
    await scenario.wait_ready()
    for node in (forged_node, copied_node):
        assert step_log.of(scenario.name, node), f"the package did not run on {node}"
        record = load_state(_record(await scenario.node(node), scenario.name))
        assert record.status == "complete" and record.sig and _record(await scenario.node(node), scenario.name) \
            not in (forged, signed), "the operator's own record replaced the one it did not write"
    assert len(step_log.of(scenario.name, source)) == source_steps, "the node the record was copied from ran again"
    # once per distinct record, however many reconciles saw it
    notes = [e["note"] for e in await _events(kube, scenario.name, "RecordNotOurs")]
    assert len(notes) == 2, notes
    counted = samples(operator_metrics(cluster), "nodegate_records_refused_total")
    assert counted.get(f'{{gate="{scenario.name}"}}') == 2, counted


async def test_a_forged_round_on_a_node_the_gate_does_not_select_does_nothing(
        kube: KubeClient, scenario: Scenario, step_log: StepLog) -> None:
    [member] = await scenario.add_nodes(1)
    [outsider] = await scenario.add_nodes(1, {"test": f"{scenario.name}-out"}, start=1)
    await scenario.apply_gate({"cve-fix": {**PKG, "interrupt": {"type": "reboot"}}})
    await scenario.wait_ready()
    member_steps = len(step_log.of(scenario.name, member))
    forged = NodeGateState.model_validate({
        "status": "in-progress", "round": 1, "batch": 1, "compartment": "__default__", "phase": "interrupt",
        "interrupt": {"type": "reboot"}, "interrupted": ["cve-fix"]}).dump()
    await kube.patch(NODES, outsider, {"metadata": {"annotations": {keys.state_annotation(scenario.name): forged}}})

    async def reported() -> bool:
        return any(outsider in e["note"] for e in await _events(kube, scenario.name, "RecordNotOurs"))

    await wait_for(reported, what="the forged record reported")
    await scenario.patch_gate({"metadata": {"annotations": {"example.com/nudge": "1"}}})  # another plan
    await asyncio.sleep(2)  # a few plans and node looks: none may act on the record
    node = await scenario.node(outsider)
    assert not node["spec"].get("unschedulable") and keys.CORDONED_BY not in node["metadata"]["annotations"]
    assert step_log.of(scenario.name, outsider) == [], "a stage ran on a node the gate does not select"
    assert _record(node, scenario.name) == forged, "the record is left as written: it is the evidence"
    assert len(step_log.of(scenario.name, member)) == member_steps


async def test_an_operator_restart_keeps_its_key_and_a_lost_key_adopts_the_records_once(
        kube: KubeClient, scenario: Scenario, step_log: StepLog, cluster: DevCluster) -> None:
    nodes = await scenario.add_nodes(2)
    await scenario.apply_gate({"cve-fix": PKG}, interruptionBudget={"percent": 100})
    await scenario.wait_ready()
    key = await kube.get(SECRETS, state_key_secret(), NAMESPACE)
    before = {n: _record(await scenario.node(n), scenario.name) for n in nodes}
    steps = len(step_log.of(scenario.name))

    await _restart_operator(cluster)
    await scenario.patch_gate({"metadata": {"annotations": {"example.com/nudge": "1"}}})
    await scenario.wait_ready()
    assert (await kube.get(SECRETS, state_key_secret(), NAMESPACE))["data"] == key["data"]
    assert {n: _record(await scenario.node(n), scenario.name) for n in nodes} == before
    assert await _events(kube, scenario.name, "RecordNotOurs") == []

    # The key lost (a new install over old nodes, an upgrade from an operator that did not sign): the
    # records on the nodes are adopted, once, and nothing runs again.
    await kube.delete(SECRETS, state_key_secret(), NAMESPACE)
    await _restart_operator(cluster)

    async def adopted() -> bool:
        return bool(await _events(kube, scenario.name, "RecordsAdopted"))

    await wait_for(adopted, what="the records adopted")
    new_key = await kube.get(SECRETS, state_key_secret(), NAMESPACE)
    assert new_key["data"] != key["data"]
    assert "nodegate.io/adopt-records" not in (new_key["metadata"].get("annotations") or {})
    await scenario.patch_gate({"metadata": {"annotations": {"example.com/nudge": "2"}}})
    await scenario.wait_ready()
    for n in nodes:
        record = _record(await scenario.node(n), scenario.name)
        assert record != before[n] and json.loads(record)["sig"].split(":")[0] in new_key["data"]
        assert load_state(record).status == "complete"
    assert len(step_log.of(scenario.name)) == steps, "a node ran again after its record was adopted"
    assert await _events(kube, scenario.name, "RecordNotOurs") == []
