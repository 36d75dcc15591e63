"""The CPU of large request bodies, kept off the event loop that answers the small ones."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class LargeBodyWork:
    """Parsing and judging large bodies, one at a time in a thread of their own, busy at most half the time.

    A thread alone is not enough: parsing JSON is one call into pydantic-core that holds the GIL
    from start to end (150 ms for 1.4 MiB), and a thread that starts the next parse as soon as one
    ends keeps the event loop from running for as long as large bodies keep coming. So after each
    job the thread rests as long as the job took: the loop gets at least every other slice of the
    interpreter, and a small review waits for at most one large body's parse, not for all of them.
    Large bodies queue instead, held by the body budget, until the API server gives up on them.
    """

    def __init__(self) -> None:
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="large-body")
        self._rest_until = 0.0

    async def run(self, work: Callable[[], T]) -> T:
        job = asyncio.get_running_loop().run_in_executor(self.executor, self._paced, work)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            # The request is gone, but the thread still holds its body: keep the body's claim on the
            # budget (given back by the caller's finally) until the thread is done with it.
            await asyncio.wait([job])
            raise

    def _paced(self, work: Callable[[], T]) -> T:
        rest = self._rest_until - time.monotonic()
        if rest > 0:
            time.sleep(rest)  # releases the GIL: the loop runs
        started = time.monotonic()
        try:
            return work()
        finally:
            ended = time.monotonic()
            self._rest_until = ended + (ended - started)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
