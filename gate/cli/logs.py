"""`nodegate package logs NODE PACKAGE`: the log of a package's latest stage on a node, and where the rest is.

A package's stage runs as a step of a stage pod: the container `<stage>-<package>` of the pod of its
node's phase (`gate.controller.pods`). Its log comes through the API server (`--tail N` keeps its
last N lines, `--follow` streams it while the step runs), followed by the agent's summary from the
container's termination message. The operator deletes every stage pod once the node's state records
its result, so the pod is usually gone: the command then says what the node's state recorded for the
package (its failure, with the agent's summary), points at the operator's Events about the node, and
names the directory on the node where the agent keeps the full log of every run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from gate.api import keys
from gate.api.common import Obj

if TYPE_CHECKING:
    from gate.cli.stagepods import StepState
    from gate.kube.client import KubeClient, Resource

HOST_LOG_DIR = "/var/log/nodegate"


async def _items(client: KubeClient, res: Resource, namespace: str | None = None,
                 label_selector: str | None = None) -> list[Obj]:
    found, _ = await client.list(res, namespace, label_selector=label_selector)
    return found


def log_params(container: str, *, follow: bool, tail: int | None) -> dict[str, str]:
    """The query of the pod log request: the step's container, streamed or not, the last `tail` lines."""
    params = {"container": container}
    if follow:
        params["follow"] = "true"
    if tail is not None:
        params["tailLines"] = str(tail)
    return params


def pick_step(pods: Sequence[Obj], package: str, stage: str | None = None) -> tuple[Obj, StepState] | None:
    """The step to show of `pods` (newest first): of the newest pod with a step of `package` (of
    `stage` when given), that step; without a stage, the package's last step in it that ran (its
    first one while none has)."""
    from gate.cli.stagepods import step_states

    for pod in pods:
        steps = [s for s in step_states(pod) if s.step.package == package and stage in (None, s.step.stage)]
        if steps:
            ran = [s for s in steps if s.ran]
            return pod, (ran[-1] if ran else steps[0])
    return None


def step_text(step: StepState, pod_phase: str, pod_message: str) -> str:
    """How a step ended, or that it has not: "succeeded", "failed (exit code 3)", "running", ..."""
    if step.phase == "failed":
        return f"failed (exit code {step.exit_code})"
    if step.phase == "pending" and pod_phase == "failed":
        return f"failed: it never ran, the pod failed ({pod_message or 'no reason given'})"
    return step.phase


def step_version(pod: Obj, container: str) -> str | None:
    """The package version a step ran (its agent's `--version`)."""
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        args = c.get("args") or []
        if c.get("name") == container and "--version" in args[:-1]:
            return str(args[args.index("--version") + 1])
    return None


def cmd_package_logs(args: argparse.Namespace) -> int:
    from gate.cli.errors import CliError

    if args.tail is not None and args.tail < 0:
        raise CliError(f"--tail wants a number of lines, 0 or more (got {args.tail})")
    return asyncio.run(_package_logs(args))


async def _package_logs(args: argparse.Namespace) -> int:
    from gate.cli import stagepods
    from gate.cli.kubectx import connect
    from gate.cli.snapshot import get_node
    from gate.controller.pods import label_value, stage_pod_view
    from gate.kube.client import NODEGATES, PODS

    async with connect(args) as client:
        node = await get_node(client, args.node)
        selector = [stagepods.SELECTOR, f"{keys.STAGE_NODE_LABEL}={label_value(args.node)}",
                    f"{keys.POD_PACKAGE_PREFIX}{args.package}"]
        if args.gate:
            selector.append(f"{keys.STAGE_GATE_LABEL}={label_value(args.gate)}")
        pods = stagepods.of_node(await _items(client, PODS, args.namespace, ",".join(selector)), args.node, args.gate)
        versions = {}
        for g in await _items(client, NODEGATES):
            pkg = ((g.get("spec") or {}).get("packages") or {}).get(args.package)
            if pkg and (not args.gate or g["metadata"]["name"] == args.gate):
                versions[g["metadata"]["name"]] = str(pkg.get("version", "<version>"))
        picked = pick_step(pods, args.package, args.stage)
        if picked is None:
            what = f"{args.package} {args.stage}" if args.stage else args.package
            print(f"No stage pod of {what} is left on node {args.node}: the operator deletes the pod of every "
                  "stage that succeeded, and of an attempt that failed and was retried (the last failed attempt "
                  "stays until the node's next round).")
            _print_recorded(node, args.package, args.stage, args.gate)
            print(f"The operator's Events about the node say what ran there: `kubectl events -n default "
                  f"--for node/{args.node}`.")
            _print_host_dirs(_host_log_dirs(node, args.package, args.gate, versions))
            return 0
        pod, step = picked
        view = stage_pod_view(pod)
        gate = stagepods.gate_of(pod) or "?"
        steps = stagepods.step_states(pod)
        print(f"Stage pod {args.namespace}/{view.name}: NodeGate {gate}, node {args.node}, package {args.package}, "
              f"stage {step.step.stage}: {step_text(step, view.phase, view.message)}")
        print(f"The pod runs the {view.kind} of round {view.round} (attempt {view.attempt}): {view.phase}"
              + (f" ({view.message})" if view.phase == "failed" and view.message else "")
              + f"; this is step {steps.index(step) + 1} of {len(steps)}, container {step.container}.")
        if step.ran or args.follow:
            await _show_step_log(client, args.namespace, view.name, step, follow=args.follow, tail=args.tail)
        else:
            print("Its container has not started yet: no log so far (--follow waits for it).")
        version = step_version(pod, step.container) or versions.get(gate, "<version>")
        _print_host_dirs([f"{HOST_LOG_DIR}/{gate}/{args.package}/{version}/"])
    return 0


async def _show_step_log(client: KubeClient, namespace: str, pod: str, step: StepState, *, follow: bool,
                         tail: int | None) -> None:
    from gate.api.state import failure_message
    from gate.kube.client import PODS
    from gate.kube.errors import ApiError

    path = PODS.path(namespace, pod, "log")
    try:
        if follow:
            async for chunk in stream_text(client, path, log_params(step.container, follow=True, tail=tail)):
                sys.stdout.write(chunk)
                sys.stdout.flush()
            step = await _ended(client, namespace, pod, step)
        else:
            text = await get_text(client, path, log_params(step.container, follow=False, tail=tail))
            sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    except ApiError as exc:
        print(f"Its log cannot be read through the API server ({exc.status} {exc.message.strip()}).")
    if step.message:
        print(f"The agent's summary: {failure_message(step.message)}")
        print(f"  {step.message}")


async def _ended(client: KubeClient, namespace: str, pod: str, step: StepState) -> StepState:
    """The step once its log stream ended with its container: how it ended (as it was, when the pod is
    gone already: the operator deletes it once the node's state records it)."""
    from gate.cli.stagepods import step_states
    from gate.kube.client import PODS
    from gate.kube.errors import ApiError

    try:
        current = await client.get(PODS, pod, namespace)
    except ApiError:
        return step
    return next((s for s in step_states(current) if s.container == step.container), step)


def _print_recorded(node: Obj, package: str, stage: str | None, gate: str | None) -> None:
    """What the node's state records of the package's last failure, per gate."""
    from gate.api.state import StateParseError, failure_message, load_state
    from gate.cli.snapshot import states_on

    for g, raw in sorted(states_on(node).items()):
        if gate and g != gate:
            continue
        try:
            failure = load_state(raw).failure
        except StateParseError:
            continue
        if failure is None or failure.package != package or stage not in (None, failure.stage):
            continue
        print(f"The node's state for NodeGate {g}, node {node['metadata']['name']}, package {package}, "
              f"stage {failure.stage}: failed ({failure.reason}).")
        print(f"The agent's summary: {failure_message(failure.message)}")
        if failure.message.strip().startswith("{"):
            print(f"  {failure.message.strip()}")


def _host_log_dirs(node: Obj, package: str, gate: str | None, versions: dict[str, str]) -> list[str]:
    """Where the agent keeps every run's log on the node: per gate with the package, the version on
    the node (or the one the gate asks for)."""
    from gate.api.state import StateParseError, load_state
    from gate.cli.snapshot import states_on

    dirs = []
    states = states_on(node)
    for g in sorted(set(states) | set(versions)):
        if gate and g != gate:
            continue
        try:
            record = load_state(states[g]).installed.get(package) if g in states else None
        except StateParseError:
            record = None
        version = record.version if record is not None else versions.get(g)
        if version is not None:
            dirs.append(f"{HOST_LOG_DIR}/{g}/{package}/{version}/")
    return dirs or [f"{HOST_LOG_DIR}/{gate or '<gate>'}/{package}/<version>/"]


def _print_host_dirs(dirs: list[str]) -> None:
    where = " and ".join(dirs)
    print(f"The agent writes the full log of every run on the node itself, under {where} "
          "(one file per run: <time>-<stage>.log).")


async def get_text(client: KubeClient, path: str, params: dict[str, str]) -> str:
    return await client.get_text(path, params)


def stream_text(client: KubeClient, path: str, params: dict[str, str]) -> AsyncIterator[str]:
    return client.stream_text(path, params)


def register(sub: Any) -> None:
    """Add `logs` to the authors' `package` group (gate.cli.agent adds the group)."""
    from gate.cli.fleet import cluster_parents, subparsers_of

    package = sub.choices["package"]
    for choice in sub._choices_actions:
        if choice.dest == "package" and "logs" not in (choice.help or ""):
            choice.help = (choice.help or "package tools") + "; logs of a package's stage on a node"
    cluster, _ = cluster_parents()
    logs = subparsers_of(package).add_parser("logs", parents=[cluster],
                                             help="logs of a package's stage on a node (its step in a stage pod)")
    logs.add_argument("node", metavar="NODE")
    logs.add_argument("package", metavar="PACKAGE")
    logs.add_argument("--stage", help="only this stage (apply, config, upgrade, uninstall, post-interrupt, "
                      "post-uninstall)")
    logs.add_argument("--gate", "-g", help="only this NodeGate's stage pods")
    logs.add_argument("--follow", "-f", action="store_true", help="stream the log while the step runs")
    logs.add_argument("--tail", type=int, metavar="N", help="only the last N lines of the step's log (default all)")
    logs.set_defaults(func=cmd_package_logs)
