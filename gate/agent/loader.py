"""Loading a package from its directory: package.yaml parsed and validated, and the files it names checked.

`gate.agent.package` defines the format; this module reads one package against it. `load_package`
refuses, before anything runs, a manifest that does not parse or validate (every bad field named the
way package.yaml spells it: `validation_problems`), a script that is missing, not executable, without
a #! line or outside the package, and an overlay that holds anything but files and directories
(`file_problems`). `example_entries` reads a package's entries from its example NodeGate.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gate.agent.errors import PackageError
from gate.agent.package import MANIFEST, PackageManifest


@dataclass(frozen=True)
class Package:
    """A validated manifest and the directory it came from."""

    manifest: PackageManifest
    directory: Path

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def version(self) -> str:
        return self.manifest.version

    def overlay_dir(self) -> Path | None:
        return None if self.manifest.root is None else self.directory / self.manifest.root


def _location(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def validation_problems(exc: ValidationError) -> list[str]:
    """pydantic errors as `field.path: message` lines, the way package.yaml spells the fields."""
    problems = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        elif error["type"] == "string_type" and isinstance(error.get("input"), (int, float)):
            message += f" (quote it: YAML reads {error['input']!r} as a number)"
        problems.append(f"{_location(loc)}: {message}")
    return problems


def parse_manifest(text: str, source: str = MANIFEST) -> PackageManifest:
    """Parse and validate package.yaml text; PackageError names the file and every bad field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PackageError(f"{source}: not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise PackageError(f"{source}: expected a mapping with apiVersion, kind, name, version and stages")
    try:
        return PackageManifest.model_validate(data)
    except ValidationError as exc:
        raise PackageError(f"{source}: " + "; ".join(validation_problems(exc))) from None


def _is_inside(path: Path, directory: Path) -> bool:
    return path.resolve().is_relative_to(directory.resolve())


def _executable_problems(directory: Path, script: str, where: str) -> list[str]:
    path = directory / script
    if not path.exists():
        return [f"{where}: no such file in the package"]
    if not _is_inside(path, directory):
        return [f"{where}: resolves outside the package"]
    if not path.is_file():
        return [f"{where}: not a regular file"]
    if not path.stat().st_mode & 0o111:
        return [f"{where}: not executable (chmod +x)"]
    if not path.read_bytes()[:2] == b"#!":
        return [f"{where}: has no #! line, so it cannot be executed directly"]
    return []


def file_problems(manifest: PackageManifest, directory: Path) -> list[str]:
    """What is wrong with the files package.yaml refers to: missing, not executable, outside the package."""
    problems = []
    for list_name, step in manifest.scripts():
        assert step.script is not None
        problems += _executable_problems(
            directory, step.script, f"{MANIFEST}: stages.{list_name} step {step.name!r}: script {step.script}")
    for list_name, step in manifest.undo_scripts():
        assert step.undo is not None and step.undo.script is not None
        problems += _executable_problems(directory, step.undo.script, f"{MANIFEST}: stages.{list_name} step "
                                         f"{step.name!r}: undo.script {step.undo.script}")
    if manifest.explain is not None:
        problems += _executable_problems(directory, manifest.explain.script, f"{MANIFEST}: explain.script")
    if manifest.root is not None:
        overlay = directory / manifest.root
        where = f"{MANIFEST}: root {manifest.root}"
        if not overlay.is_dir():
            problems.append(f"{where}: no such directory in the package")
        elif not _is_inside(overlay, directory):
            problems.append(f"{where}: resolves outside the package")
        else:
            for entry in sorted(overlay.rglob("*")):
                mode = entry.lstat().st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    rel = entry.relative_to(overlay)
                    problems.append(f"{where}: {rel} is not a regular file or directory")
    return problems


def load_package(directory: Path) -> Package:
    """Load and fully validate the package in `directory`: manifest, scripts and overlay.

    Raises PackageError before anything else happens, so a bad package never half-applies.
    """
    manifest_path = directory / MANIFEST
    if not directory.is_dir():
        raise PackageError(f"package directory {directory} does not exist")
    if not manifest_path.is_file():
        raise PackageError(f"{manifest_path}: no such file (a package carries /nodegate-package/{MANIFEST})")
    manifest = parse_manifest(manifest_path.read_text(errors="replace"), str(manifest_path))
    problems = file_problems(manifest, directory)
    if problems:
        raise PackageError("; ".join(problems))
    return Package(manifest, directory)


def example_entries(path: Path, name: str) -> list[dict[str, Any]]:
    """Package `name`'s entries under spec.packages in the NodeGate documents of an example gate file.

    Empty when the file is missing or not YAML: an example that does not parse is the docs tests' business."""
    if not path.is_file():
        return []
    try:
        documents = list(yaml.safe_load_all(path.read_text(errors="replace")))
    except yaml.YAMLError:
        return []
    entries = []
    for document in documents:
        spec = document.get("spec") if isinstance(document, dict) else None
        packages = spec.get("packages") if isinstance(spec, dict) else None
        entry = packages.get(name) if isinstance(packages, dict) else None
        if isinstance(entry, dict):
            entries.append(entry)
    return entries
