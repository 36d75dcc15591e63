"""How many bytes of request bodies the webhook holds at once: a budget claimed before a body is read.

aiohttp's client_max_size bounds one body; nothing bounds how many are read at the same time, so a
client opening a hundred connections with 3 MiB bodies makes the process hold 300 MiB of bytes, and
several times that once parsed. A request claims its declared length (or the largest body allowed,
when it declares none) before its body is read, and gives it back once answered; a claim that does
not fit is refused at once (the server answers 429).

A quarter of the budget is kept for small bodies (at most `small` bytes): the writes people make
every day, a gate of a few packages, a Node joining, stay a few KiB, and a flood of large bodies
then fills at most three quarters, never the room those need. Pure: no I/O, no clock.
"""

from __future__ import annotations

SMALL_BODY = 64 * 1024


class BodyBudget:
    def __init__(self, total: int, *, small: int = SMALL_BODY) -> None:
        if total < 4 * small:
            raise ValueError(f"the body budget ({total} bytes) must hold at least four small bodies of {small} bytes")
        self.total = total
        self.small = small
        self.large_limit = total - total // 4
        self.held = 0
        self.held_large = 0
        self.refused = 0

    def take(self, size: int) -> bool:
        """Claim `size` bytes; False (and nothing claimed) when they do not fit."""
        large = size > self.small
        if self.held + size > self.total or (large and self.held_large + size > self.large_limit):
            self.refused += 1
            return False
        self.held += size
        if large:
            self.held_large += size
        return True

    def give(self, size: int) -> None:
        """Give back a claim that `take` granted."""
        self.held -= size
        if size > self.small:
            self.held_large -= size
