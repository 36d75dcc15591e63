"""The machine's side of real nodes: the cluster's bridge, each node's cgroups, and the error they raise.

A real node (`gate.devcluster.realnode`) reaches the cluster through a veth plugged into the
cluster's bridge on this machine (`ensure_bridge`, `remove_bridge`; `run_ip` runs `ip` for the
veths and routes too), and its processes live in a cgroup of its own in every hierarchy mounted
here (`create_cgroups`, `remove_cgroups`: deepest first, killing what still runs in them).
`RealNodeError` is what any of real nodes' machinery raises when a node cannot be built, started or
stopped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from gate.devcluster.network import ClusterNetwork

CGROUP_ROOT = Path("/sys/fs/cgroup")


class RealNodeError(RuntimeError):
    """A real node could not be built, started or stopped; the message says what to look at."""


def run_ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RealNodeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc


def ensure_bridge(net: ClusterNetwork) -> None:
    if run_ip("link", "show", net.bridge, check=False).returncode != 0:
        run_ip("link", "add", net.bridge, "type", "bridge")
    if net.gateway not in run_ip("-4", "-o", "addr", "show", "dev", net.bridge).stdout:
        run_ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
    run_ip("link", "set", net.bridge, "up")


def remove_bridge(net: ClusterNetwork) -> None:
    run_ip("link", "del", net.bridge, check=False)


def cgroup_dirs(name: str) -> list[Path]:
    """The node's cgroup directory in every hierarchy mounted here (v1 controllers and unified)."""
    hierarchies = [p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink()] \
        if not (CGROUP_ROOT / "cgroup.controllers").exists() else [CGROUP_ROOT]
    return [h / name for h in hierarchies]


def create_cgroups(name: str) -> None:
    for path in cgroup_dirs(name):
        path.mkdir(exist_ok=True)
        if path.parent.name == "cpuset":
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (path / knob).write_text((path.parent / knob).read_text())


def remove_cgroups(name: str, timeout: float = 10.0) -> list[str]:
    """Remove the node's cgroups, deepest first; returns the directories that could not be removed."""
    left: list[str] = []
    for top in cgroup_dirs(name):
        if not top.exists():
            continue
        dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
        for d in [*dirs, top]:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    # A process that is just exiting still counts in its cgroup for a moment.
                    if time.monotonic() > deadline:
                        left.append(str(d))
                        break
                    _kill_cgroup(d)
                    time.sleep(0.1)
    return left


def _kill_cgroup(path: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
