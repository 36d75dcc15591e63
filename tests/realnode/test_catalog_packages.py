"""The catalog's packages rolled by the operator over real nodes: install, a config change, an upgrade, uninstall.

tuning:

Each effect is checked from outside, in the node's own root and namespaces: the node's own `net.*`
sysctls (its network namespace, never this machine's), the GRUB drop-in, grub.cfg written by
Debian's update-grub and the kernel command line the node booted with, and the limits a new PAM
session gets from Debian's runuser and pam_limits. Only namespaced sysctls are used: the kernel is
shared with this machine.

`service_<unit>.conf` is not rolled here: the dev nodes run no systemd (a systemctl stand-in), so
there is no drop-in loading to prove; the chroot tier covers it (tests/agent/test_tuning.py).

bind-mount and shellscript, in one gate without an interrupt: the bind mount must land in the node's
own mount namespace (the stage pod's would vanish with it), and the gate's scripts run on the node.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.realnode.conftest import RealCluster, real_pool_gate

pytestmark = pytest.mark.timeout(1800)

REPO = Path(__file__).resolve().parents[2]
KERNEL_ARG = "nodegate.tuning=1"
SOMAXCONN, KEEPALIVE, KEEPALIVE_CHANGED, NOFILE = "3333", "555", "444", "1234"
SESSION_NOFILE = "runuser -u root -- /bin/sh -c 'ulimit -Sn'"


def tuning_gate(name: str, image: str, config: dict[str, str], version: str = "1.0.0",
                interrupt: str = "reboot") -> str:
    return real_pool_gate(name, {"tuning": {
        "version": version, "image": image, "interrupt": {"type": interrupt}, "config": config,
        "configInterrupts": {"grub.conf": {"type": "reboot"}}, "uninstall": {"enabled": True}}})


def installed_version(real: RealCluster, node: str, gate: str) -> str | None:
    text = real.node_file(node, f"/var/lib/nodegate/{gate}/tuning/history.json")
    return None if text is None else json.loads(text).get("installed")


def next_version(directory: Path, version: str) -> Path:
    """A copy of packages/tuning under another version: the image an upgrade rolls to."""
    shutil.copytree(REPO / "packages" / "tuning", directory)
    manifest = directory / "package.yaml"
    manifest.write_text(manifest.read_text().replace("version: 1.0.0", f"version: {version}", 1))
    return directory


def node_state(real: RealCluster, node: str) -> dict[str, str]:
    sh = real.node_sh
    return {"somaxconn": sh(node, "sysctl -n net.core.somaxconn").stdout.strip(),
            "keepalive": sh(node, "sysctl -n net.ipv4.tcp_keepalive_time").stdout.strip(),
            "nofile": sh(node, SESSION_NOFILE).stdout.strip(), "boot_id": real.boot_id(node)}


def wait_rolled(real: RealCluster, name: str, ready: Any, what: str) -> None:
    """The gate's current generation complete on every node, and the effect seen on the nodes."""
    def done() -> bool:
        out = yaml.safe_load(real.kubectl.run("get", "nodegates.nodegate.io", name, "-o", "yaml").stdout)
        status, generation = out.get("status") or {}, out["metadata"]["generation"]
        nodes = status.get("nodes") or {}
        return (status.get("observedGeneration") == generation and bool(nodes.get("matched"))
                and nodes.get("complete") == nodes.get("matched") and all(ready(node) for node in real.nodes))

    real.wait(what, done, 900.0, every=3.0)


def test_tuning_installs_follows_a_config_change_upgrades_and_uninstall_restores_each_node(
        real: RealCluster, gate_name: str, tmp_path: Path) -> None:
    before = {node: node_state(real, node) for node in real.nodes}
    for state in before.values():
        assert (state["somaxconn"], state["keepalive"], state["nofile"]) != (SOMAXCONN, KEEPALIVE, NOFILE)
    tag = f"85-nodegate-tuning-{gate_name}"
    config = {"sysctl.conf": f"net.core.somaxconn = {SOMAXCONN}\nnet.ipv4.tcp_keepalive_time = {KEEPALIVE}\n",
              "grub.conf": f"{KERNEL_ARG}\n", "ulimit.conf": f"root soft nofile {NOFILE}\n"}
    image = real.images["tuning"]
    try:
        # Install: every key live on each node, the kernel argument booted (one node rebooted at a time).
        real.kubectl.apply(tuning_gate(gate_name, image, config))
        wait_rolled(real, gate_name, lambda node: KERNEL_ARG in (real.node_file(node, "/proc/cmdline") or ""),
                    "tuning installed and every node rebooted into the kernel argument")
        for node in real.nodes:
            now = node_state(real, node)
            assert (now["somaxconn"], now["keepalive"], now["nofile"]) == (SOMAXCONN, KEEPALIVE, NOFILE), node
            assert now["boot_id"] != before[node]["boot_id"], f"{node} did not reboot"
            assert f"net.core.somaxconn = {SOMAXCONN}" in (real.node_file(node, f"/etc/sysctl.d/{tag}.conf") or "")
            assert KERNEL_ARG in (real.node_file(node, f"/etc/default/grub.d/{tag}.cfg") or "")
            assert KERNEL_ARG in (real.node_file(node, "/boot/grub/grub.cfg") or "")
        # The kernel is shared, but these sysctls are each node's own: this machine kept its values.
        assert open("/proc/sys/net/core/somaxconn").read().strip() != SOMAXCONN

        # A config change: somaxconn and the limits leave the config, keepalive moves; grub.conf is
        # unchanged, so no reboot.
        changed = {"sysctl.conf": f"net.ipv4.tcp_keepalive_time = {KEEPALIVE_CHANGED}\n",
                   "grub.conf": config["grub.conf"]}
        booted = {node: real.boot_id(node) for node in real.nodes}
        real.kubectl.apply(tuning_gate(gate_name, image, changed))
        wait_rolled(real, gate_name, lambda node: node_state(real, node)["keepalive"] == KEEPALIVE_CHANGED,
                    "the config change on every node")
        for node in real.nodes:
            now = node_state(real, node)
            assert now["somaxconn"] == before[node]["somaxconn"], f"{node}: somaxconn not put back"
            assert now["nofile"] == before[node]["nofile"], f"{node}: the session limit not put back"
            assert real.node_file(node, f"/etc/security/limits.d/{tag}.conf") is None
            assert real.boot_id(node) == booted[node], f"{node} rebooted for a change that needs none"

        # An upgrade to 1.0.1, built and pushed by `package build`'s code; grub.conf is unchanged, so the
        # gate asks for no reboot. The upgrade stage re-syncs, and its check proves every key again.
        from gate.devcluster.images import build_package

        upgraded = build_package(next_version(tmp_path / "tuning", "1.0.1"), real.progress, cluster=real.dev,
                                 host=real.dev.network.gateway)
        assert upgraded.reference is not None
        real.kubectl.apply(tuning_gate(gate_name, upgraded.reference, changed, version="1.0.1", interrupt="none"))
        wait_rolled(real, gate_name, lambda node: installed_version(real, node, gate_name) == "1.0.1",
                    "the upgrade to 1.0.1 on every node")
        for node in real.nodes:
            now = node_state(real, node)
            assert (now["keepalive"], now["somaxconn"]) == (KEEPALIVE_CHANGED, before[node]["somaxconn"]), node
            assert KERNEL_ARG in (real.node_file(node, f"/etc/default/grub.d/{tag}.cfg") or "")

        # Uninstall: every original back, the drop-in gone and grub.cfg without the argument.
        real.delete_gate(gate_name, 900.0)
        for node in real.nodes:
            now = node_state(real, node)
            assert (now["somaxconn"], now["keepalive"], now["nofile"]) == (
                before[node]["somaxconn"], before[node]["keepalive"], before[node]["nofile"]), node
            for gone in (f"/etc/sysctl.d/{tag}.conf", f"/etc/default/grub.d/{tag}.cfg"):
                assert real.node_file(node, gone) is None, f"{node}: {gone} left behind"
            assert KERNEL_ARG not in (real.node_file(node, "/boot/grub/grub.cfg") or "")
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=false")


def two_packages_gate(name: str, images: dict[str, str], shell: dict[str, str], mounts: str) -> str:
    return real_pool_gate(name, {
        "shellscript": {"version": "1.0.0", "image": images["shellscript"], "interrupt": {"type": "none"},
                        "config": shell, "uninstall": {"enabled": True}},
        "bind-mount": {"version": "1.0.0", "image": images["bind-mount"], "interrupt": {"type": "none"},
                       "config": {"mounts": mounts}, "uninstall": {"enabled": True}},
    })


def test_bind_mount_lands_in_the_nodes_mount_namespace_and_shellscript_runs_the_gates_scripts(
        real: RealCluster, gate_name: str) -> None:
    shell = {"apply.sh": f"echo {gate_name} > /etc/nodegate-shellscript-{gate_name}\n",
             "apply-check.sh": f"grep -qx {gate_name} /etc/nodegate-shellscript-{gate_name}\n",
             "uninstall.sh": f"rm -f /etc/nodegate-shellscript-{gate_name}\n",
             "uninstall-check.sh": f"test ! -e /etc/nodegate-shellscript-{gate_name}\n"}
    source, target = f"/srv/{gate_name}-src", f"/mnt/{gate_name}"
    for node in real.nodes:
        real.node_sh(node, f"mkdir -p {source} && echo from-{node} > {source}/hello")
    try:
        real.kubectl.apply(two_packages_gate(gate_name, real.images, shell, f"{source} {target} ro\n"))
        real.wait_complete(gate_name, 600.0)
        for node in real.nodes:
            assert real.node_file(node, f"/etc/nodegate-shellscript-{gate_name}") == f"{gate_name}\n"
            # Seen from a shell in the node's own namespaces, not from any pod.
            assert real.node_file(node, f"{target}/hello") == f"from-{node}\n"
            mountinfo = real.node_sh(node, "cat /proc/self/mountinfo").stdout
            fields = [line.split() for line in mountinfo.splitlines()]
            assert any(f[4] == target and f[5].split(",")[0] == "ro" for f in fields), f"{node}: {target} not ro"
            assert f"{source} {target} none bind,ro 0 0" in (real.node_file(node, "/etc/fstab") or "")
        real.delete_gate(gate_name, 600.0)
        for node in real.nodes:
            assert real.node_file(node, f"/etc/nodegate-shellscript-{gate_name}") is None
            mountinfo = real.node_sh(node, "cat /proc/self/mountinfo").stdout
            assert not any(line.split()[4] == target for line in mountinfo.splitlines()), f"{node}: still mounted"
            assert real.node_sh(node, f"test ! -e {target}", check=False).returncode == 0, f"{node}: {target} left"
            assert "NodeGate bind-mount" not in (real.node_file(node, "/etc/fstab") or "")
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=false")
        for node in real.nodes:
            real.node_sh(node, f"umount {target} 2>/dev/null; rm -rf {source}", check=False)
