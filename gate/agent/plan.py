"""Which commands a stage runs, with which arguments and environment: decided without touching anything.

`plan_stage` turns a package, the host's history and the gate's checked env into a list of
invocations; `gate.agent.stage` runs them. Everything that makes a step's behaviour predictable for a
package author lives here: the environment's precedence, the upgrade arguments, the idempotence skip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Final, Literal

from gate.agent.facts import step_variables
from gate.agent.history import History, is_done, is_staged, step_key
from gate.agent.package import CHECK_OF, SERVING_LISTS, STEPS_OF, PackageManifest, Stage, Step, StepList
from gate.api.facts import OperatorFacts

HOST_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Which part of a stage a run is: the whole stage (in the window, skipping what was staged), its
# serving steps alone (staged on a serving node, before the cordon), or the undo of what was staged.
Part = Literal["whole", "serving", "undo"]
PARTS: Final[tuple[Part, ...]] = ("whole", "serving", "undo")


@dataclass(frozen=True)
class Places:
    """Where a step finds things, as the step itself sees them (inside the chroot, or in the pod)."""

    root: str
    package_dir: str
    config_dir: str
    state_dir: str
    facts_dir: str = ""
    staged_dir: str = ""  # NODEGATE_STAGED_DIR: what serving steps keep for their undo


@dataclass(frozen=True)
class StageRequest:
    """One run of one stage of one package, as the operator asked for it."""

    stage: Stage
    gate: str
    package: str
    version: str
    generation: int
    previous_version: str | None = None  # resolved: only set for upgrade
    part: Part = "whole"


@dataclass(frozen=True)
class Invocation:
    list_name: StepList
    step: Step
    argv: tuple[str, ...]
    env: Mapping[str, str]
    chroot: bool
    cwd: str
    skip_reason: str | None = None
    undo: bool = False  # the step's undo runs (`step` is built from it)

    @property
    def is_check(self) -> bool:
        return self.list_name.endswith("-check")

    @property
    def key(self) -> str:
        return step_key(self.list_name, self.step.name)

    @property
    def label(self) -> str:
        return f"{self.key}:undo" if self.undo else self.key


def step_environment(
    manifest: PackageManifest,
    step: Step,
    gate_env: Mapping[str, str],
    agent_vars: Mapping[str, str],
) -> dict[str, str]:
    """The environment of one step, built from declared names only, from weakest to strongest source:

    a fixed safe PATH and HOME=/root; the package's own `env` defaults; the gate's env, as
    `gate.agent.gate_env.check_gate_env` held it against the package's `gateEnv` (so the gate can
    override a package default it declares); the step's `env`; the NODEGATE_* variables the agent
    computes. Nothing else of the agent's environment reaches a step: not the image's, not the
    kubelet's, not a name the package did not declare (systemd's `Environment=` rule, STYLE.md).
    The PATH is the same in and out of the chroot: it names the host's (or the image's) system
    directories only, none that a spec can write.
    """
    env = {"PATH": HOST_PATH, "HOME": "/root"}
    env.update(manifest.env)
    env.update((k, v) for k, v in gate_env.items() if k in manifest.gate_env)
    env.update(step.env)
    env.update(agent_vars)
    return env


def agent_variables(request: StageRequest, list_name: StepList, step: Step, places: Places,
                    facts: OperatorFacts | None = None) -> dict[str, str]:
    out = {
        "NODEGATE_GATE": request.gate,
        "NODEGATE_PACKAGE": request.package,
        "NODEGATE_VERSION": request.version,
        "NODEGATE_GENERATION": str(request.generation),
        "NODEGATE_STAGE": list_name,
        "NODEGATE_STEP": step.name,
        "NODEGATE_ROOT": places.root,
        "NODEGATE_PACKAGE_DIR": places.package_dir,
        "NODEGATE_CONFIG_DIR": places.config_dir,
        "NODEGATE_STATE_DIR": places.state_dir,
    }
    if request.previous_version is not None:
        out["NODEGATE_PREVIOUS_VERSION"] = request.previous_version
    if request.part != "whole" or step.serving:
        out["NODEGATE_PART"] = request.part
        out["NODEGATE_STAGED_DIR"] = places.staged_dir
    if facts is not None:
        out.update(step_variables(facts, places.facts_dir))
    return out


def step_argv(list_name: StepList, step: Step, places: Places, request: StageRequest) -> tuple[str, ...]:
    """The command line: a script by its path in the package, or an inline command through /bin/sh.

    Upgrade steps get the previous and the new version as their first two arguments. Upgrade checks
    do not (they have both in the environment): a check script is usually shared with apply-check.
    """
    versions: list[str] = []
    if list_name == "upgrade":
        assert request.previous_version is not None, "an upgrade request carries the resolved previous version"
        versions = [request.previous_version, request.version]
    if step.script is not None:
        return (str(PurePosixPath(places.package_dir) / step.script), *versions, *step.args)
    assert step.command is not None
    # With `sh -c`, the word after the command becomes $0, so the step's arguments start at $1.
    return ("/bin/sh", "-c", step.command, f"nodegate-{step.name}", *versions, *step.args)


def lists_of(stage: Stage) -> tuple[StepList, ...]:
    steps = STEPS_OF[stage]
    return (steps, CHECK_OF[stage]) if steps else (CHECK_OF[stage],)


def plan_stage(
    manifest: PackageManifest,
    request: StageRequest,
    history: History,
    gate_env: Mapping[str, str],
    host_places: Places,
    agent_places: Places,
    facts: OperatorFacts | None = None,
) -> list[Invocation]:
    """The stage's steps then its checks, in package.yaml order, with idempotent repeats marked skipped.

    `facts`: the node's (`gate.agent.facts`), written to each Places' `facts_dir` before the steps run."""
    if request.part == "undo":
        return _plan_undo(manifest, request, history, gate_env, host_places, agent_places, facts)
    plan = []
    serving_only = request.part == "serving"
    own = STEPS_OF[request.stage]
    whole = own is not None and own in manifest.serving_only()
    for list_name in lists_of(request.stage):
        if serving_only and list_name not in SERVING_LISTS:
            # A stage's check proves the window's work: it runs there. Unless the stage is staged whole
            # (every step serving, no overlay): then its check runs here, before the cordon, and the
            # window runs no container for it (`gate.lifecycle.staging.staged_whole`).
            if whole:
                plan += [_invocation(manifest, request, list_name, step, gate_env,
                                     host_places if step.on_host else agent_places, facts)
                         for step in manifest.stages.steps(list_name)]
            continue
        steps = manifest.stages.serving_steps(list_name) if serving_only else manifest.stages.steps(list_name)
        for step in steps:
            places = host_places if step.on_host else agent_places
            skip = None
            if step.idempotent and is_done(history, list_name, step.name, request.version, request.generation):
                skip = f"already done for version {request.version} at generation {request.generation}"
            elif (not serving_only and step.serving
                  and is_staged(history, list_name, step.name, request.version, request.generation)):
                skip = f"staged while the node served, for version {request.version} at generation {request.generation}"
            plan.append(_invocation(manifest, request, list_name, step, gate_env, places, facts, skip=skip))
    return plan


def _invocation(manifest: PackageManifest, request: StageRequest, list_name: StepList, step: Step,
                gate_env: Mapping[str, str], places: Places, facts: OperatorFacts | None, *,
                skip: str | None = None, undo: bool = False) -> Invocation:
    return Invocation(
        list_name=list_name,
        step=step,
        argv=step_argv(list_name, step, places, request),
        env=step_environment(manifest, step, gate_env, agent_variables(request, list_name, step, places, facts)),
        chroot=step.on_host,
        cwd=places.package_dir,
        skip_reason=skip,
        undo=undo,
    )


def _plan_undo(
    manifest: PackageManifest,
    request: StageRequest,
    history: History,
    gate_env: Mapping[str, str],
    host_places: Places,
    agent_places: Places,
    facts: OperatorFacts | None,
) -> list[Invocation]:
    """The undos of the staged serving steps, the last staged first (each undo may count on the undos of
    the steps after it having run). A step staged only half (recorded, not done) is undone too."""
    plan = []
    for list_name in reversed(SERVING_LISTS):
        for step in reversed(manifest.stages.serving_steps(list_name)):
            if step_key(list_name, step.name) not in history.staged or step.undo is None:
                continue
            undo = Step(name=step.name, **step.undo.model_dump())
            places = host_places if undo.on_host else agent_places
            plan.append(_invocation(manifest, request, list_name, undo, gate_env, places, facts, undo=True))
    return plan
