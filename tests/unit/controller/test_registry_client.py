"""The registry client's conversations, against a small registry served in this test (aiohttp): the
Bearer token dance, Basic credentials, the GET fallback and its digest check, and errors that name the
image, the registry and the status. The real registry (distribution) is in
tests/integration/operator/test_image_digests.py; it serves anonymously, so the authentication paths
are shown here."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from gate.controller.registry import RegistryError, resolve_digest

MANIFEST = b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}'
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


@dataclass
class Registry:
    """What the served registry does: `auth` none | bearer | basic; `head_digest`: send the header on HEAD;
    `named`: the digest it names on GET (a lying registry names another)."""

    auth: str = "none"
    head_digest: bool = True
    named: str = DIGEST
    base: str = ""
    seen: list[str] = field(default_factory=list)

    def authorized(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        if self.auth == "bearer":
            return header == "Bearer t0ken"
        if self.auth == "basic":
            return header == "Basic " + base64.b64encode(b"robot:pw").decode()
        return True

    async def manifest(self, request: web.Request) -> web.Response:
        self.seen.append(f"{request.method} {request.path} {request.headers.get('Authorization', '-')}")
        if not self.authorized(request):
            challenge = (f'Bearer realm="{self.base}/token",service="test-registry",'
                         f'scope="repository:{request.match_info["repo"]}:pull"' if self.auth == "bearer"
                         else 'Basic realm="test"')
            return web.Response(status=401, headers={"WWW-Authenticate": challenge})
        if request.match_info["tag"] != "1.0.0":
            return web.Response(status=404)
        assert "application/vnd.oci.image.index.v1+json" in request.headers["Accept"]
        headers = {"Content-Type": "application/vnd.oci.image.manifest.v1+json"}
        if request.method == "HEAD":
            if self.head_digest:
                headers["Docker-Content-Digest"] = DIGEST
            return web.Response(status=200, headers=headers)
        return web.Response(status=200, body=MANIFEST, headers={**headers, "Docker-Content-Digest": self.named})

    async def token(self, request: web.Request) -> web.Response:
        """A private repository: a pull token only for robot:pw."""
        header = request.headers.get("Authorization", "-")
        self.seen.append(f"token {request.query.get('service')} {request.query.get('scope')} {header}")
        if header != "Basic " + base64.b64encode(b"robot:pw").decode():
            return web.json_response({"errors": [{"code": "UNAUTHORIZED"}]}, status=401)
        return web.json_response({"token": "t0ken"})


async def serve(registry: Registry) -> web.AppRunner:
    """Serve `registry` on a free loopback port (its `base` says where); cleanup() stops it."""
    app = web.Application()
    app.router.add_route("*", "/v2/{repo:.+}/manifests/{tag}", registry.manifest)
    app.router.add_get("/token", registry.token)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    registry.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    return runner


@pytest.fixture
async def served() -> AsyncIterator[Registry]:
    registry = Registry()
    runner = await serve(registry)
    try:
        yield registry
    finally:
        await runner.cleanup()


def ref(registry: Registry, tag: str = "1.0.0") -> str:
    return f"{registry.base.removeprefix('http://')}/team/pkg:{tag}"


async def test_anonymous_head_gives_the_digest(served: Registry) -> None:
    assert await resolve_digest(ref(served)) == DIGEST
    assert served.seen == ["HEAD /v2/team/pkg/manifests/1.0.0 -"]


async def test_a_bearer_challenge_gets_a_token_from_its_realm_with_the_pull_credentials(served: Registry) -> None:
    served.auth = "bearer"
    assert await resolve_digest(ref(served), ("robot", "pw")) == DIGEST
    basic = "Basic " + base64.b64encode(b"robot:pw").decode()
    assert served.seen == ["HEAD /v2/team/pkg/manifests/1.0.0 -",
                           f"token test-registry repository:team/pkg:pull {basic}",
                           "HEAD /v2/team/pkg/manifests/1.0.0 Bearer t0ken"]


async def test_a_private_repositorys_token_service_refuses_an_anonymous_pull(served: Registry) -> None:
    served.auth = "bearer"
    with pytest.raises(RegistryError, match=r"token service .*/token refused a pull token \(without credentials\)"
                                            r" \(HTTP 401\)"):
        await resolve_digest(ref(served))


async def test_a_basic_challenge_needs_credentials(served: Registry) -> None:
    served.auth = "basic"
    assert await resolve_digest(ref(served), ("robot", "pw")) == DIGEST
    with pytest.raises(RegistryError, match=r"access refused anonymously.*\(HTTP 401\)"):
        await resolve_digest(ref(served))


async def test_without_a_digest_on_head_the_body_is_fetched_and_checked(served: Registry) -> None:
    served.head_digest = False
    assert await resolve_digest(ref(served)) == DIGEST
    assert [s.split()[0] for s in served.seen] == ["HEAD", "GET"]
    served.named = "sha256:" + "0" * 64
    with pytest.raises(RegistryError, match="named the manifest sha256:0000.* but its body is " + DIGEST):
        await resolve_digest(ref(served))


async def test_errors_name_the_image_the_registry_and_the_status(served: Registry) -> None:
    missing = ref(served, "9.9.9")
    with pytest.raises(RegistryError) as caught:
        await resolve_digest(missing)
    text = str(caught.value)
    assert missing in text and f"registry {served.base.removeprefix('http://')}" in text and "HTTP 404" in text


async def test_an_unreachable_registry_fails_within_the_timeout() -> None:
    from gate.devcluster.cluster import free_port

    reference = f"127.0.0.1:{free_port()}/team/pkg:1.0.0"  # nothing listens there
    with pytest.raises(RegistryError, match=f"cannot resolve image {reference}"):
        await resolve_digest(reference, timeout=2)
