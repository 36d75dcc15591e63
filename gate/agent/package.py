"""The package format: `package.yaml` as pydantic models, and the published JSON Schema.

A package image carries `/nodegate-package/package.yaml`, the scripts it names and, optionally, an
overlay directory whose files are copied onto the host root. The models here are the one source of
the format: the JSON Schema published in `packages/package.schema.json` is generated from them, and
a test fails when the published file is stale. `gate.agent.loader` reads a package against them.

Unlike the CRD models, unknown fields are refused: a misspelt `onhost:` must fail `nodegate package
lint`, not silently run the step in the wrong place.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Annotated, Any, Final, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

from gate.agent.values import ConfigSpec, EnvDeclaration, PackageModel
from gate.api.common import Duration, parse_duration
from gate.api.environment import RESERVED_PREFIX, never_passed_reason
from gate.api.nodegate import PACKAGE_NAME_PATTERN

API_VERSION: Final = "nodegate.io/v1alpha1"
KIND: Final = "Package"
MANIFEST: Final = "package.yaml"
EXAMPLE_GATE: Final = "nodegate.yaml"  # a package's example NodeGate, next to package.yaml
SCHEMA_ID: Final = "https://nodegate.io/schemas/package-v1alpha1.json"

# Semantic versions as semver.org defines them, written out here so the agent needs no semver library.
SEMVER_PATTERN: Final = (
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$"
)
STEP_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$"
ENV_NAME_PATTERN: Final = r"^[A-Za-z_][A-Za-z0-9_]*$"
RESERVED_ENV_PREFIX: Final = RESERVED_PREFIX

Stage = Literal["apply", "config", "upgrade", "uninstall", "post-interrupt", "post-uninstall"]
STAGES: Final[tuple[Stage, ...]] = ("apply", "config", "upgrade", "uninstall", "post-interrupt", "post-uninstall")

StepList = Literal[
    "apply",
    "apply-check",
    "config",
    "config-check",
    "upgrade",
    "upgrade-check",
    "uninstall",
    "uninstall-check",
    "post-interrupt-check",
    "post-uninstall-check",
]
CHECK_OF: Final[dict[Stage, StepList]] = {
    "apply": "apply-check",
    "config": "config-check",
    "upgrade": "upgrade-check",
    "uninstall": "uninstall-check",
    "post-interrupt": "post-interrupt-check",
    "post-uninstall": "post-uninstall-check",
}
# post-interrupt and post-uninstall have checks only: they run after the node was rebooted or its
# services restarted, after an install and after an uninstall.
STEPS_OF: Final[dict[Stage, StepList | None]] = {
    "apply": "apply",
    "config": "config",
    "upgrade": "upgrade",
    "uninstall": "uninstall",
    "post-interrupt": None,
    "post-uninstall": None,
}
# The stage whose own steps a list holds (a staged list's stage, taken over after the interrupt).
STAGE_OF_LIST: Final[dict[StepList, Stage]] = {steps: stage for stage, steps in STEPS_OF.items() if steps}
# Stages whose steps change the host and therefore must be followed by a check.
CHANGING_STAGES: Final[tuple[Stage, ...]] = ("apply", "config", "upgrade", "uninstall")

EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN, max_length=128)]
Env = dict[EnvName, Annotated[str, Field(max_length=32768)]]


def _check_relative(path: str, what: str) -> str:
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts:
        raise ValueError(f"{what} must be a path inside the package (relative, no '..'), got {path!r}")
    return str(pure)


def _check_env_names(env: dict[str, Any]) -> dict[str, Any]:
    """Refuse NodeGate's own names and those never passed (`gate.api.environment`), naming each."""
    reserved = sorted(name for name in env if name.startswith(RESERVED_ENV_PREFIX))
    if reserved:
        raise ValueError(f"variables starting with {RESERVED_ENV_PREFIX} are set by the agent: {', '.join(reserved)}")
    for name in sorted(env):
        reason = never_passed_reason(name)
        if reason is not None:
            raise ValueError(f"{name}: {reason}")
    return env


# pydantic cannot express "exactly one of" in the schema by itself; editors validating package.yaml should.
STEP_SCHEMA_EXTRA: Final[JsonDict] = {"oneOf": [{"required": ["script"]}, {"required": ["command"]}]}


class Command(PackageModel):
    """What runs: a script shipped in the package, or an inline shell command (a step, or a step's undo)."""

    model_config = ConfigDict(json_schema_extra=STEP_SCHEMA_EXTRA)

    script: str | None = Field(
        default=None,
        max_length=1024,
        description=(
            "Path of an executable file inside the package (e.g. scripts/apply.sh), run directly: it needs "
            "a shebang and the executable bit. Exactly one of script and command."
        ),
    )
    command: str | None = Field(
        default=None,
        max_length=32768,
        description=(
            "An inline command run with /bin/sh -c; args become its positional parameters $1, $2, ... "
            "Exactly one of script and command."
        ),
    )
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=256,
        description=(
            "Arguments. Upgrade steps get the previous and the new version first, then these."
        ),
    )
    env: Env = Field(
        default_factory=dict,
        description="Environment of this step, over the package's env; names starting with NODEGATE_ are reserved.",
    )
    on_host: bool = Field(
        default=True,
        description=(
            "Run chrooted into the host root (the default). false: run in the agent container, with the host "
            "root at $NODEGATE_ROOT."
        ),
    )
    accepted_exit_codes: list[Annotated[int, Field(ge=0, le=255)]] = Field(
        default_factory=lambda: [0],
        min_length=1,
        max_length=256,
        description="Exit codes that count as success.",
    )
    timeout: Duration | None = Field(
        default=None,
        description="Kill the step (and its children) after this long, e.g. 90s or 5m; the step then fails.",
    )

    @field_validator("script")
    @classmethod
    def _script_inside_package(cls, value: str | None) -> str | None:
        return None if value is None else _check_relative(value, "script")

    @field_validator("env")
    @classmethod
    def _env_not_reserved(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_env_names(value)

    @model_validator(mode="after")
    def _script_xor_command(self) -> Command:
        if (self.script is None) == (self.command is None):
            raise ValueError("a step needs exactly one of script and command")
        return self

    def timeout_seconds(self) -> float | None:
        return None if self.timeout is None else parse_duration(self.timeout).total_seconds()


class Step(Command):
    """One command of a stage, by name; a `serving` one runs before the cordon and has an `undo`."""

    name: str = Field(
        pattern=STEP_NAME_PATTERN,
        description="Unique within its stage; names the step in logs, summaries and the idempotence record.",
    )
    idempotent: bool = Field(
        default=False,
        description=(
            "Skip the step when it already succeeded on this node for the same package version and gate "
            "generation (for expensive steps such as rebuilding an initramfs). Not allowed in checks."
        ),
    )
    serving: bool = Field(
        default=False,
        description=(
            "Safe on a serving node: its effect waits for the interrupt (a file for the next boot, a downloaded "
            "package, a built initramfs). The operator stages such steps before it cordons the node, and the "
            "stage in the window skips them once staged. Only in apply, upgrade and config, only the first steps "
            "of the list (none but serving steps before one), and only with an undo."
        ),
    )
    undo: Command | None = Field(
        default=None,
        description=(
            "A serving step's undo: returns the host to what it was before the step ran (the undos of later "
            "steps ran first), from whatever the step left, a half run included. It runs when a staged node is "
            "not to be interrupted after all (the rollout stopped, was deleted or rolled back)."
        ),
    )

    @model_validator(mode="after")
    def _undo_with_serving(self) -> Step:
        if self.serving and self.undo is None:
            raise ValueError(f"step {self.name!r}: a serving step needs an undo (what takes its effect back "
                             "when the node is not interrupted after all)")
        if self.undo is not None and not self.serving:
            raise ValueError(f"step {self.name!r}: undo is for serving steps only (set serving: true, or drop it)")
        return self


class Stages(PackageModel):
    """The steps of each stage. A stage without steps does nothing; its check still runs."""

    apply: list[Step] = Field(
        default_factory=list, max_length=64, description="Install the package on a node."
    )
    apply_check: list[Step] = Field(
        default_factory=list, max_length=64, alias="apply-check", description="Prove apply took effect."
    )
    config: list[Step] = Field(
        default_factory=list,
        max_length=64,
        description="Apply the gate's config (files in $NODEGATE_CONFIG_DIR); runs after apply and on every change.",
    )
    config_check: list[Step] = Field(
        default_factory=list, max_length=64, alias="config-check", description="Prove config took effect."
    )
    upgrade: list[Step] = Field(
        default_factory=list,
        max_length=64,
        description="Move from the previous installed version to this one ($1 previous, $2 new).",
    )
    upgrade_check: list[Step] = Field(
        default_factory=list, max_length=64, alias="upgrade-check", description="Prove upgrade took effect."
    )
    uninstall: list[Step] = Field(
        default_factory=list, max_length=64, description="Remove the package from a node."
    )
    uninstall_check: list[Step] = Field(
        default_factory=list, max_length=64, alias="uninstall-check", description="Prove the package is gone."
    )
    post_interrupt_check: list[Step] = Field(
        default_factory=list,
        max_length=64,
        alias="post-interrupt-check",
        description="Prove the change is live after the interrupt (reboot or service restart).",
    )
    post_uninstall_check: list[Step] = Field(
        default_factory=list,
        max_length=64,
        alias="post-uninstall-check",
        description=(
            "Prove the package is gone after the interrupt that followed its uninstall (the kernel booted "
            "without its arguments, say); when empty, uninstall-check runs again there."
        ),
    )

    def steps(self, name: StepList) -> list[Step]:
        """The steps of one list, by its package.yaml name (e.g. "apply-check")."""
        value: list[Step] = getattr(self, name.replace("-", "_"))
        return value

    def of(self, stage: Stage) -> list[Step]:
        """The steps a stage runs before its check (none for post-interrupt, which only checks)."""
        own = STEPS_OF[stage]
        return self.steps(own) if own else []

    def checks_of(self, stage: Stage) -> list[Step]:
        own = self.steps(CHECK_OF[stage])
        if stage == "post-uninstall" and not own:
            return self.steps("uninstall-check")
        return own

    @model_validator(mode="after")
    def _names_unique_and_checks_always_run(self) -> Stages:
        for stage, check in CHECK_OF.items():
            for name in _lists_of(stage):
                seen: set[str] = set()
                for step in self.steps(name):
                    if step.name in seen:
                        raise ValueError(f"{name}: step name {step.name!r} is used twice")
                    seen.add(step.name)
                    if name == check and step.idempotent:
                        raise ValueError(f"{name}: step {step.name!r}: checks always run, idempotent is not allowed")
            for name in _lists_of(stage):
                _check_serving(name, self.steps(name))
        return self

    def serving_steps(self, name: StepList) -> list[Step]:
        """The steps of a list that may run on a serving node: its first steps, as far as they are serving."""
        out = []
        for step in self.steps(name):
            if not step.serving:
                break
            out.append(step)
        return out


# The lists whose steps may be staged on a serving node: those that change the host before its interrupt.
SERVING_LISTS: Final[tuple[StepList, ...]] = ("apply", "upgrade", "config")


def _check_serving(name: StepList, steps: list[Step]) -> None:
    serving = [step.name for step in steps if step.serving]
    if serving and name not in SERVING_LISTS:
        raise ValueError(f"{name}: step {serving[0]!r}: serving steps are for {', '.join(SERVING_LISTS)} only "
                         "(a check proves the window's work; uninstall runs when the node is drained)")
    seen_other = None
    for step in steps:
        if not step.serving:
            seen_other = seen_other or step.name
        elif seen_other is not None:
            raise ValueError(f"{name}: serving step {step.name!r} comes after {seen_other!r}, which is not serving: "
                             "serving steps run before the cordon, so they must be the first steps of the list")


class ExplainEntry(PackageModel):
    """How `nodegate package explain` asks the package what it would do, without a node."""

    script: str = Field(
        max_length=1024,
        description=(
            "Executable file in the package, run on the machine of whoever runs `nodegate package explain` with "
            "NODEGATE_EXPLAIN_CONFIG (the config as a JSON object) and, with --os, NODEGATE_EXPLAIN_OS_RELEASE "
            "(an os-release text). It prints one JSON object: title, columns, rows (lists of strings), notes."
        ),
    )
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, max_length=64, description="Arguments of the script."
    )

    @field_validator("script")
    @classmethod
    def _script_inside_package(cls, value: str) -> str:
        return _check_relative(value, "explain.script")


TestTier = Literal["realnode", "chroot", "unit"]


class TestedOn(PackageModel):
    """An operating system the package is proven on, and how: the catalog prints these."""

    os: str = Field(pattern=r"^[a-z][-a-z0-9.]{0,62}$", description="The OS and release, e.g. debian-12.")
    tier: TestTier = Field(
        description=(
            "realnode: stages run by the operator on real nodes (tests/realnode); chroot: every stage run by "
            "`nodegate package test` against a root filesystem (tests/agent); unit: the OS's os-release and "
            "command outputs in unit tests."
        )
    )
    note: str = Field(default="", max_length=1024, description="What is and is not proven there.")


class PackageManifest(PackageModel):
    """package.yaml: what a NodeGate package is and what each of its stages runs."""

    api_version: Literal["nodegate.io/v1alpha1"] = Field(description="Always nodegate.io/v1alpha1.")
    kind: Literal["Package"] = Field(description="Always Package.")
    name: str = Field(
        pattern=PACKAGE_NAME_PATTERN,
        description="The package name; the key of the package in a NodeGate's spec.packages.",
    )
    version: str = Field(
        pattern=SEMVER_PATTERN, max_length=128, description="Semantic version; the image tag of the package."
    )
    description: str = Field(default="", max_length=4096, description="One paragraph for people.")
    root: str | None = Field(
        default=None,
        max_length=1024,
        description=(
            "Directory inside the package whose files are copied onto the host root before the apply and "
            "upgrade steps, and removed (restoring what they replaced) before the uninstall steps. "
            "Regular files and directories only."
        ),
    )
    env: Env = Field(
        default_factory=dict,
        description=(
            "Default environment of every step; the gate's env overrides it (for a name gateEnv declares), a "
            "step's own env overrides both. Loader, shell and interpreter variables (LD_*, PYTHON*, BASH_ENV, "
            "PATH, ...: docs/packages.md) are refused."
        ),
    )
    gate_env: dict[EnvName, EnvDeclaration] = Field(
        default_factory=dict,
        max_length=64,
        description=(
            "The environment variables a gate may set for this package (spec.packages[].env), each with the "
            "rule its value must follow. The agent refuses a gate that sets any other name, or a value that "
            "breaks its rule, before it touches the host, and the steps get only these names (with the "
            "package's env, the step's env and NodeGate's own NODEGATE_*, PATH and HOME). Loader, shell "
            "and interpreter variables can never be declared."
        ),
    )
    config: ConfigSpec | None = Field(
        default=None,
        description=(
            "The config keys the package accepts, checked by the agent before any step runs: any other key is "
            "refused. Without it the package accepts no config at all."
        ),
    )
    stages: Stages = Field(default_factory=Stages, description="Steps per stage.")
    explain: ExplainEntry | None = Field(
        default=None,
        description="Optional: a script that prints what the package would do for a config, for "
        "`nodegate package explain`.",
    )
    tested_on: list[TestedOn] = Field(
        default_factory=list, max_length=64,
        description="Where the package is proven, for the catalog (docs/catalog.md); a test checks each claim.",
    )

    @field_validator("root")
    @classmethod
    def _root_inside_package(cls, value: str | None) -> str | None:
        return None if value is None else _check_relative(value, "root")

    @field_validator("env", "gate_env")
    @classmethod
    def _env_not_reserved(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_env_names(value)

    def scripts(self) -> list[tuple[str, Step]]:
        """Every (list name, step) whose step runs a script, in package.yaml order."""
        return [
            (name, step)
            for stage in STAGES
            for name in _lists_of(stage)
            for step in self.stages.steps(name)
            if step.script is not None
        ]

    def undo_scripts(self) -> list[tuple[str, Step]]:
        """Every (list name, step) whose undo runs a script."""
        return [(name, step) for name in SERVING_LISTS for step in self.stages.steps(name)
                if step.undo is not None and step.undo.script is not None]

    def serving(self) -> dict[StepList, list[str]]:
        """The serving steps by list, for the lists that have any (the catalog's `serving`)."""
        out: dict[StepList, list[str]] = {}
        for name in SERVING_LISTS:
            names = [step.name for step in self.stages.serving_steps(name)]
            if names:
                out[name] = names
        return out

    def serving_only(self) -> list[StepList]:
        """The lists whose every step is a serving step (no overlay to lay down in the window either): staged,
        their stage in the window only checks."""
        if self.root is not None:
            return []
        return [name for name in SERVING_LISTS if self.stages.steps(name)
                and all(step.serving for step in self.stages.steps(name))]

    def runs_on_host(self) -> bool:
        """Whether any step runs chrooted into the host (the overlay alone needs no chroot)."""
        return any(
            step.on_host for stage in STAGES for name in _lists_of(stage) for step in self.stages.steps(name)
        )


def _lists_of(stage: Stage) -> list[StepList]:
    step_list = STEPS_OF[stage]
    return ([step_list] if step_list else []) + [CHECK_OF[stage]]


def package_schema() -> dict[str, Any]:
    """The JSON Schema of package.yaml, as published in packages/package.schema.json."""
    schema = PackageManifest.model_json_schema(by_alias=True, mode="validation")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}


def schema_text() -> str:
    return json.dumps(package_schema(), indent=2) + "\n"
