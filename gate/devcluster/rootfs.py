"""Debian root filesystems, built once per machine into the cache: the real nodes' roots and image bases.

`debootstrap --variant=minbase` from Debian's archive (the only distribution archive reachable here)
makes a root; extra packages are installed into it with apt in a chroot. A root is identified by its
suite and package list: a stamp file holds that fingerprint, so a later run reuses the directory
without touching the network, and a changed package list builds a new one next to it.

Building needs root (debootstrap and chroot). A half-built root never counts: the tree is assembled
under a temporary name and renamed into place only when every step succeeded.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gate.devcluster.build import BuildError, cache_root

Progress = Callable[[str], None]

MIRROR = os.environ.get("NODEGATE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# The machine's CA bundle: HTTPS from inside a root (pip, apt over https) goes through the same
# proxy as the machine's own, so a root that downloads anything needs the same trust.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


@dataclass(frozen=True)
class RootSpec:
    """A Debian root: `suite` (bookworm, trixie) plus `packages` installed with apt afterwards."""

    name: str
    suite: str
    packages: tuple[str, ...] = ()

    @property
    def fingerprint(self) -> str:
        blob = "\0".join([self.suite, MIRROR, *sorted(self.packages)])
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    @property
    def path(self) -> Path:
        return cache_root() / "rootfs" / f"{self.name}-{self.suite}-{self.fingerprint}"


def missing_tools() -> list[str]:
    """What this machine lacks to build a root (empty when it can)."""
    return [tool for tool in ("debootstrap", "chroot") if shutil.which(tool) is None]


def is_built(spec: RootSpec) -> bool:
    return (spec.path / ".nodegate-root").is_file()


@contextmanager
def _locked(name: str) -> Iterator[None]:
    lock_dir = cache_root() / "rootfs"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run(cmd: Sequence[str], log: Path, what: str, env: dict[str, str] | None = None) -> None:
    with open(log, "a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        code = subprocess.run(list(cmd), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              env={**os.environ, **(env or {})}, check=False).returncode
    if code != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        raise BuildError(f"{what} failed (exit {code}); full log: {log}\n{tail}")


@contextmanager
def chroot_mounts(root: Path) -> Iterator[None]:
    """/proc, /dev and /sys for apt inside `root`, unmounted afterwards whatever happens."""
    mounted: list[Path] = []
    try:
        for fstype, source, target in (("proc", "proc", "proc"), ("bind", "/dev", "dev"), ("sysfs", "sysfs", "sys")):
            point = root / target
            point.mkdir(exist_ok=True)
            args = ["mount", "--bind", source, str(point)] if fstype == "bind" else \
                ["mount", "-t", fstype, source, str(point)]
            subprocess.run(args, check=True, capture_output=True)
            mounted.append(point)
        yield
    finally:
        for point in reversed(mounted):
            subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)


def apt_install(root: Path, packages: Sequence[str], log: Path) -> None:
    """Install `packages` into `root` with its own apt, chrooted (no recommends, lists removed)."""
    if not packages:
        return
    shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    # No daemon may start inside the build chroot (package scripts try to start what they install).
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    try:
        with chroot_mounts(root):
            _run(["chroot", str(root), "apt-get", "update", "-q"], log, "apt-get update in the root", env)
            _run(["chroot", str(root), "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
                 log, f"apt-get install {' '.join(packages)} in the root", env)
            _run(["chroot", str(root), "apt-get", "clean"], log, "apt-get clean in the root", env)
    finally:
        policy.unlink(missing_ok=True)
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)


def ensure_root(spec: RootSpec, progress: Progress = print) -> Path:
    """The built root of `spec`, building it first when missing (debootstrap, then apt)."""
    if is_built(spec):
        return spec.path
    if os.geteuid() != 0:
        raise BuildError(f"building the Debian root {spec.name} ({spec.suite}) needs root (debootstrap, chroot)")
    if missing := missing_tools():
        raise BuildError(f"building the Debian root {spec.name} needs {', '.join(missing)}: "
                         "apt-get install debootstrap")
    with _locked(spec.name):
        if is_built(spec):
            return spec.path
        work = spec.path.with_name(spec.path.name + ".building")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        log = spec.path.with_name(spec.path.name + ".log")
        log.write_text("")
        started = time.monotonic()
        progress(f"Building the Debian root {spec.name} ({spec.suite}, once per machine; log: {log}) ...")
        _run(["debootstrap", "--variant=minbase", spec.suite, str(work), MIRROR], log,
             f"debootstrap {spec.suite}")
        progress(f"  {spec.name}: base system in {time.monotonic() - started:.0f}s; "
                 f"installing {len(spec.packages)} packages ...")
        apt_install(work, spec.packages, log)
        if HOST_CA_BUNDLE.is_file():
            (work / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(HOST_CA_BUNDLE, work / "etc/ssl/certs/ca-certificates.crt")
        (work / ".nodegate-root").write_text(spec.fingerprint + "\n")
        shutil.rmtree(spec.path, ignore_errors=True)
        os.replace(work, spec.path)
        progress(f"Built the Debian root {spec.name} in {time.monotonic() - started:.0f}s -> {spec.path}")
        return spec.path
