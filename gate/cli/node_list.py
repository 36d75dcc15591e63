"""`nodegate node list [--gate GATE]`: every node, or one gate's nodes with compartment, phase and failures.

Computed from one snapshot (`gate.cli.snapshot`): without `--gate` a node's readiness, cordon (and by
whom, or held for hand-off), opt-out and status per gate; with it the gate's report per node (`gate.cli.report`) next to
what its state annotation records. The other `node` commands, which write, are in `gate.cli.nodes`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from gate.api import keys
from gate.api.common import Obj
from gate.cli.kubectx import connect
from gate.cli.output import print_data, table
from gate.cli.report import Snapshot
from gate.cli.snapshot import fetch_snapshot, reports_of
from gate.lifecycle.handoff import held as held_for_hand_off


def cmd_node_list(args: argparse.Namespace) -> int:
    return asyncio.run(_node_list(args))


async def _node_list(args: argparse.Namespace) -> int:
    async with connect(args) as client:
        snapshot = await fetch_snapshot(client, args.namespace, args.gate)
    rows, data = (_gate_nodes(snapshot, args.gate) if args.gate else _all_nodes(snapshot))
    if args.output != "text":
        print_data({"items": data}, args.output)
    elif len(rows) == 1:
        print("No nodes." if not args.gate else f"NodeGate {args.gate} selects no nodes.")
    else:
        sys.stdout.write(table(rows))
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
        held = held_for_hand_off(annotations, cordoned)
        ignored = labels.get(keys.IGNORE_LABEL) == "true"
        gates = {g: ("unreadable" if isinstance(s, Exception) else s.status) for g, s in node_states(node).items()}
        rows.append([meta["name"], "yes" if ready else "no",
                     _cordon_cell(cordoned, by, held), "yes" if ignored else "no",
                     " ".join(f"{g}={s}" for g, s in sorted(gates.items())) or "-"])
        data.append({"node": meta["name"], "ready": ready, "cordoned": cordoned, "cordonedBy": by,
                     "heldForHandOffBy": held, "ignored": ignored, "gates": gates})
    return rows, data


def _cordon_cell(cordoned: bool, by: str | None, held: str | None) -> str:
    if not cordoned:
        return "no"
    if held:
        return f"yes (held for hand-off by {held})"
    return f"yes (by {by})" if by else "yes"


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
