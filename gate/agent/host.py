"""Where the agent keeps things on the host, and how it finds host paths from inside the pod.

The host root is mounted at `/host` in the agent's pod. A host path such as `/etc/sysctl.d` may be a
symlink with an *absolute* target (`/usr/lib/...`); followed naively from the pod it would point into
the container's own filesystem. `resolve_in_root` follows symlinks the way the host would see them,
never leaving the root, so every write lands on the host.

Layout on the host (one directory per gate and package: two gates may each carry a package with the
same name, and their histories must not mix):

    /var/lib/nodegate/<gate>/<package>/
        history.json            installed and previous version, finished idempotent steps, overlay files
        lock                    flock: one stage of a package at a time
        package/<version>/      the payload of each kept version (package.yaml, scripts, overlay)
        config/                 the gate's config files of the latest run ($NODEGATE_CONFIG_DIR)
        data/                   the scripts' own state ($NODEGATE_STATE_DIR); removed by uninstall
        overlay-backup/         host files the overlay replaced, restored by uninstall
        node/                   the node's facts of the latest run ($NODEGATE_NODE_FACTS, gate.agent.facts)
    /var/lib/nodegate/reboots/<pod uid>   the boot a reboot pod asked for its reboot on (gate.agent.reboots)
    /var/log/nodegate/<gate>/<package>/<version>/<time>-<stage>.log
    /var/log/nodegate/interrupts/<time>-<type>.log
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Final

from gate.agent.errors import HostError

STATE_BASE: Final = PurePosixPath("/var/lib/nodegate")
LOG_BASE: Final = PurePosixPath("/var/log/nodegate")
INTERRUPT_LOGS: Final = LOG_BASE / "interrupts"
REBOOTS: Final = STATE_BASE / "reboots"
BOOT_ID: Final = "proc/sys/kernel/random/boot_id"
# Linux's own limit on symlinks followed while resolving one path.
_MAX_SYMLINKS: Final = 40


def boot_id(root: Path) -> str | None:
    """The host's boot ID as the kubelet reports it: read through the host root first (a node that
    gives its /proc a boot ID of its own, as the dev cluster's real nodes do), else the kernel's."""
    for path in (root / BOOT_ID, Path("/") / BOOT_ID):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text:
            return text
    return None


def resolve_in_root(root: Path, host_path: PurePosixPath | str) -> Path:
    """The agent-side path of `host_path`, following symlinks as the host would, never above `root`.

    Components that do not exist yet are kept as they are, so the result can be created.
    """
    parts = list(PurePosixPath("/", host_path).parts[1:])
    current = PurePosixPath("/")
    followed = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent
            continue
        candidate = current / part
        outside = root / candidate.relative_to("/")
        if outside.is_symlink():
            followed += 1
            if followed > _MAX_SYMLINKS:
                raise HostError(f"too many symlinks resolving {host_path} under {root}")
            target = PurePosixPath(os.readlink(outside))
            if target.is_absolute():
                current = PurePosixPath("/")
                parts = list(target.parts[1:]) + parts
            else:
                parts = list(target.parts) + parts
            continue
        current = candidate
    return root / current.relative_to("/")


def check_root(root: Path, needs_shell: bool, needs_chroot: bool | None = None) -> None:
    """Refuse a root that is missing or cannot run host steps, before anything is written to it.

    `needs_chroot` defaults to `needs_shell`: host steps are what the agent chroots for.
    """
    needs_chroot = needs_shell if needs_chroot is None else needs_chroot
    if not root.is_dir():
        raise HostError(f"host root {root} does not exist or is not a directory (is the host mounted there?)")
    if needs_shell and not os.path.lexists(resolve_in_root(root, "/bin/sh")):
        raise HostError(f"host root {root} has no /bin/sh, so steps cannot run chrooted into it")
    if needs_chroot and os.geteuid() != 0:
        raise HostError(f"chrooting into {root} needs root: run the agent privileged (or with sudo)")


@dataclass(frozen=True)
class PackageLayout:
    """The host paths of one package of one gate. `host_*` paths are as seen inside the chroot."""

    root: Path
    gate: str
    package: str

    @property
    def host_state_dir(self) -> PurePosixPath:
        return STATE_BASE / self.gate / self.package

    def host_package_dir(self, version: str) -> PurePosixPath:
        return self.host_state_dir / "package" / version

    @property
    def host_config_dir(self) -> PurePosixPath:
        return self.host_state_dir / "config"

    @property
    def host_data_dir(self) -> PurePosixPath:
        return self.host_state_dir / "data"

    @property
    def host_backup_dir(self) -> PurePosixPath:
        return self.host_state_dir / "overlay-backup"

    @property
    def host_facts_dir(self) -> PurePosixPath:
        return self.host_state_dir / "node"

    @property
    def host_staged_dir(self) -> PurePosixPath:
        """What serving steps keep for their undo (NODEGATE_STAGED_DIR): made empty when a staging starts
        afresh, removed once the stage took the staged work over or the undo ran."""
        return self.host_state_dir / "staged"

    @property
    def staged_dir(self) -> Path:
        return self.outside(self.host_staged_dir)

    @property
    def host_log_dir(self) -> PurePosixPath:
        return LOG_BASE / self.gate / self.package

    def outside(self, host_path: PurePosixPath) -> Path:
        """The same path as the agent sees it (under the mounted root)."""
        return resolve_in_root(self.root, host_path)

    @property
    def state_dir(self) -> Path:
        return self.outside(self.host_state_dir)

    @property
    def history_file(self) -> Path:
        return self.outside(self.host_state_dir / "history.json")

    @property
    def lock_file(self) -> Path:
        return self.outside(self.host_state_dir / "lock")

    @property
    def packages_dir(self) -> Path:
        return self.outside(self.host_state_dir / "package")

    def package_dir(self, version: str) -> Path:
        return self.outside(self.host_package_dir(version))

    @property
    def config_dir(self) -> Path:
        return self.outside(self.host_config_dir)

    @property
    def data_dir(self) -> Path:
        return self.outside(self.host_data_dir)

    @property
    def backup_dir(self) -> Path:
        return self.outside(self.host_backup_dir)

    @property
    def facts_dir(self) -> Path:
        return self.outside(self.host_facts_dir)

    @property
    def log_dir(self) -> Path:
        return self.outside(self.host_log_dir)
