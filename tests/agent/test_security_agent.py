"""packages/security-agent on the test root: auditd pinned and held, rules loaded, upgraded, the host restored."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agent.conftest import PACKAGES, Agent
from tests.agent.packaging import configmap
from tests.agent.rootfs import installed_version

pytestmark = pytest.mark.usefixtures("clean_env")

PKG = PACKAGES / "security-agent"
OLD, NEW = "1:3.0.9-1", "1:3.1.2-2"
RULES = "-w /etc/passwd -p wa -k identity\n-a always,exit -F arch=b64 -S execve -k exec\n"


def run(agent: Agent, stage: str, mount: Path, generation: int = 1) -> tuple[int, str]:
    result = agent.run(stage, PKG, package="security-agent", config_dir=mount, generation=generation)
    return result.code, str(result.summary.get("message", ""))


def installed(root: Path) -> str:
    return installed_version(root, "auditd")


def holds(root: Path) -> str:
    path = root / "var/lib/fake-apt/holds"
    return path.read_text() if path.exists() else ""


def loaded(root: Path) -> str:
    path = root / "run/fake-audit/loaded"
    return path.read_text() if path.exists() else ""


def test_auditd_is_pinned_held_active_with_the_rules_loaded_then_an_upgrade_then_purged(
        agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {"version": f"{OLD}\n", "audit.rules": RULES})
    assert run(agent, "apply", mount) == (0, "2 steps passed")
    assert (installed(agent.root), holds(agent.root)) == (OLD, "auditd\n")
    assert "-k identity" in loaded(agent.root)
    # The upgrade path: a new pinned version in the config.
    configmap(mount, {"version": f"{NEW}\n", "audit.rules": RULES})
    assert run(agent, "config", mount, generation=2)[0] == 0
    assert (installed(agent.root), holds(agent.root)) == (NEW, "auditd\n")
    assert run(agent, "uninstall", mount, generation=2)[0] == 0
    assert (installed(agent.root), holds(agent.root), loaded(agent.root)) == ("", "", "")


def test_uninstall_puts_back_the_auditd_the_host_had(agent: Agent, tmp_path: Path) -> None:
    assert subprocess.run(["chroot", str(agent.root), "apt-get", "install", "-y", f"auditd={NEW}"],
                          capture_output=True).returncode == 0   # the host's own auditd, not held
    mount = configmap(tmp_path / "cm", {"version": OLD, "audit.rules": RULES})
    assert run(agent, "apply", mount)[0] == 0
    assert installed(agent.root) == OLD  # pinned means pinned, downwards too
    assert run(agent, "config", mount, generation=2)[0] == 0  # a rerun must not record our install as the host's
    assert run(agent, "uninstall", mount, generation=2)[0] == 0
    assert (installed(agent.root), holds(agent.root)) == (NEW, "")
    assert "-k identity" not in loaded(agent.root)


def test_the_check_names_a_stopped_service_a_moved_version_and_an_unloaded_rule(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {"version": OLD, "audit.rules": RULES})
    assert run(agent, "apply", mount)[0] == 0
    running = agent.root / "etc/fake-systemd/running"
    running.write_text("".join(line for line in running.read_text().splitlines(keepends=True)
                               if not line.startswith("auditd.service")))
    (agent.root / "run/fake-audit/loaded").write_text("-w /etc/passwd -p wa -k identity\n")
    (agent.root / "var/lib/fake-apt/holds").write_text("")
    code, message = run(agent, "post-interrupt", mount)
    assert code == 1
    assert "auditd.service is not active" in message
    assert "auditd is not held at 1:3.0.9-1" in message
    assert "rule with key exec is not loaded (0 of 1): -a always,exit -F arch=b64 -S execve -k exec" in message


@pytest.mark.parametrize(
    ("config", "code", "failure"),
    [
        ({"audit.rules": RULES}, 2, "config key 'version' is required by package security-agent"),
        ({"version": "latest"}, 2, "config key 'version': does not match the pattern"),
        ({"version": "1:9.9-1"}, 1, "E: Version '1:9.9-1' for 'auditd' was not found"),
        ({"version": OLD, "audit.rules": "-w /etc/passwd -p wa\n"}, 1, "has no key (-k KEY)"),
        ({"version": OLD, "audit.rules": "-D\n"}, 1, "audit.rules: '-D' is a control line"),
    ],
)
def test_a_bad_config_is_refused_saying_why(
        agent: Agent, tmp_path: Path, config: dict[str, str], code: int, failure: str) -> None:
    got, message = run(agent, "apply", configmap(tmp_path / "cm", config))
    assert got == code and failure in message, message
    assert installed(agent.root) == ""
