"""The processes one dev cluster state directory started, and how they are started, found and stopped.

Every part of the dev cluster (the control plane, kwok, the registry, the real nodes' supervisors,
NodeGate's webhook and operator) runs as a child process in its own session, so it outlives
`nodegate dev up`. `ProcessTable` is their bookkeeping: `processes.json` (pid and kernel start time
of each, so a later `down` never kills a recycled pid), `ports.json`, and one log per process under
`logs/`. It is also the place where a fault is injected into one of them (`stop`, `restart` with a
signal of the caller's choosing).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


class ClusterError(RuntimeError):
    """The dev cluster could not start or is not running; the message says what to look at."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range.

    A dev cluster picks its ports first and starts what listens on them over the next half minute.
    A port of the ephemeral range (what binding port 0 gives) can be taken meanwhile by any outgoing
    connection of the machine (kwok lost 55003 so while three test workers started clusters); below
    that range (and under the NodePorts) only another picker can take it, at random among thousands."""
    low = _ephemeral_low()
    for _ in range(100):
        # Under 30000 too: Kubernetes' NodePorts (30000-32767) stay clear.
        port = random.randint(max(1024, low - 12000), min(low, 30000) - 1)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


@dataclass
class Process:
    name: str
    pid: int
    started: str
    log: str
    argv: list[str] = field(default_factory=list)
    # The environment given on top of the caller's (not the caller's own), so that a process killed by
    # a fault starts again as it was started (the operator's settings are in its environment).
    env: dict[str, str] = field(default_factory=dict)

    def alive(self) -> bool:
        return _proc_start_time(self.pid) == self.started


class ProcessTable:
    """The processes of one state directory, by name. Every method reads the files afresh, so two
    `DevCluster` objects (two commands) on one directory see the same table."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.logs = state_dir / "logs"
        self._procs_file = state_dir / "processes.json"
        self._ports_file = state_dir / "ports.json"
        # Processes started but not yet in processes.json: a Ctrl-C between the two must not leave one
        # that no `down` knows of, so `stop_all` on this object stops these too.
        self._unrecorded: dict[str, int] = {}

    def all(self) -> dict[str, Process]:
        if not self._procs_file.exists():
            return {}
        data = json.loads(self._procs_file.read_text())
        return {name: Process(**p) for name, p in data.items()}

    def save(self, procs: dict[str, Process]) -> None:
        # Written aside and renamed: interrupted half-way, the file is the old one, never a torn one.
        part = self._procs_file.with_suffix(".json.part")
        part.write_text(json.dumps({n: p.__dict__ for n, p in procs.items()}, indent=1))
        os.replace(part, self._procs_file)
        for name, proc in procs.items():
            if self._unrecorded.get(name) == proc.pid:
                del self._unrecorded[name]

    def ports(self) -> dict[str, int]:
        return json.loads(self._ports_file.read_text()) if self._ports_file.exists() else {}

    def running_port(self, name: str, answers: Callable[[int], bool]) -> int | None:
        """The port of the table's process `name` when it runs and `answers` on its port, else None."""
        proc = self.all().get(name)
        port = self.ports().get(name)
        if proc is None or port is None or not proc.alive():
            return None
        return port if answers(port) else None

    def set_port(self, name: str, port: int) -> None:
        ports = self.ports()
        ports[name] = port
        self.write_ports(ports)

    def write_ports(self, ports: dict[str, int]) -> None:
        self._ports_file.write_text(json.dumps(ports))

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        """Start `argv` in a session of its own, its output appended to `logs/<name>.log` (not yet
        recorded: the caller saves it, or `register` does)."""
        log = self.logs / f"{name}.log"
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.dir, env={**os.environ, **(env or {})},
            )
            self._unrecorded[name] = proc.pid
        started = _proc_start_time(proc.pid) or ""
        return Process(name, proc.pid, started, str(log), argv, dict(env or {}))

    def register(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Process:
        """Start `name` unless it runs, and record it."""
        procs = self.all()
        if name in procs and procs[name].alive():
            return procs[name]
        procs[name] = self.spawn(name, argv, env)
        self.save(procs)
        return procs[name]

    def stop(self, name: str, *, sig: int = signal.SIGTERM) -> None:
        """Stop `name` (SIGTERM to its session, or SIGKILL at once when `sig` is SIGKILL; SIGKILL after
        10 s) and forget it."""
        procs = self.all()
        proc = procs.pop(name, None)
        if proc and proc.alive():
            os.killpg(proc.pid, sig) if sig == signal.SIGKILL else _terminate(proc.pid)
            deadline = time.monotonic() + 10
            while proc.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.alive():
                _kill(proc.pid)
        self.save(procs)

    def kill(self, name: str, *, sig: int = signal.SIGKILL) -> Process:
        """Kill `name` (its session, with `sig`; SIGKILL after 10 s) and keep its record, so that
        `start_again` starts it as it was: a fault, where `stop` is an ending. Returns the old Process."""
        old = self._recorded(name)
        self._end(old, sig)
        return old

    def start_again(self, name: str, *, env: dict[str, str] | None = None) -> Process:
        """Start `name` again with its recorded argv and environment (`env` on top), unless it runs."""
        old = self._recorded(name)
        if old.alive():
            return old
        return self._respawn(old, env)

    def restart(self, name: str, *, sig: int = signal.SIGTERM, env: dict[str, str] | None = None) -> Process:
        """Stop `name` by its pid (`sig`, SIGKILL after 10 s) and start it again with the same argv, so it
        keeps its ports, data directory, log and environment (`env` on top); returns the new Process (not
        waited for)."""
        old = self._recorded(name)
        if not old.argv:
            raise ClusterError(f"{name} was recorded without its command line; it cannot be restarted")
        self._end(old, sig, "; not starting a second copy")
        return self._respawn(old, env)

    def _recorded(self, name: str) -> Process:
        procs = self.all()
        if name not in procs:
            raise ClusterError(f"{name} is not a process of this cluster ({self.dir})")
        return procs[name]

    def _end(self, proc: Process, sig: int, note: str = "") -> None:
        """Signal `proc`'s session and wait until it is gone (SIGKILL after 10 s)."""
        if not proc.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if not _wait_exited(proc.pid, 10):
            _kill(proc.pid)
        if not _wait_exited(proc.pid, 10):
            raise ClusterError(f"{proc.name} (pid {proc.pid}) did not exit{note}")

    def _respawn(self, old: Process, env: dict[str, str] | None) -> Process:
        """Start `old` again with its recorded argv and environment (`env` on top), recorded."""
        if not old.argv:
            raise ClusterError(f"{old.name} was recorded without its command line; it cannot be restarted")
        new = self.spawn(old.name, old.argv, {**old.env, **(env or {})})
        procs = self.all()  # re-read, so an entry another caller registered meanwhile is kept
        procs[old.name] = new
        self.save(procs)
        return new

    def stop_all(self) -> list[str]:
        """Stop every process of the table, newest first (clients before the API server, the API
        server before etcd), and those started but never recorded; return the names stopped."""
        procs = self.all()
        stopped = []
        for pid in self._unrecorded.values():  # started, and interrupted before it was recorded
            _kill(pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # our child, SIGKILLed: gone at once
        self._unrecorded.clear()
        for name in reversed(list(procs)):
            proc = procs[name]
            if proc.alive():
                _terminate(proc.pid)
                stopped.append(name)
        # Wait for all of them at once; whoever ignores SIGTERM for 5 s gets SIGKILL.
        deadline = time.monotonic() + 5
        while any(p.alive() for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in procs.values():
            if proc.alive():
                _kill(proc.pid)
        deadline = time.monotonic() + 5
        while any(p.alive() for p in procs.values()) and time.monotonic() < deadline:
            time.sleep(0.02)
        self._procs_file.unlink(missing_ok=True)
        return stopped


def check_alive(procs: dict[str, Process]) -> None:
    """Raise naming the first of `procs` that exited, with the last lines of its log."""
    for name, proc in procs.items():
        if not proc.alive():
            raise ClusterError(f"{name} exited during start-up; last lines of {proc.log}:\n{tail(Path(proc.log))}")


def wait_until(ready: Callable[[], bool], what: str, procs: dict[str, Process], deadline: float, log: Path) -> None:
    """Poll `ready` until it holds; raise when one of `procs` exits or the deadline passes."""
    while not ready():
        check_alive(procs)
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} did not become ready in time; see {log}")
        time.sleep(0.1)


def http_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)"


def _proc_start_time(pid: int) -> str | None:
    """The kernel's start time of a live `pid` (clock ticks since boot), to recognise it later.

    None when there is no such process or it is a zombie: a child we started and killed stays in the
    process table until reaped, and must not count as running.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces, so split after its closing parenthesis;
    # then field 3 (state) is at index 0 and field 22 (start time) at index 19.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        _reap(pid)
        return None
    return fields[19]


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: init reaps it


def _wait_exited(pid: int, timeout: float) -> bool:
    """Wait until every thread of `pid` has exited (so its ports are free again); reap our child.

    A multi-threaded process shows its leader as a zombie while other threads are still exiting and
    holding its sockets, so a zombie leader alone does not mean the process is gone.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            return True  # reaped
        states = []
        for task in tasks:
            try:
                states.append(task.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0])
            except (OSError, IndexError):
                continue
        if all(state in ("Z", "X") for state in states):
            _reap(pid)
            return True
        time.sleep(0.02)
    return False


def _terminate(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


__all__ = ["ClusterError", "Process", "ProcessTable", "check_alive", "free_port", "http_ok", "tail", "wait_until"]
