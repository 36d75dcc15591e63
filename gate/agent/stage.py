"""`nodegate agent run`: one stage of one package on one node, then its check.

Everything that can be refused is refused before the host is touched: the package (manifest,
scripts, overlay), the host root, the config directory and the gate's env against the package's
declarations, the upgrade's previous version. Then, in
order: lock the package, copy the payload and config onto the host, lay down (or take off) the
overlay, run the steps (skipping idempotent ones already done), run the checks, record the result in
the host's history, prune old payloads and logs. The stage passes only when its steps and its checks
did.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Literal

from gate.agent import logs, overlay
from gate.agent.config import check_config, check_digest, lenient_config, render
from gate.agent.errors import PackageError, UsageError
from gate.agent.facts import NodeFacts, load_operator_facts, node_facts, write_facts
from gate.agent.gate_env import check_gate_env
from gate.agent.history import (
    History,
    OverlayFile,
    load_history,
    save_history,
    step_key,
    upgrade_versions,
    with_overlay,
    with_payload,
    with_stage_result,
    with_staged,
    with_step_done,
    without_staged,
)
from gate.agent.host import PackageLayout, boot_id, check_root
from gate.agent.loader import Package, load_package
from gate.agent.package import STAGE_OF_LIST, STEPS_OF
from gate.agent.plan import Invocation, Places, StageRequest, plan_stage
from gate.agent.process import Outcome, Termination, run_command
from gate.agent.summary import Summary, tail
from gate.api.facts import OperatorFacts

StepStatus = Literal["ok", "failed", "skipped"]


@dataclass(frozen=True)
class StageSettings:
    """Everything `agent run` needs, resolved from flags and environment in one place (gate.cli.agent)."""

    request: StageRequest
    root: Path
    payload: Path
    config_dir: Path | None = None
    environ: Mapping[str, str] = field(default_factory=dict)
    gate_env_names: tuple[str, ...] | None = None  # the gate's env names (--gate-env); None: run by hand
    node_facts: OperatorFacts | None = None  # None: the node's name alone (see gate.agent.facts)
    config_digest: str | None = None  # what the operator rendered (gate.api.digests); None: unchecked
    timeout: float | None = None  # seconds the whole stage may take (None: no bound of its own)
    # The check after the interrupt reads the payload the round's stage left on the host, not `payload`; so
    # does a stage whose payload the round's staging placed there (its image recorded and held against this).
    payload_on_host: bool = False
    payload_image: str | None = None  # the image the payload comes from, as the operator named it


@dataclass(frozen=True)
class StepResult:
    label: str
    status: StepStatus
    exit_code: int | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class StageResult:
    summary: Summary
    steps: list[StepResult]
    log_path: Path | None = None

    @property
    def ok(self) -> bool:
        return self.summary.ok


def _now() -> datetime:
    return datetime.now(UTC)


def read_config(config_dir: Path | None) -> dict[str, bytes]:
    """The gate's config files from the mounted ConfigMap.

    A ConfigMap volume holds each key as a symlink into a hidden `..data` directory; the names
    starting with two dots are the volume's bookkeeping (a ConfigMap key may not start with `..`), a
    key may start with one (`.env`).
    """
    if config_dir is None:
        return {}
    if not config_dir.is_dir():
        raise UsageError(f"config directory {config_dir} does not exist")
    return {
        entry.name: entry.read_bytes()
        for entry in sorted(config_dir.iterdir())
        if not entry.name.startswith("..") and entry.is_file()
    }


def validate(settings: StageSettings) -> Package:
    """Every refusal that must happen before the host is touched."""
    request = settings.request
    source = settings.payload
    if settings.payload_on_host:
        if request.stage in ("uninstall", "post-uninstall") or request.part != "whole":
            raise UsageError(f"--payload-on-host is for a stage of the round's window, not {request.stage} "
                             f"(part {request.part})")
        layout = PackageLayout(settings.root, request.gate, request.package)
        source = layout.package_dir(request.version)
        if not (source / "package.yaml").is_file():
            raise PackageError(
                f"the payload of {request.package} {request.version} is not on the host "
                f"({layout.host_package_dir(request.version)}), where this round's staging or stage left it: "
                "the operator tries again with a copy from the image"
            )
        _payload_from(layout, request, settings.payload_image)
    package = load_package(source)
    if package.name != request.package or package.version != request.version:
        raise PackageError(
            f"{source}/package.yaml is {package.name} {package.version}, "
            f"but the stage is for {request.package} {request.version} (wrong image tag?)"
        )
    check_root(settings.root, needs_shell=package.manifest.runs_on_host())
    return package


def _payload_from(layout: PackageLayout, request: StageRequest, image: str | None) -> None:
    """The host's copy of the payload came from `image`, as the host's history recorded when it was copied.
    A stage before the interrupt needs that record (the copy a staging placed may have been replaced since,
    by an undo of another spec's staging of the same version); the check after the interrupt reads what
    its round's stage left, and holds the record against its image when there is one."""
    recorded = load_history(layout.history_file, request.gate, request.package).payloads.get(request.version)
    if recorded is None and request.stage == "post-interrupt":
        return
    if image is None or recorded != image:
        came = f"image {recorded}" if recorded else "an image the host has no record of"
        where = layout.host_package_dir(request.version)
        raise PackageError(
            f"the payload of {request.package} {request.version} on the host ({where}) came from {came}, not "
            f"{image or 'the image the stage names (no --payload-image)'}: the operator tries again with a copy "
            "from the image"
        )


def stage_inputs(
    package: Package, settings: StageSettings, given: dict[str, bytes]
) -> tuple[dict[str, bytes], dict[str, str], list[str]]:
    """The config files and the gate's env the steps see, held against the package's declarations
    (`config.keys`, `gateEnv`) before the host is touched, and the warnings to log.

    Every stage but uninstall refuses input that breaks the declarations: an undeclared config key or
    env name, a value against its rule, a name NodeGate never passes (one PackageError naming each).
    Uninstall leaves such input out and warns, so a node can always leave a gate whose input went
    wrong."""
    manifest = package.manifest
    gate_env, env_problems = check_gate_env(manifest, settings.gate_env_names, settings.environ)
    if settings.request.stage == "uninstall":
        files, config_problems = lenient_config(manifest, given)
        return files, gate_env, [f"{p} (uninstall goes on without it)" for p in config_problems + env_problems]
    values, config_problems = check_config(manifest, given)
    problems = config_problems + env_problems
    if problems:
        raise PackageError("; ".join(problems))
    return render(manifest, values, given), gate_env, []


def _replace_dir(dst: Path, fill: Callable[[Path], None]) -> None:
    """Make `dst` hold what `fill` writes, switching over in two renames so no reader sees half of it."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    new, old = dst.with_name(f".{dst.name}.new"), dst.with_name(f".{dst.name}.old")
    for leftover in (new, old):
        shutil.rmtree(leftover, ignore_errors=True)
    fill(new)
    if dst.exists():
        os.rename(dst, old)
    os.rename(new, dst)
    shutil.rmtree(old, ignore_errors=True)


def _copy_tree(source: Path) -> Callable[[Path], None]:
    def fill(target: Path) -> None:
        shutil.copytree(source, target, symlinks=True)

    return fill


def _write_config(files: Mapping[str, bytes]) -> Callable[[Path], None]:
    def fill(target: Path) -> None:
        target.mkdir(mode=0o755)
        for name, data in files.items():
            (target / name).write_bytes(data)

    return fill


@contextmanager
def _locked(layout: PackageLayout) -> Iterator[None]:
    # Two stage pods for the same package on one node (a retry while the old pod still terminates) must not
    # interleave their steps; the second waits. The operator's stage timeout bounds the wait.
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    with open(layout.lock_file, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        yield


class _Run:
    """The mutable bits of one stage run: the history as it evolves and where it is saved."""

    def __init__(self, layout: PackageLayout, history: History, log: logs.RunLog, now: Callable[[], datetime]):
        self.layout = layout
        self.history = history
        self.log = log
        self.now = now

    def save(self, history: History) -> None:
        self.history = history
        save_history(self.layout.history_file, history)

    def persist_overlay(self, files: list[OverlayFile]) -> None:
        self.save(with_overlay(self.history, files))

    def stamp(self) -> str:
        return self.now().isoformat(timespec="seconds")


def _places(layout: PackageLayout, version: str) -> tuple[Places, Places]:
    host = Places(
        root="/",
        package_dir=str(layout.host_package_dir(version)),
        config_dir=str(layout.host_config_dir),
        state_dir=str(layout.host_data_dir),
        facts_dir=str(layout.host_facts_dir),
        staged_dir=str(layout.host_staged_dir),
    )
    agent = Places(
        root=str(layout.root),
        package_dir=str(layout.package_dir(version)),
        config_dir=str(layout.config_dir),
        state_dir=str(layout.data_dir),
        facts_dir=str(layout.facts_dir),
        staged_dir=str(layout.staged_dir),
    )
    return host, agent


def _step_ok(invocation: Invocation, outcome: Outcome) -> bool:
    # A step stopped by the pod's SIGTERM failed whatever its exit code: a 0 after cleaning up (or
    # rolling back) does not mean the step did its work.
    return (
        outcome.start_error is None
        and not outcome.timed_out
        and outcome.stopped_by is None
        and outcome.returncode >= 0
        and outcome.returncode in invocation.step.accepted_exit_codes
    )


def _run_overlay(run: _Run, request: StageRequest) -> None:
    layout = run.layout
    if request.part != "whole":
        return  # the overlay takes effect as it lands: it waits for the window
    if request.stage in ("apply", "upgrade"):
        manifest_root = load_package(layout.package_dir(request.version)).overlay_dir()
        sources, digests = overlay.sources_with_digests(manifest_root)
        involved = sorted(set(sources) | {f.path for f in run.history.overlay})
        plan = overlay.plan_install(digests, run.history.overlay, overlay.host_digests(layout.root, involved))
    elif request.stage == "uninstall":
        sources, plan = {}, overlay.plan_removal(run.history.overlay)
    else:
        return
    if plan.changes_host() or plan.owned != run.history.overlay:
        overlay.carry_out(plan, layout, sources, run.persist_overlay, run.log.line)


def _forget_owned_staging(run: _Run, request: StageRequest) -> None:
    """A staging finds records of another version or generation: an earlier staging's, which no undo took
    back, so its round passed its cordon and owns that work (the operator starts no staging on a node
    where another staging or undo pod of the gate is left, and a succeeded undo removes the records).
    They go without an undo, so this staging's undo never takes back what that round owns."""
    stale = [key for key, rec in run.history.staged.items()
             if (rec.version, rec.generation) != (request.version, request.generation)]
    if stale:
        run.save(without_staged(run.history, stale))
        run.log.line(f"Forgot the staged records of an earlier round, which owns their work: {', '.join(stale)}.")


def _take_over_staged(run: _Run, package: Package, request: StageRequest) -> None:
    """The check after the interrupt takes over the stages staged whole for its version: each list whose
    every step is a serving step (`serving_only`) and was staged to its end for this version. The window
    ran no container for such a stage (`gate.lifecycle.staging.staged_whole`; the staging pod ran its
    check): it is recorded applied here, at this run's generation, and its staged record goes, so no
    undo takes back what the round owns. A stage the window did run took its records over itself."""
    if request.stage != "post-interrupt" or request.part != "whole":
        return
    history = run.history
    for name in package.manifest.serving_only():
        keys = [step_key(name, step.name) for step in package.manifest.stages.steps(name)]
        records = [history.staged.get(key) for key in keys]
        if not all(rec is not None and rec.done and rec.version == request.version for rec in records):
            continue
        history = with_stage_result(history, STAGE_OF_LIST[name], request.version, request.generation, True, None,
                                    run.stamp(), "staged")
        history = without_staged(history, keys)
        run.log.line(f"Took over stage {name} of {request.package} {request.version}: it was staged whole while "
                     "the node served, and its check passed there (the window ran no container for it).")
    if history is not run.history:
        run.save(history)


def _forget_package(layout: PackageLayout) -> None:
    """After a successful uninstall only the history and the logs stay on the host."""
    for directory in (layout.data_dir, layout.config_dir, layout.packages_dir, layout.backup_dir, layout.facts_dir):
        shutil.rmtree(directory, ignore_errors=True)


def _write_node_facts(facts: NodeFacts) -> Callable[[Path], None]:
    def fill(target: Path) -> None:
        write_facts(facts, target)

    return fill


def _prune_payloads(layout: PackageLayout, keep: set[str]) -> None:
    if not layout.packages_dir.is_dir():
        return
    for entry in layout.packages_dir.iterdir():
        if entry.name not in keep:
            shutil.rmtree(entry, ignore_errors=True)


def run_stage(
    settings: StageSettings,
    now: Callable[[], datetime] = _now,
    echo: IO[str] | None = None,
) -> StageResult:
    """Run the stage and its check. Raises AgentError (nothing changed) for anything refused up front."""
    started = time.monotonic()
    package = validate(settings)
    given = read_config(settings.config_dir)
    check_digest(given, settings.config_digest, str(settings.config_dir or "no config directory"))
    config, gate_env, input_warnings = stage_inputs(package, settings, given)
    operator_facts = settings.node_facts or load_operator_facts(None, settings.environ)
    request = settings.request
    layout = PackageLayout(settings.root, request.gate, request.package)
    termination = Termination()

    # SIGTERM from here on (the pod is being stopped) goes to the running step, and no step starts
    # after it; what the agent does itself (the overlay, the history) is finished, never cut half way.
    with termination.installed(settings.timeout), _locked(layout):
        history = load_history(layout.history_file, request.gate, request.package)
        warning = None
        if request.stage == "upgrade":
            previous, warning = upgrade_versions(history, request.version, request.previous_version)
            request = replace(request, previous_version=previous)
        else:
            request = replace(request, previous_version=None)

        # From here on the host changes.
        if not settings.payload_on_host:  # else it is the host's copy already
            _replace_dir(layout.package_dir(request.version), _copy_tree(package.directory))
            history = with_payload(history, request.version, settings.payload_image)
        _replace_dir(layout.config_dir, _write_config(config))
        facts = node_facts(operator_facts, settings.root)
        _replace_dir(layout.facts_dir, _write_node_facts(facts))
        layout.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = layout.log_dir / request.version / logs.log_name(now(), request.stage)
        with logs.RunLog(log_path, echo) as log:
            run = _Run(layout, history, log, now)
            log.line(
                f"Started stage {request.stage} of {request.package} {request.version} "
                f"(gate {request.gate}, generation {request.generation})."
            )
            if warning:
                log.line(f"Warning: {warning}.")
            for problem in input_warnings:
                log.line(f"Warning: {problem}.")
            if request.previous_version:
                log.line(f"Upgrading from {request.previous_version}.")
            _run_overlay(run, request)
            _take_over_staged(run, package, request)
            if request.part == "serving":
                _forget_owned_staging(run, request)
            if request.part == "serving" and not run.history.staged:
                shutil.rmtree(layout.staged_dir, ignore_errors=True)  # a staging that starts afresh
            if request.part != "whole" or run.history.staged:
                layout.staged_dir.mkdir(parents=True, exist_ok=True)
            results, failed, outcome = _run_steps(run, package, gate_env, request, facts, termination)
            if termination.timed_out:
                log.line(f"The stage's timeout of {settings.timeout:g}s passed: the running step was stopped.")
            ok = failed is None
            history = with_stage_result(run.history, request.stage, request.version, request.generation,
                                        ok, failed.label if failed else None, run.stamp(), request.part)
            if ok and request.part == "whole":
                # The stage took its own list's staged work over.
                own = STEPS_OF[request.stage]
                history = without_staged(history, [k for k in history.staged if k.split("/")[0] == own])
            elif ok and request.part == "undo":
                history = without_staged(history)
            if ok and request.part != "serving" and not history.staged:
                shutil.rmtree(layout.staged_dir, ignore_errors=True)
            kept = {v for v in (history.installed, history.previous, request.version) if v}
            history = history.model_copy(update={"payloads": {v: i for v, i in history.payloads.items() if v in kept}})
            run.save(history)
            if ok and request.stage in ("uninstall", "post-uninstall"):
                _forget_package(layout)  # the check after an uninstall's interrupt left its payload again
            else:
                _prune_payloads(layout, kept)
            elapsed = time.monotonic() - started
            log.line(f"Finished stage {request.stage}: {'passed' if ok else 'FAILED'} in {elapsed:.1f}s.")
        logs.prune(layout.log_dir, request.version)

    summary = Summary(
        package=request.package,
        version=request.version,
        stage=request.stage,
        ok=ok,
        failed_step=failed.label if failed else None,
        exit_code=outcome.exit_code if outcome else 0,
        message=(_failure_message(failed, outcome, settings.timeout if termination.timed_out else None) if failed
                 else _success_message(results)),
        duration_seconds=time.monotonic() - started,
        boot_id=boot_id(settings.root) if request.part == "serving" else None,
    )
    return StageResult(summary=summary, steps=results, log_path=log_path)


def _success_message(results: list[StepResult]) -> str:
    ran = sum(1 for r in results if r.status == "ok")
    skipped = sum(1 for r in results if r.status == "skipped")
    return f"{ran} steps passed" + (f", {skipped} skipped (already done)" if skipped else "")


def _failure_message(failed: Invocation, outcome: Outcome | None, stage_timeout: float | None = None) -> str:
    if outcome is None:
        return f"{failed.label} failed"
    if stage_timeout is not None:
        return f"the stage timed out after {stage_timeout:g}s in {failed.label}" + (
            f"\n{tail(outcome.output_tail)}" if tail(outcome.output_tail) else "")
    if outcome.start_error:
        return outcome.start_error
    accepted = ", ".join(str(c) for c in failed.step.accepted_exit_codes)
    head = f"{failed.label} exited {outcome.exit_code} (accepted: {accepted})"
    if outcome.timed_out:
        head = f"{failed.label} timed out"
    elif outcome.stopped_by is not None:
        head = (f"{failed.label} was stopped with the pod: {_signal_name(outcome.stopped_by)} passed on to it, "
                f"it exited {outcome.exit_code}")
    body = tail(outcome.output_tail)
    return f"{head}\n{body}" if body else head


def _prefixed(log: logs.RunLog, prefix: str) -> Callable[[str], None]:
    def line(text: str) -> None:
        log.line(text, prefix)

    return line


def _signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def _not_started(signum: int) -> Outcome:
    message = f"not started: the agent got {_signal_name(signum)} (the pod is being stopped)"
    return Outcome(returncode=-signum, output_tail=message, start_error=message, stopped_by=signum)


def _run_steps(
    run: _Run, package: Package, gate_env: Mapping[str, str], request: StageRequest, facts: OperatorFacts,
    termination: Termination | None = None,
) -> tuple[list[StepResult], Invocation | None, Outcome | None]:
    host_places, agent_places = _places(run.layout, request.version)
    invocations = plan_stage(package.manifest, request, run.history, gate_env, host_places, agent_places, facts)
    results: list[StepResult] = []
    for invocation in invocations:
        if invocation.skip_reason:
            run.log.line(f"Skipped step {invocation.label}: {invocation.skip_reason}.")
            results.append(StepResult(invocation.label, "skipped"))
            continue
        if termination is not None and termination.signum is not None:
            outcome = _not_started(termination.signum)
            run.log.line(f"Step {invocation.label} {outcome.start_error}.")
            results.append(StepResult(invocation.label, "failed", outcome.exit_code))
            return results, invocation, outcome
        where = "on the host" if invocation.chroot else "in the agent container"
        run.log.line(f"Running step {invocation.label} {where}.")
        if request.part == "serving" and not invocation.is_check:
            # Recorded before it starts: a half run is undone too.
            run.save(with_staged(run.history, invocation.list_name, invocation.step.name,
                                 request.version, request.generation, done=False))
        started = time.monotonic()
        outcome = run_command(
            invocation.argv,
            invocation.env,
            invocation.cwd,
            run.layout.root if invocation.chroot else None,
            invocation.step.timeout_seconds(),
            _prefixed(run.log, f"[{invocation.label}] "),
            termination,
        )
        seconds = time.monotonic() - started
        if not _step_ok(invocation, outcome):
            run.log.line(f"Step {invocation.label} failed with exit code {outcome.exit_code}.")
            results.append(StepResult(invocation.label, "failed", outcome.exit_code, seconds))
            return results, invocation, outcome
        results.append(StepResult(invocation.label, "ok", outcome.exit_code, seconds))
        if request.part == "serving" and not invocation.is_check:
            run.save(with_staged(run.history, invocation.list_name, invocation.step.name,
                                 request.version, request.generation, done=True))
        elif request.part == "undo":
            run.save(without_staged(run.history, [invocation.key]))
        if invocation.step.idempotent and not invocation.is_check and request.part == "whole":
            run.save(with_step_done(run.history, invocation.list_name, invocation.step.name,
                                    request.version, request.generation, run.stamp()))
    return results, None, None
