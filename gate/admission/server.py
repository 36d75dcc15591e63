"""The webhook server: aiohttp over TLS, a thin adapter around the pure rules.

POST /validate and /mutate take an AdmissionReview v1 and answer one. Per request: parse (pydantic),
`plan_lookups`, fetch the facts, `validate`/`mutate`, ask the authorizer the verdict's questions
(concurrently), fold the answers in, answer. Input that is not a well-formed review gets a 4xx with a
message; a rule or lookup that fails gets a denial (validation) or an unpatched allow (mutation) with
the reason, never a 5xx: a 5xx tells the API server nothing a person can act on.

Bodies in memory are bounded twice: each by `max_body_bytes` (aiohttp's client_max_size; a declared
Content-Length above it is refused before a byte of the body is read), and all of them together by
a `BodyBudget`. A request is answered 429 at once when its body does not fit in what is left,
rather than read while RSS grows with every large body in flight: the API server retries within its
webhook timeout or refuses the write (failurePolicy), and nothing else slows down.

A large body (above 64 KiB) is parsed and judged by `LargeBodyWork`, one thread, not on the event
loop: the largest spec admission allows takes 100 to 400 ms of CPU to parse and judge, and on the
loop every small review arriving meanwhile would wait that long.

GET /healthz (the process serves), /readyz (a serving certificate is loaded and the caches are
synced), /metrics (Prometheus).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import logging
import signal
import socket
import time
from collections.abc import Callable, Iterator
from typing import Literal, Protocol, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from pydantic import ValidationError

from gate.admission.authz import Authorizer, KubeAccessReviews, ReviewStats, SubjectAccessReviewer
from gate.admission.bodies import SMALL_BODY, BodyBudget
from gate.admission.certificates import FileCertificates, SelfManagedCertificates
from gate.admission.facts import ClusterFacts
from gate.admission.largebodies import LargeBodyWork
from gate.admission.notices import KubeNotices, NoticeSink
from gate.admission.rules import decide
from gate.admission.rules.facts import Facts, Lookups
from gate.admission.rules.images import ALLOW_ALL, ImagePolicy
from gate.admission.rules.review import AdmissionReview, Verdict, Violation, response_for
from gate.admission.settings import WebhookSettings
from gate.certs.reload import ReloadableCertificate
from gate.certs.rotation import CertPolicy
from gate.kube.client import KubeClient
from gate.kube.errors import ApiError, ConnectionFailed

log = logging.getLogger(__name__)

T = TypeVar("T")
Webhook = Literal["validate", "mutate"]
KNOWN_KINDS = frozenset({"NodeGate", "DeploymentPolicy", "Node", "PodExecOptions", "PodAttachOptions",
                         "PodPortForwardOptions"})
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class FactSource(Protocol):
    @property
    def synced(self) -> bool: ...

    async def facts(self, lookups: Lookups) -> Facts: ...


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter("nodegate_admission_requests", "Admission requests answered.",
                                ["webhook", "kind", "operation", "verdict"], registry=self.registry)
        self.latency = Histogram("nodegate_admission_duration_seconds", "Time to answer an admission request.",
                                 ["webhook", "kind", "operation", "verdict"], buckets=LATENCY_BUCKETS,
                                 registry=self.registry)
        self.errors = Counter("nodegate_admission_errors", "Requests whose rules or lookups failed.",
                              ["webhook", "stage"], registry=self.registry)

    def watch(self, *, reviews: ReviewStats | None = None, bodies: BodyBudget | None = None) -> None:
        """Export what the authorizer and the body budget count (read at each scrape)."""
        self.registry.register(_Watched(reviews, bodies))

    def observe(self, webhook: str, kind: str, operation: str, verdict: str, seconds: float) -> None:
        # The kind comes from the request: anyone who reaches the port could mint a new time series per
        # request and grow the registry (and every scrape) without bound. Known kinds only.
        kind = kind if kind in KNOWN_KINDS else ("" if not kind else "other")
        self.requests.labels(webhook, kind, operation, verdict).inc()
        self.latency.labels(webhook, kind, operation, verdict).observe(seconds)


class _Watched(Collector):
    def __init__(self, reviews: ReviewStats | None, bodies: BodyBudget | None) -> None:
        self.reviews = reviews
        self.bodies = bodies

    def collect(self) -> Iterator[Metric]:
        if self.reviews is not None:
            r = self.reviews
            yield CounterMetricFamily("nodegate_admission_access_checks", "Access checks the rules asked for.",
                                      value=r.checks)
            answered = CounterMetricFamily(
                "nodegate_admission_access_checks_answered_without_review",
                "Access checks answered without a SubjectAccessReview of their own: by an identical check of the "
                "same request (duplicate), from the cache (cache), or by a review in flight for another request "
                "(shared).", labels=["by"])
            answered.add_metric(["duplicate"], r.duplicates)
            answered.add_metric(["cache"], r.cache_hits)
            answered.add_metric(["shared"], r.shared)
            yield answered
            yield CounterMetricFamily("nodegate_admission_subject_access_reviews_sent",
                                      "SubjectAccessReviews sent to the API server.", value=r.sent)
            results = CounterMetricFamily("nodegate_admission_subject_access_reviews",
                                          "SubjectAccessReviews answered, by result (failed: raised, not cached).",
                                          labels=["result"])
            results.add_metric(["allowed"], r.allowed)
            results.add_metric(["denied"], r.denied)
            results.add_metric(["failed"], r.failed)
            yield results
            yield GaugeMetricFamily("nodegate_admission_subject_access_reviews_in_flight",
                                    "SubjectAccessReviews in flight to the API server.", value=r.in_flight)
        if self.bodies is not None:
            yield GaugeMetricFamily("nodegate_admission_body_bytes_held",
                                    "Bytes of request bodies being read or held (claimed from the budget).",
                                    value=self.bodies.held)
            yield GaugeMetricFamily("nodegate_admission_body_bytes_budget",
                                    "Most bytes of request bodies held at once.", value=self.bodies.total)
            yield CounterMetricFamily("nodegate_admission_bodies_refused",
                                      "Requests answered 429 because their body did not fit in the budget.",
                                      value=self.bodies.refused)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _refused_unread(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    """An answer given before the body was read: the connection closes after it. Kept open, aiohttp
    would read and throw away the rest of the body (up to 10 s of it), decrypting megabytes on the
    event loop for a request already refused."""
    response = _error(status, message, headers)
    response.force_close()
    return response


def _summarise(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "not an AdmissionReview v1: " + "; ".join(parts)


class AdmissionServer:
    def __init__(self, *, facts: FactSource, authorizer: Authorizer, certificate: ReloadableCertificate,
                 max_body_bytes: int = 3 * 1024 * 1024, bodies: BodyBudget | None = None,
                 metrics: Metrics | None = None, image_policy: ImagePolicy = ALLOW_ALL,
                 notices: NoticeSink | None = None) -> None:
        self.facts = facts
        self.notices = notices
        self.image_policy = image_policy
        self.authorizer = authorizer
        self.certificate = certificate
        self.max_body_bytes = max_body_bytes
        self.bodies = bodies or BodyBudget(max(8 * max_body_bytes, 4 * SMALL_BODY))
        if self.bodies.large_limit < max_body_bytes:
            raise ValueError(f"the body budget's share for large bodies ({self.bodies.large_limit} bytes) cannot "
                             f"hold one body of max_body_bytes ({max_body_bytes})")
        self.metrics = metrics or Metrics()
        self.large_work = LargeBodyWork()
        stats = authorizer.stats if isinstance(authorizer, SubjectAccessReviewer) else None
        self.metrics.watch(reviews=stats, bodies=self.bodies)
        self.shutting_down = False

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_post("/validate", self.validate)
        app.router.add_post("/mutate", self.mutate)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics_endpoint)
        return app

    # -- probes -----------------------------------------------------------------------------------

    def not_ready_reason(self) -> str | None:
        if self.shutting_down:
            return "shutting down"
        if not self.certificate.loaded:
            return "no serving certificate loaded yet"
        if not self.facts.synced:
            return "the NodeGate and DeploymentPolicy caches are not synced yet"
        return None

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(self, request: web.Request) -> web.Response:
        reason = self.not_ready_reason()
        if reason:
            return web.Response(status=503, text=f"not ready: {reason}\n")
        return web.Response(text="ok\n")

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- reviews ----------------------------------------------------------------------------------

    async def validate(self, request: web.Request) -> web.Response:
        return await self._review(request, "validate")

    async def mutate(self, request: web.Request) -> web.Response:
        return await self._review(request, "mutate")

    async def _review(self, request: web.Request, webhook: Webhook) -> web.Response:
        started = time.perf_counter()
        if request.content_type != "application/json":
            self.metrics.observe(webhook, "", "", "bad-request", time.perf_counter() - started)
            return _error(415, f"content type must be application/json, not {request.content_type or 'none'!r}")
        declared = request.content_length
        if declared is not None and declared > self.max_body_bytes:
            self.metrics.observe(webhook, "", "", "bad-request", time.perf_counter() - started)
            return _refused_unread(413, f"request body larger than {self.max_body_bytes} bytes")
        # Without a Content-Length (chunked), the body may be as large as any: claim the most.
        claim = declared if declared is not None else self.max_body_bytes
        if not self.bodies.take(claim):
            self.metrics.observe(webhook, "", "", "throttled", time.perf_counter() - started)
            return _refused_unread(429, f"too many request bodies in memory at once ({self.bodies.held} of "
                                        f"{self.bodies.total} bytes held); retry shortly", {"Retry-After": "1"})
        try:
            return await self._read_and_answer(request, webhook, started)
        finally:
            # The body, the parsed review and the verdict are all gone once the response is built.
            self.bodies.give(claim)

    async def _read_and_answer(self, request: web.Request, webhook: Webhook, started: float) -> web.Response:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.metrics.observe(webhook, "", "", "bad-request", time.perf_counter() - started)
            return _refused_unread(413, f"request body larger than {self.max_body_bytes} bytes")
        except (ConnectionResetError, asyncio.IncompleteReadError, ValueError) as exc:
            # The client went away mid-body, or sent a body that does not match its framing.
            self.metrics.observe(webhook, "", "", "bad-request", time.perf_counter() - started)
            return _error(400, f"could not read the request body: {exc}")
        large = len(body) > SMALL_BODY
        try:
            review = await self._compute(large, lambda: AdmissionReview.model_validate_json(body))
        except ValidationError as exc:
            self.metrics.observe(webhook, "", "", "bad-request", time.perf_counter() - started)
            if any(e.get("type") == "json_invalid" for e in exc.errors()):
                return _error(400, "the body is not valid JSON")
            return _error(422, _summarise(exc))
        req = review.request
        kind, operation = req.kind.kind, req.operation
        try:
            verdict = await self._judge(review, webhook, large)
        except decide.ReviewError as exc:
            self.metrics.observe(webhook, kind, operation, "bad-request", time.perf_counter() - started)
            return _error(422, str(exc))
        answer = response_for(req.uid, verdict)
        outcome = "allowed" if answer.response.allowed else "denied"
        if webhook == "mutate" and answer.response.patch:
            outcome = "patched"
        self.metrics.observe(webhook, kind, operation, outcome, time.perf_counter() - started)
        return web.Response(body=answer.model_dump_json(by_alias=True, exclude_none=True),
                            content_type="application/json")

    async def _compute(self, large: bool, work: Callable[[], T]) -> T:
        """`work()`, on the loop for a small body, in the large-body thread for a large one."""
        return await self.large_work.run(work) if large else work()

    async def _judge(self, review: AdmissionReview, webhook: Webhook, large: bool = False) -> Verdict:
        req = review.request
        try:
            lookups = decide.plan_lookups(req, webhook)
        except decide.ReviewError:
            raise  # the caller answers 422
        except Exception:
            self.metrics.errors.labels(webhook, "rules").inc()
            log.exception("Lookup planning failed; kind=%s operation=%s name=%s", req.kind.kind, req.operation,
                          req.name)
            return self._failed(webhook, "NodeGate's admission rules failed on this object (logged as a bug)")
        try:
            facts = await self.facts.facts(lookups)
        except (ApiError, ConnectionFailed) as exc:
            self.metrics.errors.labels(webhook, "lookup").inc()
            log.warning("Lookup failed; kind=%s name=%s error=%s", req.kind.kind, req.name, exc)
            return self._failed(webhook, f"could not look up what this request depends on ({exc}); retry shortly")
        except Exception:
            # Never a 5xx: what a lookup found (a node's annotation, say) is no reason to stop answering.
            self.metrics.errors.labels(webhook, "lookup").inc()
            log.exception("Lookup failed unexpectedly; kind=%s name=%s", req.kind.kind, req.name)
            return self._failed(webhook, "could not look up what this request depends on (logged as a bug)")
        try:
            image_policy = self.image_policy
            verdict = await self._compute(large, lambda: decide.validate(req, facts, image_policy)
                                          if webhook == "validate" else decide.mutate(req, facts))
        except decide.ReviewError:
            raise
        except Exception:
            self.metrics.errors.labels(webhook, "rules").inc()
            log.exception("Rule failed; kind=%s operation=%s name=%s", req.kind.kind, req.operation, req.name)
            return self._failed(webhook, "NodeGate's admission rules failed on this object (logged as a bug)")
        if verdict.access:
            try:
                answers = await self.authorizer.answer(verdict.access)
            except (ApiError, ConnectionFailed) as exc:
                self.metrics.errors.labels(webhook, "authorization").inc()
                log.warning("SubjectAccessReview failed; user=%s error=%s", req.user_info.username, exc)
                return self._failed(webhook, f"could not check authorization ({exc}); retry shortly")
            verdict = verdict.with_answers(answers)
        if verdict.allowed and verdict.notices and not req.dry_run:
            return await self._record(webhook, req.user_info.username, verdict)
        return verdict

    async def _record(self, webhook: Webhook, user: str, verdict: Verdict) -> Verdict:
        """Leave the verdict's Events (a break-glass use); refuse when they cannot be left."""
        if self.notices is None:
            return self._failed(webhook, "this webhook cannot record a break-glass use (no Event sink), so it "
                                         "allows none")
        for notice in verdict.notices:
            try:
                await self.notices.record(notice, user)
            except (ApiError, ConnectionFailed) as exc:
                self.metrics.errors.labels(webhook, "notice").inc()
                log.warning("Break-glass Event not written; refused; user=%s pod=%s/%s error=%s", user,
                            notice.namespace, notice.name, exc)
                return self._failed(webhook, f"could not record the break-glass use as an Event ({exc}), and "
                                             "none goes without one; retry shortly")
            log.warning("Allowed a break-glass use; user=%s object=%s/%s reason=%s", user, notice.namespace,
                        notice.name, notice.reason)
        return verdict

    @staticmethod
    def _failed(webhook: Webhook, reason: str) -> Verdict:
        # Validation fails closed (the configuration's failurePolicy is Fail for what it guards);
        # mutation lets the object through unpatched: the operator's own checks catch what it missed.
        if webhook == "validate":
            return Verdict(violations=(Violation("", reason),))
        return Verdict(warnings=(f"nodegate: not mutated: {reason}",))


def settle_garbage_collector() -> None:
    """Move everything alive at start-up (tens of thousands of module-level objects) out of the
    collector's sight: a full collection then scans only what requests created, and stops showing
    up as a p99 spike of tens of milliseconds."""
    gc.collect()
    gc.freeze()


async def serve(settings: WebhookSettings) -> None:
    """Run `nodegate webhook serve` until SIGTERM or SIGINT."""
    client = await KubeClient.from_environment(settings.kubeconfig, user_agent="nodegate-webhook")
    certificate = ReloadableCertificate()
    facts = ClusterFacts(client, operator_username=settings.operator_username,
                         operator_namespace=settings.operator_namespace)
    reviewer = SubjectAccessReviewer(KubeAccessReviews(client), cache_seconds=settings.sar_cache_seconds,
                                     max_entries=settings.sar_cache_entries, max_in_flight=settings.sar_max_in_flight,
                                     per_request=settings.sar_per_request)
    server = AdmissionServer(facts=facts, certificate=certificate, max_body_bytes=settings.max_body_bytes,
                             bodies=BodyBudget(settings.max_bodies_bytes), authorizer=reviewer,
                             image_policy=settings.image_policy,
                             notices=KubeNotices(client, socket.gethostname()))
    certs: SelfManagedCertificates | FileCertificates
    if settings.cert_mode == "self-managed":
        policy = CertPolicy(hosts=settings.hosts,
                            propagation=dt.timedelta(seconds=settings.cert_propagation_seconds))
        certs = SelfManagedCertificates(client, certificate, namespace=settings.secret_namespace,
                                        secret_name=settings.secret_name, policy=policy,
                                        configuration_name=settings.configuration_name,
                                        interval=settings.cert_check_seconds)
    else:
        certs = FileCertificates(certificate, settings.cert_files, interval=settings.cert_check_seconds)

    # handler_cancellation: the API server closes the connection when its webhook timeout passes;
    # the handler is then cancelled, rather than going on asking SubjectAccessReviews for an answer
    # nobody will read (a review already in flight still finishes and fills the cache).
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False, shutdown_timeout=10,
                           handler_cancellation=True)
    await runner.setup()
    host, port = settings.host_port
    site = web.TCPSite(runner, host, port, ssl_context=certificate.context, backlog=1024)
    await site.start()
    log.info("Serving admission webhook; listen=%s:%d certMode=%s imagePolicy=%s", host, port, settings.cert_mode,
             settings.image_policy.describe())
    settle_garbage_collector()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def start_caches() -> None:
        backoff = 0.5
        while True:
            try:
                await facts.start()
                log.info("Caches synced; nodegates=%d policies=%d", len(facts.gates), len(facts.policies))
                return
            except (ApiError, ConnectionFailed) as exc:
                log.warning("Cache start failed; retrying; error=%s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    tasks = [asyncio.create_task(certs.run(), name="certificates"),
             asyncio.create_task(start_caches(), name="caches")]
    try:
        await stop.wait()
    finally:
        log.info("Shutting down; finishing requests in flight")
        server.shutting_down = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await runner.cleanup()
        server.large_work.shutdown()
        await facts.stop()
        await client.close()
