"""packages/lvm on the test root: real loop disks, real wipefs/blkid/mkfs.ext4/mount, fake LVM commands.

See tests/agent/fake_lvm.py for what is real and what is a fake (this kernel has no device-mapper).
Each story runs in one private mount namespace of this machine, so the package's mounts are real and
never land on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent import fake_lvm
from tests.agent.conftest import PACKAGES, in_private_mounts
from tests.agent.packaging import configmap

pytestmark = pytest.mark.usefixtures("clean_env")

PKG = PACKAGES / "lvm"
CONFIG = {"disks": "/dev/vdb /dev/vdc\n", "vg_name": "scratch", "lv_name": "data", "size": "32M",
          "mount_point": "/mnt/scratch"}

STEP = r"""
step() { NODEGATE_NODE=gpu-node-7 "$PY" -m gate.cli.main agent run --stage "$2" --package lvm --version 1.0.0 \
         --gate g1 --generation "$4" --root "$ROOT" --payload "$PKG" --config-dir "$3" \
         --termination-log "$OUT/$1.summary" > "$OUT/$1.log" 2>&1; echo $? > "$OUT/$1.code"; }
look() {
    awk '{ print $3, $5 }' /proc/self/mountinfo | grep " $ROOT/mnt" | sed "s|$ROOT||" > "$OUT/$1.mounts" || true
    cp "$ROOT/etc/fstab" "$OUT/$1.fstab" 2>/dev/null || true
    cat "$ROOT/mnt/scratch/hello" > "$OUT/$1.hello" 2>/dev/null || true
    cat "$ROOT/var/log/fake-calls.log" > "$OUT/$1.calls" 2>/dev/null || true
    blkid -p -s TYPE -o value "$ROOT/dev/vdc" > "$OUT/$1.vdc" || true
}
"""


def story(root: Path, tmp_path: Path, steps: str, configs: dict[str, dict[str, str]]) -> dict[str, str]:
    (root / "etc/fstab").write_text("UUID=1234 / ext4 defaults 0 1\n")
    out = tmp_path / "out"
    out.mkdir()
    env = "".join(f"{name}={configmap(tmp_path / name, files)}; " for name, files in configs.items())
    done = in_private_mounts(root, "/bin/sh", "-c", f"ROOT={root}; PKG={PKG}; PY={sys.executable}; OUT={out}; "
                             + env + STEP + steps)
    assert done.returncode == 0, done.stderr
    return {p.name: p.read_text() for p in out.iterdir()}


@pytest.fixture
def disks(root: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    fake_lvm.install(root)
    with fake_lvm.loop_disks(root, tmp_path, ("vdb", "vdc")) as devices:
        yield devices


def blkid_type(device: str) -> str:
    return subprocess.run(["blkid", "-p", "-s", "TYPE", "-o", "value", device], capture_output=True,
                          text=True).stdout.strip()


def test_the_volume_is_made_mounted_proven_and_removed_cleanly(
        root: Path, tmp_path: Path, disks: dict[str, str]) -> None:
    moved = {**CONFIG, "mount_point": "/mnt/moved"}
    seen = story(root, tmp_path, r"""
step apply apply "$CM" 1; look apply
echo kept > "$ROOT/mnt/scratch/hello"
umount "$ROOT/mnt/scratch"; step drifted post-interrupt "$CM" 1
step again config "$CM" 2; look again
step moved config "$MOVED" 3; look moved
step uninstall uninstall "$MOVED" 3; look uninstall
""", {"CM": CONFIG, "MOVED": moved})
    assert seen["apply.code"] == "0\n", seen["apply.log"]
    assert "made an ext4 filesystem on /dev/scratch/data" in seen["apply.log"]
    rdev = os.stat(disks["fake-lv"]).st_rdev
    number = f"{os.major(rdev)}:{os.minor(rdev)}"
    assert seen["apply.mounts"] == f"{number} /mnt/scratch\n"
    assert seen["apply.fstab"] == (
        "UUID=1234 / ext4 defaults 0 1\n"
        "# BEGIN NodeGate lvm (gate g1): managed, removed when the package is uninstalled\n"
        "/dev/scratch/data /mnt/scratch ext4 defaults 0 2\n"
        "# END NodeGate lvm (gate g1)\n")
    # Unmounted behind the package's back: the check says so, naming the node.
    assert seen["drifted.code"] == "1\n"
    assert "/dev/scratch/data is not mounted at /mnt/scratch on gpu-node-7" in seen["drifted.summary"]
    # Mounted again, with the data written before: the filesystem was not made again.
    assert seen["again.code"] == "0\n", seen["again.log"]
    assert seen["again.hello"] == "kept\n" and "made an" not in seen["again.log"]
    assert seen["moved.code"] == "0\n", seen["moved.log"]
    assert seen["moved.mounts"] == f"{number} /mnt/moved\n" and not (root / "mnt/scratch").exists()
    assert seen["uninstall.code"] == "0\n", seen["uninstall.log"]
    assert seen["uninstall.mounts"] == "" and seen["uninstall.fstab"] == "UUID=1234 / ext4 defaults 0 1\n"
    assert not (root / "mnt/moved").exists() and not (root / "dev/scratch").exists()
    assert (root / "etc/fake-lvm/pvs").read_text() == "" and (root / "etc/fake-lvm/lvs").read_text() == ""
    assert blkid_type(disks["fake-lv"]) == ""  # the filesystem went with the logical volume


def test_a_disk_holding_a_filesystem_is_refused_naming_it_until_the_config_says_wipe(
        root: Path, tmp_path: Path, disks: dict[str, str]) -> None:
    subprocess.run(["mkfs.ext4", "-q", "-F", disks["vdc"]], check=True)
    seen = story(root, tmp_path, r"""
step refused apply "$CM" 1; look refused
step wiped apply "$WIPE" 2; look wiped
step uninstall uninstall "$WIPE" 2
""", {"CM": CONFIG, "WIPE": {**CONFIG, "wipe": "true"}})
    assert seen["refused.code"] == "1\n"
    assert ("disk /dev/vdc on gpu-node-7 holds data (ext4 at offset 0x438): refusing to use it; "
            "set config wipe: true to erase it") in seen["refused.summary"]
    # Nothing was touched: no physical volume, no mount, the filesystem still there.
    assert "pvcreate" not in seen["refused.calls"]
    assert seen["refused.mounts"] == "" and seen["refused.vdc"] == "ext4\n"
    assert seen["wiped.code"] == "0\n", seen["wiped.log"]
    assert "disk /dev/vdc holds ext4 at offset 0x438: it will be wiped (config wipe: true)" in seen["wiped.log"]
    assert "wiped /dev/vdc" in seen["wiped.log"]
    assert seen["wiped.vdc"] == ""
    assert seen["uninstall.code"] == "0\n", seen["uninstall.log"]


def test_a_partition_table_is_data_too(root: Path, tmp_path: Path, disks: dict[str, str]) -> None:
    # An MBR with one Linux partition from sector 2048 on (no partitioning tool on this machine).
    entry = bytes([0, 0, 0, 0, 0x83, 0, 0, 0]) + (2048).to_bytes(4, "little") + (4096).to_bytes(4, "little")
    with open(disks["vdb"], "r+b") as disk:
        disk.seek(446)
        disk.write(entry + bytes(48) + b"\x55\xaa")
    seen = story(root, tmp_path, 'step refused apply "$CM" 1\n', {"CM": CONFIG})
    assert seen["refused.code"] == "1\n"
    assert "disk /dev/vdb on gpu-node-7 holds data (dos at offset 0x1fe): refusing to use it" in \
        seen["refused.summary"], seen["refused.summary"]


@pytest.mark.parametrize(
    ("change", "failure"),
    [
        ({"disks": "/dev/vdb /dev/nothing"}, "disks: /dev/nothing is not a block device on gpu-node-7"),
        ({"disks": "/dev/vdb /dev/vdb"}, "disks: /dev/vdb is listed twice"),
        ({"mount_point": "/etc"}, "mount_point: will not mount over /etc"),
    ],
)
def test_a_bad_config_fails_naming_the_key_and_touches_no_disk(
        root: Path, tmp_path: Path, disks: dict[str, str], change: dict[str, str], failure: str) -> None:
    seen = story(root, tmp_path, 'step bad apply "$CM" 1; look bad\n', {"CM": {**CONFIG, **change}})
    assert seen["bad.code"] == "1\n" and failure in seen["bad.summary"], seen["bad.summary"]
    assert "pvcreate" not in seen.get("bad.calls", "")


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [("size", "lots", "does not match the pattern"), ("fs_type", "ntfs", "'ntfs' is not one of ext4, xfs"),
     ("wipe", "yes", "'yes' is not true or false"), ("disks", "sdb", "does not match the pattern")],
)
def test_a_mistyped_key_is_refused_by_the_agent_before_any_step(
        root: Path, tmp_path: Path, disks: dict[str, str], key: str, value: str, why: str) -> None:
    seen = story(root, tmp_path, 'step bad apply "$CM" 1\n', {"CM": {**CONFIG, key: value}})
    assert seen["bad.code"] == "2\n"
    assert f"config key '{key}'" in seen["bad.summary"] and why in seen["bad.summary"], seen["bad.summary"]


def test_a_disk_named_by_a_link_is_used_and_checked_by_its_device_name(
        root: Path, tmp_path: Path, disks: dict[str, str]) -> None:
    (root / "dev/disk/by-id").mkdir(parents=True)
    (root / "dev/disk/by-id/nvme-Example_SSD_1234").symlink_to("../../vdb")
    config = {**CONFIG, "disks": "/dev/disk/by-id/nvme-Example_SSD_1234 /dev/vdc"}
    seen = story(root, tmp_path, 'step apply apply "$CM" 1; step uninstall uninstall "$CM" 1\n', {"CM": config})
    assert seen["apply.code"] == "0\n", seen["apply.log"]
    assert "scratch/data (ext4, 33554432 bytes) on /dev/vdb /dev/vdc, mounted at /mnt/scratch" in seen["apply.log"], \
        seen["apply.log"]
    assert seen["uninstall.code"] == "0\n", seen["uninstall.log"]
