"""Logs of stage runs on the host, one file per run, and how old ones are pruned.

A node keeps `/var/log/nodegate/<gate>/<package>/<version>/<time>-<stage>.log`. Names start with a
UTC timestamp precise to the microsecond, so sorting names sorts runs. Pruning keeps the newest runs
of each version and the newest versions of each package; the version being run is never pruned.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Final

KEEP_RUNS: Final = 20
KEEP_VERSIONS: Final = 5


def log_name(now: datetime, what: str) -> str:
    return f"{now:%Y%m%dT%H%M%S.%f}Z-{what}.log"


@dataclass(frozen=True)
class Pruning:
    versions: list[str]  # whole version directories to delete
    runs: list[tuple[str, str]]  # (version, log name) to delete


def plan_pruning(
    listing: Mapping[str, list[str]], current: str, keep_runs: int = KEEP_RUNS, keep_versions: int = KEEP_VERSIONS
) -> Pruning:
    """What to delete from `listing` (version -> its log names) to keep the newest runs and versions."""
    newest = {version: max(names, default="") for version, names in listing.items()}
    by_age = sorted(listing, key=lambda v: (v == current, newest[v]), reverse=True)
    kept = by_age[:keep_versions]
    runs = [
        (version, name)
        for version in kept
        for name in sorted(listing[version], reverse=True)[keep_runs:]
    ]
    return Pruning(versions=sorted(set(listing) - set(kept)), runs=runs)


def prune(log_dir: Path, current: str, keep_runs: int = KEEP_RUNS, keep_versions: int = KEEP_VERSIONS) -> Pruning:
    """Delete old logs under a package's log directory; returns what was deleted."""
    if not log_dir.is_dir():
        return Pruning([], [])
    listing = {
        entry.name: [log.name for log in entry.iterdir() if log.is_file() and log.name.endswith(".log")]
        for entry in log_dir.iterdir()
        if entry.is_dir()
    }
    pruning = plan_pruning(listing, current, keep_runs, keep_versions)
    for version in pruning.versions:
        shutil.rmtree(log_dir / version, ignore_errors=True)
    for version, name in pruning.runs:
        (log_dir / version / name).unlink(missing_ok=True)
    return pruning


class RunLog:
    """One run's log file on the host, echoed to the pod's stdout with a prefix naming the step."""

    def __init__(self, path: Path, echo: IO[str] | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "a", buffering=1)
        self._echo = echo if echo is not None else sys.stdout

    def line(self, text: str, prefix: str = "") -> None:
        self._file.write(f"{prefix}{text}\n")
        self._echo.write(f"{prefix}{text}\n")
        self._echo.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
