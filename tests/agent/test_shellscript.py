"""packages/shellscript on the test root: the gate's scripts per stage, and no stage without its proof."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.conftest import PACKAGES, Agent
from tests.agent.packaging import configmap

pytestmark = pytest.mark.usefixtures("clean_env")

PKG = PACKAGES / "shellscript"
BASE = {
    "apply.sh": "echo installed > /etc/demo\n",
    "apply-check.sh": "grep -qx installed /etc/demo\n",
}


def run(agent: Agent, stage: str, mount: Path, **extra: str) -> tuple[int, str]:
    result = agent.run(stage, PKG, *[a for k, v in extra.items() for a in (f"--{k.replace('_', '-')}", v)],
                       package="shellscript", config_dir=mount)
    return result.code, str(result.summary.get("message", ""))


def test_a_stage_whose_script_ran_without_its_check_script_fails_naming_the_missing_key(
        agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {**BASE, "config.sh": "echo tuned > /etc/demo-config\n"})
    code, message = run(agent, "config", mount)
    assert code == 1
    assert message.endswith("config.sh ran, but the config has no config-check.sh to prove it worked: "
                            "a missing check is a failure")
    assert (agent.root / "etc/demo-config").read_text() == "tuned\n"  # it ran; its proof is what is missing


def test_without_a_stage_script_there_is_nothing_to_prove_and_the_stage_says_so(
        agent: Agent, tmp_path: Path) -> None:
    code, _ = run(agent, "config", configmap(tmp_path / "cm", BASE))
    assert code == 0
    log = "".join(p.read_text() for p in (agent.root / "var/log/nodegate").rglob("*-config.log"))
    assert "no config.sh in the config: nothing to do" in log
    assert "no config.sh and no config-check.sh in the config: nothing changed, nothing to prove" in log


def test_apply_and_its_check_are_required_before_any_step_runs(agent: Agent, tmp_path: Path) -> None:
    code, message = run(agent, "apply", configmap(tmp_path / "cm", {"apply.sh": "touch /etc/ran\n"}))
    assert code == 2
    assert message.startswith("config key 'apply-check.sh' is required by package shellscript")
    assert not (agent.root / "etc/ran").exists()


def test_a_failing_check_script_fails_the_stage_with_its_reason(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {**BASE, "apply-check.sh": "echo 'demo is not installed'; exit 3\n"})
    code, message = run(agent, "apply", mount)
    assert code == 1 and message.endswith("demo is not installed")


def test_the_post_interrupt_check_falls_back_to_the_apply_check(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", BASE)
    assert run(agent, "apply", mount)[0] == 0
    assert run(agent, "post-interrupt", mount)[0] == 0
    (agent.root / "etc/demo").unlink()  # the reboot lost it
    code, message = run(agent, "post-interrupt", mount)
    assert code == 1 and "no post-interrupt-check.sh: proving the install still holds with apply-check.sh" in message


def test_upgrade_gets_both_versions_and_a_shebang_picks_the_interpreter(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {
        **BASE,
        "upgrade.sh": "#!/bin/sh\necho \"from $1 to $2 by $0\" > /etc/upgraded\n",
        "upgrade-check.sh": "grep -q '^from 0.9.0 to 1.0.0 by .*/upgrade.sh$' /etc/upgraded\n",
    })
    assert run(agent, "apply", mount)[0] == 0
    assert run(agent, "upgrade", mount, previous_version="0.9.0")[0] == 0
    assert (agent.root / "etc/upgraded").read_text().startswith("from 0.9.0 to 1.0.0 by ")


def test_a_script_without_a_shebang_runs_with_errexit(agent: Agent, tmp_path: Path) -> None:
    mount = configmap(tmp_path / "cm", {**BASE, "apply.sh": "false\ntouch /etc/after-false\n"})
    assert run(agent, "apply", mount)[0] == 1
    assert not (agent.root / "etc/after-false").exists()
