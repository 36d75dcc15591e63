"""A real Prometheus on this machine, for the health signals that ask one (`health.prometheus`).

NodeGate reads a Prometheus only through its HTTP API (`gate/controller/promql.py`), and the tests of
that path run against the real server (built from the Go module proxy like the control plane, pinned
in versions.toml), scraping exporters the caller names and evaluating the alerting rules it gives.
It runs as a process of a `ProcessTable` (a dev cluster's, or a test's own state directory), so the
table's `stop_all` (`nodegate dev down`) stops it with the rest.

Decisions:

* **Fast by configuration, not by waiting.** The scrape interval and the rule evaluation interval
  are the caller's (1 s by default), and the scrape timeout equals the scrape interval (Prometheus
  refuses a timeout longer than the interval, and its default is 10 s). A series the exporter stops
  serving is marked stale at the next scrape, so a query stops returning it at once rather than
  after the five-minute lookback.
* **Static targets.** The caller knows its exporters before it starts Prometheus; a target list in
  the configuration file is the simplest thing that Prometheus reads exactly once.
* **Storage in the state directory** (`<dir>/prometheus/data`), rewritten at each start: nothing of a
  previous run is worth keeping, and an old series would answer a new query.
* **Loopback only, no web UI.** It listens on `127.0.0.1:<free port>`. It is built without the
  `builtinassets` tag (the UI is built with npm), so `/` serves nothing; `/api/v1/*` and `/-/ready`
  are all NodeGate needs. Ready means `GET /-/ready` answers 200 (the TSDB is open and the first
  configuration is loaded).
"""

from __future__ import annotations

import shutil
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gate.devcluster import build
from gate.devcluster.processes import ClusterError, ProcessTable, free_port, tail

Progress = Callable[[str], None]

PROCESS = "prometheus"
DEFAULT_INTERVAL = 1.0
JOB = "nodegate-test"


def _duration(seconds: float) -> str:
    """A Prometheus duration: whole milliseconds (`1500ms`), which every duration field accepts."""
    millis = round(seconds * 1000)
    if millis <= 0:
        raise ValueError(f"a Prometheus interval must be positive, not {seconds!r} s")
    return f"{millis}ms"


def prometheus_config(targets: Sequence[str], *, interval: float = DEFAULT_INTERVAL,
                      rule_files: Sequence[str] = ()) -> dict[str, Any]:
    """The configuration: one scrape job over `targets` (`host:port`, scraped at `/metrics`) and the
    rule files, all at `interval` seconds."""
    every = _duration(interval)
    return {
        "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
        "rule_files": list(rule_files),
        "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": list(targets)}]}],
    }


def prometheus_argv(binary: Path, config: Path, data: Path, port: int) -> list[str]:
    return [
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
        # Reading the configuration again (`POST /-/reload`) lets a caller change its rules in place.
        "--web.enable-lifecycle",
    ]


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:  # refused, reset, or an HTTP error status (503 while starting)
        return False


def running_port(procs: ProcessTable) -> int | None:
    """The port of the table's Prometheus when it runs and is ready, else None."""
    return procs.running_port(PROCESS, ready)


def start_prometheus(procs: ProcessTable, targets: Sequence[str], *,
                     rules: Mapping[str, Mapping[str, Any]] | None = None,
                     interval: float = DEFAULT_INTERVAL, progress: Progress = print,
                     timeout: float = 60.0) -> int:
    """Start Prometheus as a process of `procs`, scraping `targets` and evaluating `rules` (file name ->
    a rule file's content, `{"groups": [...]}`), and return its port once it is ready.

    A Prometheus already running in the table is stopped first: its targets and rules are the ones
    it was started with, not necessarily these. Builds the binary when the cache lacks it.
    """
    if PROCESS in procs.all():
        procs.stop(PROCESS)
    binary = build.ensure_built((PROCESS,), progress=progress)[PROCESS]
    home = procs.dir / "prometheus"
    shutil.rmtree(home, ignore_errors=True)
    (home / "data").mkdir(parents=True)
    rule_files = []
    for name, content in sorted((rules or {}).items()):
        path = home / name
        path.write_text(yaml.safe_dump(dict(content), sort_keys=False))
        rule_files.append(str(path))
    config = home / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(targets, interval=interval, rule_files=rule_files),
                                     sort_keys=False))
    port = free_port()
    progress(f"Starting Prometheus on port {port} (scraping {', '.join(targets) or 'nothing'}) ...")
    proc = procs.register(PROCESS, prometheus_argv(binary, config, home / "data", port))
    procs.set_port(PROCESS, port)
    deadline = time.monotonic() + timeout
    while not ready(port):
        if not proc.alive():
            raise ClusterError(f"Prometheus exited during start-up; last lines of {proc.log}:\n{tail(Path(proc.log))}")
        if time.monotonic() > deadline:
            raise ClusterError(f"Prometheus did not answer GET /-/ready within {timeout:.0f}s; see {proc.log}")
        time.sleep(0.1)
    return port
