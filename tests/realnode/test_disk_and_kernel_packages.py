"""packages/lvm and packages/node-setup rolled by the operator over real nodes, and what this machine lets them prove.

lvm: this machine's kernel has no device-mapper (CONFIG_MD is not set; it loads no modules), so no
logical volume can be activated on it, in a real node or anywhere else; the volume group, the
filesystem and the mount are proven in the chroot tier (tests/agent/test_lvm.py). What a real node
proves is the refusal: a loop device of this machine (the nodes' /dev is the kernel's, shared) holding
ext4 is refused by the node's own wipefs, naming the node, the disk and the signature, and nothing is
written to it or to the node.

node-setup: the kernel is this machine's too, so `uname -r` in a node never changes. A real node
proves the install step finding the root's kernel package (the node's dpkg), the hold (the node's
apt-mark) and GRUB's default (a drop-in and the node's own update-grub), then their removal. The
comparison after a reboot is proven failing here, naming the node and both releases; its passing
side is proven in the chroot tier with a fake boot loader and uname (tests/agent/test_node_setup.py).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from gate.api import keys
from tests.realnode.conftest import POOL_LABEL, RealCluster

pytestmark = pytest.mark.timeout(1800)


def one_node_gate(name: str, node: str, package: str, spec: dict[str, object]) -> str:
    return yaml.safe_dump({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {POOL_LABEL: "real", "kubernetes.io/hostname": node}},
                 "interruptionBudget": {"count": 1}, "packages": {package: spec}},
    })


def failed_message(real: RealCluster, gate: str, node: str) -> str:
    real.wait(f"gate {gate} to report a failed node",
              lambda: (real.gate_status(gate).get("nodes") or {}).get("failed") == 1, 600.0, every=2.0)
    key = keys.state_annotation(gate).replace(".", "\\.")
    state = real.kubectl.run("get", "node", node, "-o", f"jsonpath={{.metadata.annotations.{key}}}")
    return str(json.loads(state.stdout or "{}"))


def test_lvm_refuses_a_loop_disk_holding_ext4_on_a_real_node_naming_node_disk_and_signature(
        real: RealCluster, gate_name: str, tmp_path: Path) -> None:
    node = real.nodes[0]
    image = tmp_path / "disk.img"
    with open(image, "wb") as out:
        out.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    disk = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True,
                          check=True).stdout.strip()
    mount_point = f"/mnt/{gate_name}"
    try:
        real.node_sh(node, f"test -b {disk}")  # the node sees the kernel's loop device
        real.kubectl.apply(one_node_gate(gate_name, node, "lvm", {
            "version": "1.0.0", "image": real.images["lvm"], "interrupt": {"type": "none"}, "retries": 0,
            "config": {"disks": disk, "vg_name": gate_name, "mount_point": mount_point},
            "uninstall": {"enabled": True}}))
        message = failed_message(real, gate_name, node)
        assert (f"disk {disk} on {node} holds data (ext4 at offset 0x438): refusing to use it; "
                "set config wipe: true to erase it") in message, message
        # Nothing was written: the filesystem is still there, the node has no mount or fstab entry.
        probe = subprocess.run(["blkid", "-p", "-s", "TYPE", "-o", "value", disk], capture_output=True, text=True)
        assert probe.stdout.strip() == "ext4"
        assert real.node_sh(node, f"test ! -e {mount_point}", check=False).returncode == 0
        assert "NodeGate lvm" not in (real.node_file(node, "/etc/fstab") or "")
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=true",
                         "--timeout=100s", check=False)
        subprocess.run(["losetup", "--detach", disk], capture_output=True)


def root_kernel(real: RealCluster, node: str) -> str:
    images = real.node_sh(node, "ls /boot").stdout.split()
    releases = sorted(name.removeprefix("vmlinuz-") for name in images if name.startswith("vmlinuz-"))
    assert releases, f"{node} has no kernel in /boot"
    return releases[-1]


def status(real: RealCluster, node: str, package: str) -> str:
    """dpkg's wanted and current state of PACKAGE on the node: "ii" installed, "hi" installed and held."""
    return real.node_sh(node, f"dpkg-query -W -f '${{db:Status-Abbrev}}' {package}").stdout[:2]


def grub_default(real: RealCluster, node: str) -> str:
    cfg = real.node_file(node, "/boot/grub/grub.cfg") or ""
    found = re.findall(r'^\s*set default="([^$"]*)"$', cfg, re.M)
    return found[-1] if found else ""


def test_node_setup_holds_the_kernel_and_makes_it_grubs_default_on_real_nodes_then_releases_it(
        real: RealCluster, gate_name: str) -> None:
    # One gate per node: the nodes run different Debian releases, each with a kernel of its own.
    kernels = {node: root_kernel(real, node) for node in real.nodes}
    gates = {node: f"{gate_name}-{i}" for i, node in enumerate(real.nodes)}
    drop_ins = {node: f"/etc/default/grub.d/86-nodegate-node-setup-{gates[node]}.cfg" for node in real.nodes}
    for node, kernel in kernels.items():
        assert f"linux-image-{kernel}" not in real.node_sh(node, "apt-mark showhold").stdout.split(), (
            f"{node}: already held")
    try:
        for node, kernel in kernels.items():
            real.kubectl.apply(one_node_gate(gates[node], node, "node-setup", {
                "version": "1.0.0", "image": real.images["node-setup"], "interrupt": {"type": "none"},
                "config": {"kernel": kernel}, "uninstall": {"enabled": True}}))
        for node, kernel in kernels.items():
            real.wait_complete(gates[node], 600.0)
            package = f"linux-image-{kernel}"
            assert package in real.node_sh(node, "apt-mark showhold").stdout.split(), f"{node}: not held"
            assert status(real, node, package) == "hi", f"{node}: {package} not installed and held in dpkg"
            default = grub_default(real, node)
            # Debian's update-grub wrote the drop-in's menu path; it names this kernel's (non-recovery) entry.
            assert re.fullmatch(rf"gnulinux-advanced-[-0-9a-f]+>gnulinux-{re.escape(kernel)}-advanced-[-0-9a-f]+",
                                default), f"{node}: {default}"
            assert f'GRUB_DEFAULT="{default}"' in (real.node_file(node, drop_ins[node]) or "")
        for node, kernel in kernels.items():
            real.delete_gate(gates[node], 600.0)
            package = f"linux-image-{kernel}"
            assert package not in real.node_sh(node, "apt-mark showhold").stdout.split(), f"{node}: still held"
            assert real.node_file(node, drop_ins[node]) is None, f"{node}: {drop_ins[node]} left behind"
            assert grub_default(real, node) == "0", f"{node}: GRUB's default not put back"
            # The kernel package was the root's own: it stays.
            assert status(real, node, package) == "ii", f"{node}: {package} not installed, or still held"
    finally:
        for gate in gates.values():
            real.kubectl.run("delete", "nodegates.nodegate.io", gate, "--ignore-not-found", "--wait=false")


def test_node_setup_after_a_real_reboot_fails_naming_the_node_and_both_kernels_as_the_kernel_is_shared(
        real: RealCluster, gate_name: str) -> None:
    node = real.nodes[1]
    kernel = root_kernel(real, node)
    running = subprocess.run(["uname", "-r"], capture_output=True, text=True, check=True).stdout.strip()
    assert running != kernel, "this machine runs the node root's kernel: the failing side cannot be shown"
    booted = real.boot_id(node)
    drop_in = f"/etc/default/grub.d/86-nodegate-node-setup-{gate_name}.cfg"
    try:
        real.kubectl.apply(one_node_gate(gate_name, node, "node-setup", {
            # No retries: the failure is the point, and a retry would only repeat it.
            "version": "1.0.0", "image": real.images["node-setup"], "interrupt": {"type": "reboot"}, "retries": 0,
            "config": {"kernel": kernel}, "uninstall": {"enabled": True}}))
        message = failed_message(real, gate_name, node)
        assert real.boot_id(node) != booted, f"{node} did not reboot"
        assert f"node {node} runs kernel {running}, want {kernel}" in message, message
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=true",
                         "--timeout=100s", check=False)
        real.node_sh(node, f"apt-mark unhold linux-image-{kernel} >/dev/null; rm -f {drop_in}; "
                     "update-grub >/dev/null 2>&1", check=False)
