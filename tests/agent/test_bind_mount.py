"""packages/bind-mount on the test root: real bind mounts, made in a private mount namespace of this machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.agent.conftest import PACKAGES, Agent, in_private_mounts
from tests.agent.packaging import configmap

pytestmark = pytest.mark.usefixtures("clean_env")

PKG = PACKAGES / "bind-mount"

# One mount namespace for the whole story: each `step NAME STAGE CONFIG` runs a stage and records its
# exit code in $OUT/NAME.code; `look NAME` records what the host root shows at that moment.
STORY = r"""
step() { "$PY" -m gate.cli.main agent run --stage "$2" --package bind-mount --version 1.0.0 --gate g1 \
         --generation "$4" --root "$ROOT" --payload "$PKG" --config-dir "$3" --termination-log "$OUT/$1.summary" \
         > "$OUT/$1.log" 2>&1; echo $? > "$OUT/$1.code"; }
look() {
    awk '{ print $5, $6 }' /proc/self/mountinfo | grep " \?$ROOT/mnt" | sed "s|$ROOT||" > "$OUT/$1.mounts" || true
    cat "$ROOT/mnt/data/hello" > "$OUT/$1.hello" 2>/dev/null || true
    (echo x > "$ROOT/mnt/data/write-test") 2>/dev/null && echo writable > "$OUT/$1.rw" || echo read-only > "$OUT/$1.rw"
    cp "$ROOT/etc/fstab" "$OUT/$1.fstab" 2>/dev/null || true
}
"""
FULL_STORY = STORY + r"""
step apply apply "$CM1" 1; look apply
umount "$ROOT/mnt/data"; step drifted post-interrupt "$CM1" 1
step again config "$CM1" 2; look again
step moved config "$CM2" 3; look moved
step uninstall uninstall "$CM2" 3; look uninstall
"""


def story(root: Path, tmp_path: Path, steps: str = FULL_STORY) -> dict[str, str]:
    (root / "srv/data").mkdir(parents=True)
    (root / "srv/data/hello").write_text("from the source\n")
    (root / "srv/other").mkdir()
    (root / "etc/fstab").write_text("UUID=1234 / ext4 defaults 0 1\n")
    cm1 = configmap(tmp_path / "cm1", {"mounts": "/srv/data /mnt/data ro\n"})
    cm2 = configmap(tmp_path / "cm2", {"mounts": "/srv/other /mnt/other  # moved\n"})
    out = tmp_path / "out"
    out.mkdir()
    script = (f"ROOT={root}; PKG={PKG}; PY={sys.executable}; OUT={out}; CM1={cm1}; CM2={cm2}\n" + steps)
    done = in_private_mounts(root, "/bin/sh", "-c", script)
    assert done.returncode == 0, done.stderr
    return {p.name: p.read_text() for p in out.iterdir()}


def test_mounts_are_made_read_only_proven_followed_and_removed_cleanly(root: Path, tmp_path: Path) -> None:
    seen = story(root, tmp_path)
    assert seen["apply.code"] == "0\n", seen["apply.log"]
    assert seen["apply.hello"] == "from the source\n"
    assert seen["apply.rw"] == "read-only\n"
    assert seen["apply.fstab"] == (
        "UUID=1234 / ext4 defaults 0 1\n"
        "# BEGIN NodeGate bind-mount (gate g1): managed, removed when the package is uninstalled\n"
        "/srv/data /mnt/data none bind,ro 0 0\n"
        "# END NodeGate bind-mount (gate g1)\n")
    # Unmounted behind the package's back: the check says so.
    assert seen["drifted.code"] == "1\n"
    assert "/mnt/data is not a bind mount of /srv/data on the host" in seen["drifted.summary"]
    assert seen["again.code"] == "0\n" and seen["again.hello"] == "from the source\n"
    # The line changed: the old mount and the directory made for it are gone, the new one is there.
    assert seen["moved.code"] == "0\n", seen["moved.log"]
    assert seen["moved.mounts"].split()[0] == "/mnt/other"
    assert "/mnt/data" not in seen["moved.mounts"] and not (root / "mnt/data").exists()
    assert "/srv/other /mnt/other none bind 0 0\n" in seen["moved.fstab"]
    assert seen["uninstall.code"] == "0\n", seen["uninstall.log"]
    assert seen["uninstall.mounts"] == ""
    assert seen["uninstall.fstab"] == "UUID=1234 / ext4 defaults 0 1\n"
    assert not (root / "mnt/other").exists()


def test_a_target_made_for_the_mount_that_cannot_be_removed_fails_the_uninstall_check(
        root: Path, tmp_path: Path) -> None:
    seen = story(root, tmp_path, STORY + r"""
step apply apply "$CM1" 1
umount "$ROOT/mnt/data"; echo stray > "$ROOT/mnt/data/stray"
step uninstall uninstall "$CM1" 1
""")
    assert seen["apply.code"] == "0\n"
    assert seen["uninstall.code"] == "1\n"
    assert "/mnt/data, created for the mount, is left behind" in seen["uninstall.summary"]


def test_a_missing_mounts_key_is_refused_before_any_step(agent: Agent, tmp_path: Path) -> None:
    run = agent.run("apply", PKG, package="bind-mount", config_dir=configmap(tmp_path / "cm", {}))
    assert run.code == 2 and str(run.summary["message"]).startswith("config key 'mounts' is required")


@pytest.mark.parametrize(
    ("mounts", "failure"),
    [
        ("srv/data /mnt/data\n", "mounts: source 'srv/data' is not an absolute path"),
        ("/srv/data /etc\n", "mounts: will not mount over /etc"),
        ("/srv/data /mnt/data rx\n", "mounts: 'rx' is not ro or rw"),
        ("/srv/nothing /mnt/data\n", "mounts: source /srv/nothing does not exist on the host"),
    ],
)
def test_a_bad_line_fails_the_stage_naming_it_and_mounts_nothing(
        agent: Agent, tmp_path: Path, mounts: str, failure: str) -> None:
    (agent.root / "srv/data").mkdir(parents=True)
    run = agent.run("apply", PKG, package="bind-mount", config_dir=configmap(tmp_path / "cm", {"mounts": mounts}))
    assert run.code == 1 and failure in str(run.summary["message"])
    assert not (agent.root / "mnt").exists()
