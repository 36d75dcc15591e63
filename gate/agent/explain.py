"""`nodegate package explain`: ask a package what it would do for a config, without a node.

A package opts in with `explain:` in package.yaml: a script (and arguments) that gets the config as
a JSON object in NODEGATE_EXPLAIN_CONFIG and, when the caller names an OS, an os-release text in
NODEGATE_EXPLAIN_OS_RELEASE, and prints one JSON object on stdout:

    {"title": "...", "columns": ["setting", ...], "rows": [["...", ...], ...], "notes": ["..."]}

The script runs as a child process, as a step would: the package's code never runs inside the CLI.
A non-zero exit is the package refusing the config (an unsupported combination, a bad value); the
end of its output is the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gate.agent.config import effective_config
from gate.agent.errors import PackageError
from gate.agent.loader import load_package

EXPLAIN_TIMEOUT_SECONDS = 60.0
MESSAGE_LINES = 10


class ExplainRefused(Exception):
    """The package's explain script refused the config; the message is its reason."""


@dataclass(frozen=True)
class Explanation:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def os_release_text(os_id: str) -> str:
    """A minimal os-release for `--os ID[:VERSION]` (what a node's /etc/os-release would say)."""
    name, _, version = os_id.partition(":")
    return f"ID={name}\n" + (f"VERSION_ID={version}\n" if version else "")


def parse_explanation(stdout: str, source: str) -> Explanation:
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise PackageError(f"{source} did not print one JSON object: {exc}") from None
    if not isinstance(data, dict):
        raise PackageError(f"{source} printed JSON that is not an object")
    columns = data.get("columns")
    rows = data.get("rows")
    if not (isinstance(columns, list) and all(isinstance(c, str) for c in columns)):
        raise PackageError(f"{source}: 'columns' must be a list of strings")
    if not (isinstance(rows, list) and all(isinstance(r, list) and len(r) == len(columns) for r in rows)):
        raise PackageError(f"{source}: 'rows' must be lists of {len(columns)} values, one per column")
    notes = data.get("notes", [])
    if not (isinstance(notes, list) and all(isinstance(n, str) for n in notes)):
        raise PackageError(f"{source}: 'notes' must be a list of strings")
    return Explanation(title=str(data.get("title", "")), columns=columns,
                       rows=[[str(cell) for cell in row] for row in rows], notes=notes)


def explain_package(directory: Path, config: Mapping[str, bytes], os_release: str | None = None,
                    environ: Mapping[str, str] | None = None) -> Explanation:
    """Run the package's explain entry point with the effective config (held against the package's
    declared keys, defaults filled in, as the agent would); PackageError when the package has no
    entry point, the config breaks its declarations or the script misbehaves, ExplainRefused when
    the script refuses the config."""
    package = load_package(directory)
    entry = package.manifest.explain
    if entry is None:
        raise PackageError(f"{directory}: package.yaml declares no explain entry point (explain: script: ...)")
    effective = effective_config(package.manifest, config)
    env = dict(os.environ if environ is None else environ)
    env["NODEGATE_EXPLAIN_CONFIG"] = json.dumps(
        {name: data.decode(errors="replace") for name, data in effective.items()}, sort_keys=True)
    env.pop("NODEGATE_EXPLAIN_OS_RELEASE", None)
    if os_release is not None:
        env["NODEGATE_EXPLAIN_OS_RELEASE"] = os_release
    argv = [str(package.directory.resolve() / entry.script), *entry.args]
    source = f"{package.name} {entry.script}"
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=EXPLAIN_TIMEOUT_SECONDS,
                              cwd=package.directory)
    except subprocess.TimeoutExpired:
        raise PackageError(f"{source} did not finish within {EXPLAIN_TIMEOUT_SECONDS:.0f}s") from None
    except OSError as exc:
        raise PackageError(f"{source} could not start: {exc.strerror}") from None
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-MESSAGE_LINES:]
        raise ExplainRefused("\n".join(tail) or f"{source} exited {done.returncode}")
    return parse_explanation(done.stdout, source)
