"""The operator's Prometheus metrics, on a registry of its own (tests run several operators)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.leader = Gauge("nodegate_leader", "1 while this replica holds the leader lease", registry=r)
        self.nodes = Gauge("nodegate_nodes", "Nodes by status per gate", ["gate", "status"], registry=r)
        self.stage_duration = Histogram(
            "nodegate_stage_duration_seconds", "Time from a stage Job's creation to its end",
            ["package", "stage", "outcome"], registry=r,
            buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
        )
        self.stage_failures = Counter("nodegate_stage_failures_total", "Stages and node steps that failed for good",
                                      ["gate", "package", "stage", "reason"], registry=r)
        self.drains_blocked = Counter("nodegate_drain_blocked_total",
                                      "Drains held up by a PodDisruptionBudget (once per node and blocking budget)",
                                      ["gate"], registry=r)
        self.drains_blocked_now = Gauge("nodegate_drains_blocked",
                                        "Nodes whose drain a PodDisruptionBudget holds up right now", ["gate"],
                                        registry=r)
        self.taint_removals = Counter("nodegate_readiness_taint_removals_total",
                                      "Readiness taints removed from nodes", ["gate"], registry=r)
        self.taints_added = Counter("nodegate_readiness_taints_added_total",
                                    "Readiness taints the operator added (missed joins, reboots)", ["gate"],
                                    registry=r)
        self.reconcile_errors = Counter("nodegate_reconcile_errors_total", "Reconciles that raised",
                                        ["kind", "error"], registry=r)
        self.reconcile_duration = Histogram("nodegate_reconcile_duration_seconds", "Reconcile duration", ["kind"],
                                            registry=r, buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5))
        self.api_requests = Gauge("nodegate_api_requests", "API requests sent since start", registry=r)
        self.api_requests_by = Counter("nodegate_api_requests_by_resource",
                                       "API requests sent, by verb and resource", ["verb", "resource"], registry=r)
        self.queue_depth = Gauge("nodegate_work_queue_depth", "Keys waiting in the work queue", registry=r)
        labels = ["gate", "compartment"]
        self.c_matched = Gauge("nodegate_compartment_matched_nodes", "Nodes in the compartment", labels, registry=r)
        self.c_ceiling = Gauge("nodegate_compartment_ceiling", "Most nodes disrupted at once", labels, registry=r)
        self.c_in_progress = Gauge("nodegate_compartment_in_progress_nodes", "Nodes disrupted now", labels,
                                   registry=r)
        self.c_complete = Gauge("nodegate_compartment_complete_nodes", "Nodes done", labels, registry=r)
        self.c_failed = Gauge("nodegate_compartment_failed_nodes", "Nodes failed", labels, registry=r)
        self.c_batch = Gauge("nodegate_compartment_batch", "Current batch number", labels, registry=r)
        self.c_failures = Gauge("nodegate_compartment_consecutive_failures", "Failed batches in a row", labels,
                                registry=r)
        self.c_stopped = Gauge("nodegate_compartment_stopped", "1 when the compartment is stopped", labels,
                               registry=r)
