"""Typed API errors carrying the parsed `Status`, so callers branch on kinds, not on numbers."""

from __future__ import annotations

import re
from typing import Any


class ApiError(Exception):
    """The API server answered with an error `Status`."""

    status: int = 0

    def __init__(self, status: int, body: dict[str, Any] | None = None, *, method: str = "", path: str = "",
                 retry_after: float | None = None) -> None:
        self.status = status
        self.body = body or {}
        self.reason: str = str(self.body.get("reason", ""))
        self.message: str = str(self.body.get("message", "")) or f"HTTP {status}"
        self.details: dict[str, Any] = self.body.get("details") or {}
        self.method = method
        self.path = path
        self.retry_after = retry_after
        super().__init__(f"{method} {path}: {status} {self.reason}: {self.message}".strip())

    @property
    def temporary(self) -> bool:
        """Worth retrying as is: throttling, conflicts of optimistic concurrency, server trouble."""
        return self.status in (409, 429) or self.status >= 500

    @property
    def causes(self) -> list[dict[str, Any]]:
        return list(self.details.get("causes") or [])


class BadRequest(ApiError):
    status = 400


class Unauthorized(ApiError):
    status = 401


class Forbidden(ApiError):
    status = 403

    @property
    def by_authorizer(self) -> bool:
        """Refused by the authorizer (RBAC, Node, a webhook authorizer), not by admission: the
        requester's own rights, the same for every object of the kind. Admission refusals (a webhook,
        a ValidatingAdmissionPolicy, a quota) read `... is forbidden: <why>` with no `User`."""
        return _AUTHORIZER_DENIAL.search(self.message) is not None


# The authorizer's wording since Kubernetes 1.6: `<resource> is forbidden: User "<name>" cannot <verb> ...`.
_AUTHORIZER_DENIAL = re.compile(r'is forbidden: User "[^"]*" cannot [a-z]+ ')


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    """409: optimistic concurrency lost (or AlreadyExists, see `already_exists`)."""

    status = 409

    @property
    def already_exists(self) -> bool:
        return self.reason == "AlreadyExists"


class Gone(ApiError):
    """410: a watch or list resourceVersion is too old; relist."""

    status = 410


class Invalid(ApiError):
    status = 422


class TooManyRequests(ApiError):
    """429: throttled, or an eviction refused by a PodDisruptionBudget."""

    status = 429


class ServerError(ApiError):
    status = 500


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def api_error(status: int, body: dict[str, Any] | None, **kw: Any) -> ApiError:
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return cls(status, body, **kw)


class ConnectionFailed(Exception):
    """The API server could not be reached (connection refused, reset, TLS, timeout)."""

    temporary = True


class LeadershipLost(ConnectionFailed):
    """A write this replica refused to send: it is not (or no longer) the leader (`gate.kube.fence`).

    Nothing went out, so it is as temporary as a refused connection, and every caller that retries a
    ConnectionFailed handles it; the work that asked is being cancelled anyway.
    """
