"""`nodegate rollout history GATE` and `nodegate rollout undo GATE [--to-revision N]`, as `kubectl rollout`.

The operator keeps a gate's previous specs as ControllerRevisions in its namespace
(`gate.controller.history`). `history` lists the ones controlled by the gate (name and uid), or shows
one revision's spec; `undo` writes a revision's spec back to the gate.

Undo is a write of the NodeGate by the person who runs it, with their credentials: it needs `patch`
on nodegates, and admission checks the spec written back like any other (packages the person may
use, images, every rule). It is sent as a JSON patch replacing `spec` whole and carrying the
resourceVersion read, so a gate changed meanwhile is refused (409), not overwritten. `paused` is no
part of a revision and keeps its value. What follows is an ordinary rollout of that spec: budgets,
compartments, cordon, drain and interrupts as for any spec change.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from gate.api.common import Obj
from gate.cli.errors import CliError


def cmd_history(args: argparse.Namespace) -> int:
    return asyncio.run(_history(args))


def cmd_undo(args: argparse.Namespace) -> int:
    return asyncio.run(_undo(args))


async def _revisions(args: argparse.Namespace) -> tuple[Obj, str, list[Any]]:
    """The gate, its current rollout hash, and its revisions (oldest first)."""
    from gate.api.nodegate import NodeGate
    from gate.api.state import rollout_hash
    from gate.cli.kubectx import connect
    from gate.cli.snapshot import get_gate
    from gate.kube.client import CONTROLLER_REVISIONS
    from gate.rollout.history import history_selector, parse_revision

    async with connect(args) as client:
        gate = await get_gate(client, args.gate)
        objs, _ = await client.list(CONTROLLER_REVISIONS, args.namespace, label_selector=history_selector(args.gate))
    uid = str(gate["metadata"].get("uid", ""))
    revisions = [r for r in (parse_revision(o, args.gate, uid) for o in objs) if r is not None]
    return gate, rollout_hash(NodeGate.model_validate(gate)), sorted(revisions, key=lambda r: r.number)


async def _history(args: argparse.Namespace) -> int:
    from gate.cli.output import print_data, table
    from gate.rollout.history import spec_summary

    _, current, revisions = await _revisions(args)
    if args.revision is not None:
        found = [r for r in revisions if r.number == args.revision]
        if not found:
            numbers = ", ".join(str(r.number) for r in revisions) or "none"
            raise CliError(f"no revision {args.revision} of NodeGate {args.gate}; it has revision(s) {numbers}")
        print_data({"revision": found[0].number, "name": found[0].name, "spec": found[0].spec},
                   "json" if args.output == "json" else "yaml")
        return 0
    if args.output != "text":
        print_data([{"revision": r.number, "name": r.name, "created": r.created, "current": r.spec_hash == current,
                     "packages": spec_summary(r.spec)} for r in revisions], args.output)
        return 0
    if not revisions:
        print(f"NodeGate {args.gate} has no revisions yet (the operator records one per rollout spec).")
        return 0
    rows = [["REVISION", "CREATED", "CURRENT", "PACKAGES"]]
    rows += [[str(r.number), r.created, "*" if r.spec_hash == current else "", spec_summary(r.spec)]
             for r in revisions]
    print(f"NodeGate {args.gate}\n" + table(rows), end="")
    return 0


async def _undo(args: argparse.Namespace) -> int:
    from gate.cli.kubectx import connect
    from gate.cli.targets import changed
    from gate.kube.client import NODEGATES
    from gate.kube.errors import Conflict
    from gate.rollout.history import UndoError, spec_summary, undo_target

    gate, current, revisions = await _revisions(args)
    try:
        target = undo_target(revisions, current, args.to_revision)
    except UndoError as exc:
        raise CliError(f"NodeGate {args.gate}: {exc}") from None
    spec = gate.get("spec") or {}
    if target.spec_hash == current:
        print(f"NodeGate {args.gate} is at revision {target.number}'s spec already; nothing changed.")
        return 0
    wanted = dict(target.spec)
    if "paused" in spec:
        wanted["paused"] = spec["paused"]
    patch = [{"op": "replace", "path": "/metadata/resourceVersion", "value": gate["metadata"]["resourceVersion"]},
             {"op": "replace", "path": "/spec", "value": wanted}]
    async with connect(args) as client:
        try:
            await client.patch(NODEGATES, args.gate, patch, patch_type="json", dry_run=args.dry_run)
        except Conflict:
            raise CliError(f"NodeGate {args.gate} changed while undo read it; nothing was written, run undo "
                           "again") from None
    before = spec_summary({"packages": spec.get("packages") or {}})
    changed(f"NodeGate {args.gate}: rolled back to the spec of revision {target.number} ({spec_summary(wanted)}; "
            f"was {before}). It rolls out as any spec change does; the operator records it as the newest "
            "revision.", args.dry_run)
    return 0


def register(sub: Any) -> None:
    from gate.cli.fleet import cluster_parents

    cluster, dry = cluster_parents()
    rollout = sub.add_parser("rollout", help="a NodeGate's previous specs: history, and undo to one of them")
    verbs = rollout.add_subparsers(dest="verb", required=True, metavar="{history,undo}")
    history = verbs.add_parser("history", parents=[cluster],
                               help="list the gate's revisions (ControllerRevisions), or show one")
    history.add_argument("gate", metavar="GATE")
    history.add_argument("--revision", type=int, help="show this revision's spec")
    history.add_argument("--output", "-o", choices=("text", "json", "yaml"), default="text",
                         help="output format (default text; a revision's spec is YAML unless json)")
    history.set_defaults(func=cmd_history)
    undo = verbs.add_parser("undo", parents=[cluster, dry],
                            help="write a previous revision's spec back to the gate (as you, through admission)")
    undo.add_argument("gate", metavar="GATE")
    undo.add_argument("--to-revision", type=int, help="the revision to go back to (default: the one before the "
                      "current spec)")
    undo.set_defaults(func=cmd_undo)
