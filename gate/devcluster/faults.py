"""The faults real hosts have, injected into a dev cluster: its real nodes, its registry, its operator.

One home for every fault the real-node tier and `bench.chaos --real-nodes` inject, each a function of
the cluster's state directory (and a node's name where it is a node's), so that a test, a bench and a
person at a shell (`python -m gate.devcluster.faults`) do the very same thing:

* `kill_kubelet`, `kill_containerd`: SIGKILL of that process in the node; the node's boot script starts
  it again, as `Restart=always` of its unit does on a host. Running containers outlive both.
* `power_cut`: SIGKILL of the node's init, which kills every process in its namespaces at once (no
  shutdown, no unmount); the node's supervisor boots it again from its disk with a new boot ID, as
  power coming back does.
* `hold_boot` / `release_boot`: the node's next boot waits that long after its shutdown (a reboot that
  does not come back in time), until released.
* `registry_down` / `registry_up`: the cluster's registry killed, then started again on the same port
  (the nodes' containerd config names `host:port`).
* `kill_operator`: SIGKILL of the operator, and, after `down_seconds` (and once `until` holds), the same
  operator started again with the same command line and environment.

Host processes (registry, operator) are faulted through the cluster's `ProcessTable`; a node's own
processes are found by their PID namespace, which is the node's init's.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from gate.devcluster import realnode
from gate.devcluster.processes import ClusterError, Process, ProcessTable
from gate.devcluster.registry import PROCESS as REGISTRY

OPERATOR = "operator"
# The faults by name, as `bench.chaos --real-nodes` and the command line pick them.
NODE_FAULTS = ("kubelet", "containerd", "power-cut")
HOST_FAULTS = ("registry", "operator")


class FaultError(RuntimeError):
    """A fault could not be injected (no such node, process not running); the message says which."""


def node_config(state_dir: Path, node: str) -> realnode.NodeConfig:
    path = state_dir / "realnodes" / node
    if not (path / "node.json").is_file():
        raise FaultError(f"{node} is not a real node of the dev cluster in {state_dir}")
    return realnode.NodeConfig.load(path)


def node_processes(config: realnode.NodeConfig, comm: str) -> list[int]:
    """The pids (as this machine sees them) of the node's processes whose command name is `comm`."""
    init = realnode.node_init_pid(config)
    namespace = os.readlink(f"/proc/{init}/ns/pid")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == comm and os.readlink(entry / "ns" / "pid") == namespace:
                found.append(int(entry.name))
        except OSError:
            continue  # exited meanwhile
    return sorted(found)


def _kill_in_node(state_dir: Path, node: str, comm: str) -> list[int]:
    config = node_config(state_dir, node)
    pids = node_processes(config, comm)
    if not pids:
        raise FaultError(f"no {comm} runs on real node {node}")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


def kill_kubelet(state_dir: Path, node: str) -> list[int]:
    """SIGKILL the node's kubelet; its boot script starts it again 2 s later. Returns the pids killed."""
    return _kill_in_node(state_dir, node, "kubelet")


def kill_containerd(state_dir: Path, node: str) -> list[int]:
    """SIGKILL the node's containerd (not its shims: containers keep running); the boot script starts it
    again at once. Returns the pids killed."""
    return _kill_in_node(state_dir, node, "containerd")


def boot_id(state_dir: Path, node: str) -> str:
    """The boot ID of the node's current (or last) boot, as its supervisor wrote it."""
    return (node_config(state_dir, node).dir / "boot_id").read_text().strip()


def power_cut(state_dir: Path, node: str) -> str:
    """Cut the node's power: every process in its namespaces killed at once, then booted again by its
    supervisor after `realnode.POWER_CUT_SECONDS`, with a new boot ID. Returns the boot ID it had."""
    config = node_config(state_dir, node)
    init = realnode.node_init_pid(config)
    before = boot_id(state_dir, node)
    (config.dir / realnode.POWER_CUT_FILE).write_text(f"{time.time():.3f}\n")
    os.kill(init, signal.SIGKILL)
    return before


def hold_boot(state_dir: Path, node: str, seconds: float) -> None:
    """Hold the node's next boot back: after its next shutdown it stays down at least `seconds` (or
    until `release_boot`), as a host whose reboot hangs in firmware."""
    if seconds <= 0:
        raise FaultError(f"hold_boot: seconds must be positive, not {seconds}")
    (node_config(state_dir, node).dir / realnode.HOLD_BOOT_FILE).write_text(f"{seconds}\n")


def release_boot(state_dir: Path, node: str) -> None:
    """Let a held node boot (at once when it is down past its usual reboot time)."""
    (node_config(state_dir, node).dir / realnode.HOLD_BOOT_FILE).unlink(missing_ok=True)


def registry_down(state_dir: Path) -> Process:
    """Kill the cluster's registry; pulls fail with "connection refused" until `registry_up`."""
    return _kill_host_process(state_dir, REGISTRY)


def registry_up(state_dir: Path) -> Process:
    """Start the registry again with its own command line: the same port and storage."""
    return ProcessTable(state_dir).start_again(REGISTRY)


def kill_operator(state_dir: Path, *, down_seconds: float = 0.0, until: Callable[[], bool] | None = None,
                  timeout: float = 600.0, name: str = OPERATOR) -> Process:
    """SIGKILL the operator (no shutdown, its Lease not released), and after `down_seconds`, and then once
    `until` holds (asked every half second, at most `timeout` seconds: then it raises), start it again as it
    was started (argv and environment). It is started again whatever happens meanwhile (a timeout, `until`
    raising), so a test's cluster never loses its operator. Returns the new operator process."""
    _kill_host_process(state_dir, name)
    try:
        time.sleep(down_seconds)
        deadline = time.monotonic() + timeout
        while until is not None and not until():
            if time.monotonic() > deadline:
                raise FaultError(f"kill_operator: what the operator was to be away for did not happen within "
                                 f"{timeout:.0f}s; it is started again")
            time.sleep(0.5)
    finally:
        started = ProcessTable(state_dir).start_again(name)
    return started


def _kill_host_process(state_dir: Path, name: str) -> Process:
    procs = ProcessTable(state_dir)
    try:
        proc = procs.all()[name]
    except KeyError:
        raise FaultError(f"{name} is not a process of the dev cluster in {state_dir}") from None
    if not proc.alive():
        raise FaultError(f"{name} (pid {proc.pid}) is not running in the dev cluster in {state_dir}")
    try:
        return procs.kill(name, sig=signal.SIGKILL)
    except ClusterError as exc:
        raise FaultError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - a person's shell
    parser = argparse.ArgumentParser(prog="python -m gate.devcluster.faults",
                                     description="Inject a fault into a running dev cluster.")
    parser.add_argument("state_dir", type=Path, help="the dev cluster's state directory")
    parser.add_argument("fault", choices=[*NODE_FAULTS, "hold-boot", "release-boot", "registry-down",
                                          "registry-up", "operator"])
    parser.add_argument("--node", help="the real node (node faults)")
    parser.add_argument("--seconds", type=float, default=60.0, help="hold-boot: how long")
    args = parser.parse_args(argv)
    node = args.node or ""
    actions: dict[str, Callable[[], object]] = {
        "kubelet": lambda: kill_kubelet(args.state_dir, node),
        "containerd": lambda: kill_containerd(args.state_dir, node),
        "power-cut": lambda: power_cut(args.state_dir, node),
        "hold-boot": lambda: hold_boot(args.state_dir, node, args.seconds),
        "release-boot": lambda: release_boot(args.state_dir, node),
        "registry-down": lambda: registry_down(args.state_dir),
        "registry-up": lambda: registry_up(args.state_dir),
        "operator": lambda: kill_operator(args.state_dir, down_seconds=2.0),
    }
    print(actions[args.fault]())
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["FaultError", "boot_id", "hold_boot", "kill_containerd", "kill_kubelet", "kill_operator",
           "node_processes", "power_cut", "registry_down", "registry_up", "release_boot"]
