"""The four example packages, rolled by the operator over real nodes under a budget of one.

Each effect is checked from outside, in the node's own root and namespaces: the files the packages
write, the node's own `net.core.somaxconn`, the GRUB drop-in and grub.cfg written by Debian's
update-grub, the kernel command line the node booted with after its reboot, the initramfs rebuilt
with the blocklist, and chronyd restarted under the node's service manager. Deleting the gate
uninstalls them under the same budget, with a reboot of its own, and the test checks each is undone.

sysctl-tuning also sets two `vm.*` values, and those are this machine's (the kernel is shared): the
test records them first and puts them back whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.request
from pathlib import Path

import pytest
import yaml

from gate.testing.watcher import InvariantWatcher, WatchReport
from tests.realnode.conftest import POOL_LABEL, RealCluster, real_pool_gate

# The first test of the tier builds what is missing (node root, images): minutes from a cold cache.
pytestmark = pytest.mark.timeout(1800)

SHARED_KERNEL_VALUES = ("vm.swappiness", "vm.max_map_count")
CHRONY_CONFIG = "pool time.nodegate.invalid iburst maxsources 2\n"
KERNEL_ARG = "nodegate.realnode=1"


def four_packages_gate(name: str, images: dict[str, str]) -> str:
    return real_pool_gate(name, {
        "sysctl-tuning": {"version": "1.0.0", "image": images["sysctl-tuning"], "interrupt": {"type": "none"},
                          "uninstall": {"enabled": True}},
        "chrony-conf": {"version": "1.0.0", "image": images["chrony-conf"],
                        "interrupt": {"type": "service", "services": ["chrony.service"]},
                        "config": {"pool.conf": CHRONY_CONFIG}, "uninstall": {"enabled": True}},
        "grub-cmdline": {"version": "1.0.0", "image": images["grub-cmdline"], "interrupt": {"type": "reboot"},
                         "env": [{"name": "KERNEL_ARGS", "value": KERNEL_ARG}],
                         "uninstall": {"enabled": True}},
        "module-blocklist": {"version": "1.0.0", "image": images["module-blocklist"],
                             "interrupt": {"type": "reboot"},
                             "env": [{"name": "MODULES", "value": "nodegate_no_such_module"}],
                             "uninstall": {"enabled": True}},
    })


def node_event_reasons(real: RealCluster, node: str) -> list[str]:
    selector = f"involvedObject.kind=Node,involvedObject.name={node}"
    out = real.kubectl.run("get", "events", "-A", "--field-selector", selector,
                           "-o", "jsonpath={.items[*].reason}").stdout
    return out.split()


def operator_metric(real: RealCluster, name: str, label: str) -> float:
    """The sum of the tier's operator's series of `name` whose labels include `label`."""
    port = real.dev.ports()["operator"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        rows = resp.read().decode().splitlines()
    return sum(float(row.rpartition(" ")[2]) for row in rows if row.startswith(f"{name}{{") and label in row)


def machine_value(key: str) -> str:
    return Path("/proc/sys", *key.split(".")).read_text().strip()


def set_machine_value(key: str, value: str) -> None:
    Path("/proc/sys", *key.split(".")).write_text(value)


async def test_the_example_packages_change_real_nodes_one_at_a_time_and_uninstall_restores_them(
        real: RealCluster, gate_name: str) -> None:
    before = {node: {"somaxconn": real.node_sh(node, "sysctl -n net.core.somaxconn").stdout.strip(),
                     "boot_id": real.boot_id(node)} for node in real.nodes}
    async with await real.dev.client() as kube:
        report = await roll_and_remove(real, gate_name, InvariantWatcher(kube), before)
    # The budget of one held: never two real nodes disrupted at once, nothing left cordoned.
    assert not report.violations, report.summary()
    # Both nodes were disrupted (cordoned for the reboot) and judged against the ceiling of one, by the
    # installation and again by the removal.
    assert report.coverage.disruptions_judged >= 2 * len(real.nodes), report.summary()
    assert report.coverage.interrupts_judged >= 2 * len(real.nodes), report.summary()


async def roll_and_remove(real: RealCluster, gate_name: str, watcher: InvariantWatcher,
                          before: dict[str, dict[str, str]]) -> WatchReport:
    saved = {key: machine_value(key) for key in SHARED_KERNEL_VALUES}
    await watcher.start()
    try:
        real.kubectl.apply(four_packages_gate(gate_name, real.images))
        await asyncio.to_thread(real.wait_complete, gate_name, 900.0)
        for node in real.nodes:
            # sysctl-tuning: the node's own network namespace has the value, not only the stage pod's.
            assert real.node_sh(node, "sysctl -n net.core.somaxconn").stdout.strip() == "8192"
            assert "net.core.somaxconn = 8192" in (real.node_file(node, "/etc/sysctl.d/90-nodegate-tuning.conf") or "")
            # chrony-conf: the gate's config is in place and chronyd was restarted under the node.
            assert real.node_file(node, "/etc/chrony/conf.d/nodegate-pool.conf") == CHRONY_CONFIG
            assert real.node_sh(node, "systemctl is-active chrony.service").stdout.strip() == "active"
            # grub-cmdline: Debian's update-grub put the argument in grub.cfg, and the node booted it.
            assert KERNEL_ARG in (real.node_file(node, "/etc/default/grub.d/90-nodegate.cfg") or "")
            assert KERNEL_ARG in (real.node_file(node, "/boot/grub/grub.cfg") or "")
            assert KERNEL_ARG in (real.node_file(node, "/proc/cmdline") or "")
            # module-blocklist: the blocklist is in the initramfs that update-initramfs rebuilt.
            listing = real.node_sh(node, "lsinitramfs /boot/initrd.img-*").stdout
            assert "etc/modprobe.d/nodegate-blocklist.conf" in listing
            # The reboot was real: the node came back with a new boot ID, and the control plane saw it
            # go NotReady (silent past the grace period) and the kubelet report it rebooted and Ready.
            assert real.boot_id(node) != before[node]["boot_id"]
            reasons = node_event_reasons(real, node)
            for reason in ("NodeNotReady", "Rebooted", "NodeReady"):
                assert reason in reasons, f"{node}: no {reason} event in {reasons}"
        # This machine's own value is untouched: only the node's network namespace changed.
        assert machine_value("net.core.somaxconn") != "8192" or before[real.nodes[0]]["somaxconn"] == "8192"

        installed_boot = {node: real.boot_id(node) for node in real.nodes}
        await asyncio.to_thread(real.delete_gate, gate_name, 900.0)
        for node in real.nodes:
            # The removal rebooted each node once more (grub-cmdline's and module-blocklist's uninstall
            # need it), and the post-uninstall check proved the kernel booted without the argument.
            assert real.boot_id(node) != installed_boot[node]
            assert KERNEL_ARG not in (real.node_file(node, "/proc/cmdline") or "")
            assert real.node_sh(node, "sysctl -n net.core.somaxconn").stdout.strip() == before[node]["somaxconn"]
            assert real.node_file(node, "/etc/sysctl.d/90-nodegate-tuning.conf") is None
            assert real.node_file(node, "/etc/chrony/conf.d/nodegate-pool.conf") is None
            assert real.node_file(node, "/etc/default/grub.d/90-nodegate.cfg") is None
            assert KERNEL_ARG not in (real.node_file(node, "/boot/grub/grub.cfg") or "")
            assert real.node_file(node, "/etc/modprobe.d/nodegate-blocklist.conf") is None
            listing = real.node_sh(node, "lsinitramfs /boot/initrd.img-*").stdout
            assert "etc/modprobe.d/nodegate-blocklist.conf" not in listing
    finally:
        report = await watcher.stop()
        with contextlib.suppress(AssertionError):
            real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=false")
        for key, value in saved.items():
            set_machine_value(key, value)
    return report


def test_a_net_sysctl_changes_the_nodes_network_namespace_not_the_stage_pods(real: RealCluster, gate_name: str) -> None:
    """Regression (issue 13): stage pods without hostNetwork ran `sysctl -p` in their own network
    namespace; the package's check read that copy back and passed while the node kept its value.
    Without a reboot to reload /etc/sysctl.d, only the node's own namespace can tell."""
    node = real.nodes[1]
    saved = {key: machine_value(key) for key in SHARED_KERNEL_VALUES}
    before = real.node_sh(node, "sysctl -n net.core.somaxconn").stdout.strip()
    assert before != "8192"
    real.kubectl.apply(yaml.safe_dump({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": gate_name},
        "spec": {"nodeSelector": {"matchLabels": {POOL_LABEL: "real", "kubernetes.io/hostname": node}},
                 "packages": {"sysctl-tuning": {"version": "1.0.0", "image": real.images["sysctl-tuning"],
                                                "interrupt": {"type": "none"}, "uninstall": {"enabled": True}}}},
    }))
    try:
        status = real.wait_complete(gate_name, 300.0)
        assert real.node_sh(node, "sysctl -n net.core.somaxconn").stdout.strip() == "8192"
        # The tier's operator enforces the dev signature policy: it ran the catalog image (pinned by digest
        # in the spec, so it has no image record) and its own agent image once it verified them.
        assert status["nodes"]["complete"] == 1
        assert operator_metric(real, "nodegate_image_verifications_total", 'result="Verified"') >= 2
        real.delete_gate(gate_name, 300.0)
        assert real.node_sh(node, "sysctl -n net.core.somaxconn").stdout.strip() == before
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=false")
        for key, value in saved.items():
            set_machine_value(key, value)


def test_an_unsigned_image_is_held_under_the_tiers_enforcing_policy_and_no_real_node_is_cordoned(
        real: RealCluster, gate_name: str) -> None:
    """The tier's operator enforces the dev signature policy (conftest `signature_policy`): an image
    pushed to the dev registry under `nodegate/` without the dev key's signature holds its gate before
    any real node is cordoned, naming the image, its digest and the rule; the signed catalog images of
    the other tests run."""
    from gate.devcluster import cosign, registry

    port = int(real.registry.rpartition(":")[2])
    repository = f"nodegate/unsigned-{gate_name}"
    digest = registry.push_small_image(port, repository, "1.0.0", f"unsigned, for {gate_name}")
    image = f"{real.registry}/{repository}"
    real.kubectl.apply(real_pool_gate(gate_name, {"unsigned": {"version": "1.0.0", "image": image,
                                                               "interrupt": {"type": "reboot"}}}))
    try:
        def verified_condition() -> dict[str, str]:
            conditions = real.gate_status(gate_name).get("conditions") or []
            return next((c for c in conditions if c["type"] == "ImagesVerified"), {})

        real.wait("the unsigned image held", lambda: verified_condition().get("status") == "False", 120.0)
        held = verified_condition()
        assert held["reason"] == "SignatureMissing", held
        for part in ("package unsigned", f"{image}:1.0.0", digest, f"rule {cosign.DEV_RULE_NAME}"):
            assert part in held["message"], held["message"]
        # Held before anything: no real node cordoned, no stage pod of the gate, its record says why.
        records = {r["package"]: r for r in real.gate_status(gate_name).get("images") or []}
        assert records["unsigned"]["digest"] == digest
        assert records["unsigned"]["verified"]["reason"] == "SignatureMissing"
        for node in real.nodes:
            spec = yaml.safe_load(real.kubectl.run("get", "node", node, "-o", "yaml").stdout)["spec"]
            assert spec.get("unschedulable") is not True, node
        pods = real.kubectl.run("get", "pods", "-n", "nodegate-system", "-o",
                                "jsonpath={.items[*].metadata.annotations.nodegate\\.io/gate-name}").stdout.split()
        assert gate_name not in pods
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=false")
