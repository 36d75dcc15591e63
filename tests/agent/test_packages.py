"""The example packages in packages/, each linted and run stage by stage on the test root."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from gate.agent.host import STATE_BASE
from gate.agent.loader import load_package
from gate.api.nodegate import NodeGate
from gate.cli.main import main
from tests.agent import fake_kernels, fake_lvm
from tests.agent.conftest import PACKAGES, Agent, in_private_mounts
from tests.agent.packaging import OS_RELEASES, configmap, with_os_release
from tests.agent.rootfs import fake_calls, restarted_units

pytestmark = pytest.mark.usefixtures("clean_env")

EXAMPLES = sorted(p.parent.name for p in PACKAGES.glob("*/package.yaml"))
INTERRUPTS = {
    "sysctl-tuning": [],
    "module-blocklist": ["--interrupt", "reboot"],
    "grub-cmdline": ["--interrupt", "reboot"],
    "chrony-conf": ["--interrupt", "service", "--service", "chrony.service"],
    "gpu-tuning": ["--interrupt", "reboot"],
    "tuning": ["--interrupt", "reboot"],  # sample-config has grub.conf: only a boot makes it live
    "shellscript": ["--interrupt", "reboot"],
    "bind-mount": [],
    "cve-fix": ["--interrupt", "reboot"],
    "security-agent": ["--interrupt", "service", "--service", "auditd.service"],
    "kdump": ["--interrupt", "reboot"],  # crashkernel= reserves memory only at boot
    "tuned": [],
    "lvm": [],
    "node-setup": ["--interrupt", "reboot"],
}
# Packages that really mount: their stages run in a private mount namespace (tests.agent.conftest).
REAL_MOUNTS = {"bind-mount", "lvm"}


@contextmanager
def host_for(name: str, root: Path, tmp_path: Path) -> Iterator[None]:
    """What a package's sample config needs of the host beyond the test root: lvm's disk /dev/vdb (a
    loop device, detached after) and LVM fakes, node-setup's kernel fakes."""
    if name == "lvm":
        fake_lvm.install(root)
        with fake_lvm.loop_disks(root, tmp_path, ("vdb",)):
            yield
        return
    if name == "node-setup":
        fake_kernels.install(root)
    yield


def test_every_example_has_an_interrupt_plan_here() -> None:
    assert sorted(INTERRUPTS) == EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
def test_package_lint_passes_on_every_example(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["package", "lint", str(PACKAGES / name)]) == 0
    assert capsys.readouterr().out == f"{PACKAGES / name}: ok\n"


@pytest.mark.parametrize("name", EXAMPLES)
def test_package_test_runs_every_stage_of_every_example(
    name: str, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["package", "test", str(PACKAGES / name), "--root", str(root), *INTERRUPTS[name]]
    with host_for(name, root, tmp_path):
        if name in REAL_MOUNTS:
            done = in_private_mounts(root, sys.executable, "-m", "gate.cli.main", *argv)
            code, out = done.returncode, done.stdout + done.stderr
        else:
            code = main(argv)
            out = capsys.readouterr().out
    assert code == 0, out
    assert out.splitlines()[-1] == "passed"
    assert re.search(r"^PASS  apply ", out, re.M) and re.search(r"^PASS  uninstall ", out, re.M)


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_examples_gate_manifest_is_a_valid_nodegate_using_the_package(name: str) -> None:
    gate = NodeGate.model_validate(yaml.safe_load((PACKAGES / name / "nodegate.yaml").read_text()))
    package = load_package(PACKAGES / name)
    assert gate.spec.packages[package.name].version == package.version


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_dockerfile_copies_what_the_package_needs_into_nodegate_package(name: str) -> None:
    directory = PACKAGES / name
    copies = re.findall(r"^COPY\s+(\S+)\s+(\S+)$", (directory / "Dockerfile").read_text(), re.M)
    sources = {src.rstrip("/") for src, _ in copies}
    assert all(dst.startswith("/nodegate-package/") for _, dst in copies)
    assert all((directory / src).exists() for src in sources)
    manifest = load_package(directory).manifest
    needed = {"package.yaml"} | {step.script.split("/")[0] for _, step in manifest.scripts() if step.script}
    needed |= {manifest.root} if manifest.root else set()
    assert needed <= sources
    assert (directory / "README.md").is_file()


MANAGERS = {"debian-12": "apt", "debian-13": "apt", "ubuntu-24.04": "apt", "rhel-9": "dnf", "rocky-9": "dnf",
            "amzn-2023": "dnf"}
REFUSALS = {"cos-113": "unsupported OS 'cos ' (os-release ID and ID_LIKE)", "sles-15": "unsupported OS 'sles suse'"}


@pytest.mark.parametrize("system", OS_RELEASES)
@pytest.mark.parametrize("name", ["cve-fix", "tuned"])
def test_apt_or_dnf_is_read_from_os_release(name: str, system: str, tmp_path: Path) -> None:
    done = with_os_release(PACKAGES / name, "package_manager", system, tmp_path)
    if system in MANAGERS:
        assert (done.returncode, done.stdout) == (0, f"{MANAGERS[system]}\n")
    else:
        assert done.returncode == 1 and REFUSALS[system] in done.stderr


def sysctl(root: Path, key: str) -> str:
    return (root / "proc/sys" / key.replace(".", "/")).read_text().strip()


def test_sysctl_tuning_sets_values_live_and_uninstall_puts_the_old_ones_back(agent: Agent) -> None:
    pkg = PACKAGES / "sysctl-tuning"
    assert agent.run("apply", pkg, package="sysctl-tuning").code == 0
    assert (sysctl(agent.root, "vm.swappiness"), sysctl(agent.root, "net.core.somaxconn")) == ("10", "8192")
    assert (agent.root / "etc/sysctl.d/90-nodegate-tuning.conf").exists()
    (agent.root / "proc/sys/vm/swappiness").write_text("30\n")  # someone changed it behind our back
    drifted = agent.run("post-interrupt", pkg, package="sysctl-tuning")
    assert drifted.code == 1 and "vm.swappiness is 30, want 10" in str(drifted.summary["message"])
    assert agent.run("apply", pkg, package="sysctl-tuning", generation=2).code == 0
    assert agent.run("uninstall", pkg, package="sysctl-tuning").code == 0
    assert (sysctl(agent.root, "vm.swappiness"), sysctl(agent.root, "net.core.somaxconn")) == ("60", "4096")
    assert not (agent.root / "etc/sysctl.d/90-nodegate-tuning.conf").exists()


def test_module_blocklist_rebuilds_the_initramfs_once_and_is_only_proven_after_the_reboot(agent: Agent) -> None:
    pkg = PACKAGES / "module-blocklist"
    assert agent.run("apply", pkg, package="module-blocklist").code == 0
    assert agent.run("apply", pkg, package="module-blocklist").code == 0  # a retry: no second rebuild
    assert [c for c in fake_calls(agent.root) if c.startswith("update-initramfs")] == ["update-initramfs -u -k all"]
    initrd = (agent.root / "boot/initrd.img-6.1.0-fake").read_text()
    assert "etc/modprobe.d/nodegate-blocklist.conf" in initrd
    before_reboot = agent.run("post-interrupt", pkg, package="module-blocklist")
    assert before_reboot.code == 1 and "nouveau is loaded" in str(before_reboot.summary["message"])
    assert agent.interrupt("reboot", "--reboot-wait", "0").code == 0
    assert agent.run("post-interrupt", pkg, package="module-blocklist").code == 0
    assert agent.run("uninstall", pkg, package="module-blocklist").code == 0
    assert "nodegate-blocklist" not in (agent.root / "boot/initrd.img-6.1.0-fake").read_text()


def test_module_blocklist_check_catches_an_initramfs_built_for_another_blocklist(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rebuild is skipped for the same version and generation; the check is the safety net if the
    blocklist still changed (here: the env changed without the generation, which the API never does)."""
    pkg = PACKAGES / "module-blocklist"
    assert agent.run("apply", pkg, package="module-blocklist").code == 0
    monkeypatch.setenv("MODULES", "nouveau nvidiafb")
    run = agent.run("apply", pkg, package="module-blocklist")
    assert (run.code, run.summary["failedStep"]) == (1, "apply-check/initramfs-current")
    assert "the initramfs was not rebuilt since the blocklist changed" in str(run.summary["message"])
    assert agent.run("apply", pkg, package="module-blocklist", generation=2).code == 0


def test_module_blocklist_a_failed_rebuild_fails_apply_and_the_retry_rebuilds(agent: Agent) -> None:
    pkg = PACKAGES / "module-blocklist"
    (agent.root / "etc/fake-systemd/fail-update-initramfs").write_text("")
    failed = agent.run("apply", pkg, package="module-blocklist")
    assert (failed.code, failed.summary["failedStep"]) == (1, "apply/update-initramfs")
    (agent.root / "etc/fake-systemd/fail-update-initramfs").unlink()
    assert agent.run("apply", pkg, package="module-blocklist").code == 0
    assert [c for c in fake_calls(agent.root) if c.startswith("update-initramfs")] == ["update-initramfs -u -k all"] * 2


def test_grub_cmdline_reaches_proc_cmdline_only_through_the_reboot(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = PACKAGES / "grub-cmdline"
    monkeypatch.setenv("KERNEL_ARGS", "intel_iommu=on iommu=pt")  # the gate's env, as the operator sets it
    assert agent.run("apply", pkg, package="grub-cmdline").code == 0
    grub_cfg = (agent.root / "boot/grub/grub.cfg").read_text()
    assert "intel_iommu=on iommu=pt" in grub_cfg
    before_reboot = agent.run("post-interrupt", pkg, package="grub-cmdline")
    assert before_reboot.code == 1
    assert "intel_iommu=on is absent in /proc/cmdline, want present" in str(before_reboot.summary["message"])
    assert agent.interrupt("reboot", "--reboot-wait", "0").code == 0
    assert agent.run("post-interrupt", pkg, package="grub-cmdline").code == 0
    assert agent.run("uninstall", pkg, package="grub-cmdline").code == 0
    assert "iommu" not in (agent.root / "boot/grub/grub.cfg").read_text()
    # The check after the uninstall's reboot: the running kernel must have booted without them.
    still_booted = agent.run("post-uninstall", pkg, package="grub-cmdline")
    assert still_booted.code == 1
    assert "intel_iommu=on is present in /proc/cmdline, want absent" in str(still_booted.summary["message"])
    assert agent.interrupt("reboot", "--reboot-wait", "0").code == 0
    assert agent.run("post-uninstall", pkg, package="grub-cmdline").code == 0
    state_dirs = [agent.root / str(STATE_BASE).lstrip("/") / gate / "grub-cmdline"
                  for gate in os.listdir(agent.root / str(STATE_BASE).lstrip("/"))]
    assert state_dirs and not any((d / "package").exists() for d in state_dirs), "the check left its payload"


def test_chrony_conf_drops_the_config_files_and_follows_config_changes(agent: Agent, tmp_path: Path) -> None:
    pkg = PACKAGES / "chrony-conf"
    mount = configmap(tmp_path / "cm", {"pool.conf": "pool a.example iburst\n", "notes.txt": "not a chrony setting\n"})
    refused = agent.run("apply", pkg, package="chrony-conf", config_dir=mount)
    assert (refused.code, refused.summary["message"]) == (
        2, "config key 'notes.txt' is not declared by package chrony-conf (declared: *.conf)")
    mount = configmap(mount, {"pool.conf": "pool a.example iburst\n", "makestep.conf": "makestep 1 3\n"})
    assert agent.run("apply", pkg, package="chrony-conf", config_dir=mount).code == 0
    assert agent.run("config", pkg, package="chrony-conf", config_dir=mount).code == 0
    conf_d = agent.root / "etc/chrony/conf.d"
    assert sorted(p.name for p in conf_d.iterdir()) == ["nodegate-makestep.conf", "nodegate-pool.conf"]
    configmap(mount, {"pool.conf": "pool b.example iburst\n"})
    assert agent.run("config", pkg, package="chrony-conf", config_dir=mount, generation=2).code == 0
    assert sorted(p.name for p in conf_d.iterdir()) == ["nodegate-pool.conf"]
    assert (conf_d / "nodegate-pool.conf").read_text() == "pool b.example iburst\n"
    # The gate's configInterrupts for *.conf: a service interrupt restarting chrony.
    assert agent.interrupt("service", "--service", "chrony.service").code == 0
    assert restarted_units(agent.root) == ["chrony.service"]
    assert agent.run("post-interrupt", pkg, package="chrony-conf", config_dir=mount).code == 0
    assert agent.run("uninstall", pkg, package="chrony-conf", config_dir=mount).code == 0
    assert list(conf_d.iterdir()) == []
    assert "NodeGate" not in (agent.root / "etc/chrony/chrony.conf").read_text()
    assert not (agent.root / "etc/systemd/system/chrony.service.d/50-nodegate.conf").exists()


def test_chrony_conf_config_check_catches_a_file_edited_on_the_node(agent: Agent, tmp_path: Path) -> None:
    pkg = PACKAGES / "chrony-conf"
    mount = configmap(tmp_path / "cm", {"pool.conf": "pool a.example iburst\n"})
    assert agent.run("apply", pkg, package="chrony-conf", config_dir=mount).code == 0
    assert agent.run("config", pkg, package="chrony-conf", config_dir=mount).code == 0
    (agent.root / "etc/chrony/conf.d/nodegate-rogue.conf").write_text("server evil\n")
    run = agent.run("config", pkg, package="chrony-conf", config_dir=mount)
    assert run.code == 0  # config re-syncs: the stray file of ours goes
    assert not (agent.root / "etc/chrony/conf.d/nodegate-rogue.conf").exists()
