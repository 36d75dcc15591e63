"""`nodegate disable` / `enable` on a real control plane with the webhook and the operator: a disabled gate
starts no round, taints no joining node and lets go of the readiness taint; enabled, it rolls out again."""

from __future__ import annotations

from typing import Any

from gate.api import keys
from tests.integration.cli.conftest import Cli
from tests.integration.conftest import Webhook
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/tool"}


def _tainted(node: dict[str, Any]) -> bool:
    return any(t.get("key") == keys.READINESS_TAINT_KEY for t in (node.get("spec") or {}).get("taints") or [])


async def test_a_disabled_gate_does_nothing_and_holds_no_node_back_until_enabled(
        scenario: Scenario, cli: Cli, webhook: Webhook, step_log: StepLog) -> None:
    g = scenario.name
    await scenario.apply_gate({"tool": PKG}, readinessTaint=True, paused=True)
    await scenario.wait_condition("Paused")
    [early] = await scenario.add_nodes(1)
    assert _tainted(await scenario.node(early))  # the webhook held the joining node back, as for any paused gate

    dry = (await cli.ok("disable", g, "--dry-run")).out
    assert dry.rstrip().endswith("(server dry run: nothing was changed)")
    assert keys.DISABLED_ANNOTATION not in (await scenario.gate())["metadata"].get("annotations", {})
    out = (await cli.ok("disable", g)).out
    assert out.startswith(f"NodeGate {g}: annotated {keys.DISABLED_ANNOTATION}=true. It starts no new round")
    assert (await cli.ok("disable", g)).out == f"NodeGate {g} is already disabled; nothing changed.\n"

    async def released() -> bool:
        return not _tainted(await scenario.node(early))

    await wait_for(released, what="the disabled gate's readiness taint taken off the node")
    gate = await scenario.wait_condition("Disabled")
    assert gate["status"]["status"] == "Disabled"
    [late] = await scenario.add_nodes(1, start=1)
    assert not _tainted(await scenario.node(late))  # the webhook taints no joining node for a disabled gate

    # Unpaused but disabled: the operator reconciles the new generation and starts nothing.
    generation = (await scenario.patch_gate({"spec": {"paused": False}}))["metadata"]["generation"]

    async def observed() -> bool:
        return ((await scenario.gate()).get("status") or {}).get("observedGeneration") == generation

    await wait_for(observed, what="the operator reconciling the unpaused, disabled gate")
    assert step_log.of(g) == []
    for node in (early, late):
        assert keys.state_annotation(g) not in (await scenario.node(node))["metadata"].get("annotations", {})

    enabled = (await cli.ok("enable", g)).out
    assert enabled.startswith(f"NodeGate {g}: removed the annotation {keys.DISABLED_ANNOTATION}. It rolls out again.")
    await scenario.wait_ready()
    for node in (early, late):
        assert await scenario.node_status(node) == "complete"
        assert not _tainted(await scenario.node(node))
    assert "Disabled" not in {c["type"] for c in (await scenario.gate())["status"]["conditions"]}
    assert (await cli.ok("enable", g)).out == f"NodeGate {g} is already enabled; nothing changed.\n"
