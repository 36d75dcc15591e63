"""The commands as the operator's Job and a package author run them: real processes, real exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate.cli.main import main
from tests.agent.conftest import REPO
from tests.agent.packaging import make_package


def nodegate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("NODEGATE_")}
    return subprocess.run([sys.executable, "-m", "gate.cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          env={**base, **(env or {})}, timeout=120)


def test_agent_run_takes_its_identity_from_the_pods_environment(root: Path, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: s, command: 'echo "$NODEGATE_GATE/$NODEGATE_PACKAGE/$NODEGATE_VERSION" > /etc/who'}]
        apply-check: [{name: c, command: 'true'}]
    """)
    log = tmp_path / "termination-log"
    env = {"NODEGATE_GATE": "gpu-base", "NODEGATE_PACKAGE": "demo-pkg", "NODEGATE_VERSION": "1.0.0",
           "NODEGATE_STAGE": "apply"}
    proc = nodegate("agent", "run", "--generation", "2", "--root", str(root), "--payload", str(pkg),
                    "--termination-log", str(log), env=env)
    assert proc.returncode == 0, proc.stderr
    assert (root / "etc/who").read_text() == "gpu-base/demo-pkg/1.0.0\n"
    assert json.loads(log.read_text())["ok"] is True
    assert (root / "var/lib/nodegate/gpu-base/demo-pkg/history.json").exists()


def test_exit_codes_separate_a_failed_stage_from_a_refused_one(root: Path, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: s, command: 'exit 5'}]
        apply-check: [{name: c, command: 'true'}]
    """)
    common = ["--stage", "apply", "--package", "demo-pkg", "--gate", "g", "--root", str(root), "--payload", str(pkg),
              "--termination-log", str(tmp_path / "t")]
    failed = nodegate("agent", "run", "--version", "1.0.0", *common)
    refused = nodegate("agent", "run", "--version", "2.0.0", *common)
    assert (failed.returncode, refused.returncode) == (1, 2)
    assert refused.stderr.startswith("error: ") and "wrong image tag" in refused.stderr
    assert "Traceback" not in failed.stderr + refused.stderr


def _in_turn(root: Path, tmp_path: Path, turns: Path, steps: list[tuple[str, Path, str]]) -> list[tuple[int, dict]]:
    """Each (package, payload, version) as the pod's step in turn, all started together as the kubelet starts a
    pod's containers, the last first: their exit codes and summaries, in the steps' order."""
    procs = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("NODEGATE_")}
    for index, (package, payload, version) in reversed(list(enumerate(steps))):
        argv = ["agent", "run", "--stage", "apply", "--package", package, "--version", version, "--gate", "g",
                "--root", str(root), "--payload", str(payload), "--termination-log", str(tmp_path / f"t{index}"),
                "--turn", str(index), "--turns", str(turns)]
        procs.append(subprocess.Popen([sys.executable, "-m", "gate.cli.main", *argv], cwd=REPO, env=base,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    codes = [p.wait(timeout=60) for p in reversed(procs)]
    return [(code, json.loads((tmp_path / f"t{i}").read_text())) for i, code in enumerate(codes)]


def test_steps_in_turn_run_one_after_another_and_none_after_one_that_did_not_succeed(
    root: Path, tmp_path: Path
) -> None:
    """A pod's steps in turn all start together (gate.agent.turns): the second runs only once the first recorded
    its success, whichever process started first; after a failed or refused step the steps that follow run
    nothing on the host and exit 3, saying why."""
    first = make_package(tmp_path / "p", """
        apply: [{name: s, command: 'sleep 0.5; echo first >> /etc/order'}]
        apply-check: [{name: c, command: 'true'}]
    """, name="first")
    second = make_package(tmp_path / "p", """
        apply: [{name: s, command: 'echo second >> /etc/order'}]
        apply-check: [{name: c, command: 'true'}]
    """, name="second")
    failing = make_package(tmp_path / "p", """
        apply: [{name: s, command: 'exit 5'}]
        apply-check: [{name: c, command: 'true'}]
    """, name="failing")
    ran = _in_turn(root, tmp_path, tmp_path / "turns-1", [("first", first, "1.0.0"), ("second", second, "1.0.0")])
    assert [code for code, _ in ran] == [0, 0]
    assert (root / "etc/order").read_text() == "first\nsecond\n"
    assert sorted(p.name for p in (tmp_path / "turns-1").iterdir()) == ["0", "1"]
    (root / "etc/order").unlink()
    history = (root / "var/lib/nodegate/g/second/history.json").read_text()
    # A failed step, then a refused one (the image's version is not the one asked for): nothing after either runs.
    for turns, head in (("turns-2", ("failing", failing, "1.0.0")), ("turns-3", ("first", first, "9.9.9"))):
        ran = _in_turn(root, tmp_path, tmp_path / turns, [head, ("second", second, "1.0.0")])
        assert [code for code, _ in ran] == [1 if head[0] == "failing" else 2, 3]
        assert ran[1][1]["ok"] is False and ran[1][1]["package"] == "second"
        assert ran[1][1]["message"] == "not run: the step before it in this pod did not succeed"
        assert not (root / "etc/order").exists()
        assert (root / "var/lib/nodegate/g/second/history.json").read_text() == history


def test_package_test_reports_the_failing_stage_and_where_its_log_is(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: s, command: 'touch /etc/x'}]
        apply-check: [{name: c, command: 'test -e /etc/x'}]
        uninstall: [{name: u, command: 'echo "cannot remove" >&2; exit 1'}]
        uninstall-check: [{name: uc, command: 'test ! -e /etc/x'}]
    """)
    (pkg / "Dockerfile").write_text("FROM busybox\nCOPY . /nodegate-package/\n")
    assert main(["package", "test", str(pkg), "--root", str(root)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("PASS  apply ")
    assert out[1].startswith("PASS  apply again ")
    assert out[2] == "FAIL  uninstall          uninstall/u exited 1 (accepted: 0)"
    assert out[3].startswith("      log: ") and out[3].endswith("-uninstall.log")
    assert out[-1] == "FAILED"


def test_package_test_refuses_a_package_that_does_not_lint(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pkg = make_package(tmp_path, "apply: [{name: s, command: 'touch /etc/x'}]\n")
    assert main(["package", "test", str(pkg), "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "error: package.yaml: stages.apply has steps but stages.apply-check is empty" in out
    assert not (root / "etc/x").exists()


def test_package_test_runs_apply_again_as_after_a_power_cut_and_fails_a_step_that_is_not_safe_to_rerun(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `mkdir` without -p fails when the first run made the directory: a node that lost power after this
    # step would fail its retried stage. `idempotent: true` does not hide it: the second apply runs
    # every step, as a power cut can land between a step's end and its record.
    pkg = make_package(tmp_path, """
        apply: [{name: s, command: 'mkdir /etc/made-once', idempotent: true}]
        apply-check: [{name: c, command: 'test -d /etc/made-once'}]
        uninstall: [{name: u, command: 'rmdir /etc/made-once'}]
        uninstall-check: [{name: uc, command: 'test ! -e /etc/made-once'}]
    """)
    (pkg / "Dockerfile").write_text("FROM busybox\nCOPY . /nodegate-package/\n")
    assert main(["package", "test", str(pkg), "--root", str(root)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("PASS  apply "), out
    assert out[1].startswith("FAIL  apply again ") and "apply/s exited 1" in out[1], out
