"""`nodegate agent run --part serving|undo` against a real chroot: a package's serving steps staged on a
serving node, taken over by the stage in the window, and undone when the node is not interrupted after all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agent.conftest import REPO, Agent
from tests.agent.packaging import make_package

pytestmark = pytest.mark.usefixtures("clean_env")

STATE = "var/lib/nodegate/test-gate/demo-pkg"

# write-next-boot keeps what it replaces in $NODEGATE_STAGED_DIR once per staging; its undo puts it back.
STAGES = """
    apply:
      - name: write-next-boot
        script: scripts/write.sh
        serving: true
        undo: {script: scripts/unwrite.sh}
      - name: count-builds
        command: 'echo built >> /etc/builds; test "${FAIL_BUILD:-}" != yes'
        serving: true
        undo: {command: 'sed -i "\\$d" /etc/builds'}
      - {name: in-window, command: 'echo "$NODEGATE_PART" > /etc/window-part; date > /etc/window-ran'}
    apply-check:
      - {name: written, command: 'grep -qx new /etc/next-boot && test -e /etc/window-ran'}
"""
SCRIPTS = {
    "scripts/write.sh": """
        if [ "${NODEGATE_PART:-whole}" = serving ] && [ ! -e "$NODEGATE_STAGED_DIR/saved" ]; then
            [ ! -f /etc/next-boot ] || cp /etc/next-boot "$NODEGATE_STAGED_DIR/next-boot"
            : > "$NODEGATE_STAGED_DIR/saved"
        fi
        echo new > /etc/next-boot.tmp && mv /etc/next-boot.tmp /etc/next-boot
    """,
    "scripts/unwrite.sh": """
        [ -e "$NODEGATE_STAGED_DIR/saved" ] || exit 0
        if [ -f "$NODEGATE_STAGED_DIR/next-boot" ]; then cp "$NODEGATE_STAGED_DIR/next-boot" /etc/next-boot
        else rm -f /etc/next-boot; fi
    """,
}


def history(root: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((root / STATE / "history.json").read_text())
    return data


def test_serving_steps_stage_then_the_window_skips_them_and_an_undo_puts_the_host_back(
        agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, STAGES, scripts=SCRIPTS)
    (agent.root / "etc/next-boot").write_text("old\n")

    # Staged while the node serves: the serving steps only, no check, nothing installed yet.
    staged = agent.run("apply", pkg, "--part", "serving")
    assert staged.code == 0, staged.summary
    assert staged.summary["message"] == "2 steps passed"
    # The host's boot ID, read through its root (the test root's own, as a dev real node gives its /proc one).
    assert staged.summary["bootId"] == (agent.root / "proc/sys/kernel/random/boot_id").read_text().strip()
    assert (agent.root / "etc/next-boot").read_text() == "new\n"
    assert (agent.root / "etc/builds").read_text() == "built\n"
    assert not (agent.root / "etc/window-ran").exists()
    record = history(agent.root)
    assert record["installed"] is None
    assert record["staged"] == {
        "apply/write-next-boot": {"version": "1.0.0", "generation": 1, "done": True},
        "apply/count-builds": {"version": "1.0.0", "generation": 1, "done": True}}

    # Staged again (the operator's pod ran twice): write-next-boot keeps the original it saved first.
    assert agent.run("apply", pkg, "--part", "serving").code == 0

    # The undo: the last staged first; the host is what it was, nothing is staged any more.
    undone = agent.run("apply", pkg, "--part", "undo")
    assert undone.code == 0, undone.summary
    assert (agent.root / "etc/next-boot").read_text() == "old\n"
    assert (agent.root / "etc/builds").read_text() == "built\n"  # two stagings, one undo of the last
    assert history(agent.root)["staged"] == {}
    assert not (agent.root / STATE / "staged").exists()

    # Staged anew, then the stage in the window: it skips what was staged and runs the rest and the check.
    assert agent.run("apply", pkg, "--part", "serving").code == 0
    window = agent.run("apply", pkg)
    assert window.code == 0, window.summary
    assert window.summary["message"] == "2 steps passed, 2 skipped (already done)"
    assert "bootId" not in window.summary
    assert (agent.root / "etc/window-part").read_text() == "\n"  # NODEGATE_PART only for serving steps
    assert (agent.root / "etc/builds").read_text() == "built\nbuilt\n"
    record = history(agent.root)
    assert (record["installed"], record["staged"]) == ("1.0.0", {})
    assert not (agent.root / STATE / "staged").exists()

    # Another generation stages nothing it finds staged: the window runs every step.
    again = agent.run("apply", pkg, generation=2)
    assert again.code == 0 and again.summary["message"] == "4 steps passed", again.summary


def test_a_half_staged_step_is_undone_too(agent: Agent, tmp_path: Path) -> None:
    failing = make_package(tmp_path, STAGES.replace('"${FAIL_BUILD:-}" != yes', "1 = 2"), scripts=SCRIPTS)
    half = agent.run("apply", failing, "--part", "serving")
    assert (half.code, half.summary["failedStep"]) == (1, "apply/count-builds")
    assert history(agent.root)["staged"]["apply/count-builds"] == {"version": "1.0.0", "generation": 1,
                                                                   "done": False}
    # The window would run it again (not done); the undo takes the half run back with the rest.
    undone = agent.run("apply", failing, "--part", "undo")
    assert undone.code == 0, undone.summary
    assert not (agent.root / "etc/next-boot").exists()
    assert (agent.root / "etc/builds").read_text() == ""
    assert history(agent.root)["staged"] == {}


def test_grub_cmdline_stages_its_drop_in_and_grub_cfg_and_its_undo_restores_the_installed_arguments(
        agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = REPO / "packages/grub-cmdline"
    drop_in = agent.root / "etc/default/grub.d/90-nodegate.cfg"
    grub_cfg = agent.root / "boot/grub/grub.cfg"
    state = agent.root / "var/lib/nodegate/test-gate/grub-cmdline"
    monkeypatch.setenv("KERNEL_ARGS", "iommu=pt")
    installed = agent.run("apply", pkg, package="grub-cmdline")
    assert installed.code == 0, installed.summary
    before = (drop_in.read_text(), grub_cfg.read_text(), (state / "data/args").read_text())

    monkeypatch.setenv("KERNEL_ARGS", "iommu=pt intel_iommu=on")
    staged = agent.run("apply", pkg, "--part", "serving", package="grub-cmdline", generation=2)
    assert staged.code == 0, staged.summary
    assert "intel_iommu=on" in drop_in.read_text() and "intel_iommu=on" in grub_cfg.read_text()

    undone = agent.run("apply", pkg, "--part", "undo", package="grub-cmdline", generation=2)
    assert undone.code == 0, undone.summary
    assert (drop_in.read_text(), grub_cfg.read_text(), (state / "data/args").read_text()) == before
    assert not (state / "staged").exists()

    assert agent.run("apply", pkg, "--part", "serving", package="grub-cmdline", generation=2).code == 0
    window = agent.run("apply", pkg, package="grub-cmdline", generation=2)
    assert window.code == 0 and window.summary["message"] == "1 steps passed, 2 skipped (already done)", window.summary
    assert "intel_iommu=on" in grub_cfg.read_text()


# STAGES' first step alone: every apply step a serving step, the apply staged whole.
WHOLE = STAGES[:STAGES.index("      - name: count-builds")] + """\
    apply-check:
      - {name: written, command: 'grep -qx new /etc/next-boot'}
    post-interrupt-check:
      - {name: live, command: 'grep -qx new /etc/next-boot'}
"""


def test_a_stage_staged_whole_runs_its_check_in_staging_and_the_check_after_the_interrupt_takes_it_over(
        agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, WHOLE, scripts=SCRIPTS)
    # Every apply step is serving: the staging runs the apply's check too, before the cordon.
    staged = agent.run("apply", pkg, "--part", "serving")
    assert staged.code == 0 and staged.summary["message"] == "2 steps passed", staged.summary
    record = history(agent.root)
    assert record["installed"] is None
    assert record["staged"] == {"apply/write-next-boot": {"version": "1.0.0", "generation": 1, "done": True}}

    # The window ran no container for the apply; the check after the interrupt (another generation: the
    # spec changed mid-round) records it applied and takes the staged record over, so no undo takes it back.
    after = agent.run("post-interrupt", pkg, generation=2)
    assert after.code == 0, after.summary
    record = history(agent.root)
    assert (record["installed"], record["staged"]) == ("1.0.0", {})
    assert [(r["stage"], r["ok"], r["generation"]) for r in record["runs"][-2:]] == [
        ("apply:staged", True, 2), ("post-interrupt", True, 2)]
    assert not (agent.root / STATE / "staged").exists()
    assert agent.run("apply", pkg, "--part", "undo").summary["message"] == "0 steps passed"
    assert (agent.root / "etc/next-boot").read_text() == "new\n"

    # A check after the interrupt with nothing staged whole records nothing more.
    again = agent.run("post-interrupt", pkg, generation=2)
    assert again.code == 0 and [r["stage"] for r in history(agent.root)["runs"]].count("apply:staged") == 1

    # A failing check fails the staging, before any cordon.
    (agent.root / "etc/next-boot").write_text("old\n")
    failing = make_package(tmp_path / "bad", WHOLE.replace("grep -qx new /etc/next-boot'}\n    post",
                                                            "false'}\n    post"), scripts=SCRIPTS)
    bad = agent.run("apply", failing, "--part", "serving", generation=3)
    assert (bad.code, bad.summary["failedStep"]) == (1, "apply-check/written"), bad.summary


def test_a_staging_forgets_what_an_earlier_round_staged_and_owns_so_its_undo_never_takes_that_back(
        agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, STAGES, scripts=SCRIPTS)
    (agent.root / "etc/next-boot").write_text("old\n")
    # Round 1 staged at generation 1, passed its cordon and failed before anything took the records over.
    assert agent.run("apply", pkg, "--part", "serving").code == 0
    assert set(history(agent.root)["staged"]) == {"apply/write-next-boot", "apply/count-builds"}
    # A later staging (generation 2) starts afresh: round 1's records go, and what it saves is the host now.
    again = agent.run("apply", pkg, "--part", "serving", generation=2)
    assert again.code == 0, again.summary
    assert {rec["generation"] for rec in history(agent.root)["staged"].values()} == {2}
    # Its undo takes back its own work only: round 1's write stays.
    assert agent.run("apply", pkg, "--part", "undo", generation=2).code == 0
    assert (agent.root / "etc/next-boot").read_text() == "new\n"
    assert (agent.root / "etc/builds").read_text() == "built\n"
    assert history(agent.root)["staged"] == {}
