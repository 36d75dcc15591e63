"""Processes a test starts (a `status --watch`, the demo), each in a process group of its own that is
killed when the test ends, passed or failed.

A test that fails half-way must leave nothing behind: two `status --watch` processes of failed tests
once watched a long-gone API server for an hour. So every such process starts a new session (its pid
is its process group), and the context managers here SIGKILL the whole group on the way out, whatever
the test did with it before. `ctrl_c` sends SIGINT to the group, as a terminal does on Ctrl-C.

Waits here are on conditions (a line of output, an exit); their timeouts are hang guards only, far
above what a busy machine needs, so a slow run passes and a hung one still ends.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

HANG_GUARD = 300.0  # seconds: only a hung process takes this long


def kill_group(pid: int) -> None:
    """SIGKILL every process of the group `pid` leads (gone already is fine)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def ctrl_c(pid: int) -> None:
    """What Ctrl-C in a terminal does: SIGINT to the foreground process group."""
    os.killpg(pid, signal.SIGINT)


@contextmanager
def group_process(argv: Sequence[str], **kw: Any) -> Iterator[subprocess.Popen[str]]:
    """`subprocess.Popen(argv, text=True, **kw)` in a new session; its group is killed on exit."""
    proc = subprocess.Popen(list(argv), text=True, start_new_session=True, **kw)
    try:
        yield proc
    finally:
        kill_group(proc.pid)
        proc.wait(timeout=HANG_GUARD)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@asynccontextmanager
async def async_group_process(*argv: str, **kw: Any) -> AsyncIterator[asyncio.subprocess.Process]:
    """`asyncio.create_subprocess_exec(*argv, **kw)` in a new session; its group is killed on exit."""
    proc = await asyncio.create_subprocess_exec(*argv, start_new_session=True, **kw)
    try:
        yield proc
    finally:
        kill_group(proc.pid)
        await asyncio.wait_for(proc.wait(), HANG_GUARD)


def read_until(proc: subprocess.Popen[str], done: Callable[[str], bool], *, guard: float = HANG_GUARD) -> list[str]:
    """Lines of `proc`'s stdout up to and including the first for which `done(line)` holds.

    Raises AssertionError when the output ends first, or nothing satisfies `done` within `guard`
    seconds (the reader thread ends when the caller kills the process)."""
    assert proc.stdout is not None
    stream = proc.stdout
    lines: queue.Queue[str] = queue.Queue()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            line = stream.readline()
            lines.put(line)
            if not line or done(line):
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        while True:
            try:
                line = lines.get(timeout=guard)
            except queue.Empty:
                raise AssertionError(f"no such line within {guard:.0f}s; output so far:\n" + "".join(seen)) from None
            if not line:
                raise AssertionError(f"the output ended (exit code {proc.poll()}) before the line looked for:\n"
                                     + "".join(seen))
            seen.append(line)
            if done(line):
                reader.join()
                return seen
    finally:
        stop.set()
