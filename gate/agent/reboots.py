"""A reboot pod asks for its reboot once: the host keeps the boot it asked on.

The kubelet of a new boot runs a pod with `restartPolicy: Never` again from its first step when the
container runtime no longer lists any of its containers (a power cut, a boot held back long: both seen
on real nodes, docs/realnodes.md). Run again, a pod that ends with a reboot would reboot the node once
more, and the operator can only race the kubelet to delete it first. So before the reboot step asks for
the reboot it writes, on the host, the boot ID it asks on under its pod's UID; the same pod run again on
a later boot finds that record, and its reboot step ends at once with success: the reboot it was made
for happened. A new pod (a retry, the next round) has a new UID and reboots as asked.

The records are files under `/var/lib/nodegate/reboots/`, one per pod UID, written aside and renamed
(and synced), the newest `KEEP` kept. Only root on the host writes there.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from gate.agent.errors import UsageError
from gate.agent.host import REBOOTS, resolve_in_root

KEEP: Final = 64
# A Kubernetes object UID (RFC 4122 text form): the record's file name, never a path.
_UID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def checked_uid(uid: str) -> str:
    """`uid` when it is a pod UID; refused otherwise, before anything touches the host."""
    if not _UID.fullmatch(uid):
        raise UsageError(f"--pod {uid!r} is not a pod UID (8-4-4-4-12 lowercase hexadecimal digits)")
    return uid


def asked_on(root: Path, uid: str) -> str | None:
    """The boot ID the pod `uid` asked for its reboot on, None when it never asked on this host."""
    try:
        return (resolve_in_root(root, REBOOTS) / checked_uid(uid)).read_text().strip() or None
    except FileNotFoundError:
        return None


def record(root: Path, uid: str, boot: str) -> None:
    """Keep `boot` as the boot the pod `uid` asks for its reboot on, whole or not at all, and on disk
    before the reboot is asked for; the oldest records beyond `KEEP` go."""
    directory = resolve_in_root(root, REBOOTS)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / checked_uid(uid)
    aside = directory / f".{uid}.tmp"
    with open(aside, "w") as f:
        f.write(boot + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(aside, target)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    kept = sorted((p for p in directory.iterdir() if _UID.fullmatch(p.name)), key=_mtime, reverse=True)
    for old in kept[KEEP:]:
        old.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # pruned meanwhile by another reboot step (another gate's, on the same host)
        return 0.0
