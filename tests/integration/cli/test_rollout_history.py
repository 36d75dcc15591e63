"""A gate's previous specs as ControllerRevisions, on the real control plane: the operator records one per
rollout spec (numbered, reused when a spec comes back, pruned past the limit, only its own trusted), and
`nodegate rollout history` / `nodegate rollout undo` read them and write one back as the person running it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.state import rollout_hash
from gate.controller.settings import OperatorSettings
from gate.devcluster.cluster import DevCluster
from gate.kube.client import CLUSTERROLEBINDINGS, CLUSTERROLES, CONTROLLER_REVISIONS, SERVICEACCOUNTS, KubeClient
from gate.rollout.history import SIGNATURE_ANNOTATION, history_selector
from tests.integration.cli.conftest import Cli
from tests.integration.operator.conftest import NAMESPACE, Scenario, wait_for

FORGED_SIG = "20200101T000000Z:" + "0" * 64


def pkg(version: str) -> Obj:
    # With an uninstall path: admission refuses a downgrade by hand (an undo is one) without it.
    return {"version": version, "image": "registry.example.com/tool", "retries": 0, "uninstall": {"enabled": True}}


async def revisions(sc: Scenario) -> dict[int, Obj]:
    """The gate's ControllerRevisions in the operator's namespace, by number."""
    items, _ = await sc.kube.list(CONTROLLER_REVISIONS, NAMESPACE, label_selector=history_selector(sc.name))
    return {r["revision"]: r for r in items}


def versions(history: dict[int, Obj]) -> dict[int, str]:
    return {n: r["data"]["spec"]["packages"]["tool"]["version"] for n, r in history.items()}


async def wait_versions(sc: Scenario, want: dict[int, str]) -> dict[int, Obj]:
    async def reached() -> bool:
        return versions(await revisions(sc)) == want
    await wait_for(reached, what=f"revisions {want}")
    return await revisions(sc)


async def installed(sc: Scenario, node: str) -> str | None:
    return ((await sc.state(node)).get("installed") or {}).get("tool", {}).get("version")


async def test_each_rollout_spec_is_a_revision_and_undo_rolls_the_previous_one_back_out(
        scenario: Scenario, cli: Cli) -> None:
    g = scenario.name
    nodes = await scenario.add_nodes(2)
    gate = await scenario.apply_gate({"tool": pkg("1.0.0")})
    first = await wait_versions(scenario, {1: "1.0.0"})
    [owner] = first[1]["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("NodeGate", g, gate["metadata"]["uid"],
                                                                              True)
    assert first[1]["metadata"]["name"] == f"{g}-{first[1]['metadata']['labels']['nodegate.io/rollout-hash']}"
    assert "paused" not in first[1]["data"]["spec"]
    await scenario.wait_ready()
    assert await cli.fails("rollout", "undo", g) == (
        f"error: NodeGate {g}: no previous revision to go back to (revision(s) kept: 1); the gate has had one "
        "rollout spec only, or its older ones were pruned")

    # A pause is no rollout: no revision. The next version is revision 2.
    await scenario.apply_gate({"tool": pkg("1.0.0")}, paused=True)
    await scenario.apply_gate({"tool": pkg("2.0.0")})
    await wait_versions(scenario, {1: "1.0.0", 2: "2.0.0"})
    await scenario.wait_ready()
    assert [await installed(scenario, n) for n in nodes] == ["2.0.0", "2.0.0"]

    text = (await cli.ok("rollout", "history", g)).out
    rows = [line.split() for line in text.splitlines()[2:]]
    assert [(r[0], r[-1]) for r in rows] == [("1", "tool@1.0.0"), ("2", "tool@2.0.0")]
    assert [r[-2] == "*" for r in rows] == [False, True], text
    one = json.loads((await cli.ok("rollout", "history", g, "--revision", "1", "-o", "json")).out)
    assert one["revision"] == 1 and one["spec"]["packages"]["tool"]["version"] == "1.0.0"
    assert await cli.fails("rollout", "history", g, "--revision", "5") == (
        f"error: no revision 5 of NodeGate {g}; it has revision(s) 1, 2")

    dry = (await cli.ok("rollout", "undo", g, "--dry-run")).out
    assert "rolled back to the spec of revision 1 (tool@1.0.0; was tool@2.0.0)" in dry and "dry run" in dry
    assert (await scenario.gate())["spec"]["packages"]["tool"]["version"] == "2.0.0"

    done = (await cli.ok("rollout", "undo", g)).out
    assert done.startswith(f"NodeGate {g}: rolled back to the spec of revision 1 (tool@1.0.0; was tool@2.0.0).")
    assert (await scenario.gate())["spec"]["packages"]["tool"]["version"] == "1.0.0"
    # The spec came back: its revision is reused, renumbered as the newest, and it rolls out again.
    back = await wait_versions(scenario, {2: "2.0.0", 3: "1.0.0"})
    assert back[3]["metadata"]["name"] == first[1]["metadata"]["name"]
    await scenario.wait_ready()
    assert [await installed(scenario, n) for n in nodes] == ["1.0.0", "1.0.0"]

    assert (await cli.ok("rollout", "undo", g, "--to-revision", "3")).out == (
        f"NodeGate {g} is at revision 3's spec already; nothing changed.\n")
    assert await cli.fails("rollout", "undo", g, "--to-revision", "1") == (
        f"error: NodeGate {g}: no revision 1 of this gate; it has revision(s) 2, 3 (`nodegate rollout history` "
        "lists them)")
    await cli.ok("rollout", "undo", g, "--to-revision", "2")
    await wait_versions(scenario, {3: "1.0.0", 4: "2.0.0"})


async def test_history_keeps_the_limit_and_only_what_the_operator_signed(scenario: Scenario, cli: Cli) -> None:
    g = scenario.name
    limit = OperatorSettings().revision_history_limit  # the session's operator runs with the default
    gate = await scenario.apply_gate({"tool": pkg("1.0.0")}, paused=True)  # paused: specs only, no rounds
    await wait_versions(scenario, {1: "1.0.0"})
    uid = gate["metadata"]["uid"]
    # Someone with write access to the operator's namespace forges revisions under the gate's label and
    # owner: one with a high number, and one squatting the name the next spec's revision will have.
    owner = {"apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "name": g, "uid": uid, "controller": True}
    forged_spec = {**(await revisions(scenario))[1]["data"]["spec"],
                   "packages": {"tool": pkg("6.6.6")}}

    def forged(name: str, number: int, spec_hash: str) -> Obj:
        return {"apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": name, "namespace": NAMESPACE, "ownerReferences": [owner],
                             "labels": {"nodegate.io/gate": g, "nodegate.io/rollout-hash": spec_hash},
                             "annotations": {SIGNATURE_ANNOTATION: FORGED_SIG}},
                "data": {"spec": forged_spec}, "revision": number}

    await scenario.kube.create(CONTROLLER_REVISIONS, forged(f"{g}-forged", 50, "forged"), NAMESPACE)
    # The name the operator will give version 1.0.1: the rollout hash fills defaults in, as the webhook does.
    squat_hash = rollout_hash(NodeGate.model_validate(scenario.gate_manifest({"tool": pkg("1.0.1")}, paused=True)))
    squat = f"{g}-{squat_hash}"
    await scenario.kube.create(CONTROLLER_REVISIONS, forged(squat, 60, squat_hash), NAMESPACE)
    await scenario.apply_gate({"tool": pkg("1.0.1")}, paused=True)

    async def own_revision_of_101() -> bool:
        history = {r["metadata"]["name"]: r for r in (await revisions(scenario)).values()}
        return squat in history and history[squat]["revision"] == 2
    await wait_for(own_revision_of_101, what="the operator's own revision 2 under the squatted name")
    history = await revisions(scenario)
    assert sorted(history) == [1, 2, 50], "numbered on from the operator's own; the foreign one left alone"
    assert versions(history) == {1: "1.0.0", 2: "1.0.1", 50: "6.6.6"}
    assert history[2]["metadata"]["annotations"][SIGNATURE_ANNOTATION] != FORGED_SIG, "the squatter was replaced"

    # Many specs: the current one and `limit` previous ones are kept, numbered on from the operator's own.
    async def own() -> dict[int, Obj]:
        return {n: r for n, r in (await revisions(scenario)).items() if r["metadata"]["name"] != f"{g}-forged"}

    for i in range(limit + 2):  # one at a time: specs written faster than the operator looks may share one look
        await scenario.apply_gate({"tool": pkg(f"2.0.{i}")}, paused=True)

        async def newest(i: int = i) -> bool:
            mine = await own()
            return versions(mine)[max(mine)] == f"2.0.{i}"
        await wait_for(newest, what=f"revision of 2.0.{i}")
    async def pruned() -> bool:
        return len(await own()) == limit + 1
    await wait_for(pruned, what=f"{limit + 1} revisions kept")
    mine = await own()
    assert max(mine) == 2 + limit + 2
    assert sorted(versions(mine).values()) == sorted(f"2.0.{i}" for i in range(1, limit + 2))
    assert max(mine) < 50 and 50 in await revisions(scenario)


async def test_undo_is_a_write_by_the_person_and_admission_checks_their_package_rights(
        scenario: Scenario, cli: Cli, cluster: DevCluster, kube: KubeClient, webhook: Any, tmp_path: Path) -> None:
    from gate.devcluster.services import service_account_kubeconfig

    g = scenario.name
    await scenario.apply_gate({"other": pkg("1.0.0")}, paused=True)
    await wait_for(lambda: _count(scenario, 1), what="revision 1")
    await scenario.apply_gate({"tool": pkg("1.0.0")}, paused=True)
    await wait_for(lambda: _count(scenario, 2), what="revision 2")

    who = f"{g}-undoer"[:63]
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": who},
            "rules": [{"apiGroups": ["nodegate.io"], "resources": ["nodegates"], "verbs": ["get", "patch"]},
                      {"apiGroups": ["apps"], "resources": ["controllerrevisions"], "verbs": ["list"]},
                      {"apiGroups": ["nodegate.io"], "resources": ["packages"], "verbs": ["use"],
                       "resourceNames": ["tool"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": who},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": who},
               "subjects": [{"kind": "ServiceAccount", "name": who, "namespace": "default"}]}
    await kube.create(SERVICEACCOUNTS, {"apiVersion": "v1", "kind": "ServiceAccount",
                                        "metadata": {"name": who, "namespace": "default"}}, "default")
    await kube.create(CLUSTERROLES, role)
    await kube.create(CLUSTERROLEBINDINGS, binding)
    try:
        config = str(await service_account_kubeconfig(cluster, who, "default", tmp_path / "kubeconfig", hours=1))
        line = await cli.fails("rollout", "undo", g, kubeconfig=config)
        assert line.startswith("error: ") and "other" in line and f"system:serviceaccount:default:{who}" in line, line
        assert "tool" in (await scenario.gate())["spec"]["packages"], "nothing was written"

        role["rules"][2]["resourceNames"] = ["tool", "other"]
        await kube.apply(role, field_manager="test", force=True)

        async def undone() -> bool:
            result = await cli("rollout", "undo", g, kubeconfig=config)
            return result.code == 0
        await wait_for(undone, what="undo allowed once the person may use package other")
        assert list((await scenario.gate())["spec"]["packages"]) == ["other"]
        assert (await scenario.gate())["spec"]["paused"] is True, "undo keeps paused as it is"
    finally:
        await kube.delete(CLUSTERROLEBINDINGS, who)
        await kube.delete(CLUSTERROLES, who)
        await kube.delete(SERVICEACCOUNTS, who, "default")


async def _count(sc: Scenario, n: int) -> bool:
    return len(await revisions(sc)) == n
