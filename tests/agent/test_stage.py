"""`nodegate agent run` against a real chroot: steps, checks, idempotence, upgrades, config, logs, refusals."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gate.agent.logs import KEEP_RUNS, KEEP_VERSIONS
from tests.agent.conftest import REPO, Agent
from tests.agent.packaging import configmap, make_package

pytestmark = pytest.mark.usefixtures("clean_env")

STATE = "var/lib/nodegate/test-gate/demo-pkg"
LOGS = "var/log/nodegate/test-gate/demo-pkg"


def tree(root: Path) -> dict[str, bytes | str]:
    """Everything under a root: to prove a refused run changed nothing."""
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes()
        elif path.is_dir():
            out[rel] = "dir"
    return out


def test_host_steps_run_chrooted_and_pod_steps_see_the_host_at_nodegate_root(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply:
          - {name: on-host, command: 'cat /etc/hostname > /etc/seen-from-host; pwd > /etc/cwd'}
          - {name: in-pod, command: 'echo "$NODEGATE_ROOT" > "$NODEGATE_ROOT/etc/root-from-pod"', onHost: false}
        apply-check:
          - {name: both-ran, command: 'test -s /etc/seen-from-host && test -s /etc/root-from-pod'}
    """)
    run = agent.run("apply", pkg)
    assert run.code == 0, run.summary
    assert (agent.root / "etc/seen-from-host").read_text() == "fake-node\n"  # the test root's, not this machine's
    assert (agent.root / "etc/cwd").read_text() == f"/{STATE}/package/1.0.0\n"
    assert (agent.root / "etc/root-from-pod").read_text() == f"{agent.root}\n"
    assert run.summary == {**run.summary, "package": "demo-pkg", "version": "1.0.0", "stage": "apply", "ok": True,
                           "failedStep": None, "exitCode": 0, "message": "3 steps passed"}


def test_the_payload_is_copied_onto_the_host_and_scripts_run_from_there(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: s, script: scripts/s.sh, args: [one, two words]}]
        apply-check: [{name: c, command: 'test -e /tmp/args'}]
    """, scripts={"scripts/s.sh": 'printf "%s|" "$0" "$@" > /tmp/args\n'})
    assert agent.run("apply", pkg).code == 0
    assert (agent.root / "tmp/args").read_text() == f"/{STATE}/package/1.0.0/scripts/s.sh|one|two words|"
    assert (agent.root / STATE / "package/1.0.0/package.yaml").read_text() == (pkg / "package.yaml").read_text()


def test_a_failing_check_fails_the_stage_with_the_tail_of_its_output(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: s, command: 'true'}]
        apply-check:
          - name: c
            command: |
              i=0; while [ $i -lt 300 ]; do echo "noise $i"; i=$((i+1)); done
              echo "value is 3, want 4"; exit 4
    """)
    run = agent.run("apply", pkg)
    assert run.code == 1
    assert (run.summary["ok"], run.summary["failedStep"], run.summary["exitCode"]) == (False, "apply-check/c", 4)
    message = str(run.summary["message"])
    assert message.startswith("apply-check/c exited 4 (accepted: 0)\n")
    assert message.endswith("noise 299\nvalue is 3, want 4") and "noise 0\n" not in message
    assert len(agent.termination_log.read_bytes()) <= 4096
    history = json.loads((agent.root / STATE / "history.json").read_text())
    assert history["installed"] is None  # a stage whose check failed installs nothing


def test_a_failing_step_stops_the_stage_before_later_steps_and_checks(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply:
          - {name: breaks, command: 'echo broken >&2; exit 2'}
          - {name: later, command: 'touch /tmp/later'}
        apply-check: [{name: c, command: 'touch /tmp/checked'}]
    """)
    run = agent.run("apply", pkg)
    assert (run.code, run.summary["failedStep"], run.summary["exitCode"]) == (1, "apply/breaks", 2)
    assert "broken" in str(run.summary["message"])  # stderr is part of the output
    assert not (agent.root / "tmp/later").exists() and not (agent.root / "tmp/checked").exists()


def test_accepted_exit_codes_count_as_success(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: nothing-to-do, command: 'exit 3', acceptedExitCodes: [0, 3]}]
        apply-check: [{name: c, command: 'true'}]
    """)
    assert agent.run("apply", pkg).code == 0


def test_a_command_missing_in_the_host_is_a_failed_step_not_a_crash(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: s, script: scripts/s.sh}]
        apply-check: [{name: c, command: 'true'}]
    """)
    script = pkg / "scripts/s.sh"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/python3-not-on-this-host\n")
    script.chmod(0o755)
    run = agent.run("apply", pkg)
    assert (run.code, run.summary["failedStep"], run.summary["exitCode"]) == (1, "apply/s", 127)
    assert "cannot start" in str(run.summary["message"])


def test_a_step_past_its_timeout_is_killed_with_its_children(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: hangs, command: 'sleep 60 & sleep 60', timeout: 1s}]
        apply-check: [{name: c, command: 'true'}]
    """)
    run = agent.run("apply", pkg)
    assert (run.code, run.summary["failedStep"]) == (1, "apply/hangs")
    assert "timed out" in str(run.summary["message"])
    assert processes_in(agent.root) == []  # the background sleep went too


def test_past_the_stages_timeout_the_running_step_is_stopped_and_no_other_starts(agent: Agent, tmp_path: Path) -> None:
    """One stage pod runs several stages one after another: each is bounded by its own timeout."""
    pkg = make_package(tmp_path, """
        apply:
          - {name: slow, command: 'trap "echo cleaned > /tmp/cleaned; exit 0" TERM; while :; do sleep 0.1; done'}
          - {name: after, command: 'touch /tmp/after'}
        apply-check: [{name: c, command: 'true'}]
    """)
    run = agent.run("apply", pkg, "--timeout", "1.5")
    assert (run.code, run.summary["failedStep"]) == (1, "apply/slow")
    assert "the stage timed out after 1.5s in apply/slow" in str(run.summary["message"])
    assert (agent.root / "tmp/cleaned").read_text() == "cleaned\n"  # it got SIGTERM and cleaned up
    assert not (agent.root / "tmp/after").exists()
    assert processes_in(agent.root) == []


def test_sigterm_to_the_agent_reaches_the_running_step_which_cleans_up_and_fails_the_stage(
    root: Path, tmp_path: Path
) -> None:
    """Like the kubelet stopping the stage pod (its deadline, a deletion): SIGTERM to the agent process."""
    pkg = make_package(tmp_path, """
        apply:
          - name: works
            command: 'trap "echo cleaned > /tmp/cleaned; exit 0" TERM; touch /tmp/ready; while :; do sleep 0.1; done'
          - {name: later, command: 'touch /tmp/later'}
        apply-check: [{name: c, command: 'touch /tmp/checked'}]
    """)
    log = tmp_path / "termination-log"
    proc = _agent_process(root, pkg, log)
    try:
        deadline = time.monotonic() + 60
        while not (root / "tmp/ready").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the step never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, output
    assert (root / "tmp/cleaned").read_text() == "cleaned\n"  # the step's own cleanup ran
    summary = json.loads(log.read_text())
    # Failed even though the cleanup exited 0: the step did not do its work; nothing after it ran.
    assert (summary["ok"], summary["failedStep"]) == (False, "apply/works")
    assert "was stopped with the pod: SIGTERM passed on to it" in summary["message"]
    assert not (root / "tmp/later").exists() and not (root / "tmp/checked").exists()
    assert processes_in(root) == []
    # The agent lived to record the run: the host's history and log say it failed.
    history = json.loads((root / STATE / "history.json").read_text())
    assert history["runs"][-1]["ok"] is False, history
    [run_log] = (root / LOGS / "1.0.0").glob("*-apply.log")
    assert "Finished stage apply: FAILED" in run_log.read_text()


def _agent_process(root: Path, pkg: Path, log: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gate.cli.main", "agent", "run", "--stage", "apply", "--package", "demo-pkg",
         "--version", "1.0.0", "--gate", "test-gate", "--generation", "1", "--root", str(root), "--payload", str(pkg),
         "--termination-log", str(log)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def test_sigterm_before_the_first_step_starts_no_step(root: Path, tmp_path: Path) -> None:
    """SIGTERM while the agent waits for the package's lock (a retry behind a terminating pod): the host
    files are laid down as usual, then no step runs and the stage fails saying why."""
    pkg = make_package(tmp_path, """
        apply: [{name: first, command: 'touch /tmp/first'}]
        apply-check: [{name: c, command: 'touch /tmp/checked'}]
    """)
    lock_path = root / STATE / "lock"
    lock_path.parent.mkdir(parents=True)
    log = tmp_path / "termination-log"
    with open(lock_path, "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        proc = _agent_process(root, pkg, log)
        try:
            deadline = time.monotonic() + 60
            while not _has_open(proc.pid, lock_path):  # it opens the lock, then blocks on it
                assert proc.poll() is None and time.monotonic() < deadline, "the agent never reached the lock"
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            assert proc.poll() is None  # handled: it keeps waiting for the lock, then stops cleanly
            fcntl.flock(held.fileno(), fcntl.LOCK_UN)
            output, _ = proc.communicate(timeout=60)
        finally:
            proc.kill()
    assert proc.returncode == 1, output
    summary = json.loads(log.read_text())
    assert (summary["ok"], summary["failedStep"]) == (False, "apply/first")
    assert "not started: the agent got SIGTERM" in summary["message"]
    assert not (root / "tmp/first").exists() and not (root / "tmp/checked").exists()


def _has_open(pid: int, path: Path) -> bool:
    try:
        return any(os.readlink(fd) == str(path) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


def processes_in(root: Path) -> list[int]:
    """Processes still running chrooted into `root` (their /proc/<pid>/root points there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "root") == str(root):
                    found.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile, or not ours to inspect
    return found


COUNTING = """
    apply:
      - {name: expensive, command: 'echo x >> /var/tmp-expensive', idempotent: true}
      - {name: cheap, command: 'echo x >> /var/tmp-cheap'}
      - {name: flaky, command: 'test ! -e /etc/break-flaky'}
    apply-check: [{name: c, command: 'echo x >> /var/tmp-checks'}]
"""


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_idempotent_steps_run_once_per_version_and_generation_across_reruns(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, COUNTING)
    first = agent.run("apply", pkg, generation=5)
    second = agent.run("apply", pkg, generation=5)
    assert (first.code, second.code) == (0, 0)
    assert second.summary["message"] == "3 steps passed, 1 skipped (already done)"
    root = agent.root
    counts = [lines(root / f"var/tmp-{name}") for name in ("expensive", "cheap", "checks")]
    assert counts == [1, 2, 2]
    assert agent.run("apply", pkg, generation=6).code == 0  # the gate changed: do it again
    assert lines(root / "var/tmp-expensive") == 2


def test_a_retry_after_a_failure_skips_the_idempotent_steps_that_already_succeeded(
    agent: Agent, tmp_path: Path
) -> None:
    pkg = make_package(tmp_path, COUNTING)
    (agent.root / "etc/break-flaky").write_text("")
    assert agent.run("apply", pkg).summary["failedStep"] == "apply/flaky"
    (agent.root / "etc/break-flaky").unlink()
    assert agent.run("apply", pkg).code == 0
    assert (lines(agent.root / "var/tmp-expensive"), lines(agent.root / "var/tmp-cheap")) == (1, 2)


def test_reinstalling_after_uninstall_runs_idempotent_steps_again(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, COUNTING + """
    uninstall: [{name: u, command: 'true'}]
    uninstall-check: [{name: uc, command: 'true'}]
""")
    for stage in ("apply", "uninstall", "apply"):
        assert agent.run(stage, pkg).code == 0
    assert lines(agent.root / "var/tmp-expensive") == 2


UPGRADE = """
    apply: [{name: s, command: 'true'}]
    apply-check: [{name: c, command: 'true'}]
    upgrade:
      - name: move
        command: 'echo "$1 $2 $3 | $NODEGATE_PREVIOUS_VERSION $NODEGATE_VERSION" > /etc/upgrade-seen'
        args: [--extra]
    upgrade-check: [{name: uc, command: 'echo "$# $NODEGATE_PREVIOUS_VERSION" > /etc/upgrade-check-seen'}]
"""


def test_upgrade_gets_the_previous_version_from_the_hosts_history(agent: Agent, tmp_path: Path) -> None:
    old = make_package(tmp_path, UPGRADE, version="1.0.0")
    new = make_package(tmp_path, UPGRADE, version="1.1.0")
    assert agent.run("apply", old, version="1.0.0").code == 0
    run = agent.run("upgrade", new, "--previous-version", "0.9.0", version="1.1.0")  # the operator is wrong
    assert run.code == 0, run.summary
    assert (agent.root / "etc/upgrade-seen").read_text() == "1.0.0 1.1.0 --extra | 1.0.0 1.1.0\n"
    assert (agent.root / "etc/upgrade-check-seen").read_text() == "0 1.0.0\n"
    history = json.loads((agent.root / STATE / "history.json").read_text())
    assert (history["installed"], history["previous"]) == ("1.1.0", "1.0.0")
    log = next((agent.root / LOGS / "1.1.0").glob("*-upgrade.log")).read_text()
    assert "the host records 1.0.0 as the previous version, not 0.9.0" in log
    # Both versions' payloads are kept (a rollback needs the old scripts); nothing older is.
    assert sorted(p.name for p in (agent.root / STATE / "package").iterdir()) == ["1.0.0", "1.1.0"]


def test_upgrade_on_a_host_without_history_uses_the_given_previous_version(agent: Agent, tmp_path: Path) -> None:
    new = make_package(tmp_path, UPGRADE, version="1.1.0")
    assert agent.run("upgrade", new, "--previous-version", "1.0.0", version="1.1.0").code == 0
    assert (agent.root / "etc/upgrade-seen").read_text() == "1.0.0 1.1.0 --extra | 1.0.0 1.1.0\n"


def test_upgrade_with_no_known_previous_version_is_refused_before_touching_the_host(
    agent: Agent, tmp_path: Path
) -> None:
    new = make_package(tmp_path, UPGRADE, version="1.1.0")
    run = agent.run("upgrade", new, version="1.1.0")
    assert run.code == 2
    assert "no previous version is recorded on the host and none was given" in str(run.summary["message"])
    assert not (agent.root / "etc/upgrade-seen").exists()


ANY_CONF = 'config: {keys: {"*.conf": {}}}\n'


def test_config_files_from_the_configmap_are_visible_and_follow_changes(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        config:
          - name: show
            command: 'ls "$NODEGATE_CONFIG_DIR" > /etc/config-keys; cat "$NODEGATE_CONFIG_DIR/a.conf" > /etc/a.conf'
        config-check: [{name: same, command: 'cmp "$NODEGATE_CONFIG_DIR/a.conf" /etc/a.conf'}]
        apply: [{name: s, command: 'true'}]
        apply-check: [{name: c, command: 'true'}]
    """, header=ANY_CONF)
    mount = configmap(tmp_path / "cm", {"a.conf": "alpha=1\n", "b.conf": "beta\n"})
    assert agent.run("config", pkg, config_dir=mount).code == 0
    assert (agent.root / "etc/config-keys").read_text() == "a.conf\nb.conf\n"  # ..data is not a key
    assert (agent.root / "etc/a.conf").read_text() == "alpha=1\n"
    configmap(mount, {"a.conf": "alpha=2\n"})
    assert agent.run("config", pkg, config_dir=mount, generation=2).code == 0
    assert (agent.root / "etc/config-keys").read_text() == "a.conf\n"
    assert (agent.root / "etc/a.conf").read_text() == "alpha=2\n"


@pytest.mark.parametrize("stage", ["config", "uninstall"])
def test_a_configmap_that_is_not_the_one_the_operator_rendered_is_refused_before_the_host_is_touched(
        agent: Agent, tmp_path: Path, stage: str) -> None:
    """The operator's stage pod carries the digest of the config it rendered; the ConfigMap the kubelet
    mounts (replaced, or created ahead under the content-addressed name) is held against it. Uninstall
    is no exception: a node may leave a gate with a config that breaks the declarations, not with one
    someone swapped in."""
    from gate.api.nodegate import NodeGate
    from gate.controller.pods import config_map, stage_pod
    from gate.controller.settings import OperatorSettings
    from gate.lifecycle.node import PodRequest, Step

    g = NodeGate.model_validate({"metadata": {"name": "test-gate", "uid": "u-1"}, "spec": {"packages": {
        "demo-pkg": {"version": "1.0.0", "image": "example.com/demo", "config": {"a.conf": "alpha=1\n"}}}}})
    settings = OperatorSettings(namespace="ng")
    pod = stage_pod(g, "n", PodRequest(name="p", kind="stages", steps=(Step("demo-pkg", stage, "f"),)), settings)
    args = pod["spec"]["containers"][0]["args"]
    digest = args[args.index("--config-digest") + 1]
    pkg = make_package(tmp_path, """
        config: [{name: show, command: 'cat "$NODEGATE_CONFIG_DIR/a.conf" > /etc/a.conf'}]
        config-check: [{name: c, command: 'true'}]
        uninstall: [{name: u, command: 'cat "$NODEGATE_CONFIG_DIR/a.conf" > /etc/a.conf'}]
        uninstall-check: [{name: c, command: 'true'}]
    """, header=ANY_CONF)
    mount = configmap(tmp_path / "cm", {"a.conf": "alpha=1\n", "evil.conf": "x\n"})
    before = tree(agent.root)
    run = agent.run(stage, pkg, "--config-digest", digest, config_dir=mount)
    assert run.code == 2 and run.summary["ok"] is False
    message = str(run.summary["message"])
    assert f"but the operator started this stage with config digest {digest}" in message
    assert "(keys: a.conf, evil.conf)" in message and "sha256:" in message.replace(digest, "")
    assert tree(agent.root) == before
    configmap(mount, config_map(g, "demo-pkg", settings)["data"])  # what the operator rendered
    assert agent.run(stage, pkg, "--config-digest", digest, config_dir=mount).code == 0
    assert (agent.root / "etc/a.conf").read_text() == "alpha=1\n"


DECLARED = """\
    config:
      keys:
        mode: {type: enum, enum: [fast, safe], required: true}
        workers: {type: int, default: 4}
    """


def test_declared_config_keys_reach_the_steps_with_their_defaults(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        config:
          - name: show
            command: 'cd "$NODEGATE_CONFIG_DIR" && for k in *; do echo "$k=$(cat $k)"; done > /etc/seen'
        config-check: [{name: c, command: 'test -s /etc/seen'}]
    """, header=DECLARED)
    assert agent.run("config", pkg, config_dir=configmap(tmp_path / "cm", {"mode": "safe\n"})).code == 0
    assert (agent.root / "etc/seen").read_text() == "mode=safe\nworkers=4\n"


def test_a_config_against_the_declared_keys_is_refused_before_any_step_but_uninstall_goes_on(
    agent: Agent, tmp_path: Path
) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: s, command: 'touch /etc/applied'}]
        apply-check: [{name: c, command: 'true'}]
        uninstall: [{name: u, command: 'cat "$NODEGATE_CONFIG_DIR/workers" > /etc/uninstalled'}]
        uninstall-check: [{name: c, command: 'true'}]
    """, header=DECLARED)
    mount = configmap(tmp_path / "cm", {"mode": "quick", "workers": "many"})
    before = tree(agent.root)
    run = agent.run("apply", pkg, config_dir=mount)
    assert run.code == 2
    assert run.summary["message"] == (
        "config key 'mode': 'quick' is not one of fast, safe; config key 'workers': 'many' is not an integer")
    assert tree(agent.root) == before
    run = agent.run("uninstall", pkg, config_dir=mount)
    assert run.code == 0, run.summary
    # The value against its rule is left out, so the step sees the declared default.
    assert (agent.root / "etc/uninstalled").read_text() == "4"


def test_the_gates_env_overrides_package_defaults_and_the_step_overrides_both(
    agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = make_package(tmp_path, """
        apply:
          - name: s
            command: 'echo "$A $B $C $NODEGATE_STAGE $NODEGATE_GATE $NODEGATE_GENERATION" > /etc/env'
            env: {C: step}
        apply-check: [{name: c, command: 'true'}]
    """, header="env: {A: package, B: package, C: package}\n"
              "gateEnv: {B: {pattern: '[a-z]+'}, C: {pattern: '[a-z]+'}}\n")
    monkeypatch.setenv("B", "gate")
    monkeypatch.setenv("C", "gate")
    assert agent.run("apply", pkg, generation=4).code == 0
    assert (agent.root / "etc/env").read_text() == "package gate step apply test-gate 4\n"


def test_each_run_is_logged_per_version_and_old_logs_are_pruned(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: s, command: 'echo step-output-here'}]
        apply-check: [{name: c, command: 'true'}]
    """)
    logs = agent.root / LOGS
    for version in ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0"):
        (logs / version).mkdir(parents=True)
        (logs / version / f"2020010{version[2]}T000000.000000Z-apply.log").write_text("old\n")
    for i in range(KEEP_RUNS + 3):
        (logs / "1.0.0").mkdir(parents=True, exist_ok=True)
        (logs / "1.0.0" / f"20200101T0000{i:02d}.000000Z-apply.log").write_text("old\n")
    assert agent.run("apply", pkg).code == 0
    kept = sorted((logs / "1.0.0").iterdir())
    assert len(kept) == KEEP_RUNS
    assert "[apply/s] step-output-here" in kept[-1].read_text()
    assert len([d for d in logs.iterdir()]) == KEEP_VERSIONS
    assert not (logs / "0.1.0").exists() and not (logs / "0.2.0").exists() and (logs / "0.6.0").exists()


def test_the_overlay_is_laid_down_and_uninstall_restores_what_it_replaced(agent: Agent, tmp_path: Path) -> None:
    (agent.root / "etc/motd").write_text("the original motd\n")
    (agent.root / "usr/lib/conf.d").mkdir(parents=True)
    (agent.root / "etc/conf.d").symlink_to("/usr/lib/conf.d")  # absolute: must resolve inside the root
    pkg = make_package(tmp_path, """
        apply-check: [{name: c, command: 'grep -q ours /etc/motd && test -e /etc/conf.d/x.conf'}]
        uninstall-check: [{name: u, command: 'grep -q original /etc/motd && test ! -e /etc/conf.d/x.conf'}]
    """, overlay={"etc/motd": "ours\n", "etc/conf.d/x.conf": "x=1\n", "etc/nodegate-demo/new.conf": "new\n"})
    (pkg / "root/etc/motd").chmod(0o600)
    assert agent.run("apply", pkg).code == 0
    assert (agent.root / "etc/motd").read_text() == "ours\n"
    assert (agent.root / "etc/motd").stat().st_mode & 0o777 == 0o600
    assert (agent.root / "usr/lib/conf.d/x.conf").read_text() == "x=1\n"
    assert agent.run("apply", pkg).code == 0  # a rerun must not save our own file as the original
    run = agent.run("uninstall", pkg)
    assert run.code == 0, run.summary
    assert (agent.root / "etc/motd").read_text() == "the original motd\n"
    assert not (agent.root / "etc/nodegate-demo/new.conf").exists()
    # Only the history and the logs stay behind.
    assert sorted(p.name for p in (agent.root / STATE).iterdir()) == ["history.json", "lock"]


def test_an_upgrade_that_drops_an_overlay_file_removes_it(agent: Agent, tmp_path: Path) -> None:
    stages = "apply-check: [{name: c, command: 'true'}]\nupgrade-check: [{name: c, command: 'true'}]\n"
    old = make_package(tmp_path, stages, version="1.0.0", overlay={"etc/a": "a\n", "etc/b": "b\n"})
    new = make_package(tmp_path, stages, version="2.0.0", overlay={"etc/a": "a2\n"})
    assert agent.run("apply", old, version="1.0.0").code == 0
    assert agent.run("upgrade", new, version="2.0.0").code == 0
    assert (agent.root / "etc/a").read_text() == "a2\n" and not (agent.root / "etc/b").exists()


@pytest.mark.parametrize(
    ("breakage", "expected"),
    [
        ("bad-yaml", "package.yaml: stages.apply[0].onhost: unknown field"),
        ("missing-script", "script scripts/s.sh: no such file in the package"),
        ("missing-overlay", "root root: no such directory in the package"),
        ("wrong-name", "is demo-pkg 1.0.0, but the stage is for other-pkg 1.0.0"),
        ("missing-root", "does not exist or is not a directory"),
        ("root-without-shell", "has no /bin/sh"),
        ("missing-config-dir", "config directory"),
    ],
)
def test_a_refused_run_exits_2_with_a_clear_summary_and_changes_nothing_on_the_host(
    agent: Agent, tmp_path: Path, breakage: str, expected: str
) -> None:
    pkg = make_package(tmp_path, """
        apply: [{name: s, script: scripts/s.sh}]
        apply-check: [{name: c, command: 'true'}]
    """, scripts={"scripts/s.sh": "touch /etc/applied\n"}, overlay={"etc/overlaid": "x\n"})
    args: dict[str, object] = {}
    if breakage == "bad-yaml":
        manifest = pkg / "package.yaml"
        manifest.write_text(manifest.read_text().replace("script:", "onhost: true, script:"))
    elif breakage == "missing-script":
        (pkg / "scripts/s.sh").unlink()
    elif breakage == "missing-overlay":
        for f in (pkg / "root/etc").iterdir():
            f.unlink()
        (pkg / "root/etc").rmdir()
        (pkg / "root").rmdir()
    elif breakage == "wrong-name":
        args["package"] = "other-pkg"
    elif breakage == "missing-root":
        agent.root = tmp_path / "no-such-root"
    elif breakage == "root-without-shell":
        (agent.root / "usr/bin/sh").unlink()
    elif breakage == "missing-config-dir":
        args["config_dir"] = tmp_path / "no-configmap"
    before = tree(agent.root) if agent.root.exists() else {}
    run = agent.run("apply", pkg, **args)  # type: ignore[arg-type]
    assert run.code == 2
    assert run.summary["ok"] is False and expected in str(run.summary["message"])
    assert (tree(agent.root) if agent.root.exists() else {}) == before


def test_steps_see_the_nodes_facts_from_the_operators_file_and_what_the_host_has_installed(
        agent: Agent, tmp_path: Path) -> None:
    from gate.api.facts import FACTS_ANNOTATION
    from gate.api.nodegate import NodeGate
    from gate.api.state import NodeGateState
    from gate.controller.pods import facts_of, stage_pod
    from gate.controller.settings import OperatorSettings
    from gate.lifecycle.node import PodRequest, Step

    base = make_package(tmp_path / "base", "apply: [{name: s, command: 'true'}]", name="base-sysctl", version="1.2.0")
    assert agent.run("apply", base, package="base-sysctl", version="1.2.0", gate="base").code == 0
    # The file as the kubelet projects it: the annotation of the operator's stage pod.
    node = {"metadata": {"name": "gpu-node-3", "labels": {"pool": "gpu", "zone": "b"},
                         "annotations": {"team": "ml", "nodegate.io/state.test-gate": "{}"}}}
    gate = NodeGate.model_validate({"metadata": {"name": "test-gate"}, "spec": {"packages": {
        "demo-pkg": {"version": "1.0.0", "image": "example.com/demo"}}}})
    request = PodRequest(name="p", kind="stages", steps=(Step("demo-pkg", "apply", "1.0.0", version="1.0.0"),))
    pod = stage_pod(gate, "gpu-node-3", request, OperatorSettings(),
                    facts_of("gpu-node-3", node, NodeGateState(compartment="canary", batch=2)))
    facts_file = tmp_path / "facts.json"
    facts_file.write_text(pod["metadata"]["annotations"][FACTS_ANNOTATION])
    pkg = make_package(tmp_path / "demo", """
        apply:
          - name: on-host
            command: |
              echo "$NODEGATE_NODE $NODEGATE_COMPARTMENT $NODEGATE_BATCH" > /etc/node-env
              cp "$NODEGATE_NODE_FACTS" /etc/facts-seen
              grep '^pool=' "$NODEGATE_NODE_LABELS" > /etc/pool
              cp "$NODEGATE_NODE_INSTALLED" /etc/installed-seen
          - {name: in-pod, command: 'cp "$NODEGATE_NODE_FACTS" "$NODEGATE_ROOT/etc/facts-from-pod"', onHost: false}
    """)
    run = agent.run("apply", pkg, "--node-facts", str(facts_file))
    assert run.code == 0, run.summary
    assert (agent.root / "etc/node-env").read_text() == "gpu-node-3 canary 2\n"
    assert (agent.root / "etc/pool").read_text() == "pool=gpu\n"
    assert (agent.root / "etc/installed-seen").read_text() == "base base-sysctl 1.2.0\n"
    seen = json.loads((agent.root / "etc/facts-seen").read_text())
    assert seen["node"] == "gpu-node-3" and seen["annotations"] == {"team": "ml"}
    assert seen["installed"] == {"base": {"base-sysctl": "1.2.0"}}
    assert seen["rollout"]["compartment"] == "canary" and seen["rollout"]["batch"] == 2
    assert (agent.root / "etc/facts-from-pod").read_text() == (agent.root / "etc/facts-seen").read_text()


def test_without_a_facts_file_steps_still_get_the_node_from_nodegate_node(
        agent: Agent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODEGATE_NODE", "node-from-env")
    pkg = make_package(tmp_path, "apply: [{name: s, command: 'echo \"$NODEGATE_NODE\" > /etc/node'}]")
    assert agent.run("apply", pkg).code == 0
    assert (agent.root / "etc/node").read_text() == "node-from-env\n"


def test_a_missing_facts_file_is_refused_before_the_host_is_touched(agent: Agent, tmp_path: Path) -> None:
    pkg = make_package(tmp_path, "apply: [{name: s, command: 'touch /etc/ran'}]")
    before = tree(agent.root)
    run = agent.run("apply", pkg, "--node-facts", str(tmp_path / "nope.json"))
    assert run.code == 2 and "node facts file" in str(run.summary["message"])
    assert tree(agent.root) == before


def test_the_check_after_the_interrupt_reads_the_payload_the_stage_left_on_the_host(
        agent: Agent, tmp_path: Path) -> None:
    """`--payload-on-host` (the operator's pod after a reboot holds no copy of the payload): the check runs the
    host's copy of the version; without one it is refused naming where it looked; other stages refuse it."""
    pkg = make_package(tmp_path, """
        apply: [{name: s, script: scripts/s.sh}]
        apply-check: [{name: c, command: 'test -e /tmp/applied'}]
        post-interrupt-check: [{name: live, script: scripts/live.sh}]
    """, scripts={"scripts/s.sh": "touch /tmp/applied\n", "scripts/live.sh": "echo from-host > /tmp/checked\n"})
    missing = tmp_path / "no-payload-here"  # what --payload would name: never read with --payload-on-host
    before = tree(agent.root)
    refused = agent.run("post-interrupt", missing, "--payload-on-host")
    assert refused.code != 0 and tree(agent.root) == before
    assert f"/{STATE}/package/1.0.0" in refused.summary["message"], refused.summary
    assert "not on the host" in refused.summary["message"]
    assert agent.run("apply", pkg).code == 0
    wrong = agent.run("uninstall", missing, "--payload-on-host")
    assert wrong.code != 0 and "--payload-on-host is for a stage of the round's window" in wrong.summary["message"]
    run = agent.run("post-interrupt", missing, "--payload-on-host")
    assert run.code == 0, run.summary
    assert (agent.root / "tmp/checked").read_text() == "from-host\n"
    assert (agent.root / STATE / "package/1.0.0/package.yaml").read_text() == (pkg / "package.yaml").read_text()
    # Another version's copy is not this one's.
    other = agent.run("post-interrupt", missing, "--payload-on-host", version="2.0.0")
    assert other.code != 0 and "demo-pkg 2.0.0 is not on the host" in other.summary["message"]


def test_a_stage_reads_the_payload_a_staging_placed_on_the_host_only_from_the_image_it_names(
        agent: Agent, tmp_path: Path) -> None:
    """A staging (`--part serving`, no serving step in the package) only lays the payload on the host and
    records the image it came from; the window's stage then reads that copy (`--payload-on-host`) when the
    record is of the image its own pod names, and is refused, before the host changes, when it is of another
    (an undo of another spec's staging of the same version copied over it) or when there is none."""
    pkg = make_package(tmp_path, """
        apply: [{name: s, script: scripts/s.sh}]
        apply-check: [{name: c, command: 'test -e /tmp/applied'}]
    """, scripts={"scripts/s.sh": "touch /tmp/applied\n"})
    missing = tmp_path / "no-payload-here"
    image = "registry.example.com/demo@sha256:" + "a" * 64
    other = "registry.example.com/demo@sha256:" + "b" * 64
    staged = agent.run("apply", pkg, "--part", "serving", "--payload-image", image)
    assert staged.code == 0, staged.summary
    assert not (agent.root / "tmp/applied").exists()  # no step ran: the payload was only placed
    history = json.loads((agent.root / STATE / "history.json").read_text())
    assert history["payloads"] == {"1.0.0": image}, history
    before = tree(agent.root)
    for named in (other, None):
        refused = agent.run("apply", missing, "--payload-on-host", *(["--payload-image", named] if named else []))
        assert refused.code != 0 and f"came from image {image}" in refused.summary["message"], refused.summary
        assert tree(agent.root) == before
    run = agent.run("apply", missing, "--payload-on-host", "--payload-image", image)
    assert run.code == 0, run.summary
    assert (agent.root / "tmp/applied").exists()
    # A copy from another image (the undo of another spec's staging) takes the record with it.
    assert agent.run("apply", pkg, "--part", "undo", "--payload-image", other).code == 0
    again = agent.run("apply", missing, "--payload-on-host", "--payload-image", image)
    assert again.code != 0 and f"came from image {other}" in again.summary["message"], again.summary
    # A copy laid by hand (no image named) leaves no record: no stage reads it in place of its own.
    assert agent.run("apply", pkg).code == 0
    unknown = agent.run("apply", missing, "--payload-on-host", "--payload-image", image)
    assert unknown.code != 0 and "an image the host has no record of" in unknown.summary["message"]
