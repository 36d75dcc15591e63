"""Large bodies' CPU: one job at a time, in a thread of its own, resting after each as long as it worked."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time

from gate.admission.largebodies import LargeBodyWork


async def test_jobs_run_one_at_a_time_off_the_loop_and_rest_as_long_as_they_worked() -> None:
    work = LargeBodyWork()
    spans: list[tuple[float, float]] = []
    threads: set[str] = set()

    def job() -> int:
        started = time.monotonic()
        threads.add(threading.current_thread().name)
        time.sleep(0.02)  # the job's CPU, standing in for a parse that holds the GIL
        spans.append((started, time.monotonic()))
        return len(spans)

    try:
        assert sorted(await asyncio.gather(*(work.run(job) for _ in range(3)))) == [1, 2, 3]
    finally:
        work.shutdown()
    assert threads == {"large-body_0"} and threading.current_thread().name not in threads
    for (start_a, end_a), (start_b, _) in itertools.pairwise(spans):
        # A lower bound, which a busy machine only makes longer: the next job waits at least as
        # long as the last one worked, so the loop got that slice of the interpreter.
        assert start_b - end_a >= end_a - start_a


async def test_a_cancelled_request_waits_for_its_job_to_leave_the_thread() -> None:
    work = LargeBodyWork()
    release = threading.Event()
    done = threading.Event()

    def job() -> None:
        release.wait(10)
        done.set()

    try:
        asker = asyncio.create_task(work.run(job))
        await asyncio.sleep(0.01)
        asker.cancel()
        await asyncio.sleep(0.01)
        assert not asker.done()  # still holding the body's claim: the thread has the body
        release.set()
        try:
            await asker
        except asyncio.CancelledError:
            pass
        assert done.is_set() and asker.cancelled()
    finally:
        work.shutdown()
