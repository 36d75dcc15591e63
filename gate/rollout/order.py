"""The order in which a compartment's waiting nodes are picked.

Nodes are picked in order of the SHA-256 of their name (the name itself breaks the impossible tie).
Why not the name: fleets name nodes after their place (`rack3-node07`, `zone-b-gpu-12`), so name
order would put neighbours, and with them one rack, switch or power domain, into the same batch.
A hash spreads every batch across the fleet, the way a careful operator would by hand.
Why not a hash of (gate, node): every gate sees the same order, so with `sequencing: node` a
lower-priority gate follows a higher-priority one node by node instead of waiting on a different
random node each time. The hash is SHA-256, not `hash()`, so the order survives restarts and is the
same in the operator, in `nodegate plan` and on a laptop.
"""

from __future__ import annotations

import functools
import hashlib


@functools.lru_cache(maxsize=1 << 16)  # a plan sorts the fleet by it, every time: hash each name once
def order_key(node: str) -> tuple[str, str]:
    """Sort key of a node: lower keys are picked first."""
    return hashlib.sha256(node.encode()).hexdigest(), node
