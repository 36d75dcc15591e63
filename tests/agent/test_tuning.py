"""packages/tuning on the test root: each config key's change proven live, followed and undone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.agent.conftest import PACKAGES, Agent
from tests.agent.packaging import configmap
from tests.agent.rootfs import fake_calls

pytestmark = pytest.mark.usefixtures("clean_env")

PKG = PACKAGES / "tuning"
GATE = "test-gate"
TAG = f"85-nodegate-tuning-{GATE}"
SYSCTL_FILE = f"etc/sysctl.d/{TAG}.conf"
GRUB_FILE = f"etc/default/grub.d/{TAG}.cfg"
LIMITS_FILE = f"etc/security/limits.d/{TAG}.conf"
CHRONY_DROP_IN = f"etc/systemd/system/chrony.service.d/{TAG}.conf"
FULL = {
    "sysctl.conf": "net.core.somaxconn = 8192\nnet.ipv4.tcp_keepalive_time=600\n",
    "grub.conf": "iommu=pt intel_iommu=on  # for the GPUs\n",
    "ulimit.conf": "root soft nofile 4242\n* - nofile 4000\n",
    "service_chrony.conf": "[Service]\nLimitNOFILE=65536\n",
}


def sysctl(root: Path, key: str) -> str:
    return (root / "proc/sys" / key.replace(".", "/")).read_text().strip()


def run(agent: Agent, stage: str, mount: Path, generation: int = 1) -> tuple[int, str]:
    result = agent.run(stage, PKG, package="tuning", config_dir=mount, generation=generation)
    return result.code, str(result.summary.get("message", ""))


def test_every_key_is_applied_proven_live_after_the_reboot_and_undone_by_uninstall(
        agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", FULL)
    assert run(agent, "apply", mount)[0] == 0
    assert run(agent, "config", mount) == (0, "2 steps passed")
    assert (sysctl(agent.root, "net.core.somaxconn"), sysctl(agent.root, "net.ipv4.tcp_keepalive_time")) == (
        "8192", "600")
    assert 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt intel_iommu=on"' in (agent.root / GRUB_FILE).read_text()
    assert "iommu=pt intel_iommu=on" in (agent.root / "boot/grub/grub.cfg").read_text()
    assert "root soft nofile 4242" in (agent.root / LIMITS_FILE).read_text()
    assert (agent.root / CHRONY_DROP_IN).read_text().endswith("[Service]\nLimitNOFILE=65536\n")

    # Before the reboot the kernel has not got the arguments, and chrony has not loaded its drop-in.
    code, message = run(agent, "post-interrupt", mount)
    assert code == 1
    assert "kernel argument iommu=pt is not in /proc/cmdline" in message
    assert f"chrony.service has not loaded /{CHRONY_DROP_IN}" in message
    assert agent.interrupt("reboot", "--reboot-wait", "0").code == 0
    assert run(agent, "post-interrupt", mount)[0] == 0

    assert run(agent, "uninstall", mount)[0] == 0
    assert (sysctl(agent.root, "net.core.somaxconn"), sysctl(agent.root, "net.ipv4.tcp_keepalive_time")) == (
        "4096", "7200")
    for left in (SYSCTL_FILE, GRUB_FILE, LIMITS_FILE, CHRONY_DROP_IN):
        assert not (agent.root / left).exists(), left
    assert "iommu" not in (agent.root / "boot/grub/grub.cfg").read_text()


def test_a_key_leaving_the_config_takes_its_change_away_and_reruns_keep_the_first_originals(
        agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", FULL)
    assert run(agent, "config", mount)[0] == 0
    assert run(agent, "config", mount, generation=2)[0] == 0  # a rerun must not save 8192 as the original
    configmap(mount, {"sysctl.conf": "net.ipv4.tcp_keepalive_time = 300\n"})
    grub_runs = sum(call == "update-grub " for call in fake_calls(agent.root))
    assert run(agent, "config", mount, generation=3) == (0, "2 steps passed")
    assert sysctl(agent.root, "net.core.somaxconn") == "4096"  # left the config: the original is back
    assert sysctl(agent.root, "net.ipv4.tcp_keepalive_time") == "300"
    for gone in (GRUB_FILE, LIMITS_FILE, CHRONY_DROP_IN):
        assert not (agent.root / gone).exists(), gone
    assert not (agent.root / "etc/systemd/system/chrony.service.d").exists()
    assert "iommu" not in (agent.root / "boot/grub/grub.cfg").read_text()
    assert sum(call == "update-grub " for call in fake_calls(agent.root)) == grub_runs + 1
    assert run(agent, "uninstall", mount)[0] == 0
    assert sysctl(agent.root, "net.ipv4.tcp_keepalive_time") == "7200"


def test_an_unchanged_grub_conf_does_not_regenerate_grub_cfg(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {"grub.conf": "iommu=pt\n"})
    assert run(agent, "config", mount)[0] == 0
    assert run(agent, "config", mount, generation=2)[0] == 0
    assert sum(call == "update-grub " for call in fake_calls(agent.root)) == 1


def test_the_check_names_each_value_that_drifted_from_the_config(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", FULL)
    assert run(agent, "config", mount)[0] == 0
    (agent.root / "proc/sys/net/core/somaxconn").write_text("128\n")  # changed behind our back
    (agent.root / LIMITS_FILE).write_text("# edited by hand\n")
    (agent.root / CHRONY_DROP_IN).write_text("[Service]\n")
    code, message = run(agent, "post-interrupt", mount)
    assert code == 1
    assert "sysctl net.core.somaxconn is 128, want 8192" in message
    assert "root's soft nofile is" in message and "want 4242" in message
    assert f"/{CHRONY_DROP_IN} does not hold the config's service_chrony.conf" in message


def test_a_file_that_was_at_our_path_before_is_put_back_by_uninstall(agent: Agent, tmp_path: Path) -> None:
    (agent.root / LIMITS_FILE).parent.mkdir(parents=True)
    (agent.root / LIMITS_FILE).write_text("someone else's limits\n")
    mount = configmap(tmp_path / "cm", {"ulimit.conf": "root - nofile 5000\n"})
    assert run(agent, "config", mount)[0] == 0
    assert run(agent, "uninstall", mount)[0] == 0
    assert (agent.root / LIMITS_FILE).read_text() == "someone else's limits\n"


@pytest.mark.parametrize(
    ("config", "refusal"),
    [
        ({"grub.conf": 'quiet init="/bin/sh"\n'}, "config key 'grub.conf': does not match the pattern"),
        ({"sysctls.conf": "x = 1\n"}, "config key 'sysctls.conf' is not declared by package tuning (declared: "
                                      "sysctl.conf, grub.conf, ulimit.conf, service_*.conf)"),
    ],
)
def test_a_config_the_package_does_not_take_is_refused_before_any_step(
        agent: Agent, tmp_path: Path, config: dict[str, str], refusal: str) -> None:
    code, message = run(agent, "config", configmap(tmp_path / "cm", config))
    assert code == 2 and refusal in message
    assert fake_calls(agent.root) == []


@pytest.mark.parametrize(
    ("config", "failure"),
    [
        ({"sysctl.conf": "net.core.somaxconn 8192\n"}, "sysctl.conf: 'net.core.somaxconn 8192' is not key = value"),
        ({"sysctl.conf": "net.core.no_such_key = 1\n"}, "cannot stat"),
        ({"ulimit.conf": "root soft nofile\n"}, "is not 'domain type item value'"),
        ({"ulimit.conf": "root both nofile 10\n"}, "ulimit.conf: type 'both' is not soft, hard or -"),
    ],
)
def test_a_malformed_value_fails_the_config_step_saying_why(
        agent: Agent, tmp_path: Path, config: dict[str, str], failure: str) -> None:
    code, message = run(agent, "config", configmap(tmp_path / "cm", config))
    assert code == 1 and failure in message, message


def preset_config(name: str) -> dict[str, str]:
    gate = yaml.safe_load((PKG / "examples" / f"{name}.yaml").read_text())
    config: dict[str, str] = gate["spec"]["packages"]["tuning"]["config"]
    return config


def test_the_sysctl_tuning_preset_sets_what_the_sysctl_tuning_package_sets(agent: Agent, tmp_path: Path) -> None:
    overlay = (PACKAGES / "sysctl-tuning/root/etc/sysctl.d/90-nodegate-tuning.conf").read_text()
    wanted = dict(line.replace(" ", "").split("=") for line in overlay.splitlines() if line and line[0] != "#")
    assert run(agent, "config", configmap(tmp_path / "cm", preset_config("sysctl-tuning")))[0] == 0
    assert {key: sysctl(agent.root, key) for key in wanted} == wanted
    assert run(agent, "uninstall", tmp_path / "cm")[0] == 0
    assert sysctl(agent.root, "vm.swappiness") == "60"


def test_the_grub_cmdline_preset_reaches_proc_cmdline_through_the_reboot(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", preset_config("grub-cmdline"))
    assert run(agent, "config", mount)[0] == 0
    assert agent.interrupt("reboot", "--reboot-wait", "0").code == 0
    assert run(agent, "post-interrupt", mount)[0] == 0
    assert "intel_iommu=on iommu=pt" in (agent.root / "proc/cmdline").read_text()
