"""The package's overlay: files copied onto the host root, and taken back off by uninstall.

The files under the overlay belong to the package, like files a distribution package installs: apply
and upgrade (re)write them when their content differs, an upgrade that drops a file removes it, and
uninstall removes them all. A host file the overlay replaced is saved first and put back by
uninstall, so removing a package leaves the host as it found it.

`plan_install` and `plan_removal` decide; `carry_out` acts. The history is saved (write-ahead) after
the backups and before the first write, so a crash at any point leaves a state a rerun completes:
a rerun never mistakes the package's own file for an original to back up.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gate.agent.errors import HostError
from gate.agent.history import OverlayFile
from gate.agent.host import PackageLayout, resolve_in_root


@dataclass(frozen=True)
class OverlayPlan:
    backup: list[str] = field(default_factory=list)   # save these host files before writing over them
    write: list[str] = field(default_factory=list)    # write these from the package
    remove: list[str] = field(default_factory=list)   # delete these (files the package no longer ships)
    restore: list[str] = field(default_factory=list)  # then put these saved originals back
    owned: list[OverlayFile] = field(default_factory=list)  # the package's files once the plan is done

    def changes_host(self) -> bool:
        return bool(self.write or self.remove or self.restore)


def plan_install(
    source: Mapping[str, str], owned: list[OverlayFile], current: Mapping[str, str | None]
) -> OverlayPlan:
    """What to do to make the host carry exactly the overlay `source` (host path -> sha256).

    `owned` is what the package put there before; `current` is the sha256 of each path involved on the
    host now (None: absent).
    """
    previously = {f.path: f for f in owned}
    backup, write, new_owned = [], [], []
    for path in sorted(source):
        before = previously.get(path)
        if before is None and current.get(path) is not None:
            backup.append(path)
        if current.get(path) != source[path]:
            write.append(path)
        backed_up = before.backed_up if before else current.get(path) is not None
        new_owned.append(OverlayFile(path=path, sha256=source[path], backed_up=backed_up))
    dropped = [f for f in owned if f.path not in source]
    return OverlayPlan(
        backup=backup,
        write=write,
        remove=sorted(f.path for f in dropped),
        restore=sorted(f.path for f in dropped if f.backed_up),
        owned=new_owned,
    )


def plan_removal(owned: list[OverlayFile]) -> OverlayPlan:
    """Take every file of the package off the host and put back what it replaced."""
    return OverlayPlan(
        remove=sorted(f.path for f in owned),
        restore=sorted(f.path for f in owned if f.backed_up),
        owned=[],
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as src:
        for chunk in iter(lambda: src.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def source_files(overlay: Path) -> dict[str, Path]:
    """The overlay's regular files by the host path they go to."""
    return {
        str(PurePosixPath("/") / entry.relative_to(overlay).as_posix()): entry
        for entry in sorted(overlay.rglob("*"))
        if stat.S_ISREG(entry.lstat().st_mode)
    }


def host_digests(root: Path, paths: list[str]) -> dict[str, str | None]:
    """sha256 of each host path now; refuses paths where the host has something other than a file."""
    out: dict[str, str | None] = {}
    for path in paths:
        target = resolve_in_root(root, path)
        if not os.path.lexists(target):
            out[path] = None
        elif target.is_file():
            out[path] = _sha256(target)
        else:
            raise HostError(f"overlay file {path}: the host has something other than a regular file there")
    return out


def _copy_atomically(src: Path, dst: Path, mode: int) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.nodegate-tmp")
    shutil.copyfile(src, tmp)
    os.chmod(tmp, mode)
    os.replace(tmp, dst)


def carry_out(
    plan: OverlayPlan,
    layout: PackageLayout,
    sources: Mapping[str, Path],
    persist: Callable[[list[OverlayFile]], None],
    log: Callable[[str], None],
) -> None:
    """Perform `plan` on the host; `persist` saves the owned list to the history at the safe moment."""
    root = layout.root
    backups = layout.backup_dir
    for path in plan.backup:
        saved = backups / path.lstrip("/")
        target = resolve_in_root(root, path)
        _copy_atomically(target, saved, stat.S_IMODE(target.stat().st_mode))
        log(f"Saved host file {path} before the overlay replaces it.")
    if plan.write or plan.backup:
        persist(plan.owned)
    for path in plan.write:
        src = sources[path]
        _copy_atomically(src, resolve_in_root(root, path), stat.S_IMODE(src.stat().st_mode))
        log(f"Wrote overlay file {path}.")
    for path in plan.remove:
        target = resolve_in_root(root, path)
        if os.path.lexists(target):
            target.unlink()
            log(f"Removed overlay file {path}.")
    for path in plan.restore:
        saved = backups / path.lstrip("/")
        if saved.exists():
            _copy_atomically(saved, resolve_in_root(root, path), stat.S_IMODE(saved.stat().st_mode))
            saved.unlink()
            log(f"Restored host file {path}.")
    persist(plan.owned)


def sources_with_digests(overlay: Path | None) -> tuple[dict[str, Path], dict[str, str]]:
    if overlay is None:
        return {}, {}
    sources = source_files(overlay)
    return sources, {path: _sha256(src) for path, src in sources.items()}
