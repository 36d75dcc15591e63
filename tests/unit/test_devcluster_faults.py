"""The fault injection of gate/devcluster/faults.py and what the node's supervisor decides about a node
that went down, as data and on processes of this test's own (the faults on real nodes are
tests/realnode/test_faults.py)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from gate.devcluster import faults, realnode
from gate.devcluster.processes import ProcessTable


def test_a_reboot_and_a_power_cut_boot_the_node_again_and_any_other_end_stops_it(tmp_path: Path) -> None:
    marker = tmp_path / realnode.POWER_CUT_FILE
    assert realnode.down_cause(-realnode.REBOOT_SIGNAL, marker) == "rebooted"
    # A SIGKILL of the node's init is a power cut only when the fault said so first: someone else's
    # kill (or a broken node) must not boot-loop.
    assert realnode.down_cause(-signal.SIGKILL, marker) is None
    marker.write_text("1\n")
    assert realnode.down_cause(-signal.SIGKILL, marker) == "power cut"
    assert realnode.down_cause(1, marker) == "power cut"  # unshare exits 1 when its child was SIGKILLed
    assert realnode.down_cause(0, marker) is None
    marker.unlink()
    assert realnode.down_cause(1, marker) is None


def test_a_held_boot_is_read_as_seconds_and_anything_else_holds_nothing(tmp_path: Path) -> None:
    hold = tmp_path / realnode.HOLD_BOOT_FILE
    assert realnode.read_hold(hold) == 0.0
    hold.write_text("120\n")
    assert realnode.read_hold(hold) == 120.0
    hold.write_text("soon\n")
    assert realnode.read_hold(hold) == 0.0
    hold.write_text("-5\n")
    assert realnode.read_hold(hold) == 0.0


def test_a_fault_names_the_node_or_process_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(faults.FaultError, match=r"real-node-9 is not a real node of the dev cluster in"):
        faults.kill_kubelet(tmp_path, "real-node-9")
    with pytest.raises(faults.FaultError, match=r"operator is not a process of the dev cluster in"):
        faults.kill_operator(tmp_path)
    with pytest.raises(faults.FaultError, match=r"registry is not a process"):
        faults.registry_down(tmp_path)


def test_a_killed_host_process_starts_again_with_its_command_line_and_environment(tmp_path: Path) -> None:
    table = ProcessTable(tmp_path)
    script = "import os, time; print('env', os.environ['FAULT_TEST'], flush=True); time.sleep(60)"
    first = table.register("registry", [sys.executable, "-c", script], env={"FAULT_TEST": "kept"})
    log = tmp_path / "logs" / "registry.log"
    try:
        printed(log, 1)
        killed = faults.registry_down(tmp_path)
        assert killed.pid == first.pid and not first.alive()
        # Still recorded while down, so that it starts again as it was.
        assert table.all()["registry"].pid == first.pid
        with pytest.raises(faults.FaultError, match="is not running"):
            faults.registry_down(tmp_path)
        again = faults.registry_up(tmp_path)
        assert again.pid != first.pid and again.alive() and again.argv == first.argv
        assert again.env == {"FAULT_TEST": "kept"}
        assert faults.registry_up(tmp_path).pid == again.pid  # already up: left alone
        printed(log, 2)  # the second start saw the same environment
    finally:
        table.stop_all()


def printed(log: Path, times: int) -> None:
    for _ in range(600):
        if log.exists() and log.read_text().count("env kept") >= times:
            return
        time.sleep(0.05)
    raise AssertionError(f"'env kept' not printed {times} times: {log.read_text() if log.exists() else ''}")


def test_a_killed_operator_stays_away_until_what_it_waits_for_holds_and_no_longer(tmp_path: Path) -> None:
    table = ProcessTable(tmp_path)
    script = "import time; print('env kept', flush=True); time.sleep(60)"
    first = table.register("operator", [sys.executable, "-c", script])
    asked: list[bool] = []

    def until() -> bool:  # holds at the third time it is asked; the operator is down until then
        assert not table.all()["operator"].alive()
        asked.append(True)
        return len(asked) >= 3

    try:
        again = faults.kill_operator(tmp_path, until=until)
        assert len(asked) == 3 and not first.alive() and again.alive() and again.pid != first.pid
        with pytest.raises(faults.FaultError, match=r"did not happen within 1s; it is started again"):
            faults.kill_operator(tmp_path, until=lambda: False, timeout=1.0)
        assert table.all()["operator"].alive()  # started again all the same: a test's cluster keeps its operator

        def broken() -> bool:
            raise RuntimeError("the API server did not answer")

        with pytest.raises(RuntimeError, match="did not answer"):
            faults.kill_operator(tmp_path, until=broken)
        assert table.all()["operator"].alive()
    finally:
        table.stop_all()
