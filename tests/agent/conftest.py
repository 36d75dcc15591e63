"""The chroot tier: the agent really runs steps chrooted into a root filesystem built from host binaries.

chroot needs root; CI runs as root. The base root filesystem is built once per session (a second or
so) and every test gets a private copy, so tests never see each other's host changes.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gate.cli.main import main
from tests.agent import rootfs

REPO = Path(__file__).resolve().parents[2]
PACKAGES = REPO / "packages"

if os.geteuid() != 0:
    pytest.skip("the chroot tests need root (CI runs as root)", allow_module_level=True)


@pytest.fixture(scope="session")
def base_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return rootfs.build(tmp_path_factory.mktemp("rootfs-base") / "root")


@pytest.fixture
def root(base_root: Path, tmp_path: Path) -> Path:
    return rootfs.clone(base_root, tmp_path / "root")


@dataclass
class Run:
    code: int
    summary: dict[str, object]


class Agent:
    """`nodegate ...` in-process, the way the operator's Job would call it, with the summary parsed."""

    def __init__(self, root: Path, tmp: Path) -> None:
        self.root = root
        self.termination_log = tmp / "termination-log"

    def __call__(self, *args: str) -> Run:
        self.termination_log.unlink(missing_ok=True)
        code = main([*args, "--termination-log", str(self.termination_log)])
        text = self.termination_log.read_text() if self.termination_log.exists() else "{}"
        return Run(code, json.loads(text))

    def run(self, stage: str, payload: Path, *extra: str, package: str = "demo-pkg", version: str = "1.0.0",
            gate: str = "test-gate", generation: int = 1, config_dir: Path | None = None) -> Run:
        args = ["agent", "run", "--stage", stage, "--package", package, "--version", version, "--gate", gate,
                "--generation", str(generation), "--root", str(self.root), "--payload", str(payload)]
        if config_dir is not None:
            args += ["--config-dir", str(config_dir)]
        return self(*args, *extra)

    def interrupt(self, kind: str, *extra: str) -> Run:
        return self("agent", "interrupt", "--type", kind, "--root", str(self.root), *extra)


@pytest.fixture
def agent(root: Path, tmp_path: Path) -> Agent:
    return Agent(root, tmp_path)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No NODEGATE_* leaking in from the environment the tests run in."""
    for name in list(os.environ):
        if name.startswith("NODEGATE_"):
            monkeypatch.delenv(name)
    yield


def in_private_mounts(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`nodegate ARGV...` in a mount namespace of its own, with a real /proc over the test root's fake one.

    For packages that really mount (bind-mount): their mounts land in a throwaway namespace, never on
    this machine, and `/proc/self/mountinfo` inside the chroot shows them. One call is one namespace:
    run every stage that must see the same mounts in one call (`package test`, or a shell script)."""
    script = 'root=$1; shift; mount -t proc proc "$root/proc" && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh",
                           str(root), *argv], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
