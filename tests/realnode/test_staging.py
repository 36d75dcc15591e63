"""Stage while serving on real nodes: the catalog's serving steps (grub-cmdline's drop-in and
update-grub, module-blocklist's blocklist and initramfs) run by the agent in a staging pod on a node
that is not cordoned, then their undo in an unstage pod puts the node back.

The first test creates the pods the operator renders (`gate.controller.pods.stage_pod` with `part`)
directly: the host's side of staging, each step and its undo, on Debian 12 and 13. The second runs
them through the tier's operator (staging on, `OPERATOR_ENV`): staged before the cordon (the apply's
check with it: both packages stage their whole apply), the window's pod holding only the reboot, the
checks after it taking the staged work over on the host, and the undo of a deleted gate. Effects are read in the
node's own root."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from gate.api import keys
from gate.api.common import Obj
from gate.api.nodegate import NodeGate
from gate.controller.pods import GATE_NAME_ANNOTATION, pod_steps, stage_pod, stage_pod_view
from gate.controller.settings import OperatorSettings
from gate.kube.cache import WatchCache
from gate.kube.client import NODES, PODS
from gate.lifecycle.images import PodImage
from gate.lifecycle.node import PodRequest, Step
from gate.testing.watcher import InvariantWatcher
from tests.realnode.conftest import RealCluster, real_pool_gate

# The tier's first file builds what is missing (node root, images), and the second test reboots each node.
pytestmark = pytest.mark.timeout(1800)

KERNEL_ARG = "nodegate.staged=1"
MODULE = "nodegate_staged_no_such_module"  # blocked, never loaded: the kernel is this machine's
DROP_IN = "/etc/default/grub.d/90-nodegate.cfg"
BLOCKLIST = "/etc/modprobe.d/nodegate-blocklist.conf"


def _gate(real: RealCluster, name: str) -> NodeGate:
    return NodeGate.model_validate({"metadata": {"name": name, "generation": 1, "uid": "staging-test"}, "spec": {
        "packages": {
            "grub-cmdline": {"version": "1.0.0", "image": real.images["grub-cmdline"], "interrupt": {"type": "reboot"},
                             "env": [{"name": "KERNEL_ARGS", "value": KERNEL_ARG}]},
            "module-blocklist": {"version": "1.0.0", "image": real.images["module-blocklist"],
                                 "interrupt": {"type": "reboot"}, "timeout": "15m",
                                 "env": [{"name": "MODULES", "value": MODULE}]}}}})


def _run(real: RealCluster, gate: NodeGate, node: str, kind: str, part: str) -> dict[str, Any]:
    """Create the staging (or unstage) pod on `node`, wait for it to succeed, and return its agent's summary."""
    steps = tuple(Step(p, "apply", "fp", version="1.0.0") for p in ("grub-cmdline", "module-blocklist"))
    name = f"ng-{kind}-{node}-{gate.name}"[:63]
    settings = OperatorSettings(namespace="default", agent_image=real.images["nodegate"])
    images = {p: PodImage(real.images[p], "IfNotPresent") for p in ("grub-cmdline", "module-blocklist")}
    pod = stage_pod(gate, node, PodRequest(name, kind, steps, part=part), settings,  # type: ignore[arg-type]
                    images=images)
    pod["metadata"].pop("ownerReferences", None)  # no NodeGate object owns it here
    account = pod["spec"]["serviceAccountName"]  # the chart's, in its namespace; here made in `default`
    real.kubectl.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "ServiceAccount",
                                       "metadata": {"name": account, "namespace": "default"},
                                       "automountServiceAccountToken": False}))
    real.kubectl.apply(yaml.safe_dump(pod))

    def phase() -> str:
        return real.kubectl.run("get", "pod", name, "-o", "jsonpath={.status.phase}").stdout.strip()

    real.wait(f"{kind} pod on {node}", lambda: phase() in ("Succeeded", "Failed"), timeout=900, every=2.0)
    obj = json.loads(real.kubectl.run("get", "pod", name, "-o", "json").stdout)
    real.kubectl.run("delete", "pod", name, "--wait=false")
    summaries = [json.loads(s["state"]["terminated"]["message"])
                 for s in (obj["status"].get("initContainerStatuses") or []) + obj["status"]["containerStatuses"]
                 if s["name"].startswith("apply-") and s["state"].get("terminated", {}).get("message")]
    assert obj["status"]["phase"] == "Succeeded", summaries or obj["status"]
    last: dict[str, Any] = summaries[-1]
    return last


def _in_initramfs(real: RealCluster, node: str) -> set[str]:
    """Whether each initramfs of the node holds the blocklist: {'present'} or {'absent'} when they agree."""
    out = real.node_sh(node, "for i in /boot/initrd.img-*; do if lsinitramfs $i | grep -q "
                             "'etc/modprobe.d/nodegate-blocklist.conf$'; then echo present; else echo absent; fi; done")
    return set(out.stdout.split())


def test_the_catalogs_serving_steps_stage_on_a_serving_node_and_their_undo_puts_it_back(
        real_nodes: RealCluster, gate_name: str) -> None:
    real = real_nodes
    gate = _gate(real, gate_name)
    state = f"/var/lib/nodegate/{gate_name}"
    before = {node: (real.node_file(node, "/boot/grub/grub.cfg"), _in_initramfs(real, node)) for node in real.nodes}
    for node in real.nodes:
        assert real.node_file(node, DROP_IN) is None and real.node_file(node, BLOCKLIST) is None
        assert KERNEL_ARG not in (before[node][0] or "") and before[node][1] == {"absent"}

    for node in real.nodes:
        boot = real.boot_id(node)
        summary = _run(real, gate, node, "staging", "serving")
        # Staged: each step's effect is on disk for the next boot, the node still serves.
        assert summary["bootId"] == boot, summary
        assert KERNEL_ARG in (real.node_file(node, DROP_IN) or "")
        assert KERNEL_ARG in (real.node_file(node, "/boot/grub/grub.cfg") or "")
        assert f"install {MODULE} /bin/false" in (real.node_file(node, BLOCKLIST) or "")
        assert _in_initramfs(real, node) == {"present"}
        assert KERNEL_ARG not in (real.node_file(node, "/proc/cmdline") or "")  # not live: no reboot
        unschedulable = real.kubectl.run("get", "node", node, "-o", "jsonpath={.spec.unschedulable}").stdout
        assert unschedulable.strip() in ("", "false")
        for package, steps in (("grub-cmdline", ("write-drop-in", "update-grub")),
                               ("module-blocklist", ("write-blocklist", "update-initramfs"))):
            history = json.loads(real.node_file(node, f"{state}/{package}/history.json") or "{}")
            assert history["installed"] is None
            assert {k: v["done"] for k, v in history["staged"].items()} == {f"apply/{s}": True for s in steps}

        # The undo, the last step's first: the node is back to what it had, nothing is staged any more.
        _run(real, gate, node, "unstage", "undo")
        assert real.node_file(node, DROP_IN) is None and real.node_file(node, BLOCKLIST) is None
        assert real.node_file(node, "/boot/grub/grub.cfg") == before[node][0]
        assert _in_initramfs(real, node) == {"absent"}
        for package in ("grub-cmdline", "module-blocklist"):
            history = json.loads(real.node_file(node, f"{state}/{package}/history.json") or "{}")
            assert history["staged"] == {} and history["installed"] is None
            assert real.node_file(node, f"{state}/{package}/staged/saved") is None
    for node in real.nodes:
        real.node_sh(node, f"rm -rf {state} /var/log/nodegate/{gate_name}")


# ---- through the operator ------------------------------------------------------------------------

SERVING_STEPS = {"grub-cmdline": ("write-drop-in", "update-grub"),
                 "module-blocklist": ("write-blocklist", "update-initramfs")}


# A catalog package with no serving step: its staging only places its payload on the host, and its apply in
# the window reads it there (no payload copy in the window's pod).
PLACED = "sysctl-tuning"
SYSCTL_FILE = "/etc/sysctl.d/90-nodegate-tuning.conf"


def _packages(real: RealCluster) -> dict[str, Any]:
    return {PLACED: {"version": "1.0.0", "image": real.images[PLACED], "interrupt": {"type": "none"}},
            "grub-cmdline": {"version": "1.0.0", "image": real.images["grub-cmdline"],
                             "interrupt": {"type": "reboot"}, "env": [{"name": "KERNEL_ARGS", "value": KERNEL_ARG}]},
            "module-blocklist": {"version": "1.0.0", "image": real.images["module-blocklist"],
                                 "interrupt": {"type": "reboot"}, "timeout": "15m",
                                 "env": [{"name": "MODULES", "value": MODULE}]}}


@dataclass
class Seen:
    """The operator's pods and the nodes as a watch of the test's own saw them, each change with its etcd
    revision: "before" is the API server's order."""

    gates: set[str] = field(default_factory=set)
    staged: dict[tuple[str, str], int] = field(default_factory=dict)  # (gate, node) -> its staging pod's steps ended
    undone: dict[tuple[str, str], int] = field(default_factory=dict)  # (gate, node) -> its undo pod's steps ended
    failed: list[str] = field(default_factory=list)  # staging or undo pods that failed
    cordoned: dict[str, int] = field(default_factory=dict)  # node -> first unschedulable
    # (gate, node) -> each round pod's steps and containers (init and main), by pod name
    window: dict[tuple[str, str], dict[str, tuple[list[str], list[str]]]] = field(default_factory=dict)
    started_together: dict[str, list[str]] = field(default_factory=dict)  # pod -> its containers (not init)
    staging_steps: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # its staging pod's, in turn

    def on_pod(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        gate = (meta.get("annotations") or {}).get(GATE_NAME_ANNOTATION)
        pod_kind = (meta.get("labels") or {}).get(keys.STAGE_KIND_LABEL)
        if gate in self.gates and pod_kind not in ("staging", "unstage", "prepull") and kind != "DELETED":
            spec = pod.get("spec") or {}
            containers = [c["name"] for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])]
            self.window.setdefault((gate, spec.get("nodeName", "")), {})[meta["name"]] = (
                [f"{s.package or '-'}:{s.stage}" for s in pod_steps(pod)], containers)
            self.started_together[meta["name"]] = [c["name"] for c in spec.get("containers") or []]
        if gate not in self.gates or pod_kind not in ("staging", "unstage") or kind == "DELETED":
            return
        if pod_kind == "staging" and (meta.get("labels") or {}).get(keys.IN_TURN_LABEL) == "true":
            self.staging_steps[gate, pod["spec"].get("nodeName", "")] = sorted(
                c["name"] for c in pod["spec"].get("containers") or [])
        # Ended as the operator reads it: at its last step's end, before the kubelet writes the terminal
        # phase (`gate.controller.pods.stage_pod_ended`), which can come after the cordon.
        phase, key = stage_pod_view(pod).phase, (gate, pod["spec"].get("nodeName", ""))
        if phase == "failed":
            self.failed.append(meta["name"])
        elif phase == "succeeded":
            (self.staged if pod_kind == "staging" else self.undone).setdefault(key, int(meta["resourceVersion"]))

    def on_node(self, kind: str, node: Obj) -> None:
        if (node.get("spec") or {}).get("unschedulable"):
            self.cordoned.setdefault(node["metadata"]["name"], int(node["metadata"]["resourceVersion"]))


def _stage_logs(real: RealCluster, node: str, gate: str, package: str, stage: str) -> list[str]:
    """The node's logs of the gate's `stage` runs of `package`, oldest first."""
    where = f"/var/log/nodegate/{gate}/{package}/1.0.0"
    names = real.node_sh(node, f"ls {where}").stdout.split()
    return [real.node_file(node, f"{where}/{name}") or "" for name in sorted(names) if name.endswith(f"-{stage}.log")]


def _staged_on_host(real: RealCluster, node: str) -> bool:
    return (KERNEL_ARG in (real.node_file(node, DROP_IN) or "")
            and f"install {MODULE} /bin/false" in (real.node_file(node, BLOCKLIST) or "")
            and _in_initramfs(real, node) == {"present"})


async def test_the_operator_stages_before_the_cordon_runs_only_the_rest_in_the_window_and_undoes_a_deleted_gate(
        real: RealCluster, gate_name: str) -> None:
    from gate.devcluster.cluster import NAMESPACE

    before = {node: real.node_file(node, "/boot/grub/grub.cfg") for node in real.nodes}
    boots = {node: real.boot_id(node) for node in real.nodes}
    held, gate = f"{gate_name}-held", gate_name
    seen = Seen(gates={held, gate})
    policy = f"{gate_name}-closed"
    async with await real.dev.client() as kube:
        pods = WatchCache(kube, PODS, namespace=NAMESPACE, label_selector=f"{keys.MANAGED_BY_LABEL}={keys.MANAGER}")
        nodes = WatchCache(kube, NODES)
        pods.subscribe(seen.on_pod)
        nodes.subscribe(seen.on_node)
        watcher = InvariantWatcher(kube)
        await pods.start()
        await nodes.start()
        await watcher.start()
        try:
            # 1. A gate whose maintenance window never opens today: its nodes wait outside the window, a
            # reason that clears by itself, so both are staged ahead; neither is picked nor cordoned.
            # Deleted, the gate undoes both stagings before it goes: the nodes are back as they were.
            day = (datetime.now(UTC) + timedelta(days=3)).strftime("%a")
            real.kubectl.apply(yaml.safe_dump({
                "apiVersion": "nodegate.io/v1alpha1", "kind": "DeploymentPolicy", "metadata": {"name": policy},
                "spec": {"windows": [{"days": [day], "start": "00:00", "end": "00:01", "timeZone": "UTC"}]}}))
            manifest = yaml.safe_load(real_pool_gate(held, _packages(real)))
            manifest["spec"].pop("interruptionBudget")
            manifest["spec"]["deploymentPolicy"] = policy
            real.kubectl.apply(yaml.safe_dump(manifest))
            # In a thread: the watches above run on this loop.
            await asyncio.to_thread(real.wait, "both nodes staged ahead of a closed window",
                                    lambda: all((held, n) in seen.staged for n in real.nodes), 900.0, 2.0)
            for node in real.nodes:
                assert _staged_on_host(real, node), node
                assert KERNEL_ARG in (real.node_file(node, "/boot/grub/grub.cfg") or "")
                assert real.boot_id(node) == boots[node]  # staged on the serving node: no reboot
            await asyncio.to_thread(real.delete_gate, held, 600.0)
            assert all((held, n) in seen.undone and seen.staged[held, n] < seen.undone[held, n] for n in real.nodes), \
                (seen.staged, seen.undone)
            for node in real.nodes:
                assert real.node_file(node, DROP_IN) is None and real.node_file(node, BLOCKLIST) is None
                assert real.node_file(node, "/boot/grub/grub.cfg") == before[node]
                assert _in_initramfs(real, node) == {"absent"}
                for package in SERVING_STEPS:
                    history = json.loads(real.node_file(node, f"/var/lib/nodegate/{held}/{package}/history.json")
                                         or "{}")
                    assert history.get("staged") == {} and history.get("installed") is None, history
            assert not seen.cordoned, f"a node was cordoned for a gate that never opened: {seen.cordoned}"

            # 2. The same packages, rolled: each node is staged while it serves, cordoned only after its
            # staging pod succeeded, and its window runs the reboot alone, then the checks after it.
            real.kubectl.apply(real_pool_gate(gate, _packages(real)))
            await asyncio.to_thread(real.wait_complete, gate, 900.0)
            for node in real.nodes:
                assert (gate, node) in seen.staged, f"{node} was never staged"
                assert node in seen.cordoned, f"{node} was never cordoned for its reboot"
                assert seen.staged[gate, node] < seen.cordoned[node], f"{node} was cordoned before its staging ended"
                # The result on the host: the staged work went live with the reboot, and the round owns it.
                assert real.boot_id(node) != boots[node]
                assert KERNEL_ARG in (real.node_file(node, "/proc/cmdline") or "")
                assert _staged_on_host(real, node)
                for package, steps in SERVING_STEPS.items():
                    history = json.loads(real.node_file(node, f"/var/lib/nodegate/{gate}/{package}/history.json")
                                         or "{}")
                    assert history["installed"] == "1.0.0" and history["staged"] == {}, history
                    # The apply was staged whole: one apply run, the staging's (its serving steps, then
                    # its check), and no container of the package in the window's pod before the reboot;
                    # the check after the reboot took the staged record over as the apply of this round.
                    assert [r["stage"] for r in history["runs"]] == ["apply:serving", "apply:staged",
                                                                   "post-interrupt"], history["runs"]
                    assert history["runs"][1]["ok"] and history["runs"][1]["generation"] == \
                        history["runs"][0]["generation"], history["runs"]
                    runs = _stage_logs(real, node, gate, package, "apply")
                    assert len(runs) == 1, runs
                    for step in steps:
                        assert f"Running step apply/{step} " in runs[0], runs[0]
                    assert "Running step apply-check/" in runs[0], runs[0]
                    after = _stage_logs(real, node, gate, package, "post-interrupt")
                    assert len(after) == 1 and "Took over stage apply" in after[0], after
                # The window's pod that held the reboot: nothing of the packages staged whole (no payload copy,
                # no apply), and the apply of the package whose payload the staging placed, with no copy of it.
                window = seen.window[gate, node]
                first = [(name, steps, names) for name, (steps, names) in window.items() if "-:interrupt" in steps]
                assert len(first) == 1 and first[0][1] == [f"{PLACED}:apply", "-:interrupt"], window
                assert first[0][2] == [f"apply-{PLACED}", "interrupt"], window
                # ... in a chain, as a pod that ends with a reboot keeps (gate.controller.steporder): the kubelet saw
                # the apply end before the reboot started.
                assert seen.started_together[first[0][0]] == ["interrupt"], seen.started_together
                # The staging pod's steps ran in turn: all of them the pod's containers, started together.
                assert seen.staging_steps[gate, node] == sorted(
                    [f"apply-{PLACED}", *(f"apply-{p}" for p in SERVING_STEPS)]), seen.staging_steps
                assert sorted(s for steps, _ in window.values() for s in steps) == sorted(
                    [f"{PLACED}:apply", "-:interrupt", *(f"{p}:post-interrupt" for p in SERVING_STEPS)]), window
                placed = json.loads(real.node_file(node, f"/var/lib/nodegate/{gate}/{PLACED}/history.json") or "{}")
                assert [r["stage"] for r in placed["runs"]] == ["apply:serving", "apply"], placed["runs"]
                assert placed["installed"] == "1.0.0" and placed["payloads"] == {"1.0.0": real.images[PLACED]}, placed
                assert "Running step apply/load " in _stage_logs(real, node, gate, PLACED, "apply")[-1]
                # The checks after the reboot read the payload the staging left on the host: no copy in their pod.
                [(pod, checks)] = [(n, names) for n, (steps, names) in window.items() if "-:interrupt" not in steps]
                assert sorted(checks) == sorted(f"post-interrupt-{p}" for p in SERVING_STEPS), window
                # ... and run side by side: all of them the pod's containers, none an init container.
                assert sorted(seen.started_together[pod]) == sorted(checks), seen.started_together[pod]
            assert not seen.failed, seen.failed
        finally:
            report = await watcher.stop()
            await pods.stop()
            await nodes.stop()
            for name in (held, gate):
                with contextlib.suppress(AssertionError):
                    real.kubectl.run("delete", "nodegates.nodegate.io", name, "--ignore-not-found", "--wait=false")
            with contextlib.suppress(AssertionError):
                real.kubectl.run("delete", "deploymentpolicies.nodegate.io", policy, "--ignore-not-found")
    assert not report.violations, report.summary()
    await asyncio.to_thread(real.delete_gate, gate, 600.0)
    # The packages stay installed (no uninstall): the test takes them off the hosts for the tier's next tests.
    for node in real.nodes:
        real.node_sh(node, f"rm -rf {DROP_IN} {BLOCKLIST} {SYSCTL_FILE} /var/lib/nodegate/{held} "
                           f"/var/lib/nodegate/{gate} /var/log/nodegate/{held} /var/log/nodegate/{gate} && "
                           "update-grub && update-initramfs -u -k all", check=True)
