"""Which nodes a command acts on (names or a label selector), and writing requests to many at once.

`nodegate node reset|ignore|unignore` and `nodegate reset` ask the operator for something on each of
many nodes. Every node named must exist before anything is written (a typo changes nothing), a
selector must match at least one, and the writes go out a few at a time: a fleet of thousands must
not open thousands of connections, nor wait for them one by one.

Imported by the handlers when they run (it loads the Kubernetes client), never by the parsers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from gate.api.common import Obj
from gate.cli.errors import CliError
from gate.kube.client import NODES, KubeClient
from gate.kube.errors import ApiError, NotFound

DRY_RUN_NOTE = " (server dry run: nothing was changed)"
CONCURRENT_WRITES = 16


def now_stamp() -> str:
    """The value of a request annotation: when it was asked for (RFC 3339, UTC)."""
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def changed(text: str, dry_run: bool) -> None:
    print(text + (DRY_RUN_NOTE if dry_run else ""))


async def select_nodes(client: KubeClient, names: Sequence[str], selector: str | None) -> list[Obj]:
    """The nodes named, or matching `selector`, sorted by name; CliError when one is missing or none match."""
    if names and selector:
        raise CliError("name nodes or give -l SELECTOR, not both")
    if not names and not selector:
        raise CliError("name at least one node, or give -l SELECTOR")
    if selector:
        try:
            items, _ = await client.list(NODES, label_selector=selector)
        except ApiError as exc:
            if exc.status == 400:
                raise CliError(f"-l {selector}: {exc.message}") from None
            raise
        if not items:
            raise CliError(f"no node matches -l {selector}")
        return sorted(items, key=lambda n: n["metadata"]["name"])

    async def get(name: str) -> Obj | None:
        try:
            return await client.get(NODES, name)
        except NotFound as exc:
            if not exc.details.get("name"):
                raise
            return None

    unique = sorted(set(names))
    found = await asyncio.gather(*(get(n) for n in unique))
    missing = [n for n, obj in zip(unique, found, strict=True) if obj is None]
    if missing:
        raise CliError(f"no node named {', '.join(missing)}")
    return [obj for obj in found if obj is not None]


async def patch_nodes(client: KubeClient, patches: Mapping[str, Obj], *, dry_run: bool) -> None:
    """Send each node its merge patch, at most CONCURRENT_WRITES at a time."""
    gate = asyncio.Semaphore(CONCURRENT_WRITES)

    async def one(name: str, patch: Obj) -> None:
        async with gate:
            await client.patch(NODES, name, patch, dry_run=dry_run)

    await asyncio.gather(*(one(n, p) for n, p in patches.items()))
