"""packages/cve-fix on the test root: remediation, and a check that names the node and the CVE while it is open."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agent.conftest import PACKAGES, Agent
from tests.agent.packaging import configmap
from tests.agent.rootfs import fake_calls

PKG = PACKAGES / "cve-fix"
CVE = "CVE-2024-6387"
FIX = f"{CVE} openssh-server 1:9.2p1-2+deb12u3\n"


@pytest.fixture(autouse=True)
def node_name(clean_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEGATE_NODE", "gpu-node-7")


def run(agent: Agent, stage: str, mount: Path) -> tuple[int, str]:
    result = agent.run(stage, PKG, package="cve-fix", config_dir=mount)
    return result.code, str(result.summary.get("message", ""))


def installed(root: Path, package: str) -> str:
    out = subprocess.run(["dpkg-query", "--admindir", str(root / "var/lib/dpkg"), "-W", "-f", "${Version}", package],
                         capture_output=True, text=True, check=True)
    return out.stdout


def test_a_vulnerable_package_fails_the_check_naming_node_and_cve_until_apply_upgrades_it(
        agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {"packages.conf": FIX})
    code, message = run(agent, "post-interrupt", mount)  # the check alone, before any remediation
    assert code == 1
    assert message.endswith(f"node gpu-node-7 is vulnerable to {CVE}: openssh-server 1:9.2p1-2+deb12u2 is below "
                            "the fixed 1:9.2p1-2+deb12u3")
    assert run(agent, "apply", mount) == (0, "2 steps passed")
    assert installed(agent.root, "openssh-server") == "1:9.2p1-2+deb12u3"
    assert "apt-get install -y -q --only-upgrade openssh-server" in fake_calls(agent.root)


def test_when_the_archive_has_no_fixed_version_yet_the_node_stays_failed(agent: Agent, tmp_path: Path) -> None:
    (agent.root / "etc/fake-apt/candidates").write_text("openssh-server 1:9.2p1-2+deb12u2\n")  # no fix published
    code, message = run(agent, "apply", configmap(tmp_path / "cm", {"packages.conf": FIX}))
    assert code == 1 and f"node gpu-node-7 is vulnerable to {CVE}" in message


def test_a_package_at_or_above_the_fix_or_not_installed_is_left_alone(agent: Agent, tmp_path: Path) -> None:
    config = {"packages.conf": f"{CVE} openssh-server 1:9.2p1-2\nCVE-2023-0001 libfoo1 2.0-1  # only config files\n"}
    assert run(agent, "apply", configmap(tmp_path / "cm", config))[0] == 0
    assert not any(call.startswith("apt-get") for call in fake_calls(agent.root))


def test_a_loaded_module_is_blocked_and_unloaded_or_failed_until_the_reboot(agent: Agent, tmp_path: Path) -> None:
    (agent.root / "etc/fake-modules").mkdir()
    (agent.root / "etc/fake-modules/in-use-nouveau").write_text("")
    mount = configmap(tmp_path / "cm", {"modules.conf": "CVE-2024-1086 nouveau\nCVE-2024-0002 drm_kms_helper\n"})
    code, message = run(agent, "apply", mount)
    assert code == 1
    assert message.endswith("node gpu-node-7 is vulnerable to CVE-2024-1086: module nouveau is loaded")
    assert "drm_kms_helper" not in (agent.root / "proc/modules").read_text()  # not in use: unloaded at once
    blocklist = (agent.root / "etc/modprobe.d/85-nodegate-cve-fix-test-gate.conf").read_text()
    assert "install nouveau /bin/false" in blocklist and "# CVE-2024-1086" in blocklist
    assert agent.interrupt("reboot", "--reboot-wait", "0").code == 0
    assert run(agent, "post-interrupt", mount)[0] == 0
    assert run(agent, "uninstall", mount)[0] == 0
    assert not (agent.root / "etc/modprobe.d/85-nodegate-cve-fix-test-gate.conf").exists()


@pytest.mark.parametrize(
    ("config", "failure"),
    [
        ({}, "the config has neither packages.conf nor modules.conf lines: nothing to fix"),
        ({"packages.conf": "CVE-24-1 openssh-server 1.0\n"}, "packages.conf: 'CVE-24-1' is not a CVE id"),
        ({"packages.conf": f"{CVE} openssh-server\n"}, "is not 'CVE PACKAGE FIXED_VERSION'"),
        ({"modules.conf": "CVE-2024-1086 nf/tables\n"}, "modules.conf: 'nf/tables' is not a module name"),
    ],
)
def test_a_bad_config_fails_saying_why(agent: Agent, tmp_path: Path, config: dict[str, str], failure: str) -> None:
    code, message = run(agent, "apply", configmap(tmp_path / "cm", config))
    assert code == 1 and failure in message, message


def test_a_version_or_package_name_that_is_code_is_refused_before_it_reaches_dpkg_or_rpm(
        agent: Agent, tmp_path: Path) -> None:
    """Issue 33: packages.conf reached `rpm --eval` inside a Lua body; a version could close the string
    and run any Lua as root. Macro and shell characters are refused by the package's declared pattern
    (the agent, before the host is touched), the rest of what is not a name or a version by the script."""
    lua = f"{CVE} openssh-server 1')os.execute('reboot')print('\n"  # one word: a version field
    macro = f"{CVE} openssh-server 1%{{lua:os.execute('touch /pwned')}}\n"
    code, message = run(agent, "apply", configmap(tmp_path / "cm", {"packages.conf": macro}))
    assert code == 2 and message.startswith("config key 'packages.conf': does not match the pattern"), message
    code, message = run(agent, "apply", configmap(tmp_path / "cm", {"packages.conf": lua}))
    assert code == 1 and "is not a package version" in message, message
    code, message = run(agent, "apply", configmap(tmp_path / "cm", {"packages.conf": f"{CVE} -oDebug::x=1 2.0\n"}))
    assert code == 1 and "'-oDebug::x=1' is not a package name" in message, message
    assert not (agent.root / "pwned").exists()
    assert not any(c.startswith("apt-get") for c in fake_calls(agent.root))


def test_rpm_compares_versions_through_a_fixed_lua_body(tmp_path: Path) -> None:
    """The dnf path, with a fake rpm that records its arguments: the versions arrive as macro
    definitions, never inside the Lua, and a version that is not one is never handed to rpm."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rpm").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/rpm-args\necho 1\n')
    (bin_dir / "rpm").chmod(0o755)

    def at_least(have: str, want: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["/bin/sh", "-c", f'. {PKG}/scripts/lib.sh; pm=dnf; at_least "$1" "$2"', "sh",
                               have, want], capture_output=True, text=True,
                              env={"NODEGATE_GATE": "g", "NODEGATE_CONFIG_DIR": str(tmp_path),
                                   "PATH": f"{bin_dir}:/usr/bin:/bin"})

    assert at_least("1:9.2p1-2.el9", "1:9.2p1-1.el9").returncode == 0
    args = (tmp_path / "rpm-args").read_text().splitlines()
    assert args == ["--define", "nodegate_have 1:9.2p1-2.el9", "--define", "nodegate_want 1:9.2p1-1.el9", "--eval",
                    '%{lua: print(rpm.vercmp(rpm.expand("%{nodegate_have}"), rpm.expand("%{nodegate_want}")))}']
    (tmp_path / "rpm-args").unlink()
    refused = at_least("1')os.execute('touch /pwned')print('", "2.0")
    assert refused.returncode == 2 and "not package versions" in refused.stderr
    assert not (tmp_path / "rpm-args").exists()
