"""The per-package history kept on the host: the agent's durable memory of what it did there.

It answers three questions the operator cannot answer from the API server alone: which version is
installed (so upgrade knows where it comes from, even after the operator lost its state), which
idempotent steps already succeeded for this version and gate generation (so a retried stage skips
them), and which files the overlay put on the host (so uninstall removes exactly those).

The transitions are pure functions from one History to the next; `load_history` and `save_history`
are the only I/O, and saving is atomic (write, fsync, rename), so a crash leaves the old or the new
history, never half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from gate.agent.errors import HostError, UsageError
from gate.agent.package import Stage

MAX_RUNS: Final = 50


class Record(BaseModel):
    # A newer agent may add fields; an older one reading them must not fail.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class StepRecord(Record):
    version: str
    generation: int
    finished_at: str


class StagedRecord(Record):
    """A serving step staged on the node (`serving: true`): recorded before it starts, so that its undo
    also covers a half run, and marked done once it succeeded."""

    version: str
    generation: int
    done: bool = False


class StageRun(Record):
    stage: str
    version: str
    generation: int
    ok: bool
    failed_step: str | None = None
    at: str


class OverlayFile(Record):
    """A file the overlay wrote, by its host path, and whether it replaced a file we saved."""

    path: str
    sha256: str
    backed_up: bool = False


class History(Record):
    gate: str
    package: str
    installed: str | None = Field(default=None, description="Version whose apply or upgrade last succeeded.")
    previous: str | None = Field(default=None, description="Version installed before `installed`.")
    steps: dict[str, StepRecord] = Field(default_factory=dict, description="Finished steps by stage/step.")
    overlay: list[OverlayFile] = Field(default_factory=list)
    staged: dict[str, StagedRecord] = Field(
        default_factory=dict, description="Serving steps staged and not yet taken over by their stage, by stage/step.")
    runs: list[StageRun] = Field(default_factory=list, description=f"The last {MAX_RUNS} stage runs, oldest first.")
    payloads: dict[str, str] = Field(
        default_factory=dict, description="Version -> the image its payload copy on the host came from, as the "
        "operator named it (`agent run --payload-image`); a stage that reads that copy holds it against its own.")


def step_key(stage: str, step: str) -> str:
    return f"{stage}/{step}"


def is_done(history: History, stage: str, step: str, version: str, generation: int) -> bool:
    """Whether an idempotent step already succeeded here for this package version and gate generation."""
    record = history.steps.get(step_key(stage, step))
    return record is not None and record.version == version and record.generation == generation


def with_step_done(history: History, stage: str, step: str, version: str, generation: int, at: str) -> History:
    steps = dict(history.steps)
    steps[step_key(stage, step)] = StepRecord(version=version, generation=generation, finished_at=at)
    return history.model_copy(update={"steps": steps})


def with_payload(history: History, version: str, image: str | None) -> History:
    """The payload of `version` was copied onto the host from `image` (None: an image nobody named, a run by
    hand: no record, so no stage reads that copy in place of its own)."""
    payloads = {v: i for v, i in history.payloads.items() if v != version}
    if image:
        payloads[version] = image
    return history.model_copy(update={"payloads": payloads})


def is_staged(history: History, stage: str, step: str, version: str, generation: int) -> bool:
    """Whether a serving step was staged here, to its end, for this package version and gate generation."""
    record = history.staged.get(step_key(stage, step))
    return record is not None and record.done and record.version == version and record.generation == generation


def with_staged(history: History, stage: str, step: str, version: str, generation: int, done: bool) -> History:
    staged = dict(history.staged)
    staged[step_key(stage, step)] = StagedRecord(version=version, generation=generation, done=done)
    return history.model_copy(update={"staged": staged})


def without_staged(history: History, keys: list[str] | None = None) -> History:
    """The history without the staged records `keys` (every one when None)."""
    staged = {} if keys is None else {k: v for k, v in history.staged.items() if k not in keys}
    return history.model_copy(update={"staged": staged})


def with_overlay(history: History, files: list[OverlayFile]) -> History:
    return history.model_copy(update={"overlay": list(files)})


def with_stage_result(
    history: History,
    stage: Stage,
    version: str,
    generation: int,
    ok: bool,
    failed_step: str | None,
    at: str,
    part: str = "whole",
) -> History:
    """Record a finished stage; a successful apply, upgrade or uninstall moves the installed version (its
    serving part, staged before the cordon, or the undo of that moves nothing; a stage staged whole and
    taken over after the interrupt, part `staged`, moves it as the whole stage would)."""
    shown = stage if part == "whole" else f"{stage}:{part}"
    runs = [*history.runs, StageRun(stage=shown, version=version, generation=generation, ok=ok,
                                    failed_step=failed_step, at=at)][-MAX_RUNS:]
    update: dict[str, object] = {"runs": runs}
    if part not in ("whole", "staged"):
        pass
    elif ok and stage in ("apply", "upgrade") and history.installed != version:
        update |= {"installed": version, "previous": history.installed}
    elif ok and stage == "uninstall":
        # A later apply of the same version must run every step again: forget them.
        update |= {"installed": None, "previous": history.installed or history.previous, "steps": {},
                   "overlay": [], "staged": {}}
    return history.model_copy(update=update)


def upgrade_versions(history: History, version: str, given_previous: str | None) -> tuple[str, str | None]:
    """The version an upgrade comes from, and a warning when the operator's idea differs from the host's.

    The host's record wins: it is what is actually installed, while the operator's annotation can be
    stale (restored from a backup, or lost and rebuilt). The given version is the fallback for a host
    that has no record (installed before the agent kept histories).
    """
    if history.installed is not None and history.installed != version:
        found: str | None = history.installed
    elif history.installed == version:
        # The upgrade already succeeded and this is a retry: it still comes from the same place.
        found = history.previous
    else:
        found = None
    if found is None:
        if given_previous is None:
            raise UsageError(
                f"upgrade of {history.package} to {version}: no previous version is recorded on the host "
                "and none was given (--previous-version or NODEGATE_PREVIOUS_VERSION)"
            )
        return given_previous, None
    if given_previous is not None and given_previous != found:
        return found, f"the host records {found} as the previous version, not {given_previous}; using {found}"
    return found, None


def load_history(path: Path, gate: str, package: str) -> History:
    """The history at `path`, or an empty one when the package never ran here."""
    if not path.exists():
        return History(gate=gate, package=package)
    try:
        return History.model_validate_json(path.read_bytes())
    except (ValidationError, ValueError) as exc:
        first = str(exc).splitlines()[0]
        raise HostError(
            f"{path} is not a valid NodeGate history ({first}); move it away to let the agent start over"
        ) from None


def save_history(path: Path, history: History) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    data = json.dumps(history.model_dump(by_alias=True, mode="json"), indent=2) + "\n"
    with open(tmp, "w") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
