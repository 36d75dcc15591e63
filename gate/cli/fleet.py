"""The commands a person runs against a cluster: status, plan, pause, resume, delete, node, rerun, package logs.

This module only builds the parser. Each command lives in a module of its own, as kubectl keeps a
package per verb (`k8s.io/kubectl/pkg/cmd/<verb>`): `gate.cli.status`, `plan`, `pause` (pause and
resume), `delete`, `node_list`, `rerun`, with what they share in `snapshot` and `output`;
`gate.cli.nodes` and `gate.cli.logs` add to the groups. A handler imports its module when it runs
(the Kubernetes client, pydantic models, rich), so `nodegate version` and `--help` stay fast.

The operator is the only writer of node state and gate status. These commands read, or they ask:
`spec.paused` on a NodeGate, the `nodegate.io/resume` annotation on a NodeGate, the `reset.<gate>` and
`rerun.<gate>` annotations and the `nodegate.io/ignore` label on a Node. The operator acts on a request
and removes it. Every command that changes something takes `--dry-run` (a server-side dry run: the API
server and the admission webhooks see the request, nothing is stored) and prints what it changed.
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_NAMESPACE = "nodegate-system"
OUTPUTS = ("text", "json", "yaml")
RERUN_STAGES = ("apply", "config")


# The handlers import their command's module when they run; static imports, so import-linter and
# mypy see every edge.
def _status(args: argparse.Namespace) -> int:
    from gate.cli.status import cmd_status

    return cmd_status(args)


def _plan(args: argparse.Namespace) -> int:
    from gate.cli.plan import cmd_plan

    return cmd_plan(args)


def _pause(args: argparse.Namespace) -> int:
    from gate.cli.pause import cmd_pause

    return cmd_pause(args)


def _resume(args: argparse.Namespace) -> int:
    from gate.cli.pause import cmd_resume

    return cmd_resume(args)


def _delete(args: argparse.Namespace) -> int:
    from gate.cli.delete import cmd_delete

    return cmd_delete(args)


def _node_list(args: argparse.Namespace) -> int:
    from gate.cli.node_list import cmd_node_list

    return cmd_node_list(args)


def _rerun(args: argparse.Namespace) -> int:
    from gate.cli.rerun import cmd_rerun

    return cmd_rerun(args)


def subparsers_of(parser: argparse.ArgumentParser) -> Any:
    """The subcommands of a command group, so another module can add to the group."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def cluster_parents() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The flags every cluster command takes (kubeconfig, context, namespace), and `--dry-run`."""
    cluster = argparse.ArgumentParser(add_help=False)
    cluster.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    cluster.add_argument("--context", help="kubeconfig context to use (default: the current one)")
    cluster.add_argument("--namespace", "-n", default=DEFAULT_NAMESPACE,
                         help=f"the operator's namespace, where stage pods run (default {DEFAULT_NAMESPACE})")
    dry = argparse.ArgumentParser(add_help=False)
    dry.add_argument("--dry-run", action="store_true",
                     help="send the change as a server-side dry run: checked, admitted, not stored")
    return cluster, dry


def register(sub: Any) -> None:
    """Add status, plan, pause, resume, delete, node, rerun and `package logs` to the `nodegate` parser."""
    cluster, dry = cluster_parents()
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--output", "-o", choices=OUTPUTS, default="text", help="output format (default text)")

    status = sub.add_parser("status", parents=[cluster, output],
                            help="rollout status: per compartment progress, nodes in progress, failures, waits")
    status.add_argument("gate", nargs="?", metavar="GATE", help="one NodeGate (default: all)")
    status.add_argument("--watch", "-w", action="store_true", help="keep the status on screen, live, until Ctrl-C")
    status.set_defaults(func=_status)

    plan = sub.add_parser("plan", parents=[cluster, output],
                          help="the batches of a rollout, done, running and planned, assuming every node succeeds")
    plan.add_argument("gate", metavar="GATE")
    plan.set_defaults(func=_plan)

    pause = sub.add_parser("pause", parents=[cluster, dry], help="pause a NodeGate: no new work starts")
    pause.add_argument("gate", metavar="GATE")
    pause.set_defaults(func=_pause)

    resume = sub.add_parser("resume", parents=[cluster, dry],
                            help="unpause a NodeGate and resume its stopped compartments")
    resume.add_argument("gate", metavar="GATE")
    resume.add_argument("--compartment", "-c", action="append", default=[], metavar="NAME",
                        help="resume only this stopped compartment (repeatable; default: every stopped one)")
    resume.set_defaults(func=_resume)

    delete = sub.add_parser("delete", parents=[cluster, dry],
                            help="delete a NodeGate: its nodes are cleaned up (uninstall where enabled), then it goes")
    delete.add_argument("gate", metavar="GATE")
    delete.add_argument("--force", action="store_true",
                        help="also when it is paused: unpause it, so its removal goes on (a paused gate uninstalls "
                        "nothing)")
    delete.set_defaults(func=_delete)

    node = sub.add_parser("node", help="nodes and NodeGate: list, reset, ignore, unignore")
    node_sub = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    listing = node_sub.add_parser("list", parents=[cluster, output], help="nodes and their status per NodeGate")
    listing.add_argument("--gate", "-g", help="one NodeGate's nodes, with compartment, phase and failures")
    listing.set_defaults(func=_node_list)
    # `node reset|ignore|unignore` are in gate.cli.nodes, `package logs` in gate.cli.logs: a module per command.

    rerun = sub.add_parser("rerun", parents=[cluster, dry], help="run one package's stage on one node again")
    rerun.add_argument("gate", metavar="GATE")
    rerun.add_argument("--node", required=True, metavar="NODE")
    rerun.add_argument("--package", required=True, metavar="PACKAGE")
    rerun.add_argument("--stage", choices=RERUN_STAGES, default="apply",
                       help="apply: install again (default); config: apply the config files again")
    rerun.set_defaults(func=_rerun)
