"""Failures on real nodes are real, and their own words reach the gate: containerd's for an image that
cannot be pulled, the agent's for a step that exits 1; `kubectl logs` of the failed stage pod works."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from gate.api import keys
from tests.realnode.conftest import POOL_LABEL, RealCluster

# The first test of the tier builds what is missing (node root, images): minutes from a cold cache.
pytestmark = pytest.mark.timeout(1800)


def one_package_gate(name: str, node: str, package: dict[str, object]) -> str:
    return yaml.safe_dump({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {POOL_LABEL: "real", "kubernetes.io/hostname": node}},
                 "interruptionBudget": {"count": 1}, "packages": {"grub-cmdline": package}},
    })


def failed_message(real: RealCluster, gate: str, node: str) -> str:
    key = keys.state_annotation(gate).replace(".", "\\.")
    state = real.kubectl.run("get", "node", node, "-o", f"jsonpath={{.metadata.annotations.{key}}}")
    return str(json.loads(state.stdout or "{}"))


def wait_failed(real: RealCluster, gate: str) -> dict[str, object]:
    real.wait(f"gate {gate} to report a failed node",
              lambda: (real.gate_status(gate).get("nodes") or {}).get("failed") == 1, 300.0, every=2.0)
    return real.gate_status(gate)


def package_logs(real: RealCluster, node: str, package: str, *args: str) -> str:
    ran = subprocess.run([sys.executable, "-m", "gate.cli.main", "package", "logs", node, package, *args,
                          "--kubeconfig", str(real.dev.kubeconfig)], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


def events(real: RealCluster, gate: str) -> str:
    return real.kubectl.run("get", "events", "-A", "--field-selector", f"involvedObject.name={gate}",
                            "-o", "jsonpath={range .items[*]}{.reason}: {.message}{'\\n'}{end}").stdout


def test_an_image_that_cannot_be_pulled_fails_the_node_with_containerds_message(
        real: RealCluster, gate_name: str) -> None:
    node = real.nodes[0]
    registry = real.images["grub-cmdline"].split("/", 1)[0]
    # Outside nodegate/ (which the tier's signature policy covers) and pinned by a digest nothing has:
    # the policy lets it run unverified (NotCovered) and resolves nothing, so the node's pull is what fails.
    missing = f"{registry}/elsewhere/no-such-package@sha256:{'0' * 64}"
    real.kubectl.apply(one_package_gate(gate_name, node, {
        "version": "1.0.0", "image": missing, "interrupt": {"type": "none"}}))
    try:
        # Said at once, before the 20 s pull grace fails the node: the gate's condition, the node's
        # condition and `nodegate status` name the node and the image, in the kubelet's words.
        seen: dict[str, str] = {}

        def said() -> bool:
            gate_conditions = {c["type"]: c for c in real.gate_status(gate_name).get("conditions") or []}
            nodes = {"failed": (real.gate_status(gate_name).get("nodes") or {}).get("failed")}
            node_obj = json.loads(real.kubectl.run("get", "node", node, "-o", "json").stdout)
            blocked = {c["type"]: c for c in node_obj["status"].get("conditions") or []}.get(
                keys.blocked_condition(gate_name))
            pulling = gate_conditions.get("ImagePullFailing")
            if pulling is None or blocked is None or nodes["failed"]:
                return False
            status = subprocess.run([sys.executable, "-m", "gate.cli.main", "status", gate_name, "--kubeconfig",
                                     str(real.dev.kubeconfig)], capture_output=True, text=True, timeout=60)
            seen.update(gate=pulling["message"], node=f"{blocked['reason']}: {blocked['message']}",
                        cli=status.stdout)
            return True

        real.wait("the failing pull to show on the gate and the node", said, 60.0, every=0.5)
        assert node in seen["gate"] and "no-such-package" in seen["gate"], seen
        assert seen["node"].startswith("ImagePullFailing:") and "no-such-package" in seen["node"], seen
        assert "cannot pull" in seen["cli"] and "no-such-package" in seen["cli"], seen["cli"]
        wait_failed(real, gate_name)
        message = failed_message(real, gate_name, node)
        # containerd's own words: the registry on this machine answered that the reference does not exist.
        assert "no-such-package" in message and "not found" in message, message
        assert "not found" in events(real, gate_name)
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--wait=true", "--timeout=120s")


def test_a_step_that_exits_1_fails_the_node_with_the_agents_message_and_its_pod_has_logs(
        real: RealCluster, gate_name: str) -> None:
    node = real.nodes[0]
    # write-drop-in.sh refuses empty arguments: the step exits 1 and says why, last. (Quotes and the like
    # never reach it: the package's gateEnv pattern has the agent refuse them before any step.)
    real.kubectl.apply(one_package_gate(gate_name, node, {
        "version": "1.0.0", "image": real.images["grub-cmdline"], "interrupt": {"type": "none"},
        "env": [{"name": "KERNEL_ARGS", "value": ""}]}))
    try:
        wait_failed(real, gate_name)
        message = failed_message(real, gate_name, node)
        assert "KERNEL_ARGS is empty: nothing to add" in message, message
        assert "KERNEL_ARGS is empty: nothing to add" in events(real, gate_name)
        pods = real.kubectl.run("get", "pods", "-n", "nodegate-system", "-l", "nodegate.io/gate=" + gate_name,
                                "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
        assert pods, "the failed stage's pod is kept for inspection"
        # The step's container: `<stage>-<package>` (the pod's last step is its container).
        logs = real.kubectl.run("logs", "-n", "nodegate-system", pods[0], "-c", "apply-grub-cmdline").stdout
        assert "KERNEL_ARGS is empty: nothing to add" in logs and "write-drop-in" in logs, logs
        # nodegate package logs reads the same log through the API server, all of it or its tail.
        full = package_logs(real, node, "grub-cmdline")
        assert "Started stage apply of grub-cmdline 1.0.0" in full, full
        tailed = package_logs(real, node, "grub-cmdline", "--tail", "1")
        assert "Started stage apply" not in tailed, tailed
        assert "The agent's summary: step apply/" in tailed, tailed
        # Nothing was changed on the node by the refused step.
        assert real.node_file(node, "/etc/default/grub.d/90-nodegate.cfg") is None
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--wait=true", "--timeout=120s")
