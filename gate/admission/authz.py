"""Answers to the rules' access questions: SubjectAccessReviews, asked concurrently, briefly cached.

Allowed answers are reused for `cache_seconds` (the API server's own webhook authorizer caches for
minutes); denials are never cached, so granting a role takes effect on the next request. Identical
questions in flight at the same moment share one review.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Protocol

from gate.admission.rules.review import AccessCheck
from gate.kube.client import SUBJECT_ACCESS_REVIEWS, KubeClient


class Authorizer(Protocol):
    async def answer(self, checks: Sequence[AccessCheck]) -> list[bool]: ...


def review_body(check: AccessCheck) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "user": check.user.username,
        "groups": check.user.groups,
        "resourceAttributes": {"verb": check.verb, "group": check.group, "resource": check.resource,
                               **({"name": check.name} if check.name else {}),
                               **({"namespace": check.namespace} if check.namespace else {})},
    }
    if check.user.uid:
        spec["uid"] = check.user.uid
    if check.user.extra:
        spec["extra"] = check.user.extra
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


class SubjectAccessReviewer:
    def __init__(self, client: KubeClient, *, cache_seconds: float = 10.0, max_entries: int = 10_000) -> None:
        self.client = client
        self.cache_seconds = cache_seconds
        self.max_entries = max_entries
        self._allowed_until: dict[tuple[object, ...], float] = {}
        self._inflight: dict[tuple[object, ...], asyncio.Future[bool]] = {}
        self.reviews = 0

    async def answer(self, checks: Sequence[AccessCheck]) -> list[bool]:
        return list(await asyncio.gather(*(self._one(c) for c in checks)))

    async def _one(self, check: AccessCheck) -> bool:
        key = check.cache_key()
        now = time.monotonic()
        until = self._allowed_until.get(key)
        if until is not None and until > now:
            return True
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            self.reviews += 1
            result = await self.client.create(SUBJECT_ACCESS_REVIEWS, review_body(check))
            allowed = bool((result.get("status") or {}).get("allowed"))
            if allowed and self.cache_seconds > 0:
                if len(self._allowed_until) >= self.max_entries:
                    self._allowed_until.clear()
                self._allowed_until[key] = time.monotonic() + self.cache_seconds
            future.set_result(allowed)
            return allowed
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody else needs to
            raise
        finally:
            self._inflight.pop(key, None)
