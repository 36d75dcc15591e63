"""Running a step: a SIGTERM to the agent (its pod being stopped) reaches the step, so it can clean up."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from gate.agent.process import Termination, run_command

# Traps TERM and INT, says it is ready, then works until stopped; its cleanup leaves a mark and exits 3.
STEP = """
trap 'echo cleaned up > "$MARK"; exit 3' TERM INT
echo ready > "$READY"
while :; do sleep 0.05; done
"""


def _signal_when(path: Path, signum: int) -> threading.Thread:
    """Send `signum` to this process (as the kubelet would to the agent) once `path` exists."""

    def wait_then_signal() -> None:
        deadline = time.monotonic() + 20
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=wait_then_signal, daemon=True)
    thread.start()
    return thread


def _run(tmp_path: Path, signum: int) -> tuple[int, str | None, int | None, str]:
    ready, mark = tmp_path / "ready", tmp_path / "mark"
    termination = Termination()
    lines: list[str] = []
    with termination.installed():
        sender = _signal_when(ready, signum)
        env = {"READY": str(ready), "MARK": str(mark), "PATH": "/usr/bin:/bin"}
        outcome = run_command(["/bin/sh", "-c", STEP], env, str(tmp_path), None, 30, lines.append, termination)
        sender.join()
    return outcome.returncode, mark.read_text().strip() if mark.exists() else None, outcome.stopped_by, \
        outcome.output_tail


def test_sigterm_to_the_agent_is_passed_on_to_the_running_step(tmp_path: Path) -> None:
    code, mark, stopped_by, tail = _run(tmp_path, signal.SIGTERM)
    assert mark == "cleaned up"  # the step's trap ran: it got the signal and had time to clean up
    assert code == 3 and stopped_by == signal.SIGTERM
    assert tail.endswith("stopped: the agent got SIGTERM and passed it on")


def test_sigint_is_passed_on_too(tmp_path: Path) -> None:
    code, mark, stopped_by, _ = _run(tmp_path, signal.SIGINT)
    assert (code, mark, stopped_by) == (3, "cleaned up", signal.SIGINT)


def test_the_agents_own_handlers_come_back_after_the_stage(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with Termination().installed():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_signal_before_the_command_started_reaches_it_as_it_starts(tmp_path: Path) -> None:
    termination = Termination()
    with termination.installed():
        os.kill(os.getpid(), signal.SIGTERM)
        outcome = run_command(["/bin/sh", "-c", "trap 'exit 4' TERM; while :; do sleep 0.05; done"],
                              {"PATH": "/usr/bin:/bin"}, str(tmp_path), None, 30, lambda _: None, termination)
    # Killed before its trap was set, or by the trap: either way stopped, never left running.
    assert outcome.stopped_by == signal.SIGTERM and outcome.returncode in (4, -signal.SIGTERM)


def test_without_a_termination_a_command_runs_as_before(tmp_path: Path) -> None:
    outcome = run_command(["/bin/sh", "-c", "echo hi"], {"PATH": "/usr/bin:/bin"}, str(tmp_path), None, 30,
                          lambda _: None)
    assert (outcome.returncode, outcome.output_tail, outcome.stopped_by) == (0, "hi", None)
