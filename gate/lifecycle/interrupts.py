"""One interrupt per node: the strongest of what the packages ask for.

reboot > restartAllServices > service (with the union of the services) > drain > none. A reboot
restarts every service anyway, restarting all services covers any single one, and every interrupt
but none cordons and drains the node first, so a drain is covered by any of the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase

from gate.api.nodegate import Interrupt
from gate.api.state import INTERRUPT_RANK


def merge(interrupts: Iterable[Interrupt | None]) -> Interrupt:
    strongest = Interrupt()
    services: set[str] = set()
    for item in interrupts:
        if item is None:
            continue
        if INTERRUPT_RANK[item.type] > INTERRUPT_RANK[strongest.type]:
            strongest = item
        if item.type == "service":
            services.update(item.services)
    if strongest.type == "service":
        return Interrupt(type="service", services=sorted(services))
    return Interrupt(type=strongest.type)


def config_interrupts(rules: Mapping[str, Interrupt], changed_keys: Iterable[str]) -> list[Interrupt]:
    """The configInterrupts that apply to a change of `changed_keys`: exact keys and glob patterns."""
    keys = list(changed_keys)
    return [rule for pattern, rule in sorted(rules.items()) if any(fnmatchcase(k, pattern) for k in keys)]
