"""Small packages written on the fly for the chroot tests."""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_package(
    where: Path,
    stages: str,
    *,
    name: str = "demo-pkg",
    version: str = "1.0.0",
    scripts: dict[str, str] | None = None,
    header: str = "",
    overlay: dict[str, str] | None = None,
) -> Path:
    """A package directory like an image's /nodegate-package: package.yaml, scripts, an overlay."""
    directory = where / f"{name}-{version}"
    directory.mkdir(parents=True)
    manifest = (
        f"apiVersion: nodegate.io/v1alpha1\nkind: Package\nname: {name}\nversion: {version}\n"
        + textwrap.dedent(header)
        + ("root: root\n" if overlay is not None else "")
        + "stages:\n"
        + textwrap.indent(textwrap.dedent(stages), "  ")
    )
    (directory / "package.yaml").write_text(manifest)
    for path, body in (scripts or {}).items():
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("#!/bin/sh\nset -eu\n" + textwrap.dedent(body))
        target.chmod(0o755)
    if overlay is not None:
        (directory / "root").mkdir()
        for path, body in overlay.items():
            target = directory / "root" / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(body)
    return directory


def configmap(where: Path, files: dict[str, str]) -> Path:
    """A directory laid out like a mounted ConfigMap: keys are symlinks into a hidden ..data directory."""
    where.mkdir(parents=True, exist_ok=True)
    for stale in where.iterdir():
        if stale.is_symlink() or stale.is_file():
            stale.unlink()
    data = where / "..2030_01_01_00_00_00.000000001"
    if data.exists():
        for old in data.iterdir():
            old.unlink()
    data.mkdir(exist_ok=True)
    for key, text in files.items():
        (data / key).write_text(text)
    (where / "..data").symlink_to(data.name)
    for key in files:
        (where / key).symlink_to(f"..data/{key}")
    return where
