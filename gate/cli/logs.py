"""`nodegate package logs NODE PACKAGE`: the log of a package's latest stage on a node, and where the rest is.

The stage Job's pod log comes through the API server (`--tail N` keeps its last N lines, `--follow`
streams it while the stage runs), followed by the agent's summary from the pod's termination
message. The operator deletes the Job of every stage that succeeded, so the command also names the
directory on the node where the agent keeps the full log of every run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from gate.api import keys

if TYPE_CHECKING:
    from gate.kube.client import KubeClient, Resource

HOST_LOG_DIR = "/var/log/nodegate"
Obj = dict[str, Any]


async def _items(client: KubeClient, res: Resource, namespace: str | None = None,
                 label_selector: str | None = None) -> list[Obj]:
    found, _ = await client.list(res, namespace, label_selector=label_selector)
    return found


def log_params(*, follow: bool, tail: int | None) -> dict[str, str]:
    """The query of the pod log request: the agent's container, streamed or not, the last `tail` lines."""
    params = {"container": "agent"}
    if follow:
        params["follow"] = "true"
    if tail is not None:
        params["tailLines"] = str(tail)
    return params


def cmd_package_logs(args: argparse.Namespace) -> int:
    from gate.cli.errors import CliError

    if args.tail is not None and args.tail < 0:
        raise CliError(f"--tail wants a number of lines, 0 or more (got {args.tail})")
    return asyncio.run(_package_logs(args))


async def _package_logs(args: argparse.Namespace) -> int:
    from gate.cli.kubectx import connect
    from gate.cli.snapshot import get_node
    from gate.controller.jobs import GATE_NAME_ANNOTATION, NODE_NAME_ANNOTATION, label_value
    from gate.kube.client import JOBS, NODEGATES, PODS

    async with connect(args) as client:
        node = await get_node(client, args.node)
        selector = [f"{keys.STAGE_NODE_LABEL}={label_value(args.node)}", f"{keys.STAGE_PACKAGE_LABEL}={args.package}"]
        if args.stage:
            selector.append(f"{keys.STAGE_KIND_LABEL}={args.stage}")
        if args.gate:
            selector.append(f"{keys.STAGE_GATE_LABEL}={label_value(args.gate)}")
        jobs = await _items(client, JOBS, args.namespace, ",".join(selector))
        jobs = [j for j in jobs if (j["metadata"].get("annotations") or {}).get(NODE_NAME_ANNOTATION) == args.node
                and (not args.gate or j["metadata"]["annotations"].get(GATE_NAME_ANNOTATION) == args.gate)]
        versions = {}
        for g in await _items(client, NODEGATES):
            pkg = ((g.get("spec") or {}).get("packages") or {}).get(args.package)
            if pkg and (not args.gate or g["metadata"]["name"] == args.gate):
                versions[g["metadata"]["name"]] = str(pkg.get("version", "<version>"))
        if not jobs:
            what = f"{args.package} {args.stage}" if args.stage else args.package
            print(f"No stage Job of {what} is left on node {args.node}: the operator deletes the Job of every "
                  "stage that succeeded and keeps those that failed.")
            _print_host_dirs(_host_log_dirs(node, args.package, args.gate, versions))
            return 0
        job = max(jobs, key=lambda j: j["metadata"].get("creationTimestamp", ""))
        meta = job["metadata"]
        gate = meta.get("annotations", {}).get(GATE_NAME_ANNOTATION, "?")
        stage = meta.get("labels", {}).get(keys.STAGE_KIND_LABEL, "?")
        version = meta.get("annotations", {}).get(f"{keys.GROUP}/version")
        pods = await _items(client, PODS, args.namespace, f"job-name={meta['name']}")
        print(f"Job {args.namespace}/{meta['name']}: NodeGate {gate}, node {args.node}, package {args.package}, "
              f"stage {stage}: {_job_phase(job)}")
        if not pods:
            print("It has no pod (yet, or any more).")
        else:
            pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp", ""))
            await _show_pod_log(client, args.namespace, pod, follow=args.follow, tail=args.tail)
        _print_host_dirs([f"{HOST_LOG_DIR}/{gate}/{args.package}/{version or versions.get(gate, '<version>')}/"])
    return 0


def _job_phase(job: Obj) -> str:
    from gate.kube.objects import job_failure, job_outcome

    outcome = job_outcome(job)
    if outcome == "failed":
        return f"failed ({job_failure(job)})"
    if outcome is not None:
        return outcome
    return "running" if (job.get("status") or {}).get("active") else "pending"


async def _show_pod_log(client: KubeClient, namespace: str, pod: Obj, *, follow: bool, tail: int | None) -> None:
    from gate.api.state import failure_message
    from gate.kube.client import PODS
    from gate.kube.errors import ApiError

    name = pod["metadata"]["name"]
    phase = (pod.get("status") or {}).get("phase", "Unknown")
    print(f"Pod {name}: {phase}")
    path = PODS.path(namespace, name, "log")
    try:
        if follow:
            async for chunk in stream_text(client, path, log_params(follow=True, tail=tail)):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        else:
            text = await get_text(client, path, log_params(follow=False, tail=tail))
            sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    except ApiError as exc:
        print(f"Its log cannot be read through the API server ({exc.status} {exc.message.strip()}).")
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated") or {}
        if cs.get("name") == "agent" and term.get("message"):
            print(f"The agent's summary: {failure_message(term['message'])}")
            print(f"  {term['message'].strip()}")


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
                                             help="logs of a package's stage on a node (its stage Job's pod)")
    logs.add_argument("node", metavar="NODE")
    logs.add_argument("package", metavar="PACKAGE")
    logs.add_argument("--stage", help="only this stage (apply, config, upgrade, uninstall, post-interrupt, "
                      "post-uninstall)")
    logs.add_argument("--gate", "-g", help="only this NodeGate's Jobs")
    logs.add_argument("--follow", "-f", action="store_true", help="stream the log while the stage runs")
    logs.add_argument("--tail", type=int, metavar="N", help="only the last N lines of the pod's log (default all)")
    logs.set_defaults(func=cmd_package_logs)
