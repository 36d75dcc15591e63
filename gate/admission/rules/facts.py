"""What the rules need to know about the rest of the cluster, as plain data.

A rule never asks the API server. `plan_lookups(request)` says what a review needs beyond its own
objects; the server's adapter looks that up (from its watch caches, or live) and hands the answers
back as `Facts`. The rules stay pure functions of (request, facts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_OPERATOR_NAMESPACE = "nodegate-system"
DEFAULT_OPERATOR_USERNAME = f"system:serviceaccount:{DEFAULT_OPERATOR_NAMESPACE}:nodegate-operator"


@dataclass(frozen=True)
class Lookups:
    """What to find out before deciding a review."""

    policies: frozenset[str] = frozenset()
    """DeploymentPolicy names whose existence matters."""
    gates_referencing: str | None = None
    """A DeploymentPolicy name: which NodeGates reference it?"""
    installed: tuple[str, frozenset[str]] | None = None
    """(gate, packages): on which nodes is each of these packages of that gate still installed?"""
    readiness_gates: bool = False
    """The NodeGates with readinessTaint: true (name and nodeSelector)."""
    pod: tuple[str, str] | None = None
    """(namespace, name): the pod an exec, attach or port-forward goes into (read live)."""

    @property
    def empty(self) -> bool:
        return not (self.policies or self.gates_referencing or self.installed or self.readiness_gates or self.pod)


@dataclass(frozen=True)
class ReadinessGate:
    name: str
    node_selector: Any


@dataclass(frozen=True)
class Facts:
    existing_policies: frozenset[str] = frozenset()
    referencing_gates: tuple[str, ...] = ()
    referencing_packages: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """gate -> the package names of each gate in `referencing_gates`."""
    installed_on: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """package -> names of nodes where it is still installed (not yet uninstalled)."""
    readiness_gates: tuple[ReadinessGate, ...] = ()
    operator_username: str = DEFAULT_OPERATOR_USERNAME
    operator_namespace: str = DEFAULT_OPERATOR_NAMESPACE
    """Where package pods run: the Secrets and ConfigMaps a package refers to are looked up there."""
    pod: Mapping[str, Any] | None = None
    """The pod of `Lookups.pod`; None when it does not exist (the API server then answers 404 itself)."""


NO_FACTS = Facts()
