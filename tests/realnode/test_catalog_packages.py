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

kdump, on one node, from a file: apt mirror the test gives it: what is the node's own (apt, GRUB, the
reboot into crashkernel=, the uninstall) is proven; the service and a loaded crash kernel cannot exist
on a dev node (no systemd; the kernel is this machine's), so the post-interrupt check must fail,
naming exactly those, and the test holds it to that. tuned is not rolled here: it needs its daemon on
a system D-Bus, and its plugins write the shared kernel's global state (packages/tuned/README.md).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.api import keys
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


# --- kdump
# The nodes reach no Debian mirror, so the test gives one node a mirror of its own: the packages apt
# says the node's root lacks for kdump-tools, downloaded on this machine from the node's own sources
# and served to the node as a file: repository, the node's only apt source for the test. Everything after that is the
# package's own: Debian's apt, dpkg and kdump-tools maintainer scripts, update-grub, the reboot.
KDUMP_CONF = 'USE_KDUMP=1\nKDUMP_COREDIR="/var/crash/nodegate"\n'
MIRROR = "/srv/nodegate-test-apt"
SOURCES_SAVED = "/etc/apt/sources.list.nodegate-test"


def mirror_for(real: RealCluster, node: str, package: str, where: Path) -> None:
    """A file: apt repository in `node` holding `package` and what the node's root lacks for it."""
    from gate.devcluster import realnode

    # This machine's apt, on the node's sources and the node's dpkg status, with lists and caches of its
    # own: the node's release (whatever the node root is), and nothing of this machine's apt state touched.
    status, sources = where / "status", where / "sources.list"
    status.write_text(real.node_file(node, "/var/lib/dpkg/status") or "")
    sources.write_text(real.node_file(node, "/etc/apt/sources.list") or "")
    debs = where / "debs"
    for directory in (where / "lists/partial", debs / "partial"):
        directory.mkdir(parents=True)
    options = ["-q", "-o", f"Dir::State::status={status}", "-o", f"Dir::State::Lists={where / 'lists'}",
               "-o", f"Dir::Etc::SourceList={sources}", "-o", f"Dir::Etc::SourceParts={where / 'none'}",
               "-o", f"Dir::Cache={where}", "-o", f"Dir::Cache::archives={debs}"]
    subprocess.run(["apt-get", "update", *options], check=True, capture_output=True, timeout=300)
    subprocess.run(["apt-get", "install", "--download-only", "-y", *options, package], check=True,
                   capture_output=True, timeout=300)
    index = []
    for deb in sorted(debs.glob("*.deb")):
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
        digest = hashlib.sha256(deb.read_bytes()).hexdigest()
        index.append(f"{control.rstrip()}\nFilename: ./{deb.name}\nSize: {deb.stat().st_size}\nSHA256: {digest}\n")
    (debs / "Packages").write_text("\n".join(index))
    archive = where / "mirror.tar"
    with tarfile.open(archive, "w") as tar:
        for path in [debs / "Packages", *sorted(debs.glob("*.deb"))]:
            tar.add(path, arcname=path.name)
    subprocess.run(realnode.in_node(real.config(node), "/bin/sh", "-c", f"mkdir -p {MIRROR} && tar -x -C {MIRROR}"),
                   input=archive.read_bytes(), check=True, capture_output=True, timeout=120)
    real.node_sh(node, f"mv /etc/apt/sources.list {SOURCES_SAVED} && "
                       f"echo 'deb [trusted=yes] file:{MIRROR} ./' > /etc/apt/sources.list.d/nodegate-test.list")


def drop_mirror(real: RealCluster, node: str) -> None:
    real.node_sh(node, f"rm -rf {MIRROR} /etc/apt/sources.list.d/nodegate-test.list "
                       "/var/lib/apt/lists/*nodegate-test-apt*; "
                       f"[ ! -e {SOURCES_SAVED} ] || mv {SOURCES_SAVED} /etc/apt/sources.list", check=False)


def crashkernels(text: str | None) -> list[str]:
    return [word for word in (text or "").split() if word.startswith("crashkernel=")]


def dpkg_installed(real: RealCluster, node: str, package: str) -> bool:
    out = real.node_sh(node, f"dpkg-query -W -f '${{db:Status-Abbrev}}' {package}", check=False).stdout
    return out.startswith("ii")


def test_kdump_reboots_a_node_into_crashkernel_and_the_check_names_what_a_shared_kernel_cannot_give(
        real: RealCluster, gate_name: str, tmp_path: Path) -> None:
    """Install by the operator on one node: real apt installs kdump-tools, our drop-in wins over Debian's
    own kdump-tools.cfg in grub.cfg, the node reboots and boots with crashkernel=. The post-interrupt
    check then fails, as it must here, naming the two things no dev node can have: the kdump service
    (the nodes run no systemd, and starting kdump-config there would try to load a crash kernel into
    this machine's kernel) and a loaded crash kernel (the kernel is this machine's)."""
    node = real.nodes[0]
    assert crashkernels(real.node_file(node, "/proc/cmdline")) == []
    assert not dpkg_installed(real, node, "kdump-tools")
    booted = real.boot_id(node)
    mirror_for(real, node, "kdump-tools", tmp_path)
    gate = yaml.safe_dump({
        "apiVersion": "nodegate.io/v1alpha1", "kind": "NodeGate", "metadata": {"name": gate_name},
        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
                 "packages": {"kdump": {
                     "version": "1.0.0", "image": real.images["kdump"], "interrupt": {"type": "reboot"},
                     "config": {"crashkernel": "256M", "kdump.conf": KDUMP_CONF},
                     "uninstall": {"enabled": True}}}}})
    try:
        real.kubectl.apply(gate)
        real.wait(f"gate {gate_name} to report the node failed",
                  lambda: (real.gate_status(gate_name).get("nodes") or {}).get("failed") == 1, 600.0, every=3.0)
        state = json.loads(real.kubectl.run("get", "node", node, "-o", "jsonpath={.metadata.annotations."
                                            + keys.state_annotation(gate_name).replace(".", "\\.") + "}").stdout)
        failure = state["failure"]
        assert (failure["reason"], failure["stage"]) == ("PostInterruptCheckFailed", "post-interrupt"), failure
        lines = json.loads(failure["message"])["message"].splitlines()[1:]
        problems = [line for line in lines if not line.startswith("ok: ")]
        # Exactly what a dev node cannot have: the service, and a crash kernel in the shared kernel (this
        # machine's has no kexec at all; one with kexec but no reserved memory would say "is 0").
        assert problems[:2] == ["kdump-tools.service is not enabled", "kdump-tools.service is not active"], lines
        assert problems[2:] in (
            ["/sys/kernel/kexec_crash_loaded is missing: this kernel cannot load a crash kernel (no kexec support)"],
            ["no crash kernel is loaded (/sys/kernel/kexec_crash_loaded is 0)"]), lines
        assert "ok: the running kernel booted with crashkernel=256M" in lines, lines
        # What is the node's own was done and is proven from outside it.
        assert real.boot_id(node) != booted, "the node did not reboot"
        assert crashkernels(real.node_file(node, "/proc/cmdline")) == ["crashkernel=256M"]
        assert crashkernels(real.node_sh(node, "grep -m1 '^[[:space:]]*linux' /boot/grub/grub.cfg").stdout) == [
            "crashkernel=256M"]
        # Debian's own drop-in sets a crashkernel= of its own; grub.cfg has only ours (above).
        assert "crashkernel=" in (real.node_file(node, "/etc/default/grub.d/kdump-tools.cfg") or "")
        assert dpkg_installed(real, node, "kdump-tools") and dpkg_installed(real, node, "kexec-tools")
        assert real.node_file(node, "/etc/default/kdump-tools") == KDUMP_CONF

        # The gate deleted: the operator uninstalls it from the failed node, reboots it, and the
        # post-uninstall check proves the node booted without crashkernel=.
        booted = real.boot_id(node)
        real.delete_gate(gate_name, 600.0)
        assert real.boot_id(node) != booted, "the node did not reboot after the uninstall"
        assert crashkernels(real.node_file(node, "/proc/cmdline")) == []
        assert real.node_file(node, "/etc/default/grub.d/zz-nodegate-kdump-" + gate_name + ".cfg") is None
        assert not dpkg_installed(real, node, "kdump-tools") and not dpkg_installed(real, node, "kexec-tools")
        assert real.node_file(node, "/etc/default/kdump-tools") is None
        assert real.node_file(node, "/etc/default/grub.d/kdump-tools.cfg") is None
    finally:
        real.kubectl.run("delete", "nodegates.nodegate.io", gate_name, "--ignore-not-found", "--wait=false")
        drop_mirror(real, node)
