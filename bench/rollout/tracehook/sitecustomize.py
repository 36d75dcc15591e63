"""Loaded at the start of the operator's interpreter when `bench.rollout.run --tracemalloc DIR` puts this
folder first on its PYTHONPATH: Python's allocations are traced from the first import, and a snapshot is
written on request, without a signal or an endpoint in NodeGate itself.

The bench asks by creating `DIR/NAME.request`; a thread of this hook then writes `DIR/NAME.snapshot`
(`tracemalloc.Snapshot.dump`), with the traced total and the RSS of that moment in `DIR/NAME.json`, and
removes the request. A bench-only hook: nothing in `gate` knows of it."""

from __future__ import annotations

import json
import os
import threading
import time
import tracemalloc
from pathlib import Path


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _serve(folder: Path) -> None:
    while True:
        for request in sorted(folder.glob("*.request")):
            name = request.name.removesuffix(".request")
            traced, peak = tracemalloc.get_traced_memory()
            rss = _rss()
            tracemalloc.take_snapshot().dump(str(folder / f"{name}.snapshot"))
            (folder / f"{name}.json").write_text(json.dumps({"traced": traced, "traced_peak": peak, "rss": rss}))
            request.unlink(missing_ok=True)
        time.sleep(0.5)


_FOLDER = os.environ.get("NODEGATE_BENCH_TRACEMALLOC")
if _FOLDER:
    tracemalloc.start(int(os.environ.get("NODEGATE_BENCH_TRACEMALLOC_FRAMES", "8")))
    threading.Thread(target=_serve, args=(Path(_FOLDER),), name="bench-tracemalloc", daemon=True).start()
