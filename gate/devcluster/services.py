"""NodeGate's own processes next to the dev control plane: the admission webhook and the operator.

They run out of cluster as local processes (the API server reaches the webhook on 127.0.0.1), under
the same bookkeeping as the control plane so `nodegate dev down` stops them too.
"""

from __future__ import annotations

from collections.abc import Callable

from gate.devcluster.cluster import DevCluster

Progress = Callable[[str], None]


def start(cluster: DevCluster, *, webhook: bool, operator: bool, progress: Progress) -> None:
    """Start the webhook and the operator that are asked for and not yet running."""
    if webhook:
        progress("The admission webhook is not part of this build yet; starting without it.")
    if operator:
        progress("The operator is not part of this build yet; starting without it.")
