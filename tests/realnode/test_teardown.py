"""`nodegate dev down` leaves nothing of a real node behind: no process, mount, cgroup, link or disk.

A control plane of its own with one real node (the session's real cluster stays up for the others).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate.devcluster import realnode
from tests.conftest import REPO

# The first test of the tier builds what is missing (node root, images): minutes from a cold cache.
pytestmark = pytest.mark.timeout(1800)


def traces(state: Path) -> dict[str, list[str]]:
    """Everything on this machine that belongs to the cluster in `state`."""
    from gate.devcluster.network import ClusterNetwork

    net = ClusterNetwork.of(state)
    processes = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(state) in cmdline:
                processes.append(f"{proc.name}: {cmdline[:120]}")
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(state) in line]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout.splitlines()
    ours = [line for line in links if f" {net.bridge}:" in line or f" {net.host_veth(0)}@" in line]
    cgroups = [str(path) for path in Path("/sys/fs/cgroup").glob(f"*/nodegate-{net.index}-*")]
    disks = [str(path) for path in (state / "realnodes").glob("*")] if (state / "realnodes").exists() else []
    return {"processes": processes, "mounts": mounts, "links": ours, "cgroups": cgroups, "disks": disks}


def test_dev_down_leaves_no_process_mount_cgroup_link_or_disk_of_a_real_node(tmp_path: Path) -> None:
    if reason := realnode.unsupported_reason():
        pytest.skip(f"real nodes cannot run on this machine: {reason}")
    state = tmp_path / "dev"
    nodegate = [sys.executable, "-m", "gate.cli.main", "dev"]
    up = subprocess.run([*nodegate, "up", "--state-dir", str(state), "--nodes", "0", "--real-nodes", "1",
                         "--no-webhook", "--no-operator"], capture_output=True, text=True, timeout=1500, cwd=REPO)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        running = traces(state)
        # What the node is made of, seen from this machine: the supervisor, unshare, the kubelet and
        # containerd in their own namespaces; its cgroups; its veth and the cluster's bridge.
        assert any("realnode supervise" in p for p in running["processes"]), running["processes"]
        assert running["cgroups"] and len(running["links"]) == 2 and running["disks"], running
        config = realnode.NodeConfig.load(state / "realnodes" / "real-node-0")
        pid_namespace = os.readlink(f"/proc/{realnode.node_init_pid(config)}/ns/pid")
        assert in_namespace(pid_namespace), "the node's kubelet and containerd run in its PID namespace"
    finally:
        down = subprocess.run([*nodegate, "down", "--state-dir", str(state)], capture_output=True, text=True,
                              timeout=120, cwd=REPO)
    assert down.returncode == 0 and "realnode-real-node-0" in down.stdout, down.stdout + down.stderr
    assert traces(state) == {"processes": [], "mounts": [], "links": [], "cgroups": [], "disks": []}
    assert in_namespace(pid_namespace) == [], "a process of the node outlived it"


def in_namespace(pid_namespace: str) -> list[str]:
    """Processes in the PID namespace `pid_namespace` (as /proc/PID/ns/pid reads), with their commands."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.readlink(proc / "ns" / "pid") == pid_namespace:
                    found.append(f"{proc.name}: {(proc / 'comm').read_text().strip()}")
            except OSError:
                continue
    return found
