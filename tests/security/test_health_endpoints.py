"""A DeploymentPolicy writer cannot aim the operator at an address (issue 33, item 4).

The attacker is a policy editor: an identity that may write DeploymentPolicies and nothing else (no
package right, no gate right), through `kubectl --as` against the real API server and webhook. A
listener on another loopback address (127.0.0.9) stands for the metadata service or an internal admin
API: it records every request it gets. The editor tries every way a policy could name it; a gate made
by an admin then uses the editor's policy, and the operator handles that gate while the listener
counts. Nothing reaches it; the gate and the policy say why, naming the field.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import pytest
import yaml
from aiohttp import web

from gate.kube.client import EVENTS, POLICIES, KubeClient
from tests.conftest import Kubectl, unique
from tests.integration.conftest import Webhook
from tests.integration.operator.conftest import Scenario, wait_for

PKG = {"version": "1.0.0", "image": "registry.example.com/sysctl-tuning"}


class Trap:
    """An HTTP listener that answers like Prometheus would and records every request."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.url = ""

    async def any(self, request: web.Request) -> web.Response:
        self.hits.append(f"{request.method} {request.path_qs}")
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": []}})


@pytest.fixture
async def trap() -> AsyncIterator[Trap]:
    found = Trap()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", found.any)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.9", 0)
    await site.start()
    found.url = f"http://127.0.0.9:{runner.addresses[0][1]}"
    try:
        yield found
    finally:
        await runner.cleanup()


@pytest.fixture
def policy_editor(kubectl: Kubectl, webhook: Webhook) -> Iterator[str]:
    """A user who may write DeploymentPolicies, and nothing else of NodeGate."""
    user, role = unique("polly"), unique("policy-editor")
    kubectl.apply(yaml.safe_dump({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
        "rules": [{"apiGroups": ["nodegate.io"], "resources": ["deploymentpolicies"],
                   "verbs": ["get", "list", "create", "update", "patch"]}]}))
    kubectl.run("create", "clusterrolebinding", role, f"--clusterrole={role}", f"--user={user}")
    try:
        yield user
    finally:
        kubectl.run("delete", "clusterrolebinding", role, "--ignore-not-found", check=False)
        kubectl.run("delete", "clusterrole", role, "--ignore-not-found", check=False)


def _policy(name: str, prometheus: dict[str, str]) -> str:
    return json.dumps({"apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": name},
                       "spec": {"default": {"budget": {"count": 1},
                                            "health": {"soak": "1s", "prometheus": prometheus}}}})


async def _events(kube: KubeClient, gate: str, reason: str) -> list[dict[str, object]]:
    events, _ = await kube.list(EVENTS, "default", field_selector=f"regarding.name={gate},reason={reason}")
    return events


async def test_a_policy_editor_cannot_make_the_operator_ask_an_address_and_an_unknown_endpoint_is_refused(
        scenario: Scenario, kubectl: Kubectl, policy_editor: str, trap: Trap) -> None:
    query = 'ALERTS{node="$NODE"}'
    name = f"{scenario.name}-p"

    def as_editor(manifest: str) -> tuple[int, str]:
        proc = kubectl.run("create", "-f", "-", stdin=manifest, as_user=policy_editor, check=False)
        return proc.returncode, proc.stderr + proc.stdout

    # An address, in every field a policy has for it: the old `url`, and the endpoint's name.
    code, out = as_editor(_policy(name, {"url": trap.url, "query": query}))
    assert code != 0 and "url" in out, out  # no such field any more (and `endpoint` is required)
    code, out = as_editor(_policy(name, {"endpoint": trap.url, "query": query}))
    assert code != 0 and "endpoint" in out, out  # a name, not an address: refused by the schema
    code, out = as_editor(_policy(name, {"endpoint": "127-0-0-9", "query": query}))  # a name, and unknown
    assert code == 0, out
    scenario.policies.append(name)

    # An admin's gate uses the editor's policy: the operator refuses the endpoint it does not know.
    await scenario.add_nodes(1)
    [node] = scenario.nodes
    await scenario.apply_gate({"tuning": PKG}, deploymentPolicy=name)
    gate = await scenario.wait_condition("Stalled")
    stalled = {c["type"]: c for c in gate["status"]["conditions"]}["Stalled"]
    assert stalled["reason"] == "EndpointNotConfigured", stalled
    assert ("spec.default.health.prometheus.endpoint: Prometheus endpoint '127-0-0-9' is not one the operator's "
            "installer configured" in stalled["message"]), stalled["message"]

    async def event() -> bool:
        return bool(await _events(scenario.kube, scenario.name, "EndpointNotConfigured"))

    await wait_for(event, what="a Warning Event EndpointNotConfigured on the gate")

    async def policy_says() -> bool:
        conds = {c["type"]: c for c in ((await scenario.kube.get(POLICIES, name)).get("status") or {})
                 .get("conditions") or []}
        return conds.get("Ready", {}).get("status") == "False" and "127-0-0-9" in conds["Ready"].get("message", "")

    await wait_for(policy_says, what="the policy's Ready=False naming the endpoint")
    assert (await scenario.state(node)) == {}  # nothing started on the node
    assert trap.hits == []

    # A node already soaking when its policy comes to name an unknown endpoint (an admin's edits here:
    # the edit of a policy in use is not the editor's to make once it needs `use`): its signal is
    # unreadable, saying so, and still nothing is asked.
    await scenario.kube.patch(POLICIES, name, {"spec": {"default": {"health": {"soak": "1h", "prometheus": None}}}},
                              patch_type="merge")
    await _soaking(scenario, node)
    await scenario.kube.patch(POLICIES, name, {"spec": {"default": {"health": {"prometheus": {
        "endpoint": "127-0-0-9", "query": query}}}}}, patch_type="merge")

    async def unreadable() -> bool:
        return "no endpoint named '127-0-0-9'" in ((await scenario.state(node)).get("healthUnreadable") or "")

    await wait_for(unreadable, what="the soaking node's signal unreadable, naming the endpoint")
    state = await scenario.state(node)
    assert (state["status"], state["phase"]) == ("in-progress", "soak") and "nothing was asked" in \
        state["healthUnreadable"], state
    assert trap.hits == []


async def _soaking(sc: Scenario, node: str) -> None:
    async def soaking() -> bool:
        state = await sc.state(node)
        return state.get("status") == "in-progress" and state.get("phase") == "soak"

    await wait_for(soaking, what=f"{node} in its soak")
