"""Where the registry client may send a request (gate.controller.egress): the pure rules, and the
resolver that refuses a name by the addresses it resolves to before any connection is made.

Nothing here sends a packet anywhere but the loopback: the link-local and metadata cases are refused
by the checks themselves (a literal address, or a resolver that answers with one), never connected to.
"""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from gate.controller.egress import (
    RULE_LINK_LOCAL,
    RULE_METADATA,
    RULE_PLAIN_HTTP,
    RULE_REALM,
    EgressRefused,
    GuardedResolver,
    address_refusal,
    realm_refusal,
    redirect_refusal,
    same_host,
    url_refusal,
)


@pytest.mark.parametrize(("address", "rule"), [
    ("169.254.169.254", RULE_METADATA), ("169.254.170.2", RULE_METADATA), ("fd00:ec2::254", RULE_METADATA),
    ("100.100.100.200", RULE_METADATA), ("::ffff:169.254.169.254", RULE_METADATA),
    ("169.254.1.1", RULE_LINK_LOCAL), ("fe80::1", RULE_LINK_LOCAL), ("fe80::1%eth0", RULE_LINK_LOCAL),
    ("::ffff:169.254.3.4", RULE_LINK_LOCAL),
    ("127.0.0.1", None), ("::1", None), ("10.0.0.1", None), ("140.82.112.33", None), ("fd00::1", None),
])
def test_link_local_and_metadata_addresses_are_refused_naming_the_rule(address: str, rule: str | None) -> None:
    refused = address_refusal(address)
    assert (refused is None) == (rule is None), refused
    if rule is not None:
        assert refused is not None and address in refused and rule in refused


@pytest.mark.parametrize(("url", "rule"), [
    ("http://127.0.0.1:5000/v2/", None), ("http://localhost/v2/", None), ("http://[::1]:5000/v2/", None),
    ("https://ghcr.io/v2/", None), ("https://10.1.2.3/v2/", None),
    ("http://ghcr.io/v2/", RULE_PLAIN_HTTP), ("http://10.0.0.5:5000/v2/", RULE_PLAIN_HTTP),
    ("https://169.254.169.254/latest/meta-data/", RULE_METADATA),
    ("https://metadata.google.internal/computeMetadata/v1/", RULE_METADATA),
    ("https://METADATA.google.internal./x", RULE_METADATA),
    ("https://[fd00:ec2::254]/latest", RULE_METADATA), ("https://[fe80::1]/", RULE_LINK_LOCAL),
    ("https://169.254.10.10:443/", RULE_LINK_LOCAL),
    ("http://169.254.169.254/", RULE_PLAIN_HTTP),  # two rules broken: the first one found is named
])
def test_a_url_is_judged_by_scheme_and_host(url: str, rule: str | None) -> None:
    refused = url_refusal(url)
    assert (refused is None) == (rule is None), refused
    if rule is not None:
        assert refused is not None and rule in refused
    redirect = redirect_refusal(url)
    assert (redirect is None) == (rule is None)
    if redirect is not None:
        assert redirect.startswith(f"a redirect to {url} is refused")


@pytest.mark.parametrize("scheme", ["file", "ftp", "gopher", "unix"])
def test_a_url_other_than_http_is_refused(scheme: str) -> None:
    assert url_refusal(f"{scheme}://host/x") is not None


def test_a_realm_is_the_registrys_own_host_or_a_listed_one() -> None:
    hub = "https://registry-1.docker.io/v2/library/ubuntu/manifests/24.04"
    assert realm_refusal("https://ghcr.io/token", "https://ghcr.io/v2/a/manifests/1", ()) is None
    assert realm_refusal("https://auth.docker.io/token", hub, ["auth.docker.io"]) is None
    assert realm_refusal("https://AUTH.docker.io/token", hub, ["auth.docker.io"]) is None
    assert realm_refusal("http://127.0.0.1:5001/token", "http://127.0.0.1:5000/v2/a/manifests/1", ()) is None
    refused = realm_refusal("https://auth.docker.io/token", hub, ())
    assert refused is not None and RULE_REALM in refused and "registry-1.docker.io" in refused
    refused = realm_refusal("https://collector.example/token", hub, ["auth.docker.io"])
    assert refused is not None and RULE_REALM in refused and "collector.example" in refused
    # Listed, yet plain HTTP off the loopback or a metadata address: the other rules still hold.
    refused = realm_refusal("http://auth.docker.io/token", hub, ["auth.docker.io"])
    assert refused is not None and RULE_PLAIN_HTTP in refused
    refused = realm_refusal("https://169.254.169.254/token", hub, ["169.254.169.254"])
    assert refused is not None and RULE_METADATA in refused


def test_credentials_follow_only_the_same_host_and_port() -> None:
    assert same_host("https://ghcr.io/v2/a", "https://GHCR.io:443/v2/b")
    assert not same_host("https://ghcr.io/v2/a", "https://pkg-containers.githubusercontent.com/x")
    assert not same_host("http://127.0.0.1:5000/a", "http://127.0.0.1:5001/a")


class _Answers(AbstractResolver):
    """A resolver that answers from a table and never asks DNS."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        address = self.table[host]
        return [{"hostname": host, "host": address, "port": port, "family": socket.AF_INET6 if ":" in address
                 else socket.AF_INET, "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        pass


async def test_a_name_that_resolves_to_a_metadata_address_is_refused_before_any_connection() -> None:
    """The check runs on the resolved addresses: the connector gets none to connect to. The session
    below would connect to 169.254.169.254 if the resolver let it; the refusal is what the request
    raises, so no socket was opened."""
    answers = _Answers({"innocent.example": "169.254.169.254", "v6.example": "fe80::1", "fine.example": "127.0.0.1"})
    guarded = GuardedResolver(answers)
    with pytest.raises(EgressRefused, match=f"innocent.example resolves to 169.254.169.254 .*{RULE_METADATA}"):
        await guarded.resolve("innocent.example", 443)
    with pytest.raises(EgressRefused, match=RULE_LINK_LOCAL):
        await guarded.resolve("v6.example", 443)
    assert [r["host"] for r in await guarded.resolve("fine.example", 80)] == ["127.0.0.1"]

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=guarded)) as session:
        with pytest.raises(aiohttp.ClientConnectorError) as caught:
            await session.get("https://innocent.example/v2/", timeout=aiohttp.ClientTimeout(total=5))
    assert isinstance(caught.value.os_error, EgressRefused)
    assert answers.asked.count("innocent.example") == 2


def test_plain_http_goes_to_a_listed_registry_exactly_and_the_other_rules_still_hold() -> None:
    listed = ("10.0.0.5:5000",)
    assert url_refusal("http://10.0.0.5:5000/v2/team/pkg/manifests/1.0.0", listed) is None
    for url in ("http://10.0.0.5:5001/v2/", "http://10.0.0.5/v2/", "http://10.0.0.6:5000/v2/"):
        refused = url_refusal(url, listed)
        assert refused is not None and RULE_PLAIN_HTTP in refused, url
    refused = redirect_refusal("http://10.0.0.6:5000/v2/x", listed)
    assert refused is not None and RULE_PLAIN_HTTP in refused
    refused = url_refusal("http://169.254.169.254:80/latest", ("169.254.169.254:80",))
    assert refused is not None and RULE_METADATA in refused
