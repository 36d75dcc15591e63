"""Issue 33 on a real node: a package user's env and config never run as root on the node.

Two ways past admission, each with payloads that would leave a marker file on the node's root:

* a value admission cannot judge: grub-cmdline's declared `KERNEL_ARGS` holding a command
  substitution (the drop-in is a shell fragment update-grub sources), and a config key
  `sitecustomize.py` the package does not declare. The agent refuses both by name before it touches
  the host.
* admission bypassed: the validating webhook configuration is removed for the write, and the
  sysctl-tuning gate gets PYTHONPATH at its config directory (with `sitecustomize.py`),
  PYTHONWARNINGS plus BROWSER, BASH_ENV and LD_PRELOAD. The operator leaves them out of the stage
  pod, the agent's interpreter is isolated, and the agent refuses the names it was told of.

Either way the node fails with the agent's message naming the input, and no marker appears.
"""

from __future__ import annotations

import json

import pytest
import yaml

from gate.api import keys
from gate.devcluster.services import WEBHOOK_CONFIGURATION
from tests.realnode.conftest import POOL_LABEL, RealCluster
from tests.realnode.test_failures import wait_failed

pytestmark = pytest.mark.timeout(1800)


def _gate(name: str, node: str, package: str, spec: dict[str, object]) -> str:
    return yaml.safe_dump({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {POOL_LABEL: "real", "kubernetes.io/hostname": node}},
                 "interruptionBudget": {"count": 1}, "packages": {package: spec}},
    })


def _payloads(marker: str) -> tuple[dict[str, str], dict[str, str]]:
    """(env, config) whose every payload touches `marker` on the node's root (the agent container sees it
    at /host, a step chrooted into the host at /)."""
    touch = f"touch /host{marker} {marker}"
    env = {"PYTHONPATH": "/nodegate-config", "PYTHONWARNINGS": "all:0:antigravity.x:0:0",
           "BROWSER": f"/bin/sh -c '{touch}' #%s", "BASH_ENV": "/nodegate-config/evil.sh",
           "LD_PRELOAD": "/nodegate-config/evil.so"}
    config = {"sitecustomize.py": f"import os\nos.system({touch!r})\n", "evil.sh": touch + "\n"}
    return env, config


def failed_message(real: RealCluster, gate: str, node: str) -> str:
    """The agent's own message in the node's failure record: the record keeps the agent's JSON summary
    of the stage as its message, whose `message` is what the agent refused, unquoted."""
    key = keys.state_annotation(gate).replace(".", "\\.")
    state = real.kubectl.run("get", "node", node, "-o", f"jsonpath={{.metadata.annotations.{key}}}")
    failure = json.loads(state.stdout or "{}").get("failure") or {}
    message = str(failure.get("message", ""))
    try:
        summary = json.loads(message)
    except ValueError:
        return message
    return str(summary.get("message", message)) if isinstance(summary, dict) else message


def _marker_absent(real: RealCluster, node: str, marker: str) -> None:
    assert real.node_file(node, marker) is None, f"{marker} appeared on {node}: a gate's input ran as root"


def test_a_declared_but_hostile_value_and_an_undeclared_key_are_refused_on_the_node(
        real: RealCluster, gate_name: str) -> None:
    node = real.nodes[0]
    marker = f"/nodegate-pwned-{gate_name}"
    written = real.kubectl.run("apply", "-f", "-", check=False, stdin=_gate(gate_name, node, "grub-cmdline", {
        "version": "1.0.0", "image": real.images["grub-cmdline"], "interrupt": {"type": "none"},
        "env": [{"name": "KERNEL_ARGS", "value": f"quiet $(touch {marker})"}],
        "config": {"sitecustomize.py": f"import os\nos.system('touch /host{marker}')\n"}}))
    if written.returncode != 0:
        # A webhook that binds the catalog (the chart's default; the dev cluster's binds nothing) refuses
        # the write itself, naming both fields.
        assert "spec.packages[grub-cmdline].env[0].value" in written.stderr, written.stderr
        assert "spec.packages[grub-cmdline].config[sitecustomize.py]" in written.stderr, written.stderr
        _marker_absent(real, node, marker)
        return
    try:
        wait_failed(real, gate_name)
        message = failed_message(real, gate_name, node)
        assert "env KERNEL_ARGS=" in message and "does not match the pattern" in message, message
        assert "config key 'sitecustomize.py' is not accepted: package grub-cmdline declares no config" in message, \
            message
        _marker_absent(real, node, marker)
        assert real.node_file(node, "/etc/default/grub.d/90-nodegate.cfg") is None, "the agent touched the host"
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--wait=true", "--timeout=120s")
    _marker_absent(real, node, marker)


def test_with_admission_bypassed_the_loader_and_interpreter_variables_still_run_nothing(
        real: RealCluster, gate_name: str) -> None:
    node = real.nodes[0]
    marker = f"/nodegate-pwned-{gate_name}"
    env, config = _payloads(marker)
    # Admission would refuse every one of these names (tests/security/test_package_images.py); remove its
    # validating half for this write, as a cluster whose webhook failed open would.
    real.kubectl.run("delete", "validatingwebhookconfiguration", WEBHOOK_CONFIGURATION, "--ignore-not-found")
    try:
        real.kubectl.apply(_gate(gate_name, node, "sysctl-tuning", {
            "version": "1.0.0", "image": real.images["sysctl-tuning"], "interrupt": {"type": "none"},
            "env": [{"name": k, "value": v} for k, v in env.items()], "config": config}))
    finally:
        real.stop_services()
        real.start_services()
    try:
        wait_failed(real, gate_name)
        message = failed_message(real, gate_name, node)
        # The node's failure message keeps 1,000 characters: the first refusals, by name.
        assert "config key 'evil.sh' is not accepted: package sysctl-tuning declares no config" in message, message
        for name in ("PYTHONPATH", "PYTHONWARNINGS", "BROWSER"):
            assert f"env {name} is refused" in message, (name, message)
        _marker_absent(real, node, marker)
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--wait=true", "--timeout=120s")
    _marker_absent(real, node, marker)
