"""gpu-tuning's stages on the chroot test root: the profile assembled in the agent's container from the
host's os-release, applied on the host, proven live, reapplied at boot, and undone.

The test root plays the host: sysctls are files under /proc/sys, CPU frequency and idle controls are
files under /sys/devices/system/cpu, units are files under /lib/systemd/system with the fake
systemctl keeping their enabled state and the limits they were started with."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agent.conftest import PACKAGES, Agent
from tests.agent.packaging import configmap
from tests.agent.rootfs import fake_calls

pytestmark = pytest.mark.usefixtures("clean_env")

PKG = PACKAGES / "gpu-tuning"
STATE = "var/lib/nodegate/test-gate/gpu-tuning/data"
TRAINING_SYSCTLS = {
    "net/core/rmem_max": "212992", "net/core/wmem_max": "212992", "net/core/rmem_default": "212992",
    "net/core/wmem_default": "212992", "net/ipv4/tcp_rmem": "4096\t131072\t6291456",
    "net/ipv4/tcp_wmem": "4096\t16384\t4194304", "net/core/netdev_max_backlog": "1000",
    "net/ipv4/tcp_max_syn_backlog": "512", "net/ipv4/tcp_congestion_control": "cubic",
    "net/core/default_qdisc": "fq_codel", "kernel/numa_balancing": "1",
}
COS = 'NAME="Container-Optimized OS"\nID=cos\nVERSION_ID=113\n'
UNITS = ("nvidia-persistenced.service", "irqbalance.service", "containerd.service")


def host(root: Path, os_release: str | None = None, cpus: int = 2) -> None:
    """Make the test root look like a GPU node: the training sysctls, CPU controls, the units."""
    for key, value in TRAINING_SYSCTLS.items():
        (root / "proc/sys" / key).parent.mkdir(parents=True, exist_ok=True)
        (root / "proc/sys" / key).write_text(value + "\n")
    cpu = root / "sys/devices/system/cpu"
    (cpu / "cpufreq").mkdir(parents=True)
    (cpu / "cpuidle").mkdir()
    for n in range(cpus):
        (cpu / f"cpu{n}/cpufreq").mkdir(parents=True)
        (cpu / f"cpu{n}/cpufreq/scaling_governor").write_text("schedutil\n")
        for state in range(4):
            (cpu / f"cpu{n}/cpuidle/state{state}").mkdir(parents=True)
            (cpu / f"cpu{n}/cpuidle/state{state}/disable").write_text("0\n")
    (root / "lib/systemd/system").mkdir(parents=True, exist_ok=True)
    for unit in UNITS:
        (root / "lib/systemd/system" / unit).write_text("[Service]\nExecStart=/bin/true\n")
    (root / "etc/fake-systemd/enabled").write_text("irqbalance.service\ncontainerd.service\n")
    if os_release is not None:
        (root / "etc/os-release").write_text(os_release)


def sysctl(root: Path, key: str) -> str:
    return (root / "proc/sys" / key.replace(".", "/")).read_text().strip()


def cpu(root: Path, rel: str) -> str:
    return (root / "sys/devices/system/cpu" / rel).read_text().strip()


def enabled(root: Path) -> list[str]:
    return sorted((root / "etc/fake-systemd/enabled").read_text().split())


def boot(agent: Agent) -> None:
    """What a reboot does to what the kernel and systemd hold: a new command line (the fake reboot),
    volatile CPU settings back to the firmware's, the boot-time unit run, then containerd started
    with its drop-ins."""
    assert agent.interrupt("reboot", "--reboot-wait", "0").code == 0
    for governor in agent.root.glob("sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"):
        governor.write_text("schedutil\n")
    for disable in agent.root.glob("sys/devices/system/cpu/cpu*/cpuidle/state*/disable"):
        disable.write_text("0\n")
    unit = (agent.root / "etc/systemd/system/nodegate-gpu-tuning.service").read_text()
    env = dict(item.split("=", 1) for line in unit.splitlines() if line.startswith("Environment=")
               for item in line.removeprefix("Environment=").split())
    start = next(line.removeprefix("ExecStart=") for line in unit.splitlines() if line.startswith("ExecStart="))
    done = subprocess.run(["chroot", str(agent.root), *start.split()], env={"PATH": "/usr/bin:/usr/sbin", **env},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert agent.interrupt("service", "--service", "containerd.service").code == 0  # After= the boot-time unit


def test_multi_node_training_on_debian_applies_everything_proves_it_after_the_reboot_and_undoes_it(
        agent: Agent, tmp_path: Path) -> None:
    host(agent.root)
    config = configmap(tmp_path / "cm", {"accelerator": "h100", "intent": "multiNodeTraining"})
    run = agent.run("apply", PKG, package="gpu-tuning", config_dir=config)
    assert run.code == 0, run.summary
    # sysctls: live, and in /etc/sysctl.d for the next boot
    assert sysctl(agent.root, "net.core.rmem_max") == "536870912"
    assert sysctl(agent.root, "net.ipv4.tcp_rmem") == "4096 87380 268435456"
    assert sysctl(agent.root, "vm.swappiness") == "10"
    conf = (agent.root / "etc/sysctl.d/90-nodegate-gpu-tuning.conf").read_text()
    assert "net.ipv4.tcp_congestion_control = bbr" in conf
    # kernel arguments: a GRUB drop-in and update-grub; not live before the reboot
    grub_cfg = (agent.root / "boot/grub/grub.cfg").read_text()
    assert "iommu=pt pci=realloc=off pci=disable_acs_redir=pci:0:0" in grub_cfg
    assert fake_calls(agent.root).count("update-grub ") == 1
    # CPU: every core's governor; C-states (multiNodeTraining sets none) untouched
    assert cpu(agent.root, "cpu0/cpufreq/scaling_governor") == cpu(agent.root, "cpu1/cpufreq/scaling_governor") \
        == "performance"
    assert cpu(agent.root, "cpu0/cpuidle/state3/disable") == "0"
    # services: persistence daemon on, irqbalance off; containerd's limits in a drop-in
    assert enabled(agent.root) == ["containerd.service", "nvidia-persistenced.service"]
    drop_in = (agent.root / "etc/systemd/system/containerd.service.d/50-nodegate-gpu-tuning.conf").read_text()
    assert "LimitMEMLOCK=infinity" in drop_in and "LimitNPROC=infinity" in drop_in

    before_reboot = agent.run("post-interrupt", PKG, package="gpu-tuning", config_dir=config)
    message = str(before_reboot.summary["message"])
    assert before_reboot.code == 1
    assert "kernel argument iommu=pt is not in /proc/cmdline" in message
    assert "containerd.service runs with LimitMEMLOCK=unknown, want infinity" in message
    boot(agent)
    after = agent.run("post-interrupt", PKG, package="gpu-tuning", config_dir=config)
    assert after.code == 0, after.summary
    assert cpu(agent.root, "cpu1/cpufreq/scaling_governor") == "performance"  # the boot-time unit put it back

    assert agent.run("uninstall", PKG, package="gpu-tuning", config_dir=config).code == 0
    assert sysctl(agent.root, "net.core.rmem_max") == "212992"
    assert sysctl(agent.root, "net.ipv4.tcp_rmem") == "4096 131072 6291456"
    assert sysctl(agent.root, "net.ipv4.tcp_congestion_control") == "cubic"
    assert sysctl(agent.root, "vm.swappiness") == "60"
    assert cpu(agent.root, "cpu0/cpufreq/scaling_governor") == "schedutil"
    assert enabled(agent.root) == ["containerd.service", "irqbalance.service"]
    assert "iommu" not in (agent.root / "boot/grub/grub.cfg").read_text()
    for gone in ("etc/sysctl.d/90-nodegate-gpu-tuning.conf", "etc/default/grub.d/90-nodegate-gpu-tuning.cfg",
                 "etc/systemd/system/containerd.service.d/50-nodegate-gpu-tuning.conf",
                 "etc/systemd/system/nodegate-gpu-tuning.service",
                 "etc/systemd/system/multi-user.target.wants/nodegate-gpu-tuning.service"):
        assert not (agent.root / gone).exists(), gone


def test_a_drifted_value_fails_the_check_naming_it(agent: Agent, tmp_path: Path) -> None:
    host(agent.root)
    config = configmap(tmp_path / "cm", {"accelerator": "h100", "intent": "inference"})
    assert agent.run("apply", PKG, package="gpu-tuning", config_dir=config).code == 0
    assert cpu(agent.root, "cpu0/cpuidle/state2/disable") == "1"
    assert cpu(agent.root, "cpu0/cpuidle/state1/disable") == "0"
    (agent.root / "proc/sys/vm/swappiness").write_text("60\n")
    (agent.root / "sys/devices/system/cpu/cpu1/cpuidle/state3/disable").write_text("0\n")
    run = agent.run("config", PKG, package="gpu-tuning", config_dir=config, generation=2)
    assert run.code == 0  # config converges again
    assert sysctl(agent.root, "vm.swappiness") == "1"
    (agent.root / "proc/sys/vm/swappiness").write_text("60\n")
    check = agent.run("post-interrupt", PKG, package="gpu-tuning", config_dir=config)
    assert check.code == 1 and "sysctl vm.swappiness is 60, want 1" in str(check.summary["message"])


def test_changing_the_intent_gives_back_what_the_new_profile_no_longer_sets(agent: Agent, tmp_path: Path) -> None:
    host(agent.root)
    config = configmap(tmp_path / "cm", {"accelerator": "h100", "intent": "multiNodeTraining"})
    assert agent.run("apply", PKG, package="gpu-tuning", config_dir=config).code == 0
    configmap(config, {"accelerator": "h100", "intent": "inference"})
    run = agent.run("config", PKG, package="gpu-tuning", config_dir=config, generation=2)
    assert run.code == 0, run.summary
    assert sysctl(agent.root, "net.core.rmem_max") == "212992"
    assert sysctl(agent.root, "vm.swappiness") == "1"
    assert "hugepages=8192" in (agent.root / "boot/grub/grub.cfg").read_text()
    assert "LimitMEMLOCK" not in (agent.root / "etc/systemd/system/containerd.service.d/50-nodegate-gpu-tuning.conf"
                                  ).read_text()
    assert agent.run("uninstall", PKG, package="gpu-tuning", config_dir=config).code == 0
    assert sysctl(agent.root, "vm.swappiness") == "60"  # the original of before the first apply


def test_container_optimized_os_gets_only_sysctls_and_containerd_limits_and_a_boot_time_unit(
        agent: Agent, tmp_path: Path) -> None:
    host(agent.root, COS)
    config = configmap(tmp_path / "cm", {"accelerator": "h100", "intent": "multiNodeTraining", "cloud": "gke"})
    run = agent.run("apply", PKG, package="gpu-tuning", config_dir=config)
    assert run.code == 0, run.summary
    assert sysctl(agent.root, "net.core.rmem_max") == "536870912"
    assert not (agent.root / "etc/default/grub.d/90-nodegate-gpu-tuning.cfg").exists()
    assert not any(call.startswith(("update-grub", "grubby")) for call in fake_calls(agent.root))
    assert cpu(agent.root, "cpu0/cpufreq/scaling_governor") == "schedutil"  # left out on COS
    assert enabled(agent.root) == ["containerd.service", "irqbalance.service"]  # services left out too
    assert (agent.root / "etc/systemd/system/containerd.service.d/50-nodegate-gpu-tuning.conf").exists()
    log = next((agent.root / "var/log/nodegate/test-gate/gpu-tuning/1.0.0").glob("*-apply.log")).read_text()
    assert "os=cos cloud=gke" in log and "kernelArg/iommu = iommu=pt (accelerator/h100): cos takes only" in log
    # A reboot of COS: /etc comes back from the image, the kernel with its defaults. The unit (here
    # run by hand, as systemd would) reapplies both from the stateful partition.
    (agent.root / "proc/sys/net/core/rmem_max").write_text("212992\n")
    (agent.root / "etc/systemd/system/containerd.service.d/50-nodegate-gpu-tuning.conf").unlink()
    boot(agent)
    assert sysctl(agent.root, "net.core.rmem_max") == "536870912"
    assert "LimitMEMLOCK=infinity" in (agent.root / "etc/systemd/system/containerd.service.d/"
                                       "50-nodegate-gpu-tuning.conf").read_text()
    assert agent.run("post-interrupt", PKG, package="gpu-tuning", config_dir=config).code == 0
    assert agent.run("uninstall", PKG, package="gpu-tuning", config_dir=config).code == 0
    assert sysctl(agent.root, "net.core.rmem_max") == "212992"


def test_an_unsupported_host_fails_apply_with_the_supported_list_and_changes_nothing(
        agent: Agent, tmp_path: Path) -> None:
    host(agent.root, 'PRETTY_NAME="Alpine Linux v3.20"\nID=alpine\n')
    config = configmap(tmp_path / "cm", {"accelerator": "h100", "intent": "inference"})
    run = agent.run("apply", PKG, package="gpu-tuning", config_dir=config)
    assert (run.code, run.summary["failedStep"]) == (1, "apply/assemble")
    assert "Alpine Linux v3.20" in str(run.summary["message"])
    assert "supported: cloud aks: os ubuntu" in str(run.summary["message"])
    assert sysctl(agent.root, "vm.swappiness") == "60"
    assert not (agent.root / "etc/sysctl.d/90-nodegate-gpu-tuning.conf").exists()


def test_a_sysctl_the_kernel_lacks_fails_naming_it_and_how_to_exclude_it(agent: Agent, tmp_path: Path) -> None:
    host(agent.root)
    (agent.root / "proc/sys/net/core/default_qdisc").unlink()
    config = configmap(tmp_path / "cm", {"accelerator": "h100", "intent": "multiNodeTraining"})
    run = agent.run("apply", PKG, package="gpu-tuning", config_dir=config)
    assert (run.code, run.summary["failedStep"]) == (1, "apply/apply")
    assert "sysctl net.core.default_qdisc does not exist in this kernel (exclude it with config " \
           "exclude=sysctl/net.core.default_qdisc)" in str(run.summary["message"])
    configmap(config, {"accelerator": "h100", "intent": "multiNodeTraining",
                       "exclude": "sysctl/net.core.default_qdisc"})
    assert agent.run("apply", PKG, package="gpu-tuning", config_dir=config).code == 0


def test_a_config_key_gpu_tuning_does_not_declare_is_refused_before_any_step(agent: Agent, tmp_path: Path) -> None:
    host(agent.root)
    config = configmap(tmp_path / "cm", {"accelerator": "h100", "intent": "inference", "profile": "x"})
    run = agent.run("apply", PKG, package="gpu-tuning", config_dir=config)
    assert run.code == 2
    assert "config key 'profile' is not declared by package gpu-tuning" in str(run.summary["message"])
    assert sysctl(agent.root, "vm.swappiness") == "60"


FAKE_GRUBBY = r"""#!/bin/sh
# FAKE grubby for this test: one default entry whose arguments live in /etc/fake-grubby-args.
echo "grubby $*" >> /var/log/fake-calls.log
args=$(cat /etc/fake-grubby-args)
for opt in "$@"; do
    case "$opt" in
        --info=DEFAULT) echo "index=0"; echo "kernel=\"/boot/vmlinuz-6.1.0-fake\""; echo "args=\"$args\"" ;;
        --args=*) for a in ${opt#--args=}; do case " $args " in *" $a "*) ;; *) args="$args $a" ;; esac; done ;;
        --remove-args=*)
            for a in ${opt#--remove-args=}; do args=$(echo " $args " | sed "s| $a | |; s|^ ||; s| $||"); done ;;
    esac
done
echo "$args" > /etc/fake-grubby-args
"""
RHEL = 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\n'


def test_the_rhel_family_puts_kernel_arguments_in_with_grubby_and_removes_only_its_own(
        agent: Agent, tmp_path: Path) -> None:
    host(agent.root, RHEL)
    grubby = agent.root / "usr/sbin/grubby"
    grubby.write_text(FAKE_GRUBBY)
    grubby.chmod(0o755)
    (agent.root / "etc/fake-grubby-args").write_text("ro quiet iommu=pt\n")  # iommu=pt was there before
    config = configmap(tmp_path / "cm", {"accelerator": "h100", "intent": "performance"})
    run = agent.run("apply", PKG, package="gpu-tuning", config_dir=config)
    assert run.code == 0, run.summary
    assert "grubby --update-kernel=ALL --args=iommu=pt pci=realloc=off pci=disable_acs_redir=pci:0:0" \
        in fake_calls(agent.root)
    assert (agent.root / "etc/fake-grubby-args").read_text().split() == [
        "ro", "quiet", "iommu=pt", "pci=realloc=off", "pci=disable_acs_redir=pci:0:0"]
    assert not (agent.root / "etc/default/grub.d/90-nodegate-gpu-tuning.cfg").exists()
    assert agent.run("uninstall", PKG, package="gpu-tuning", config_dir=config).code == 0
    assert (agent.root / "etc/fake-grubby-args").read_text().split() == ["ro", "quiet", "iommu=pt"]
