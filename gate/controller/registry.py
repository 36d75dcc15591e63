"""A small OCI registry client: what digest does a tag name now (the distribution API, over aiohttp).

`resolve_digest(reference, credentials)` asks the registry for the manifest of `repository:tag`
(`HEAD /v2/<repository>/manifests/<tag>`, falling back to `GET` when a registry answers a HEAD
without `Docker-Content-Digest` or refuses it) and returns its digest. The operator calls it once per
package and rollout (`gate.lifecycle.images`).

Decisions:

* **The digest is the one a node would pull.** The Accept header lists the OCI and Docker manifests
  and indexes, so a multi-platform image resolves to its index, as containerd resolves it; the
  kubelet then picks its platform's manifest from that index by itself.
* **A body is verified.** After a GET the digest is computed over the body; a
  `Docker-Content-Digest` that differs from it is refused (a proxy or a registry that serves one
  thing and names another).
* **Names are qualified as containerd does**, by the rule the image policy follows too
  (`gate.api.references`): `nvidia/x` is `docker.io/nvidia/x`, `ubuntu` is
  `docker.io/library/ubuntu`; Docker Hub's API lives at registry-1.docker.io.
* **Authentication as a kubelet does it**: anonymous first; a `401` with a Bearer challenge gets a
  token from the realm it names (with the package's pull credentials, if any, else anonymously), a
  Basic challenge the credentials themselves. The credentials come from the package's
  `imagePullSecrets` (`kubernetes.io/dockerconfigjson` or `kubernetes.io/dockercfg`), matched by
  registry host (`credentials_for`).
* **Plain HTTP only to the loopback** (localhost, 127.0.0.0/8, ::1), as Docker and containerd treat
  it, and to the registries the installer lists as plain HTTP (`plain_http`, the operator's
  `--registry-plain-http`; what the nodes' containerd is configured to pull over HTTP, such as the
  dev cluster's registry at its nodes' gateway). No credentials are ever sent to a listed one: the
  wire is readable. Every other registry is HTTPS with the system's trust store.
* **Only registries are asked** (`gate.controller.egress`): a Bearer realm must be the registry's own
  host or one the installer lists (`token_hosts`), and is judged before the credentials go there;
  redirects are followed by hand, each hop judged (no plain HTTP off the loopback), and the
  credentials never follow one to another host; no link-local or metadata address is contacted,
  judged on the URL and on every address a name resolves to, before connecting. A refusal is a
  `RegistryError` that names the image and the rule, and surfaces where every resolution error does
  (the gate's `ImagesResolved` condition and a `ResolveFailed` Event).
* **Bounded.** Every request has a connect and a total timeout; an error names the image, the
  registry and the HTTP status (`RegistryError`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urljoin

import aiohttp

from gate.api.references import DOCKER_HUB, registry_of_host, split_name
from gate.controller.egress import (
    EgressRefused,
    GuardedResolver,
    loopback_host,
    realm_refusal,
    redirect_refusal,
    same_host,
    url_refusal,
)

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
DOCKER_HUB_API = "registry-1.docker.io"
MAX_MANIFEST = 4 * 1024 * 1024  # distribution's own limit on a manifest's size
_DIGEST = re.compile(r"^(sha256|sha512):[0-9a-f]{64,128}$")


class RegistryError(Exception):
    """A reference could not be resolved; the message names the image, the registry and what it answered."""

    def __init__(self, reference: str, registry: str, problem: str, status: int | None = None) -> None:
        where = f"registry {registry}" if registry else "no registry"
        answered = f" (HTTP {status})" if status is not None else ""
        super().__init__(f"cannot resolve image {reference} at {where}: {problem}{answered}")
        self.reference = reference
        self.registry = registry
        self.status = status


class DigestMismatch(RegistryError):
    """The registry served bytes that are not the digest they were asked for by."""


@dataclass(frozen=True)
class Target:
    """Where a tagged reference's manifest lives."""

    registry: str  # as the reference names it, qualified (docker.io for Docker Hub)
    repository: str  # path inside the registry
    tag: str
    plain_http: bool = False  # a registry the installer lists as plain HTTP (`registry_session`)

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def scheme(self) -> str:
        return "http" if self.plain_http or loopback(self.api_host) else "https"

    @property
    def manifest_url(self) -> str:
        return f"{self.scheme}://{self.api_host}/v2/{self.repository}/manifests/{self.tag}"


def loopback(host: str) -> bool:
    """The host (with an optional port) is this machine, by the rule the egress guard applies to plain
    http (`gate.controller.egress.loopback_host`): the registry is spoken to over http exactly where the
    guard allows it."""
    return loopback_host(host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host)


_PATH = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")


def target_of(reference: str) -> Target | str:
    """The registry (qualified as containerd does), repository and tag of a tagged reference, or why
    it has none."""
    if "@" in reference:
        return f"{reference} is pinned by digest already"
    head, slash, last = reference.rpartition("/")
    name, colon, tag = last.partition(":")
    if not colon or not _TAG.match(tag):
        return f"{reference} has no tag (or not one a registry accepts)"
    registry, repository = split_name(f"{head}{slash}{name}")
    if not _PATH.match(repository):
        return f"{reference}: {repository!r} is not a repository path (lowercase components joined by /)"
    return Target(registry, repository, tag)


_PARAM = re.compile(r'([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))')


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """A `WWW-Authenticate` header as its scheme (lower case) and parameters:
    `Bearer realm="https://auth.example/token",service="registry",scope="repository:a/b:pull"`."""
    scheme, _, rest = header.strip().partition(" ")
    params = {m.group(1).lower(): (m.group(2) if m.group(2) is not None else m.group(3)).replace('\\"', '"')
              for m in _PARAM.finditer(rest)}
    return scheme.lower(), params


def _host_of(key: str) -> str:
    """A dockerconfig `auths` key (`https://index.docker.io/v1/`, `host:5000`, `host/path`) as a registry host."""
    host = re.sub(r"^[a-z]+://", "", key.strip()).split("/", 1)[0]
    return registry_of_host(host)


def credentials_for(registry: str, config: Mapping[str, Any]) -> tuple[str, str] | None:
    """User and password for `registry` from a docker config (`{"auths": {...}}`, or the legacy
    dockercfg's bare mapping): its `auth` (base64 of user:password) or `username`/`password`."""
    nested = config.get("auths")
    auths: Mapping[str, Any] = nested if isinstance(nested, Mapping) else config
    for key, entry in auths.items():
        if not isinstance(entry, Mapping) or _host_of(str(key)) != registry:
            continue
        if entry.get("auth"):
            try:
                user, sep, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                continue
            if sep:
                return user, password
        if entry.get("username") is not None:
            return str(entry["username"]), str(entry.get("password") or "")
    return None


def docker_config(secret: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The docker config a pull Secret holds, or None when it is of another type or unreadable."""
    data = secret.get("data") or {}
    raw = {"kubernetes.io/dockerconfigjson": data.get(".dockerconfigjson"),
           "kubernetes.io/dockercfg": data.get(".dockercfg")}.get(secret.get("type") or "")
    if not raw:
        return None
    try:
        parsed = json.loads(base64.b64decode(raw))
    except (binascii.Error, ValueError):
        return None
    return parsed if isinstance(parsed, Mapping) else None


def body_digest(algorithm: str, body: bytes) -> str:
    return f"{algorithm}:{hashlib.new(algorithm, body).hexdigest()}"


async def resolve_digest(reference: str, credentials: tuple[str, str] | None = None, *,
                         timeout: float = 15.0, token_hosts: Collection[str] = (),
                         plain_http: Collection[str] = ()) -> str:
    """The manifest digest `reference` (repository:tag) names now at its registry. `token_hosts`: the
    hosts besides the registry's own that a Bearer realm may name (`gate.controller.egress`)."""
    target = target_of(reference)
    if isinstance(target, str):
        raise RegistryError(reference, "", target)
    async with registry_session(reference, target, credentials, timeout=timeout, token_hosts=token_hosts,
                                plain_http=plain_http) as reg:
        return await reg.resolve()


@asynccontextmanager
async def registry_session(reference: str, target: Target, credentials: tuple[str, str] | None = None, *,
                           timeout: float = 15.0, token_hosts: Collection[str] = (),
                           plain_http: Collection[str] = ()) -> AsyncIterator[RegistrySession]:
    """A session with `target`'s registry for several reads of its repository (the resolution, or a
    signature lookup: `gate.controller.signatures`), one authorization shared by them. Timeouts and
    connection failures inside it are raised as a `RegistryError` naming `reference`. `plain_http`:
    the registries (`host:port`) listed as plain HTTP; one of them gets no credentials."""
    plain = frozenset(h.strip().lower() for h in plain_http if h.strip())
    if target.registry.lower() in plain:
        target, credentials = replace(target, plain_http=True), None
    limits = aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 5.0))
    resolver = GuardedResolver()  # the connector does not close a resolver it was given: closed below
    try:
        async with aiohttp.ClientSession(timeout=limits,
                                         connector=aiohttp.TCPConnector(resolver=resolver)) as session:
            yield RegistrySession(session, reference, target, credentials, token_hosts, plain)
    except TimeoutError as exc:
        raise RegistryError(reference, target.registry, f"no answer within {timeout:g}s") from exc
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, EgressRefused):  # refused on the resolved address, before connecting
            raise RegistryError(reference, target.registry, f"refused to connect: {exc.os_error}") from exc
        raise RegistryError(reference, target.registry, f"{type(exc).__name__}: {exc}") from exc
    except aiohttp.ClientError as exc:
        raise RegistryError(reference, target.registry, f"{type(exc).__name__}: {exc}") from exc
    finally:
        await resolver.close()


MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)


class RegistrySession:
    """Reads of one repository at its registry, and the authentication they ask for on the way."""

    def __init__(self, session: aiohttp.ClientSession, reference: str, target: Target,
                 credentials: tuple[str, str] | None, token_hosts: Collection[str] = (),
                 plain_http: Collection[str] = ()) -> None:
        self.session = session
        self.reference = reference
        self.target = target
        self.credentials = credentials
        self.token_hosts = token_hosts
        self.plain_http = plain_http
        self.authorization: str | None = None
        self.requests = 0  # HTTP requests sent (redirect hops and token requests included): the cost figure

    def error(self, problem: str, status: int | None = None) -> RegistryError:
        return RegistryError(self.reference, self.target.registry, problem, status)

    def url(self, kind: str, ref: str) -> str:
        """The API URL of one of the repository's `manifests`, `blobs` or `referrers` (by tag or digest)."""
        return f"{self.target.scheme}://{self.target.api_host}/v2/{self.target.repository}/{kind}/{ref}"

    async def resolve(self) -> str:
        """The digest the reference's tag names now."""
        status, headers, _ = await self.fetch("HEAD", self.target.manifest_url)
        digest = headers.get("Docker-Content-Digest", "")
        if status == 200 and _DIGEST.match(digest):
            return digest
        if status not in (200, 405):
            raise self._refusal(status)
        # No digest in the answer to HEAD (or HEAD refused): the body tells, and is checked against it.
        status, headers, body = await self.fetch("GET", self.target.manifest_url)
        if status != 200:
            raise self._refusal(status)
        named = headers.get("Docker-Content-Digest", "")
        algorithm = named.partition(":")[0] if _DIGEST.match(named) else "sha256"
        computed = body_digest(algorithm, body)
        if named and named != computed:
            raise self.error(f"the registry named the manifest {named} but its body is {computed}")
        return computed

    async def manifest(self, ref: str, accept: Collection[str] = MANIFEST_TYPES) -> bytes | None:
        """The body of the manifest under `ref` (a tag or a digest), or None when there is none (404).
        By digest, the body must hash to it; by tag, to the `Docker-Content-Digest` the registry names."""
        status, headers, body = await self.fetch("GET", self.url("manifests", ref), accept)
        if status == 404:
            return None
        if status != 200:
            raise self._refusal(status)
        named = ref if _DIGEST.match(ref) else headers.get("Docker-Content-Digest", "")
        if _DIGEST.match(named) and body_digest(named.partition(":")[0], body) != named:
            raise self.error(f"the registry served a manifest under {ref} whose body is not {named}")
        return body

    async def referrers(self, digest: str) -> bytes | None:
        """The OCI referrers API's index for `digest`, or None when the registry does not offer the API
        (404, as registries without it answer; a 404 for an unknown digest reads the same)."""
        status, _, body = await self.fetch("GET", self.url("referrers", digest), (MANIFEST_TYPES[0],))
        if status in (404, 405):
            return None
        if status != 200:
            raise self._refusal(status)
        return body

    async def blob(self, digest: str, limit: int = MAX_MANIFEST) -> bytes | None:
        """The blob `digest` (at most `limit` bytes), checked against its digest; None when missing."""
        if not _DIGEST.match(digest):
            raise self.error(f"{digest!r} is not a digest")
        status, _, body = await self.fetch("GET", self.url("blobs", digest), ("*/*",), limit)
        if status == 404:
            return None
        if status != 200:
            raise self._refusal(status)
        if body_digest(digest.partition(":")[0], body) != digest:
            raise DigestMismatch(self.reference, self.target.registry,
                                 f"the registry served the blob {digest} with other bytes")
        return body

    def _refusal(self, status: int) -> RegistryError:
        if status == 404:
            return self.error("the registry has no manifest under that tag (not pushed, or a typo)", status)
        if status in (401, 403):
            who = "with the package's pull credentials" if self.credentials else "anonymously"
            return self.error(f"access refused {who}; give the package an imagePullSecret that may pull it, "
                              "and let the operator read it (docs/security.md)", status)
        return self.error("unexpected answer", status)

    async def fetch(self, method: str, url: str, accept: Collection[str] = MANIFEST_TYPES,
                    limit: int = MAX_MANIFEST) -> tuple[int, Mapping[str, str], bytes]:
        """`method url` on the repository's registry, authenticating when it asks (once)."""
        for _ in range(2):  # once, and once more after a 401 told how to authenticate
            status, headers, body = await self._follow(method, url, accept, limit)
            if status != 401 or self.authorization is not None:
                return status, headers, body
            self.authorization = await self._authorize(headers.get("WWW-Authenticate", ""))
        return 401, {}, b""

    async def _follow(self, method: str, url: str, accept: Collection[str],
                      limit: int) -> tuple[int, Mapping[str, str], bytes]:
        """The answer to `method url`, redirects followed by hand: each hop is judged before it is asked
        (`gate.controller.egress`), and the credentials go only to the registry's own host."""
        for _ in range(MAX_REDIRECTS + 1):
            refused = url_refusal(url, self.plain_http)
            if refused is not None:
                raise self.error(f"refused to ask {refused}")
            headers = {"Accept": ", ".join(accept)}
            if self.authorization and same_host(url, self.target.manifest_url):
                headers["Authorization"] = self.authorization
            self.requests += 1
            async with self.session.request(method, url, headers=headers, allow_redirects=False) as resp:
                location = resp.headers.get("Location")
                if resp.status in _REDIRECTS and location:
                    url = urljoin(url, location)
                    refused = redirect_refusal(url, self.plain_http)
                    if refused is not None:
                        raise self.error(refused, resp.status)
                    continue
                body = b""
                if method == "GET" and resp.status == 200:
                    if (resp.content_length or 0) > limit:
                        raise self.error(f"the answer to {url} is larger than {limit} bytes")
                    body = await _read_capped(resp.content, limit + 1)
                    if len(body) > limit:
                        raise self.error(f"the answer to {url} is larger than {limit} bytes")
                return resp.status, resp.headers, body
        raise self.error(f"more than {MAX_REDIRECTS} redirects")

    async def _authorize(self, challenge: str) -> str:
        scheme, params = parse_challenge(challenge)
        if scheme == "basic":
            if self.credentials is None:
                raise self._refusal(401)
            return _basic(self.credentials)
        if scheme != "bearer" or not params.get("realm"):
            raise self.error(f"the registry asked for authentication it did not name as Bearer or Basic: "
                             f"{challenge or '(no WWW-Authenticate header)'}", 401)
        realm = params["realm"]
        refused = realm_refusal(realm, self.target.manifest_url, self.token_hosts)
        if refused is not None:  # before any request: neither the credentials nor a probe go there
            raise self.error(refused, 401)
        query = {"scope": params.get("scope") or f"repository:{self.target.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        headers = {"Authorization": _basic(self.credentials)} if self.credentials else {}
        self.requests += 1
        # No redirect is followed from the token service: the credentials were sent to it alone.
        async with self.session.get(realm, params=query, headers=headers, allow_redirects=False) as resp:
            if resp.status != 200:
                raise self.error(f"the token service {realm} refused a pull token "
                                 f"({'with' if self.credentials else 'without'} credentials)", resp.status)
            try:
                answer = await resp.json(content_type=None)
            except ValueError as exc:
                raise self.error(f"the token service {realm} answered no JSON") from exc
        token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) else None
        if not token:
            raise self.error(f"the token service {realm} answered no token")
        return f"Bearer {token}"


async def _read_capped(stream: aiohttp.StreamReader, cap: int) -> bytes:
    """The body, up to `cap` bytes: `read(n)` returns what has arrived so far, not n bytes."""
    chunks: list[bytes] = []
    size = 0
    while size < cap:
        chunk = await stream.read(cap - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _basic(credentials: tuple[str, str]) -> str:
    return "Basic " + base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()
