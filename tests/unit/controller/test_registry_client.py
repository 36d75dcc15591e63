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

from gate.controller.egress import RULE_LINK_LOCAL, RULE_METADATA, RULE_PLAIN_HTTP, RULE_REALM
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
    port: int = 0
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
    registry.port = runner.addresses[0][1]
    registry.base = f"http://127.0.0.1:{registry.port}"
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


# -- only registries are asked (gate.controller.egress) --------------------------------------------


@dataclass
class Listener:
    """Any request to it is recorded: where the client must never go, it proves it did not."""

    hits: list[str] = field(default_factory=list)
    base: str = ""

    async def any(self, request: web.Request) -> web.Response:
        self.hits.append(f"{request.method} {request.path} {request.headers.get('Authorization', '-')}")
        if request.path.startswith("/v2/"):
            return web.Response(status=200, headers={"Docker-Content-Digest": DIGEST})
        return web.json_response({"token": "t0ken"})


@pytest.fixture
async def elsewhere() -> AsyncIterator[Listener]:
    """A listener on another loopback address (127.0.0.2): another host, as far as the rules go."""
    listener = Listener()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", listener.any)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.2", 0)
    await site.start()
    listener.base = f"http://127.0.0.2:{runner.addresses[0][1]}"
    try:
        yield listener
    finally:
        await runner.cleanup()


async def serve_answer(handler: web.RequestHandler) -> tuple[web.AppRunner, str]:  # type: ignore[type-arg]
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"127.0.0.1:{runner.addresses[0][1]}"


async def test_the_registry_is_the_only_place_asked_and_its_credentials_go_nowhere_else(elsewhere: Listener) -> None:
    """A registry that sends the client elsewhere: a token realm on another host, redirects to plain
    HTTP off the loopback and to a metadata address. Each is refused naming the image and the rule,
    before any request there; a redirect to another host that is allowed gets no credentials."""
    basic = "Basic " + base64.b64encode(b"robot:pw").decode()
    answer: dict[str, tuple[int, dict[str, str]]] = {}
    seen: list[str] = []

    async def registry(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path} {request.headers.get('Authorization', '-')}")
        if request.headers.get("Authorization") != basic and answer["now"][0] != 401:
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="r"'})
        status, headers = answer["now"]
        return web.Response(status=status, headers=headers)

    runner, host = await serve_answer(registry)
    try:
        reference = f"{host}/team/pkg:1.0.0"
        cases = [
            ((401, {"WWW-Authenticate": f'Bearer realm="{elsewhere.base}/token",service="s"'}), RULE_REALM),
            ((307, {"Location": "http://registry.example.com/v2/team/pkg/manifests/1.0.0"}), RULE_PLAIN_HTTP),
            ((302, {"Location": "https://169.254.169.254/latest/meta-data/iam/"}), RULE_METADATA),
            ((301, {"Location": "https://[fe80::1]/v2/"}), RULE_LINK_LOCAL),
        ]
        for response, rule in cases:
            answer["now"] = response
            with pytest.raises(RegistryError) as caught:
                await resolve_digest(reference, ("robot", "pw"))
            text = str(caught.value)
            assert f"cannot resolve image {reference}" in text and rule in text, text
        assert elsewhere.hits == []  # the realm on another host was never asked, with or without credentials

        # A redirect to another host that passes the rules is followed, without the credentials.
        answer["now"] = (307, {"Location": f"{elsewhere.base}/v2/team/pkg/manifests/1.0.0"})
        assert await resolve_digest(reference, ("robot", "pw")) == DIGEST
        assert elsewhere.hits == ["HEAD /v2/team/pkg/manifests/1.0.0 -"]
        assert f"HEAD /v2/team/pkg/manifests/1.0.0 {basic}" in seen  # the registry itself got them
    finally:
        await runner.cleanup()


async def test_a_listed_token_host_gets_the_credentials(served: Registry, elsewhere: Listener) -> None:
    """The installer's list (`registry_token_hosts`) is how a registry whose tokens come from another host
    (Docker Hub: auth.docker.io) works."""
    served.auth = "bearer"
    realm_host = "127.0.0.2"
    served.base = elsewhere.base  # the registry names the other listener's /token as its realm
    reference = f"127.0.0.1:{served.port}/team/pkg:1.0.0"
    with pytest.raises(RegistryError, match=RULE_REALM):
        await resolve_digest(reference, ("robot", "pw"))
    assert elsewhere.hits == []
    assert await resolve_digest(reference, ("robot", "pw"), token_hosts=[realm_host]) == DIGEST
    basic = "Basic " + base64.b64encode(b"robot:pw").decode()
    assert elsewhere.hits == [f"GET /token {basic}"]


async def test_a_refusal_reaches_the_gates_condition_naming_the_image_the_package_and_the_rule(
        elsewhere: Listener) -> None:
    """What the gate reconciler writes as ImagesResolved=False (`unresolved_message` of the resolver's
    problems), for a registry whose realm is on another host; the token host list comes from the
    operator's settings (`--registry-token-hosts`)."""
    from gate.api.nodegate import NodeGate
    from gate.controller.images import ImageResolver
    from gate.controller.metrics import OperatorMetrics
    from gate.controller.settings import OperatorSettings
    from gate.lifecycle.images import unresolved_message

    async def registry(request: web.Request) -> web.Response:
        return web.Response(status=401, headers={"WWW-Authenticate": f'Bearer realm="{elsewhere.base}/token"'})

    runner, host = await serve_answer(registry)
    try:
        image = f"{host}/team/tuning"
        gate = NodeGate.model_validate({"metadata": {"name": "g"}, "spec": {"packages": {
            "tuning": {"version": "1.0.0", "image": image}}}})
        settings = OperatorSettings(resolve_timeout=5)
        resolver = ImageResolver(settings, None, OperatorMetrics())  # type: ignore[arg-type]  # no Secret read
        records, problems = await resolver.resolve(gate)
        message = unresolved_message(problems)
        assert records == [] and f"package tuning: cannot resolve image {image}:1.0.0" in message, message
        assert RULE_REALM in message and "127.0.0.2" in message and elsewhere.hits == []
        # The installer lists the realm's host: the token service is asked (this registry then refuses the token).
        listed = ImageResolver(OperatorSettings(resolve_timeout=5, registry_token_hosts="auth.docker.io, 127.0.0.2"),
                               None, OperatorMetrics())  # type: ignore[arg-type]
        _, problems = await listed.resolve(gate)
        assert elsewhere.hits == ["GET /token -"] and RULE_REALM not in str(problems)
    finally:
        await runner.cleanup()


async def test_a_registry_listed_as_plain_http_never_gets_the_pull_credentials(served: Registry) -> None:
    """Listed as plain HTTP (`--registry-plain-http`), the wire is readable: the credentials stay home,
    so a registry that wants them refuses, and the request went without them."""
    served.auth = "basic"
    with pytest.raises(RegistryError) as raised:
        await resolve_digest(ref(served), ("robot", "pw"), plain_http=[f"127.0.0.1:{served.port}"])
    assert raised.value.status == 401
    assert served.seen == ["HEAD /v2/team/pkg/manifests/1.0.0 -"] * len(served.seen)
    # Not listed (the loopback is plain HTTP anyway), the same credentials go and the tag resolves.
    assert await resolve_digest(ref(served), ("robot", "pw")) == DIGEST
