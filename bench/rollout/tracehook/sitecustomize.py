"""Loaded at the start of the operator's interpreter when `bench.rollout.run --tracemalloc DIR` or
`--heap-stats DIR` puts this folder first on its PYTHONPATH. A bench-only hook: nothing in `gate` knows of
it, and it adds no signal or endpoint to NodeGate.

The bench asks for a snapshot by creating `DIR/NAME.request`; a thread of this hook answers and removes the
request:

* `--tracemalloc`: Python's allocations are traced from the first import; the answer is `DIR/NAME.snapshot`
  (`tracemalloc.Snapshot.dump`), with the traced total and the RSS of that moment in `DIR/NAME.json`.
* `--heap-stats`: nothing is traced (the operator runs at its usual speed); the answer, `DIR/NAME.json`,
  splits the RSS of that moment: Python's small-object allocator (its arenas, the bytes in live blocks and
  the free ones it keeps, from `sys._debugmallocstats`), glibc's heap (`mallinfo2`: in use and free), and
  the resident pages by mapping (`/proc/self/smaps`: the heap, anonymous mappings, files); and the time
  Python's cyclic garbage collector took so far, by generation (`gc.callbacks`), with the objects it
  tracks."""

from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _pymalloc() -> dict[str, int]:
    """`sys._debugmallocstats` writes to the C stderr: point fd 2 at a file for the call (it holds the GIL)."""
    with tempfile.TemporaryFile(mode="w+") as out:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    figures: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        number = value.strip().replace(",", "")
        if not (sep and number.isdigit()):
            continue
        if "arenas allocated current" in key:
            figures["arenas"] = int(number)
        elif "bytes/arena" in key:
            figures["arena_bytes"] = int(number)
        elif "bytes in allocated blocks" in key:
            figures["live_blocks"] = int(number)
        elif "bytes in available blocks" in key:
            figures["free_blocks"] = int(number)
        elif "unused pools" in key:
            figures["unused_pools"] = int(number)
    return figures


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _glibc() -> dict[str, int]:
    try:
        call = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    call.restype = _MallInfo2
    info = call()
    return {"sbrk_heap": info.arena, "mmapped": info.hblkhd, "in_use": info.uordblks, "free": info.fordblks}


def _smaps() -> dict[str, int]:
    """Resident bytes by kind of mapping."""
    out: dict[str, int] = {}
    kind = "anonymous"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if not head:
            continue
        if "-" in head[0] and not head[0].endswith(":"):
            path = head[5] if len(head) > 5 else ""
            kind = "heap" if path == "[heap]" else "stack" if path.startswith("[stack") else \
                "anonymous" if not path else "other" if path.startswith("[") else "files"
        elif head[0] == "Rss:":
            out[kind] = out.get(kind, 0) + int(head[1]) * 1024
    return out


class _GcClock:
    """Wall time of the collector's runs by generation: a collection runs with the GIL held, on the thread
    that allocated, so its wall time is the operator's CPU time."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.runs = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._started
            self.runs[info["generation"]] += 1

    def figures(self) -> dict[str, object]:
        return {"seconds_by_generation": [round(s, 3) for s in self.seconds], "runs_by_generation": self.runs}


_GC = _GcClock()


def _heap_stats() -> dict[str, object]:
    return {"rss": _rss(), "pymalloc": _pymalloc(), "glibc": _glibc(), "resident_by_mapping": _smaps(),
            "gc": _GC.figures()}


def _serve(folder: Path, tracing: bool) -> None:
    while True:
        for request in sorted(folder.glob("*.request")):
            name = request.name.removesuffix(".request")
            if tracing:
                traced, peak = tracemalloc.get_traced_memory()
                rss = _rss()
                tracemalloc.take_snapshot().dump(str(folder / f"{name}.snapshot"))
                figures: dict[str, object] = {"traced": traced, "traced_peak": peak, "rss": rss}
            else:
                figures = _heap_stats()
            (folder / f"{name}.json").write_text(json.dumps(figures))
            request.unlink(missing_ok=True)
        time.sleep(0.5)


_TRACE = os.environ.get("NODEGATE_BENCH_TRACEMALLOC")
_HEAP = os.environ.get("NODEGATE_BENCH_HEAPSTATS")
if _TRACE:
    tracemalloc.start(int(os.environ.get("NODEGATE_BENCH_TRACEMALLOC_FRAMES", "8")))
if _HEAP:
    gc.callbacks.append(_GC)
if _TRACE or _HEAP:
    threading.Thread(target=_serve, args=(Path(_TRACE or _HEAP or ""), bool(_TRACE)), name="bench-snapshots",
                     daemon=True).start()
