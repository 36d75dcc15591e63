"""The CLI's connection to a cluster, and every API failure turned into one line a person can act on.

Commands open a client with `connect(args)` and run inside `api_errors()`: no cluster reachable, no
kubeconfig, refused credentials, no permission, CRDs not installed all become a `CliError` (one line,
exit code 2), never a traceback.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from gate.cli.errors import CliError
from gate.kube.client import KubeClient
from gate.kube.errors import ApiError, ConnectionFailed, Forbidden, NotFound, Unauthorized


@asynccontextmanager
async def connect(args: argparse.Namespace) -> AsyncIterator[KubeClient]:
    """A client for the cluster the flags (or the environment) name; closed on exit."""
    path = _first(getattr(args, "kubeconfig", None) or os.environ.get("KUBECONFIG") or None)
    context = getattr(args, "context", None)
    if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        client = KubeClient.in_cluster(user_agent="nodegate-cli")
    else:
        if path is None:
            path = os.path.expanduser("~/.kube/config")
            if not os.path.exists(path):
                raise CliError("no kubeconfig: set KUBECONFIG or pass --kubeconfig "
                               "(for a local cluster: `nodegate dev up` or `nodegate demo`)")
        elif not os.path.exists(path):
            raise CliError(f"the kubeconfig {path} does not exist")
        try:
            client = await KubeClient.from_kubeconfig(path, context=context, user_agent="nodegate-cli")
        except Exception as exc:  # kubernetes' ConfigException and whatever a broken file raises
            raise CliError(f"cannot use the kubeconfig {path}: {_first_line(exc)}") from None
    try:
        with api_errors(client.base_url):
            yield client
    finally:
        await client.close()


def _first(path: str | None) -> str | None:
    # KUBECONFIG may list several files; like kubectl we use them in order (the first that exists).
    if path is None or os.pathsep not in path:
        return path
    for part in path.split(os.pathsep):
        if part and os.path.exists(part):
            return part
    return path.split(os.pathsep)[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def api_errors(server: str = "") -> Iterator[None]:
    """Translate the Kubernetes client's failures into one-line CliErrors."""
    try:
        yield
    except (ApiError, ConnectionFailed) as exc:
        raise CliError(explain(exc, server)) from None


def explain(exc: ApiError | ConnectionFailed, server: str = "") -> str:
    """One line for a person: what went wrong talking to the cluster, and what to check."""
    if isinstance(exc, ConnectionFailed):
        where = f" at {server}" if server else ""
        return (f"cannot reach the Kubernetes API server{where} ({_cause(exc)}); "
                "is the cluster running and KUBECONFIG right?")
    if isinstance(exc, Unauthorized):
        return "the API server refused the credentials of the kubeconfig (401 Unauthorized)"
    if isinstance(exc, Forbidden):
        return f"no permission: {exc.message}"
    if isinstance(exc, NotFound) and missing_api(exc):
        return "the NodeGate CRDs are not installed in this cluster (see docs/install.md)"
    if isinstance(exc, NotFound):
        return exc.message
    return f"the API server refused: {exc.message}"


def _cause(exc: ConnectionFailed) -> str:
    # "GET /apis/...: ClientConnectorError: Cannot connect to host 127.0.0.1:1 ssl:... [Connect call failed ...]"
    text = _first_line(exc)
    _, _, rest = text.partition(": ")
    return rest or text


def missing_api(exc: NotFound) -> bool:
    """A 404 for the resource type itself (the API is not served: CRDs not installed), not for one
    object: a missing object's Status names it in `details`, a missing API answers "404 page not found"."""
    details: dict[str, Any] = exc.details
    return not details.get("name")
