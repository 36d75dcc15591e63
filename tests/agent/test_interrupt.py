"""`nodegate agent interrupt` against a real chroot whose systemctl and reboot are recording fakes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.agent.conftest import REPO, Agent
from tests.agent.rootfs import fake_calls, make_fail, restarted_units


def test_a_service_interrupt_reloads_systemd_then_restarts_each_unit(agent: Agent) -> None:
    run = agent.interrupt("service", "--service", "chrony.service", "--service", "cron.service")
    assert run.code == 0
    assert fake_calls(agent.root) == ["systemctl daemon-reload", "systemctl restart chrony.service",
                                      "systemctl restart cron.service"]
    assert run.summary == {**run.summary, "stage": "interrupt", "interrupt": "service", "ok": True}
    assert list((agent.root / "var/log/nodegate/interrupts").glob("*-service.log"))


def test_one_unit_failing_to_restart_fails_the_interrupt_but_the_others_still_restart(agent: Agent) -> None:
    make_fail(agent.root, "restart-chrony.service")
    run = agent.interrupt("service", "--service", "chrony.service", "--service", "cron.service")
    assert run.code == 1
    assert restarted_units(agent.root) == ["cron.service"]
    assert (run.summary["ok"], run.summary["failedStep"], run.summary["exitCode"]) == (
        False, "systemctl restart chrony.service", 1)
    assert "Job for chrony.service failed" in str(run.summary["message"])


def test_a_failed_daemon_reload_restarts_nothing(agent: Agent) -> None:
    make_fail(agent.root, "daemon-reload")
    run = agent.interrupt("service", "--service", "chrony.service")
    assert (run.code, run.summary["failedStep"]) == (1, "systemctl daemon-reload")
    assert restarted_units(agent.root) == []


def test_restart_all_services_restarts_running_services_except_systemd_bus_and_gettys(agent: Agent) -> None:
    run = agent.interrupt("restartAllServices")
    assert run.code == 0, run.summary
    assert restarted_units(agent.root) == ["chrony.service", "cron.service", "ssh.service"]
    assert fake_calls(agent.root)[0] == "systemctl daemon-reload"


def test_a_service_interrupt_without_services_is_refused(agent: Agent) -> None:
    run = agent.interrupt("service")
    assert run.code == 2 and "needs at least one --service" in str(run.summary["message"])
    assert fake_calls(agent.root) == []


def test_reboot_goes_through_the_hosts_systemctl(agent: Agent) -> None:
    run = agent.interrupt("reboot", "--reboot-wait", "0")
    assert run.code == 0, run.summary
    assert fake_calls(agent.root) == ["systemctl reboot"]
    assert (agent.root / "proc/sys/kernel/random/boot_id").read_text() != "fake-boot-0\n"


def test_reboot_uses_reboot_on_a_host_without_systemctl(agent: Agent) -> None:
    (agent.root / "usr/bin/systemctl").unlink()
    run = agent.interrupt("reboot", "--reboot-wait", "0")
    assert run.code == 0, run.summary
    assert fake_calls(agent.root) == ["reboot "]


def test_a_refused_reboot_fails_and_replaces_the_early_success_summary(agent: Agent) -> None:
    make_fail(agent.root, "reboot")
    run = agent.interrupt("reboot", "--reboot-wait", "0")
    assert run.code == 1
    assert (run.summary["ok"], run.summary["failedStep"]) == (False, "systemctl reboot")
    assert "Failed to reboot" in str(run.summary["message"])


def test_a_reboot_that_never_comes_fails_after_the_wait(agent: Agent) -> None:
    run = agent.interrupt("reboot", "--reboot-wait", "0.2")
    assert run.code == 1
    assert "did not shut down within 0.2s" in str(run.summary["message"])


def test_the_reboot_command_killed_by_the_shutdown_counts_as_success(agent: Agent) -> None:
    (agent.root / "etc/fake-systemd/shutdown-kills-self").write_text("")
    run = agent.interrupt("reboot", "--reboot-wait", "600")
    assert run.code == 0, run.summary
    assert "killed by the shutdown" in str(run.summary["message"])


def test_the_agent_stopped_by_the_shutdown_after_asking_for_a_reboot_exits_0_with_success(
    root: Path, tmp_path: Path
) -> None:
    """Like systemd stopping the pod: the fake reboot sends SIGTERM to the agent process itself."""
    (root / "etc/fake-systemd/shutdown-kills-caller").write_text("")
    log = tmp_path / "termination-log"
    proc = subprocess.run(
        [sys.executable, "-m", "gate.cli.main", "agent", "interrupt", "--type", "reboot", "--root", str(root),
         "--termination-log", str(log), "--reboot-wait", "300"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(log.read_text())
    assert (summary["ok"], summary["interrupt"]) == (True, "reboot")
    assert summary["message"] == "stopped by the shutdown after the reboot was requested"


def test_an_interrupt_on_a_missing_root_is_refused(agent: Agent, tmp_path: Path) -> None:
    agent.root = tmp_path / "nowhere"
    run = agent.interrupt("reboot")
    assert run.code == 2 and "does not exist" in str(run.summary["message"])
