"""Where the registry client may send a request: the rules, decided without I/O, and the resolver
that applies the address rules to what a name resolves to.

A package's image names its registry, and the registry's answers (a `WWW-Authenticate` realm, a
redirect) name further addresses. Followed blindly, they would make the operator, from inside the
cluster, ask any address for anything and hand it the package's pull credentials. So every address
the client is about to ask is judged first (`url_refusal`, `realm_refusal`, `redirect_refusal`), and
a refusal names the rule it broke. The rules:

* **Token realm** (`RULE_REALM`): a Bearer challenge's realm must be the registry's own host, or one
  the installer lists (`registry_token_hosts`, chart value `operator.images.tokenHosts`; Docker Hub
  answers from `registry-1.docker.io` with a realm on `auth.docker.io`). Only there do the pull
  credentials go.
* **Plain HTTP only on the loopback** (`RULE_PLAIN_HTTP`): a redirect or a realm may be `http://`
  only when its host is this machine (as Docker and containerd treat registries), or a registry the
  installer lists as plain HTTP (`registry_plain_http`, as the nodes' containerd is configured for
  it; no credentials go there: `gate.controller.registry`); everything else is HTTPS.
* **No link-local address** (`RULE_LINK_LOCAL`: 169.254.0.0/16, fe80::/10) and **no metadata
  service** (`RULE_METADATA`: the addresses and names clouds serve instance credentials on), judged
  on the literal host of a URL and, through `GuardedResolver`, on every address a name resolves to
  before any connection is made: a name that resolves to 169.254.169.254 is refused like the
  address itself, and a DNS answer cannot slip between the check and the connection, because the
  connection uses exactly the addresses checked.

Credentials never follow a redirect to another host (`same_host`); the client drops them there.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Collection
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

RULE_REALM = "token realm: the registry's own host or one of operator.images.tokenHosts"
RULE_PLAIN_HTTP = "plain HTTP only on the loopback"
RULE_LINK_LOCAL = "no link-local address"
RULE_METADATA = "no cloud metadata address"

# Instance metadata services: AWS (IPv4 and IPv6), GCP, Azure, Oracle, DigitalOcean (all
# 169.254.169.254), AWS ECS task metadata (169.254.170.2), Alibaba Cloud (100.100.100.200).
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200"))
METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data",
                            "instance-data.ec2.internal", "metadata.tencentyun.com"})


def address_refusal(address: str) -> str | None:
    """Why the operator may not connect to this IP address (None: it may)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # fe80::1%eth0: the zone is not the address
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in METADATA_ADDRESSES:
        return f"{address} is a cloud metadata service's address (rule: {RULE_METADATA})"
    if ip.is_link_local:
        return f"{address} is a link-local address (rule: {RULE_LINK_LOCAL})"
    return None


def host_refusal(host: str) -> str | None:
    """Why the operator may not ask this host, as a URL names it (an address or a name)."""
    name = host.strip("[]").rstrip(".").lower()
    if name in METADATA_NAMES:
        return f"{host} is a cloud metadata service's name (rule: {RULE_METADATA})"
    return address_refusal(name)


def loopback_host(host: str) -> bool:
    """The host (no port) is this machine: localhost or a loopback address."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def url_refusal(url: str, plain_http: Collection[str] = ()) -> str | None:
    """Why the operator may not send a request to `url`: its scheme or its host. `plain_http`: the
    registries (`host:port` as an image names them) the installer lists as plain HTTP."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host:
        return f"{url} is not an http(s) URL with a host"
    if parts.scheme == "http" and not loopback_host(host) and parts.netloc.lower() not in plain_http:
        return (f"{url} is plain HTTP to {host}, which is not this machine nor a registry listed as plain HTTP "
                f"(rule: {RULE_PLAIN_HTTP})")
    return host_refusal(host)


def same_host(a: str, b: str) -> bool:
    """Both URLs name the same host and port (the port a scheme implies counts as written)."""
    pa, pb = urlsplit(a), urlsplit(b)
    return ((pa.hostname or "").lower(), _port(pa.scheme, pa.port)) == ((pb.hostname or "").lower(),
                                                                         _port(pb.scheme, pb.port))


def _port(scheme: str, port: int | None) -> int | None:
    return port if port is not None else {"http": 80, "https": 443}.get(scheme)


def realm_refusal(realm: str, registry_url: str, token_hosts: Collection[str]) -> str | None:
    """Why the pull credentials may not go to the token service `realm` that the registry at
    `registry_url` named: it must pass `url_refusal` and be on the registry's own host (any port)
    or on a host the installer listed."""
    refused = url_refusal(realm)
    if refused is not None:
        return f"the token realm {realm} is refused: {refused}"
    host = (urlsplit(realm).hostname or "").lower()
    own = (urlsplit(registry_url).hostname or "").lower()
    if host != own and host not in {h.strip().lower() for h in token_hosts}:
        listed = ", ".join(sorted(token_hosts)) or "none"
        return (f"the token realm {realm} is on {host}, neither the registry's own host {own} nor a listed "
                f"token host ({listed}) (rule: {RULE_REALM})")
    return None


def redirect_refusal(location: str, plain_http: Collection[str] = ()) -> str | None:
    """Why the client may not follow a redirect to `location` (an absolute URL)."""
    refused = url_refusal(location, plain_http)
    return None if refused is None else f"a redirect to {location} is refused: {refused}"


class EgressRefused(OSError):
    """A name resolved to an address the operator never contacts. An OSError, so that aiohttp reports
    it as the connection's error (`ClientConnectorError.os_error`) without having connected."""


class GuardedResolver(AbstractResolver):
    """Resolves as `inner` (aiohttp's default resolver) does, and refuses a name any of whose
    addresses `address_refusal` refuses: the connector then connects to none of them."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self.inner = inner if inner is not None else DefaultResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self.inner.resolve(host, port, family)
        for result in results:
            refused = address_refusal(result["host"])
            if refused is not None:
                raise EgressRefused(f"{host} resolves to {refused}")
        return results

    async def close(self) -> None:
        await self.inner.close()


__all__ = ["METADATA_ADDRESSES", "METADATA_NAMES", "RULE_LINK_LOCAL", "RULE_METADATA", "RULE_PLAIN_HTTP",
           "RULE_REALM", "EgressRefused", "GuardedResolver", "address_refusal", "host_refusal", "loopback_host",
           "realm_refusal", "redirect_refusal", "same_host", "url_refusal"]
