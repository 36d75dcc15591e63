"""`nodegate package test`: every stage of a package against a root filesystem, in a node's order.

A rehearsal of what the operator does on a node: apply, apply again (as after a power cut, below),
config, the interrupt (when asked for), post-interrupt, upgrade, uninstall, and with an interrupt a
second one and post-uninstall (as when the gate is deleted), each followed by its check, through the
same code path as `nodegate agent run`. It stops at the first failing stage: later stages would only
report noise.

"apply again" is the rule of docs/packages.md that every step is safe to run again: a node that loses
power part-way through a stage boots again and the operator runs the stage again from its first step,
and a power cut can land after a step finished but before the agent recorded it. So the second apply
runs under another generation, where no step counts as done: `idempotent: true` steps run again too,
and the check must pass after it.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Literal

from gate.agent.errors import AgentError
from gate.agent.interrupt import InterruptSettings, run_interrupt
from gate.agent.lint import Finding, has_errors, lint_package
from gate.agent.loader import load_package
from gate.agent.package import Stage
from gate.agent.plan import StageRequest
from gate.agent.stage import StageResult, StageSettings, run_stage
from gate.agent.summary import Summary

TRIAL_GATE: Final = "package-test"
TRIAL_GENERATION: Final = 1
AGAIN: Final = "apply again"


@dataclass(frozen=True)
class TrialStep:
    """One row of the report: a stage or the interrupt, and how it went."""

    name: str
    ok: bool | None  # None: not run
    detail: str
    result: StageResult | None = None


@dataclass(frozen=True)
class Trial:
    findings: list[Finding]
    steps: list[TrialStep]

    @property
    def ok(self) -> bool:
        return not has_errors(self.findings) and all(step.ok is not False for step in self.steps) and bool(
            self.steps
        )


def stages_to_run(directory: Path) -> list[Stage]:
    """The stages a package has something for, in the order a node sees them."""
    manifest = load_package(directory).manifest
    later: tuple[Stage, ...] = ("config", "post-interrupt", "upgrade", "uninstall")
    overlay_only: set[Stage] = {"uninstall"} if manifest.root is not None else set()
    first: list[Stage] = ["apply"]
    return first + [
        stage
        for stage in later
        if manifest.stages.of(stage) or manifest.stages.checks_of(stage) or stage in overlay_only
    ]


def run_trial(
    directory: Path,
    root: Path,
    config_dir: Path | None = None,
    interrupt: InterruptSettings | None = None,
    upgrade_from: str | None = None,
    echo: IO[str] | None = None,
    environ: dict[str, str] | None = None,
) -> Trial:
    findings = lint_package(directory)
    if has_errors(findings):
        return Trial(findings, [])
    package = load_package(directory)
    sink = echo if echo is not None else io.StringIO()
    rows: list[TrialStep] = []
    pending: list[Stage | Literal["interrupt", "apply again"]] = list(stages_to_run(directory))
    pending.insert(1, AGAIN)
    if interrupt is not None:
        # Where the operator interrupts: after apply and config, before the post-interrupt check.
        at = pending.index("post-interrupt") if "post-interrupt" in pending else min(len(pending), 3)
        pending.insert(at, "interrupt")
        if "uninstall" in pending and package.manifest.stages.checks_of("post-uninstall"):
            # As when the gate is deleted: the uninstall's interrupt, then the check that it is gone.
            pending += ["interrupt", "post-uninstall"]
    for name in pending:
        if any(row.ok is False for row in rows):
            rows.append(TrialStep(name, None, "not run: an earlier stage failed"))
            continue
        if name == "post-interrupt" and interrupt is None:
            rows.append(TrialStep(name, None, "not run: no --interrupt given"))
            continue
        if name == "interrupt":
            assert interrupt is not None
            rows.append(_interrupt_row(interrupt, sink))
            continue
        stage: Stage = "apply" if name == AGAIN else name
        request = StageRequest(
            stage=stage,
            gate=TRIAL_GATE,
            package=package.name,
            version=package.version,
            generation=TRIAL_GENERATION + (1 if name == AGAIN else 0),
            previous_version=(upgrade_from or package.version) if name == "upgrade" else None,
        )
        settings = StageSettings(request, root, directory, config_dir, dict(environ or {}))
        try:
            result = run_stage(settings, echo=sink)
        except AgentError as exc:
            rows.append(TrialStep(name, False, str(exc)))
            continue
        rows.append(TrialStep(name, result.ok, _describe(result), result))
    return Trial(findings, rows)


def _interrupt_row(settings: InterruptSettings, echo: IO[str]) -> TrialStep:
    def ignore(summary: Summary) -> None:
        return None

    try:
        result = run_interrupt(settings, ignore, echo=echo)
    except AgentError as exc:
        return TrialStep(f"interrupt {settings.type}", False, str(exc))
    detail = "; ".join(result.commands) if result.summary.ok else result.summary.message
    return TrialStep(f"interrupt {settings.type}", result.summary.ok, detail)


def _describe(result: StageResult) -> str:
    if result.ok:
        return result.summary.message
    return result.summary.message.splitlines()[0] if result.summary.message else "failed"


def report(trial: Trial, write: Callable[[str], None]) -> None:
    for finding in trial.findings:
        write(str(finding))
    for step in trial.steps:
        mark = "PASS" if step.ok else "FAIL" if step.ok is False else "SKIP"
        write(f"{mark}  {step.name:<18} {step.detail}")
        if step.ok is False and step.result and step.result.log_path:
            write(f"      log: {step.result.log_path}")
