"""The operator's Prometheus metrics, on a registry of its own (tests run several operators).

prometheus_client keeps every labelled series it ever saw until told otherwise, so a gauge of a gate
deleted an hour ago would still be scraped (and an alert on it keep firing). Every metric labelled
with a gate, compartment or package is therefore `Tracked`: it remembers its series, and the operator
removes them when their object goes (`forget_gate`, `forget_gone`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)


class Tracked(Generic[M]):
    """A labelled metric that remembers the series it was given, so they can be removed."""

    def __init__(self, metric: M, labelnames: Sequence[str]) -> None:
        self.metric = metric
        self.labelnames = tuple(labelnames)
        self._series: set[tuple[str, ...]] = set()

    def labels(self, *values: object) -> M:
        """The series for these label values (created on first use), as `metric.labels` does."""
        key = tuple(str(v) for v in values)
        self._series.add(key)
        return self.metric.labels(*key)

    def series(self) -> list[dict[str, str]]:
        """The label sets of every series this process has now, for tests and debugging."""
        return [dict(zip(self.labelnames, v, strict=True)) for v in sorted(self._series)]

    def remove_where(self, doomed: Callable[[Mapping[str, str]], bool]) -> int:
        """Remove every series whose labels `doomed` says are of an object that went; how many."""
        gone = [v for v in self._series if doomed(dict(zip(self.labelnames, v, strict=True)))]
        for values in gone:
            self.metric.remove(*values)
            self._series.discard(values)
        return len(gone)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry

        def gauge(name: str, doc: str, labels: list[str]) -> Tracked[Gauge]:
            return Tracked(Gauge(name, doc, labels, registry=r), labels)

        def counter(name: str, doc: str, labels: list[str]) -> Tracked[Counter]:
            return Tracked(Counter(name, doc, labels, registry=r), labels)

        self.leader = Gauge("nodegate_leader", "1 while this replica holds the leader lease", registry=r)
        self.nodes = gauge("nodegate_nodes", "Nodes by status per gate", ["gate", "status"])
        self.stage_duration = Tracked(Histogram(
            "nodegate_stage_duration_seconds", "Time a step of a stage pod ran, from its container's start to its end",
            ["package", "stage", "outcome"], registry=r,
            buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
        ), ["package", "stage", "outcome"])
        self.stage_failures = counter("nodegate_stage_failures_total", "Stages and node steps that failed for good",
                                      ["gate", "package", "stage", "reason"])
        self.drains_blocked = counter("nodegate_drain_blocked_total",
                                      "Drains held up by a PodDisruptionBudget (once per node and blocking budget)",
                                      ["gate"])
        self.drains_blocked_now = gauge("nodegate_drains_blocked",
                                        "Nodes whose drain a PodDisruptionBudget holds up right now", ["gate"])
        self.waiting_for_pods = gauge("nodegate_nodes_waiting_for_pods",
                                      "Nodes not picked (or held cordoned) while their protected pods run", ["gate"])
        self.waiting_for_pods_since = gauge(
            "nodegate_waiting_for_pods_since_timestamp_seconds",
            "Unix time since when the node that has waited longest for its protected pods waits (absent while "
            "none waits): `time() - ...` is the oldest wait", ["gate"])
        self.taint_removals = counter("nodegate_readiness_taint_removals_total",
                                      "Readiness taints removed from nodes", ["gate"])
        self.hand_off_holds = counter("nodegate_hand_off_holds_total",
                                      "Joining nodes left cordoned for hand-off as their readiness taint was lifted "
                                      "(spec.leaveCordoned), by the gate that asked", ["gate"])
        self.hand_off_releases = Counter("nodegate_hand_off_releases_total",
                                         "Held nodes that someone uncordoned, whose hold NodeGate then ended for good",
                                         registry=r)
        self.taints_added = counter("nodegate_readiness_taints_added_total",
                                    "Readiness taints the operator added (missed joins, reboots)", ["gate"])
        self.records_refused = counter("nodegate_records_refused_total",
                                       "Node records of a gate that the operator did not write (no valid signature): "
                                       "ignored and reported, once per distinct record", ["gate"])
        self.pods_refused = counter("nodegate_pods_refused_total",
                                    "Pods with a gate's stage pod labels that the operator did not create, or that "
                                    "changed since it did: never read as stage results, reported once per pod and "
                                    "shape (staging and undo pods without its signature: deleted too)", ["gate"])
        self.reconcile_errors = Counter("nodegate_reconcile_errors_total", "Reconciles that raised",
                                        ["kind", "error"], registry=r)
        self.reconcile_duration = Histogram("nodegate_reconcile_duration_seconds", "Reconcile duration", ["kind"],
                                            registry=r, buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5))
        self.api_requests = Gauge("nodegate_api_requests", "API requests sent since start", registry=r)
        self.writes_refused = Gauge("nodegate_leader_writes_refused",
                                    "Writes not sent since start: this replica was not the leader (gate.kube.fence)",
                                    registry=r)
        self.api_requests_by = Counter("nodegate_api_requests_by_resource",
                                       "API requests sent, by verb and resource", ["verb", "resource"], registry=r)
        self.image_resolutions = Counter("nodegate_image_resolutions_total",
                                         "Package image tags resolved to a digest (result: resolved or failed)",
                                         ["result"], registry=r)
        self.image_verifications = Counter("nodegate_image_verifications_total",
                                           "Image digests judged by the image signature policy, by result: Verified, "
                                           "NotCovered, or why one failed (NoRule, SignatureMissing, "
                                           "SignatureInvalid, UntrustedKey; counted in warn mode too)",
                                           ["result"], registry=r)
        self.signature_lookups = Counter("nodegate_image_signature_lookups",
                                         "Image digests whose signatures were looked up in a registry (verdicts "
                                         "not answered from the cache by digest and policy)", registry=r)
        self.signature_requests = Counter("nodegate_image_signature_requests",
                                          "HTTP requests those signature lookups sent to registries", registry=r)
        self.images_unverified = gauge("nodegate_gate_images_unverified",
                                       "Package images of the gate that failed the image signature policy (in "
                                       "enforce mode the gate is held; in warn mode they run anyway)", ["gate"])
        self.prepull_pods = gauge("nodegate_prepull_pods",
                                  "Prepull pods (a node's next images, pulled before its cordon) by state: pulling, "
                                  "pulled, failing (the kubelet cannot pull and keeps trying), failed",
                                  ["gate", "state"])
        self.prepull_failures = counter("nodegate_prepull_failures_total",
                                        "Prepull pods that could not pull an image (once per pod)", ["gate"])
        self.stagings = Gauge("nodegate_stagings", "Staging and undo pods over the fleet (stage while serving) by "
                              "state: staging, staged, failed, undoing, undone, undo-failed", ["state"], registry=r)
        self.queue_depth = Gauge("nodegate_work_queue_depth", "Keys waiting in the work queue", registry=r)
        labels = ["gate", "compartment"]
        self.c_matched = gauge("nodegate_compartment_matched_nodes", "Nodes in the compartment", labels)
        self.c_ceiling = gauge("nodegate_compartment_ceiling", "Most nodes disrupted at once", labels)
        self.c_in_progress = gauge("nodegate_compartment_in_progress_nodes", "Nodes disrupted now", labels)
        self.c_complete = gauge("nodegate_compartment_complete_nodes", "Nodes done", labels)
        self.c_failed = gauge("nodegate_compartment_failed_nodes", "Nodes failed", labels)
        self.c_batch = gauge("nodegate_compartment_batch", "Current batch number", labels)
        self.c_failures = gauge("nodegate_compartment_consecutive_failures", "Failed batches in a row", labels)
        self.c_stopped = gauge("nodegate_compartment_stopped", "1 when the compartment is stopped", labels)
        self.c_rolled_back = gauge("nodegate_compartment_rolled_back",
                                   "1 while the compartment is stopped by a failed batch under rollback: true", labels)

    def tracked(self) -> list[Tracked[Gauge] | Tracked[Counter] | Tracked[Histogram]]:
        return [m for m in vars(self).values() if isinstance(m, Tracked)]

    def forget_gate(self, gate: str) -> int:
        """The gate is gone: every series labelled with it."""
        return sum(m.remove_where(lambda s: s.get("gate") == gate) for m in self.tracked())

    def forget_gone(self, gate: str, compartments: Collection[str], packages: Collection[str],
                    all_packages: Collection[str]) -> int:
        """What the gate no longer has: series of its compartments not in `compartments` and of its
        packages not in `packages`; and stage series of packages no gate has (`all_packages`)."""

        def doomed(s: Mapping[str, str]) -> bool:
            if "gate" in s:
                if s["gate"] != gate:
                    return False
                if "compartment" in s and s["compartment"] not in compartments:
                    return True
                return "package" in s and s["package"] != "-" and s["package"] not in packages
            return "package" in s and s["package"] != "-" and s["package"] not in all_packages

        return sum(m.remove_where(doomed) for m in self.tracked())
