"""Small packages written on the fly for the chroot tests."""

from __future__ import annotations

import subprocess
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


# os-release files of the systems the packages name, for the tests of their detection.
OS_RELEASES = {
    "debian-12": 'ID=debian\nVERSION_ID="12"\n',
    "debian-13": 'ID=debian\nVERSION_ID="13"\n',
    "ubuntu-24.04": 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n',
    "rhel-9": 'ID="rhel"\nID_LIKE="fedora"\nVERSION_ID="9.4"\n',
    "rocky-9": 'NAME="Rocky Linux"\nID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n',
    "amzn-2023": 'ID="amzn"\nID_LIKE="fedora"\nVERSION_ID="2023"\n',
    "cos-113": "ID=cos\nVERSION_ID=113\n",
    "sles-15": 'ID="sles"\nID_LIKE="suse"\n',
}


def with_os_release(package: Path, shell: str, system: str, where: Path) -> subprocess.CompletedProcess[str]:
    """`shell` after sourcing the package's scripts/lib.sh, on this machine, with `system`'s os-release."""
    (where / "os-release").write_text(OS_RELEASES[system])
    return subprocess.run(["/bin/sh", "-c", f". {package}/scripts/lib.sh; {shell}"], capture_output=True, text=True,
                          env={"OS_RELEASE": str(where / "os-release"), "NODEGATE_GATE": "g",
                               "NODEGATE_CONFIG_DIR": str(where), "PATH": "/usr/bin:/bin"})
