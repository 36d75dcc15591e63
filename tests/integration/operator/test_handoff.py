"""The onboarding hand-off (spec.leaveCordoned) on the real control plane, kwok nodes.

A node joining a readinessTaint gate that asks for the hand-off ends untainted and cordoned, held for
the validator that comes next; `kubectl uncordon` releases it for good. Not covered here: a real node
that runs no workload pod until released (the real-node tier), and the operator killed between the
taint's lift and the cordon, which cannot happen: both are one node write (tests/unit/lifecycle/test_handoff.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import urllib.request
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

from gate.api import keys
from gate.devcluster.cluster import node_manifest
from gate.kube.client import EVENTS, NODEGATES, NODES
from gate.kube.errors import NotFound
from tests.conftest import Kubectl
from tests.integration.conftest import Webhook
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/pkg"}
TAINT = {"key": keys.READINESS_TAINT_KEY, "effect": "NoSchedule"}
Obj = dict[str, Any]


def _tainted(node: Obj) -> bool:
    return any(t["key"] == keys.READINESS_TAINT_KEY for t in node["spec"].get("taints") or [])


def _annotations(node: Obj) -> dict[str, str]:
    return node["metadata"].get("annotations") or {}


def _hand_off_condition(node: Obj) -> Obj | None:
    return next((c for c in (node.get("status") or {}).get("conditions") or []
                 if c["type"] == keys.HAND_OFF_CONDITION), None)


async def join(sc: Scenario, name: str) -> str:
    """A node joining now: the webhook gives it the readiness taint at creation."""
    created = await sc.kube.create(NODES, node_manifest(name, {"test": sc.name}))
    sc.nodes.append(name)
    assert _tainted(created), "the mutating webhook did not taint the joining node"
    return name


async def wait_held(sc: Scenario, node: str, by: str) -> Obj:
    async def held() -> bool:
        obj = await sc.node(node)
        return bool(obj["spec"].get("unschedulable")) and _hand_off_condition(obj) is not None
    await wait_for(held, what=f"{node} held for hand-off")
    obj = await sc.node(node)
    assert not _tainted(obj) and _annotations(obj).get(keys.HELD_BY) == by, obj["metadata"]
    assert keys.CORDONED_BY not in _annotations(obj), "the hold is not a round's cordon"
    return obj


async def assert_serving(sc: Scenario, node: str) -> None:
    obj = await sc.node(node)
    assert not obj["spec"].get("unschedulable"), f"{node} was held again: {_annotations(obj)}"
    assert keys.HELD_BY not in _annotations(obj) and not _tainted(obj)


async def test_a_joining_node_is_held_until_uncordoned_and_never_held_again(
        scenario: Scenario, webhook: Webhook, kubectl: Kubectl, step_log: StepLog) -> None:
    [existing] = await scenario.add_nodes(1)  # in service before the gate: never held
    await scenario.apply_gate({"runtime": PKG}, readinessTaint=True, leaveCordoned=True)
    await scenario.wait_ready()
    node = await join(scenario, f"{scenario.name}-9")
    await scenario.wait_node(node, "complete")
    await wait_held(scenario, node, scenario.name)
    await assert_serving(scenario, existing)
    port = scenario.cluster.ports()["operator"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    assert f'nodegate_hand_off_holds_total{{gate="{scenario.name}"}} 1.0' in metrics

    kubectl.run("uncordon", node)

    async def released() -> bool:
        obj = await scenario.node(node)
        return (keys.HELD_BY not in _annotations(obj) and keys.HAND_OFF_RELEASED in _annotations(obj)
                and _hand_off_condition(obj) is None)
    await wait_for(released, what=f"{node}'s hold released")
    await assert_serving(scenario, node)

    async def both_told() -> bool:  # Events follow the writes they tell of
        events, _ = await scenario.kube.list(EVENTS, "default", field_selector=f"regarding.name={node}")
        return {"HeldForHandOff", "HandOffReleased"} <= {e["reason"] for e in events}
    await wait_for(both_told, what=f"the HeldForHandOff and HandOffReleased Events of {node}")

    # A config change: a round on every node, and the node keeps serving.
    await scenario.apply_gate({"runtime": {**PKG, "config": {"a.conf": "2"}}}, readinessTaint=True,
                              leaveCordoned=True)
    await scenario.wait_ready()
    for name in (node, existing):
        await scenario.wait_node(name, "complete")
        await assert_serving(scenario, name)

    # `nodegate reset GATE`: every node runs the gate again from scratch.
    code, out = await nodegate(scenario, "reset", scenario.name, "--yes")
    assert code == 0, out

    async def restarted() -> bool:
        if keys.RESTART_ANNOTATION in ((await scenario.gate())["metadata"].get("annotations") or {}):
            return False
        return keys.reset_annotation(scenario.name) not in _annotations(await scenario.node(node))
    await wait_for(restarted, what="the reset acted on")
    await scenario.wait_ready()
    await scenario.wait_node(node, "complete")
    await assert_serving(scenario, node)

    # Deleted and created again. The node gets the readiness taint back by hand (as a node that rebooted
    # before completing would) while the new gate is paused: the new gate lifts it and must not hold it.
    await scenario.delete_gate()
    assert keys.HAND_OFF_RELEASED in _annotations(await scenario.node(node)), "the release did not outlive the gate"
    await scenario.apply_gate({"runtime": PKG}, readinessTaint=True, leaveCordoned=True, paused=True)
    await scenario.wait_condition("Paused")
    await scenario.kube.patch(NODES, node, {"spec": {"taints": [TAINT]}}, patch_type="strategic")
    assert _tainted(await scenario.node(node))
    await scenario.patch_gate({"spec": {"paused": False}})
    await scenario.wait_node(node, "complete")

    async def lifted() -> bool:
        return not _tainted(await scenario.node(node))
    await wait_for(lifted, what="the readiness taint lifted by the new gate")
    await assert_serving(scenario, node)


async def nodegate(sc: Scenario, *argv: str) -> tuple[int, str]:
    """The `nodegate` command (`gate.cli.main.main`, what the entry point calls): exit code, stdout and stderr."""
    from gate.cli.main import main

    def run() -> tuple[int, str]:
        out = io.StringIO()
        with redirect_stdout(out), redirect_stderr(out):
            code = main([*argv, "--kubeconfig", str(sc.cluster.kubeconfig)])
        return code, out.getvalue()

    return await asyncio.to_thread(run)


async def test_two_gates_hold_a_joining_node_once_both_are_done_naming_the_one_that_asks_and_the_cli_shows_it(
        scenario: Scenario, webhook: Webhook) -> None:
    asking = f"{scenario.name}-asks"
    manifest = scenario.gate_manifest({"other": PKG}, readinessTaint=True, leaveCordoned=True, priority=300)
    manifest["metadata"]["name"] = asking
    await scenario.kube.apply(manifest, field_manager="test", force=True)
    try:
        await scenario.apply_gate({"runtime": PKG}, readinessTaint=True)  # asks for nothing
        await scenario.wait_ready()
        node = await join(scenario, f"{scenario.name}-9")
        await scenario.wait_node(node, "complete")
        obj = await wait_held(scenario, node, asking)
        assert keys.status_label(asking) in obj["metadata"]["labels"]
        assert obj["metadata"]["labels"][keys.status_label(asking)] == "complete", "held before both were done"
        # Where people look: `nodegate node list`, `nodegate status`, and `nodegate node release`.
        code, out = await nodegate(scenario, "node", "list", "-o", "json")
        assert code == 0, out
        [row] = [r for r in json.loads(out)["items"] if r["node"] == node]
        assert row["cordoned"] and row["heldForHandOffBy"] == asking
        code, out = await nodegate(scenario, "status", asking)
        assert code == 0 and "held for hand-off: 1 node(s)" in out and node in out, out

        # The hold outlives the gate that asked, and a round with an interrupt of the other gate.
        await scenario.delete_gate(asking)
        await scenario.apply_gate({"runtime": {**PKG, "version": "1.1.0",
                                               "interrupt": {"type": "service", "services": ["tuned"]}}},
                                  readinessTaint=True)

        async def upgraded() -> bool:
            state = await scenario.state(node)
            return state.get("status") == "complete" and state["installed"]["runtime"]["version"] == "1.1.0"
        await wait_for(upgraded, what=f"{node} upgraded by a round with a service restart")
        await wait_held(scenario, node, asking)

        code, out = await nodegate(scenario, "node", "release", node)
        assert code == 0 and "uncordoned" in out, out

        async def released() -> bool:
            return keys.HAND_OFF_RELEASED in _annotations(await scenario.node(node))
        await wait_for(released, what=f"{node}'s release noticed")
        await assert_serving(scenario, node)
        code, out = await nodegate(scenario, "node", "release", node)
        assert code == 2 and "not held for hand-off" not in out and "nothing to release" in out, out
    finally:
        with contextlib.suppress(NotFound):
            await scenario.kube.delete(NODEGATES, asking)
