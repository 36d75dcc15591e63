"""`nodegate demo --quick`: the README's first command, run to the end on its own control plane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate.devcluster.cluster import DevCluster
from tests.conftest import kubectl_path
from tests.processes import HANG_GUARD, ctrl_c, group_process, read_until

NODEGATE = [sys.executable, "-m", "gate.cli.main"]


def _kubectl(kubeconfig: Path, *args: str) -> str:
    return subprocess.run([kubectl_path(), "--kubeconfig", str(kubeconfig), *args], check=True,
                          capture_output=True, text=True, timeout=60).stdout


def test_the_quick_demo_tells_the_whole_story_and_leaves_a_cluster_to_explore(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    try:
        with group_process([*NODEGATE, "demo", "--quick", "--keep", "--state-dir", str(state)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE) as demo:
            out, err = demo.communicate(timeout=540)  # a hang guard under pytest's 600 s
        run = subprocess.CompletedProcess(demo.args, demo.returncode, out, err)
        assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
        assert [line for line in out.splitlines() if line.startswith("== Step")] == [
            "== Step 1/6: A real control plane with 12 simulated nodes",
            "== Step 2/6: Admission: a bad spec is refused with its reason",
            "== Step 3/6: Rolling out NodeGate host-tuning under DeploymentPolicy demo-fleet",
            "== Step 4/6: Fix the node, rerun chrony-conf there, resume pool-b",
            "== Step 5/6: Following the rollout to the end",
            "== Step 6/6: Summary",
        ]
        assert ('denied the request: spec.packages[sysctl-tuning].image: tag "2.0.0" differs from version "1.0.0"'
                in out)
        assert "failed in chrony-conf apply: StageFailed: step enable-confdir exited 1: /etc/chrony/chrony.conf " \
               "not found: is chrony installed?" in out
        assert "$ nodegate rerun host-tuning --node pool-b-" in out
        assert "$ nodegate resume host-tuning --compartment pool-b" in out
        assert "NodeGate host-tuning: Ready, 12 of 12 nodes complete." in out
        # The summary's statements, each counted from the cluster (gate.cli.demo.summary_lines).
        for line in ("Every node (12) was cordoned, drained, rebooted (a new boot ID) and uncordoned, by the "
                     "operator's Events on the nodes.",
                     "Cordoned now: none.",
                     "12 of 12 nodes record all 4 packages installed at the gate's versions in their state "
                     "annotation",
                     "12 interrupt steps for 12 nodes: the packages' interrupts were merged into one reboot per node.",
                     "stopped pool-b after 1 failed batch; a rerun and a resume finished it."):
            assert line in out, out[-3000:]
        # Every package stage of the gate ran as a step: 4 packages' applies on 12 nodes and the failed one
        # again, one package's config, one reboot and 3 checks after it per node (the 4th asks for none);
        # but grub-cmdline's and module-blocklist's apply on a node where both were staged whole (Event
        # StagedWhole), which ran in its staging pod and no container in the window.
        [pods] = [line for line in out.splitlines() if " stage pods ran " in line]
        whole = [line for line in out.splitlines() if "staged whole ran no container" in line]
        staged_whole = int(whole[0].split(" of ")[0].split()[-1]) if whole else 0
        applies = 49 - 2 * staged_whole
        assert f"({applies} apply, 12 config, 12 interrupt, 36 post-interrupt check)" in pods, (pods, whole)
        assert pods.endswith("; 1 failed (a watch of the stage pods)."), pods
        assert f"export KUBECONFIG={state.resolve()}/kubeconfig" in out

        kubeconfig = state / "kubeconfig"
        gate = json.loads(_kubectl(kubeconfig, "get", "ng", "host-tuning", "-o", "json"))
        assert (gate["status"]["status"], gate["status"]["progress"]) == ("Ready", "12/12")
        events = _kubectl(kubeconfig, "events", "--for", "nodegate/host-tuning")
        for reason in ("BatchFailed", "CompartmentStopped", "Resumed"):
            assert reason in events
        nodes = json.loads(_kubectl(kubeconfig, "get", "nodes", "-l", "nodegate.dev/demo=true", "-o", "json"))
        assert len(nodes["items"]) == 12
        assert not [n for n in nodes["items"] if n["spec"].get("unschedulable")]
    finally:
        down = subprocess.run([*NODEGATE, "demo", "--down", "--state-dir", str(state)],
                              capture_output=True, text=True, timeout=120)
    assert down.stdout.startswith("Stopped the demo's ")
    assert not DevCluster(state).processes()


def _processes_in(state: Path) -> list[int]:
    """Every process whose working directory or argv is under the demo's state directory: each one the
    demo starts runs there (gate.devcluster.cluster), so none can hide from this."""
    found = []
    root = str(state.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if cwd == root or cwd.startswith(root + "/") or root in argv:
            found.append(int(entry.name))
    return found


# Ctrl-C at three moments of the story: while the control plane starts (subprocesses, sleeps), while
# the demo talks to the API server (an event loop per step), and while it follows the rollout live
# (watch caches being started and stopped).
MOMENTS = {"starting": "== Step 1/6", "applying": "== Step 3/6", "following": "  Live status until"}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_ctrl_c_stops_every_process_the_demo_started(tmp_path: Path, moment: str) -> None:
    state = tmp_path / "demo"
    try:
        with group_process([*NODEGATE, "demo", "--quick", "--state-dir", str(state)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT) as demo:
            seen = read_until(demo, lambda line: line.startswith(MOMENTS[moment]))
            started = DevCluster(state).processes()
            ctrl_c(demo.pid)
            rest, _ = demo.communicate(timeout=HANG_GUARD)
    finally:
        DevCluster(state).down(quiet=True)  # whatever the demo left, should it have left anything
    assert demo.returncode == 130, "".join(seen) + rest
    assert "Interrupted: stopping the demo's control plane" in rest
    assert "Traceback" not in rest
    if moment != "starting":
        assert {"etcd", "kube-apiserver", "kwok", "webhook", "operator"} <= set(started), "".join(seen)
    assert not [p for p in started.values() if p.alive()]
    assert not os.path.exists(state / "processes.json")
    assert _processes_in(state) == []
