"""The operator trusts only what it made and signed (issue 33, items 3 and 6), on the real API server.

* A stage pod is the operator's only when its uid is in the node's signed record and it still runs
  what the operator built (`gate.lifecycle.ownership`). An admin of the operator's namespace plants a
  pod with a stage pod's labels and annotations for a node in a running rollout, and a cluster admin
  writes another one's status as ended well: neither is read as the stage's success, each is reported
  once (Event `PodNotOurs`, `nodegate_pods_refused_total`), and the package still runs there.
* A staging or undo pod (no node's state records it) is the operator's only when it carries the
  operator's signature of its name and of what it runs. A namespace admin plants a succeeded staging
  pod under the very name a node's staging will use, and a pod patcher rewrites the generation on
  the operator's own staging pod: neither is read (the node is not cordoned), each is reported and
  deleted, and the node is staged by the operator's own pod.
* A ControllerRevision's signature covers its number: one renumbered by hand is not the operator's,
  so it decides neither the next number nor which revision is newest.
"""

from __future__ import annotations

import asyncio
import copy
import json

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.api.state import load_state
from gate.controller.pods import GATE_NAME_ANNOTATION, GENERATION_ANNOTATION, NODE_NAME_ANNOTATION, pod_steps
from gate.controller.podshape import SIGNATURE_ANNOTATION
from gate.devcluster.cluster import DevCluster
from gate.kube.client import CONTROLLER_REVISIONS, EVENTS, KWOK_STAGES, PODS, KubeClient
from gate.kube.errors import NotFound
from gate.lifecycle.node import Step
from gate.lifecycle.round import stage_fingerprint
from gate.lifecycle.staging import staging_pod_name
from gate.rollout.history import history_selector
from tests.conftest import Kubectl, unique
from tests.integration.operator.conftest import NAMESPACE, Scenario, StepLog, wait_for
from tests.security.helpers import operator_metrics, samples

PKG = {"version": "1.0.0", "image": "registry.example.com/cve-fix"}
RUNS = "test.nodegate.io/kwok-runs"  # a planted pod that kwok runs to the end like a stage pod


def _hang(nodes: list[str]) -> Obj:
    """A kwok Stage that holds the stage pods on `nodes` (but those labelled RUNS) where they are: the
    operator's own stage pod stays unfinished while the planted ones end."""
    kind = f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]'
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": "hang"}, "spec": {
        "resourceRef": {"apiGroup": "v1", "kind": "Pod"}, "weight": 1, "next": {},
        "selector": {"matchExpressions": [
            {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
            {"key": ".spec.nodeName", "operator": "In", "values": nodes},
            {"key": kind, "operator": "Exists"},
            {"key": f'.metadata.labels["{RUNS}"]', "operator": "DoesNotExist"},
            {"key": ".status.phase", "operator": "NotIn", "values": ["Succeeded", "Failed"]}]}}}


def _planted(real: Obj, name: str, *, runs: bool) -> Obj:
    """A pod with the real stage pod's labels and annotations (its gate, node, round, attempt and steps)
    and a container per step under the step's name, running nothing privileged."""
    meta = real["metadata"]
    labels = {**meta["labels"], **({RUNS: "true"} if runs else {})}
    containers = [{"name": c["name"], "image": "registry.example.com/anything:1", "command": ["true"]}
                  for c in [*(real["spec"].get("initContainers") or []), *real["spec"]["containers"]]]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": NAMESPACE, "labels": labels, "annotations": copy.deepcopy(meta["annotations"])},
        "spec": {"nodeName": real["spec"]["nodeName"], "restartPolicy": "Never",
                 "tolerations": [{"operator": "Exists"}], "initContainers": containers[:-1],
                 "containers": containers[-1:]}}


async def _not_ours(kube: KubeClient, gate: str) -> list[str]:
    events, _ = await kube.list(EVENTS, "default", field_selector=f"regarding.name={gate},reason=PodNotOurs")
    return [str(e.get("note", "")) for e in events]


async def test_a_planted_or_status_forged_stage_pod_is_reported_once_and_never_counted(
        kube: KubeClient, kubectl: Kubectl, scenario: Scenario, step_log: StepLog, cluster: DevCluster) -> None:
    [node] = await scenario.add_nodes(1)
    await scenario.inject(_hang([node]))
    await scenario.apply_gate({"cve-fix": PKG}, interruptionBudget={"percent": 100})

    async def real_pod() -> bool:
        return bool(step_log.of(scenario.name, node))

    await wait_for(real_pod, what="the operator's stage pod created")
    [record] = step_log.of(scenario.name, node)
    real = await kube.get(PODS, record.pod, NAMESPACE)
    assert [s.stage for s in pod_steps(real)] == ["apply"]

    admin = unique("ns-admin")  # may create pods in the operator's namespace, and nothing about NodeGates
    binding = unique("sec-nsadmin")
    kubectl.run("create", "rolebinding", binding, "-n", NAMESPACE, "--clusterrole=admin", f"--user={admin}")
    ran, forged = unique("ng-apply-planted"), unique("ng-apply-forged")
    try:
        for name, runs in ((ran, True), (forged, False)):
            proc = kubectl.run("create", "-f", "-", stdin=json.dumps(_planted(real, name, runs=runs)), as_user=admin,
                               check=False)
            assert proc.returncode == 0, proc.stderr
        # kwok (the "kubelet") runs the first to the end; the second's status is written by hand as ended well.
        done = {"phase": "Succeeded", "containerStatuses": [{
            "name": "apply-cve-fix", "ready": False, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}
        kubectl.run("patch", "pod", forged, "-n", NAMESPACE, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": done}))

        async def ended() -> bool:
            pods = [await kube.get(PODS, n, NAMESPACE) for n in (ran, forged)]
            return all(p["status"].get("phase") == "Succeeded" for p in pods)

        await wait_for(ended, what="both planted pods ended well")

        async def reported() -> bool:
            notes = await _not_ours(kube, scenario.name)
            return all(any(name in n for n in notes) for name in (ran, forged))

        await wait_for(reported, what="both planted pods reported")
        notes = await _not_ours(kube, scenario.name)
        assert all(node in n and "did not record creating" in n for n in notes), notes
        # A status update of the operator's own pod (as the kubelet sends) keeps its generation, and the
        # operator's cache keeps its digest from the copy before: the pod stays the operator's.
        kubectl.run("patch", "pod", record.pod, "-n", NAMESPACE, "--subresource=status",
                    "-p", json.dumps({"status": {"conditions": [{"type": "example.com/Seen", "status": "True"}]}}))
        seen = await kube.get(PODS, record.pod, NAMESPACE)
        assert seen["metadata"]["generation"] == real["metadata"]["generation"] == 1, seen["metadata"]
        # More looks at the node (a plan of the gate, the planted pods' own events): none counts them.
        await scenario.patch_gate({"metadata": {"annotations": {"example.com/nudge": "1"}}})
        await asyncio.sleep(2)
        state = load_state((await scenario.node(node))["metadata"]["annotations"][keys.state_annotation(scenario.name)])
        assert (state.status, state.phase) == ("in-progress", "stages"), state
        assert "cve-fix" not in state.installed, "a pod the operator did not make was read as the stage's success"
        assert list(state.pods) == [record.pod] and state.pods[record.pod].uid == real["metadata"]["uid"]
        assert len(await _not_ours(kube, scenario.name)) == 2, "reported more than once"
        counted = samples(operator_metrics(cluster), "nodegate_pods_refused_total")
        assert counted.get(f'{{gate="{scenario.name}"}}') == 2, counted
        # An image patched on the operator's own live pod (the API server bumps its generation): what it runs
        # changed since the operator recorded it, and it is reported, never read again.
        kubectl.run("patch", "pod", record.pod, "-n", NAMESPACE, "--type=json", "-p", json.dumps(
            [{"op": "replace", "path": "/spec/containers/0/image", "value": "registry.example.com/evil:1"}]))
        assert (await kube.get(PODS, record.pod, NAMESPACE))["metadata"]["generation"] == 2

        async def changed() -> bool:
            return any(record.pod in n and "changed since" in n for n in await _not_ours(kube, scenario.name))

        await wait_for(changed, what="the operator's pod with its image patched reported")
    finally:
        kubectl.run("delete", "rolebinding", binding, "-n", NAMESPACE, "--ignore-not-found", check=False)
        kubectl.run("delete", "pod", ran, forged, "-n", NAMESPACE, "--ignore-not-found", "--wait=false", check=False)
    # The hold lifted and the held pod deleted, the operator creates its pod again, and the package runs.
    for stage in scenario.stages:
        await kube.delete(KWOK_STAGES, stage)
    scenario.stages.clear()
    await kube.delete(PODS, record.pod, NAMESPACE)
    await scenario.wait_ready()
    state = load_state((await scenario.node(node))["metadata"]["annotations"][keys.state_annotation(scenario.name)])
    assert state.status == "complete" and "cve-fix" in state.installed
    assert len(step_log.uids[record.pod]) == 2, "the step ran in the operator's pod, created again under its name"


GRUB = {"version": "1.0.0", "image": "registry.example.com/grub-cmdline",  # stages its apply (the catalog's)
        "interrupt": {"type": "service", "services": ["svc"]}}


async def test_a_planted_or_edited_staging_pod_is_deleted_and_never_read(
        kube: KubeClient, kubectl: Kubectl, scenario: Scenario) -> None:
    [node] = await scenario.add_nodes(1)
    hold = _hang([node])  # the operator's staging pods stay unfinished; the planted one (RUNS) ends
    hold["metadata"]["name"] = unique("hang-staging")
    hold["spec"]["selector"]["matchExpressions"].append(
        {"key": f'.metadata.labels["{keys.STAGE_KIND_LABEL}"]', "operator": "In", "values": ["staging"]})
    await scenario.inject(hold)
    gate_obj = await scenario.apply_gate({"grub-cmdline": GRUB}, interruptionBudget={"percent": 100}, paused=True)
    gate = NodeGate.model_validate(await scenario.gate())
    step = Step("grub-cmdline", "apply", stage_fingerprint(gate.spec.packages["grub-cmdline"], "apply"))
    name = staging_pod_name(scenario.name, node, [step])  # what the node's staging pod will be called
    resumed = (gate.metadata.generation or 0) + 1

    admin, patcher = unique("ns-admin"), unique("pod-patcher")  # the second may get and patch pods, no more
    bindings = [unique("sec-nsadmin"), unique("sec-patcher")]
    kubectl.run("create", "rolebinding", bindings[0], "-n", NAMESPACE, "--clusterrole=admin", f"--user={admin}")
    kubectl.run("create", "role", bindings[1], "-n", NAMESPACE, "--verb=get,patch", "--resource=pods")
    kubectl.run("create", "rolebinding", bindings[1], "-n", NAMESPACE, f"--role={bindings[1]}", f"--user={patcher}")
    try:
        # A succeeded staging pod under that name, for the generation the resume brings, runs nothing privileged.
        planted = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": NAMESPACE,
            "labels": {keys.MANAGED_BY_LABEL: keys.MANAGER, keys.STAGE_KIND_LABEL: "staging", RUNS: "true"},
            "annotations": {GATE_NAME_ANNOTATION: scenario.name, NODE_NAME_ANNOTATION: node,
                            GENERATION_ANNOTATION: str(resumed),
                            "nodegate.io/steps": json.dumps([["grub-cmdline", "apply", step.fingerprint,
                                                              "apply-grub-cmdline"]])}},
            "spec": {"nodeName": node, "restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "apply-grub-cmdline", "image": "registry.example.com/anything:1",
                                     "command": ["true"]}]}}
        proc = kubectl.run("create", "-f", "-", "-o", "json", stdin=json.dumps(planted), as_user=admin, check=False)
        assert proc.returncode == 0, proc.stderr
        planted_uid = json.loads(proc.stdout)["metadata"]["uid"]

        async def ran() -> bool:  # or deleted already: the operator looks at staging pods while paused too
            try:
                return bool((await kube.get(PODS, name, NAMESPACE))["status"].get("phase") == "Succeeded")
            except NotFound:
                return True

        await wait_for(ran, what="the planted staging pod ended well, or gone")
        assert gate_obj["metadata"]["name"] == scenario.name
        await scenario.patch_gate({"spec": {"paused": False}})

        async def own() -> Obj | None:
            try:
                pod = await kube.get(PODS, name, NAMESPACE)
            except NotFound:
                return None
            return pod if pod["metadata"]["uid"] != planted_uid else None

        async def replaced() -> bool:
            return await own() is not None

        await wait_for(replaced, what="the planted pod deleted and the operator's own staging pod created")
        notes = await _not_ours(kube, scenario.name)
        assert any(name in n and "no signature" in n and "deletes it" in n for n in notes), notes
        real = await own()
        assert real is not None and real["metadata"]["annotations"].get(SIGNATURE_ANNOTATION), real["metadata"]
        node_obj = await scenario.node(node)
        assert not node_obj["spec"].get("unschedulable"), "cordoned on the planted pod's success"

        # The pod patcher rewrites the generation on the operator's own (held) staging pod: its signature no
        # longer matches; it is deleted and created again.
        first_uid = real["metadata"]["uid"]
        kubectl.run("annotate", "pod", name, "-n", NAMESPACE, "--overwrite", f"{GENERATION_ANNOTATION}=1",
                    as_user=patcher)

        async def again() -> bool:
            pod = await own()
            return pod is not None and pod["metadata"]["uid"] != first_uid

        await wait_for(again, what="the edited staging pod deleted and created again")
        notes = await _not_ours(kube, scenario.name)
        assert any(name in n and "does not match" in n for n in notes), notes
        assert not (await scenario.node(node))["spec"].get("unschedulable")
        state = (await scenario.node(node))["metadata"]["annotations"].get(keys.state_annotation(scenario.name))
        assert state is None or "grub-cmdline" not in load_state(state).installed
    finally:
        kubectl.run("delete", "rolebinding", *bindings, "-n", NAMESPACE, "--ignore-not-found", check=False)
        kubectl.run("delete", "role", bindings[1], "-n", NAMESPACE, "--ignore-not-found", check=False)
    # The hold lifted and the held pod deleted, the operator stages the node anew, and it goes through its round.
    for stage in scenario.stages:
        await kube.delete(KWOK_STAGES, stage)
    scenario.stages.clear()
    await kube.delete(PODS, name, NAMESPACE)
    await scenario.wait_ready()
    state = load_state((await scenario.node(node))["metadata"]["annotations"][keys.state_annotation(scenario.name)])
    assert state.status == "complete" and "grub-cmdline" in state.installed
    events, _ = await kube.list(EVENTS, "default", field_selector=f"regarding.name={node},reason=StagedWhole")
    assert events, "the operator's own staging was not the one the round took over"


async def test_a_renumbered_controller_revision_is_not_counted(kube: KubeClient, scenario: Scenario) -> None:
    """Whoever may patch ControllerRevisions in the operator's namespace renumbers the first spec's revision
    to be the newest: the operator does not count it (the next spec is numbered after its own revisions,
    not after the forged number), and when that spec is applied again it writes its revision anew."""
    versions = ("1.0.0", "1.1.0", "1.2.0")

    async def listed(count: int) -> list[Obj]:
        found: list[Obj] = []

        async def enough() -> bool:
            nonlocal found
            found, _ = await kube.list(CONTROLLER_REVISIONS, NAMESPACE, label_selector=history_selector(scenario.name))
            return len(found) >= count

        await wait_for(enough, what=f"{count} revisions of the gate")
        return found

    # uninstall enabled: the last step goes back to 1.0.0, a downgrade admission allows only with an uninstall path
    await scenario.apply_gate({"cve-fix": {**PKG, "version": versions[0], "uninstall": {"enabled": True}}},
                              interruptionBudget={"percent": 100})
    await scenario.wait_ready()
    [first] = await listed(1)
    await scenario.patch_gate({"spec": {"packages": {"cve-fix": {"version": versions[1]}}}})
    await scenario.wait_ready()
    await listed(2)
    forged = await kube.patch(CONTROLLER_REVISIONS, first["metadata"]["name"], {"revision": 99}, namespace=NAMESPACE)
    assert forged["revision"] == 99
    await scenario.patch_gate({"spec": {"packages": {"cve-fix": {"version": versions[2]}}}})
    await scenario.wait_ready()
    objs = await listed(3)
    numbers = sorted(o["revision"] for o in objs)
    assert numbers == [2, 3, 99], f"the forged number decided the next one: {numbers}"
    # The first spec again: its revision (the forged one) is not the operator's, so it is written anew.
    await scenario.patch_gate({"spec": {"packages": {"cve-fix": {"version": versions[0]}}}})

    async def rewritten() -> bool:
        obj = await kube.get(CONTROLLER_REVISIONS, first["metadata"]["name"], NAMESPACE)
        return bool(obj["metadata"]["uid"] != first["metadata"]["uid"])

    await wait_for(rewritten, what="the renumbered revision written anew")
    again = await kube.get(CONTROLLER_REVISIONS, first["metadata"]["name"], NAMESPACE)
    assert again["revision"] == 4 and again["metadata"]["annotations"][GATE_NAME_ANNOTATION] == scenario.name


async def test_the_operators_own_manifest_as_the_api_server_stores_it_is_adopted(
        kube: KubeClient, operator: int) -> None:
    """The adoption after a crash between a pod's create and its record compares the pod found with the
    manifest the operator builds: the API server's defaults (pull policy, termination message path, a
    volume's mode, a fieldRef's apiVersion) must not read as a difference, or the operator's own pod
    would be refused. Its stored shape is also what gets recorded: the same digest as the cache's."""
    from gate.api.nodegate import Interrupt, NodeGate
    from gate.controller.pods import stage_pod, stage_pod_fields, stage_pod_view, staging_pod, unstage_pod
    from gate.controller.podshape import built_digest, shape_differences, shape_digest
    from gate.controller.settings import OperatorSettings
    from gate.lifecycle.node import PodRequest, Step

    env = [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    gate = NodeGate.model_validate({
        "metadata": {"name": unique("adopt"), "uid": "0b5e2f9e-0000-4000-8000-000000000001"},
        "spec": {"packages": {"cve-fix": {**PKG, "config": {"a.conf": "x=1"}, "env": env}}}})
    settings = OperatorSettings(namespace=NAMESPACE)
    stages = PodRequest(name=unique("ng-apply-adopt"), kind="stages", round=1,
                        steps=(Step("cve-fix", "apply", "1.0.0/x", version="1.0.0"),
                               Step("cve-fix", "config", "c", version="1.0.0")))
    reboot = PodRequest(name=unique("ng-interrupt-adopt"), kind="interrupt", round=1,
                        steps=(Step(None, "interrupt", "reboot:"),), interrupt=Interrupt(type="reboot"))
    for request in (stages, reboot):
        body = stage_pod(gate, "kwok-node-0", request, settings)
        stored = await kube.create(PODS, body, NAMESPACE, dry_run=True)
        assert stored["metadata"]["uid"] and shape_differences(body, stored) == [], request.kind
        assert stage_pod_view(stage_pod_fields(stored)).shape == shape_digest(stored)
    # A staging pod and its undo are signed in their create, over `built_digest` of the manifest: the pod as the
    # API server stores it has the same (or the operator's own staging pods would read as not its own).
    steps = (Step("cve-fix", "apply", "1.0.0/x", version="1.0.0"),)
    staging = staging_pod(gate, "kwok-node-0", unique("ng-staging-adopt"), steps, settings)
    stored = await kube.create(PODS, staging, NAMESPACE, dry_run=True)
    assert built_digest(stored) == built_digest(staging) != built_digest({**staging, "metadata": {
        **staging["metadata"], "annotations": {**staging["metadata"]["annotations"], GENERATION_ANNOTATION: "7"}}})
    undo = unstage_pod(stored, unique("ng-unstage-adopt"))
    assert built_digest(await kube.create(PODS, undo, NAMESPACE, dry_run=True)) == built_digest(undo)
