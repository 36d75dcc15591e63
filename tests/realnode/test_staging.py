"""Stage while serving on real nodes: the catalog's serving steps (grub-cmdline's drop-in and
update-grub, module-blocklist's blocklist and initramfs) run by the agent in a staging pod on a node
that is not cordoned, then their undo in an unstage pod puts the node back. The pods are the ones the
operator renders (`gate.controller.pods.stage_pod` with `part`), created here directly: this proves
the host's side of staging, each step and its undo, on Debian 12 and 13. Effects are read in the
node's own root."""

from __future__ import annotations

import json
from typing import Any

import yaml

from gate.api.nodegate import NodeGate
from gate.controller.pods import stage_pod
from gate.controller.settings import OperatorSettings
from gate.lifecycle.images import PodImage
from gate.lifecycle.node import PodRequest, Step
from tests.realnode.conftest import RealCluster

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
    real.node_sh(real.nodes[0], f"rm -rf {state} /var/log/nodegate/{gate_name}")
    real.node_sh(real.nodes[1], f"rm -rf {state} /var/log/nodegate/{gate_name}")
