"""packages/node-setup: the kernel installed, held, GRUB's default, and `uname -r` compared after the reboot.

On the test root (chroot tier) with the fakes of tests/agent/fake_kernels.py: this machine's kernel
cannot be changed by a test, so the boot loader and `uname` are fakes there, named as such. Other
systems (Ubuntu, RHEL) by their os-release and, for RHEL, fake dnf, rpm and grubby on PATH (unit tier).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.agent import fake_kernels
from tests.agent.conftest import PACKAGES, Agent
from tests.agent.packaging import configmap
from tests.agent.rootfs import KERNEL, fake_calls

PKG = PACKAGES / "node-setup"
NEW = fake_kernels.NEW_KERNEL


@pytest.fixture(autouse=True)
def kernels(clean_env: None, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEGATE_NODE", "gpu-node-7")
    fake_kernels.install(root)


def run(agent: Agent, stage: str, config: Path, generation: int = 1) -> tuple[int, str]:
    result = agent.run(stage, PKG, package="node-setup", config_dir=config, generation=generation)
    return result.code, str(result.summary.get("message", ""))


def holds(root: Path) -> list[str]:
    path = root / "var/lib/fake-apt/holds"
    return path.read_text().split() if path.exists() else []


def installed(root: Path, package: str) -> bool:
    out = subprocess.run(["dpkg-query", "--admindir", str(root / "var/lib/dpkg"), "-W", "-f", "${db:Status-Abbrev}",
                          package], capture_output=True, text=True)
    return out.stdout.startswith("ii")


def test_the_kernel_is_installed_held_made_the_default_and_proven_running_after_the_reboot(
        agent: Agent, tmp_path: Path) -> None:
    config = configmap(tmp_path / "cm", {"kernel": NEW})
    assert run(agent, "apply", config) == (0, "2 steps passed")
    assert installed(agent.root, f"linux-image-{NEW}") and holds(agent.root) == [f"linux-image-{NEW}"]
    drop_in = (agent.root / "etc/default/grub.d/86-nodegate-node-setup-test-gate.cfg").read_text()
    assert f'GRUB_DEFAULT="gnulinux-advanced-6e6f6465-6761-7465-0000-66616b650000>gnulinux-{NEW}-advanced-' in drop_in
    assert f"apt-get install -y -q linux-image-{NEW}" in fake_calls(agent.root)
    # Before the reboot the node still runs the old kernel: the post-interrupt check says so.
    code, message = run(agent, "post-interrupt", config)
    assert code == 1 and message.endswith(f"node gpu-node-7 runs kernel {KERNEL}, want {NEW}"), message
    assert agent.interrupt("reboot", "--reboot-wait", "0").code == 0
    assert run(agent, "post-interrupt", config) == (0, "1 steps passed")
    # Uninstall while running it: hold and default go, the running kernel stays.
    assert run(agent, "uninstall", config)[0] == 0
    assert holds(agent.root) == [] and installed(agent.root, f"linux-image-{NEW}")
    assert not (agent.root / "etc/default/grub.d/86-nodegate-node-setup-test-gate.cfg").exists()
    assert 'set default="0"' in (agent.root / "boot/grub/grub.cfg").read_text()


def test_a_node_that_boots_another_kernel_fails_the_check_naming_node_and_versions(
        agent: Agent, tmp_path: Path) -> None:
    config = configmap(tmp_path / "cm", {"kernel": NEW})
    assert run(agent, "apply", config)[0] == 0
    # Someone pins the old kernel behind the package's back (a later drop-in wins); the node boots it.
    (agent.root / "etc/default/grub.d/99-local.cfg").write_text(
        f'GRUB_DEFAULT="gnulinux-advanced-6e6f6465-6761-7465-0000-66616b650000>gnulinux-{KERNEL}-advanced-'
        '6e6f6465-6761-7465-0000-66616b650000"\n')
    subprocess.run(["chroot", str(agent.root), "update-grub"], check=True, capture_output=True)
    assert agent.interrupt("reboot", "--reboot-wait", "0").code == 0
    code, message = run(agent, "post-interrupt", config)
    assert code == 1
    assert f"node gpu-node-7 boots {KERNEL} by default, want {NEW}" in message
    assert message.endswith(f"node gpu-node-7 runs kernel {KERNEL}, want {NEW}"), message


def test_uninstall_removes_a_kernel_it_installed_that_the_node_does_not_run(agent: Agent, tmp_path: Path) -> None:
    config = configmap(tmp_path / "cm", {"kernel": NEW})
    assert run(agent, "apply", config)[0] == 0
    assert run(agent, "uninstall", config) == (0, "2 steps passed")
    assert not installed(agent.root, f"linux-image-{NEW}") and holds(agent.root) == []
    assert not (agent.root / f"boot/vmlinuz-{NEW}").exists()


def test_an_installed_kernel_is_held_and_made_default_without_apt_and_a_host_hold_is_kept(
        agent: Agent, tmp_path: Path) -> None:
    (agent.root / "var/lib/fake-apt").mkdir(parents=True)
    (agent.root / "var/lib/fake-apt/holds").write_text(f"linux-image-{KERNEL}\n")  # the host's own hold
    config = configmap(tmp_path / "cm", {"kernel": KERNEL})
    assert run(agent, "apply", config)[0] == 0
    assert not any(call.startswith("apt-get") for call in fake_calls(agent.root))
    assert run(agent, "uninstall", config)[0] == 0
    assert holds(agent.root) == [f"linux-image-{KERNEL}"] and installed(agent.root, f"linux-image-{KERNEL}")


def test_a_kernel_the_archive_does_not_have_fails_the_apply_saying_so(agent: Agent, tmp_path: Path) -> None:
    code, message = run(agent, "apply", configmap(tmp_path / "cm", {"kernel": "6.9.0-1-nowhere"}))
    assert code == 1 and "Unable to locate package linux-image-6.9.0-1-nowhere" in message, message


def test_a_kernel_that_is_no_release_is_refused_by_the_agent(agent: Agent, tmp_path: Path) -> None:
    code, message = run(agent, "apply", configmap(tmp_path / "cm", {"kernel": "latest"}))
    assert code == 2 and message.startswith("config key 'kernel'"), message


OS_RELEASES = {
    "ubuntu-24.04": ('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n', "apt linux-image-6.8.0-45-generic"),
    "rhel-9": ('ID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.4"\n', "dnf kernel-6.8.0-45-generic"),
    "amzn-2023": ('ID="amzn"\nID_LIKE="fedora"\n', "dnf kernel-6.8.0-45-generic"),
    "cos-113": ("ID=cos\nVERSION_ID=113\n", "unsupported OS 'cos ' (os-release ID and ID_LIKE)"),
}


def lib(tmp_path: Path, script: str, os_release: str, path: str = "/usr/bin:/bin",
        kernel: str = "6.8.0-45-generic") -> subprocess.CompletedProcess[str]:
    (tmp_path / "os-release").write_text(os_release)
    configmap(tmp_path / "cfg", {"kernel": kernel + "\n", "hold": "true"})
    return subprocess.run(["/bin/sh", "-c", f"set -eu; . {PKG}/scripts/lib.sh; {script}"],
                          capture_output=True, text=True,
                          env={"OS_RELEASE": str(tmp_path / "os-release"), "NODEGATE_GATE": "g",
                               "NODEGATE_CONFIG_DIR": str(tmp_path / "cfg"), "NODEGATE_STATE_DIR": str(tmp_path),
                               "NODEGATE_NODE": "n1", "PATH": path})


@pytest.mark.parametrize("system", OS_RELEASES)
def test_the_package_manager_and_kernel_package_come_from_os_release(system: str, tmp_path: Path) -> None:
    text, expected = OS_RELEASES[system]
    done = lib(tmp_path, 'echo "$pm $package"', text)
    if expected.startswith(("apt", "dnf")):
        assert (done.returncode, done.stdout) == (0, f"{expected}\n")
    else:
        assert done.returncode != 0 and expected in done.stderr


# FAKE dnf, rpm and grubby of a RHEL 9 host, answering as the real ones print (dnf versionlock's
# NAME-EPOCH:VERSION-RELEASE.* lines; grubby --default-kernel's image path).
RHEL_FAKES = {
    "rpm": '[ "$1" = -q ] && grep -qx "$2" "$FAKE/installed"',
    "dnf": 'case "$*" in *"versionlock list"*) cat "$FAKE/locks" 2>/dev/null ;;\n'
           '  *"versionlock add"*) echo "kernel-0:${4#kernel-}" | sed "s/\\.x86_64$/.*/" >> "$FAKE/locks" ;; esac',
    "grubby": 'case "$1" in --default-kernel) cat "$FAKE/default" ;;\n'
              '  --set-default) echo "$2" > "$FAKE/default" ;; esac',
}
RHEL = 'ID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.4"\n'
RHEL_KERNEL = "5.14.0-427.13.1.el9_4.x86_64"


@pytest.fixture
def rhel(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in RHEL_FAKES.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n# FAKE {name} of a RHEL 9 host (tests/agent/test_node_setup.py)\n"
                                    f"{body}\n")
        os.chmod(bin_dir / name, 0o755)
    (tmp_path / "installed").write_text(f"kernel-{RHEL_KERNEL}\n")
    (tmp_path / "default").write_text("/boot/vmlinuz-5.14.0-362.8.1.el9_3.x86_64\n")
    return bin_dir


def test_on_rhel_the_hold_is_a_versionlock_and_the_default_is_grubbys(tmp_path: Path, rhel: Path) -> None:
    path = f"{rhel}:/usr/bin:/bin"
    script = (f'export FAKE={tmp_path}; is_installed && echo installed; is_held || echo not-held; hold_kernel; '
              'is_held && echo held; echo "default $(default_kernel)"; grubby --set-default /boot/vmlinuz-$kernel; '
              'echo "default $(default_kernel)"')
    done = lib(tmp_path, script, RHEL, path, kernel=RHEL_KERNEL)
    assert done.stdout.splitlines() == ["installed", "not-held", "held", "default 5.14.0-362.8.1.el9_3.x86_64",
                                        f"default {RHEL_KERNEL}"], done.stderr
    assert (tmp_path / "locks").read_text() == "kernel-0:5.14.0-427.13.1.el9_4.*\n"


def test_a_release_with_a_plus_as_debian_13_names_its_kernels_is_found_in_the_grub_menu(
        agent: Agent, root: Path, tmp_path: Path) -> None:
    """Debian 13's kernels are 6.12.117+deb13-cloud-amd64: the menu entry is matched as a string (as a
    regex the '+' matched nothing, and the apply failed saying no entry boots it: seen on a real node)."""
    plus = "6.12.117+deb13-fake"
    with open(root / "etc/fake-apt/candidates", "a") as candidates:  # the fakes are in: one more in the archive
        candidates.write(f"linux-image-{plus} 6.12.117-1\n")
    config = configmap(tmp_path / "cm", {"kernel": plus})
    assert run(agent, "apply", config) == (0, "2 steps passed")
    drop_in = (agent.root / "etc/default/grub.d/86-nodegate-node-setup-test-gate.cfg").read_text()
    assert f'GRUB_DEFAULT="gnulinux-advanced-6e6f6465-6761-7465-0000-66616b650000>gnulinux-{plus}-advanced-' in drop_in
