"""Running one command, chrooted into the host root or not, with its output teed and its tail kept.

The only place the agent starts processes. A command runs in its own session, so a timeout kills
the whole process group (a script's children too). Output is read by a thread while the main thread
waits for the process: a step that leaves a daemon behind holding the output pipe must not hang the
agent after the step itself has exited.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

# How long to keep reading output after the command exited (from children that inherited the pipe).
_DRAIN_SECONDS: Final = 5.0
_TAIL_LINES: Final = 200


@dataclass(frozen=True)
class Outcome:
    returncode: int  # negative: killed by that signal (subprocess's convention)
    output_tail: str
    timed_out: bool = False
    start_error: str | None = None  # the command could not be started at all

    @property
    def exit_code(self) -> int:
        """The exit code as a shell reports it: 128+N for a process killed by signal N."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


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
) -> Outcome:
    """Run `argv` to completion; `cwd` is a path inside `chroot` when one is given."""
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
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        proc.wait()
    reader.join(_DRAIN_SECONDS)
    if timed_out:
        note = f"killed after the step's timeout of {timeout:g}s"
        keep.append(note)
        sink(note)
    return Outcome(returncode=proc.returncode, output_tail="\n".join(keep), timed_out=timed_out)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
