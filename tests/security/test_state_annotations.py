"""Hand-edited `nodegate.io/state.<gate>` annotations, written through the real API server.

Two gates select the same nodes and complete there. Then a person (the admin, with `kubectl
annotate --overwrite`) writes a different malformed value into gate A's annotation on each node. The
operator must report each node as failed for A with the reason (status label, StateCorrupt Event,
the gate's failed count), leave what the person wrote alone (it is the evidence; `nodegate node reset`
replaces it), keep gate B's state on the same nodes intact, and keep running without a failed
reconcile (a lost write race, 409, is requeued and not counted). Gate B then rolls out a new version
across the same nodes: its own writes must not touch A's values.

Two more cases found operator bugs, since fixed (d457fea): an annotation nested deeper than the JSON
parser recurses stopped every gate's reconcile, and a gate could not be deleted while a node held an
unreadable state for it.
"""

from __future__ import annotations

import json
from typing import Any

from gate.api import keys
from gate.devcluster.cluster import DevCluster
from gate.kube.client import EVENTS, NODEGATES, NODES
from tests.conftest import Kubectl
from tests.integration.operator.conftest import Scenario, wait_for
from tests.security.helpers import operator_metrics, operator_pid, reconcile_failures

PKG = {"version": "1.0.0", "image": "registry.example.com/tool"}
MALFORMED = {
    "truncated JSON": '{"v":1,"status":"comp',
    "not an object": '["complete"]',
    "unknown status": '{"v":1,"status":"exploded"}',
    "future format version": '{"v":2,"status":"complete"}',
    "wrong types": '{"v":1,"status":"complete","installed":"everything","batch":"one"}',
    "JSON null": "null",
    "a number too long to read": '{"v":1,"status":"complete","batch":' + "9" * 5000 + "}",
    "emoji soup": "💥" * 2000,
    "100 KB in a field": '{"v":1,"status":"complete","phase":"' + "x" * 100_000 + '"}',
}
# Not malformed, and rightly not reported: a record that parses with a field the format does not know
# (ignored) is a valid state, and the operator carries on from it.


async def _second_gate(scenario: Scenario, version: str) -> str:
    name = f"{scenario.name}-b"
    manifest = scenario.gate_manifest({"other": {**PKG, "version": version}}, interruptionBudget={"percent": 100})
    manifest["metadata"]["name"] = name
    await scenario.kube.apply(manifest, field_manager="test", force=True)
    return name


async def _ready(scenario: Scenario, name: str) -> bool:
    gate = await scenario.kube.get(NODEGATES, name)
    conds = {c["type"]: c["status"] for c in (gate.get("status") or {}).get("conditions") or []}
    return bool(gate.get("status", {}).get("observedGeneration") == gate["metadata"]["generation"]
                and conds.get("Ready") == "True")


def _annotations(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"].get("annotations") or {})


async def test_malformed_state_is_reported_failed_left_alone_and_other_gates_carry_on(
        scenario: Scenario, kubectl: Kubectl, cluster: DevCluster) -> None:
    nodes = await scenario.add_nodes(len(MALFORMED))
    await scenario.apply_gate({"tool": PKG}, interruptionBudget={"percent": 100})
    other = await _second_gate(scenario, "1.0.0")
    try:
        await scenario.wait_ready()
        await wait_for(lambda: _ready(scenario, other), what=f"gate {other} Ready")
        errors_before = reconcile_failures(operator_metrics(cluster))
        pid = operator_pid(cluster)
        written = dict(zip(nodes, MALFORMED.values(), strict=True))
        b_before = {n: _annotations(await scenario.node(n))[keys.state_annotation(other)] for n in nodes}
        for node, value in written.items():
            kubectl.run("annotate", "node", node, "--overwrite", f"{keys.state_annotation(scenario.name)}={value}")

        async def all_failed() -> bool:
            status = (await scenario.gate()).get("status") or {}
            return bool(status.get("nodes", {}).get("failed") == len(nodes))

        await wait_for(all_failed, timeout=60, what="every node with a malformed state counted failed")
        for node in nodes:
            await scenario.wait_node(node, "failed")
            annotations = _annotations(await scenario.node(node))
            assert annotations[keys.state_annotation(scenario.name)] == written[node], "the operator overwrote it"
            assert annotations[keys.state_annotation(other)] == b_before[node], "the other gate's state changed"
        events, _ = await scenario.kube.list(EVENTS, "default", field_selector="reason=StateCorrupt")
        corrupt = {e["regarding"]["name"]: e["note"] for e in events if e["regarding"]["name"] in nodes}
        assert set(corrupt) == set(nodes), corrupt
        for note in corrupt.values():
            assert f"NodeGate {scenario.name}: the state annotation" in note and "nodegate node reset" in note
        # Gate B works on the same nodes, and its writes leave A's values as the person wrote them.
        await _second_gate(scenario, "1.1.0")

        async def b_rolled_out() -> bool:
            if not await _ready(scenario, other):
                return False
            for n in nodes:
                state = json.loads(_annotations(await scenario.node(n))[keys.state_annotation(other)])
                if state.get("installed", {}).get("other", {}).get("version") != "1.1.0":
                    return False
            return True

        await wait_for(b_rolled_out, timeout=90, what=f"gate {other} rolled out 1.1.0 on every node")
        for node in nodes:
            assert _annotations(await scenario.node(node))[keys.state_annotation(scenario.name)] == written[node]
            assert await scenario.node_status(node) == "failed"
        assert operator_pid(cluster) == pid, "the operator restarted"
        errors = reconcile_failures(operator_metrics(cluster)) - errors_before
        assert errors == 0, f"{errors:.0f} reconciles failed while reading malformed states"
        # The documented way out: `nodegate node reset` replaces the unreadable state and A runs again.
        for node in nodes:
            await scenario.kube.patch(NODES, node, {"metadata": {"annotations": {
                keys.reset_annotation(scenario.name): "2026-01-01T00:00:00Z"}}})
        gate = await scenario.wait_ready()
        assert gate["status"]["nodes"]["complete"] == len(nodes)
    finally:
        await scenario.delete_gate(other)


async def test_a_gate_is_deleted_even_while_a_node_holds_an_unreadable_state_for_it(
        scenario: Scenario, kubectl: Kubectl) -> None:
    [node] = await scenario.add_nodes(1)
    await scenario.apply_gate({"tool": PKG})
    await scenario.wait_ready()
    kubectl.run("annotate", "node", node, "--overwrite", f"{keys.state_annotation(scenario.name)}=[]")
    await scenario.wait_node(node, "failed")
    kubectl.run("annotate", "node", node, f"{keys.reset_annotation(scenario.name)}=2026-01-01T00:00:00Z")
    try:
        await scenario.delete_gate(timeout=10)  # a one-node gate goes in about a second
        left = {k for k in {**_annotations(await scenario.node(node)),
                            **(await scenario.node(node))["metadata"].get("labels", {})} if scenario.name in k}
        assert not left, f"keys of the deleted gate left on the node: {left}"
    finally:
        kubectl.run("annotate", "node", node, f"{keys.state_annotation(scenario.name)}-", check=False)


async def test_a_state_nested_too_deep_is_reported_failed_without_stopping_other_gates(
        scenario: Scenario, kubectl: Kubectl, cluster: DevCluster) -> None:
    corrupt, healthy = await scenario.add_nodes(2)
    await scenario.apply_gate({"tool": PKG}, interruptionBudget={"percent": 100})
    other = await _second_gate(scenario, "1.0.0")
    try:
        await scenario.wait_ready()
        await wait_for(lambda: _ready(scenario, other), what=f"gate {other} Ready")
        errors_before = reconcile_failures(operator_metrics(cluster))
        kubectl.run("annotate", "node", corrupt, "--overwrite", f"{keys.state_annotation(scenario.name)}={'[' * 2000}")
        await _second_gate(scenario, "1.1.0")  # gate B has work to do on both nodes

        async def b_rolled_out() -> bool:
            for n in (corrupt, healthy):
                raw = _annotations(await scenario.node(n))[keys.state_annotation(other)]
                if json.loads(raw).get("installed", {}).get("other", {}).get("version") != "1.1.0":
                    return False
            return True

        await scenario.wait_node(corrupt, "failed", timeout=15)
        await wait_for(b_rolled_out, timeout=15, what=f"gate {other} rolled out on both nodes")
        errors = reconcile_failures(operator_metrics(cluster)) - errors_before
        assert errors == 0, f"{errors:.0f} reconciles failed"
    finally:
        kubectl.run("annotate", "node", corrupt, f"{keys.state_annotation(scenario.name)}-", check=False)
        await scenario.delete_gate(other)
