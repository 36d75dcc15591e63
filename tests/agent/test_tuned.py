"""packages/tuned on the test root: tuned installed, the config's profiles written and activated,
`tuned-adm verify` as the proof, and the host's profile (or no tuned at all) back on uninstall.

tuned-adm is a fake here (tests/agent/rootfs.py): it applies and verifies a profile's [sysctl]
settings on the test root's /proc/sys, and fails while tuned.service is not running."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agent.conftest import PACKAGES, Agent
from tests.agent.packaging import configmap
from tests.agent.rootfs import fake_calls, installed_version

pytestmark = pytest.mark.usefixtures("clean_env")

PKG = PACKAGES / "tuned"
THROUGHPUT = "[main]\ninclude=balanced\n\n[sysctl]\nnet.core.somaxconn=8192\n"
LATENCY = "[main]\nsummary=low latency\n\n[sysctl]\nnet.ipv4.tcp_keepalive_time=60\n"


def run(agent: Agent, stage: str, mount: Path, generation: int = 1) -> tuple[int, str]:
    result = agent.run(stage, PKG, package="tuned", config_dir=mount, generation=generation)
    return result.code, str(result.summary.get("message", ""))


def sysctl(root: Path, key: str) -> str:
    return (root / "proc/sys" / key.replace(".", "/")).read_text().strip()


def installed(root: Path) -> str:
    return installed_version(root, "tuned")


def active(root: Path) -> str:
    path = root / "etc/tuned/active_profile"
    return path.read_text().strip() if path.exists() else ""


def test_tuned_is_installed_the_profile_activated_and_verified_and_uninstall_purges_what_the_host_lacked(
        agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {"tuned_profile": "gpu-net\n", "profile_gpu-net.conf": THROUGHPUT})
    assert run(agent, "apply", mount) == (0, "2 steps passed")
    assert installed(agent.root) == "2.19.0-2" and active(agent.root) == "gpu-net"
    assert (agent.root / "etc/tuned/gpu-net/tuned.conf").read_text().endswith(THROUGHPUT)
    assert sysctl(agent.root, "net.core.somaxconn") == "8192"
    assert "tuned-adm verify" in fake_calls(agent.root)
    assert run(agent, "uninstall", mount) == (0, "2 steps passed")
    assert installed(agent.root) == "" and active(agent.root) == ""
    assert sysctl(agent.root, "net.core.somaxconn") == "4096"   # tuned reverted it as the profile went
    assert not (agent.root / "etc/tuned/gpu-net").exists()


def test_drift_from_the_profile_and_a_stopped_daemon_fail_the_check(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {"tuned_profile": "gpu-net", "profile_gpu-net.conf": THROUGHPUT})
    assert run(agent, "apply", mount)[0] == 0
    (agent.root / "proc/sys/net/core/somaxconn").write_text("128\n")   # someone changed it on the node
    code, message = run(agent, "post-interrupt", mount)
    assert code == 1 and "tuned-adm verify failed: the host's settings differ from profile gpu-net" in message
    running = agent.root / "etc/fake-systemd/running"
    running.write_text("".join(line for line in running.read_text().splitlines(keepends=True)
                               if not line.startswith("tuned.service")))
    code, message = run(agent, "post-interrupt", mount)
    assert code == 1 and "tuned.service is not active" in message
    assert run(agent, "config", mount, generation=2)[0] == 0   # config starts tuned again and reapplies
    assert sysctl(agent.root, "net.core.somaxconn") == "8192"


def test_a_config_change_switches_the_profile_and_removes_the_one_that_left(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {"tuned_profile": "gpu-net", "profile_gpu-net.conf": THROUGHPUT})
    assert run(agent, "apply", mount)[0] == 0
    configmap(mount, {"tuned_profile": "low-latency", "profile_low-latency.conf": LATENCY})
    assert run(agent, "config", mount, generation=2)[0] == 0
    assert active(agent.root) == "low-latency"
    assert not (agent.root / "etc/tuned/gpu-net").exists()
    assert (sysctl(agent.root, "net.core.somaxconn"), sysctl(agent.root, "net.ipv4.tcp_keepalive_time")) == (
        "4096", "60")


def test_uninstall_puts_back_the_profile_the_host_had_active_and_keeps_its_tuned(agent: Agent, tmp_path: Path) -> None:
    chroot = ["chroot", str(agent.root)]
    assert subprocess.run([*chroot, "apt-get", "install", "-y", "tuned"], capture_output=True).returncode == 0
    assert subprocess.run([*chroot, "tuned-adm", "profile", "balanced"], capture_output=True).returncode == 0
    mount = configmap(tmp_path / "cm", {"tuned_profile": "gpu-net", "profile_gpu-net.conf": THROUGHPUT})
    assert run(agent, "apply", mount)[0] == 0
    assert run(agent, "config", mount, generation=2)[0] == 0   # a rerun must not save our profile as the host's
    assert active(agent.root) == "gpu-net"
    assert run(agent, "uninstall", mount, generation=2)[0] == 0
    assert (installed(agent.root), active(agent.root)) == ("2.19.0-2", "balanced")
    assert not any(call.startswith("apt-get purge") for call in fake_calls(agent.root))


def test_a_shipped_profile_is_activated_without_a_profile_in_the_config(agent: Agent, tmp_path: Path) -> None:
    assert run(agent, "apply", configmap(tmp_path / "cm", {"tuned_profile": "balanced"}))[0] == 0
    assert active(agent.root) == "balanced"


@pytest.mark.parametrize(
    ("config", "code", "failure"),
    [
        ({"profile_x.conf": THROUGHPUT}, 2, "config key 'tuned_profile' is required by package tuned"),
        ({"tuned_profile": "../etc"}, 2, "config key 'tuned_profile': does not match the pattern"),
        ({"tuned_profile": "x", "profiles_x.conf": THROUGHPUT}, 2, "profiles_x.conf"),
        ({"tuned_profile": "nope"}, 1, "tuned_profile 'nope' is neither in the config (profile_nope.conf) nor shipped"),
        ({"tuned_profile": "x", "profile_a b.conf": THROUGHPUT}, 1,
         "config key profile_a b.conf: 'a b' is not a profile name (letters, digits, _ . -)"),
    ],
)
def test_a_bad_config_is_refused_saying_why(
        agent: Agent, tmp_path: Path, config: dict[str, str], code: int, failure: str) -> None:
    got, message = run(agent, "apply", configmap(tmp_path / "cm", config))
    assert got == code and failure in message, message
    assert active(agent.root) == ""
