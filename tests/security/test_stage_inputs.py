"""A stage pod's inputs cannot be swapped: a ConfigMap that someone with write access to the operator's
namespace created ahead under the content-addressed name of a package's config is never taken as
NodeGate's. The operator's create is answered 409, it reads what is there, and the node fails for that
gate with reason ConfigMapNotOurs, naming the ConfigMap; no stage pod is created. Once the planted
ConfigMap is gone, a reset runs the node with the operator's own.

The attacker is a namespace admin of the operator's namespace (the `admin` ClusterRole bound there),
who may create ConfigMaps but has no right on NodeGates, and reads the gate's uid the way anyone
allowed to list gates can."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from gate.api import keys
from gate.api.nodegate import NodeGate
from gate.controller.pods import config_map, config_map_name, owner_reference
from gate.controller.settings import OperatorSettings
from gate.kube.client import CONFIGMAPS, NODES
from gate.kube.errors import NotFound
from tests.conftest import Kubectl, unique
from tests.integration.operator.conftest import Scenario, StepLog, wait_for

NS = "nodegate-system"
CONFIG = {"sysctl.conf": "vm.swappiness = 10\n"}


@pytest.fixture(scope="module")
def namespace_admin(kubectl: Kubectl) -> Iterator[str]:
    user = unique("cm-admin")
    binding = unique("sec-cm-admin")
    kubectl.run("create", "rolebinding", binding, "-n", NS, "--clusterrole=admin", f"--user={user}")
    yield user
    kubectl.run("delete", "rolebinding", binding, "-n", NS, "--ignore-not-found", check=False)


def _planted(gate: NodeGate, how: str) -> dict[str, object]:
    """The ConfigMap the attacker creates ahead under the gate's name for the package's config."""
    ours = config_map(gate, "tuning", OperatorSettings(namespace=NS))
    if how == "other content, dressed as NodeGate's":
        # Everything the operator would write, but one more key and no immutability (it can change later).
        meta = ours["metadata"]
        return {**ours, "immutable": False, "data": {**CONFIG, "evil.conf": "kernel.modules_disabled = 0\n"},
                "metadata": {**meta, "ownerReferences": [owner_reference(gate)]}}
    assert how == "the same content, mutable and not owned"
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": ours["metadata"]["name"], "namespace": NS},
            "data": dict(CONFIG)}


@pytest.mark.parametrize("how", ["other content, dressed as NodeGate's", "the same content, mutable and not owned"])
async def test_a_configmap_created_ahead_under_the_content_addressed_name_is_never_taken(
        scenario: Scenario, step_log: StepLog, kubectl: Kubectl, namespace_admin: str, how: str) -> None:
    [node] = await scenario.add_nodes(1)
    await scenario.apply_gate({"tuning": {"version": "1.0.0", "image": "registry.example.com/tuning",
                                          "config": CONFIG}}, paused=True)
    gate = NodeGate.model_validate(await scenario.gate())
    name = config_map_name(gate, "tuning", gate.spec.packages["tuning"])
    planted = _planted(gate, how)
    proc = kubectl.run("create", "-f", "-", stdin=yaml.safe_dump(planted), as_user=namespace_admin, check=False)
    assert proc.returncode == 0, proc.stderr  # RBAC allows it: the operator is what must not take it
    try:
        await scenario.patch_gate({"spec": {"paused": False}})
        await scenario.wait_node(node, "failed")
        failure = (await scenario.state(node))["failure"]
        assert (failure["reason"], failure["package"], failure["stage"]) == ("ConfigMapNotOurs", "tuning", "apply")
        assert f"ConfigMap {NS}/{name} exists but is not NodeGate's config of package tuning" in failure["message"]
        assert "Nothing ran" in failure["message"]
        assert step_log.of(scenario.name) == [], "a stage pod was created with the planted ConfigMap"
        live = await scenario.kube.get(CONFIGMAPS, name, NS)
        assert live["data"] == planted["data"]  # left as it was, for whoever investigates

        # The way back: the planted ConfigMap removed, a reset runs the node with the operator's own.
        await scenario.kube.delete(CONFIGMAPS, name, NS)

        async def gone() -> bool:
            try:
                await scenario.kube.get(CONFIGMAPS, name, NS)
                return False
            except NotFound:
                return True

        await wait_for(gone, what=f"ConfigMap {name} deleted")
        await scenario.kube.patch(NODES, node, {"metadata": {"annotations": {keys.reset_annotation(scenario.name):
                                                                             "now"}}})
        await scenario.wait_node(node, "complete")
        ours = await scenario.kube.get(CONFIGMAPS, name, NS)
        assert ours["data"] == CONFIG and ours["immutable"] is True
        assert [o["uid"] for o in ours["metadata"]["ownerReferences"]] == [gate.metadata.uid]
        records = step_log.of(scenario.name)
        assert records and all(r.succeeded for r in records)
        assert all("--config-digest" in r.args for r in records)
    finally:
        kubectl.run("delete", "configmap", name, "-n", NS, "--ignore-not-found", check=False)
