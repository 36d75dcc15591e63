"""Planning a stage: order, arguments, environment precedence, idempotent skips — no processes involved."""

from __future__ import annotations

import textwrap

from gate.agent.history import History, with_step_done
from gate.agent.loader import parse_manifest
from gate.agent.package import PackageManifest
from gate.agent.plan import HOST_PATH, Places, StageRequest, plan_stage

HOST = Places(root="/", package_dir="/var/lib/nodegate/g/p/package/2.0.0", config_dir="/cfg", state_dir="/data")
AGENT = Places(root="/host", package_dir="/host/var/lib/nodegate/g/p/package/2.0.0", config_dir="/host/cfg",
               state_dir="/host/data")


def manifest(stages: str, env: str = "") -> PackageManifest:
    head = "apiVersion: nodegate.io/v1alpha1\nkind: Package\nname: pkg\nversion: 2.0.0\n"
    return parse_manifest(head + textwrap.dedent(env) + "stages:\n" + textwrap.indent(textwrap.dedent(stages), "  "))


def request(stage: str = "apply", generation: int = 3, previous: str | None = None) -> StageRequest:
    return StageRequest(stage=stage, gate="g", package="p", version="2.0.0", generation=generation,  # type: ignore[arg-type]
                        previous_version=previous)


def empty() -> History:
    return History(gate="g", package="p")


def test_a_stage_runs_its_steps_then_its_checks_in_file_order() -> None:
    m = manifest("""
        apply-check: [{name: c1, command: 'true'}]
        apply: [{name: s1, command: 'true'}, {name: s2, command: 'true'}]
        config: [{name: other, command: 'true'}]
    """)
    plan = plan_stage(m, request(), empty(), {}, HOST, AGENT)
    assert [i.label for i in plan] == ["apply/s1", "apply/s2", "apply-check/c1"]


def test_post_interrupt_runs_only_its_checks() -> None:
    m = manifest("""
        apply: [{name: s1, command: 'true'}]
        post-interrupt-check: [{name: live, command: 'true'}]
    """)
    assert [i.label for i in plan_stage(m, request("post-interrupt"), empty(), {}, HOST, AGENT)] == [
        "post-interrupt-check/live"
    ]


def test_a_host_script_runs_by_its_path_inside_the_chroot_and_a_pod_script_by_the_mounted_path() -> None:
    m = manifest("""
        apply:
          - {name: host, script: bin/a.sh, args: [x]}
          - {name: pod, script: bin/b.sh, onHost: false}
    """)
    host, pod = plan_stage(m, request(), empty(), {}, HOST, AGENT)[:2]
    assert (host.argv, host.chroot, host.cwd) == (("/var/lib/nodegate/g/p/package/2.0.0/bin/a.sh", "x"), True,
                                                 HOST.package_dir)
    assert (pod.argv, pod.chroot, pod.cwd) == (("/host/var/lib/nodegate/g/p/package/2.0.0/bin/b.sh",), False,
                                              AGENT.package_dir)
    assert host.env["NODEGATE_ROOT"] == "/" and pod.env["NODEGATE_ROOT"] == "/host"


def test_an_inline_command_gets_its_args_as_positional_parameters() -> None:
    m = manifest("apply: [{name: say, command: 'echo \"$1\"', args: [hello, world]}]")
    (step,) = plan_stage(m, request(), empty(), {}, HOST, AGENT)
    assert step.argv == ("/bin/sh", "-c", 'echo "$1"', "nodegate-say", "hello", "world")


def test_upgrade_steps_get_previous_and_new_version_first_but_upgrade_checks_only_in_env() -> None:
    m = manifest("""
        upgrade: [{name: move, script: up.sh, args: [--keep]}]
        upgrade-check: [{name: moved, script: check.sh, args: [--strict]}]
    """)
    step, check = plan_stage(m, request("upgrade", previous="1.4.0"), empty(), {}, HOST, AGENT)
    assert step.argv[1:] == ("1.4.0", "2.0.0", "--keep")
    assert check.argv[1:] == ("--strict",)
    for invocation in (step, check):
        assert (invocation.env["NODEGATE_PREVIOUS_VERSION"], invocation.env["NODEGATE_VERSION"]) == ("1.4.0", "2.0.0")


def test_environment_precedence_package_then_gate_then_step_then_agent() -> None:
    m = manifest(
        "apply: [{name: s, command: 'true', env: {FROM_STEP: step, BOTH: step}}]",
        env="env: {FROM_PACKAGE: package, OVERRIDDEN: package, BOTH: package}\n"
            "gateEnv: {OVERRIDDEN: {pattern: '[a-z]*'}, BOTH: {pattern: '[a-z]*'}}\n",
    )
    # What check_gate_env let through; a name the package does not declare never reaches a step.
    gate_env = {"OVERRIDDEN": "gate", "BOTH": "gate", "UNDECLARED": "gate"}
    (step,) = plan_stage(m, request(), empty(), gate_env, HOST, AGENT)
    env = step.env
    assert (env["FROM_PACKAGE"], env["OVERRIDDEN"], env["BOTH"]) == ("package", "gate", "step")
    assert env["FROM_STEP"] == "step"
    assert "UNDECLARED" not in env
    assert "NODEGATE_PREVIOUS_VERSION" not in env  # the agent's resolved values only
    assert env["NODEGATE_STAGE"] == "apply" and env["NODEGATE_STEP"] == "s" and env["NODEGATE_GENERATION"] == "3"
    assert env["NODEGATE_CONFIG_DIR"] == "/cfg" and env["NODEGATE_STATE_DIR"] == "/data"
    assert env["PATH"] == HOST_PATH  # never the container image's PATH inside the host


def test_a_step_gets_declared_names_and_nodegates_own_only() -> None:
    m = manifest("apply: [{name: s, command: 'true', onHost: false}, {name: h, command: 'true'}]")
    for step in plan_stage(m, request(), empty(), {}, HOST, AGENT):
        assert step.env["PATH"] == HOST_PATH and step.env["HOME"] == "/root"
        assert {k for k in step.env if not k.startswith("NODEGATE_")} == {"PATH", "HOME"}


def test_checks_see_their_own_list_name_as_the_stage() -> None:
    m = manifest("apply-check: [{name: c, command: 'true'}]")
    (check,) = plan_stage(m, request(), empty(), {}, HOST, AGENT)
    assert check.env["NODEGATE_STAGE"] == "apply-check" and check.is_check


def test_an_idempotent_step_is_skipped_only_for_the_same_version_and_generation() -> None:
    m = manifest("apply: [{name: slow, command: 'true', idempotent: true}, {name: fast, command: 'true'}]")
    done = with_step_done(empty(), "apply", "slow", "2.0.0", 3, "t")
    slow, fast = plan_stage(m, request(generation=3), done, {}, HOST, AGENT)
    assert slow.skip_reason == "already done for version 2.0.0 at generation 3"
    assert fast.skip_reason is None
    newer_generation = plan_stage(m, request(generation=4), done, {}, HOST, AGENT)[0]
    assert newer_generation.skip_reason is None
    other_version = with_step_done(empty(), "apply", "slow", "1.0.0", 3, "t")
    assert plan_stage(m, request(generation=3), other_version, {}, HOST, AGENT)[0].skip_reason is None


def test_a_non_idempotent_step_runs_even_when_recorded_done() -> None:
    m = manifest("apply: [{name: s, command: 'true'}]")
    done = with_step_done(empty(), "apply", "s", "2.0.0", 3, "t")
    assert plan_stage(m, request(), done, {}, HOST, AGENT)[0].skip_reason is None


def test_every_step_gets_the_nodes_name_rollout_place_and_fact_files_where_it_sees_them() -> None:
    from gate.api.facts import OperatorFacts, RolloutPlace

    m = manifest("apply: [{name: host, command: 'true'}, {name: pod, command: 'true', onHost: false}]")
    facts = OperatorFacts(node="node-7", labels={"pool": "gpu"}, rollout=RolloutPlace(compartment="canary", batch=2))
    host = Places(root="/", package_dir="/p", config_dir="/c", state_dir="/d", facts_dir="/var/lib/ng/node")
    agent = Places(root="/host", package_dir="/host/p", config_dir="/host/c", state_dir="/host/d",
                   facts_dir="/host/var/lib/ng/node")
    environ = {"NODEGATE_NODE": "stale-from-the-pod", "NODEGATE_BATCH": "9"}
    on_host, in_pod = plan_stage(m, request(), empty(), environ, host, agent, facts)
    assert on_host.env["NODEGATE_NODE"] == "node-7" and in_pod.env["NODEGATE_NODE"] == "node-7"
    assert (on_host.env["NODEGATE_COMPARTMENT"], on_host.env["NODEGATE_BATCH"]) == ("canary", "2")
    assert on_host.env["NODEGATE_NODE_FACTS"] == "/var/lib/ng/node/facts.json"
    assert on_host.env["NODEGATE_NODE_LABELS"] == "/var/lib/ng/node/labels"
    assert on_host.env["NODEGATE_NODE_INSTALLED"] == "/var/lib/ng/node/installed"
    assert in_pod.env["NODEGATE_NODE_FACTS"] == "/host/var/lib/ng/node/facts.json"
