"""packages/kdump on the test root: crash-dump tools, crashkernel= through the boot loader and a reboot,
the crash kernel loaded, and the host given back as it was.

The kernel's side is a fake here (tests/agent/rootfs.py): a boot with crashkernel= on its command line
and an enabled kdump unit sets the test root's /sys/kernel/kexec_crash_loaded to 1. The RHEL family
runs against fakes of rpm, dnf and grubby written by this module, each named FAKE at its top."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agent.conftest import PACKAGES, Agent
from tests.agent.packaging import OS_RELEASES, configmap, with_os_release
from tests.agent.rootfs import fake_calls, installed_version

pytestmark = pytest.mark.usefixtures("clean_env")

PKG = PACKAGES / "kdump"
CONF = 'USE_KDUMP=1\nKDUMP_COREDIR="/var/crash/nodegate"\n'
DROP_IN = "etc/default/grub.d/zz-nodegate-kdump-test-gate.cfg"


def run(agent: Agent, stage: str, mount: Path, generation: int = 1) -> tuple[int, str]:
    result = agent.run(stage, PKG, package="kdump", config_dir=mount, generation=generation)
    return result.code, str(result.summary.get("message", ""))


def reboot(agent: Agent) -> None:
    assert agent.interrupt("reboot", "--reboot-wait", "0").code == 0


def crashkernels(text: str) -> list[str]:
    return [word for word in text.split() if word.startswith("crashkernel=")]


def grub_line(root: Path) -> str:
    return next(line for line in (root / "boot/grub/grub.cfg").read_text().splitlines()
                if line.strip().startswith("linux"))


def installed(root: Path) -> str:
    return installed_version(root, "kdump-tools")


def agent_log(root: Path, stage: str) -> str:
    return sorted((root / "var/log/nodegate/test-gate/kdump/1.0.0").glob(f"*-{stage}.log"))[-1].read_text()


def crash_loaded(root: Path) -> str:
    return (root / "sys/kernel/kexec_crash_loaded").read_text().strip()


def test_install_reboots_into_crashkernel_with_the_crash_kernel_loaded_and_uninstall_boots_without_it(
        agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {"crashkernel": "256M\n", "kdump.conf": CONF})
    assert run(agent, "apply", mount) == (0, "2 steps passed")
    assert installed(agent.root) == "1:1.8.1"
    assert (agent.root / "etc/default/kdump-tools").read_text() == CONF
    # Debian's kdump-tools.cfg sets its own crashkernel=; ours is the only one left in grub.cfg.
    assert (agent.root / "etc/default/grub.d/kdump-tools.cfg").exists()
    assert crashkernels(grub_line(agent.root)) == ["crashkernel=256M"]
    assert "systemctl enable kdump-tools.service" in fake_calls(agent.root)
    # Before the reboot the check fails, naming what only a boot gives.
    code, message = run(agent, "post-interrupt", mount)
    assert code == 1
    assert "the running kernel booted with no crashkernel= (/proc/cmdline), want crashkernel=256M" in message
    assert "no crash kernel is loaded (/sys/kernel/kexec_crash_loaded is 0)" in message
    reboot(agent)
    assert crash_loaded(agent.root) == "1"
    assert run(agent, "post-interrupt", mount) == (0, "1 steps passed")

    assert run(agent, "uninstall", mount) == (0, "2 steps passed")
    assert installed(agent.root) == ""  # the host had none: purged, with its files
    assert "apt-get purge -y -q kdump-tools" in fake_calls(agent.root)  # exactly what the install added
    assert not (agent.root / DROP_IN).exists() and not (agent.root / "etc/default/kdump-tools").exists()
    assert crashkernels(grub_line(agent.root)) == []
    # Until the reboot the running kernel still has the memory reserved: post-uninstall says so.
    early = agent.run("post-uninstall", PKG, package="kdump", config_dir=mount)
    assert early.code == 1
    assert "the running kernel booted with 'crashkernel=256M' (/proc/cmdline), the host's boot entry has 'none'" \
        in str(early.summary["message"])
    reboot(agent)
    assert crashkernels((agent.root / "proc/cmdline").read_text()) == []
    assert crash_loaded(agent.root) == "0"
    assert agent.run("post-uninstall", PKG, package="kdump", config_dir=mount).code == 0


def test_a_host_with_kdump_tools_gets_its_config_file_and_crashkernel_back(agent: Agent, tmp_path: Path) -> None:
    chroot = ["chroot", str(agent.root)]
    assert subprocess.run([*chroot, "apt-get", "install", "-y", "kdump-tools"], capture_output=True).returncode == 0
    (agent.root / "etc/default/kdump-tools").write_text("USE_KDUMP=1\n# the host's own\n")
    assert subprocess.run([*chroot, "update-grub"], capture_output=True).returncode == 0
    reboot(agent)
    assert crashkernels((agent.root / "proc/cmdline").read_text()) == ["crashkernel=384M-:128M"]
    mount = configmap(tmp_path / "cm", {"crashkernel": "1G-4G:192M,4G-:256M", "kdump.conf": CONF})
    assert run(agent, "apply", mount)[0] == 0
    assert not any(call.startswith("apt-get install") for call in fake_calls(agent.root)[3:])
    reboot(agent)
    assert crashkernels((agent.root / "proc/cmdline").read_text())[-1] == "crashkernel=1G-4G:192M,4G-:256M"
    assert run(agent, "post-interrupt", mount)[0] == 0
    # A config change: a new crashkernel= and kdump.conf leaving the config (the host's file comes back).
    mount = configmap(mount, {"crashkernel": "512M"})
    assert run(agent, "config", mount, generation=2)[0] == 0
    assert (agent.root / "etc/default/kdump-tools").read_text() == "USE_KDUMP=1\n# the host's own\n"
    assert crashkernels(grub_line(agent.root)) == ["crashkernel=512M"]
    assert run(agent, "uninstall", mount, generation=2)[0] == 0
    assert installed(agent.root) == "1:1.8.1"  # the host's tools stay
    assert (agent.root / "etc/default/kdump-tools").read_text() == "USE_KDUMP=1\n# the host's own\n"
    assert crashkernels(grub_line(agent.root)) == ["crashkernel=384M-:128M"]
    reboot(agent)
    assert agent.run("post-uninstall", PKG, package="kdump", config_dir=mount, generation=2).code == 0


def test_the_crash_kernel_not_loaded_after_the_reboot_fails_the_check(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {"crashkernel": "256M"})
    assert run(agent, "apply", mount)[0] == 0
    assert subprocess.run(["chroot", str(agent.root), "systemctl", "disable", "kdump-tools.service"]).returncode == 0
    running = agent.root / "etc/fake-systemd/running"
    running.write_text("".join(line for line in running.read_text().splitlines(keepends=True)
                               if not line.startswith("kdump-tools.service")))
    reboot(agent)
    code, message = run(agent, "post-interrupt", mount)
    assert code == 1
    assert "kdump-tools.service is not enabled" in message and "kdump-tools.service is not active" in message
    assert "ok: the running kernel booted with crashkernel=256M" in agent_log(agent.root, "post-interrupt")
    assert "no crash kernel is loaded (/sys/kernel/kexec_crash_loaded is 0)" in message
    (agent.root / "sys/kernel/kexec_crash_loaded").unlink()   # a kernel without kexec support
    assert "this kernel cannot load a crash kernel (no kexec support)" in run(agent, "post-interrupt", mount)[1]


def test_the_default_crashkernel_is_graduated_by_memory_and_a_bad_value_is_refused_before_any_step(
        agent: Agent, tmp_path: Path) -> None:
    assert run(agent, "apply", configmap(tmp_path / "cm", {}))[0] == 0
    assert crashkernels(grub_line(agent.root)) == ["crashkernel=1G-4G:192M,4G-64G:256M,64G-:512M"]
    code, message = run(agent, "apply", configmap(tmp_path / "bad", {"crashkernel": '256M" init=/bin/sh'}))
    assert code == 2 and "config key 'crashkernel': does not match the pattern" in message, message


FAKE_RPM = r"""#!/bin/sh
# FAKE rpm for this test: installed packages are "NAME EPOCH:VERSION-RELEASE" lines of /var/lib/fake-rpm/installed.
echo "rpm $*" >> /var/log/fake-calls.log
for name; do :; done
v=$(awk -v p="$name" '$1 == p { print $2 }' /var/lib/fake-rpm/installed 2>/dev/null)
if [ -n "$v" ]; then echo "$v"; else echo "package $name is not installed"; exit 1; fi
"""
FAKE_DNF = r"""#!/bin/sh
# FAKE dnf for this test: install puts kexec-tools in the fake rpm database and starts kdump.service,
# remove takes both away.
echo "dnf $*" >> /var/log/fake-calls.log
db=/var/lib/fake-rpm/installed; running=/etc/fake-systemd/running
for name; do :; done
grep -v "^$name " "$db" > "$db.new" 2>/dev/null || true; mv "$db.new" "$db"
grep -v "^kdump.service " "$running" > "$running.new" || true; mv "$running.new" "$running"
case "$1" in
    install) echo "$name 0:2.0.27-8.el9" >> "$db"
             echo "kdump.service loaded active exited Crash recovery kernel arming" >> "$running" ;;
esac
"""
FAKE_GRUBBY = r"""#!/bin/sh
# FAKE grubby for this test: the default entry's arguments are the linux line of /boot/grub/grub.cfg
# (which the test root's fake reboot boots). --args replaces an argument of the same name, as grubby does.
echo "grubby $*" >> /var/log/fake-calls.log
cfg=/boot/grub/grub.cfg
args=$(grep -m1 '^[[:space:]]*linux' "$cfg" | sed 's/^[[:space:]]*linux[[:space:]]*[^ ]*[[:space:]]*//')
for opt; do
    case "$opt" in
        --info=DEFAULT) echo "index=0"; echo "kernel=\"/boot/vmlinuz-6.1.0-fake\""; echo "args=\"$args\"" ;;
        --args=*|--remove-args=*)
            for a in ${opt#*=}; do
                args=$(echo " $args " | sed "s| ${a%%=*}=[^ ]*| |g; s| ${a%%=*} | |g; s|^ *||; s| *$||")
                case "$opt" in --args=*) args="$args $a" ;; esac
            done ;;
    esac
done
printf "menuentry 'Rocky Linux' {\n\tlinux\t/boot/vmlinuz-6.1.0-fake %s\n}\n" "$args" > "$cfg"
"""


def rhel_host(root: Path) -> None:
    (root / "etc/os-release").write_text(OS_RELEASES["rocky-9"])
    for name, text in (("rpm", FAKE_RPM), ("dnf", FAKE_DNF), ("grubby", FAKE_GRUBBY)):
        fake = root / "usr/sbin" / name
        fake.write_text(text)
        fake.chmod(0o755)
    (root / "var/lib/fake-rpm").mkdir(parents=True)
    (root / "var/lib/fake-rpm/installed").write_text("")
    (root / "boot/grub").mkdir(parents=True)
    (root / "boot/grub/grub.cfg").write_text(
        "menuentry 'Rocky Linux' {\n\tlinux\t/boot/vmlinuz-6.1.0-fake root=/dev/sda1 ro crashkernel=1G-4G:192M\n}\n")
    (root / "proc/cmdline").write_text("BOOT_IMAGE=/boot/vmlinuz-6.1.0-fake root=/dev/sda1 ro crashkernel=1G-4G:192M\n")


def test_the_rhel_family_installs_kexec_tools_with_dnf_and_sets_crashkernel_with_grubby(
        agent: Agent, tmp_path: Path) -> None:
    rhel_host(agent.root)
    conf = "path /var/crash\ncore_collector makedumpfile -l -d 31\n"
    mount = configmap(tmp_path / "cm", {"crashkernel": "2G-:448M", "kdump.conf": conf})
    assert run(agent, "apply", mount)[0] == 0
    calls = fake_calls(agent.root)
    assert "dnf install -y -q kexec-tools" in calls
    assert "grubby --update-kernel=ALL --args=crashkernel=2G-:448M" in calls
    assert not any(call.startswith(("apt-get", "update-grub")) for call in calls)
    assert (agent.root / "etc/kdump.conf").read_text().startswith("path /var/crash\n")
    assert "systemctl enable kdump.service" in calls
    reboot(agent)
    assert crashkernels((agent.root / "proc/cmdline").read_text()) == ["crashkernel=2G-:448M"]
    assert run(agent, "post-interrupt", mount)[0] == 0
    assert run(agent, "uninstall", mount)[0] == 0
    assert "dnf remove -y -q kexec-tools" in fake_calls(agent.root)
    assert not (agent.root / "etc/kdump.conf").exists()
    assert crashkernels(grub_line(agent.root)) == ["crashkernel=1G-4G:192M"]   # the host's value, back
    reboot(agent)
    assert agent.run("post-uninstall", PKG, package="kdump", config_dir=mount).code == 0


FAMILIES = {"debian-12": "debian", "debian-13": "debian", "ubuntu-24.04": "debian", "rhel-9": "rhel",
            "rocky-9": "rhel", "amzn-2023": "rhel"}


@pytest.mark.parametrize("system", OS_RELEASES)
def test_the_family_and_its_names_come_from_os_release(system: str, tmp_path: Path) -> None:
    done = with_os_release(PKG, "setup && echo $fam $tools $unit $conf", system, tmp_path)
    names = {"debian": "debian kdump-tools kdump-tools.service /etc/default/kdump-tools",
             "rhel": "rhel kexec-tools kdump.service /etc/kdump.conf"}
    if system in FAMILIES:
        assert (done.returncode, done.stdout) == (0, names[FAMILIES[system]] + "\n")
    else:
        assert done.returncode != 0 and "unsupported OS" in done.stderr and "(os-release ID and ID_LIKE)" in done.stderr
