"""`nodegate operator run`: the operator process."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import signal
import sys
from typing import Any


def register(sub: Any) -> None:
    from gate.controller.settings import OperatorSettings

    op = sub.add_parser("operator", help="the operator that rolls NodeGates across the fleet")
    op_sub = op.add_subparsers(dest="operator_command", required=True, metavar="ACTION")
    run = op_sub.add_parser("run", help="run the operator (leader-elected; safe to run several replicas)")
    OperatorSettings.add_arguments(run)
    run.set_defaults(func=cmd_run)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"ts": self.formatTime(record), "level": record.levelname, "logger": record.name,
                           "msg": record.getMessage()})


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def cmd_run(args: argparse.Namespace) -> int:
    from gate.controller.settings import OperatorSettings

    settings = OperatorSettings.from_args(args)
    if settings.event_loop not in ("uvloop", "asyncio"):
        print(f"nodegate operator: --event-loop must be uvloop or asyncio, not {settings.event_loop!r}",
              file=sys.stderr)
        return 2
    from gate.kube.fence import LeaseTiming

    try:
        LeaseTiming(settings.lease_seconds, settings.renew_seconds, settings.renew_deadline)
    except ValueError as exc:
        print(f"nodegate operator: --lease-seconds, --renew-seconds, --renew-deadline: {exc}", file=sys.stderr)
        return 2
    if settings.image_signatures:
        from gate.controller.imagetrust import read_policy

        try:
            read_policy(settings.image_signatures)
        except ValueError as exc:  # refused now, not an operator that verifies nothing
            print(f"nodegate operator: --image-signatures: {exc}", file=sys.stderr)
            return 2
        if not settings.resolve_digests:
            print("nodegate operator: --image-signatures needs --resolve-digests true: a signature is judged for "
                  "a digest, and a tag pulled as a tag could name other content than the one judged", file=sys.stderr)
            return 2
    setup_logging(settings.log_level, settings.log_format)
    # The caches hold every Node and stage pod, a few hundred thousand objects at 5,000 nodes, and they
    # live until the next version replaces them. The cyclic collector's default pace (a young collection
    # every 700 allocations, a full one as soon as the survivors grow by a quarter) scans them over and
    # over while a watch event is parsed; what dies young here is mostly parsed JSON, which reference
    # counting frees without it. Collect young objects less often; `Operator` takes what it holds once
    # its caches are filled out of the collector's scans (`gc.freeze`).
    gc.set_threshold(50_000, 20, 20)
    if settings.event_loop == "uvloop":
        import uvloop

        return uvloop.run(_run(settings))
    return asyncio.run(_run(settings))


async def _run(settings: Any) -> int:
    from gate.admission.rules.catalog_inputs import CATALOG_INPUTS
    from gate.controller.clients import open_clients
    from gate.controller.operator import Operator
    from gate.lifecycle.serving import ServingCatalog

    clients = await open_clients(settings)
    # Which packages stage while serving (their serving steps, the catalog's version): the catalog's inputs.
    operator = Operator(settings, clients, serving=ServingCatalog.from_inputs(CATALOG_INPUTS))
    task = asyncio.create_task(operator.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        logging.getLogger("nodegate.operator").info("Shut down; lease released")
    finally:
        await clients.close()
    return 0
