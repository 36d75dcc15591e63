"""`nodegate agent interrupt` against a real chroot whose systemctl and reboot are recording fakes."""

from __future__ import annotations

import json
import os
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


POD = "0f8e4c52-1a6b-4c1d-9a57-3c2b8e9d7f10"


def test_a_reboot_pod_run_again_on_a_later_boot_does_not_reboot_the_node_again(agent: Agent) -> None:
    """The kubelet of a new boot may run a reboot pod again from its first step (docs/realnodes.md): its
    reboot step finds on the host that this pod asked for its reboot on an earlier boot, and ends with
    success without a second reboot. Another pod (a retry, the next round) reboots as asked."""
    first_boot = (agent.root / "proc/sys/kernel/random/boot_id").read_text().strip()
    run = agent.interrupt("reboot", "--reboot-wait", "0", "--pod", POD)
    assert run.code == 0, run.summary
    assert fake_calls(agent.root) == ["systemctl reboot"]
    assert (agent.root / "var/lib/nodegate/reboots" / POD).read_text() == f"{first_boot}\n"

    again = agent.interrupt("reboot", "--reboot-wait", "0", "--pod", POD)
    assert again.code == 0 and again.summary["ok"], again.summary
    assert "is not rebooted again" in str(again.summary["message"]) and first_boot in str(again.summary["message"])
    assert fake_calls(agent.root) == ["systemctl reboot"]  # still the one reboot

    other = agent.interrupt("reboot", "--reboot-wait", "0", "--pod", POD.replace("0f8e", "1f8e"))
    assert other.code == 0, other.summary
    assert fake_calls(agent.root) == ["systemctl reboot", "systemctl reboot"]


def test_a_reboot_asked_for_again_on_the_same_boot_is_asked_for_again(agent: Agent) -> None:
    """The same pod on the same boot (its first request refused, say): the node has not rebooted since, so
    the reboot is asked for again."""
    make_fail(agent.root, "reboot")
    assert agent.interrupt("reboot", "--reboot-wait", "0", "--pod", POD).code == 1
    (agent.root / "etc/fake-systemd/fail-reboot").unlink()
    run = agent.interrupt("reboot", "--reboot-wait", "0", "--pod", POD)
    assert run.code == 0, run.summary
    assert fake_calls(agent.root) == ["systemctl reboot", "systemctl reboot"]


def test_a_pod_uid_that_is_not_one_is_refused_before_the_host_is_touched(agent: Agent) -> None:
    for bad in ("../../etc/passwd", "0F8E4C52-1A6B-4C1D-9A57-3C2B8E9D7F10", "x"):
        run = agent.interrupt("reboot", "--reboot-wait", "0", "--pod", bad)
        assert run.code == 2 and "is not a pod UID" in str(run.summary["message"]), run.summary
    run = agent.interrupt("service", "--service", "chrony.service", "--pod", POD)
    assert run.code == 2 and "--pod is for --type reboot" in str(run.summary["message"]), run.summary
    assert fake_calls(agent.root) == []
    assert not (agent.root / "var/lib/nodegate/reboots").exists()


def test_the_host_keeps_the_newest_reboot_records_only(agent: Agent) -> None:
    from gate.agent import reboots

    directory = agent.root / "var/lib/nodegate/reboots"
    uids = [f"{i:08x}-0000-4000-8000-000000000000" for i in range(reboots.KEEP + 3)]
    for n, uid in enumerate(uids):
        reboots.record(agent.root, uid, "boot-1")
        os.utime(directory / uid, (1000 + n, 1000 + n))  # written in order, a second apart
    kept = sorted(p.name for p in directory.iterdir())
    assert len(kept) == reboots.KEEP and uids[0] not in kept and uids[-1] in kept
    assert reboots.asked_on(agent.root, uids[-1]) == "boot-1" and reboots.asked_on(agent.root, uids[0]) is None
