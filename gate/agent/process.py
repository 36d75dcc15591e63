"""Running one command, chrooted into the host root or not, with its output teed and its tail kept.

The only place the agent starts processes. A command runs in its own session, so a timeout kills
the whole process group (a script's children too). Output is read by a thread while the main thread
waits for the process: a step that leaves a daemon behind holding the output pipe must not hang the
agent after the step itself has exited.

Its own session also means a signal to the agent never reaches the step. When Kubernetes stops a
stage pod (the stage's timeout, a deleted pod) it sends SIGTERM to the agent and, after the pod's
grace period (the package's `gracefulShutdown`), SIGKILL to whatever is left. `Termination` passes the
SIGTERM on to the running step's process group, so the step can clean up within that grace period
(a trap in a script), and tells the stage to start no further step. Without it the agent would die at
once (hostPID: it is not PID 1, so SIGTERM's default action applies) and the container runtime would
kill the step with SIGKILL: no cleanup, no summary, no history record.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Final

# How long to keep reading output after the command exited (from children that inherited the pipe).
_DRAIN_SECONDS: Final = 5.0
_TAIL_LINES: Final = 200


# Passed on to the running step. SIGTERM is how the kubelet (and `kubectl delete`)
# stops a pod; SIGINT is a person's Ctrl-C on `nodegate package test`.
FORWARDED: Final = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Outcome:
    returncode: int  # negative: killed by that signal (subprocess's convention)
    output_tail: str
    timed_out: bool = False
    start_error: str | None = None  # the command could not be started at all
    stopped_by: int | None = None  # a signal to the agent, passed on to the command while it ran

    @property
    def exit_code(self) -> int:
        """The exit code as a shell reports it: 128+N for a process killed by signal N."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


class Termination:
    """Whether the agent was asked to stop, and the process group to pass that on to.

    Install it (`installed`) around the work; `run_command` registers the command it runs. Signal
    handlers run in the main thread between bytecodes, also while it waits for the command (the wait
    is resumed after the handler, PEP 475), so the signal is passed on at once.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.timed_out = False
        self._group: int | None = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        if self._group is not None:
            _signal_group(self._group, signum)

    def _timeout(self, signum: int, frame: FrameType | None) -> None:
        self.timed_out = True
        self._handle(signal.SIGTERM, frame)

    @contextmanager
    def installed(self, timeout: float | None = None) -> Iterator[Termination]:
        """Handle the forwarded signals for the duration (the main thread only can: elsewhere, a no-op);
        with `timeout`, past it as if SIGTERM had come (a stage's own bound, inside a pod that runs
        several stages one after another)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in FORWARDED}
        if timeout:
            previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._timeout)
            signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            yield self
        finally:
            if timeout:
                signal.setitimer(signal.ITIMER_REAL, 0)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @contextmanager
    def passing_to(self, pgid: int) -> Iterator[None]:
        self._group = pgid
        if self.signum is not None:  # arrived between the caller's last look and the start
            _signal_group(pgid, self.signum)
        try:
            yield
        finally:
            self._group = None


def _chroot_then_chdir(root: str, cwd: str) -> Callable[[], None]:
    def enter() -> None:
        os.chroot(root)
        os.chdir(cwd)

    return enter


def _pump(stream: IO[bytes], sink: Callable[[str], None], keep: deque[str]) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        keep.append(line)
        sink(line)


def run_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    chroot: Path | None,
    timeout: float | None,
    sink: Callable[[str], None],
    termination: Termination | None = None,
) -> Outcome:
    """Run `argv` to completion; `cwd` is a path inside `chroot` when one is given. With `termination`,
    a signal it handles while the command runs is passed on to the command's process group."""
    keep: deque[str] = deque(maxlen=_TAIL_LINES)
    try:
        proc = subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=None if chroot else cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_chroot_then_chdir(str(chroot), cwd) if chroot else None,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        where = f" in {chroot}" if chroot else ""
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        message = f"cannot start {argv[0]}{where}: {reason}"
        sink(message)
        return Outcome(returncode=127, output_tail=message, start_error=message)
    assert proc.stdout is not None
    reader = threading.Thread(target=_pump, args=(proc.stdout, sink, keep), daemon=True)
    reader.start()
    timed_out = False
    with termination.passing_to(proc.pid) if termination else _nothing():
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    stopped_by = termination.signum if termination else None
    reader.join(_DRAIN_SECONDS)
    if timed_out:
        note = f"killed after the step's timeout of {timeout:g}s"
        keep.append(note)
        sink(note)
    if stopped_by is not None:
        note = f"stopped: the agent got {signal.Signals(stopped_by).name} and passed it on"
        keep.append(note)
        sink(note)
    return Outcome(returncode=proc.returncode, output_tail="\n".join(keep), timed_out=timed_out,
                   stopped_by=stopped_by)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
