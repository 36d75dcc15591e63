"""In-memory stand-ins for the server's collaborators, for tests and the benchmark: facts from a fixed
list of objects and an authorizer with fixed answers. The server code around them is the real one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gate.admission.facts import readiness_gates
from gate.admission.rules import policy as policy_rules
from gate.admission.rules.facts import DEFAULT_OPERATOR_USERNAME, Facts, Lookups
from gate.admission.rules.review import AccessCheck, Notice


class StaticFacts:
    synced = True

    def __init__(self, gates: Sequence[dict[str, Any]] = (), policies: Sequence[str] = (),
                 installed_on: dict[str, tuple[str, ...]] | None = None,
                 pods: Sequence[dict[str, Any]] = ()) -> None:
        self.gates = list(gates)
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.policies = frozenset(policies)
        self.installed_on = installed_on or {}

    async def facts(self, lookups: Lookups) -> Facts:
        return Facts(
            existing_policies=self.policies & lookups.policies,
            referencing_gates=tuple(policy_rules.referencing_gates(lookups.gates_referencing, self.gates))
            if lookups.gates_referencing else (),
            referencing_packages=policy_rules.referencing_packages(lookups.gates_referencing, self.gates)
            if lookups.gates_referencing else {},
            pod=self.pods.get(lookups.pod) if lookups.pod else None,
            installed_on=self.installed_on if lookups.installed else {},
            readiness_gates=readiness_gates(self.gates) if lookups.readiness_gates else (),
            operator_username=DEFAULT_OPERATOR_USERNAME,
        )


class FixedAuthorizer:
    def __init__(self, allowed: bool = True, *, record: bool = True) -> None:
        self.allowed = allowed
        self.record = record  # a benchmark must not keep every question: that is a leak GC then scans
        self.asked: list[AccessCheck] = []

    async def answer(self, checks: Sequence[AccessCheck]) -> list[bool]:
        if self.record:
            self.asked.extend(checks)
        return [self.allowed] * len(checks)


class RecordedNotices:
    """Keeps the Events it is given, as (notice, user)."""

    def __init__(self) -> None:
        self.recorded: list[tuple[Notice, str]] = []

    async def record(self, notice: Notice, user: str) -> None:
        self.recorded.append((notice, user))
