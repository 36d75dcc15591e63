"""`nodegate version`: this command's version, and the version of the operator running in the cluster.

The operator that acts is the one holding the leader election Lease, and it records its version on
that Lease with every renewal (annotation `nodegate.io/version`, see `gate.kube.lease`). So the
answer names the version that is actually leading, even in the middle of an upgrade where two
replicas of different versions run, and works however NodeGate was installed (Helm, plain
manifests, a process on a laptop). A Deployment's image tag would say neither.
"""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime
from typing import Any

from gate import __version__
from gate.api import keys

DEFAULT_LEASE = "nodegate-operator"


def cmd_version(args: argparse.Namespace) -> int:
    print(f"nodegate {__version__}", flush=True)
    if args.client:
        return 0
    return asyncio.run(_operator_version(args))


def _age(renewed: str | None, now: datetime) -> str:
    if not renewed:
        return ""
    from gate.kube.objects import parse_time

    at = parse_time(renewed)
    if at is None:
        return ""
    seconds = max(0, int((now - at).total_seconds()))
    return f", renewed {seconds}s ago" if seconds < 120 else f", renewed {seconds // 60}m ago"


def describe_operator(lease: dict[str, Any] | None, where: str, now: datetime) -> str:
    """The second line of `nodegate version`, from the operator's Lease (None: there is none)."""
    if lease is None:
        return (f"operator: not found (no Lease {where}; is the operator installed there? "
                "--namespace and --lease name another)")
    spec = lease.get("spec") or {}
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    version = annotations.get(keys.OPERATOR_VERSION_ANNOTATION)
    holder = spec.get("holderIdentity") or ""
    if not holder:
        last = f"; the last one was {version}" if version else ""
        return f"operator: none is leading (the Lease {where} was released{last})"
    if version is None:
        return f"operator: unknown version (its leader {holder} is an operator too old to record it)"
    return f"operator {version} (leader {holder}, Lease {where}{_age(spec.get('renewTime'), now)})"


async def _operator_version(args: argparse.Namespace) -> int:
    from gate.cli.kubectx import connect
    from gate.kube.client import LEASES
    from gate.kube.errors import NotFound

    where = f"{args.namespace}/{args.lease}"
    async with connect(args) as client:
        try:
            lease: dict[str, Any] | None = await client.get(LEASES, args.lease, args.namespace)
        except NotFound:
            lease = None
    print(describe_operator(lease, where, datetime.now(UTC)))
    return 0 if lease is not None else 1


def register(sub: Any) -> None:
    from gate.cli.fleet import cluster_parents

    cluster, _ = cluster_parents()
    version = sub.add_parser("version", parents=[cluster],
                             help="print this command's version and the running operator's")
    version.add_argument("--client", action="store_true", help="only this command's version (no cluster needed)")
    version.add_argument("--lease", default=DEFAULT_LEASE,
                         help=f"the operator's leader election Lease (default {DEFAULT_LEASE})")
    version.set_defaults(func=cmd_version)
