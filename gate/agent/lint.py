"""`nodegate package lint`: everything wrong with a package directory, found without running it.

The agent refuses the same problems at run time (`load_package`); lint reports all of them at once,
plus what is legal but unsafe: a stage that changes the host without a check to prove it worked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import ValidationError

from gate.agent.config import config_problems
from gate.agent.gate_env import check_gate_env
from gate.agent.loader import example_entries, file_problems, validation_problems
from gate.agent.package import CHANGING_STAGES, CHECK_OF, EXAMPLE_GATE, MANIFEST, PackageManifest

Level = Literal["error", "warning"]
SAMPLE_CONFIG = "sample-config"
EXAMPLES = "examples"


@dataclass(frozen=True)
class Finding:
    level: Level
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.message}"


def missing_checks(manifest: PackageManifest) -> list[str]:
    """Stages that change the host but have no check steps to prove the change took."""
    out = []
    for stage in CHANGING_STAGES:
        changes = bool(manifest.stages.of(stage)) or (manifest.root is not None and stage == "apply")
        if changes and not manifest.stages.checks_of(stage):
            why = "has steps" if manifest.stages.of(stage) else "lays down the overlay"
            out.append(f"{MANIFEST}: stages.{stage} {why} but stages.{CHECK_OF[stage]} is empty")
    return out


def _dockerfile_findings(directory: Path) -> list[Finding]:
    dockerfile = directory / "Dockerfile"
    if not dockerfile.is_file():
        return [Finding("warning", "no Dockerfile next to package.yaml: how is the package image built?")]
    if "/nodegate-package" not in dockerfile.read_text(errors="replace"):
        return [Finding("error", "Dockerfile: the image must carry the package at /nodegate-package/")]
    return []


def lint_package(directory: Path) -> list[Finding]:
    if not directory.is_dir():
        return [Finding("error", f"{directory}: no such directory")]
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return [Finding("error", f"{MANIFEST}: no such file in {directory}")]
    try:
        data = yaml.safe_load(manifest_path.read_text(errors="replace"))
    except yaml.YAMLError as exc:
        return [Finding("error", f"{MANIFEST}: not valid YAML: {exc}")]
    if not isinstance(data, dict):
        return [Finding("error", f"{MANIFEST}: expected a mapping with apiVersion, kind, name, version and stages")]
    try:
        manifest = PackageManifest.model_validate(data)
    except ValidationError as exc:
        return [Finding("error", f"{MANIFEST}: {problem}") for problem in validation_problems(exc)]
    findings = [Finding("error", problem) for problem in file_problems(manifest, directory)]
    findings += [Finding("error", problem) for problem in missing_checks(manifest)]
    if manifest.stages.apply and not manifest.stages.uninstall:
        findings.append(Finding("warning", f"{MANIFEST}: apply changes the host but there are no uninstall steps"))
    findings += _dockerfile_findings(directory)
    findings += config_findings(manifest, directory)
    findings += env_findings(manifest, directory)
    return findings


def _example_configs(manifest: PackageManifest, directory: Path) -> list[tuple[str, dict[str, bytes]]]:
    """The configs the package shows its users: sample-config/, and its entry in nodegate.yaml and in
    the example gates of examples/*.yaml."""
    out = []
    sample = directory / SAMPLE_CONFIG
    if sample.is_dir():
        out.append((f"{SAMPLE_CONFIG}/", {e.name: e.read_bytes() for e in sorted(sample.iterdir()) if e.is_file()}))
    for example in [directory / EXAMPLE_GATE, *sorted((directory / EXAMPLES).glob("*.yaml"))]:
        for entry in example_entries(example, manifest.name):
            config = entry.get("config")
            if isinstance(config, dict):
                where = f"{example.relative_to(directory)}: spec.packages.{manifest.name}.config"
                out.append((where, {str(k): str(v).encode() for k, v in config.items()}))
    return out


def config_findings(manifest: PackageManifest, directory: Path) -> list[Finding]:
    """The package's own example configs must pass its declarations: a user copies them."""
    return [Finding("error", f"{where}: {problem}")
            for where, given in _example_configs(manifest, directory)
            for problem in config_problems(manifest, given)]


def env_findings(manifest: PackageManifest, directory: Path) -> list[Finding]:
    """The env of the package's example gates must pass its gateEnv declarations, as the agent holds it."""
    findings = []
    for example in [directory / EXAMPLE_GATE, *sorted((directory / EXAMPLES).glob("*.yaml"))]:
        for entry in example_entries(example, manifest.name):
            env = entry.get("env")
            if not isinstance(env, list):
                continue
            given = {str(e.get("name")): str(e.get("value", "")) for e in env if isinstance(e, dict)}
            where = f"{example.relative_to(directory)}: spec.packages.{manifest.name}.env"
            findings += [Finding("error", f"{where}: {problem}")
                         for problem in check_gate_env(manifest, list(given), given)[1]]
    return findings


def has_errors(findings: list[Finding]) -> bool:
    return any(f.level == "error" for f in findings)
