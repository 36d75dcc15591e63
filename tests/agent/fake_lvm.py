"""Disks for packages/lvm in the chroot tier: real loop devices, real signatures, and fake LVM commands.

This machine's kernel has no device-mapper (CONFIG_MD is not set, and it loads no modules), so no
logical volume can be activated here, by the real lvm2 or any other. What is real: the disks are loop
devices over files (the kernel's), and the package's own wipefs, blkid, mkfs.ext4 and mount (copied
from this machine) read and write them. What is FAKE: the LVM commands (pvs, vgcreate, lvcreate, ...)
keep the volume group in `/etc/fake-lvm/` of the test root, and "activate" a logical volume by making
`/dev/VG/LV` a device node of a second loop device the test set aside for it (`/dev/fake-lv`), where
the real mkfs and mount then work. Every fake appends its command line to /var/log/fake-calls.log.

The test root's `/dev` is a directory of its own: each disk appears there under the name the config
uses (`/dev/vdb`), as a device node with the loop device's numbers. Loop devices are the kernel's,
shared by every session on this machine: `losetup --find` picks a free one, and `loop_disks` detaches
every one it attached, also when the test fails.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.agent.rootfs import FAKE_DIR, copy_host_tools

TOOLS = ("wipefs", "blkid", "mkfs.ext4", "paste", "mknod")
LVM_COMMANDS = ("pvs", "vgs", "lvs", "pvcreate", "vgcreate", "vgextend", "lvcreate", "lvextend", "lvremove",
                "vgremove", "pvremove")

FAKE_LVM = r"""#!/bin/sh
# FAKE LVM for NodeGate's agent tests (tests/agent/fake_lvm.py): this kernel has no device-mapper.
# /etc/fake-lvm/pvs: "DISK VG" lines (VG "-" for none); /etc/fake-lvm/lvs: "VG LV BYTES" lines.
# lvcreate "activates" the LV as a device node of /dev/fake-lv; lvremove wipes and removes it.
cmd=${0##*/}
echo "$cmd $*" >> /var/log/fake-calls.log
db=/etc/fake-lvm; mkdir -p "$db"; touch "$db/pvs" "$db/lvs"
fields=""; names=""; size=""; extents=""; lvname=""
while [ $# -gt 0 ]; do
    case "$1" in
        -o) fields=$2; shift ;; --name) lvname=$2; shift ;; --size) size=$2; shift ;; --extents) extents=$2; shift ;;
        --units|--wipesignatures|--config) shift ;; -*) ;; *) names="$names $1" ;;
    esac
    shift
done
set -- $names
bytes() { n=${1%?}; case "$1" in *K) echo $((n * 1024)) ;; *M) echo $((n * 1048576)) ;;
    *G) echo $((n * 1073741824)) ;; esac; }
has_vg() { awk -v v="$1" '$2 == v { f = 1 } END { exit !f }' "$db/pvs"; }
case "$cmd" in
    pvs)
        if [ $# -eq 0 ]; then awk '{ print "  " $1, ($2 == "-" ? "" : $2) }' "$db/pvs"; exit 0; fi
        line=$(awk -v d="$1" '$1 == d' "$db/pvs")
        [ -n "$line" ] || { echo "  Failed to find physical volume \"$1\"." >&2; exit 5; }
        set -- $line; case "$fields" in vg_name) [ "$2" = - ] || echo "  $2" ;; *) echo "  $1" ;; esac ;;
    vgs) has_vg "$1" || { echo "  Volume group \"$1\" not found" >&2; exit 5; }; echo "  $1" ;;
    lvs)
        case "$1" in
            */*) line=$(awk -v v="${1%/*}" -v l="${1#*/}" '$1 == v && $2 == l' "$db/lvs")
                 [ -n "$line" ] || { echo "  Failed to find logical volume \"$1\"" >&2; exit 5; }
                 set -- $line; case "$fields" in lv_size) echo "  $3" ;; *) echo "  $2" ;; esac ;;
            *) awk -v v="$1" '$1 == v { print "  " $2 }' "$db/lvs" ;;
        esac ;;
    pvcreate) grep -q "^$1 " "$db/pvs" || echo "$1 -" >> "$db/pvs"
              echo "  Physical volume \"$1\" successfully created." ;;
    vgcreate|vgextend)
        vg=$1; shift
        for d in "$@"; do
            awk -v d="$d" -v v="$vg" '$1 == d { $2 = v } { print }' "$db/pvs" > "$db/pvs.new"
            mv "$db/pvs.new" "$db/pvs"
        done
        echo "  Volume group \"$vg\" successfully ${cmd#vg}ed" ;;
    lvcreate)
        vg=$1
        if [ -n "$size" ]; then b=$(bytes "$size"); else b=$(cat "$db/free-bytes"); fi
        echo "$vg $lvname $b" >> "$db/lvs"
        numbers=$(stat -L -c '%t %T' /dev/fake-lv)
        mkdir -p "/dev/$vg"; mknod "/dev/$vg/$lvname" b $(printf '%d %d' 0x${numbers% *} 0x${numbers#* })
        echo "  Logical volume \"$lvname\" created." ;;
    lvextend)
        b=$(bytes "$size")
        awk -v v="${1%/*}" -v l="${1#*/}" -v b="$b" '$1 == v && $2 == l { $3 = b } { print }' "$db/lvs" > "$db/lvs.new"
        mv "$db/lvs.new" "$db/lvs" ;;
    lvremove)
        awk -v v="${1%/*}" -v l="${1#*/}" '!($1 == v && $2 == l)' "$db/lvs" > "$db/lvs.new"; mv "$db/lvs.new" "$db/lvs"
        wipefs --all --quiet "/dev/$1"; rm -f "/dev/$1"; rmdir "/dev/${1%/*}" 2>/dev/null
        echo "  Logical volume \"${1#*/}\" successfully removed." ;;
    vgremove) awk -v v="$1" '$2 == v { $2 = "-" } { print }' "$db/pvs" > "$db/pvs.new"; mv "$db/pvs.new" "$db/pvs"
              echo "  Volume group \"$1\" successfully removed" ;;
    pvremove) awk -v d="$1" '$1 != d' "$db/pvs" > "$db/pvs.new"; mv "$db/pvs.new" "$db/pvs"
              echo "  Labels on physical volume \"$1\" successfully wiped." ;;
esac
"""


def install(root: Path) -> None:
    """The real disk tools and the fake LVM commands in the test root."""
    copy_host_tools(root, *TOOLS)
    fake = root / FAKE_DIR / "fake-lvm"
    fake.write_text(FAKE_LVM)
    fake.chmod(0o755)
    for name in LVM_COMMANDS:
        link = root / "usr/sbin" / name
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(fake, link.parent))


def _device_node(root: Path, name: str, device: str) -> None:
    rdev = os.stat(device).st_rdev
    node = root / "dev" / name
    node.unlink(missing_ok=True)
    os.mknod(node, 0o660 | stat.S_IFBLK, rdev)


@contextmanager
def loop_disks(root: Path, work: Path, names: tuple[str, ...], size_mib: int = 64) -> Iterator[dict[str, str]]:
    """A loop device per name (shown in the test root as /dev/NAME) and one for the fake LV, /dev/fake-lv;
    all detached on the way out."""
    attached: list[str] = []
    try:
        for name in (*names, "fake-lv"):
            image = work / f"{name}.img"
            with open(image, "wb") as out:
                out.truncate(size_mib << 20)
            device = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True,
                                    check=True).stdout.strip()
            attached.append(device)
            _device_node(root, name, device)
        (root / "etc/fake-lvm").mkdir(parents=True, exist_ok=True)
        (root / "etc/fake-lvm/free-bytes").write_text(f"{size_mib << 20}\n")
        yield dict(zip((*names, "fake-lv"), attached, strict=True))
    finally:
        for device in attached:
            subprocess.run(["losetup", "--detach", device], capture_output=True)
