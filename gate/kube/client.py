"""A thin async Kubernetes client: raw JSON over one aiohttp session.

Where the server is and who asks is a `gate.kube.config.Connection` (a pod's ServiceAccount, or a
kubeconfig read by `kubernetes.aio`); requests are plain dicts in and out. The operator handles
thousands of nodes: decoding every object into generated model classes would cost more than the
rest of a reconcile, and the pure layers work on dicts and pydantic models of our own anyway.
"""

from __future__ import annotations

import collections
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import orjson
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from gate.api.common import Obj
from gate.kube import config as kubeconfig
from gate.kube.errors import ApiError, ConnectionFailed, Gone, api_error
from gate.kube.fence import Fence

PatchType = Literal["merge", "json", "strategic", "apply"]

_PATCH_CONTENT = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "apply": "application/apply-patch+yaml",
}


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the REST API."""

    group: str
    version: str
    plural: str
    namespaced: bool
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base


NODES = Resource("", "v1", "nodes", False, "Node")
PODS = Resource("", "v1", "pods", True, "Pod")
NAMESPACES = Resource("", "v1", "namespaces", False, "Namespace")
CONFIGMAPS = Resource("", "v1", "configmaps", True, "ConfigMap")
SECRETS = Resource("", "v1", "secrets", True, "Secret")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", True, "ServiceAccount")
SERVICES = Resource("", "v1", "services", True, "Service")
# The chart's LimitRange for package pods (charts/nodegate/templates/package-limitrange.yaml).
LIMITRANGES = Resource("", "v1", "limitranges", True, "LimitRange")
EVENTS = Resource("events.k8s.io", "v1", "events", True, "Event")
JOBS = Resource("batch", "v1", "jobs", True, "Job")
PDBS = Resource("policy", "v1", "poddisruptionbudgets", True, "PodDisruptionBudget")
LEASES = Resource("coordination.k8s.io", "v1", "leases", True, "Lease")
DAEMONSETS = Resource("apps", "v1", "daemonsets", True, "DaemonSet")
DEPLOYMENTS = Resource("apps", "v1", "deployments", True, "Deployment")
CONTROLLER_REVISIONS = Resource("apps", "v1", "controllerrevisions", True, "ControllerRevision")
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", False, "CustomResourceDefinition")
SUBJECT_ACCESS_REVIEWS = Resource("authorization.k8s.io", "v1", "subjectaccessreviews", False, "SubjectAccessReview")
VALIDATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", False,
    "ValidatingWebhookConfiguration",
)
MUTATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", False,
    "MutatingWebhookConfiguration",
)
# The chart's host-access policy (charts/nodegate/templates/host-access-policy.yaml).
VALIDATING_POLICIES = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", False, "ValidatingAdmissionPolicy",
)
VALIDATING_POLICY_BINDINGS = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", False,
    "ValidatingAdmissionPolicyBinding",
)
CLUSTERROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles", False, "ClusterRole")
CLUSTERROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "clusterrolebindings", False, "ClusterRoleBinding")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", True, "Role")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", True, "RoleBinding")
NODEGATES = Resource("nodegate.io", "v1alpha1", "nodegates", False, "NodeGate")
POLICIES = Resource("nodegate.io", "v1alpha1", "deploymentpolicies", False, "DeploymentPolicy")
KWOK_STAGES = Resource("kwok.x-k8s.io", "v1alpha1", "stages", False, "Stage")

_BUILTIN = [
    NODES, PODS, NAMESPACES, CONFIGMAPS, SECRETS, SERVICEACCOUNTS, SERVICES, LIMITRANGES, EVENTS, JOBS, PDBS, LEASES,
    DAEMONSETS, DEPLOYMENTS, CONTROLLER_REVISIONS, CRDS, VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS, VALIDATING_POLICIES,
    VALIDATING_POLICY_BINDINGS, CLUSTERROLES, CLUSTERROLEBINDINGS, ROLES, ROLEBINDINGS, NODEGATES, POLICIES,
    KWOK_STAGES,
]
_BY_KIND = {(r.api_version, r.kind): r for r in _BUILTIN}


def resource_for(obj: Obj) -> Resource:
    """The Resource of a manifest (only the kinds NodeGate itself touches)."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    if key not in _BY_KIND:
        raise ValueError(f"unknown kind {key[1]!r} of {key[0]!r}")
    return _BY_KIND[key]


def resource_of(path: str) -> str:
    """The resource a request path addresses, for counting: `nodes`, `jobs`, `pods/eviction`, ..."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:] if parts[:1] == ["apis"] else parts
    if len(parts) >= 2 and parts[0] == "namespaces" and (len(parts) > 2 or not parts[1]):
        parts = parts[2:]
    if not parts:
        return "-"
    return parts[0] if len(parts) < 3 else f"{parts[0]}/{parts[2]}"


# Connections open at once, the watches' among them. Each TLS connection holds a 256 KiB read buffer
# (uvloop's SSL protocol and asyncio's alike), and a batch's writes open as many as they may: 32 bound
# that to 8 MiB (64 did to 16). An API server on two cores is saturated well below 32 requests at once:
# `bench.rollout --nodes 1000` gave the same makespan and operator CPU with 32 as with 64.
CONNECTIONS = 32
# Methods that change nothing: never fenced.
_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def versioned(method: str, body: Any) -> bool:
    """The write carries a resourceVersion the API server checks (a compare-and-swap): a PUT or PATCH
    with `metadata.resourceVersion`, a DELETE with a resourceVersion precondition. Such a write cannot
    land over a newer one by a standby; any other can (`gate.kube.fence`)."""
    if not isinstance(body, dict):
        return False
    if method == "DELETE":
        return bool((body.get("preconditions") or {}).get("resourceVersion"))
    if method in ("PUT", "PATCH"):
        meta = body.get("metadata")
        return isinstance(meta, dict) and bool(meta.get("resourceVersion"))
    return False  # a create or a subresource POST (an eviction): nothing to compare


class _FencedConnector(aiohttp.TCPConnector):
    """Checks the fence once a write has its connection, the last moment before its bytes go out.

    aiohttp writes the request right after `connect` returns, with no await in between, so a write
    that waited for one of the pool's connections is judged when it leaves, not when it was queued.
    """

    def __init__(self, fence: Fence, **kw: Any) -> None:
        super().__init__(**kw)
        self._fence = fence

    async def connect(self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout) -> Connection:
        conn = await super().connect(req, traces, timeout)
        if req.method not in _READS and not self._fence.holds():
            conn.release()  # nothing was written on it: back to the pool
            self._fence.check(f"{req.method} {req.url.path}")
        return conn


class KubeClient:
    """One connection pool to one API server, authenticated as one identity.

    `connections` bounds the pool. With a `fence` (`gate.kube.fence`), every request that is not a
    read is refused (`LeadershipLost`) unless the fence holds when it would go out: the operator's
    work client, whose writes must stop with its leadership.
    """

    def __init__(self, connection: kubeconfig.Connection, *, user_agent: str = "nodegate",
                 timeout: float = 30.0, connections: int = CONNECTIONS, fence: Fence | None = None) -> None:
        self._cfg = connection
        self.base_url = connection.host.rstrip("/")
        ctx = ssl.create_default_context(cafile=connection.ca_file)
        if connection.cert_file:
            ctx.load_cert_chain(connection.cert_file, connection.key_file)
        if not connection.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self._ssl = ctx
        self._timeout = timeout
        self._connections = connections
        self.fence = fence
        self._session: aiohttp.ClientSession | None = None
        self.user_agent = user_agent
        self.requests = 0  # count of requests sent, for the benchmarks' requests-per-node figures
        self.requests_by: collections.Counter[tuple[str, str]] = collections.Counter()  # (verb, resource)

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    async def from_kubeconfig(cls, path: str | None = None, context: str | None = None, **kw: Any) -> KubeClient:
        return cls(await kubeconfig.from_kubeconfig(path, context), **kw)

    @classmethod
    def in_cluster(cls, **kw: Any) -> KubeClient:
        return cls(kubeconfig.in_cluster(), **kw)

    @classmethod
    async def from_environment(cls, kubeconfig: str | None = None, **kw: Any) -> KubeClient:
        """In a pod use the service account, elsewhere the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
        import os

        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
            return cls.in_cluster(**kw)
        return await cls.from_kubeconfig(kubeconfig or os.environ.get("KUBECONFIG"), **kw)

    def with_token(self, token: str) -> KubeClient:
        """A client for the same server authenticated by a bearer token instead (e.g. a TokenRequest)."""
        return KubeClient(self._cfg.with_bearer(token), user_agent=self.user_agent, timeout=self._timeout,
                          connections=self._connections)

    def sibling(self, *, user_agent: str, connections: int = CONNECTIONS, timeout: float | None = None,
                fence: Fence | None = None) -> KubeClient:
        """A client for the same server and identity with a pool of its own (and its own timeout and
        fence): requests of one never wait for the connections of the other."""
        return KubeClient(self._cfg, user_agent=user_agent, timeout=self._timeout if timeout is None else timeout,
                          connections=connections, fence=fence)

    @property
    def ca_file(self) -> str | None:
        return self._cfg.ca_file

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = (aiohttp.TCPConnector(ssl=self._ssl, limit=self._connections) if self.fence is None
                         else _FencedConnector(self.fence, ssl=self._ssl, limit=self._connections))
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers={"User-Agent": self.user_agent, "Accept": "application/json"},
            )
        return self._session

    async def _headers(self, content_type: str | None) -> dict[str, str]:
        headers: dict[str, str] = {}
        authorization = await self._cfg.authorization()  # a rotated token file or exec token, refreshed
        if authorization:
            headers["Authorization"] = authorization
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    # -- requests ---------------------------------------------------------------------------------

    async def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                      body: Any = None, content_type: str | None = None, timeout: float | None = None) -> Any:
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, str)) else orjson.dumps(body)
            content_type = content_type or "application/json"
        clean = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        wait = self._timeout if timeout is None else timeout
        if self.fence is not None and method not in _READS:
            # Early, not to wait for a connection in vain; again once it has one (`_FencedConnector`). A
            # write without a resourceVersion must also end before the fence does (`Fence.budget`).
            what = f"{method} {path}"
            wait = self.fence.budget(what, wait) if not versioned(method, body) else wait
            self.fence.check(what)
        self.requests += 1
        self.requests_by[(method, resource_of(path))] += 1
        try:
            async with self._sess().request(
                method, self.base_url + path, params=clean, data=data,
                headers=await self._headers(content_type),
                timeout=aiohttp.ClientTimeout(total=wait),
            ) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise _error(resp, raw.decode(errors="replace"), method, path)
                return orjson.loads(raw) if raw else None
        except (TimeoutError, aiohttp.ClientConnectionError, ssl.SSLError) as exc:
            raise ConnectionFailed(f"{method} {path}: {exc.__class__.__name__}: {exc}") from exc

    async def get_text(self, path: str, params: dict[str, Any] | None = None) -> str:
        """GET a plain-text endpoint, such as a pod's log."""
        clean = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        self.requests += 1
        try:
            async with self._sess().get(self.base_url + path, params=clean, headers=await self._headers(None),
                                        timeout=aiohttp.ClientTimeout(total=self._timeout)) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise _error(resp, text, "GET", path)
                return text
        except (aiohttp.ClientConnectionError, TimeoutError, ssl.SSLError) as exc:
            raise ConnectionFailed(f"GET {path}: {exc.__class__.__name__}: {exc}") from exc

    async def stream_text(self, path: str, params: dict[str, Any] | None = None) -> AsyncIterator[str]:
        """Stream a plain-text endpoint (a followed log) chunk by chunk until the server ends it."""
        clean = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        self.requests += 1
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout)
        try:
            async with self._sess().get(self.base_url + path, params=clean, headers=await self._headers(None),
                                        timeout=timeout) as resp:
                if resp.status >= 400:
                    raise _error(resp, await resp.text(), "GET", path)
                async for chunk in resp.content.iter_any():
                    yield chunk.decode(errors="replace")
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
            raise ConnectionFailed(f"GET {path}: {exc.__class__.__name__}: {exc}") from exc

    async def get(self, res: Resource, name: str, namespace: str | None = None,
                  subresource: str | None = None, *, timeout: float | None = None) -> Obj:
        result: Obj = await self.request("GET", res.path(namespace, name, subresource), timeout=timeout)
        return result

    async def list(self, res: Resource, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None, page_size: int = 500,
                   transform: Callable[[Obj], Obj] | None = None) -> tuple[list[Obj], str]:
        """Every object (paged), and the list's resourceVersion to start a watch from. `transform`
        is applied to each object as its page arrives (a cache's, `gate.kube.cache.WatchCache`)."""
        items: list[Obj] = []
        cont: str | None = None
        while True:
            page: Obj = await self.request("GET", res.path(namespace), params={
                "labelSelector": label_selector, "fieldSelector": field_selector,
                "limit": page_size, "continue": cont,
            })
            for item in page.get("items", []):
                item.setdefault("apiVersion", res.api_version)
                item.setdefault("kind", res.kind)
                items.append(item if transform is None else transform(item))
            cont = page.get("metadata", {}).get("continue")
            if not cont:
                return items, page.get("metadata", {}).get("resourceVersion", "")

    async def create(self, res: Resource, obj: Obj, namespace: str | None = None, *,
                     subresource_of: str | None = None, subresource: str | None = None,
                     dry_run: bool = False, timeout: float | None = None) -> Obj:
        ns = namespace or obj.get("metadata", {}).get("namespace")
        path = res.path(ns, subresource_of, subresource) if subresource_of else res.path(ns)
        result: Obj = await self.request("POST", path, body=obj, params={"dryRun": "All" if dry_run else None},
                                         timeout=timeout)
        return result

    async def replace(self, res: Resource, obj: Obj, *, subresource: str | None = None,
                      timeout: float | None = None) -> Obj:
        meta = obj["metadata"]
        result: Obj = await self.request("PUT", res.path(meta.get("namespace"), meta["name"], subresource), body=obj,
                                         timeout=timeout)
        return result

    async def patch(self, res: Resource, name: str, patch: Any, *, namespace: str | None = None,
                    patch_type: PatchType = "merge", subresource: str | None = None,
                    field_manager: str | None = None, force: bool = False, dry_run: bool = False) -> Obj:
        params: dict[str, Any] = {"fieldManager": field_manager, "dryRun": "All" if dry_run else None}
        if patch_type == "apply":
            params["fieldManager"] = field_manager or "nodegate"
            params["force"] = force
        result: Obj = await self.request(
            "PATCH", res.path(namespace, name, subresource), body=patch, params=params,
            content_type=_PATCH_CONTENT[patch_type],
        )
        return result

    async def apply(self, obj: Obj, *, field_manager: str = "nodegate", force: bool = True) -> Obj:
        """Server-side apply of a whole manifest."""
        res = resource_for(obj)
        meta = obj["metadata"]
        return await self.patch(res, meta["name"], obj, namespace=meta.get("namespace"), patch_type="apply",
                                field_manager=field_manager, force=force)

    async def delete(self, res: Resource, name: str, namespace: str | None = None, *,
                     body: Obj | None = None, missing_ok: bool = True) -> Obj | None:
        try:
            result: Obj | None = await self.request("DELETE", res.path(namespace, name), body=body)
            return result
        except ApiError as exc:
            if missing_ok and exc.status == 404:
                return None
            raise

    async def watch(self, res: Resource, namespace: str | None = None, *, resource_version: str,
                    label_selector: str | None = None, field_selector: str | None = None,
                    timeout_seconds: int = 290) -> AsyncIterator[tuple[str, Obj]]:
        """Events of one watch request: (type, object) with type ADDED, MODIFIED, DELETED, BOOKMARK.

        Ends when the server closes the watch; raises Gone when `resource_version` is too old.
        """
        params = {
            "watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
            "labelSelector": label_selector, "fieldSelector": field_selector, "timeoutSeconds": timeout_seconds,
        }
        clean = {k: _param(v) for k, v in params.items() if v is not None}
        path = res.path(namespace)
        self.requests += 1
        self.requests_by[("WATCH", resource_of(path))] += 1
        try:
            async with self._sess().get(
                self.base_url + path, params=clean, headers=await self._headers(None),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout, sock_read=timeout_seconds + 30),
            ) as resp:
                if resp.status >= 400:
                    raise _error(resp, await resp.text(), "WATCH", path)
                async for raw in _lines(resp.content):
                    event = orjson.loads(raw)
                    kind = event.get("type", "")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        code = int(obj.get("code", 500))
                        raise api_error(code, obj, method="WATCH", path=path)
                    obj.setdefault("apiVersion", res.api_version)
                    obj.setdefault("kind", res.kind)
                    yield kind, obj
        except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise ConnectionFailed(f"WATCH {path}: {exc.__class__.__name__}: {exc}") from exc


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    # Watch events are newline-delimited JSON; a single event (a big Node) can exceed aiohttp's
    # default line limit, so lines are assembled from chunks rather than with readline().
    buf = b""
    async for chunk in stream.iter_any():
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield line
    if buf.strip():
        yield buf


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _error(resp: aiohttp.ClientResponse, text: str, method: str, path: str) -> ApiError:
    try:
        body = orjson.loads(text) if text else {}
        if not isinstance(body, dict):
            body = {"message": text}
    except orjson.JSONDecodeError:
        body = {"message": text[:500]}
    retry = resp.headers.get("Retry-After")
    return api_error(resp.status, body, method=method, path=path,
                     retry_after=float(retry) if retry and retry.isdigit() else None)


__all__ = ["ApiError", "Gone", "KubeClient", "Resource", "resource_for"]
