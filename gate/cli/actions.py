"""What the commands a person runs against a cluster do: status, plan, pause, resume, delete, node, rerun,
logs.

The operator is the only writer of node state and gate status. These commands read, or they ask:
`spec.paused` on a NodeGate, the `nodegate.io/resume` annotation on a NodeGate, the `reset.<gate>` and
`rerun.<gate>` annotations and the `nodegate.io/ignore` label on a Node. The operator acts on a request
and removes it. Every command that changes something takes `--dry-run` (a server-side dry run: the API
server and the admission webhooks see the request, nothing is stored) and prints what it changed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml

from gate.api import keys
from gate.cli.errors import CliError
from gate.cli.kubectx import api_errors, connect, missing_api
from gate.cli.render import plan_data, plan_text, render_rich, render_text, report_data
from gate.cli.report import GateReport, Snapshot, build_reports
from gate.kube.client import JOBS, NODEGATES, NODES, POLICIES, KubeClient, Resource
from gate.kube.errors import Forbidden, NotFound

Obj = dict[str, Any]
DRY_RUN_NOTE = " (server dry run: nothing was changed)"
PLAIN_INTERVAL = 2.0


def _now() -> datetime:
    return datetime.now(UTC)


def _run(coro: Coroutine[Any, Any, int]) -> int:
    return asyncio.run(coro)


def _print_data(data: Any, output: str, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    if output == "json":
        out.write(json.dumps(data, indent=2) + "\n")
    else:
        out.write(yaml.safe_dump(data, sort_keys=False))


def _changed(text: str, dry_run: bool) -> None:
    print(text + (DRY_RUN_NOTE if dry_run else ""))


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows) + "\n"


# -- reading -------------------------------------------------------------------------------------


async def _items(client: KubeClient, res: Resource, namespace: str | None = None,
                 label_selector: str | None = None) -> list[Obj]:
    items, _ = await client.list(res, namespace, label_selector=label_selector)
    return items


async def fetch_snapshot(client: KubeClient, namespace: str, gate: str | None = None) -> Snapshot:
    """One consistent-enough read of everything the status needs (four lists, in parallel)."""

    async def jobs() -> list[Obj] | None:
        try:
            return await _items(client, JOBS, namespace, f"{keys.MANAGED_BY_LABEL}={keys.MANAGER}")
        except Forbidden:
            return None  # the status still works, without the names of running stages

    gates, policies, nodes, job_items = await asyncio.gather(
        _items(client, NODEGATES), _items(client, POLICIES), _items(client, NODES), jobs())
    if gate is not None and not any(g["metadata"]["name"] == gate for g in gates):
        raise CliError(f"no NodeGate named {gate} (`kubectl get ng` lists them)")
    return Snapshot(gates=gates, policies={p["metadata"]["name"]: p for p in policies}, nodes=nodes,
                    jobs=job_items or [], jobs_visible=job_items is not None)


async def get_gate(client: KubeClient, name: str) -> Obj:
    try:
        return await client.get(NODEGATES, name)
    except NotFound as exc:
        if missing_api(exc):
            raise
        raise CliError(f"no NodeGate named {name} (`kubectl get ng` lists them)") from None


async def get_node(client: KubeClient, name: str) -> Obj:
    try:
        return await client.get(NODES, name)
    except NotFound as exc:
        if missing_api(exc):
            raise
        raise CliError(f"no node named {name}") from None


def states_on(node: Obj) -> dict[str, str]:
    """gate name -> raw state annotation, for every gate that recorded progress on the node."""
    out = {}
    for key, value in (node["metadata"].get("annotations") or {}).items():
        gate = keys.gate_of_state_annotation(key)
        if gate is not None:
            out[gate] = value
    return out


# -- status --------------------------------------------------------------------------------------


class StatusFeed:
    """Watch caches of what the status reads, and an event set whenever any of it changes."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        from gate.kube.cache import WatchCache

        self.changed = asyncio.Event()
        selector = f"{keys.MANAGED_BY_LABEL}={keys.MANAGER}"
        self.gates = WatchCache(client, NODEGATES)
        self.policies = WatchCache(client, POLICIES)
        self.nodes = WatchCache(client, NODES)
        self.jobs = WatchCache(client, JOBS, namespace=namespace, label_selector=selector)
        self.jobs_visible = True
        for cache in (self.gates, self.policies, self.nodes, self.jobs):
            cache.subscribe(lambda kind, obj: self.changed.set())

    async def start(self) -> None:
        await asyncio.gather(self.gates.start(), self.policies.start(), self.nodes.start())
        try:
            await self.jobs.start()
        except Forbidden:
            self.jobs_visible = False

    async def stop(self) -> None:
        for cache in (self.gates, self.policies, self.nodes, self.jobs):
            await cache.stop()

    def snapshot(self) -> Snapshot:
        return Snapshot(gates=self.gates.items(),
                        policies={p["metadata"]["name"]: p for p in self.policies.items()},
                        nodes=self.nodes.items(), jobs=self.jobs.items(), jobs_visible=self.jobs_visible)

    async def wait(self, timeout: float) -> None:
        """Until something changed or `timeout` passed."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except TimeoutError:
            pass
        self.changed.clear()


def reports_of(snapshot: Snapshot, gate: str | None) -> list[GateReport]:
    return build_reports(snapshot, _now(), [gate] if gate else None)


def use_rich(stream: TextIO | None = None) -> bool:
    return (stream or sys.stdout).isatty()


def cmd_status(args: argparse.Namespace) -> int:
    if args.watch and args.output != "text":
        raise CliError("--watch shows the live status as text; leave out -o")
    return _run(_status(args))


async def _status(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        if args.watch:
            return await watch_status(client, args.namespace, args.gate)
        reports = reports_of(await fetch_snapshot(client, args.namespace, args.gate), args.gate)
    if args.output != "text":
        data = [report_data(r) for r in reports]
        _print_data(data[0] if args.gate else {"items": data}, args.output)
    elif use_rich():
        from rich.console import Console

        Console().print(render_rich(reports))
    else:
        sys.stdout.write(render_text(reports))
    return 0


async def watch_status(client: KubeClient, namespace: str, gate: str | None, *,
                       until: Callable[[list[GateReport]], bool] | None = None, tick: float = 1.0) -> int:
    """Keep the status on screen, current, until Ctrl-C (or `until` holds). A terminal gets a live
    rich view; a pipe gets a new plain rendering whenever something other than the clock changed."""
    feed = StatusFeed(client, namespace)
    with api_errors(client.base_url):
        await feed.start()
    try:
        reports = reports_of(feed.snapshot(), gate)
        if gate is not None and not reports:
            raise CliError(f"no NodeGate named {gate} (`kubectl get ng` lists them)")
        if use_rich():
            from rich.live import Live

            with Live(render_rich(reports), refresh_per_second=4, auto_refresh=False) as live:
                while until is None or not until(reports):
                    await feed.wait(tick)
                    reports = reports_of(feed.snapshot(), gate)
                    live.update(render_rich(reports), refresh=True)
        else:
            last = ""
            while True:
                key = render_text(reports, durations=False)
                if key != last:
                    stamp = datetime.now().strftime("%H:%M:%S")
                    sys.stdout.write(f"--- {stamp}\n{render_text(reports)}")
                    sys.stdout.flush()
                    last = key
                if until is not None and until(reports):
                    break
                # A pipe gets at most one rendering per `PLAIN_INTERVAL`: a rollout changes many
                # times a second, a log reader wants the picture every few seconds.
                await asyncio.sleep(PLAIN_INTERVAL)
                await feed.wait(tick)
                reports = reports_of(feed.snapshot(), gate)
    finally:
        await feed.stop()
    return 0


# -- plan ----------------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> int:
    return _run(_plan(args))


async def _plan(args: argparse.Namespace) -> int:
    from gate.api.nodegate import NodeGate
    from gate.api.policy import DeploymentPolicy
    from gate.controller.views import fleet_node
    from gate.lifecycle.fleet import progress_of
    from gate.rollout import NodeSnapshot, simulate

    async with connect(args) as client:
        snapshot = await fetch_snapshot(client, args.namespace, args.gate)
    [raw] = [g for g in snapshot.gates if g["metadata"]["name"] == args.gate]
    gate = NodeGate.model_validate(raw)
    policy = None
    if gate.spec.deployment_policy:
        found = snapshot.policies.get(gate.spec.deployment_policy)
        if found is None:
            raise CliError(f"NodeGate {gate.name} names DeploymentPolicy {gate.spec.deployment_policy}, "
                           "which does not exist")
        policy = DeploymentPolicy.model_validate(found)
    nodes = []
    for obj in snapshot.nodes:
        fnode = fleet_node(obj)
        nodes.append(NodeSnapshot(fnode.view.name, dict(fnode.view.labels),
                                  {g: progress_of(s) for g, s in fnode.states.items()}))
    sim = simulate(gate, policy, nodes)
    if args.output == "text":
        sys.stdout.write(plan_text(sim, gate.spec.deployment_policy))
    else:
        _print_data(plan_data(sim, gate.spec.deployment_policy), args.output)
    return 0


# -- pause and resume ----------------------------------------------------------------------------


def cmd_pause(args: argparse.Namespace) -> int:
    return _run(_pause(args))


async def _pause(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        gate = await get_gate(client, args.gate)
        if (gate.get("spec") or {}).get("paused"):
            print(f"NodeGate {args.gate} is already paused; nothing changed.")
            return 0
        await client.patch(NODEGATES, args.gate, {"spec": {"paused": True}}, dry_run=args.dry_run)
    _changed(f"NodeGate {args.gate}: set spec.paused=true. No new work starts; stages running now finish.",
             args.dry_run)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    return _run(_resume(args))


def _compartment_names(values: Sequence[str]) -> list[str]:
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


async def _resume(args: argparse.Namespace) -> int:
    wanted = _compartment_names(args.compartment)
    async with connect(args) as client:
        gate = await get_gate(client, args.gate)
        spec = gate.get("spec") or {}
        compartments = ((gate.get("status") or {}).get("compartments")) or []
        known = {c.get("name") for c in compartments}
        if spec.get("deploymentPolicy"):
            try:
                policy = await client.get(POLICIES, spec["deploymentPolicy"])
                known |= {c.get("name") for c in (policy.get("spec") or {}).get("compartments") or []}
            except NotFound:
                pass
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise CliError(f"NodeGate {args.gate} has no compartment {', '.join(unknown)} "
                           f"(it has: {', '.join(sorted(str(k) for k in known)) or 'none yet'})")
        stopped = [c["name"] for c in compartments if c.get("state") == "stopped"
                   and (not wanted or c["name"] in wanted)]
        paused = bool(spec.get("paused"))
        patch: Obj = {}
        if paused:
            patch["spec"] = {"paused": False}
        if stopped:
            patch["metadata"] = {"annotations": {keys.RESUME_ANNOTATION: ",".join(wanted) if wanted else "*"}}
        if not patch:
            scope = f"compartment {', '.join(wanted)} is not stopped" if wanted else "no compartment is stopped"
            print(f"NodeGate {args.gate} is not paused and {scope}; nothing changed.")
            return 0
        await client.patch(NODEGATES, args.gate, patch, dry_run=args.dry_run)
    if paused:
        _changed(f"NodeGate {args.gate}: set spec.paused=false.", args.dry_run)
    if stopped:
        _changed(f"NodeGate {args.gate}: asked the operator to resume stopped compartment"
                 f"{'s' if len(stopped) > 1 else ''} {', '.join(stopped)} "
                 f"(annotation {keys.RESUME_ANNOTATION}). Their failed nodes stay failed: "
                 "`nodegate rerun` or `nodegate node reset` gives them another round.", args.dry_run)
    return 0


# -- delete --------------------------------------------------------------------------------------


def cmd_delete(args: argparse.Namespace) -> int:
    return _run(_delete(args))


async def _delete(args: argparse.Namespace) -> int:
    g = args.gate
    async with connect(args) as client:
        gate = await get_gate(client, g)
        paused = bool((gate.get("spec") or {}).get("paused"))
        deleting = bool(gate["metadata"].get("deletionTimestamp"))
        if deleting and not (paused and args.force):
            print(f"NodeGate {g} is already being deleted{' (paused: no uninstall starts)' if paused else ''}; "
                  "nothing changed." + (f" `nodegate delete {g} --force` lets its removal go on." if paused else ""))
            return 0
        if not deleting:
            options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
            if args.dry_run:
                options["dryRun"] = ["All"]
            await client.delete(NODEGATES, g, body=options, missing_ok=False)
        if paused and args.force:
            # After the deletion, so the unpaused gate never starts a rollout round: only its removal.
            await client.patch(NODEGATES, g, {"spec": {"paused": False}}, dry_run=args.dry_run)
    after = ("The operator uninstalls what allows it, uncordons and removes the gate's keys from every node, "
             "then the gate goes.")
    if paused and args.force:
        done = "deleted and set spec.paused=false" if not deleting else "set spec.paused=false"
        _changed(f"NodeGate {g}: {done}. {after}", args.dry_run)
    elif paused:
        _changed(f"NodeGate {g}: deleted. It is paused: no uninstall starts while it stays paused (its condition "
                 f"Deleting says so); `nodegate delete {g} --force` or `nodegate resume {g}` lets the removal go on.",
                 args.dry_run)
    else:
        _changed(f"NodeGate {g}: deleted. {after}", args.dry_run)
    return 0


# -- nodes ---------------------------------------------------------------------------------------


def cmd_node_list(args: argparse.Namespace) -> int:
    return _run(_node_list(args))


async def _node_list(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        snapshot = await fetch_snapshot(client, args.namespace, args.gate)
    rows, data = (_gate_nodes(snapshot, args.gate) if args.gate else _all_nodes(snapshot))
    if args.output != "text":
        _print_data({"items": data}, args.output)
    elif len(rows) == 1:
        print("No nodes." if not args.gate else f"NodeGate {args.gate} selects no nodes.")
    else:
        sys.stdout.write(_table(rows))
    return 0


def _all_nodes(snapshot: Snapshot) -> tuple[list[list[str]], list[Obj]]:
    from gate.controller.views import node_states

    rows = [["NODE", "READY", "CORDONED", "IGNORED", "GATES"]]
    data = []
    for node in sorted(snapshot.nodes, key=lambda n: n["metadata"]["name"]):
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (node.get("status") or {}).get("conditions") or [])
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
        by = annotations.get(keys.CORDONED_BY)
        ignored = labels.get(keys.IGNORE_LABEL) == "true"
        gates = {g: ("unreadable" if isinstance(s, Exception) else s.status) for g, s in node_states(node).items()}
        rows.append([meta["name"], "yes" if ready else "no",
                     (f"yes (by {by})" if by else "yes") if cordoned else "no", "yes" if ignored else "no",
                     " ".join(f"{g}={s}" for g, s in sorted(gates.items())) or "-"])
        data.append({"node": meta["name"], "ready": ready, "cordoned": cordoned, "cordonedBy": by,
                     "ignored": ignored, "gates": gates})
    return rows, data


def _gate_nodes(snapshot: Snapshot, gate: str) -> tuple[list[list[str]], list[Obj]]:
    from gate.api.state import NodeGateState, StateParseError, load_state

    [report] = reports_of(snapshot, gate)
    failures = {f.name: f for f in report.failed}
    active = {a.name: a for a in report.active}
    compartments = {**{a.name: a.compartment for a in report.active}, **{f.name: f.compartment for f in report.failed}}
    for w in report.waits:
        compartments.update((n, w.compartment) for n in w.nodes)
    raw_gate = next(g for g in snapshot.gates if g["metadata"]["name"] == gate)
    packages = (raw_gate.get("spec") or {}).get("packages") or {}
    rows = [["NODE", "COMPARTMENT", "STATUS", "PHASE", "BATCH", "INSTALLED", "NOTE"]]
    data = []
    by_name = {n["metadata"]["name"]: n for n in snapshot.nodes}
    for name in sorted(report.node_states):
        status = report.node_states[name]
        raw = (by_name[name]["metadata"].get("annotations") or {}).get(keys.state_annotation(gate))
        try:
            state: NodeGateState | None = load_state(raw) if raw else None
        except StateParseError:
            state = None
        installed = {p: i.version for p, i in (state.installed.items() if state else ())}
        compartment = compartments.get(name) or (state.compartment if state else None) or "-"
        note = ""
        if name in failures:
            f = failures[name]
            note = f"{f.where}: {f.reason}" + (f": {f.message}" if f.message else "")
        elif name in active:
            note = active[name].doing
        rows.append([name, compartment, status, state.phase if state and status == "in-progress" else "-",
                     str(state.batch) if state and state.batch else "-", f"{len(installed)}/{len(packages)}",
                     note[:100]])
        data.append({"node": name, "compartment": compartment, "status": status,
                     "phase": state.phase if state else None, "batch": state.batch if state else 0,
                     "installed": installed, "note": note})
    return rows, data


# -- rerun ---------------------------------------------------------------------------------------


def cmd_rerun(args: argparse.Namespace) -> int:
    return _run(_rerun(args))


async def _rerun(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        gate = await get_gate(client, args.gate)
        packages = sorted((gate.get("spec") or {}).get("packages") or {})
        if args.package not in packages:
            raise CliError(f"NodeGate {args.gate} has no package {args.package} (it has: {', '.join(packages)})")
        node = await get_node(client, args.node)
        states = states_on(node)
        if args.gate not in states:
            raise CliError(f"NodeGate {args.gate} has not run on node {args.node}; nothing to rerun")
        key = keys.rerun_annotation(args.gate)
        pending = (node["metadata"].get("annotations") or {}).get(key)
        value = f"{args.package}/{args.stage}"
        await client.patch(NODES, args.node, {"metadata": {"annotations": {key: value}}}, dry_run=args.dry_run)
    busy = '"in-progress"' in states[args.gate]
    replaced = f" It replaces the pending request {pending}." if pending and pending != value else ""
    then = " once the round running there now ends" if busy else " in its next round"
    _changed(f"node/{args.node}: requested a rerun of {args.package} {args.stage} for NodeGate {args.gate} "
             f"(annotation {key}={value}); the operator runs it again{then}.{replaced}", args.dry_run)
    return 0
