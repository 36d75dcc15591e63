"""`nodegate agent ...` (run inside package pods by the operator) and `nodegate package ...` (for authors).

Flags and environment are read here, in one place, into the agent's settings: the operator sets
NODEGATE_GATE, NODEGATE_PACKAGE, NODEGATE_VERSION, NODEGATE_PREVIOUS_VERSION and NODEGATE_STAGE in
the pod and passes the same values as flags; a flag wins over its variable. It also passes the digest
of the config it rendered (`--config-digest`), which the agent holds the mounted ConfigMap against.
The node's facts come in a file (`--node-facts`, projected from the pod's annotation); without one,
NODEGATE_NODE names the node. `--gate-env` lists the names of the gate's env for the package (the rest
of the container's environment is the image's and the kubelet's): the agent holds them against the
package's declarations (`gate.agent.gate_env`) and passes only declared names on to the steps.

The operator starts the agent in an isolated interpreter (`python -I`, `gate.controller.pods`), so no
PYTHON* variable or path that a gate's env or config can reach is read before this code runs.

Exit codes of `agent run` and `agent interrupt`: 0 passed; 1 a step, check or interrupt command
failed; 2 refused before touching the host (bad package, missing root, bad flags); 3 not run, because
the step before it in its pod did not succeed (`--turn`, `gate.agent.turns`). Every exit path that
gets as far as parsing its flags leaves a JSON summary in the termination message.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gate.agent.turns import TURNS_DIR
from gate.cli.errors import CliError

if TYPE_CHECKING:
    from gate.agent.interrupt import InterruptSettings
    from gate.agent.stage import StageSettings

STAGE_CHOICES = ("apply", "config", "upgrade", "uninstall", "post-interrupt", "post-uninstall")
INTERRUPT_CHOICES = ("service", "restartAllServices", "reboot")
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
DEFAULT_PAYLOAD = "/nodegate-payload"
DEFAULT_CONFIG_DIR = "/nodegate-config"
DEFAULT_ROOT = "/host"
DEFAULT_NODE_FACTS = "/nodegate-facts/facts.json"
PUBLISHED_SCHEMA = "packages/package.schema.json"


def _pick(flag: str | None, environ: Mapping[str, str], name: str) -> str | None:
    return flag if flag not in (None, "") else (environ.get(name) or None)


def stage_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> StageSettings:
    """`agent run` flags over environment, validated; CliError names everything missing at once."""
    from gate.agent.errors import AgentError
    from gate.agent.facts import load_operator_facts
    from gate.agent.plan import PARTS, StageRequest
    from gate.agent.stage import StageSettings
    from gate.api.digests import DIGEST

    stage = _pick(args.stage, environ, "NODEGATE_STAGE")
    package = _pick(args.package, environ, "NODEGATE_PACKAGE")
    version = _pick(args.version, environ, "NODEGATE_VERSION")
    gate = _pick(args.gate, environ, "NODEGATE_GATE")
    generation_text = _pick(None if args.generation is None else str(args.generation), environ, "NODEGATE_GENERATION")
    missing = [flag for flag, value in (("--stage", stage), ("--package", package), ("--version", version),
                                        ("--gate", gate)) if value is None]
    if missing:
        raise CliError(f"agent run needs {', '.join(missing)} (or their NODEGATE_* variables)")
    if stage not in STAGE_CHOICES:
        raise CliError(f"--stage {stage!r} is not one of {', '.join(STAGE_CHOICES)}")
    part = _pick(getattr(args, "part", None), environ, "NODEGATE_PART") or "whole"
    if part not in PARTS:
        raise CliError(f"--part {part!r} is not one of {', '.join(PARTS)}")
    try:
        generation = int(generation_text or 0)
    except ValueError:
        raise CliError(f"--generation wants a number, got {generation_text!r}") from None
    config_digest = _pick(args.config_digest, environ, "NODEGATE_CONFIG_DIGEST")
    if config_digest is not None and not DIGEST.match(config_digest):
        raise CliError(f"--config-digest wants sha256: and 64 lowercase hex digits, got {config_digest!r}")
    assert package is not None and version is not None and gate is not None
    if args.config_dir is not None:
        config_dir: Path | None = Path(args.config_dir)
    else:  # the operator always mounts one; by hand the default may simply not exist
        config_dir = Path(DEFAULT_CONFIG_DIR) if Path(DEFAULT_CONFIG_DIR).is_dir() else None
    if args.node_facts:
        facts_path: Path | None = Path(args.node_facts)
    else:  # likewise
        facts_path = Path(DEFAULT_NODE_FACTS) if Path(DEFAULT_NODE_FACTS).is_file() else None
    try:
        facts = load_operator_facts(facts_path, environ)
    except AgentError as exc:
        raise CliError(str(exc)) from None
    request = StageRequest(
        stage=stage,  # type: ignore[arg-type]  # checked against STAGE_CHOICES above
        gate=gate,
        package=package,
        version=version,
        generation=generation,
        previous_version=_pick(args.previous_version, environ, "NODEGATE_PREVIOUS_VERSION"),
        part=part,  # checked against PARTS above
    )
    return StageSettings(
        request=request,
        root=Path(args.root),
        payload=Path(args.payload),
        config_dir=config_dir,
        environ=dict(environ),
        gate_env_names=None if args.gate_env is None else tuple(n for n in args.gate_env.split(",") if n),
        node_facts=facts,
        config_digest=config_digest,
        timeout=args.timeout,
        payload_on_host=args.payload_on_host,
        payload_image=args.payload_image,
    )


def _termination_log(args: argparse.Namespace) -> Path | None:
    return Path(args.termination_log) if args.termination_log else None


def run_in_turn(args: argparse.Namespace, command: Callable[[argparse.Namespace], int], stage: str) -> int:
    """Run `command` in its turn among the pod's steps (`--turn`, `gate.agent.turns`): once the step before
    it succeeded, and record its own end for the step after it. A step whose predecessor did not succeed
    runs nothing and says so in its summary. Without `--turn`, `command` at once."""
    if args.turn is None:
        return command(args)
    from gate.agent import turns
    from gate.agent.summary import Summary, write_termination_message

    directory = Path(args.turns)
    if not turns.wait_for_turn(directory, args.turn):
        write_termination_message(_termination_log(args), Summary(
            package=getattr(args, "package", None) or os.environ.get("NODEGATE_PACKAGE", ""),
            version=getattr(args, "version", None) or os.environ.get("NODEGATE_VERSION", ""),
            stage=stage, ok=False, exit_code=None,
            message="not run: the step before it in this pod did not succeed"))
        return turns.NOT_RUN
    ok = False
    try:
        code = command(args)
        ok = code == 0
        return code
    finally:  # a refusal (CliError) or a crash is an end too: the step after it must not wait for the deadline
        turns.end_turn(directory, args.turn, ok)


def cmd_agent_run(args: argparse.Namespace) -> int:
    return run_in_turn(args, _agent_run, args.stage or os.environ.get("NODEGATE_STAGE", ""))


def _agent_run(args: argparse.Namespace) -> int:
    from gate.agent.errors import AgentError
    from gate.agent.stage import run_stage
    from gate.agent.summary import Summary, write_termination_message

    try:
        settings = stage_settings(args, os.environ)
    except CliError as exc:
        write_termination_message(
            _termination_log(args),
            Summary(package=args.package or os.environ.get("NODEGATE_PACKAGE", ""),
                    version=args.version or os.environ.get("NODEGATE_VERSION", ""),
                    stage=args.stage or os.environ.get("NODEGATE_STAGE", ""), ok=False, exit_code=None,
                    message=str(exc)),
        )
        raise
    request = settings.request
    try:
        result = run_stage(settings)
    except (AgentError, OSError) as exc:
        refused = isinstance(exc, AgentError)
        write_termination_message(
            _termination_log(args),
            Summary(package=request.package, version=request.version, stage=request.stage, ok=False,
                    exit_code=None, message=str(exc)),
        )
        if refused:
            raise CliError(str(exc)) from None
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_termination_message(_termination_log(args), result.summary)
    return 0 if result.ok else 1


def interrupt_settings(args: argparse.Namespace) -> InterruptSettings:
    from gate.agent.interrupt import InterruptSettings

    if args.type == "service" and not args.service:
        raise CliError("--type service needs at least one --service UNIT")
    if args.reboot_wait < 0:
        raise CliError("--reboot-wait cannot be negative")
    pod = args.pod or os.environ.get("NODEGATE_POD_UID") or None
    if pod is not None and args.type != "reboot":
        raise CliError("--pod is for --type reboot: only a reboot is asked for once per pod")
    return InterruptSettings(type=args.type, root=Path(args.root), services=tuple(args.service),
                             reboot_wait=args.reboot_wait, pod=pod)


def cmd_agent_interrupt(args: argparse.Namespace) -> int:
    return run_in_turn(args, _agent_interrupt, "interrupt")


def _agent_interrupt(args: argparse.Namespace) -> int:
    from gate.agent.errors import AgentError
    from gate.agent.interrupt import run_interrupt
    from gate.agent.summary import Summary, write_termination_message

    log = _termination_log(args)

    def report(summary: Summary) -> None:
        write_termination_message(log, summary)

    try:
        settings = interrupt_settings(args)
    except CliError as exc:
        report(Summary(package="", version="", stage="interrupt", ok=False, exit_code=None, message=str(exc),
                       interrupt=args.type))
        raise

    try:
        result = run_interrupt(settings, report)
    except AgentError as exc:
        report(Summary(package="", version="", stage="interrupt", ok=False, exit_code=None, message=str(exc),
                       interrupt=settings.type))
        raise CliError(str(exc)) from None
    report(result.summary)
    return 0 if result.summary.ok else 1


def cmd_package_lint(args: argparse.Namespace) -> int:
    from gate.agent.lint import has_errors, lint_package

    failed = False
    for directory in args.directories:
        findings = lint_package(Path(directory))
        for finding in findings:
            print(f"{directory}: {finding}")
        if has_errors(findings):
            failed = True
        else:
            print(f"{directory}: ok")
    return 1 if failed else 0


def cmd_package_test(args: argparse.Namespace) -> int:
    from gate.agent.interrupt import InterruptSettings
    from gate.agent.trial import report, run_trial

    root = Path(args.root)
    if not root.is_dir():
        raise CliError(f"--root {root} is not a directory")
    if root.resolve() == Path("/"):
        raise CliError("refusing --root /: package test really runs every stage, uninstall included; "
                       "give it a root filesystem to spend")
    directory = Path(args.directory)
    config_dir = Path(args.config_dir) if args.config_dir else None
    if config_dir is None and (directory / "sample-config").is_dir():
        config_dir = directory / "sample-config"
    interrupt = None
    if args.interrupt:
        if args.interrupt == "service" and not args.service:
            raise CliError("--interrupt service needs at least one --service UNIT")
        # No waiting for a shutdown: a test root has no kernel to go down.
        interrupt = InterruptSettings(type=args.interrupt, root=root, services=tuple(args.service), reboot_wait=0)
    trial = run_trial(directory, root, config_dir, interrupt, args.upgrade_from,
                      echo=sys.stdout if args.verbose else None, environ=dict(os.environ))
    report(trial, print)
    print("passed" if trial.ok else "FAILED")
    return 0 if trial.ok else 1


def cmd_package_schema(args: argparse.Namespace) -> int:
    from gate.agent.package import schema_text

    text = schema_text()
    if args.check:
        path = Path(args.output or PUBLISHED_SCHEMA)
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is stale; run `nodegate package schema --output {path}`", file=sys.stderr)
            return 1
        return 0
    if args.output:
        Path(args.output).write_text(text)
        print(args.output)
    else:
        sys.stdout.write(text)
    return 0


def register(subparsers: Any) -> None:
    """Add the `agent` and `package` command groups to the `nodegate` parser."""
    agent = subparsers.add_parser("agent", help="run a package stage or an interrupt on this node (used in pods)")
    agent_sub = agent.add_subparsers(dest="agent_command", required=True, metavar="ACTION")
    summary = argparse.ArgumentParser(add_help=False)
    summary.add_argument("--termination-log", default=DEFAULT_TERMINATION_LOG,
                         help=f"where to write the JSON summary (default {DEFAULT_TERMINATION_LOG}; '' for none)")
    summary.add_argument("--root", default=DEFAULT_ROOT,
                         help=f"the host's root filesystem as mounted in the pod (default {DEFAULT_ROOT})")
    summary.add_argument("--turn", type=int, metavar="N",
                         help="this step's place among its pod's steps, from 0: it runs once step N-1 recorded its "
                         "success in --turns, and records its own end there (the operator's pods; unset: at once)")
    summary.add_argument("--turns", default=TURNS_DIR, metavar="DIR",
                         help=f"where the pod's steps record their ends (default {TURNS_DIR}, an emptyDir of the pod)")

    run = agent_sub.add_parser("run", parents=[summary], help="run one stage of a package, then its check")
    run.add_argument("--stage", choices=STAGE_CHOICES, help="the stage (env NODEGATE_STAGE)")
    run.add_argument("--part", choices=("whole", "serving", "undo"),
                     help="whole (the default): the stage, skipping serving steps staged for this version and "
                     "generation; serving: the stage's serving steps alone, on a serving node, before the cordon; "
                     "undo: the undos of what was staged, the last first (env NODEGATE_PART)")
    run.add_argument("--package", help="package name (env NODEGATE_PACKAGE)")
    run.add_argument("--version", help="package version (env NODEGATE_VERSION)")
    run.add_argument("--gate", help="the NodeGate the package belongs to (env NODEGATE_GATE)")
    run.add_argument("--generation", type=int, help="the gate's metadata.generation (env NODEGATE_GENERATION)")
    run.add_argument("--previous-version",
                     help="upgrade: the version being replaced, when the host has no record "
                     "(env NODEGATE_PREVIOUS_VERSION)")
    run.add_argument("--payload", default=DEFAULT_PAYLOAD,
                     help=f"the package's files, copied from the image (default {DEFAULT_PAYLOAD})")
    run.add_argument("--payload-on-host", action="store_true",
                     help="read the package's files from the copy this round's staging or stage left on the host "
                     "(/var/lib/nodegate/<gate>/<package>/package/<version>), not from --payload; before the "
                     "interrupt only when the host recorded that copy as from --payload-image")
    run.add_argument("--payload-image", metavar="REF",
                     help="the image the payload comes from, as the operator names it: recorded with the copy "
                     "on the host, and held against the host's record with --payload-on-host")
    run.add_argument("--config-dir", help=f"the package's config files (default {DEFAULT_CONFIG_DIR} when present)")
    run.add_argument("--config-digest", metavar="sha256:HEX",
                     help="the digest of the config the operator rendered (env NODEGATE_CONFIG_DIGEST): config "
                     "files with another digest are refused before the host is touched; unset: not checked")
    run.add_argument("--node-facts", metavar="FILE",
                     help=f"the node's facts as the operator wrote them (default {DEFAULT_NODE_FACTS} when present; "
                     "else only the node's name, env NODEGATE_NODE)")
    run.add_argument("--gate-env", metavar="NAME,...",
                     help="the names of the gate's env for this package, comma-separated (the operator passes them, "
                     "empty when there are none): each must be declared by the package's gateEnv, and its value "
                     "follow the declared rule. Unset (by hand): the declared names found in the environment")
    run.add_argument("--timeout", type=float, metavar="SECONDS",
                     help="the stage's timeout: past it the running step is stopped as by SIGTERM, and no other "
                     "starts (the operator passes the package's `timeout`: one stage pod runs several stages)")
    run.set_defaults(func=cmd_agent_run)

    interrupt = agent_sub.add_parser("interrupt", parents=[summary],
                                     help="restart services or reboot the node (one merged interrupt)")
    interrupt.add_argument("--type", required=True, choices=INTERRUPT_CHOICES, help="what to do")
    interrupt.add_argument("--service", action="append", default=[], metavar="UNIT",
                           help="a systemd unit to restart (repeatable; needed for --type service)")
    interrupt.add_argument("--reboot-wait", type=float, default=600.0, metavar="SECONDS",
                           help="after requesting a reboot, how long to wait to be stopped by it (default 600)")
    interrupt.add_argument("--pod", metavar="UID",
                           help="the UID of the pod the reboot runs in (env NODEGATE_POD_UID, which the operator "
                           "sets from the pod itself): the boot it asks on is kept on the host, and the same pod "
                           "run again on a later boot does not reboot the node again")
    interrupt.set_defaults(func=cmd_agent_interrupt)

    package = subparsers.add_parser("package", help="tools for package authors: lint, test, explain, build, catalog, "
                                    "schema")
    package_sub = package.add_subparsers(dest="package_command", required=True, metavar="ACTION")
    lint = package_sub.add_parser("lint", help="check package directories without running them")
    lint.add_argument("directories", nargs="+", metavar="DIR")
    lint.set_defaults(func=cmd_package_lint)

    test = package_sub.add_parser("test", help="run every stage of a package against a root filesystem")
    test.add_argument("directory", metavar="DIR")
    test.add_argument("--root", required=True, metavar="ROOTFS", help="root filesystem to run against (chroot)")
    test.add_argument("--config-dir", help="config files to give the stages (default DIR/sample-config if present)")
    test.add_argument("--interrupt", choices=INTERRUPT_CHOICES, help="also run this interrupt before post-interrupt")
    test.add_argument("--service", action="append", default=[], metavar="UNIT", help="for --interrupt service")
    test.add_argument("--upgrade-from", metavar="VERSION", help="previous version for the upgrade stage "
                      "(default: the package's own version)")
    test.add_argument("--verbose", "-v", action="store_true", help="show every step's output")
    test.set_defaults(func=cmd_package_test)

    from gate.cli.explain import add_parser as add_explain

    add_explain(package_sub)

    schema = package_sub.add_parser("schema", help="print the JSON Schema of package.yaml")
    schema.add_argument("--output", "-o", help="write it to this file instead")
    schema.add_argument("--check", action="store_true",
                        help=f"exit 1 when the file (--output, default {PUBLISHED_SCHEMA}) is stale")
    schema.set_defaults(func=cmd_package_schema)

    from gate.cli import packages

    packages.register(package_sub)
