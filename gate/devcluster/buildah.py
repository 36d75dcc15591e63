"""buildah, run the one way that works on this machine kind: vfs storage under the cache, chroot isolation.

There is no Docker daemon, no overlay mount for an unprivileged storage driver and no user namespace
to spare, so every command names its own storage (`--storage-driver vfs --root --runroot` under
`<cache>/buildah`, never /var/lib/containers) and builds run with `--isolation chroot`. vfs copies a
whole tree per layer: slow and large, but it needs nothing from the kernel.

Every command is appended to a log file; a failure raises BuildError with the log's tail. Commands
that take minutes (`bud`, `push`) stream their output, and their `STEP n/m` lines become progress.
"""

from __future__ import annotations

import fcntl
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from gate.devcluster.build import BuildError, cache_root

Progress = Callable[[str], None]

# `STEP 3/7: COPY ...`, prefixed with `[1/2] ` in a multi-stage build.
_STEP = re.compile(r"^(\[\d+/\d+\] )?STEP \d+/\d+: ")


def buildah_dir() -> Path:
    return cache_root() / "buildah"


def missing_tools() -> list[str]:
    """What this machine lacks to build images (empty when it can)."""
    return [tool for tool in ("buildah",) if shutil.which(tool) is None]


def _tail(log: Path, lines: int = 25) -> str:
    return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-lines:])


class Buildah:
    """buildah with NodeGate's own storage; `log` receives every command and its output."""

    def __init__(self, log: Path, root: Path | None = None) -> None:
        base = root or buildah_dir()
        self.storage = base / "storage"
        self.runroot = base / "run"
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)

    def argv(self, *args: str) -> list[str]:
        return ["buildah", "--storage-driver", "vfs", "--root", str(self.storage), "--runroot", str(self.runroot),
                *args]

    def run(self, *args: str, what: str, progress: Progress | None = None, cwd: Path | None = None) -> str:
        """Run `buildah <args>`; return its stdout. `progress` gets the build's STEP lines as they come."""
        cmd = self.argv(*args)
        started = time.monotonic()
        with open(self.log, "a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace")
            assert proc.stdout is not None
            lines = []
            for line in proc.stdout:
                out.write(line)
                lines.append(line)
                if progress is not None and _STEP.match(line):
                    progress(f"  {what}: {line.strip()[:110]} ({time.monotonic() - started:.0f}s)")
            code = proc.wait()
        if code != 0:
            raise BuildError(f"{what} failed (buildah exit {code}); full log: {self.log}\n{_tail(self.log)}")
        return "".join(lines)

    def quiet(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A query whose failure is an answer (no such image), not an error."""
        return subprocess.run(self.argv(*args), capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)

    def image_id(self, name: str) -> str | None:
        """The id of local image `name`, or None when there is none."""
        found = self.quiet("inspect", "--type", "image", "--format", "{{.FromImageID}}", name)
        return found.stdout.strip() or None if found.returncode == 0 else None

    def last_line(self, output: str) -> str:
        lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
        if not lines:
            raise BuildError(f"buildah printed nothing where an id was expected; see {self.log}")
        return lines[-1]


@contextmanager
def locked(progress: Progress | None = None) -> Iterator[None]:
    """One buildah writer at a time per machine: two of our processes (two checkouts, a test and a
    developer) building and removing the same names in one vfs storage would race."""
    buildah_dir().mkdir(parents=True, exist_ok=True)
    with open(buildah_dir() / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress is not None:
                progress(f"Waiting for another image build on this machine to finish (lock {lock.name}) ...")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def require_tools(what: str, extra: Sequence[str] = ()) -> None:
    missing = [*missing_tools(), *[t for t in extra if shutil.which(t) is None]]
    if missing:
        raise BuildError(f"{what} needs {', '.join(missing)}; install them with hack/install-realnode-deps.sh")
